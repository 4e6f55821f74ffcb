//! Reading the pcap files tcpdump writes: Ethernet frames down to the TCP or UDP header and
//! payload. Parsed here rather than from tcpdump's text so that payloads (status lines, DNS
//! messages) are at hand.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use mirror_bpf::event::DROP_MAC;
use mirror_bpf::replay::REPLAY_MAC;
use mirror_bpf::FlowKey;

/// One captured TCP segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// When it was captured, ns since the epoch (µs precision unless the capture asked for ns).
    pub ts_ns: u64,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flag byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10).
    pub flags: u8,
    /// Payload length per the IP header.
    pub len: u32,
    /// The captured payload.
    pub payload: Vec<u8>,
}

/// What makes a packet the same packet in two captures on its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PacketId {
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// TCP flags.
    pub flags: u8,
    /// Payload length.
    pub len: u32,
}

impl fmt::Display for PacketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(u8, char); 5] = [(0x02, 'S'), (0x01, 'F'), (0x04, 'R'), (0x08, 'P'), (0x10, '.')];
        let flags: String = NAMES.iter().filter(|(bit, _)| self.flags & bit != 0).map(|(_, c)| *c).collect();
        write!(f, "{} > {} [{flags}] seq {} ack {} len {}", self.src, self.dst, self.seq, self.ack, self.len)
    }
}

impl Packet {
    /// Its identity.
    pub fn id(&self) -> PacketId {
        PacketId {
            src: self.src,
            dst: self.dst,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            len: self.len,
        }
    }

    /// Its connection, as the classifier keys it.
    pub fn flow(&self) -> FlowKey {
        FlowKey::new(self.src, self.dst, 6)
    }

    /// The status when the payload starts with an HTTP/1.x status line.
    pub fn http_status(&self) -> Option<u16> {
        let p = self.payload.get(..12)?;
        if !(p.starts_with(b"HTTP/1.0 ") || p.starts_with(b"HTTP/1.1 ")) {
            return None;
        }
        std::str::from_utf8(&p[9..12]).ok()?.parse().ok()
    }
}

/// One captured UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// When it was captured, ns since the epoch.
    pub ts_ns: u64,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// Payload length per the UDP header.
    pub len: u32,
    /// The captured payload.
    pub payload: Vec<u8>,
}

impl Datagram {
    /// Its flow, as the classifier keys it.
    pub fn flow(&self) -> FlowKey {
        FlowKey::new(self.src, self.dst, 17)
    }
}

/// Every TCP segment and UDP datagram of a pcap file, in order, and how many frames were
/// something else.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The TCP segments.
    pub packets: Vec<Packet>,
    /// The UDP datagrams (first fragments, or whole).
    pub datagrams: Vec<Datagram>,
    /// Frames that are not IPv4/IPv6 TCP or UDP.
    pub other: usize,
    /// Of those, IPv6 multicast listener reports and neighbour solicitations sent from the
    /// unspecified address (`::`): what a link with IPv6 on but no address sends on its own.
    pub ipv6_own: usize,
    /// Requests replayed ahead of their trigger (Ethernet source [`REPLAY_MAC`]): not in
    /// `packets`, which holds copies only.
    pub replayed: Vec<Replayed>,
    /// Datagrams replayed ahead of their trigger (a DNS query): not in `datagrams`.
    pub replayed_datagrams: Vec<ReplayedDatagram>,
    /// TCP segments the kernel dropped, written by the agent (Ethernet source [`DROP_MAC`]):
    /// not in `packets`.
    pub dropped: Vec<Replayed>,
}

/// A replayed request on the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Copies (of `packets`) received before it.
    pub after_copies: usize,
    /// The request's segment.
    pub packet: Packet,
}

/// A replayed datagram on the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedDatagram {
    /// Copies of datagrams (of `datagrams`) received before it.
    pub after_copies: usize,
    /// The datagram.
    pub datagram: Datagram,
}

/// An IPv6 frame from `::` carrying ICMPv6 (directly or after a hop-by-hop header): an MLD
/// report or a DAD neighbour solicitation of a link that has no IPv6 address.
fn ipv6_own(f: &[u8]) -> bool {
    if f.len() < 54 || f[12..14] != [0x86, 0xdd] || f[22..38].iter().any(|&b| b != 0) {
        return false;
    }
    match f[20] {
        58 => true,
        0 => f.len() > 55 && f[54] == 58,
        _ => false,
    }
}

