//! Parse fixtures: an input frame and what the classifier must make of it. Shared by the
//! BPF unit tests and the benchmarks.

use std::net::{IpAddr, SocketAddr};

use super::consts::*;
use super::packet::{ipv6_ext, tcp_flags, PacketBuilder};
use crate::flow::FlowKey;

/// What the parser must conclude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A TCP segment of this flow.
    Tcp(FlowKey),
    /// Valid, not for us (non-IP, non-TCP, non-first fragment).
    Other,
    /// Truncated or inconsistent.
    Malformed,
}

/// One fixture.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// What it is.
    pub name: &'static str,
    /// The frame.
    pub frame: Vec<u8>,
    /// What the parser must make of it.
    pub expect: Parsed,
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

/// Every parse branch, valid and broken.
pub fn parse_fixtures() -> Vec<Fixture> {
    let tcp4 = Parsed::Tcp(v4_key(PORT_CLIENT, PORT_HTTP));
    let tcp6 = Parsed::Tcp(v6_key(PORT_CLIENT, PORT_HTTP));
    let mut out = vec![
        Fixture { name: "v4_tcp_ack", frame: v4().build(), expect: tcp4 },
        Fixture { name: "v4_tcp_payload", frame: v4().payload(b"hello").build(), expect: tcp4 },
        Fixture { name: "v4_ip_options", frame: v4().ipv4_options(10).build(), expect: tcp4 },
        Fixture {
            name: "v4_tcp_options",
            frame: v4().tcp_options(10).payload(RESP_200).build(),
            expect: tcp4,
        },
        Fixture { name: "v4_vlan", frame: v4().vlan(0x8100, 7).build(), expect: tcp4 },
        Fixture { name: "v4_qinq", frame: v4().vlan(0x88a8, 7).vlan(0x8100, 8).build(), expect: tcp4 },
        Fixture {
            name: "v4_three_tags",
            frame: v4().vlan(0x88a8, 1).vlan(0x8100, 2).vlan(0x8100, 3).build(),
            expect: Parsed::Other,
        },
        Fixture {
            name: "v4_first_fragment",
            frame: v4().ipv4_fragment(0, true).payload(b"x").build(),
            expect: tcp4,
        },
        Fixture {
            name: "v4_later_fragment",
            frame: v4().ipv4_fragment(100, false).build(),
            expect: Parsed::Other,
        },
        Fixture {
            name: "v4_udp",
            frame: PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(5353, 53).payload(b"q").build(),
            expect: Parsed::Other,
        },
        Fixture {
            name: "arp",
            frame: PacketBuilder::ethertype(0x0806).payload(&[0; 28]).build(),
            expect: Parsed::Other,
        },
        Fixture { name: "v6_tcp", frame: v6().payload(RESP_500).build(), expect: tcp6 },
        Fixture { name: "v6_vlan", frame: v6().vlan(0x8100, 9).build(), expect: tcp6 },
        Fixture {
            name: "v6_ext_headers",
            frame: v6()
                .ipv6_ext(ipv6_ext::HOPOPTS, 1)
                .ipv6_ext(ipv6_ext::ROUTING, 3)
                .ipv6_ext(ipv6_ext::DSTOPTS, 2)
                .ipv6_ext(ipv6_ext::FRAGMENT, 0)
                .build(),
            expect: tcp6,
        },
        Fixture {
            name: "v6_later_fragment",
            frame: v6().ipv6_ext(ipv6_ext::FRAGMENT, 10).build(),
            expect: Parsed::Other,
        },
        Fixture {
            name: "v6_ext_headers_beyond_the_walk",
            frame: (0..7).fold(v6(), |b, _| b.ipv6_ext(ipv6_ext::DSTOPTS, 1)).build(),
            expect: Parsed::Other,
        },
        Fixture {
            name: "v6_udp",
            frame: PacketBuilder::ipv6(V6_CLIENT, V6_SERVER).udp(5353, 53).build(),
            expect: Parsed::Other,
        },
    ];
    // Corrupted headers: each a valid frame with one field broken.
    let v4_frame = v4().payload(RESP_500).build();
    let l3 = super::packet::l3_offset(&v4_frame);
    let corrupt = |name, f: &dyn Fn(&mut Vec<u8>)| {
        let mut frame = v4_frame.clone();
        f(&mut frame);
        Fixture { name, frame, expect: Parsed::Malformed }
    };
    out.push(corrupt("v4_ihl_below_5", &|f| f[l3] = 0x44));
    let mut short = v4().build();
    short[l3] = 0x4f;
    out.push(Fixture { name: "v4_ihl_past_packet", frame: short, expect: Parsed::Malformed });
    out.push(corrupt("v4_bad_version", &|f| f[l3] = 0x65));
    out.push(corrupt("v4_tot_len_below_ihl", &|f| f[l3 + 2..l3 + 4].copy_from_slice(&10u16.to_be_bytes())));
    out.push(corrupt("v4_tot_len_past_frame", &|f| {
        f[l3 + 2..l3 + 4].copy_from_slice(&1500u16.to_be_bytes())
    }));
    out.push(corrupt("tcp_doff_below_5", &|f| f[l3 + 20 + 12] = 0x40));
    let mut short = v4().build();
    short[l3 + 20 + 12] = 0xf0;
    out.push(Fixture { name: "tcp_doff_past_packet", frame: short, expect: Parsed::Malformed });
    let mut v6_bad = v6().build();
    let l3 = super::packet::l3_offset(&v6_bad);
    v6_bad[l3] = 0x40;
    out.push(Fixture { name: "v6_bad_version", frame: v6_bad, expect: Parsed::Malformed });
    out
}

/// Frames on which every truncation must be seen as malformed (never mis-parsed).
pub fn truncation_fixtures() -> Vec<Fixture> {
    parse_fixtures().into_iter().filter(|f| matches!(f.expect, Parsed::Tcp(_))).collect()
}
