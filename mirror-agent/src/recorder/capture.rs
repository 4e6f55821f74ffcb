//! One trigger's capture while its flow is mirrored: pcapng in the form of `mirrorctl capture`
//! (one interface per pod veth, each packet's direction and a comment naming rule and
//! trigger, checksums filled in), each block weighed against the store's budget before it is
//! written, and cut, with a note saying why, when it does not fit or the disk fails.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use mirror_bpf::FlowKey;

use super::store::{Full, Store};
use crate::capture::packet;
use crate::capture::socket::Frame;
use crate::capture::{Direction, PcapNgOut};
use crate::pods::Pods;
use crate::views::{CaptureView, PodView};

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrote {
    /// The packet is in the capture.
    Packet,
    /// The capture is cut: not kept.
    Dropped,
    /// The capture was cut now, by the budget.
    CutByBudget,
    /// The capture was cut now, by a write error.
    CutByError,
}

/// Room kept within the budget for each open capture's end: its note and its metadata's
/// last fields.
pub const TAIL: u64 = 1024;

/// A capture being written.
pub struct Open {
    /// What the listing shows.
    pub view: CaptureView,
    /// Its flow's tuples (both sides of a translated connection).
    pub keys: Vec<FlowKey>,
    out: PcapNgOut<Vec<u8>>,
    file: BufWriter<File>,
    snaplen: u32,
    /// The comment of each copy (`mirrored by rule ...`).
    comment: String,
    /// The pods of the flow's addresses, looked up once.
    pods: HashMap<IpAddr, Option<PodView>>,
    /// The interface of copies of no known pod (the sink's).
    sink: String,
    /// When it was opened, and when its last copy came.
    pub opened: Instant,
    pub last_copy: Instant,
    /// When its mirror was seen to end, and how.
    pub ending: Option<(Instant, &'static str)>,
    /// FIN seen from the flow's (lower, higher) endpoint, or a reset.
    fins: (bool, bool),
    reset: bool,
}

impl Open {
    /// Starts capture `view.id` in `file`: its section header names it (`header`), and the
    /// trigger's pod interface (`first`) is interface 0, to which the closing note refers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        view: CaptureView,
        keys: Vec<FlowKey>,
        file: File,
        header: &str,
        comment: String,
        snaplen: u32,
        first: Option<PodView>,
        sink: &str,
    ) -> anyhow::Result<(Open, Vec<u8>)> {
        let mut out = PcapNgOut::with_comment(Vec::new(), snaplen, header)?;
        match &first {
            Some(p) => {
                let (name, desc) = crate::capture::pod_interface(p);
                out.interface(&name, &desc)?;
            }
            None => {
                out.interface(sink, "copies not sent or received by a known pod")?;
            }
        }
        let head = std::mem::take(out.get_mut());
        let now = Instant::now();
        let o = Open {
            view,
            keys,
            out,
            file: BufWriter::with_capacity(16 << 10, file),
            snaplen,
            comment,
            pods: HashMap::new(),
            sink: sink.to_string(),
            opened: now,
            last_copy: now,
            ending: None,
            fins: (false, false),
            reset: false,
        };
        Ok((o, head))
    }

    /// Writes `head` (the blocks the capture starts with), within the budget.
    pub fn start(&mut self, store: &mut Store, head: &[u8]) -> Wrote {
        self.put(store, head)
    }

    /// Whether it is cut (nothing more is written).
    pub fn is_cut(&self) -> bool {
        self.view.cut.is_some()
    }

    /// The pod of `ip` (looked up once per address).
    fn pod(&mut self, pods: &Pods, ip: IpAddr) -> Option<PodView> {
        self.pods.entry(ip).or_insert_with(|| pods.by_addr(ip)).clone()
    }

    /// Writes one copy (a replayed request says so in its comment).
    pub fn write(&mut self, store: &mut Store, pods: &Pods, mut frame: Frame) -> anyhow::Result<Wrote> {
        self.last_copy = Instant::now();
        let tuple = packet::tuple(&frame.data);
        if let Some(t) = tuple {
            self.follow_close(&frame.data, t);
        }
        if self.is_cut() {
            return Ok(Wrote::Dropped);
        }
        if frame.csum_not_ready {
            packet::fix_checksums(&mut frame.data);
        }
        // Sent by a pod (copied where it left it), or else received by one.
        let place = match tuple {
            Some(t) => match self.pod(pods, t.src.ip()) {
                Some(p) => Some((p, Direction::Outbound)),
                None => self.pod(pods, t.dst.ip()).map(|p| (p, Direction::Inbound)),
            },
            None => None,
        };
        let (id, direction) = match &place {
            Some((p, d)) => {
                let (name, desc) = crate::capture::pod_interface(p);
                (self.out.interface(&name, &desc)?, *d)
            }
            None => (
                self.out.interface(&self.sink, "copies not sent or received by a known pod")?,
                Direction::Unknown,
            ),
        };
        let replayed = frame.data.get(6..12) == Some(&mirror_bpf::replay::REPLAY_MAC[..]);
        let comment = if replayed {
            format!("replayed: the request before the trigger, kept by the classifier; {}", self.comment)
        } else {
            self.comment.clone()
        };
        let cut =
            if self.snaplen == 0 { frame.data.len() } else { frame.data.len().min(self.snaplen as usize) };
        self.out.packet(id, frame.time, &frame.data[..cut], frame.orig_len, direction, &comment)?;
        let block = std::mem::take(self.out.get_mut());
        let wrote = self.put(store, &block);
        if wrote == Wrote::Packet {
            self.view.packets += 1;
        }
        Ok(wrote)
    }

