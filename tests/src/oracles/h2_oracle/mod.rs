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

mod late;
mod rules;

pub use late::*;
pub use rules::*;

#[cfg(test)]
mod tests {
    use super::late::LateDecoder;
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