/// Reads a pcap file of Ethernet frames.
pub fn read(path: &Path) -> Trace {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(data.len() >= 24, "{}: no pcap header", path.display());
    let magic = u32::from_le_bytes(data[..4].try_into().unwrap());
    let (le, nano) = match magic {
        0xa1b2_c3d4 => (true, false),
        0xa1b2_3c4d => (true, true),
        0xd4c3_b2a1 => (false, false),
        0x4d3c_b2a1 => (false, true),
        _ => panic!("{}: not a pcap file (magic {magic:#x})", path.display()),
    };
    let u32_at = |off: usize| {
        let b: [u8; 4] = data[off..off + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20), 1, "{}: not Ethernet", path.display());
    let mut trace = Trace::default();
    let mut off = 24;
    // tcpdump may be stopped in the middle of a record: a partial one is ignored.
    while off + 16 <= data.len() {
        let caplen = u32_at(off + 8) as usize;
        let start = off + 16;
        if start + caplen > data.len() {
            break;
        }
        let frac = u64::from(u32_at(off + 4));
        let ts_ns = u64::from(u32_at(off)) * 1_000_000_000 + if nano { frac } else { frac * 1_000 };
        let frame = &data[start..start + caplen];
        let replayed = frame.get(6..12) == Some(&REPLAY_MAC[..]);
        let dropped = frame.get(6..12) == Some(&DROP_MAC[..]);
        match parse_frame(frame, ts_ns) {
            Some(Frame::Tcp(packet)) if dropped => {
                trace.dropped.push(Replayed { after_copies: trace.packets.len(), packet })
            }
            Some(Frame::Tcp(packet)) if replayed => {
                trace.replayed.push(Replayed { after_copies: trace.packets.len(), packet })
            }
            Some(Frame::Tcp(p)) => trace.packets.push(p),
            Some(Frame::Udp(datagram)) if replayed => trace
                .replayed_datagrams
                .push(ReplayedDatagram { after_copies: trace.datagrams.len(), datagram }),
            Some(Frame::Udp(d)) => trace.datagrams.push(d),
            None => {
                trace.other += 1;
                trace.ipv6_own += usize::from(ipv6_own(&data[start..start + caplen]));
            }
        }
        off = start + caplen;
    }
    trace
}

/// The UDP datagram in an Ethernet frame (a kept query an event carries), `None` when the frame
/// is not IPv4/IPv6 UDP; its time 0.
pub fn datagram_of(frame: &[u8]) -> Option<Datagram> {
    match parse_frame(frame, 0)? {
        Frame::Udp(d) => Some(d),
        Frame::Tcp(_) => None,
    }
}

/// The TCP segment in an Ethernet frame (a kept query over TCP an event carries), `None` when the
/// frame is not IPv4/IPv6 TCP; its time 0.
pub fn segment_of(frame: &[u8]) -> Option<Packet> {
    match parse_frame(frame, 0)? {
        Frame::Tcp(p) => Some(p),
        Frame::Udp(_) => None,
    }
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// A frame's transport part.
enum Frame {
    Tcp(Packet),
    Udp(Datagram),
}

fn parse_frame(frame: &[u8], ts_ns: u64) -> Option<Frame> {
    let mut off = 12;
    let mut ethertype = be16(frame, off)?;
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        off += 4;
        ethertype = be16(frame, off)?;
    }
    let l3 = frame.get(off + 2..)?;
    let (proto, src, dst, l4, l4_len) = match ethertype {
        0x0800 => {
            let ihl = usize::from(l3.first()? & 0x0f) * 4;
            // A later fragment.
            if be16(l3, 6)? & 0x1fff != 0 {
                return None;
            }
            let src = IpAddr::V4(Ipv4Addr::from(be32(l3, 12)?));
            let dst = IpAddr::V4(Ipv4Addr::from(be32(l3, 16)?));
            let total = usize::from(be16(l3, 2)?);
            (*l3.get(9)?, src, dst, l3.get(ihl..)?, total.checked_sub(ihl)?)
        }
        0x86dd => {
            let addr = |o: usize| -> Option<IpAddr> {
                let b: [u8; 16] = l3.get(o..o + 16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            };
            (*l3.get(6)?, addr(8)?, addr(24)?, l3.get(40..)?, usize::from(be16(l3, 4)?))
        }
        _ => return None,
    };
    let (src, dst) = (SocketAddr::new(src, be16(l4, 0)?), SocketAddr::new(dst, be16(l4, 2)?));
    match proto {
        6 => {
            let doff = usize::from(l4.get(12)? >> 4) * 4;
            let len = l4_len.checked_sub(doff)?;
            let payload = l4.get(doff..)?;
            Some(Frame::Tcp(Packet {
                ts_ns,
                src,
                dst,
                seq: be32(l4, 4)?,
                ack: be32(l4, 8)?,
                flags: *l4.get(13)?,
                len: len as u32,
                payload: payload[..payload.len().min(len)].to_vec(),
            }))
        }
        17 => {
            let len = usize::from(be16(l4, 4)?).checked_sub(8)?;
            let payload = l4.get(8..)?;
            Some(Frame::Udp(Datagram {
                ts_ns,
                src,
                dst,
                len: len as u32,
                payload: payload[..payload.len().min(len)].to_vec(),
            }))
        }
        _ => None,
    }
}
