//! HTTP/2 (cleartext) and gRPC on captured TCP connections, read the way an endpoint reads
//! them, and what the mirror must carry for rules on their statuses.
//!
//! Each direction's bytes are put back together by sequence number ([`http_stream::connections`])
//! and read as HTTP/2 from where it begins: after the client preface (prior knowledge), at a
//! SETTINGS frame opening the server's side, or after an HTTP/1.1 request with `Upgrade: h2c`
//! and its `101` (the request is then stream 1). Frames follow one another by their lengths,
//! wherever segments cut them; header blocks (HEADERS or PUSH_PROMISE and their CONTINUATION
//! frames) are decoded with HPACK (`loona-hpack`: static and dynamic tables, Huffman), one
//! decoder per direction, as the receiver decodes them.
//!
//! A response's `:status` is in the server's HEADERS that carry one; a gRPC call's
//! `grpc-status` in the server's HEADERS that end the stream (trailers, or a trailers-only
//! response). A rule ([`H2Rule`]: `status=`, `grpc-status=`, with `path=` and `host=` on the
//! request of the same stream) triggers at the packet that carried the last byte of that
//! HEADERS frame: from it on, both directions of the connection must be mirrored, each packet
//! once ([`H2Expected::expected`], compared by [`Expected::compare_mirror`]).
//!
//! A mirror starts in the middle of a connection, so a reader of it (Wireshark) lacks the
//! dynamic-table entries inserted before: [`late_view`] says what such a reader can decode of
//! each mirrored packet (the request replayed ahead of the copies first, then frames from the
//! first copied segment that begins one; fields whose name or value refers to an entry it never
//! saw are `<unknown>` and empty, as Wireshark shows them).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::SocketAddr;

use loona_hpack::huffman::HuffmanDecoder;
use loona_hpack::Decoder;
use mirror_bpf::FlowKey;

use crate::capture::pcap::{Packet, PacketId, Trace};
use crate::oracles::http_stream::{self, Parsed, Stream};
use crate::oracles::oracle::{Expected, TriggeredFlow};

/// What a client sends first when it knows the server speaks HTTP/2.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types.
pub mod frame {
    /// DATA.
    pub const DATA: u8 = 0;
    /// HEADERS.
    pub const HEADERS: u8 = 1;
    /// SETTINGS.
    pub const SETTINGS: u8 = 4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 5;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 9;
    /// Flag END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// Flag END_HEADERS.
    pub const END_HEADERS: u8 = 0x4;
    /// Flag PADDED.
    pub const PADDED: u8 = 0x8;
    /// Flag PRIORITY (HEADERS).
    pub const PRIORITY: u8 = 0x20;
}

/// A decoded header list: (name, value), in order.
pub type Fields = Vec<(String, String)>;

/// One frame of a direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Where its header starts in the direction's byte stream.
    pub offset: usize,
    /// Payload length.
    pub len: usize,
    /// Type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream id.
    pub stream: u32,
    /// Index in the trace of the packet that carried its first byte.
    pub first_packet: usize,
    /// Index of the packet that carried its last byte (where a reader has it whole).
    pub packet: usize,
    /// DATA: its payload (padding removed).
    pub data: Vec<u8>,
}

/// A header block: a HEADERS (or PUSH_PROMISE) frame and the CONTINUATION frames after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Its stream.
    pub stream: u32,
    /// HEADERS or PUSH_PROMISE.
    pub kind: u8,
    /// The HEADERS frame ends the stream.
    pub end_stream: bool,
    /// Index in the direction's frames of its first frame.
    pub frame: usize,
    /// Index in the trace of the packet that carried the last byte of its first frame: where a
    /// classifier reading it knows what the frame says.
    pub packet: usize,
    /// It went on in CONTINUATION frames.
    pub continued: bool,
    /// The HPACK-encoded block, fragments joined.
    pub encoded: Vec<u8>,
    /// Its fields, or why they could not be decoded.
    pub fields: Result<Fields, String>,
}

impl Block {
    /// The value of the first field named `name`.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.as_ref().ok()?.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// `:status`, when it has one.
    pub fn status(&self) -> Option<u16> {
        self.field(":status")?.parse().ok()
    }

    /// `grpc-status`, when the block ends its stream (trailers) and has one.
    pub fn grpc_status(&self) -> Option<u32> {
        self.end_stream.then(|| self.field("grpc-status")?.parse().ok()).flatten()
    }
}

/// How a direction began speaking HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The client preface.
    Preface,
    /// The server's SETTINGS frame at the start.
    Settings,
    /// The client's HTTP/1.1 request with `Upgrade: h2c`, then the preface.
    Upgrade,
    /// The server's `101 Switching Protocols`.
    Switched,
}

