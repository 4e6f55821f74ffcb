//! Random and mutated frames for differential fuzzing of the classifier against
//! [`super::reference`]: well-formed segments of every parse path (VLAN stacks, IPv4 options
//! and fragments, IPv6 extension chains, TCP options, UDP, other ethertypes) carrying status
//! lines, requests or noise, then mutated: truncated, lengths and offsets rewritten (IHL, total
//! length, payload length, data offset), next-header and ethertype bytes changed, bytes flipped,
//! status lines altered. Addresses come from 198.18.0.0/15 and 2001:2::/48 only.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::packet::{ipv6_ext, tcp_flags, PacketBuilder};

/// A small deterministic generator (xorshift64*): the same seed, the same frames.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }

    /// True once in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const STATUS_LINES: [&[u8]; 10] = [
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 500 Internal Server Error\r\n\r\n",
    b"HTTP/1.1 500\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 503 Service Unavailable\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\n\r\n",
    b"HTTP/1.1 5000 Odd\r\n\r\n",
    b"HTTP/2 500 \r\n\r\n\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
];

const REQUESTS: [&[u8]; 3] = [
    b"GET /bar HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"get / x\r\n\r\n",
];

fn v4(rng: &mut Rng) -> Ipv4Addr {
    Ipv4Addr::new(198, 18 + rng.below(2) as u8, rng.below(256) as u8, rng.below(256) as u8)
}

fn v6(rng: &mut Rng) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        2,
        0,
        rng.below(0x10000) as u16,
        0,
        0,
        rng.below(0x10000) as u16,
        rng.below(0x10000) as u16,
    )
}

/// A payload: a status line (maybe altered), a request, noise or nothing.
fn payload(rng: &mut Rng) -> Vec<u8> {
    let mut p = match rng.below(8) {
        0..=3 => rng.pick(&STATUS_LINES).to_vec(),
        4 => rng.pick(&REQUESTS).to_vec(),
        5 => Vec::new(),
        _ => (0..rng.below(64)).map(|_| rng.bits() as u8).collect(),
    };
    if p.starts_with(b"HTTP/") && rng.one_in(3) {
        // A status line altered where it is recognised: version, digits, separator.
        let at = rng.below(14.min(p.len()));
        p[at] = *rng.pick(b"0123456789 \r\nHTxP/.1a\0\xff");
    }
    if rng.one_in(6) {
        p.truncate(rng.below(p.len() + 1));
    }
    p
}

/// A well-formed frame of a random parse path.
fn base(rng: &mut Rng) -> Vec<u8> {
    let mut b = match rng.below(10) {
        0..=4 => {
            let mut b = PacketBuilder::ipv4(v4(rng), v4(rng));
            if rng.one_in(3) {
                b = b.ipv4_options(rng.below(11));
            }
            if rng.one_in(5) {
                b = b.ipv4_fragment(if rng.one_in(2) { 0 } else { rng.below(100) as u16 }, rng.one_in(2));
            }
            b
        }
        5..=8 => {
            let mut b = PacketBuilder::ipv6(v6(rng), v6(rng));
            for _ in 0..rng.below(8) {
                let kind =
                    *rng.pick(&[ipv6_ext::HOPOPTS, ipv6_ext::ROUTING, ipv6_ext::DSTOPTS, ipv6_ext::FRAGMENT]);
                let units =
                    if kind == ipv6_ext::FRAGMENT && rng.one_in(2) { 0 } else { 1 + rng.below(3) as u8 };
                b = b.ipv6_ext(kind, units);
            }
            b
        }
        _ => PacketBuilder::ethertype(*rng.pick(&[0x0806u16, 0x88cc, 0x8847, 0x0800, 0x86dd])),
    };
    for _ in 0..[0, 0, 0, 1, 1, 2, 3][rng.below(7)] {
        b = b.vlan(*rng.pick(&[0x8100u16, 0x88a8]), rng.below(4096) as u16);
    }
    let (sport, dport) =
        if rng.one_in(2) { (80, 30000 + rng.below(30000) as u16) } else { (rng.below(65536) as u16, 80) };
    if rng.one_in(8) {
        b = b.udp(sport, dport);
    } else {
        let flags = match rng.below(10) {
            0 => tcp_flags::SYN,
            1 => tcp_flags::SYN | tcp_flags::ACK,
            2 => tcp_flags::FIN | tcp_flags::ACK,
            3 => rng.bits() as u8,
            4..=5 => tcp_flags::ACK,
            _ => tcp_flags::ACK | tcp_flags::PSH,
        };
        b = b.tcp(sport, dport, flags).seq(rng.bits() as u32);
        if rng.one_in(3) {
            b = b.tcp_options(rng.below(11));
        }
    }
    b.payload(&payload(rng)).build()
}

