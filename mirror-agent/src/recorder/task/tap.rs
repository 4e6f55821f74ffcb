//! The recorder's socket on the interface copies are handed to: opened (again) as the sink
//! changes, read when it has frames, each frame to the open capture of its tuple, or into a
//! short queue when its trigger's event has not come yet.

use std::time::Instant;

use tokio::io::unix::AsyncFd;

use mirror_bpf::FlowKey;

use super::{Task, PENDING_BYTES, PENDING_FOR};
use crate::capture::packet;
use crate::capture::socket::PacketSocket;
use crate::recorder::Stats;

/// The socket and what it reads.
pub(super) struct Tap {
    /// The interface, and whether copies are sent out of it (else received).
    pub(super) iface: String,
    pub(super) outgoing: bool,
    pub(super) sock: AsyncFd<PacketSocket>,
}

impl Task {
    /// Reads what the socket holds, each frame to its capture.
    pub(super) fn read(&mut self) {
        let Some(tap) = self.tap.as_mut() else { return };
        let outgoing = tap.outgoing;
        let mut frames = Vec::new();
        // Readiness was cleared before: everything there now is read.
        loop {
            match tap.sock.get_mut().recv() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "recorder: reading the mirror interface");
                    self.tap = None;
                    break;
                }
            }
        }
        for f in frames {
            if f.outgoing != outgoing {
                continue;
            }
            let Some(t) = packet::tuple(&f.data) else { continue };
            let key = FlowKey::new(t.src, t.dst, t.proto);
            match self.by_key.get(&key) {
                Some(id) => self.write(*id, f),
                None => {
                    self.pending_bytes += f.data.len();
                    self.pending.push_back((Instant::now(), key, f));
                }
            }
        }
        self.expire_pending();
    }

    pub(super) fn expire_pending(&mut self) {
        while let Some((at, _, f)) = self.pending.front() {
            if at.elapsed() < PENDING_FOR && self.pending_bytes <= PENDING_BYTES {
                break;
            }
            self.pending_bytes -= f.data.len();
            self.pending.pop_front();
            Stats::add(&self.stats.unclaimed, 1);
        }
    }

    /// Opens the socket on the interface copies are handed to, again when it changed.
    pub(super) fn follow_sink(&mut self) {
        let m = self.info.lock().expect("info lock").mirror.clone();
        let want = m.copies_to.clone().zip(m.delivery.clone()).map(|(i, d)| (i, d != "ingress"));
        let have = self.tap.as_ref().map(|t| (t.iface.clone(), t.outgoing));
        if want == have {
            return;
        }
        self.tap = None;
        let Some((iface, outgoing)) = want.clone() else { return };
        // SAFETY: the socket owns its descriptor and keeps it open, unchanged, while registered.
        match PacketSocket::open(&iface)
            .and_then(|s| unsafe { AsyncFd::register(s) }.map_err(|e| std::io::Error::other(e.to_string())))
        {
            Ok(sock) => {
                tracing::debug!(%iface, outgoing, "recorder: reading copies");
                self.tap = Some(Tap { iface, outgoing, sock });
                self.tap_failed = None;
            }
            Err(e) if self.tap_failed == want => {
                tracing::debug!(%iface, error = %e, "recorder: cannot read the mirror interface")
            }
            Err(e) => {
                tracing::warn!(%iface, error = %e, "recorder: cannot read the mirror interface, no captures kept until it can");
                self.tap_failed = want;
            }
        }
    }
}

/// Waits until the socket has frames (forever without one).
pub(super) async fn readable(tap: Option<&Tap>) {
    match tap {
        Some(t) => match t.sock.readable().await {
            Ok(mut g) => g.clear_ready(),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