/// One direction of an HTTP/2 connection.
#[derive(Debug)]
pub struct Direction {
    /// Sender.
    pub from: SocketAddr,
    /// Receiver.
    pub to: SocketAddr,
    /// How it began.
    pub start: Start,
    /// Where its first frame starts in its byte stream.
    pub frames_at: usize,
    /// Its frames, in order.
    pub frames: Vec<Frame>,
    /// Its header blocks, in order.
    pub blocks: Vec<Block>,
    /// Why reading stopped before its end, if it did.
    pub stopped: Option<String>,
    /// Its bytes.
    pub bytes: Stream,
}

/// A request, from the client's HEADERS (or the HTTP/1.1 request that asked for the upgrade).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its stream.
    pub stream: u32,
    /// `:method`.
    pub method: String,
    /// `:path`.
    pub path: String,
    /// `:authority` (or Host).
    pub authority: Option<String>,
}

/// One TCP connection of a trace that speaks HTTP/2 in some direction.
#[derive(Debug)]
pub struct Conversation {
    /// The connection.
    pub flow: FlowKey,
    /// The side that opened it.
    pub client: SocketAddr,
    /// The other.
    pub server: SocketAddr,
    /// Client to server, if seen and HTTP/2.
    pub to_server: Option<Direction>,
    /// Server to client, if seen and HTTP/2.
    pub to_client: Option<Direction>,
    /// The requests, by stream.
    pub requests: BTreeMap<u32, Request>,
}

impl Conversation {
    /// Both directions that were read.
    pub fn directions(&self) -> impl Iterator<Item = &Direction> {
        self.to_server.iter().chain(self.to_client.iter())
    }

    /// Header blocks that failed to decode, in both directions.
    pub fn undecoded(&self) -> Vec<String> {
        self.directions()
            .flat_map(|d| {
                d.blocks
                    .iter()
                    .filter_map(|b| b.fields.as_ref().err())
                    .map(move |e| format!("{} > {}: {e}", d.from, d.to))
            })
            .chain(
                self.directions()
                    .filter_map(|d| d.stopped.as_ref().map(|s| format!("{} > {}: {s}", d.from, d.to))),
            )
            .collect()
    }
}

/// Every connection of `trace` that speaks HTTP/2 in some direction, in the order of their
/// first packet.
pub fn conversations(trace: &Trace) -> Vec<Conversation> {
    http_stream::connections(trace).into_iter().filter_map(read).collect()
}

fn read(mut c: http_stream::Connection) -> Option<Conversation> {
    let ends = [c.flow.lo, c.flow.hi];
    // The opener is the client; without a handshake, the side that sends the preface, or not
    // the side that starts with SETTINGS or a 101.
    let client = c.opener.unwrap_or_else(|| {
        let starts =
            |side: SocketAddr, what: &[u8]| c.streams.get(&side).is_some_and(|s| s.data.starts_with(what));
        let server_like = |side: SocketAddr| {
            starts(side, b"HTTP/1.1 101") || c.streams.get(&side).is_some_and(|s| settings_at(&s.data, 0))
        };
        if starts(ends[1], PREFACE) || server_like(ends[0]) {
            ends[1]
        } else {
            ends[0]
        }
    });
    let server = if client == ends[0] { ends[1] } else { ends[0] };
    let mut requests = BTreeMap::new();
    let to_server = c.streams.remove(&client).and_then(|s| direction(client, server, s, true, &mut requests));
    let to_client =
        c.streams.remove(&server).and_then(|s| direction(server, client, s, false, &mut requests));
    if to_server.is_none() && to_client.is_none() {
        return None;
    }
    if let Some(d) = &to_server {
        for b in d.blocks.iter().filter(|b| b.kind == frame::HEADERS) {
            if let (Some(method), Some(path)) = (b.field(":method"), b.field(":path")) {
                requests.entry(b.stream).or_insert_with(|| Request {
                    stream: b.stream,
                    method: method.to_string(),
                    path: path.to_string(),
                    authority: b.field(":authority").map(str::to_string),
                });
            }
        }
    }
    Some(Conversation { flow: c.flow, client, server, to_server, to_client, requests })
}

/// Whether a SETTINGS frame header on stream 0 starts at `off`.
fn settings_at(data: &[u8], off: usize) -> bool {
    data.len() >= off + 9
        && data[off + 3] == frame::SETTINGS
        && data[off + 5..off + 9] == [0; 4]
        && u32::from_be_bytes([0, data[off], data[off + 1], data[off + 2]]).is_multiple_of(6)
}

