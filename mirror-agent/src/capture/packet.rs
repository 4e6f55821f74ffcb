//! A mirrored frame's addresses, and its checksums filled in where the sender left them to
//! offload: a pod's own TCP and UDP packets are copied on the host-side veth before any
//! device computed their checksum, which then holds the pseudo-header's sum only.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The endpoints of a TCP or UDP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// 6 (TCP) or 17 (UDP).
    pub proto: u8,
}

/// Where the layers of a frame start.
struct Layers {
    /// The IP header.
    ip: usize,
    /// The TCP or UDP header.
    l4: usize,
    /// The end of the IP packet.
    end: usize,
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn layers(f: &[u8]) -> Option<Layers> {
    let mut at = 12;
    let mut ethertype = be16(f, at)?;
    // 802.1Q and 802.1ad tags.
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        at += 4;
        ethertype = be16(f, at)?;
    }
    let ip = at + 2;
    match ethertype {
        0x0800 => {
            let ihl = usize::from(f.get(ip)? & 0x0f) * 4;
            let total = usize::from(be16(f, ip + 2)?);
            let frag = be16(f, ip + 6)? & 0x3fff;
            if ihl < 20 || frag != 0 {
                return None;
            }
            let src: [u8; 4] = f.get(ip + 12..ip + 16)?.try_into().ok()?;
            let dst: [u8; 4] = f.get(ip + 16..ip + 20)?.try_into().ok()?;
            Some(Layers {
                ip,
                l4: ip + ihl,
                end: (ip + total).min(f.len()),
                proto: *f.get(ip + 9)?,
                src: Ipv4Addr::from(src).into(),
                dst: Ipv4Addr::from(dst).into(),
            })
        }
        0x86dd => {
            let payload = usize::from(be16(f, ip + 4)?);
            let src: [u8; 16] = f.get(ip + 8..ip + 24)?.try_into().ok()?;
            let dst: [u8; 16] = f.get(ip + 24..ip + 40)?.try_into().ok()?;
            let mut next = *f.get(ip + 6)?;
            let mut l4 = ip + 40;
            // Hop-by-hop, routing and destination options; a fragment is left alone.
            for _ in 0..8 {
                match next {
                    0 | 43 | 60 => {
                        next = *f.get(l4)?;
                        l4 += (usize::from(*f.get(l4 + 1)?) + 1) * 8;
                    }
                    _ => break,
                }
            }
            Some(Layers {
                ip,
                l4,
                end: (ip + 40 + payload).min(f.len()),
                proto: next,
                src: Ipv6Addr::from(src).into(),
                dst: Ipv6Addr::from(dst).into(),
            })
        }
        _ => None,
    }
}

/// The TCP or UDP endpoints of an Ethernet frame (`None`: another protocol, a fragment, a
/// truncated header).
pub fn tuple(frame: &[u8]) -> Option<Tuple> {
    let l = layers(frame)?;
    if l.proto != 6 && l.proto != 17 {
        return None;
    }
    let sport = be16(frame, l.l4)?;
    let dport = be16(frame, l.l4 + 2)?;
    Some(Tuple { src: SocketAddr::new(l.src, sport), dst: SocketAddr::new(l.dst, dport), proto: l.proto })
}

/// The TCP flags of an Ethernet frame (`None`: not TCP, or truncated).
pub fn tcp_flags(frame: &[u8]) -> Option<u8> {
    let l = layers(frame)?;
    if l.proto != 6 {
        return None;
    }
    frame.get(l.l4 + 13).copied()
}

fn sum(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Computes the IPv4 header checksum and the TCP or UDP checksum of `frame` in place, as the
/// device would have. Returns whether anything changed (`false` also for frames it does not
/// handle: not TCP or UDP, fragments, truncated).
pub fn fix_checksums(frame: &mut [u8]) -> bool {
    let Some(l) = layers(frame) else { return false };
    let mut changed = false;
    if l.src.is_ipv4() {
        let (ip, l4) = (l.ip, l.l4);
        let old = [frame[ip + 10], frame[ip + 11]];
        frame[ip + 10] = 0;
        frame[ip + 11] = 0;
        let c = fold(sum(&frame[ip..l4], 0)).to_be_bytes();
        frame[ip + 10..ip + 12].copy_from_slice(&c);
        changed |= c != old;
    }
    let at = match l.proto {
        6 => 16,
        17 => 6,
        _ => return changed,
    };
    if l.end < l.l4 + at + 2 {
        return changed;
    }
    let len = (l.end - l.l4) as u32;
    let mut acc = match (l.src, l.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum(&d.octets(), sum(&s.octets(), 0)),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum(&d.octets(), sum(&s.octets(), 0)),
        _ => return changed,
    };
    acc += u32::from(l.proto) + (len >> 16) + (len & 0xffff);
    let field = l.l4 + at;
    let old = [frame[field], frame[field + 1]];
    frame[field] = 0;
    frame[field + 1] = 0;
    let mut c = fold(sum(&frame[l.l4..l.end], acc));
    if l.proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    changed | (c.to_be_bytes() != old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirror_bpf::testing::consts::{V4_CLIENT, V4_SERVER, V6_CLIENT, V6_SERVER};
    use mirror_bpf::testing::packet::PacketBuilder;

    /// Whether the transport checksum of `f` verifies (the one's complement sum of the
    /// pseudo-header and the segment, checksum included, is all ones).
    fn verifies(f: &[u8]) -> bool {
        let l = layers(f).unwrap();
        let len = (l.end - l.l4) as u32;
        let mut acc = match (l.src, l.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => sum(&d.octets(), sum(&s.octets(), 0)),
            (IpAddr::V6(s), IpAddr::V6(d)) => sum(&d.octets(), sum(&s.octets(), 0)),
            _ => unreachable!(),
        };
        acc += u32::from(l.proto) + len;
        fold(sum(&f[l.l4..l.end], acc)) == 0
    }

    #[test]
    fn checksums_left_to_offload_are_computed() {
        let frames = [
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(40000, 80, 0x18).payload(b"GET / HTTP/1.1\r\n\r\n"),
            PacketBuilder::ipv6(V6_CLIENT, V6_SERVER).tcp(40000, 80, 0x18).payload(b"GET / HTTP/1.1\r\n\r\n"),
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(5353, 53).payload(b"odd"),
            PacketBuilder::ipv6(V6_CLIENT, V6_SERVER).ipv6_ext(0, 0).udp(5353, 53).payload(b"x"),
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).vlan(0x8100, 7).tcp(1, 2, 0x10),
        ];
        for b in frames {
            // As offload leaves it: zeros where the device would write.
            let mut f = b.build();
            let t = tuple(&f).expect("a TCP or UDP frame");
            assert!([80, 53, 2].contains(&t.dst.port()), "{t:?}");
            assert!(!verifies(&f));
            assert!(fix_checksums(&mut f));
            assert!(verifies(&f), "{b:?}");
            // Right already: nothing changes.
            let fixed = f.clone();
            assert!(!fix_checksums(&mut f));
            assert_eq!(f, fixed);
        }
    }

    #[test]
    fn other_frames_are_left_alone() {
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(tuple(&arp), None);
        assert!(!fix_checksums(&mut arp));
        let mut short = vec![0u8; 20];
        short[12..14].copy_from_slice(&[0x08, 0x00]);
        assert!(!fix_checksums(&mut short));
        let mut frag =
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).ipv4_fragment(8, false).tcp(1, 2, 0x10).build();
        assert_eq!(tuple(&frag), None);
        assert!(!fix_checksums(&mut frag));
    }
}
