//! HTTP/2 fixtures: frames (RFC 9113), the client preface, SETTINGS, header blocks in HPACK
//! (RFC 7541: indexed fields of the static or dynamic table, literals with or without
//! indexing, names by index or literal, strings raw or Huffman-coded), gRPC messages, and the
//! TCP segments of a connection that carry them, each direction's sequence numbers followed.

use std::net::{IpAddr, SocketAddr};

use super::consts::{V4_CLIENT, V4_SERVER};
use super::packet::{tcp_flags, PacketBuilder};
use crate::flow::FlowKey;

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header's length.
pub const FRAME_HEADER: usize = 9;

/// Frame types.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY.
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flags {
    /// END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// ACK (SETTINGS, PING).
    pub const ACK: u8 = 0x1;
    /// END_HEADERS (HEADERS, PUSH_PROMISE, CONTINUATION).
    pub const END_HEADERS: u8 = 0x4;
    /// PADDED (DATA, HEADERS, PUSH_PROMISE).
    pub const PADDED: u8 = 0x8;
    /// PRIORITY (HEADERS).
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameters.
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
}

/// Indices of the HPACK static table (RFC 7541, Appendix A) the fixtures use.
pub mod static_index {
    /// `:authority` (no value).
    pub const AUTHORITY: usize = 1;
    /// `:method GET`.
    pub const METHOD_GET: usize = 2;
    /// `:method POST`.
    pub const METHOD_POST: usize = 3;
    /// `:path /`.
    pub const PATH_ROOT: usize = 4;
    /// `:path /index.html`.
    pub const PATH_INDEX: usize = 5;
    /// `:scheme http`.
    pub const SCHEME_HTTP: usize = 6;
    /// `:scheme https`.
    pub const SCHEME_HTTPS: usize = 7;
    /// `:status 200`; 200, 204, 206, 304, 400, 404, 500 follow at 8 to 14.
    pub const STATUS_200: usize = 8;
    /// `:status 500`.
    pub const STATUS_500: usize = 14;
    /// `accept-encoding gzip, deflate`.
    pub const ACCEPT_ENCODING: usize = 16;
    /// `content-length` (no value).
    pub const CONTENT_LENGTH: usize = 28;
    /// `content-type` (no value).
    pub const CONTENT_TYPE: usize = 31;
    /// `date` (no value).
    pub const DATE: usize = 33;
    /// `server` (no value).
    pub const SERVER: usize = 54;
    /// `user-agent` (no value).
    pub const USER_AGENT: usize = 58;
}

/// The first index of the dynamic table: the latest insertion.
pub const DYNAMIC_FIRST: usize = 62;

/// The static index of `:status code`, for the seven statuses the static table has.
pub fn static_status(code: u16) -> Option<usize> {
    [200, 204, 206, 304, 400, 404, 500].iter().position(|c| *c == code).map(|i| static_index::STATUS_200 + i)
}

/// `s` in HPACK's Huffman code (RFC 7541, Appendix B), padded with the EOS prefix.
pub fn huffman(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    httlib_huffman::encode(s, &mut out).expect("every octet has a Huffman code");
    out
}

/// An HPACK integer (RFC 7541, 5.1) of `prefix` bits, the first byte's other bits `high`.
pub fn integer(value: usize, prefix: u8, high: u8) -> Vec<u8> {
    let max = (1usize << prefix) - 1;
    if value < max {
        return vec![high | value as u8];
    }
    let mut out = vec![high | max as u8];
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
    out
}

/// A string literal's text and how it is coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text<'a> {
    /// As is.
    Raw(&'a str),
    /// Huffman-coded.
    Huffman(&'a str),
}

impl Text<'_> {
    /// The string literal (RFC 7541, 5.2): its H bit and length, then its octets.
    pub fn encode(self) -> Vec<u8> {
        let (h, body) = match self {
            Text::Raw(s) => (0, s.as_bytes().to_vec()),
            Text::Huffman(s) => (0x80, huffman(s.as_bytes())),
        };
        let mut out = integer(body.len(), 7, h);
        out.extend_from_slice(&body);
        out
    }
}