/// A direction's stream read as HTTP/2, if it is; an upgrade request is put in `requests`.
fn direction(
    from: SocketAddr,
    to: SocketAddr,
    bytes: Stream,
    client: bool,
    requests: &mut BTreeMap<u32, Request>,
) -> Option<Direction> {
    let data = &bytes.data;
    let (start, at) = if client && data.starts_with(PREFACE) {
        (Start::Preface, PREFACE.len())
    } else if client {
        // An HTTP/1.1 request asking for h2c, then the preface.
        let Parsed::Done(r, n) = http_stream::request(data) else { return None };
        let upgrade = r.head.values("upgrade").any(|v| v.eq_ignore_ascii_case("h2c"));
        if !upgrade || !data[n..].starts_with(PREFACE) {
            return None;
        }
        requests.insert(
            1,
            Request {
                stream: 1,
                method: r.method.clone(),
                path: r.target.clone(),
                authority: r.head.values("host").next().map(str::to_string),
            },
        );
        (Start::Upgrade, n + PREFACE.len())
    } else if data.starts_with(b"HTTP/1.1 101") {
        let end = data.windows(4).position(|w| w == b"\r\n\r\n")?;
        (Start::Switched, end + 4)
    } else if settings_at(data, 0) {
        (Start::Settings, 0)
    } else {
        return None;
    };
    let mut d = Direction {
        from,
        to,
        start,
        frames_at: at,
        frames: Vec::new(),
        blocks: Vec::new(),
        stopped: None,
        bytes: Stream::default(),
    };
    let (frames, stopped) = read_frames(&bytes, at);
    d.frames = frames;
    d.stopped = stopped;
    d.blocks = blocks(&d.frames, &bytes.data);
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(1 << 20);
    let mut failed = false;
    for b in &mut d.blocks {
        b.fields = if failed {
            Err("after a block that failed".to_string())
        } else {
            decoder.decode(&b.encoded).map(|fields| fields.into_iter().map(text).collect()).map_err(|e| {
                failed = true;
                format!("stream {}: HPACK: {e:?}", b.stream)
            })
        };
    }
    d.bytes = bytes;
    Some(d)
}

fn text((name, value): (Vec<u8>, Vec<u8>)) -> (String, String) {
    (String::from_utf8_lossy(&name).into_owned(), String::from_utf8_lossy(&value).into_owned())
}

/// The frames of `bytes` from `at` (a frame start) to the last whole one; why it stopped early.
fn read_frames(bytes: &Stream, at: usize) -> (Vec<Frame>, Option<String>) {
    let data = &bytes.data;
    let mut frames = Vec::new();
    let mut off = at;
    while off + 9 <= data.len() {
        let len = u32::from_be_bytes([0, data[off], data[off + 1], data[off + 2]]) as usize;
        if len > 1 << 24 {
            return (frames, Some(format!("a frame of {len} bytes at byte {off}")));
        }
        let end = off + 9 + len;
        if end > data.len() {
            break;
        }
        let (kind, flags) = (data[off + 3], data[off + 4]);
        let stream = u32::from_be_bytes(data[off + 5..off + 9].try_into().unwrap()) & 0x7fff_ffff;
        let payload = &data[off + 9..end];
        let data_payload = if kind == frame::DATA {
            unpad(payload, flags, 0).unwrap_or_default().to_vec()
        } else {
            Vec::new()
        };
        frames.push(Frame {
            offset: off,
            len,
            kind,
            flags,
            stream,
            first_packet: bytes.packet_at(off),
            packet: bytes.packet_at(end - 1),
            data: data_payload,
        });
        off = end;
    }
    (frames, None)
}

/// A frame's payload without its padding and the `skip` bytes after the pad length.
fn unpad(payload: &[u8], flags: u8, skip: usize) -> Option<&[u8]> {
    let (pad, rest) = if flags & frame::PADDED != 0 {
        (usize::from(*payload.first()?), &payload[1..])
    } else {
        (0, payload)
    };
    rest.get(skip..rest.len().checked_sub(pad)?)
}

/// The header blocks of `frames` (not decoded yet).
fn blocks(frames: &[Frame], data: &[u8]) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    let mut open = false;
    for (i, f) in frames.iter().enumerate() {
        let payload = &data[f.offset + 9..f.offset + 9 + f.len];
        let fragment = match f.kind {
            frame::HEADERS => unpad(payload, f.flags, if f.flags & frame::PRIORITY != 0 { 5 } else { 0 }),
            frame::PUSH_PROMISE => unpad(payload, f.flags, 4),
            frame::CONTINUATION if open => Some(payload),
            _ => continue,
        };
        let fragment = fragment.unwrap_or_default();
        if f.kind == frame::CONTINUATION {
            let b = out.last_mut().expect("a block is open");
            b.continued = true;
            b.encoded.extend_from_slice(fragment);
        } else {
            out.push(Block {
                stream: f.stream,
                kind: f.kind,
                end_stream: f.kind == frame::HEADERS && f.flags & frame::END_STREAM != 0,
                frame: i,
                packet: f.packet,
                continued: false,
                encoded: fragment.to_vec(),
                fields: Ok(Vec::new()),
            });
        }
        open = f.flags & frame::END_HEADERS == 0;
    }
    out
}

