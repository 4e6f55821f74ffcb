//! Trigger events from the ring buffer, typed.

use std::time::Duration;

use libbpf_rs::{MapMut, RingBuffer, RingBufferBuilder};

use crate::error::{Context, Result};
use crate::flow::FlowKey;
use crate::replay::ReplayedRequest;
use crate::rule::TriggerKind;
use crate::shared::{read_plain, types};

/// Who sent the packet behind a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that sent the requests.
    Client,
    /// The other.
    Server,
}

impl Side {
    /// `client` or `server`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// One trigger: a response, a reset or a request left unanswered matched a rule, and its flow
/// is now mirrored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerEvent {
    /// What triggered.
    pub kind: TriggerKind,
    /// Who sent the packet that triggered: the server for a status, either side for a reset;
    /// none for a request left unanswered (no packet did).
    pub by: Option<Side>,
    /// The flow, as the tuple the response was seen under.
    pub key: FlowKey,
    /// The connection's other tuple when the node's conntrack translated it (a Service):
    /// the response was seen under one, its request under the other.
    pub nat: Option<FlowKey>,
    /// When, monotonic ns.
    pub ts_ns: u64,
    /// The rule that matched.
    pub rule_id: u32,
    /// The response's status (0 for the other kinds).
    pub status: u16,
    /// Interface the packet that triggered was seen on (a request left unanswered: where the
    /// request was).
    pub ifindex: u32,
    /// Seen at egress (else ingress) of that interface.
    pub egress: bool,
    /// The packet that triggered (the request, for one left unanswered) went from `key.hi` to
    /// `key.lo` (else `lo` to `hi`).
    pub reverse: bool,
    /// Request method, when the request was seen.
    pub method: Option<String>,
    /// First bytes (at most 64) of the request target.
    pub target: Option<String>,
    /// From the request's first segment to what triggered: the status line, the reset, or
    /// (a request left unanswered) the mark, the time it waited.
    pub request_to_response: Option<Duration>,
    /// The segment of the flow's latest request, kept before the trigger (and replayed to the
    /// mirror ahead of the response when the replay program is attached).
    pub request: Option<ReplayedRequest>,
}

/// Longest target prefix reported.
const TARGET_MAX: usize = 64;

impl TriggerEvent {
    /// Decodes a ring-buffer record.
    pub fn parse(data: &[u8]) -> Option<Self> {
        if data.len() < std::mem::size_of::<types::trigger_event>() {
            return None;
        }
        let ev: types::trigger_event = read_plain(data);
        let head_len = (ev.request_head_len as usize).min(ev.request_head.len());
        let (method, target) = split_request(&ev.request_head[..head_len]);
        use types::trigger_side as side;
        Some(TriggerEvent {
            kind: TriggerKind::from_raw(u32::from(ev.kind))?,
            by: match u32::from(ev.by) {
                x if x == side::SIDE_CLIENT.0 => Some(Side::Client),
                x if x == side::SIDE_SERVER.0 => Some(Side::Server),
                _ => None,
            },
            key: FlowKey::from(&ev.key),
            nat: (ev.nat.family != 0).then(|| FlowKey::from(&ev.nat)),
            ts_ns: ev.ts_ns,
            rule_id: ev.rule_id,
            status: ev.status,
            ifindex: ev.ifindex,
            egress: ev.hook == types::hook_kind::HOOK_EGRESS.0 as u8,
            reverse: ev.dir == types::flow_dir::FLOW_DIR_REVERSE.0 as u8,
            method,
            target,
            request_to_response: (ev.request_to_response_ns != 0)
                .then(|| Duration::from_nanos(ev.request_to_response_ns)),
            request: (ev.replay_len != 0).then(|| ReplayedRequest {
                ts_ns: ev.replay_ts_ns,
                wire_len: ev.replay_wire_len,
                frame: ev.replay[..(ev.replay_len as usize).min(ev.replay.len())].to_vec(),
            }),
        })
    }
}

/// A ring buffer over the `events` map that calls `f` for each trigger event.
pub(crate) fn ring<F>(events: &MapMut<'_>, mut f: F) -> Result<RingBuffer<'static>>
where
    F: FnMut(TriggerEvent) + 'static,
{
    let mut b = RingBufferBuilder::new();
    b.add(events, move |data: &[u8]| {
        if let Some(ev) = TriggerEvent::parse(data) {
            f(ev);
        }
        0
    })
    .context(|| "opening the events ring buffer".into())?;
    b.build().context(|| "opening the events ring buffer".into())
}

/// Polls `rb` once for at most `timeout`.
pub(crate) fn poll(rb: &RingBuffer<'_>, timeout: Duration) -> Result<()> {
    rb.poll(timeout).context(|| "polling events".into())
}

/// "GET /path HTTP/1.1..." -> ("GET", "/path"), the target cut at a space, CR or 64 bytes.
fn split_request(head: &[u8]) -> (Option<String>, Option<String>) {
    let Some(sp) = head.iter().position(|b| *b == b' ') else {
        return (None, None);
    };
    let method = String::from_utf8_lossy(&head[..sp]).into_owned();
    let rest = &head[sp + 1..];
    let end = rest.iter().position(|b| *b == b' ' || *b == b'\r' || *b == b'\n').unwrap_or(rest.len());
    let target = String::from_utf8_lossy(&rest[..end.min(TARGET_MAX)]).into_owned();
    (Some(method), Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_head_is_split() {
        assert_eq!(
            split_request(b"GET /bar?x=1 HTTP/1.1\r\nHost: a"),
            (Some("GET".into()), Some("/bar?x=1".into()))
        );
        let long = format!("POST /{} HTTP/1.1", "a".repeat(100));
        let (m, t) = split_request(&long.as_bytes()[..88]);
        assert_eq!(m.as_deref(), Some("POST"));
        assert_eq!(t.unwrap().len(), TARGET_MAX);
        assert_eq!(split_request(b""), (None, None));
    }
}
