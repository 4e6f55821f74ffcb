//! The classifier's fixtures: frames and what the classifier must decide on them. One set for
//! correctness and speed: the BPF tests assert every fixture's decision (`tests/classifier.rs`)
//! and the data-path benchmark times the path fixtures, checking the same decision on every
//! run. Each fixture is decided under [`super::rig::Rig`]: the rule [`super::rig::RULE`], a
//! mirror interface, and the fixture's flow brought to its state by its setup frames.

use std::net::{IpAddr, SocketAddr};

use super::consts::*;
use super::packet::{ipv6_ext, tcp_flags, PacketBuilder};
use crate::flow::FlowKey;

/// What the parser must conclude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A TCP segment of this flow.
    Tcp(FlowKey),
    /// A UDP datagram of this flow, followed (DNS).
    Udp(FlowKey),
    /// Valid, not for us (non-IP, non-TCP, non-first fragment).
    Other,
    /// Truncated or inconsistent.
    Malformed,
}

/// What the classifier must decide on a fixture's frame. Every field is checked, each time the
/// frame runs, against the classifier's counters; the verdict is always "continue" and the
/// frame always leaves untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What the parser makes of the frame.
    pub parsed: Parsed,
    /// The frame creates its flow.
    pub creates_flow: bool,
    /// How often conntrack is asked whether the connection is translated: by the first packet
    /// of a flow unless it is a SYN, and once per connection by a trigger or by a response
    /// with no request pending.
    pub conntrack: u64,
    /// HTTP requests that start in the frame.
    pub requests: u64,
    /// HTTP responses (status lines) that complete in the frame.
    pub responses: u64,
    /// DNS queries in the frame.
    pub dns_queries: u64,
    /// DNS responses in the frame.
    pub dns_responses: u64,
    /// A rule matches and marks the flow.
    pub triggers: bool,
    /// The frame is copied to the mirror interface.
    pub mirrored: bool,
}

impl Decision {
    const fn parsed(parsed: Parsed) -> Self {
        Decision {
            parsed,
            creates_flow: false,
            conntrack: 0,
            requests: 0,
            responses: 0,
            dns_queries: 0,
            dns_responses: 0,
            triggers: false,
            mirrored: false,
        }
    }

    /// A packet of an existing TCP flow that starts no HTTP message.
    pub const fn tcp(key: FlowKey) -> Self {
        Decision::parsed(Parsed::Tcp(key))
    }

    /// A datagram of an existing UDP flow, followed as DNS.
    pub const fn udp(key: FlowKey) -> Self {
        Decision::parsed(Parsed::Udp(key))
    }

    /// Not for us: passed on without a flow.
    pub const fn other() -> Self {
        Decision::parsed(Parsed::Other)
    }

    /// Truncated or inconsistent: passed on without a flow.
    pub const fn malformed() -> Self {
        Decision::parsed(Parsed::Malformed)
    }

    /// The first packet of its flow; a SYN creates it without asking conntrack, any other
    /// packet asks.
    pub const fn new_flow(self, asks_conntrack: bool) -> Self {
        Decision { creates_flow: true, conntrack: asks_conntrack as u64, ..self }
    }

    /// Asks conntrack `n` times in all.
    pub const fn conntrack(self, n: u64) -> Self {
        Decision { conntrack: n, ..self }
    }

    /// Starts `n` HTTP requests.
    pub const fn requests(self, n: u64) -> Self {
        Decision { requests: n, ..self }
    }

    /// Completes `n` HTTP status lines.
    pub const fn responses(self, n: u64) -> Self {
        Decision { responses: n, ..self }
    }

    /// Carries a DNS query.
    pub const fn dns_query(self) -> Self {
        Decision { dns_queries: 1, ..self }
    }

    /// Carries a DNS response.
    pub const fn dns_response(self) -> Self {
        Decision { dns_responses: 1, ..self }
    }

    /// Marks its flow, and is the first packet copied.
    pub const fn triggers(self) -> Self {
        Decision { triggers: true, mirrored: true, ..self }
    }

    /// Is copied (its flow was marked before).
    pub const fn mirrored(self) -> Self {
        Decision { mirrored: true, ..self }
    }

    /// The flow the frame belongs to, if it is TCP or followed UDP.
    pub fn key(&self) -> Option<FlowKey> {
        match self.parsed {
            Parsed::Tcp(key) | Parsed::Udp(key) => Some(key),
            Parsed::Other | Parsed::Malformed => None,
        }
    }
}

