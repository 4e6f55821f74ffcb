//! Trigger events from the ring buffer, typed.

use std::time::Duration;

use libbpf_rs::{MapMut, RingBuffer, RingBufferBuilder};

use crate::error::{Context, Result};
use crate::flow::FlowKey;
use crate::replay::ReplayedRequest;
use crate::rule::dns::rcode_name;
use crate::rule::grpc::grpc_status_name;
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

/// The protocol of the request behind a trigger: an HTTP version, or DNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpProto {
    /// HTTP/1.x.
    Http1,
    /// HTTP/2 (cleartext).
    Http2,
    /// DNS: the request is a query, named by its question ([`TriggerEvent::dns`]).
    Dns,
}

impl HttpProto {
    /// `http1`, `http2` or `dns`.
    pub fn name(self) -> &'static str {
        match self {
            HttpProto::Http1 => "http1",
            HttpProto::Http2 => "http2",
            HttpProto::Dns => "dns",
        }
    }

    /// From the data path's `enum http_proto` (`None`: not known).
    pub fn from_raw(v: u32) -> Option<Self> {
        use types::http_proto as p;
        match v {
            x if x == p::HTTP_PROTO_1.0 => Some(HttpProto::Http1),
            x if x == p::HTTP_PROTO_2.0 => Some(HttpProto::Http2),
            x if x == p::PROTO_DNS.0 => Some(HttpProto::Dns),
            _ => None,
        }
    }
}

/// A DNS message behind a trigger: its question and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsQuestion {
    /// The message's id (the query's and its response's).
    pub id: u16,
    /// The question's type (`28`: AAAA).
    pub qtype: u16,
    /// The question's name, lower case, without the final dot (at most 80 bytes: a longer one
    /// is cut).
    pub qname: String,
}

/// One trigger: a response, a reset, a request left unanswered, a gRPC call's status or a DNS
/// response's rcode matched a rule, and its flow is now mirrored.
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
    /// The response's status; for [`TriggerKind::Grpc`], the `grpc-status` code (0 to 63, its
    /// name: [`TriggerEvent::grpc_status_name`]); for [`TriggerKind::Dns`], the rcode (0 to
    /// 15, its name: [`TriggerEvent::rcode_name`]); 0 for the other kinds.
    pub status: u16,
    /// Interface the packet that triggered was seen on (a request left unanswered: where the
    /// request was).
    pub ifindex: u32,
    /// Seen at egress (else ingress) of that interface.
    pub egress: bool,
    /// The packet that triggered (the request, for one left unanswered) went from `key.hi` to
    /// `key.lo` (else `lo` to `hi`).
    pub reverse: bool,
    /// The protocol of the request (its HTTP version, or DNS), when known.
    pub proto: Option<HttpProto>,
    /// HTTP/2: the request's stream id (`None` for HTTP/1.x).
    pub stream: Option<u32>,
    /// HTTP/2: the request's `:authority`, lower case, without a port (at most 64 bytes).
    pub authority: Option<String>,
    /// Request method, when the request was seen (HTTP/2: its `:method`).
    pub method: Option<String>,
    /// First bytes (at most 64) of the request target (HTTP/2: of its `:path`).
    pub target: Option<String>,
    /// DNS: the message's question and id (`method` and `target` are then `None`).
    pub dns: Option<DnsQuestion>,
    /// From the request's first segment to what triggered: the status line, the reset, or
    /// (a request left unanswered) the mark, the time it waited; DNS: from the query to its
    /// response (`None` when the query was not seen).
    pub request_to_response: Option<Duration>,
    /// Whether the request behind the trigger is named (`method`, `target`, `request`).
    pub request_state: RequestState,
    /// The segment of the request behind the trigger, kept before it (and replayed to the
    /// mirror ahead of the response when the replay program is attached).
    pub request: Option<ReplayedRequest>,
    /// A drop ([`TriggerKind::Drop`]): the packet the kernel dropped, why and where.
    pub dropped: Option<DroppedPacket>,
}

/// A packet the kernel dropped, as the drop program copied it (`include/drop.h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedPacket {
    /// The kernel's reason (`enum skb_drop_reason` of the running kernel; its name:
    /// [`DroppedPacket::reason_name`]).
    pub reason: u16,
    /// Where in the kernel: the address of kfree_skb's caller.
    pub location: u64,
    /// Its length from the network header, plus an Ethernet header's 14 bytes.
    pub wire_len: u32,
    /// An Ethernet header (the packet's own when it had one, else zero addresses) and its first
    /// bytes from the network header on (at most 640 in all).
    pub frame: Vec<u8>,
}

impl DroppedPacket {
    /// The reason's name on this kernel (`netfilter_drop`), else its number.
    pub fn reason_name(&self) -> String {
        crate::rule::drop::reason_text(self.reason)
    }