/// What a rule triggers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// A final `:status` in one of these ranges.
    Status(Vec<(u16, u16)>),
    /// A `grpc-status` in the trailers, one of these codes.
    Grpc(BTreeSet<u32>),
}

/// The part of a rule the oracle follows, from the rule's text: `status=500` (`5xx`,
/// `500-504`, lists), `grpc-status=13` or `grpc-status=internal,unavailable`, `path=` (a
/// prefix of `:path`), `host=` (`:authority` without its port, case-insensitive); limits and
/// other words are left to the classifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Rule {
    /// Its text.
    pub text: String,
    /// What triggers.
    pub condition: Condition,
    /// `path=`.
    pub path: Option<String>,
    /// `host=`.
    pub host: Option<String>,
}

impl fmt::Display for H2Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A gRPC code by number or name.
pub fn grpc_code(word: &str) -> Option<u32> {
    word.parse().ok().or_else(|| {
        mirror_bpf::rule::grpc::GRPC_STATUS_NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(word))
            .map(|c| c as u32)
    })
}

impl H2Rule {
    /// Reads a rule's text; panics on a trigger it does not know.
    #[track_caller]
    pub fn parse(text: &str) -> H2Rule {
        let (mut condition, mut path, mut host) = (None, None, None);
        for word in text.split_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            match key {
                "status" => {
                    let ranges = value
                        .split(',')
                        .map(|v| match (v.split_once('-'), v.strip_suffix("xx")) {
                            (Some((lo, hi)), _) => (lo.parse().unwrap(), hi.parse().unwrap()),
                            (None, Some(class)) => {
                                let c: u16 = class.parse().unwrap();
                                (c * 100, c * 100 + 99)
                            }
                            _ => (v.parse().unwrap(), v.parse().unwrap()),
                        })
                        .collect();
                    condition = Some(Condition::Status(ranges));
                }
                "grpc-status" => {
                    let codes = value
                        .split(',')
                        .map(|c| grpc_code(c).unwrap_or_else(|| panic!("{text}: no gRPC code {c}")))
                        .collect();
                    condition = Some(Condition::Grpc(codes));
                }
                "path" => path = Some(value.to_string()),
                "host" => host = Some(value.to_ascii_lowercase()),
                _ => {}
            }
        }
        let condition = condition.unwrap_or_else(|| panic!("{text}: no status or grpc-status"));
        H2Rule { text: text.to_string(), condition, path, host }
    }

    /// What of `b` (a server's header block) it triggers on, `request` being the stream's:
    /// `(kind, code)`.
    pub fn matches(&self, b: &Block, request: Option<&Request>) -> Option<(H2Kind, u32)> {
        self.matches_outcome(
            b.status(),
            b.grpc_status(),
            request.map(|r| (r.path.as_str(), r.authority.as_deref())),
        )
    }

    /// What of a call's outcome (a final `:status`, a `grpc-status` in its trailers) it
    /// triggers on, `request` being the call's `(:path, :authority)` when known: `(kind, code)`.
    pub fn matches_outcome(
        &self,
        status: Option<u16>,
        grpc_status: Option<u32>,
        request: Option<(&str, Option<&str>)>,
    ) -> Option<(H2Kind, u32)> {
        let hit = match &self.condition {
            Condition::Status(ranges) => status
                .filter(|s| *s >= 200 && ranges.iter().any(|(lo, hi)| (lo..=hi).contains(&s)))
                .map(|s| (H2Kind::Status, u32::from(s))),
            Condition::Grpc(codes) => grpc_status.filter(|c| codes.contains(c)).map(|c| (H2Kind::Grpc, c)),
        }?;
        if self.path.is_some() || self.host.is_some() {
            let (path, authority) = request?;
            if self.path.as_ref().is_some_and(|p| !path.starts_with(p.as_str())) {
                return None;
            }
            let authority = authority.map(|a| host_of(a).to_ascii_lowercase());
            if self.host.as_ref().is_some_and(|h| authority.as_deref() != Some(h.as_str())) {
                return None;
            }
        }
        Some(hit)
    }
}

/// `host:port` or `[v6]:port` without the port.
pub fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(authority, |(h, _)| h)
}

/// Which kind of trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum H2Kind {
    /// A `:status`.
    Status,
    /// A `grpc-status`.
    Grpc,
}

/// The first trigger of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Trigger {
    /// The connection.
    pub flow: FlowKey,
    /// Index in the trace of the packet that carried the triggering HEADERS frame's end.
    pub packet: usize,
    /// The stream.
    pub stream: u32,
    /// What triggered.
    pub kind: H2Kind,
    /// The `:status` or `grpc-status`.
    pub code: u32,
    /// Index of the rule (in the list given) that matched first.
    pub rule: usize,
    /// The stream's request, when seen.
    pub request: Option<Request>,
}