/// How the frame runs again with the same decision: what is put back before each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// Nothing: the frame changes no state its decision depends on.
    AsIs,
    /// The flow's shared state (HTTP streams, requests pending, whether conntrack was asked,
    /// the mark, DNS queries kept) as the setup left it: a message read again would otherwise be a
    /// retransmission, a response would find its request answered, a trigger its flow marked.
    Restore,
    /// The whole flow forgotten and the setup frames run again: a repeated first packet would
    /// find its flow created.
    Setup,
}

/// One fixture.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// What it is (a row of the benchmark's report for the path fixtures).
    pub name: String,
    /// Frames run first, once, to bring the flow to the state the fixture is about.
    pub setup: Vec<Vec<u8>>,
    /// The frame decided.
    pub frame: Vec<u8>,
    /// What the classifier must decide on it.
    pub expect: Decision,
    /// How it runs again with the same decision.
    pub repeat: Repeat,
}

impl Fixture {
    fn new(name: impl Into<String>, frame: Vec<u8>, expect: Decision) -> Self {
        Fixture { name: name.into(), setup: Vec::new(), frame, expect, repeat: Repeat::Setup }
    }

    fn after(mut self, setup: Vec<Vec<u8>>) -> Self {
        self.setup = setup;
        self
    }

    fn repeat(mut self, repeat: Repeat) -> Self {
        self.repeat = repeat;
        self
    }

    /// Nothing is copied: the benchmark's "at most 2.5x the empty program" bar applies.
    pub fn quiet(&self) -> bool {
        !self.expect.mirrored
    }
}

fn v4_key(sport: u16, dport: u16) -> FlowKey {
    FlowKey::new(
        SocketAddr::new(IpAddr::V4(V4_CLIENT), sport),
        SocketAddr::new(IpAddr::V4(V4_SERVER), dport),
        6,
    )
}

fn v6_key(sport: u16, dport: u16) -> FlowKey {
    FlowKey::new(
        SocketAddr::new(IpAddr::V6(V6_CLIENT), sport),
        SocketAddr::new(IpAddr::V6(V6_SERVER), dport),
        6,
    )
}

/// Client -> server IPv4 TCP.
pub fn v4() -> PacketBuilder {
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(PORT_CLIENT, PORT_HTTP, tcp_flags::ACK)
}

/// Client -> server IPv6 TCP.
pub fn v6() -> PacketBuilder {
    PacketBuilder::ipv6(V6_CLIENT, V6_SERVER).tcp(PORT_CLIENT, PORT_HTTP, tcp_flags::ACK)
}

/// A server -> client IPv4 response with `payload` from `sport` to client port `cport`.
pub fn v4_response(sport: u16, cport: u16, payload: &[u8]) -> Vec<u8> {
    PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .tcp(sport, cport, tcp_flags::ACK | tcp_flags::PSH)
        .payload(payload)
        .build()
}

/// A client -> server IPv4 segment with `payload` from client port `cport` to `dport`.
pub fn v4_request(cport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .tcp(cport, dport, tcp_flags::ACK | tcp_flags::PSH)
        .payload(payload)
        .build()
}

/// A RST|ACK from the server (`from_server`) or the client of connection `cport` to port 80.
pub fn v4_rst(cport: u16, from_server: bool) -> Vec<u8> {
    let flags = tcp_flags::RST | tcp_flags::ACK;
    if from_server {
        PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).tcp(PORT_HTTP, cport, flags).build()
    } else {
        PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(cport, PORT_HTTP, flags).build()
    }
}

/// An IPv4 connection from client port `.0` to the HTTP port; each direction's stream starts
/// at sequence number 1000.
struct Conn(u16);

impl Conn {
    fn key(&self) -> FlowKey {
        v4_key(self.0, PORT_HTTP)
    }

    /// A segment with `payload` at `offset` in its direction's stream.
    fn segment(&self, to_server: bool, flags: u8, offset: usize, payload: &[u8]) -> Vec<u8> {
        let packet = if to_server {
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(self.0, PORT_HTTP, flags)
        } else {
            PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).tcp(PORT_HTTP, self.0, flags)
        };
        packet.seq(1000 + offset as u32).payload(payload).build()
    }

    fn ack(&self) -> Vec<u8> {
        self.segment(true, tcp_flags::ACK, 0, &[])
    }

    fn request_at(&self, offset: usize, payload: &[u8]) -> Vec<u8> {
        self.segment(true, tcp_flags::ACK | tcp_flags::PSH, offset, payload)
    }

    fn request(&self, payload: &[u8]) -> Vec<u8> {
        self.request_at(0, payload)
    }

    fn response_at(&self, offset: usize, payload: &[u8]) -> Vec<u8> {
        self.segment(false, tcp_flags::ACK | tcp_flags::PSH, offset, payload)
    }

    fn response(&self, payload: &[u8]) -> Vec<u8> {
        self.response_at(0, payload)
    }
}