/// The name of a literal field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name<'a> {
    /// An entry's name: of the static table (1 to 61) or the dynamic table (62 on).
    Index(usize),
    /// A literal name.
    Literal(Text<'a>),
}

/// How a literal field is indexed (RFC 7541, 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indexing {
    /// Inserted into the dynamic table (`01`, a 6-bit index).
    Incremental,
    /// Not inserted (`0000`, a 4-bit index).
    Without,
    /// Not inserted, and never to be (`0001`, a 4-bit index).
    Never,
}

/// A header block, field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Block(Vec<u8>);

impl Block {
    /// An empty block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no field.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// An indexed field: a whole entry of the static (1 to 61) or dynamic (62 on) table.
    pub fn indexed(mut self, index: usize) -> Self {
        self.0.extend(integer(index, 7, 0x80));
        self
    }

    /// A literal field.
    pub fn literal(mut self, indexing: Indexing, name: Name<'_>, value: Text<'_>) -> Self {
        let (prefix, high) = match indexing {
            Indexing::Incremental => (6, 0x40),
            Indexing::Without => (4, 0x00),
            Indexing::Never => (4, 0x10),
        };
        match name {
            Name::Index(i) => self.0.extend(integer(i, prefix, high)),
            Name::Literal(n) => {
                self.0.push(high);
                self.0.extend(n.encode());
            }
        }
        self.0.extend(value.encode());
        self
    }

    /// A dynamic table size update.
    pub fn size_update(mut self, size: usize) -> Self {
        self.0.extend(integer(size, 5, 0x20));
        self
    }

    /// Bytes as they are (a malformed field, say).
    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    /// `:status code`: the static table's entry where it has one, else a literal without
    /// indexing under the static name of `:status`, raw.
    pub fn status(self, code: u16) -> Self {
        match static_status(code) {
            Some(i) => self.indexed(i),
            None => self.literal(
                Indexing::Without,
                Name::Index(static_index::STATUS_200),
                Text::Raw(&code.to_string()),
            ),
        }
    }

    /// `:method`: the static table's GET or POST, else a literal without indexing.
    pub fn method(self, method: &str) -> Self {
        match method {
            "GET" => self.indexed(static_index::METHOD_GET),
            "POST" => self.indexed(static_index::METHOD_POST),
            m => self.literal(Indexing::Without, Name::Index(static_index::METHOD_GET), Text::Raw(m)),
        }
    }

    /// `:path`: the static table's `/`, else a literal inserted into the table, raw (as
    /// encoders insert paths).
    pub fn path(self, path: &str) -> Self {
        match path {
            "/" => self.indexed(static_index::PATH_ROOT),
            p => self.literal(Indexing::Incremental, Name::Index(static_index::PATH_ROOT), Text::Raw(p)),
        }
    }

    /// `:authority`, a literal inserted into the table, Huffman-coded.
    pub fn authority(self, authority: &str) -> Self {
        self.literal(Indexing::Incremental, Name::Index(static_index::AUTHORITY), Text::Huffman(authority))
    }

    /// `:scheme http`.
    pub fn scheme_http(self) -> Self {
        self.indexed(static_index::SCHEME_HTTP)
    }

    /// `content-type: application/grpc`, inserted into the table (as gRPC servers send it).
    pub fn grpc_content_type(self) -> Self {
        self.literal(
            Indexing::Incremental,
            Name::Index(static_index::CONTENT_TYPE),
            Text::Raw("application/grpc"),
        )
    }

    /// `grpc-status: code` as a literal with a literal name, `indexing` and `coding` applying to
    /// both name and value.
    pub fn grpc_status(self, indexing: Indexing, huffman: bool, code: u8) -> Self {
        let code = code.to_string();
        let (name, value) = if huffman {
            (Text::Huffman("grpc-status"), Text::Huffman(&code))
        } else {
            (Text::Raw("grpc-status"), Text::Raw(&code))
        };
        self.literal(indexing, Name::Literal(name), value)
    }

    /// The fields of a request: `:method`, `:scheme http`, `:path`, `:authority`, as
    /// [`Block::method`], [`Block::path`] and [`Block::authority`] encode them.
    pub fn request(method: &str, path: &str, authority: &str) -> Self {
        Block::new().method(method).scheme_http().path(path).authority(authority)
    }