/// The first trigger of `c` under `rules`, if any: the first server header block that some
/// rule matches (the lowest-indexed such rule).
pub fn first_trigger(c: &Conversation, rules: &[H2Rule]) -> Option<H2Trigger> {
    let d = c.to_client.as_ref()?;
    d.blocks.iter().find_map(|b| {
        let request = c.requests.get(&b.stream);
        rules.iter().enumerate().find_map(|(i, r)| {
            r.matches(b, request).map(|(kind, code)| H2Trigger {
                flow: c.flow,
                packet: b.packet,
                stream: b.stream,
                kind,
                code,
                rule: i,
                request: request.cloned(),
            })
        })
    })
}

/// What the mirror of a capture must carry, with what the oracle read in it.
pub struct H2Expected {
    /// The packets, and the triggered flows (`status`: the `:status` or gRPC code; `target`:
    /// the `:path`).
    pub expected: Expected,
    /// Each triggered connection's first trigger, in trigger order.
    pub triggers: Vec<H2Trigger>,
    /// The HTTP/2 connections of the capture.
    pub conversations: Vec<Conversation>,
}

impl H2Expected {
    /// Reads `reference` (a capture at an endpoint, from the connections' start) under `rules`.
    pub fn from_reference(reference: &Trace, rules: &[H2Rule]) -> H2Expected {
        let conversations = conversations(reference);
        let mut triggers: Vec<H2Trigger> =
            conversations.iter().filter_map(|c| first_trigger(c, rules)).collect();
        triggers.sort_by_key(|t| t.packet);
        let first = triggers
            .iter()
            .map(|t| {
                let flow = TriggeredFlow {
                    flow: t.flow,
                    status: t.code as u16,
                    packets: 0,
                    method: t.request.as_ref().map(|r| r.method.clone()),
                    target: t.request.as_ref().map(|r| r.path.clone()),
                };
                (t.flow, (t.packet, flow))
            })
            .collect();
        H2Expected { expected: Expected::from_first(reference, first), triggers, conversations }
    }

    /// The conversation of `flow`.
    pub fn conversation(&self, flow: FlowKey) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.flow == flow)
    }
}

/// The trigger packets of `trace` under `rules`, with the code each reports: what
/// [`crate::oracles::nat_oracle::NatExpected::from_triggers`] takes, for a capture that may
/// hold one direction only (then the rules must not filter on the request).
pub fn trigger_packets(trace: &Trace, rules: &[H2Rule]) -> Vec<(usize, u16)> {
    conversations(trace)
        .iter()
        .filter_map(|c| first_trigger(c, rules))
        .map(|t| (t.packet, t.code as u16))
        .collect()
}

/// One frame as a reader of the mirror sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenFrame {
    /// Type.
    pub kind: u8,
    /// Stream.
    pub stream: u32,
    /// A header block's first frame: its fields as a late reader decodes them (`<unknown>`
    /// and an empty value for what it cannot resolve).
    pub fields: Option<Fields>,
    /// DATA: the lengths of the gRPC messages that begin in it, its payload read as gRPC's
    /// length-prefixed messages (meaningful on gRPC streams only).
    pub messages: Vec<u32>,
    /// DATA of a stream whose `content-type` this reader decoded as gRPC in this direction.
    pub grpc_known: bool,
}

/// What a reader of the mirror can make of one direction of a triggered connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateDirection {
    /// Sender.
    pub from: SocketAddr,
    /// Receiver.
    pub to: SocketAddr,
    /// Its first mirrored segment begins a frame, and a replayed segment ahead of it, if any,
    /// holds whole frames from a frame's start (else nothing is claimed of it).
    pub aligned: bool,
    /// Why not, when it is not.
    pub unaligned: Option<&'static str>,
    /// The segment replayed ahead of the copies in this direction, when there is one and it is
    /// read.
    pub replayed: Option<PacketId>,
    /// Frames from there on, by the packet that completes each (its id).
    pub frames: BTreeMap<PacketId, Vec<SeenFrame>>,
}

