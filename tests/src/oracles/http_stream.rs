//! HTTP/1.x on captured TCP connections, parsed the way an endpoint would: each direction's
//! byte stream is put back together by sequence number (retransmitted bytes count once), then
//! requests and responses are read one after another with their framing (Content-Length,
//! chunked with trailers, 1xx interim responses, no body for 204, 304 and answers to HEAD, a
//! body until the close otherwise). For each response it gives the status and the packet that
//! completed the status code: the moment a classifier reading the stream knows it.
//!
//! The message parsers work on a buffer that may end early ([`Parsed::Incomplete`]), so that
//! clients reading a socket use them too.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use mirror_bpf::FlowKey;

use crate::capture::pcap::{Packet, Trace};

/// The outcome of parsing one item at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The item, and how many bytes it took.
    Done(T, usize),
    /// The buffer ends before the item does.
    Incomplete,
    /// Not HTTP/1.x: why.
    Invalid(String),
}

/// Unwraps a `Done`, returning early with anything else.
macro_rules! done {
    ($e:expr) => {
        match $e {
            Parsed::Done(t, n) => (t, n),
            Parsed::Incomplete => return Parsed::Incomplete,
            Parsed::Invalid(e) => return Parsed::Invalid(e),
        }
    };
}

/// Longest head (start line and header fields) accepted.
const HEAD_MAX: usize = 64 * 1024;

/// The start of a status line, `HTTP/1.x DDD`, is 12 bytes.
pub const STATUS_CODE_END: usize = 12;

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body.
    None,
    /// This many bytes.
    Length(u64),
    /// Chunked transfer coding, with trailers.
    Chunked,
    /// Everything until the connection closes.
    UntilClose,
}

/// A request or response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The three parts of the start line (method, target, version; or version, status, reason).
    pub start: [String; 3],
    /// Header fields, names lowercased, in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// Values of a header, in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Transfer-Encoding present: whether its last coding is chunked.
    fn chunked(&self) -> Option<bool> {
        let codings: Vec<String> = self
            .values("transfer-encoding")
            .flat_map(|v| v.split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        (!codings.is_empty()).then(|| codings.last().is_some_and(|c| c == "chunked"))
    }

    /// Content-Length: none, or one value (repeated identical values allowed).
    fn content_length(&self) -> Result<Option<u64>, String> {
        let mut length = None;
        for v in self.values("content-length").flat_map(|v| v.split(',')) {
            let v = v.trim();
            if v.is_empty() || v.len() > 18 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("bad Content-Length {v:?}"));
            }
            let n: u64 = v.parse().unwrap();
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length values".into());
            }
            length = Some(n);
        }
        Ok(length)
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method.
    pub method: String,
    /// Request target.
    pub target: String,
    /// Its head.
    pub head: Head,
}

/// A parsed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Its head.
    pub head: Head,
    /// How its body was delimited.
    pub body: Body,
    /// Its body (chunked: the chunks' data joined).
    pub content: Vec<u8>,
}

impl Response {
    /// A 1xx other than 101: another response to the same request follows.
    pub fn interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// `HTTP/1.0 DDD` or `HTTP/1.1 DDD` at the start of `buf`, the code followed by a space or a
/// line end (when the buffer goes on): the status, with [`STATUS_CODE_END`] bytes taken.
pub fn status_code(buf: &[u8]) -> Parsed<u16> {
    const PREFIX: &[u8] = b"HTTP/1.";
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Parsed::Invalid("not a status line".into());
    }
    // After "HTTP/1.": the minor version, a space and three digits, the first not 0.
    let fits = |at: usize, b: u8| match at {
        7 => b == b'0' || b == b'1',
        8 => b == b' ',
        9 => (b'1'..=b'9').contains(&b),
        _ => b.is_ascii_digit(),
    };
    for at in 7..STATUS_CODE_END {
        match buf.get(at) {
            None => return Parsed::Incomplete,
            Some(&b) if !fits(at, b) => return Parsed::Invalid(format!("not a status line (byte {at})")),
            Some(_) => {}
        }
    }
    if buf.get(12).is_some_and(|b| !matches!(b, b' ' | b'\r' | b'\n')) {
        return Parsed::Invalid("status code longer than three digits".into());
    }
    let d = |i: usize| u16::from(buf[i] - b'0');
    Parsed::Done(d(9) * 100 + d(10) * 10 + d(11), STATUS_CODE_END)
}