    /// The fields of a gRPC request: `POST`, `:scheme http`, `:path`, `:authority`,
    /// `content-type: application/grpc` and `te: trailers`.
    pub fn grpc_request(path: &str, authority: &str) -> Self {
        Block::request("POST", path, authority).grpc_content_type().literal(
            Indexing::Incremental,
            Name::Literal(Text::Raw("te")),
            Text::Raw("trailers"),
        )
    }
}

/// One frame: its 9-byte header, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 1 << 24, "a frame's length has 24 bits");
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A SETTINGS frame with these parameters.
pub fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> =
        params.iter().flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes())).collect();
    frame(kind::SETTINGS, 0, 0, &payload)
}

/// A client's SETTINGS as curl sends them.
pub fn client_settings() -> Vec<u8> {
    settings(&[
        (setting::MAX_CONCURRENT_STREAMS, 100),
        (setting::INITIAL_WINDOW_SIZE, 10 << 20),
        (setting::ENABLE_PUSH, 0),
    ])
}

/// A server's SETTINGS.
pub fn server_settings() -> Vec<u8> {
    settings(&[(setting::MAX_CONCURRENT_STREAMS, 250), (setting::MAX_FRAME_SIZE, 1 << 20)])
}

/// The acknowledgement of SETTINGS.
pub fn settings_ack() -> Vec<u8> {
    frame(kind::SETTINGS, flags::ACK, 0, &[])
}