/// What a reader that starts at packet `from` (index in `trace`, the mirror's first packet of
/// `c`) can decode of each direction of `c`: frames from the direction's first segment at or
/// after `from` on, if that segment begins a frame; header blocks decoded without the
/// dynamic-table entries inserted before; gRPC messages in DATA frames of streams whose
/// `content-type` it decoded in that direction. `replayed` are segments the mirror carries
/// ahead of the copies (the request behind a trigger, as the mirror has it, maybe cut): the
/// reader reads their whole frames first. With `from` 0, what a reader of the whole connection
/// decodes.
pub fn late_view(c: &Conversation, trace: &Trace, from: usize, replayed: &[&Packet]) -> Vec<LateDirection> {
    c.directions()
        .map(|d| {
            let mut out = LateDirection {
                from: d.from,
                to: d.to,
                aligned: false,
                unaligned: None,
                replayed: None,
                frames: BTreeMap::new(),
            };
            let not = |why: &'static str| {
                let mut out = out.clone();
                out.unaligned = Some(why);
                out
            };
            let first = trace
                .packets
                .iter()
                .enumerate()
                .skip(from)
                .filter(|(_, p)| p.src == d.from && p.dst == d.to && !p.payload.is_empty())
                .find_map(|(i, _)| d.bytes.offset_of(i));
            // From the start: where the frames begin (after a preface or an upgrade).
            let start = if from == 0 { d.frames.first().map(|f| f.offset) } else { first };
            let Some(start) = start else { return not("no payload from there on") };
            let Some(k) = d.frames.iter().position(|f| f.offset == start) else {
                return not("its first segment from there on begins inside a frame");
            };
            // A replayed segment: the frames it holds whole, if it begins one and cuts none.
            let mut read: Vec<(usize, PacketId)> = Vec::new();
            if let Some(r) = replayed.iter().find(|r| r.src == d.from && r.dst == d.to) {
                let same = |p: &&Packet| {
                    (p.src, p.dst, p.seq, p.ack, p.flags) == (r.src, r.dst, r.seq, r.ack, r.flags)
                };
                let Some(o) = trace.packets.iter().position(|p| same(&p)).and_then(|i| d.bytes.offset_of(i))
                else {
                    return not("the replayed segment is not in the capture");
                };
                let (begin, end) = (if o == 0 { d.frames_at } else { o }, o + r.payload.len());
                let Some(j) = d.frames.iter().position(|f| f.offset == begin) else {
                    return not("the replayed segment begins inside a frame");
                };
                for (i, f) in
                    d.frames.iter().enumerate().skip(j).take_while(|(_, f)| f.offset < end.min(start))
                {
                    if f.offset + 9 + f.len > end {
                        return not("the replayed segment ends inside a frame");
                    }
                    read.push((i, r.id()));
                }
                out.replayed = Some(r.id());
            }
            read.extend(d.frames.iter().enumerate().skip(k).map(|(i, f)| (i, trace.packets[f.packet].id())));
            out.aligned = true;
            let mut decoder = LateDecoder::new(from != 0);
            let mut grpc_streams: BTreeSet<u32> = BTreeSet::new();
            let blocks: BTreeMap<usize, &Block> = d.blocks.iter().map(|b| (b.frame, b)).collect();
            for (i, id) in read {
                let f = &d.frames[i];
                let fields = blocks.get(&i).map(|b| {
                    let fields = decoder.decode(&b.encoded);
                    let grpc =
                        fields.iter().any(|(n, v)| n == "content-type" && v.starts_with("application/grpc"));
                    if grpc {
                        grpc_streams.insert(b.stream);
                    }
                    fields
                });
                let data = f.kind == frame::DATA;
                let seen = SeenFrame {
                    kind: f.kind,
                    stream: f.stream,
                    fields,
                    messages: if data { grpc_messages(&f.data) } else { Vec::new() },
                    grpc_known: data && grpc_streams.contains(&f.stream),
                };
                out.frames.entry(id).or_default().push(seen);
            }
            out
        })
        .collect()
}

/// The lengths of the gRPC messages (5-byte prefix: flag, length) that a DATA payload holds,
/// read from its start.
fn grpc_messages(data: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 5 <= data.len() {
        let len = u32::from_be_bytes(data[off + 1..off + 5].try_into().unwrap());
        out.push(len);
        off += 5 + len as usize;
    }
    out
}

/// An HPACK decoder that may have joined late: a reference to a dynamic-table entry it did not
/// see decodes to an unknown name and an empty value, and an entry inserted with an unknown
/// name keeps it unknown (Wireshark's way). Strings and the static table are `loona-hpack`'s.
struct LateDecoder {
    /// Newest first: (name, value), `None` where unknown.
    table: VecDeque<(Option<String>, Option<String>)>,
    size: usize,
    max: usize,
    late: bool,
}

/// A field a late reader cannot name.
pub const UNKNOWN: &str = "<unknown>";

impl LateDecoder {
    fn new(late: bool) -> LateDecoder {
        LateDecoder { table: VecDeque::new(), size: 0, max: 4096, late }
    }

    fn entry(&self, index: usize) -> (Option<String>, Option<String>) {
        if (1..=61).contains(&index) {
            let (n, v) = static_entry(index);
            return (Some(n), Some(v));
        }
        match self.table.get(index.wrapping_sub(62)) {
            Some(e) => e.clone(),
            None if self.late => (None, None),
            None => panic!("HPACK index {index} beyond a table seen from the start"),
        }
    }

    fn insert(&mut self, e: (Option<String>, Option<String>)) {
        let size = |e: &(Option<String>, Option<String>)| {
            e.0.as_deref().unwrap_or(UNKNOWN).len() + e.1.as_deref().unwrap_or("").len() + 32
        };
        self.size += size(&e);
        self.table.push_front(e);
        self.evict(size);
    }