/// Where the L3 header starts (after up to three tags), within the frame.
fn l3_offset(f: &[u8]) -> usize {
    let mut off = 12;
    while off < 24
        && f.get(off..off + 2).is_some_and(|t| matches!(u16::from_be_bytes([t[0], t[1]]), 0x8100 | 0x88a8))
    {
        off += 4;
    }
    (off + 2).min(f.len())
}

/// Rewrites one header field or byte of `f` (a frame from [`base`]).
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    let l3 = l3_offset(f);
    let set = |f: &mut Vec<u8>, at: usize, v: u8| {
        if let Some(b) = f.get_mut(at) {
            *b = v;
        }
    };
    let v6 = f.get(l3).is_some_and(|b| b >> 4 == 6);
    match rng.below(9) {
        // Truncated anywhere (test_run needs the Ethernet header).
        0 => f.truncate(14 + rng.below(f.len().saturating_sub(14) + 1)),
        // IHL or version.
        1 => set(f, l3, if rng.one_in(2) { 0x40 | rng.below(16) as u8 } else { rng.bits() as u8 }),
        // Total length (IPv4) or payload length (IPv6).
        2 => {
            let at = if v6 { l3 + 4 } else { l3 + 2 };
            let len = [0u16, 1, 19, 20, 40, rng.below(2000) as u16][rng.below(6)];
            let off = rng.below(3) as u16 * 8;
            let v = len.wrapping_add(off).to_be_bytes();
            set(f, at, v[0]);
            set(f, at + 1, v[1]);
        }
        // The TCP data offset, wherever the TCP header is on the plain paths.
        3 => {
            let ihl = f.get(l3).map_or(20, |b| usize::from(b & 0xf) * 4);
            let at = if v6 { l3 + 40 + 12 } else { l3 + ihl + 12 };
            set(f, at, (rng.below(16) as u8) << 4);
        }
        // Next header / protocol.
        4 => {
            let at = if v6 { l3 + 6 } else { l3 + 9 };
            let any = rng.bits() as u8;
            set(f, at, *rng.pick(&[0u8, 6, 17, 43, 44, 51, 59, 60, any]));
        }
        // Ethertype or a VLAN's encapsulated type.
        5 => {
            let at = 12 + 4 * rng.below(3);
            let v = rng.pick(&[0x0800u16, 0x86dd, 0x8100, 0x88a8, 0x0806]).to_be_bytes();
            set(f, at, v[0]);
            set(f, at + 1, v[1]);
        }
        // Fragment offset.
        6 => set(f, l3 + if v6 { 40 + 2 } else { 6 }, rng.bits() as u8),
        // Trailing bytes beyond the IP length (padding).
        7 => f.extend((0..1 + rng.below(32)).map(|_| rng.bits() as u8)),
        // Any byte.
        _ => {
            if !f.is_empty() {
                let at = rng.below(f.len());
                f[at] = rng.bits() as u8;
            }
        }
    }
}

/// One fuzzing frame: well-formed half of the time, else with one to three mutations.
pub fn frame(rng: &mut Rng) -> Vec<u8> {
    let mut f = base(rng);
    if rng.one_in(2) {
        for _ in 0..1 + rng.below(3) {
            mutate(rng, &mut f);
        }
    }
    f
}