/// One packet per path of the classifier, each on a flow of its own: what the data-path
/// benchmark times, in its report's order.
pub fn paths() -> Vec<Fixture> {
    let (ack, get, ok, error, syn, syn_ack, marked) =
        (Conn(40001), Conn(40002), Conn(40010), Conn(40020), Conn(40004), Conn(40005), Conn(40003));
    let (dns_q, dns_ok, dns_nx) = (DnsConn(40030), DnsConn(40031), DnsConn(40032));
    vec![
        Fixture::new(
            "UDP (non-TCP)",
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(PORT_CLIENT, 443).payload(&[0; 32]).build(),
            Decision::other(),
        )
        .repeat(Repeat::AsIs),
        Fixture::new("TCP ACK, no payload", ack.ack(), Decision::tcp(ack.key()))
            .after(vec![ack.ack()])
            .repeat(Repeat::AsIs),
        // The second request of a keep-alive connection, the first one answered.
        Fixture::new(
            "HTTP GET request",
            get.request_at(REQ_GET_BAR.len(), REQ_GET_BAR),
            Decision::tcp(get.key()).requests(1),
        )
        .after(vec![get.request(REQ_GET_BAR), get.response(RESP_200)])
        .repeat(Repeat::Restore),
        Fixture::new(
            "HTTP 200 response, no rule",
            ok.response(RESP_200),
            Decision::tcp(ok.key()).responses(1),
        )
        .after(vec![ok.request(REQ_GET_BAR)])
        .repeat(Repeat::Restore),
        // The first trigger of a connection asks conntrack for its other tuple, to mark both.
        Fixture::new(
            "HTTP 500 response, trigger",
            error.response(RESP_500),
            Decision::tcp(error.key()).responses(1).triggers().conntrack(1),
        )
        .after(vec![error.request(REQ_GET_BAR)])
        .repeat(Repeat::Restore),
        // A new flow: on a SYN nobody asks conntrack (it knows nothing yet); a flow first seen
        // on any other packet (a SYN/ACK on the server's side of a Service) asks it. The lookup
        // misses here (no conntrack entry), as it does for untranslated connections.
        Fixture::new(
            "TCP SYN, new flow",
            syn.segment(true, tcp_flags::SYN, 0, &[]),
            Decision::tcp(syn.key()).new_flow(false),
        ),
        Fixture::new(
            "TCP SYN/ACK, new flow (conntrack asked)",
            syn_ack.segment(false, tcp_flags::SYN | tcp_flags::ACK, 0, &[]),
            Decision::tcp(syn_ack.key()).new_flow(true),
        ),
        Fixture::new(
            "TCP ACK, mirrored flow (clone to veth)",
            marked.ack(),
            Decision::tcp(marked.key()).mirrored(),
        )
        .after(vec![marked.request(REQ_GET_BAR), marked.response(RESP_500)])
        .repeat(Repeat::AsIs),
        // DNS: a query creates its flow (no conntrack: a query's tuple is as sent) and is kept;
        // its response finds it, is timed and counted; an NXDOMAIN triggers [`super::rig::DNS_RULE`]
        // (conntrack asked once, for the flow's other tuple), replaying the query.
        Fixture::new(
            "DNS query, new flow",
            dns_q.query(),
            Decision::udp(dns_q.key()).new_flow(false).dns_query(),
        )
        .repeat(Repeat::Setup),
        Fixture::new("DNS response, no rule", dns_ok.response(0), Decision::udp(dns_ok.key()).dns_response())
            .after(vec![dns_ok.query()])
            .repeat(Repeat::Restore),
        Fixture::new(
            "DNS NXDOMAIN response, trigger",
            dns_nx.response(3),
            Decision::udp(dns_nx.key()).dns_response().triggers().conntrack(1),
        )
        .after(vec![dns_nx.query()])
        .repeat(Repeat::Restore),
    ]
}

/// A DNS client's socket (its port) and the query it sends to the server's port 53.
struct DnsConn(u16);

impl DnsConn {
    fn key(&self) -> FlowKey {
        FlowKey::new(
            SocketAddr::new(IpAddr::V4(V4_CLIENT), self.0),
            SocketAddr::new(IpAddr::V4(V4_SERVER), 53),
            17,
        )
    }

