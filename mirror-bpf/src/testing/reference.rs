//! A reference of the classifier's parse stage and of its single-segment trigger decision,
//! written from `bpf/include/parse.h` and the HTTP recognition rules (`bpf/include/http.h`),
//! for differential fuzzing: the same frame through this and through BPF_PROG_TEST_RUN must
//! give the same verdict class, flow key and trigger.
//!
//! What it states exactly:
//! - parsing, as the classifier does it over the frame as BPF_PROG_TEST_RUN builds the skb
//!   (all of it linear, `skb->len` the frame's length): Ethernet, up to two 802.1Q/802.1ad
//!   tags, IPv4 (IHL, options, total length, fragments: a non-first fragment is not ours),
//!   IPv6 (a walk of up to 6 hop-by-hop, routing, destination-options, fragment and AH
//!   headers), TCP (data offset, options); UDP and everything else is "other" (DNS not
//!   followed: no DNS rule and DNS times off, as the differential test sets the classifier);
//! - the trigger decision of a segment that creates its flow, under the rule `status=500`:
//!   a segment without SYN, FIN or RST whose TCP payload (per the IP length) holds at least
//!   16 bytes and starts with `HTTP/1.0 ` or `HTTP/1.1 `, three digits and a space or CR
//!   triggers exactly when the digits are `500`; one whose payload does not start with
//!   `HTTP/1.` (nor with a request method) triggers never. Other segments (SYN, FIN or RST
//!   set, a status line shorter than 16 bytes, which is kept to be joined with the next
//!   segment) are not stated.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::fixtures::Parsed;
use crate::flow::FlowKey;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IP_OFFSET_MASK: u16 = 0x1fff;
const IP6_OFFSET_MASK: u16 = 0xfff8;
const IPV6_EXT_MAX: usize = 6;
const VLAN_MAX: usize = 2;
const TCP: u8 = 6;

/// What the reference concludes about a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The parse stage's conclusion (and the flow key of a TCP segment).
    pub parsed: Parsed,
    /// Whether the segment, creating its flow, triggers `status=500`; `None`: not stated.
    pub triggers: Option<bool>,
}

struct Cursor<'a> {
    frame: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(len)?;
        let s = self.frame.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The TCP segment found: its flow key, flags and payload.
struct Segment<'a> {
    key: FlowKey,
    flags: u8,
    payload: &'a [u8],
}

enum Outcome<'a> {
    Tcp(Segment<'a>),
    Other,
    Malformed,
}

/// The classifier's verdict on `frame`, as the reference states it.
pub fn decide(frame: &[u8]) -> Verdict {
    match parse(frame) {
        Outcome::Other => Verdict { parsed: Parsed::Other, triggers: Some(false) },
        Outcome::Malformed => Verdict { parsed: Parsed::Malformed, triggers: Some(false) },
        Outcome::Tcp(seg) => Verdict { parsed: Parsed::Tcp(seg.key), triggers: trigger(&seg) },
    }
}

/// The single-segment trigger decision of a segment that creates its flow.
fn trigger(seg: &Segment<'_>) -> Option<bool> {
    const SYN_FIN_RST: u8 = 0x07;
    if seg.flags & SYN_FIN_RST != 0 {
        return None;
    }
    let p = seg.payload;
    if !p.starts_with(b"HTTP/1.") {
        // Nor a request: a request line starts with an upper-case method.
        return if p.first().is_some_and(u8::is_ascii_uppercase) { None } else { Some(false) };
    }
    if p.len() < 16 {
        return None;
    }
    let version = &p[..9] == b"HTTP/1.0 " || &p[..9] == b"HTTP/1.1 ";
    let digits = p[9..12].iter().all(u8::is_ascii_digit);
    let end = p[12] == b' ' || p[12] == b'\r';
    if version && digits && end {
        if &p[9..12] == b"500" {
            return Some(true);
        }
        // Another response: a 500 may follow it in the same segment (after an interim 1xx, or
        // pipelined after a body whose framing is followed); not stated when one could.
        let more = p[1..].windows(7).any(|w| w == b"HTTP/1.");
        return if more { None } else { Some(false) };
    }
    // Not a status line: nothing can start a response here.
    Some(false)
}