    fn evict(&mut self, size: impl Fn(&(Option<String>, Option<String>)) -> usize) {
        while self.size > self.max {
            let Some(old) = self.table.pop_back() else { break };
            self.size -= size(&old);
        }
    }

    /// The block's fields, `<unknown>`/empty where unresolved; a malformed block yields the
    /// fields before the fault.
    fn decode(&mut self, block: &[u8]) -> Fields {
        let mut out = Vec::new();
        let mut off = 0;
        while off < block.len() {
            let b = block[off];
            let (field, insert) = if b & 0x80 != 0 {
                let Some((index, n)) = integer(&block[off..], 7) else { break };
                off += n;
                (self.entry(index), false)
            } else if b & 0xe0 == 0x20 {
                let Some((max, n)) = integer(&block[off..], 5) else { break };
                off += n;
                self.max = max;
                self.evict(|e| {
                    e.0.as_deref().unwrap_or(UNKNOWN).len() + e.1.as_deref().unwrap_or("").len() + 32
                });
                continue;
            } else {
                let (prefix, insert) = if b & 0x40 != 0 { (6, true) } else { (4, false) };
                let Some((index, n)) = integer(&block[off..], prefix) else { break };
                off += n;
                let name = if index == 0 {
                    let Some((s, n)) = string(&block[off..]) else { break };
                    off += n;
                    Some(s)
                } else {
                    self.entry(index).0
                };
                let Some((value, n)) = string(&block[off..]) else { break };
                off += n;
                ((name, Some(value)), insert)
            };
            out.push((
                field.0.clone().unwrap_or_else(|| UNKNOWN.to_string()),
                field.1.clone().unwrap_or_default(),
            ));
            if insert {
                self.insert(field);
            }
        }
        out
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541, 5.1): value and bytes taken.
fn integer(buf: &[u8], n: u8) -> Option<(usize, usize)> {
    let mask = (1usize << n) - 1;
    let mut value = usize::from(*buf.first()?) & mask;
    if value < mask {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (i, b) in buf.iter().enumerate().skip(1) {
        value = value.checked_add(usize::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    None
}

/// An HPACK string literal (Huffman-coded or raw): the text and bytes taken.
fn string(buf: &[u8]) -> Option<(String, usize)> {
    let huffman = *buf.first()? & 0x80 != 0;
    let (len, n) = integer(buf, 7)?;
    let raw = buf.get(n..n + len)?;
    let bytes: Cow<[u8]> =
        if huffman { Cow::Owned(HuffmanDecoder::new().decode(raw).ok()?) } else { Cow::Borrowed(raw) };
    Some((String::from_utf8_lossy(&bytes).into_owned(), n + len))
}

/// Entry `index` (1 to 61) of HPACK's static table, as `loona-hpack` has it.
fn static_entry(index: usize) -> (String, String) {
    let fields = Decoder::new().decode(&[0x80 | index as u8]).expect("a static table entry");
    text(fields.into_iter().next().expect("one field"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Encoder;
    use std::net::{IpAddr, Ipv4Addr};

    const CLIENT: u16 = 40000;
    const SERVER: u16 = 50051;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 1, if port == SERVER { 2 } else { 3 })), port)
    }

    /// Builds a trace segment by segment.
    struct Builder {
        trace: Trace,
        seq: [u32; 2],
    }

    impl Builder {
        fn new() -> Builder {
            let mut b = Builder { trace: Trace::default(), seq: [1000, 5000] };
            b.segment(false, 0x02, b"");
            b.segment(true, 0x12, b"");
            b.seq = [1001, 5001];
            b
        }

        fn segment(&mut self, from_server: bool, flags: u8, payload: &[u8]) -> usize {
            let (src, dst, s) =
                if from_server { (addr(SERVER), addr(CLIENT), 1) } else { (addr(CLIENT), addr(SERVER), 0) };
            self.trace.packets.push(Packet {
                ts_ns: self.trace.packets.len() as u64,
                src,
                dst,
                seq: self.seq[s],
                ack: self.seq[1 - s],
                flags,
                len: payload.len() as u32,
                payload: payload.to_vec(),
            });
            self.seq[s] = self.seq[s].wrapping_add(payload.len() as u32);
            self.trace.packets.len() - 1
        }
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    fn headers(enc: &mut Encoder, stream: u32, end_stream: bool, fields: &[(&str, &str)]) -> Vec<u8> {
        let block = enc.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let flags = frame::END_HEADERS | if end_stream { frame::END_STREAM } else { 0 };
        frame(frame::HEADERS, flags, stream, &block)
    }

    /// Two gRPC calls on one connection, the second's trailers (INTERNAL) split across two
    /// segments after a DATA frame of the first; frames follow by length.
    #[test]
    fn grpc_trailers_trigger_where_their_frame_ends() {
        let (mut cenc, mut senc) = (Encoder::new(), Encoder::new());
        let mut b = Builder::new();
        let mut first = PREFACE.to_vec();
        first.extend(frame(frame::SETTINGS, 0, 0, b""));
        for s in [1, 3] {
            let path = if s == 1 { "/helloworld.Greeter/SayHello" } else { "/mirror.Inventory/Get" };
            let req = [
                (":method", "POST"),
                (":path", path),
                (":authority", "greeter:50051"),
                ("content-type", "application/grpc"),
            ];
            first.extend(headers(&mut cenc, s, false, &req));
            first.extend(frame(frame::DATA, frame::END_STREAM, s, b"\0\0\0\0\x06code=0"));
        }
        b.segment(false, 0x18, &first);
        let mut out = frame(frame::SETTINGS, 0, 0, b"");
        out.extend(headers(&mut senc, 1, false, &[(":status", "200"), ("content-type", "application/grpc")]));
        out.extend(frame(frame::DATA, 0, 1, b"\0\0\0\0\x02ok"));
        let trailers = headers(
            &mut senc,
            3,
            true,
            &[(":status", "200"), ("grpc-status", "13"), ("grpc-message", "requested")],
        );
        out.extend(&trailers[..5]);
        b.segment(true, 0x18, &out);
        let at = b.segment(true, 0x18, &trailers[5..]);
        b.segment(false, 0x10, b"");

        let rules = [H2Rule::parse("grpc-status=internal,unavailable path=/mirror.")];
        let e = H2Expected::from_reference(&b.trace, &rules);
        let c = &e.conversations[0];
        assert_eq!(c.undecoded(), Vec::<String>::new());
        assert_eq!(c.requests[&3].path, "/mirror.Inventory/Get");
        assert_eq!(e.triggers.len(), 1);
        let t = &e.triggers[0];
        assert_eq!((t.packet, t.stream, t.kind, t.code), (at, 3, H2Kind::Grpc, 13));
        assert_eq!(e.expected.packets.len(), 2, "the trailers' end and the ACK after");
        // Not on another path, nor for a code not named.
        assert!(first_trigger(c, &[H2Rule::parse("grpc-status=13 path=/helloworld.")]).is_none());
        assert!(first_trigger(c, &[H2Rule::parse("grpc-status=unavailable")]).is_none());

        // A reader from the trigger on: the segment does not begin a frame.
        let late = late_view(c, &b.trace, at, &[]);
        assert!(late.iter().all(|d| !d.aligned), "{late:?}");
        // A reader from the start sees every frame and field.
        let all = late_view(c, &b.trace, 0, &[]);
        let seen: Vec<&SeenFrame> = all[1].frames.values().flatten().collect();
        assert_eq!(seen.len(), 4);
        assert_eq!((seen[2].messages.as_slice(), seen[2].grpc_known), (&[2][..], true));
        assert_eq!(seen[3].fields.as_ref().unwrap()[1], ("grpc-status".to_string(), "13".to_string()));
    }

    /// A late reader: entries inserted before it joined are unknown, those after are known.
    #[test]
    fn a_late_decoder_names_what_it_saw() {
        let mut enc = Encoder::new();
        let _ = enc.encode([(&b"grpc-status"[..], &b"0"[..])]);
        let second = enc.encode([
            (&b"x-new"[..], &b"1"[..]),
            (&b"grpc-status"[..], &b"13"[..]),
            (&b":status"[..], &b"500"[..]),
        ]);
        let third = enc.encode([(&b"x-new"[..], &b"1"[..]), (&b"grpc-status"[..], &b"0"[..])]);
        let mut late = LateDecoder::new(true);
        let got = late.decode(&second);
        assert_eq!(got[0], ("x-new".to_string(), "1".to_string()));
        assert_eq!(got[1].1, "13");
        assert_eq!(got[2], (":status".to_string(), "500".to_string()));
        let got = late.decode(&third);
        assert_eq!(got[0], ("x-new".to_string(), "1".to_string()));
        assert_eq!(got[1], (UNKNOWN.to_string(), String::new()));
    }

    #[test]
    fn rules_are_read() {
        let r = H2Rule::parse("grpc-status=internal,Unavailable,4 path=/pkg.Service/ packets=100");
        assert_eq!(r.condition, Condition::Grpc([4, 13, 14].into_iter().collect()));
        assert_eq!(r.path.as_deref(), Some("/pkg.Service/"));
        assert_eq!(H2Rule::parse("status=5xx").condition, Condition::Status(vec![(500, 599)]));
        assert_eq!(host_of("[2001:2::2]:8080"), "2001:2::2");
        assert_eq!(host_of("shop.example:80"), "shop.example");
    }
}