    fn query(&self) -> Vec<u8> {
        let q = super::dns::query(0x4d31, "api.example.com", super::dns::A);
        PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(self.0, 53).payload(&q).build()
    }

    fn response(&self, rcode: u8) -> Vec<u8> {
        let r = super::dns::response(0x4d31, "api.example.com", super::dns::A, rcode);
        PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).udp(53, self.0).payload(&r).build()
    }
}

/// HTTP/1.x recognised where it starts and only there, each on a new connection.
pub fn http() -> Vec<Fixture> {
    let mut out = Vec::new();
    let methods = ["POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"];
    for (i, method) in methods.iter().enumerate() {
        let c = Conn(41000 + i as u16);
        let req = format!("{method} /x HTTP/1.1\r\n\r\n");
        let expect = Decision::tcp(c.key()).new_flow(true).requests(1);
        out.push(Fixture::new(format!("{method} request"), c.request(req.as_bytes()), expect));
    }
    let not_http: [(&str, &[u8]); 8] = [
        ("four-digit status", b"HTTP/1.1 5000 Odd\r\n\r\n"),
        ("HTTP/2 status line", b"HTTP/2 500 \r\n\r\n\r\n\r\n"),
        ("lower-case version", b"http/1.1 500 x\r\n\r\n"),
        ("letters for a status", b"HTTP/1.1 abc x\r\n\r\n"),
        ("status line cut short", b"HTTP/1.1 50"),
        ("unknown method", b"GETX / HTTP/1.1\r\n\r\n"),
        ("lower-case method", b"get / HTTP/1.1\r\n\r\n"),
        ("TLS client hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00\x00\x00"),
    ];
    for (i, (what, payload)) in not_http.into_iter().enumerate() {
        let c = Conn(41100 + i as u16);
        let expect = Decision::tcp(c.key()).new_flow(true);
        out.push(Fixture::new(format!("not HTTP: {what}"), c.response(payload), expect));
    }
    // Responses found wherever they start in the server's stream.
    let split = Conn(41200);
    let (head, tail): (&[u8], &[u8]) =
        (b"HTTP/1.1 5", b"00 Internal Server Error\r\nContent-Length: 0\r\n\r\n");
    out.push(
        Fixture::new(
            "500 status line split across segments",
            split.response_at(head.len(), tail),
            Decision::tcp(split.key()).responses(1).triggers().conntrack(1),
        )
        .after(vec![split.response(head)]),
    );
    let pipelined = Conn(41201);
    out.push(Fixture::new(
        "500 pipelined after a 200 in one segment",
        pipelined.response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
        ),
        Decision::tcp(pipelined.key()).new_flow(true).responses(2).triggers().conntrack(2),
    ));
    let interim = Conn(41202);
    out.push(Fixture::new(
        "500 after 100 Continue",
        interim.response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"),
        Decision::tcp(interim.key()).new_flow(true).responses(2).triggers().conntrack(2),
    ));
    let body = Conn(41203);
    let head: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n";
    out.push(
        Fixture::new(
            "a status line in a body",
            body.response_at(head.len(), b"HTTP/1.1 500 in a body........"),
            Decision::tcp(body.key()),
        )
        .after(vec![body.response(head)]),
    );
    out
}