fn parse(frame: &[u8]) -> Outcome<'_> {
    let skb_len = frame.len();
    let mut c = Cursor { frame, pos: 0 };
    let Some(eth) = c.take(14) else { return Outcome::Malformed };
    let mut proto = be16(eth, 12);
    for _ in 0..VLAN_MAX {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let Some(vlan) = c.take(4) else { return Outcome::Malformed };
        proto = be16(vlan, 2);
    }
    match proto {
        ETH_P_IP => parse_ipv4(&mut c, skb_len),
        ETH_P_IPV6 => parse_ipv6(&mut c, skb_len),
        _ => Outcome::Other,
    }
}

fn parse_ipv4<'a>(c: &mut Cursor<'a>, skb_len: usize) -> Outcome<'a> {
    let Some(ip) = c.take(20) else { return Outcome::Malformed };
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let tot_len = usize::from(be16(ip, 2));
    if ip[0] >> 4 != 4 || ihl < 20 || (tot_len != 0 && tot_len < ihl) {
        return Outcome::Malformed;
    }
    if c.take(ihl - 20).is_none() {
        return Outcome::Malformed;
    }
    if be16(ip, 6) & IP_OFFSET_MASK != 0 || ip[9] != TCP {
        return Outcome::Other;
    }
    let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
    parse_tcp(c, src, dst, (tot_len != 0).then(|| tot_len - ihl), skb_len)
}

fn parse_ipv6<'a>(c: &mut Cursor<'a>, skb_len: usize) -> Outcome<'a> {
    let Some(ip6) = c.take(40) else { return Outcome::Malformed };
    if ip6[0] >> 4 != 6 {
        return Outcome::Malformed;
    }
    let mut l4_len = usize::from(be16(ip6, 4));
    let jumbo = l4_len == 0;
    let mut next = ip6[6];
    let addr = |at: usize| {
        let mut b = [0u8; 16];
        b.copy_from_slice(&ip6[at..at + 16]);
        IpAddr::V6(Ipv6Addr::from(b))
    };
    for _ in 0..IPV6_EXT_MAX {
        let len = match next {
            0 | 43 | 60 => {
                let Some(ext) = c.take(2) else { return Outcome::Malformed };
                next = ext[0];
                (usize::from(ext[1]) + 1) * 8
            }
            51 => {
                let Some(ext) = c.take(2) else { return Outcome::Malformed };
                next = ext[0];
                (usize::from(ext[1]) + 2) * 4
            }
            44 => {
                let Some(frag) = c.take(8) else { return Outcome::Malformed };
                if be16(frag, 2) & IP6_OFFSET_MASK != 0 {
                    return Outcome::Other;
                }
                next = frag[0];
                if !jumbo && l4_len < 8 {
                    return Outcome::Malformed;
                }
                if !jumbo {
                    l4_len -= 8;
                }
                continue;
            }
            TCP => return parse_tcp(c, addr(8), addr(24), (!jumbo).then_some(l4_len), skb_len),
            _ => return Outcome::Other,
        };
        if (!jumbo && l4_len < len) || c.take(len - 2).is_none() {
            return Outcome::Malformed;
        }
        if !jumbo {
            l4_len -= len;
        }
    }
    if next == TCP {
        Outcome::Malformed
    } else {
        Outcome::Other
    }
}

/// `l4_len`: TCP header and payload per the IP header; `None`: the rest of the frame.
fn parse_tcp<'a>(
    c: &mut Cursor<'a>,
    src: IpAddr,
    dst: IpAddr,
    l4_len: Option<usize>,
    skb_len: usize,
) -> Outcome<'a> {
    let l4_off = c.pos;
    let Some(tcp) = c.take(20) else { return Outcome::Malformed };
    let l4_len = l4_len.unwrap_or(skb_len.saturating_sub(l4_off));
    if l4_off + l4_len > skb_len {
        return Outcome::Malformed;
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < 20 || doff > l4_len || c.take(doff - 20).is_none() {
        return Outcome::Malformed;
    }
    let (sport, dport) = (be16(tcp, 0), be16(tcp, 2));
    let payload = &c.frame[c.pos..c.pos + (l4_len - doff)];
    Outcome::Tcp(Segment {
        key: FlowKey::new(SocketAddr::new(src, sport), SocketAddr::new(dst, dport), TCP),
        flags: tcp[13],
        payload,
    })
}
