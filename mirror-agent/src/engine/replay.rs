//! The request behind a noresponse mark, replayed by the agent. A timer marks such a flow
//! when no packet came, and the classifier replays a request by reshaping a clone of a packet:
//! it has none then, and the flow's next packet may come seconds later or never. So the agent
//! replays it as it reads the trigger event, which carries the kept segment: reshaped as the
//! replay program reshapes its clones ([`ReplayedRequest::reshaped`]), written to the sink by a
//! packet socket with the replay mark ([`AGENT_MARK`]); the replay program on the sink's egress
//! hands it on the way copies go (transmitted by the sink, or received by it or by its veth
//! peer), within the node-wide budget.
//!
//! A packet the kernel dropped reaches the mirror the same way: the drop program cannot copy
//! it (a tracepoint has no packet to redirect), so its event carries its first bytes, written
//! here with the Ethernet source [`mirror_bpf::event::DROP_MAC`] as the agent reads the event.

use std::time::Duration;

use mirror_bpf::flow::monotonic_ns;
use mirror_bpf::replay::AGENT_MARK;
use mirror_bpf::{TriggerEvent, TriggerKind};

use crate::capture::socket::PacketSocket;

/// What the agent replayed, for the `replayed` and `replay_failed` counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ReplayCounts {
    /// Replays written to the sink.
    pub replayed: u64,
    /// Replays that could not be made or written.
    pub failed: u64,
    /// Dropped packets written to the sink.
    pub drops: u64,
}

/// The agent's replays.
pub(super) struct Replayer {
    /// The sink, whose egress runs the replay program (0: none, so no replays).
    sink: u32,
    /// The packet socket on it, opened at the first replay.
    sock: Option<PacketSocket>,
    /// A node-wide budget is set: the replay program refuses what is beyond it.
    budget: bool,
    counts: ReplayCounts,
    /// A failure was logged (the next ones are not).
    warned: bool,
}

impl Replayer {
    /// No sink yet; `budget`: whether a node-wide budget is set.
    pub(super) fn new(budget: bool) -> Self {
        Self { sink: 0, sock: None, budget, counts: ReplayCounts::default(), warned: false }
    }

    /// Replays go to the sink `ifindex` from now on (0: the replay program is not attached
    /// anywhere: none are made, as the classifier makes none).
    pub(super) fn set_sink(&mut self, ifindex: u32) {
        if ifindex != self.sink {
            self.sink = ifindex;
            self.sock = None;
        }
    }

    pub(super) fn counts(&self) -> ReplayCounts {
        self.counts
    }

    /// Replays the request of `ev` when it is a noresponse mark's and its segment was kept;
    /// writes the packet of a drop. Returns how long after the event's time a drop's copy was
    /// written (`None`: none written).
    pub(super) fn on_event(&mut self, ev: &TriggerEvent) -> Option<Duration> {
        if self.sink == 0 {
            return None;
        }
        match (&ev.request, &ev.dropped) {
            (Some(r), _) if ev.kind == TriggerKind::NoResponse => {
                if self.send(r.reshaped(), "the kept segment is not one the replay program replays") {
                    self.counts.replayed += 1;
                }
                None
            }
            (_, Some(d)) => {
                if !self.send(d.reshaped(), "the dropped packet's bytes are not an IP packet") {
                    return None;
                }
                self.counts.drops += 1;
                Some(Duration::from_nanos(monotonic_ns().saturating_sub(ev.ts_ns)))
            }
            _ => None,
        }
    }

    /// Writes `frame` to the sink; `bad`: why a `None` could not be made. Whether it was written.
    fn send(&mut self, frame: Option<Vec<u8>>, bad: &str) -> bool {
        let Some(frame) = frame else {
            self.failed(bad, None);
            return false;
        };
        if self.sock.is_none() {
            match PacketSocket::sender(self.sink, AGENT_MARK) {
                Ok(s) => self.sock = Some(s),
                Err(e) => {
                    self.failed("opening a packet socket on the sink", Some(e));
                    return false;
                }
            }
        }
        let Some(sock) = &self.sock else { return false };
        match sock.send(&frame) {
            Ok(()) => true,
            // The replay program refused it: the budget was spent (counted as a refusal there).
            Err(e) if self.budget && e.raw_os_error() == Some(libc::ENOBUFS) => false,
            Err(e) => {
                // Reopened at the next replay: the sink may have been recreated.
                self.sock = None;
                self.failed("writing to the sink", Some(e));
                false
            }
        }
    }

    fn failed(&mut self, what: &str, e: Option<std::io::Error>) {
        self.counts.failed += 1;
        let error = e.map(|e| e.to_string());
        if !std::mem::replace(&mut self.warned, true) {
            tracing::warn!(
                sink = self.sink,
                error,
                "a noresponse mark's request or a dropped packet could not be written to the sink: \
                 {what} (counted in replay_failed; further failures are not logged)"
            );
        } else {
            tracing::debug!(
                sink = self.sink,
                error,
                "replay of a noresponse mark's request or a drop: {what}"
            );
        }
    }
}