    /// Writes `bytes` if the budget has room for them (and the capture's tail), else cuts.
    fn put(&mut self, store: &mut Store, bytes: &[u8]) -> Wrote {
        let id = self.view.id;
        if let Some(full) = store.room(id, bytes.len() as u64) {
            let b = store.budget();
            let why = match full {
                Full::Budget => format!(
                    "the node's capture budget is spent (recorder.max_bytes {}, by the captures open)",
                    b.max_bytes
                ),
                Full::Disk => {
                    format!("the disk has less than recorder.min_free_bytes ({}) free", b.min_free_bytes)
                }
            };
            self.cut(store, format!("cut: {why}: later copies of this flow are not kept"));
            return Wrote::CutByBudget;
        }
        if let Err(e) = self.file.write_all(bytes) {
            self.cut_by_error(store, &e);
            return Wrote::CutByError;
        }
        store.grow(id, bytes.len() as u64);
        self.view.bytes += bytes.len() as u64;
        Wrote::Packet
    }

    fn cut_by_error(&mut self, store: &mut Store, e: &std::io::Error) {
        tracing::warn!(id = self.view.id, dir = %store.dir().display(), error = %e, "writing a capture: cut");
        self.view.cut = Some(format!("cut: writing failed ({e}): later copies of this flow are not kept"));
    }

    /// Cuts the capture: a note says why (written in the room kept for it).
    fn cut(&mut self, store: &mut Store, why: String) {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        if self.out.note(0, now, &why).is_ok() {
            let note = std::mem::take(self.out.get_mut());
            if self.file.write_all(&note).is_ok() {
                store.grow(self.view.id, note.len() as u64);
                self.view.bytes += note.len() as u64;
            }
        }
        self.view.cut = Some(why);
    }

    /// Notes a FIN or a reset of the flow's TCP connection.
    fn follow_close(&mut self, f: &[u8], t: packet::Tuple) {
        if t.proto != 6 {
            return;
        }
        let Some(flags) = packet::tcp_flags(f) else { return };
        if flags & 0x04 != 0 {
            self.reset = true;
        }
        if flags & 0x01 != 0 {
            if t.src < t.dst {
                self.fins.0 = true;
            } else {
                self.fins.1 = true;
            }
        }
        // The connection is over: what is left (the last ACK) comes within the grace.
        if self.ending.is_none() && self.connection_closed() {
            self.ending = Some((Instant::now(), CLOSED));
        }
    }

    /// Whether the flow's connection closed (both FINs, or a reset).
    pub fn connection_closed(&self) -> bool {
        self.reset || (self.fins.0 && self.fins.1)
    }

    /// Flushes what was written to the file; a failure cuts it.
    pub fn flush(&mut self, store: &mut Store) -> Wrote {
        if let Err(e) = self.file.flush() {
            if !self.is_cut() {
                self.cut_by_error(store, &e);
                return Wrote::CutByError;
            }
        }
        Wrote::Packet
    }

    /// Ends the capture: `why` says how its flow's mirror ended; a capture still whole is
    /// `complete`, else `cut`. Returns its final view (the store's metadata written).
    pub fn close(mut self, store: &mut Store, why: &str) -> (CaptureView, Wrote) {
        let mut wrote = self.flush(store);
        self.view.state = if self.is_cut() { "cut" } else { "complete" }.into();
        if !self.is_cut() && why == STOPPED {
            self.cut(store, format!("cut: {STOPPED} before its flow's mirror ended"));
            self.view.state = "cut".into();
            if self.flush(store) == Wrote::CutByError {
                wrote = Wrote::CutByError;
            }
        }
        self.view.ended = Some(why.to_string());
        if let Err(e) = store.close(self.view.id, self.view.clone()) {
            tracing::warn!(id = self.view.id, error = %e, "writing a capture's metadata");
            wrote = Wrote::CutByError;
        }
        (self.view, wrote)
    }
}

/// Why a capture closes when its TCP connection closed.
pub const CLOSED: &str = "the connection closed";

/// Why a capture closes when the agent stops.
pub const STOPPED: &str = "the agent stopped";

/// How long after its mirror was seen to end a capture is closed: copies made before are read
/// by then.
pub const GRACE: Duration = Duration::from_millis(200);