/// One line ending in LF (CRLF or a bare LF), without its ending.
fn line(buf: &[u8], max: usize) -> Parsed<&[u8]> {
    match buf.iter().take(max).position(|&b| b == b'\n') {
        Some(i) => Parsed::Done(buf[..i].strip_suffix(b"\r").unwrap_or(&buf[..i]), i + 1),
        None if buf.len() >= max => Parsed::Invalid("line too long".into()),
        None => Parsed::Incomplete,
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Header fields up to and including the empty line.
fn fields(buf: &[u8], max: usize) -> Parsed<Vec<(String, String)>> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut off = 0;
    loop {
        let (l, n) = done!(line(&buf[off..], max.saturating_sub(off)));
        off += n;
        if l.is_empty() {
            return Parsed::Done(headers, off);
        }
        let l = String::from_utf8_lossy(l);
        if l.starts_with([' ', '\t']) {
            // obs-fold: continues the previous value.
            match headers.last_mut() {
                Some((_, v)) => {
                    v.push(' ');
                    v.push_str(l.trim());
                }
                None => return Parsed::Invalid("folded line before any header".into()),
            }
            continue;
        }
        let Some((name, value)) = l.split_once(':') else {
            return Parsed::Invalid(format!("header line without a colon: {l:?}"));
        };
        if !is_token(name) {
            return Parsed::Invalid(format!("bad header name {name:?}"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
}

/// A start line and header fields.
fn head(buf: &[u8]) -> Parsed<Head> {
    let (start, n) = done!(line(buf, HEAD_MAX));
    let start = String::from_utf8_lossy(start);
    let mut parts = start.splitn(3, ' ').map(str::to_string);
    let start: [String; 3] = std::array::from_fn(|_| parts.next().unwrap_or_default());
    let (headers, m) = done!(fields(&buf[n..], HEAD_MAX - n));
    Parsed::Done(Head { start, headers }, n + m)
}

/// A chunked body, trailers included: its data.
fn chunked(buf: &[u8]) -> Parsed<Vec<u8>> {
    let mut data = Vec::new();
    let mut off = 0;
    loop {
        let (l, n) = done!(line(&buf[off..], 1024));
        let size_end = l.iter().position(|b| !b.is_ascii_hexdigit()).unwrap_or(l.len());
        let rest = &l[size_end..];
        if size_end == 0 || size_end > 15 || !(rest.is_empty() || rest[0] == b';' || rest[0] == b' ') {
            return Parsed::Invalid(format!("bad chunk size line {:?}", String::from_utf8_lossy(l)));
        }
        let size = usize::from_str_radix(std::str::from_utf8(&l[..size_end]).unwrap(), 16).unwrap();
        off += n;
        if size == 0 {
            let (_, t) = done!(fields(&buf[off..], HEAD_MAX));
            return Parsed::Done(data, off + t);
        }
        let Some(chunk) = buf.get(off..off + size) else { return Parsed::Incomplete };
        data.extend_from_slice(chunk);
        off += size;
        match buf.get(off..off + 2) {
            Some(b"\r\n") => off += 2,
            Some(_) if buf[off] == b'\n' => off += 1,
            Some(_) => return Parsed::Invalid("chunk not followed by CRLF".into()),
            None if buf.get(off) == Some(&b'\r') || buf.len() == off => return Parsed::Incomplete,
            None => return Parsed::Invalid("chunk not followed by CRLF".into()),
        }
    }
}

/// A body delimited by `body`; `eof`: the stream ends with `buf`.
fn body(buf: &[u8], body: Body, eof: bool) -> Parsed<Vec<u8>> {
    match body {
        Body::None => Parsed::Done(Vec::new(), 0),
        Body::Length(n) => match buf.get(..n as usize) {
            Some(b) => Parsed::Done(b.to_vec(), n as usize),
            None => Parsed::Incomplete,
        },
        Body::Chunked => chunked(buf),
        Body::UntilClose if eof => Parsed::Done(buf.to_vec(), buf.len()),
        Body::UntilClose => Parsed::Incomplete,
    }
}

/// One request at the start of `buf`.
pub fn request(buf: &[u8]) -> Parsed<Request> {
    let (head, n) = done!(head(buf));
    let [method, target, version] = &head.start;
    if !is_token(method) || target.is_empty() || !(version == "HTTP/1.0" || version == "HTTP/1.1") {
        return Parsed::Invalid(format!("not a request line: {:?}", head.start.join(" ")));
    }
    let framing = match (head.chunked(), head.content_length()) {
        (Some(true), _) => Body::Chunked,
        (Some(false), _) => return Parsed::Invalid("request body of unknown length".into()),
        (None, Err(e)) => return Parsed::Invalid(e),
        (None, Ok(Some(len))) => Body::Length(len),
        (None, Ok(None)) => Body::None,
    };
    let (_, m) = done!(body(&buf[n..], framing, false));
    Parsed::Done(Request { method: method.clone(), target: target.clone(), head }, n + m)
}

/// One response at the start of `buf`, to a request with `method` (when known); `eof`: the
/// stream ends with `buf` (a body delimited by the close is complete).
pub fn response(buf: &[u8], method: Option<&str>, eof: bool) -> Parsed<Response> {
    let (status, _) = done!(status_code(buf));
    let (head, n) = done!(head(buf));
    let framing = if method == Some("HEAD") || status < 200 || status == 204 || status == 304 {
        Body::None
    } else if method == Some("CONNECT") && (200..300).contains(&status) {
        // A tunnel: what follows is not HTTP.
        Body::None
    } else {
        match (head.chunked(), head.content_length()) {
            (Some(true), _) => Body::Chunked,
            (Some(false), _) => Body::UntilClose,
            (None, Err(e)) => return Parsed::Invalid(e),
            (None, Ok(Some(len))) => Body::Length(len),
            (None, Ok(None)) => Body::UntilClose,
        }
    };
    let (content, m) = done!(body(&buf[n..], framing, eof));
    Parsed::Done(Response { status, head, body: framing, content }, n + m)
}

/// One direction of a connection: its bytes in stream order, each with the packet (index in
/// the trace) that first carried it.
#[derive(Debug, Default)]
pub struct Stream {
    /// Sequence number of the next byte expected, once known.
    next_seq: Option<u32>,
    /// The bytes, in stream order.
    pub data: Vec<u8>,
    /// (stream offset, packet index) of each run of bytes, in stream order.
    owners: Vec<(usize, usize)>,
    /// Segments that came before the bytes preceding them, by stream offset.
    pending: BTreeMap<usize, (Vec<u8>, usize)>,
}

impl Stream {
    fn push(&mut self, index: usize, p: &Packet) {
        let syn = p.flags & 0x02 != 0;
        if syn {
            // The first data byte follows the SYN; a SYN carrying data (fast open) starts there.
            self.next_seq.get_or_insert(p.seq.wrapping_add(1));
            if p.payload.is_empty() {
                return;
            }
        }
        if p.payload.is_empty() {
            return;
        }
        let seq = if syn { p.seq.wrapping_add(1) } else { p.seq };
        let next = *self.next_seq.get_or_insert(seq);
        let ahead = seq.wrapping_sub(next) as i32;
        let payload = &p.payload[..];
        if ahead < 0 {
            // Retransmitted bytes (and keep-alive probes) are not new; a segment that
            // overlaps the end of what we have brings the rest.
            let skip = ahead.unsigned_abs() as usize;
            if skip < payload.len() {
                self.append(index, &payload[skip..]);
            }
        } else if ahead == 0 {
            self.append(index, payload);
        } else {
            let at = self.data.len() + ahead as usize;
            self.pending.entry(at).or_insert_with(|| (payload.to_vec(), index));
            return;
        }
        self.drain_pending();
    }

    fn append(&mut self, index: usize, bytes: &[u8]) {
        self.owners.push((self.data.len(), index));
        self.data.extend_from_slice(bytes);
        let next = self.next_seq.expect("set before appending");
        self.next_seq = Some(next.wrapping_add(bytes.len() as u32));
    }

    fn drain_pending(&mut self) {
        while let Some((&at, _)) = self.pending.first_key_value() {
            if at > self.data.len() {
                return;
            }
            let (bytes, index) = self.pending.pop_first().unwrap().1;
            let skip = self.data.len() - at;
            if skip < bytes.len() {
                self.append(index, &bytes[skip..]);
            }
        }
    }

    /// Whether byte `offset` is the first one its packet brought.
    pub fn starts_run(&self, offset: usize) -> bool {
        self.owners.binary_search_by_key(&offset, |(start, _)| *start).is_ok()
    }

    /// Where the first byte that packet `index` brought is, if it brought any.
    pub fn offset_of(&self, index: usize) -> Option<usize> {
        self.owners.iter().find(|(_, i)| *i == index).map(|(start, _)| *start)
    }

    /// The packet that carried byte `offset`.
    pub fn packet_at(&self, offset: usize) -> usize {
        let i = self.owners.partition_point(|(start, _)| *start <= offset);
        self.owners[i - 1].1
    }
}

/// A request seen on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSeen {
    /// Method.
    pub method: String,
    /// Target.
    pub target: String,
    /// Its Host header, when it has one.
    pub host: Option<String>,
    /// Index in the trace of the packet that carried its first byte.
    pub packet: usize,
}

/// A response seen on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSeen {
    /// Status code.
    pub status: u16,
    /// Index in the trace of the packet that carried the last digit of the status code.
    pub packet: usize,
    /// Index of the packet that carried the first byte of the status line (another than
    /// `packet` when the code is split across segments).
    pub first_packet: usize,
    /// The status line begins its segment (else it follows other bytes in it).
    pub starts_segment: bool,
    /// Where its status line starts in the server's byte stream.
    pub offset: usize,
    /// Index in `requests` of the request it answers, when that request was seen.
    pub request: Option<usize>,
}

/// One TCP connection of a trace, read as HTTP/1.x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// The connection.
    pub flow: FlowKey,
    /// The side that opened it (or sent requests).
    pub client: SocketAddr,
    /// The side that answered.
    pub server: SocketAddr,
    /// Requests, in order.
    pub requests: Vec<RequestSeen>,
    /// Responses, interim ones included, in order; one whose status line's start is all
    /// that was seen counts.
    pub responses: Vec<ResponseSeen>,
    /// Why reading a direction stopped before its end, if it did.
    pub stopped: Option<String>,
}

impl Conversation {
    /// The request a response answers.
    pub fn request_of(&self, r: &ResponseSeen) -> Option<&RequestSeen> {
        r.request.map(|i| &self.requests[i])
    }
}

/// One TCP connection of a trace: its two byte streams, keyed by sender.
#[derive(Debug)]
pub struct Connection {
    /// The connection.
    pub flow: FlowKey,
    /// The side that sent the SYN, when it was seen.
    pub opener: Option<SocketAddr>,
    /// Each side's stream (a side that sent nothing has none).
    pub streams: HashMap<SocketAddr, Stream>,
    /// Index in the trace of its first packet.
    pub first: usize,
}

/// Every TCP connection of `trace`, in the order of their first packet, read as HTTP/1.x.
pub fn conversations(trace: &Trace) -> Vec<Conversation> {
    connections(trace).into_iter().map(read).collect()
}

/// Every TCP connection of `trace`, in the order of their first packet, its streams put
/// back together. A SYN from the same endpoints after the connection carried data starts a new
/// one (a reused port).
pub fn connections(trace: &Trace) -> Vec<Connection> {
    let mut open: HashMap<FlowKey, Connection> = HashMap::new();
    let mut finished: Vec<Connection> = Vec::new();
    for (i, p) in trace.packets.iter().enumerate() {
        let flow = p.flow();
        let pure_syn = p.flags & 0x12 == 0x02;
        if pure_syn {
            let reused = open.get(&flow).is_some_and(|c| {
                c.streams.values().any(|s| !s.data.is_empty())
                    || c.streams.get(&p.src).and_then(|s| s.next_seq) != Some(p.seq.wrapping_add(1))
            });
            if reused {
                finished.push(open.remove(&flow).unwrap());
            }
        }
        let c = open.entry(flow).or_insert_with(|| Connection {
            flow,
            opener: None,
            streams: HashMap::new(),
            first: i,
        });
        if pure_syn {
            c.opener.get_or_insert(p.src);
        }
        c.streams.entry(p.src).or_default().push(i, p);
    }
    finished.extend(open.into_values());
    finished.sort_by_key(|c| c.first);
    finished
}

/// Reads a collected connection's streams as requests and responses.
fn read(mut c: Connection) -> Conversation {
    let ends = [c.flow.lo, c.flow.hi];
    let starts_with = |c: &Connection, side: SocketAddr, what: &[u8]| {
        c.streams.get(&side).is_some_and(|s| s.data.starts_with(what))
    };
    let client = c.opener.unwrap_or_else(|| {
        // No handshake seen: the side that sent a status line is the server.
        if starts_with(&c, ends[0], b"HTTP/") {
            ends[1]
        } else if starts_with(&c, ends[1], b"HTTP/") {
            ends[0]
        } else if c.streams.get(&ends[1]).is_some_and(|s| matches!(request(&s.data), Parsed::Done(..))) {
            ends[1]
        } else {
            ends[0]
        }
    });
    let server = if client == ends[0] { ends[1] } else { ends[0] };
    let to_server = c.streams.remove(&client).unwrap_or_default();
    let to_client = c.streams.remove(&server).unwrap_or_default();
    let mut conv = Conversation {
        flow: c.flow,
        client,
        server,
        requests: Vec::new(),
        responses: Vec::new(),
        stopped: None,
    };

    let mut off = 0;
    while off < to_server.data.len() {
        match request(&to_server.data[off..]) {
            Parsed::Done(r, n) => {
                conv.requests.push(RequestSeen {
                    host: r.head.values("host").next().map(str::to_string),
                    method: r.method,
                    target: r.target,
                    packet: to_server.packet_at(off),
                });
                off += n;
            }
            Parsed::Incomplete => break,
            Parsed::Invalid(e) => {
                conv.stopped = Some(format!("requests at byte {off}: {e}"));
                break;
            }
        }
    }

    let mut off = 0;
    let mut answering = 0;
    while off < to_client.data.len() {
        let buf = &to_client.data[off..];
        match status_code(buf) {
            Parsed::Done(status, code_end) => conv.responses.push(ResponseSeen {
                status,
                packet: to_client.packet_at(off + code_end - 1),
                first_packet: to_client.packet_at(off),
                starts_segment: to_client.starts_run(off),
                offset: off,
                request: (answering < conv.requests.len()).then_some(answering),
            }),
            Parsed::Incomplete => break,
            Parsed::Invalid(e) => {
                conv.stopped = Some(format!("responses at byte {off}: {e}"));
                break;
            }
        }
        let method = conv.requests.get(answering).map(|r| r.method.as_str());
        match response(buf, method, true) {
            Parsed::Done(r, n) => {
                off += n;
                if r.interim() {
                    continue;
                }
                if r.status == 101 || (method == Some("CONNECT") && (200..300).contains(&r.status)) {
                    conv.stopped = Some(format!("not HTTP after the {} at byte {off}", r.status));
                    break;
                }
                answering += 1;
            }
            Parsed::Incomplete => break,
            Parsed::Invalid(e) => {
                conv.stopped = Some(format!("response at byte {off}: {e}"));
                break;
            }
        }
    }
    conv
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    const CLIENT: u16 = 40000;
    const SERVER: u16 = 80;
    const CISN: u32 = 1000;
    const SISN: u32 = u32::MAX - 20; // the server's sequence numbers wrap

    fn addr(port: u16, v6: bool) -> SocketAddr {
        let ip = if v6 {
            IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, if port == SERVER { 2 } else { 3 }))
        } else {
            IpAddr::V4(Ipv4Addr::new(198, 18, 1, if port == SERVER { 2 } else { 3 }))
        };
        SocketAddr::new(ip, port)
    }

    /// Builds a trace segment by segment, tracking each side's sequence number.
    struct Builder {
        v6: bool,
        trace: Trace,
        seq: [u32; 2],
    }

    impl Builder {
        fn new(v6: bool) -> Builder {
            let mut b = Builder { v6, trace: Trace::default(), seq: [CISN, SISN] };
            b.raw(false, CISN, 0x02, b"");
            b.raw(true, SISN, 0x12, b"");
            b.seq = [CISN.wrapping_add(1), SISN.wrapping_add(1)];
            b
        }

        fn raw(&mut self, from_server: bool, seq: u32, flags: u8, payload: &[u8]) -> usize {
            let (c, s) = (addr(CLIENT, self.v6), addr(SERVER, self.v6));
            let (src, dst) = if from_server { (s, c) } else { (c, s) };
            self.trace.packets.push(Packet {
                src,
                dst,
                seq,
                ack: 0,
                flags,
                len: payload.len() as u32,
                payload: payload.to_vec(),
                ts_ns: self.trace.packets.len() as u64,
            });
            self.trace.packets.len() - 1
        }

        /// Sends the next bytes of one side; returns the packet's index.
        fn send(&mut self, from_server: bool, payload: &[u8]) -> usize {
            let side = usize::from(from_server);
            let seq = self.seq[side];
            self.seq[side] = seq.wrapping_add(payload.len() as u32);
            self.raw(from_server, seq, 0x18, payload)
        }

        fn client(&mut self, payload: &[u8]) -> usize {
            self.send(false, payload)
        }

        fn server(&mut self, payload: &[u8]) -> usize {
            self.send(true, payload)
        }

        fn one(&self) -> Conversation {
            let mut c = conversations(&self.trace);
            assert_eq!(c.len(), 1, "{c:?}");
            c.pop().unwrap()
        }
    }

    fn statuses(c: &Conversation) -> Vec<(u16, usize)> {
        c.responses.iter().map(|r| (r.status, r.packet)).collect()
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    const ERR: &[u8] = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 6\r\n\r\nerror\n";

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
    }

    #[test]
    fn status_codes() {
        assert_eq!(status_code(b"HTTP/1.1 500 Internal"), Parsed::Done(500, 12));
        assert_eq!(status_code(b"HTTP/1.0 204\r\n"), Parsed::Done(204, 12));
        assert_eq!(status_code(b"HTTP/1.1 500"), Parsed::Done(500, 12));
        assert_eq!(status_code(b"HTTP/1.1 5"), Parsed::Incomplete);
        assert_eq!(status_code(b"HTT"), Parsed::Incomplete);
        assert!(matches!(status_code(b"HTTP/1.1 5000 x"), Parsed::Invalid(_)));
        assert!(matches!(status_code(b"HTTP/2 200 "), Parsed::Invalid(_)));
        assert!(matches!(status_code(b"HTTP/1.1 050 x"), Parsed::Invalid(_)));
        assert!(matches!(status_code(b"GET / HTTP/1.1"), Parsed::Invalid(_)));
    }

    #[test]
    fn pipelined_responses_in_one_segment() {
        for v6 in [false, true] {
            let mut b = Builder::new(v6);
            let req = b.client(&[get("/a"), get("/b"), get("/c")].concat());
            let all = b.server(&[OK, ERR, OK].concat());
            let c = b.one();
            assert_eq!(c.client, addr(CLIENT, v6));
            assert_eq!(statuses(&c), [(200, all), (500, all), (200, all)]);
            assert_eq!(c.responses[1].offset, OK.len());
            let starts: Vec<bool> = c.responses.iter().map(|r| r.starts_segment).collect();
            assert_eq!(starts, [true, false, false]);
            assert_eq!(c.request_of(&c.responses[1]).unwrap().target, "/b");
            assert!(c.requests.iter().all(|r| r.packet == req));
            assert_eq!(c.stopped, None);
        }
    }

    #[test]
    fn interim_responses_answer_the_same_request() {
        let mut b = Builder::new(false);
        b.client(&[get("/continue"), get("/next")].concat());
        let p = b.server(
            &[
                &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
                b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
                ERR,
                OK,
            ]
            .concat(),
        );
        let c = b.one();
        assert_eq!(statuses(&c), [(100, p), (103, p), (500, p), (200, p)]);
        let targets: Vec<_> = c.responses.iter().map(|r| c.request_of(r).unwrap().target.as_str()).collect();
        assert_eq!(targets, ["/continue", "/continue", "/continue", "/next"]);
    }

    #[test]
    fn status_code_split_across_segments_completes_in_the_second() {
        let mut b = Builder::new(false);
        b.client(&get("/split"));
        let first = b.server(b"HTTP/1.1 5");
        let second = b.server(&ERR[10..]);
        let c = b.one();
        assert_eq!(statuses(&c), [(500, second)]);
        assert_eq!((c.responses[0].first_packet, c.responses[0].starts_segment), (first, true));
        // Split after the code: the first segment completes it.
        let mut b = Builder::new(false);
        b.client(&get("/split"));
        let first = b.server(&ERR[..12]);
        b.server(&ERR[12..]);
        assert_eq!(statuses(&b.one()), [(500, first)]);
    }

    #[test]
    fn status_text_in_a_body_is_not_a_response() {
        let text = b"HTTP/1.1 500 Internal Server Error\r\n\r\n";
        let mut b = Builder::new(false);
        b.client(&get("/body"));
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\nsee: ", 2 * text.len() + 5 + 6);
        let p = b.server(&[head.as_bytes(), text].concat());
        // The rest of the body begins a segment with the status text.
        b.server(&[&text[..], b"end.\r\n"].concat());
        b.client(&get("/after"));
        let after = b.server(ERR);
        let c = b.one();
        assert_eq!(statuses(&c), [(200, p), (500, after)]);
        assert_eq!(c.stopped, None);
    }

    #[test]
    fn chunked_bodies_with_extensions_and_trailers() {
        let mut b = Builder::new(false);
        b.client(&[get("/chunked"), get("/fail")].concat());
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
            5\r\nhello\r\n24;ext=1\r\nHTTP/1.1 500 Internal Server Error\r\n\r\n\
            0\r\nX-Trailer: yes\r\n\r\n";
        let p = b.server(chunked);
        let q = b.server(ERR);
        let c = b.one();
        assert_eq!(statuses(&c), [(200, p), (500, q)]);
        match response(chunked, Some("GET"), false) {
            Parsed::Done(r, n) => {
                assert_eq!((r.body, n), (Body::Chunked, chunked.len()));
                assert_eq!(r.content, b"helloHTTP/1.1 500 Internal Server Error\r\n");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(response(&chunked[..chunked.len() - 1], None, false), Parsed::Incomplete);
    }

    #[test]
    fn no_body_for_head_204_and_304() {
        let mut b = Builder::new(false);
        let head = b"HEAD /a HTTP/1.1\r\nHost: t\r\n\r\n";
        b.client(&[&head[..], &get("/b"), &get("/c"), &get("/d")].concat());
        // Each announces a body it does not carry.
        let p = b.server(
            &[
                &b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"[..],
                b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n",
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n",
                ERR,
            ]
            .concat(),
        );
        let c = b.one();
        assert_eq!(statuses(&c), [(200, p), (204, p), (304, p), (500, p)]);
        assert_eq!(c.request_of(&c.responses[3]).unwrap().target, "/d");
    }

    #[test]
    fn http_1_0_body_until_close() {
        let mut b = Builder::new(false);
        b.client(b"GET /old HTTP/1.0\r\n\r\n");
        let p = b.server(b"HTTP/1.0 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\nerr ");
        // More body, which looks like a status line: still the body.
        b.server(b"HTTP/1.1 200 OK\r\n\r\n");
        let c = b.one();
        assert_eq!(statuses(&c), [(500, p)]);
        let body = b"HTTP/1.0 200 OK\r\n\r\nabc";
        assert_eq!(response(body, None, false), Parsed::Incomplete);
        assert!(matches!(response(body, None, true), Parsed::Done(r, 22) if r.content == b"abc"));
    }

    #[test]
    fn retransmissions_and_reordering_count_once() {
        let mut b = Builder::new(false);
        b.client(&[get("/a"), get("/b")].concat());
        let first = b.server(&OK[..20]);
        // Lost, then resent after the next one arrives.
        let seq = b.seq[1];
        b.seq[1] = seq.wrapping_add((OK.len() - 20) as u32);
        let late = b.server(&ERR[..12]);
        let resent = b.raw(true, seq, 0x18, &OK[20..]);
        // A retransmission of everything so far, then the rest.
        let all = [OK, &ERR[..12]].concat();
        b.raw(true, SISN.wrapping_add(1), 0x18, &all);
        b.server(&ERR[12..]);
        let c = b.one();
        assert_eq!(statuses(&c), [(200, first), (500, late)]);
        assert!(first < late && late < resent);
    }

    #[test]
    fn a_reused_port_is_a_new_connection_and_unknown_starts_are_guessed() {
        let mut b = Builder::new(false);
        b.client(&get("/a"));
        b.server(OK);
        b.raw(false, 5000, 0x02, b"");
        b.raw(true, 7000, 0x12, b"");
        b.seq = [5001, 7001];
        b.client(&get("/b"));
        let p = b.server(ERR);
        let c = conversations(&b.trace);
        assert_eq!(c.len(), 2);
        assert_eq!(statuses(&c[1]), [(500, p)]);

        // A capture that starts mid-connection: no SYN.
        let mut b = Builder::new(false);
        b.trace.packets.clear();
        b.client(&get("/b"));
        let p = b.server(ERR);
        let c = b.one();
        assert_eq!((c.client.port(), statuses(&c)), (CLIENT, vec![(500, p)]));
    }

    #[test]
    fn garbage_stops_the_reading() {
        let mut b = Builder::new(false);
        b.client(&get("/a"));
        b.server(b"SSH-2.0-OpenSSH\r\nHTTP/1.1 500 x\r\n\r\n");
        let c = b.one();
        assert!(c.responses.is_empty());
        assert!(c.stopped.is_some());
    }

    #[test]
    fn requests_with_bodies() {
        let post = b"POST /p HTTP/1.1\r\nContent-Length: 12\r\n\r\nGET /x HTTP/";
        let chunked = b"PUT /q HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let mut b = Builder::new(false);
        b.client(&[&post[..], chunked, &get("/r")].concat());
        let c = b.one();
        let targets: Vec<_> = c.requests.iter().map(|r| (r.method.as_str(), r.target.as_str())).collect();
        assert_eq!(targets, [("POST", "/p"), ("PUT", "/q"), ("GET", "/r")]);
        assert!(matches!(request(b"GET / HTTP/1.1\r\nHost"), Parsed::Incomplete));
    }

    #[test]
    fn switching_protocols_ends_http() {
        let mut b = Builder::new(false);
        b.client(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
        b.server(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nHTTP/1.1 500 x\r\n\r\n");
        let c = b.one();
        assert_eq!(c.responses.iter().map(|r| r.status).collect::<Vec<_>>(), [101]);
    }
}