    /// The frame as the mirror gets it: its Ethernet source [`DROP_MAC`], and a frame kept cut
    /// given the length it carries (as a replay's: [`ReplayedRequest::reshaped`]).
    pub fn reshaped(&self) -> Option<Vec<u8>> {
        let r = ReplayedRequest { ts_ns: 0, wire_len: self.wire_len, frame: self.frame.clone() };
        let mut frame = r.reshaped()?;
        frame[6..12].copy_from_slice(&DROP_MAC);
        Some(frame)
    }
}

/// The Ethernet source of a dropped packet's copy on the mirror: locally administered,
/// "\2drops" (the replayed request's is [`crate::replay::REPLAY_MAC`]).
pub const DROP_MAC: [u8; 6] = *b"\x02drops";

/// What the classifier knows of the request behind a trigger: it names the one answered, or
/// none, never another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// No request was pending: none seen before the answer (a connection followed late), or
    /// every one answered already.
    NonePending,
    /// The request is named.
    Named,
    /// The request was pending but not kept: pushed out of the flow's queue by later ones, or
    /// uncertain after a loss of the stream's framing.
    NotKept,
}

impl RequestState {
    /// From the data path's `enum trigger_request`.
    pub fn from_raw(v: u32) -> Self {
        use types::trigger_request as r;
        match v {
            x if x == r::REQUEST_KEPT.0 => RequestState::Named,
            x if x == r::REQUEST_NOT_KEPT.0 => RequestState::NotKept,
            _ => RequestState::NonePending,
        }
    }

    /// Why no request is named (`None` when one is), as events show it.
    pub fn missing(self) -> Option<&'static str> {
        match self {
            RequestState::Named => None,
            RequestState::NonePending => Some("none pending"),
            RequestState::NotKept => Some("not kept"),
        }
    }
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
        let kind = TriggerKind::from_raw(u32::from(ev.kind))?;
        let proto = HttpProto::from_raw(u32::from(ev.proto));
        let head_len = (ev.request_head_len as usize).min(ev.request_head.len());
        let head = &ev.request_head[..head_len];
        // A DNS message's head is its question's name, not a request line.
        let dns = (kind == TriggerKind::Dns || proto == Some(HttpProto::Dns)).then(|| DnsQuestion {
            id: ev.dns_id,
            qtype: ev.dns_type,
            qname: String::from_utf8_lossy(head).into_owned(),
        });
        let (method, target) = if dns.is_some() { (None, None) } else { split_request(head) };
        let authority_len = (ev.authority_len as usize).min(ev.authority.len());
        use types::trigger_side as side;
        Some(TriggerEvent {
            kind,
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
            proto,
            stream: (ev.stream != 0).then_some(ev.stream),
            authority: (authority_len != 0)
                .then(|| String::from_utf8_lossy(&ev.authority[..authority_len]).into_owned()),
            method,
            target,
            dns,
            request_to_response: (ev.request_to_response_ns != 0)
                .then(|| Duration::from_nanos(ev.request_to_response_ns)),
            request_state: RequestState::from_raw(u32::from(ev.request)),
            dropped: (kind == TriggerKind::Drop).then(|| DroppedPacket {
                reason: ev.status,
                location: ev.location,
                wire_len: ev.replay_wire_len,
                frame: ev.replay[..(ev.replay_len as usize).min(ev.replay.len())].to_vec(),
            }),
            request: (ev.replay_len != 0 && kind != TriggerKind::Drop).then(|| ReplayedRequest {
                ts_ns: ev.replay_ts_ns,
                wire_len: ev.replay_wire_len,
                frame: ev.replay[..(ev.replay_len as usize).min(ev.replay.len())].to_vec(),
            }),
        })
    }

    /// For a gRPC trigger, the canonical name of its code (`INTERNAL`), for the codes gRPC
    /// names (0 to 16).
    pub fn grpc_status_name(&self) -> Option<&'static str> {
        (self.kind == TriggerKind::Grpc).then(|| grpc_status_name(self.status)).flatten()
    }

    /// For a DNS trigger, the name of its rcode (`NXDOMAIN`), for the rcodes DNS names (0 to
    /// 11).
    pub fn rcode_name(&self) -> Option<&'static str> {
        (self.kind == TriggerKind::Dns).then(|| rcode_name(self.status)).flatten()
    }
}