/// A WINDOW_UPDATE of `stream` (0: the connection).
pub fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(kind::WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// A PING.
pub fn ping(ack: bool) -> Vec<u8> {
    frame(kind::PING, if ack { flags::ACK } else { 0 }, 0, &[1, 2, 3, 4, 5, 6, 7, 8])
}

/// A RST_STREAM of `stream` with `code`.
pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(kind::RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// A PRIORITY frame of `stream`.
pub fn priority(stream: u32, depends_on: u32, weight: u8) -> Vec<u8> {
    let mut p = depends_on.to_be_bytes().to_vec();
    p.push(weight);
    frame(kind::PRIORITY, 0, stream, &p)
}

/// A GOAWAY.
pub fn goaway(last_stream: u32, code: u32) -> Vec<u8> {
    let mut p = last_stream.to_be_bytes().to_vec();
    p.extend_from_slice(&code.to_be_bytes());
    frame(kind::GOAWAY, 0, 0, &p)
}

/// A DATA frame of `stream`.
pub fn data(stream: u32, end_stream: bool, payload: &[u8]) -> Vec<u8> {
    frame(kind::DATA, if end_stream { flags::END_STREAM } else { 0 }, stream, payload)
}

/// A gRPC length-prefixed message (uncompressed) of `payload`.
pub fn grpc_message(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A CONTINUATION frame of `stream`.
pub fn continuation(stream: u32, end_headers: bool, block: &[u8]) -> Vec<u8> {
    frame(kind::CONTINUATION, if end_headers { flags::END_HEADERS } else { 0 }, stream, block)
}

/// A HEADERS (or PUSH_PROMISE) frame, its flags and fields.
#[derive(Debug, Clone)]
pub struct Headers {
    stream: u32,
    block: Vec<u8>,
    end_stream: bool,
    end_headers: bool,
    pad: Option<usize>,
    priority: Option<(u32, bool, u8)>,
    promised: Option<u32>,
}

impl Headers {
    /// A HEADERS frame of `stream` carrying `block` whole (END_HEADERS).
    pub fn new(stream: u32, block: &Block) -> Self {
        Headers {
            stream,
            block: block.bytes().to_vec(),
            end_stream: false,
            end_headers: true,
            pad: None,
            priority: None,
            promised: None,
        }
    }

    /// A PUSH_PROMISE frame of `stream` promising `promised`, carrying `block` whole.
    pub fn push_promise(stream: u32, promised: u32, block: &Block) -> Self {
        Headers { promised: Some(promised), ..Headers::new(stream, block) }
    }

    /// With END_STREAM (a request without a body, a response without one, trailers).
    pub fn end_stream(mut self) -> Self {
        self.end_stream = true;
        self
    }

    /// Without END_HEADERS: the block goes on in CONTINUATION frames.
    pub fn continued(mut self) -> Self {
        self.end_headers = false;
        self
    }

    /// PADDED, with `pad` bytes of padding.
    pub fn padded(mut self, pad: usize) -> Self {
        self.pad = Some(pad);
        self
    }

    /// The PRIORITY flag and its 5 bytes (HEADERS only).
    pub fn priority(mut self, depends_on: u32, exclusive: bool, weight: u8) -> Self {
        self.priority = Some((depends_on, exclusive, weight));
        self
    }

    /// The frame.
    pub fn build(&self) -> Vec<u8> {
        let mut f = if self.end_headers { flags::END_HEADERS } else { 0 };
        if self.end_stream {
            f |= flags::END_STREAM;
        }
        let mut payload = Vec::new();
        if let Some(pad) = self.pad {
            f |= flags::PADDED;
            payload.push(u8::try_from(pad).expect("at most 255 bytes of padding"));
        }
        if let Some((dep, excl, weight)) = self.priority {
            f |= flags::PRIORITY;
            let dep = dep & 0x7fff_ffff | if excl { 0x8000_0000 } else { 0 };
            payload.extend_from_slice(&dep.to_be_bytes());
            payload.push(weight);
        }
        if let Some(p) = self.promised {
            payload.extend_from_slice(&(p & 0x7fff_ffff).to_be_bytes());
        }
        payload.extend_from_slice(&self.block);
        payload.resize(payload.len() + self.pad.unwrap_or(0), 0);
        let kind = if self.promised.is_some() { kind::PUSH_PROMISE } else { kind::HEADERS };
        frame(kind, f, self.stream, &payload)
    }
}

/// A HEADERS frame of `stream` carrying `block` whole.
pub fn headers(stream: u32, block: &Block) -> Vec<u8> {
    Headers::new(stream, block).build()
}

/// Trailers: a HEADERS frame of `stream` carrying `block` whole, with END_STREAM.
pub fn trailers(stream: u32, block: &Block) -> Vec<u8> {
    Headers::new(stream, block).end_stream().build()
}

/// A TCP connection between the IPv4 client and server of the fixtures, each direction's
/// stream starting at sequence number 1000: segments built in order, or at an offset.
#[derive(Debug, Clone)]
pub struct Conn {
    /// The client's port.
    pub cport: u16,
    /// The server's port.
    pub sport: u16,
    /// The next offset of each direction's stream: the client's, the server's.
    next: [usize; 2],
}

/// The first sequence number of each direction's stream.
pub const FIRST_SEQ: u32 = 1000;

impl Conn {
    /// A connection from client port `cport` to server port `sport`.
    pub fn new(cport: u16, sport: u16) -> Self {
        Conn { cport, sport, next: [0, 0] }
    }

    /// Its flow's key.
    pub fn key(&self) -> FlowKey {
        FlowKey::new(
            SocketAddr::new(IpAddr::V4(V4_CLIENT), self.cport),
            SocketAddr::new(IpAddr::V4(V4_SERVER), self.sport),
            6,
        )
    }

    /// A segment of `payload` at `offset` of the client's (`to_server`) or the server's stream.
    pub fn segment_at(&self, to_server: bool, offset: usize, payload: &[u8]) -> Vec<u8> {
        let flags = tcp_flags::ACK | tcp_flags::PSH;
        let packet = if to_server {
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(self.cport, self.sport, flags)
        } else {
            PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).tcp(self.sport, self.cport, flags)
        };
        packet.seq(FIRST_SEQ.wrapping_add(offset as u32)).payload(payload).build()
    }

    /// The client's next segment, of `payload`.
    pub fn client(&mut self, payload: &[u8]) -> Vec<u8> {
        self.next_segment(true, payload)
    }

    /// The server's next segment, of `payload`.
    pub fn server(&mut self, payload: &[u8]) -> Vec<u8> {
        self.next_segment(false, payload)
    }

    /// `bytes` of the client's (`to_server`) or the server's stream, cut into segments of
    /// these sizes (the last one takes the rest).
    pub fn split(&mut self, to_server: bool, bytes: &[u8], sizes: &[usize]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = bytes;
        for &n in sizes {
            let (head, tail) = rest.split_at(n.min(rest.len()));
            out.push(self.next_segment(to_server, head));
            rest = tail;
        }
        if !rest.is_empty() {
            out.push(self.next_segment(to_server, rest));
        }
        out
    }

    /// Moves a direction's stream on by `n` bytes that the classifier never sees (a gap, or
    /// what went before it was attached).
    pub fn skip(&mut self, to_server: bool, n: usize) {
        self.next[usize::from(!to_server)] += n;
    }

    /// The next offset of the client's (`to_server`) or the server's stream.
    pub fn offset(&self, to_server: bool) -> usize {
        self.next[usize::from(!to_server)]
    }

    fn next_segment(&mut self, to_server: bool, payload: &[u8]) -> Vec<u8> {
        let at = self.offset(to_server);
        self.skip(to_server, payload.len());
        self.segment_at(to_server, at, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7541, C.1: integers.
    #[test]
    fn integers_as_in_rfc_7541() {
        assert_eq!(integer(10, 5, 0), [0x0a]);
        assert_eq!(integer(1337, 5, 0), [0x1f, 0x9a, 0x0a]);
        assert_eq!(integer(42, 8, 0), [0x2a]);
        assert_eq!(integer(62, 7, 0x80), [0xbe]);
        assert_eq!(integer(127, 7, 0x80), [0xff, 0x00]);
    }

    /// RFC 7541, C.4.1 and C.6.1: requests and responses with Huffman-coded strings.
    #[test]
    fn blocks_as_in_rfc_7541() {
        let b = Block::new().indexed(2).indexed(6).indexed(4).literal(
            Indexing::Incremental,
            Name::Index(1),
            Text::Huffman("www.example.com"),
        );
        let want = [
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4,
            0xff,
        ];
        assert_eq!(b.bytes(), want);
        assert_eq!(Block::request("GET", "/", "www.example.com").bytes(), want);
        let b = Block::new().literal(Indexing::Incremental, Name::Index(8), Text::Huffman("302")).literal(
            Indexing::Incremental,
            Name::Index(24),
            Text::Huffman("private"),
        );
        assert_eq!(b.bytes(), [0x48, 0x82, 0x64, 0x02, 0x58, 0x85, 0xae, 0xc3, 0x77, 0x1a, 0x4b]);
        // C.2.1: a literal name with indexing.
        let b = Block::new().literal(
            Indexing::Incremental,
            Name::Literal(Text::Raw("custom-key")),
            Text::Raw("custom-header"),
        );
        assert_eq!(&b.bytes()[..3], [0x40, 0x0a, b'c']);
        assert_eq!(b.len(), 1 + 11 + 14);
        // C.2.3: never indexed.
        assert_eq!(
            Block::new().literal(Indexing::Never, Name::Literal(Text::Raw("p")), Text::Raw("s")).bytes(),
            [0x10, 0x01, b'p', 0x01, b's']
        );
    }

    #[test]
    fn huffman_round_trips() {
        for s in ["grpc-status", "503", "404", "/pkg.Svc/Method", "api.example"] {
            let mut back = Vec::new();
            httlib_huffman::decode(&huffman(s.as_bytes()), &mut back, httlib_huffman::DecoderSpeed::FourBits)
                .unwrap();
            assert_eq!(back, s.as_bytes());
        }
    }

    #[test]
    fn frames_and_segments() {
        let f =
            Headers::new(3, &Block::new().indexed(8)).end_stream().padded(2).priority(1, true, 15).build();
        assert_eq!(f, [0, 0, 9, kind::HEADERS, 0x2d, 0, 0, 0, 3, 2, 0x80, 0, 0, 1, 15, 0x88, 0, 0]);
        assert_eq!(settings_ack(), [0, 0, 0, 4, 1, 0, 0, 0, 0]);
        let mut c = Conn::new(1234, 80);
        let segs = c.split(false, &[7; 10], &[3, 3]);
        assert_eq!(segs.len(), 3);
        assert_eq!((c.offset(false), c.offset(true)), (10, 0));
    }
}