/// Every parse branch, valid and broken, on one flow.
pub fn parsing() -> Vec<Fixture> {
    let tcp4 = Decision::tcp(v4_key(PORT_CLIENT, PORT_HTTP)).new_flow(true);
    let tcp6 = Decision::tcp(v6_key(PORT_CLIENT, PORT_HTTP)).new_flow(true);
    let mut out = vec![
        Fixture::new("v4_tcp_ack", v4().build(), tcp4),
        Fixture::new("v4_tcp_payload", v4().payload(b"hello").build(), tcp4),
        Fixture::new("v4_ip_options", v4().ipv4_options(10).build(), tcp4),
        Fixture::new(
            "v4_tcp_options",
            v4().tcp_options(10).payload(RESP_200).build(),
            tcp4.responses(1).conntrack(2),
        ),
        Fixture::new("v4_vlan", v4().vlan(0x8100, 7).build(), tcp4),
        Fixture::new("v4_qinq", v4().vlan(0x88a8, 7).vlan(0x8100, 8).build(), tcp4),
        Fixture::new(
            "v4_three_tags",
            v4().vlan(0x88a8, 1).vlan(0x8100, 2).vlan(0x8100, 3).build(),
            Decision::other(),
        ),
        Fixture::new("v4_first_fragment", v4().ipv4_fragment(0, true).payload(b"x").build(), tcp4),
        Fixture::new("v4_later_fragment", v4().ipv4_fragment(100, false).build(), Decision::other()),
        Fixture::new(
            "v4_udp",
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(5353, 443).payload(b"q").build(),
            Decision::other(),
        ),
        Fixture::new("arp", PacketBuilder::ethertype(0x0806).payload(&[0; 28]).build(), Decision::other()),
        Fixture::new("v6_tcp", v6().payload(RESP_500).build(), tcp6.responses(1).triggers().conntrack(2)),
        Fixture::new("v6_vlan", v6().vlan(0x8100, 9).build(), tcp6),
        Fixture::new(
            "v6_ext_headers",
            v6().ipv6_ext(ipv6_ext::HOPOPTS, 1)
                .ipv6_ext(ipv6_ext::ROUTING, 3)
                .ipv6_ext(ipv6_ext::DSTOPTS, 2)
                .ipv6_ext(ipv6_ext::FRAGMENT, 0)
                .build(),
            tcp6,
        ),
        Fixture::new("v6_later_fragment", v6().ipv6_ext(ipv6_ext::FRAGMENT, 10).build(), Decision::other()),
        Fixture::new(
            "v6_ext_headers_beyond_the_walk",
            (0..7).fold(v6(), |b, _| b.ipv6_ext(ipv6_ext::DSTOPTS, 1)).build(),
            Decision::other(),
        ),
        Fixture::new(
            "v6_udp",
            PacketBuilder::ipv6(V6_CLIENT, V6_SERVER).udp(5353, 443).build(),
            Decision::other(),
        ),
    ];
    // Corrupted headers: each a valid frame with one field broken.
    let v4_frame = v4().payload(RESP_500).build();
    let l3 = super::packet::l3_offset(&v4_frame);
    let corrupt = |name, f: &dyn Fn(&mut Vec<u8>)| {
        let mut frame = v4_frame.clone();
        f(&mut frame);
        Fixture::new(name, frame, Decision::malformed())
    };
    out.push(corrupt("v4_ihl_below_5", &|f| f[l3] = 0x44));
    let mut short = v4().build();
    short[l3] = 0x4f;
    out.push(Fixture::new("v4_ihl_past_packet", short, Decision::malformed()));
    out.push(corrupt("v4_bad_version", &|f| f[l3] = 0x65));
    out.push(corrupt("v4_tot_len_below_ihl", &|f| f[l3 + 2..l3 + 4].copy_from_slice(&10u16.to_be_bytes())));
    out.push(corrupt("v4_tot_len_past_frame", &|f| {
        f[l3 + 2..l3 + 4].copy_from_slice(&1500u16.to_be_bytes())
    }));
    out.push(corrupt("tcp_doff_below_5", &|f| f[l3 + 20 + 12] = 0x40));
    let mut short = v4().build();
    short[l3 + 20 + 12] = 0xf0;
    out.push(Fixture::new("tcp_doff_past_packet", short, Decision::malformed()));
    let mut v6_bad = v6().build();
    let l3 = super::packet::l3_offset(&v6_bad);
    v6_bad[l3] = 0x40;
    out.push(Fixture::new("v6_bad_version", v6_bad, Decision::malformed()));
    out
}

/// Every fixture: the paths, HTTP recognition, parsing.
pub fn all() -> Vec<Fixture> {
    [paths(), http(), parsing()].concat()
}

/// Frames on which every truncation must be seen as malformed (never mis-parsed).
pub fn truncation_fixtures() -> Vec<Fixture> {
    parsing().into_iter().filter(|f| matches!(f.expect.parsed, Parsed::Tcp(_) | Parsed::Udp(_))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_flows_of_different_fixtures_distinct() {
        let all = all();
        let mut names: Vec<&str> = all.iter().map(|f| f.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        // The parse fixtures share one flow (each is decided on a fresh one); the others are
        // primed side by side, so each has its own.
        let mut keys: Vec<FlowKey> =
            [paths(), http()].concat().iter().filter_map(|f| f.expect.key()).collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n);
    }

    #[test]
    fn a_frame_that_changes_its_flow_is_not_repeated_as_is() {
        for f in all() {
            let e = &f.expect;
            let changes = e.creates_flow || e.requests + e.responses > 0 || e.triggers;
            assert!(!changes || f.repeat != Repeat::AsIs, "{}", f.name);
        }
    }
}