/// One ring buffer over the maps `rings` (the triggers' `events`, the drops' `drop_events`)
/// that calls `f` for each trigger event.
pub(crate) fn ring<F>(rings: &[&MapMut<'_>], f: F) -> Result<RingBuffer<'static>>
where
    F: FnMut(TriggerEvent) + 'static,
{
    let f = std::rc::Rc::new(std::cell::RefCell::new(f));
    let mut b = RingBufferBuilder::new();
    for events in rings {
        let f = f.clone();
        b.add(*events, move |data: &[u8]| {
            if let Some(ev) = TriggerEvent::parse(data) {
                (f.borrow_mut())(ev);
            }
            0
        })
        .context(|| "opening the events ring buffer".into())?;
    }
    b.build().context(|| "opening the events ring buffer".into())
}

/// Polls `rb` once for at most `timeout`.
pub(crate) fn poll(rb: &RingBuffer<'_>, timeout: Duration) -> Result<()> {
    rb.poll(timeout).context(|| "polling events".into())
}

/// "GET /path HTTP/1.1..." -> ("GET", "/path"), the target cut at a space, CR or 64 bytes; an
/// HTTP/2 request's "POST /pkg.Service/Method" likewise.
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

    /// A ring-buffer record as the classifier writes it.
    fn record(kind: types::trigger_kind, status: u16, head: &[u8]) -> types::trigger_event {
        let mut ev = types::trigger_event { kind: kind.0 as u8, status, rule_id: 7, ..Default::default() };
        ev.key.family = 4;
        ev.key.proto = 6;
        ev.request_head[..head.len()].copy_from_slice(head);
        ev.request_head_len = head.len() as u32;
        ev
    }

    #[test]
    fn http2_and_grpc_fields_are_read() {
        let mut raw = record(types::trigger_kind::TRIGGER_GRPC, 13, b"POST /helloworld.Greeter/SayHello");
        raw.proto = types::http_proto::HTTP_PROTO_2.0 as u8;
        raw.by = types::trigger_side::SIDE_SERVER.0 as u8;
        raw.stream = 5;
        raw.authority[..15].copy_from_slice(b"greeter.example");
        raw.authority_len = 15;
        raw.request_to_response_ns = 2_000_000;
        let ev = TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap();
        assert_eq!((ev.kind, ev.status, ev.grpc_status_name()), (TriggerKind::Grpc, 13, Some("INTERNAL")));
        assert_eq!((ev.proto, ev.stream, ev.by), (Some(HttpProto::Http2), Some(5), Some(Side::Server)));
        assert_eq!(ev.authority.as_deref(), Some("greeter.example"));
        assert_eq!(ev.method.as_deref(), Some("POST"));
        assert_eq!(ev.target.as_deref(), Some("/helloworld.Greeter/SayHello"));
        assert_eq!(ev.request_to_response, Some(Duration::from_millis(2)));
        // A code gRPC does not name.
        raw.status = 40;
        assert_eq!(TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap().grpc_status_name(), None);
    }

    #[test]
    fn dns_fields_are_read() {
        let mut raw = record(types::trigger_kind::TRIGGER_DNS, 3, b"web.shop.svc.cluster.local");
        raw.proto = types::http_proto::PROTO_DNS.0 as u8;
        raw.by = types::trigger_side::SIDE_SERVER.0 as u8;
        raw.request = types::trigger_request::REQUEST_KEPT.0 as u8;
        (raw.dns_type, raw.dns_id) = (28, 0xbeef);
        raw.request_to_response_ns = 1_500_000;
        let ev = TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap();
        assert_eq!((ev.kind, ev.status, ev.rcode_name()), (TriggerKind::Dns, 3, Some("NXDOMAIN")));
        assert_eq!(
            (ev.proto, ev.by, ev.request_state),
            (Some(HttpProto::Dns), Some(Side::Server), RequestState::Named)
        );
        let q = ev.dns.as_ref().unwrap();
        assert_eq!((q.id, q.qtype, q.qname.as_str()), (0xbeef, 28, "web.shop.svc.cluster.local"));
        assert_eq!((&ev.method, &ev.target), (&None, &None), "a name is no request line");
        assert_eq!(
            (ev.grpc_status_name(), ev.request_to_response),
            (None, Some(Duration::from_micros(1500)))
        );
        // A response whose query was not seen: no time, none pending; an rcode DNS names not.
        raw.request = types::trigger_request::REQUEST_NONE.0 as u8;
        (raw.request_to_response_ns, raw.status) = (0, 13);
        let ev = TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap();
        assert_eq!((ev.request_to_response, ev.request_state.missing()), (None, Some("none pending")));
        assert_eq!((ev.status, ev.rcode_name()), (13, None));
        assert_eq!(ev.dns.unwrap().qname, "web.shop.svc.cluster.local", "the response's own question");
    }

    #[test]
    fn http1_events_have_no_stream() {
        let mut raw = record(types::trigger_kind::TRIGGER_STATUS, 13, b"GET /bar HTTP/1.1\r\n");
        raw.proto = types::http_proto::HTTP_PROTO_1.0 as u8;
        let ev = TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap();
        assert_eq!(
            (ev.kind, ev.proto, ev.stream, ev.authority.as_deref()),
            (TriggerKind::Status, Some(HttpProto::Http1), None, None)
        );
        assert_eq!(ev.grpc_status_name(), None, "status 13 is no gRPC code here");
        assert_eq!((ev.rcode_name(), ev.dns), (None, None));
        assert_eq!(ev.target.as_deref(), Some("/bar"));
        raw.proto = types::http_proto::HTTP_PROTO_UNKNOWN.0 as u8;
        assert_eq!(TriggerEvent::parse(crate::shared::bytes_of(&raw)).unwrap().proto, None);
        assert_eq!(TriggerEvent::parse(&crate::shared::bytes_of(&raw)[1..]), None, "a short record");
    }
}
