//! A small packet builder for fixtures: Ethernet, VLAN tags, IPv4 (with options) or IPv6 (with
//! extension headers), TCP (with options) or UDP, and a payload. Lengths are filled in; the
//! classifier ignores checksums, so they are left zero.

use std::net::{Ipv4Addr, Ipv6Addr};

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

#[derive(Debug, Clone)]
enum L3 {
    V4 { src: Ipv4Addr, dst: Ipv4Addr, options: Vec<u8>, frag_off: u16 },
    V6 { src: Ipv6Addr, dst: Ipv6Addr, ext: Vec<(u8, Vec<u8>)> },
    Raw(u16),
}

#[derive(Debug, Clone)]
enum L4 {
    Tcp { sport: u16, dport: u16, flags: u8, options: Vec<u8> },
    Udp { sport: u16, dport: u16 },
}

/// Builds one frame.
#[derive(Debug, Clone)]
pub struct PacketBuilder {
    vlans: Vec<(u16, u16)>,
    l3: L3,
    l4: Option<L4>,
    payload: Vec<u8>,
    seq: u32,
}

/// IPv6 extension header kinds.
pub mod ipv6_ext {
    /// Hop-by-hop options.
    pub const HOPOPTS: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Destination options.
    pub const DSTOPTS: u8 = 60;
}

impl PacketBuilder {
    /// An IPv4 packet.
    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self::with(L3::V4 { src, dst, options: Vec::new(), frag_off: 0 })
    }

    /// An IPv6 packet.
    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Self::with(L3::V6 { src, dst, ext: Vec::new() })
    }

    /// A frame of another ethertype with the payload as its body.
    pub fn ethertype(ethertype: u16) -> Self {
        Self::with(L3::Raw(ethertype))
    }

    fn with(l3: L3) -> Self {
        Self { vlans: Vec::new(), l3, l4: None, payload: Vec::new(), seq: 1000 }
    }

    /// Adds a VLAN tag (0x8100 or 0x88a8), outermost first.
    pub fn vlan(mut self, tpid: u16, id: u16) -> Self {
        self.vlans.push((tpid, id));
        self
    }

    /// IPv4 options: `words` 4-byte words of NOPs (IHL grows by `words`).
    pub fn ipv4_options(mut self, words: usize) -> Self {
        if let L3::V4 { options, .. } = &mut self.l3 {
            *options = vec![1u8; words * 4];
        }
        self
    }

    /// IPv4 fragment offset (in 8-byte units) and the more-fragments bit.
    pub fn ipv4_fragment(mut self, offset: u16, more: bool) -> Self {
        if let L3::V4 { frag_off, .. } = &mut self.l3 {
            *frag_off = offset | if more { 0x2000 } else { 0 };
        }
        self
    }

    /// Appends an IPv6 extension header of `kind`; `units` of 8 bytes (fragment: the offset).
    pub fn ipv6_ext(mut self, kind: u8, units: u8) -> Self {
        if let L3::V6 { ext, .. } = &mut self.l3 {
            let body = if kind == ipv6_ext::FRAGMENT {
                // reserved, then offset << 3 (M=1 when offset is 0, as a first fragment is).
                let off = u16::from(units) << 3 | u16::from(units == 0);
                let mut b = vec![0u8];
                b.extend_from_slice(&off.to_be_bytes());
                b.extend_from_slice(&[0, 0, 0, 1]);
                b
            } else {
                let mut b = vec![units.saturating_sub(1)];
                b.resize(usize::from(units.max(1)) * 8 - 1, 0);
                b
            };
            ext.push((kind, body));
        }
        self
    }

    /// A TCP header.
    pub fn tcp(mut self, sport: u16, dport: u16, flags: u8) -> Self {
        self.l4 = Some(L4::Tcp { sport, dport, flags, options: Vec::new() });
        self
    }

    /// TCP options: `words` 4-byte words of NOPs (data offset grows by `words`).
    pub fn tcp_options(mut self, words: usize) -> Self {
        if let Some(L4::Tcp { options, .. }) = &mut self.l4 {
            *options = vec![1u8; words * 4];
        }
        self
    }

    /// A UDP header.
    pub fn udp(mut self, sport: u16, dport: u16) -> Self {
        self.l4 = Some(L4::Udp { sport, dport });
        self
    }

    /// The TCP sequence number (default 1000). The classifier follows each direction's byte
    /// stream: a segment with the sequence number of one already seen is a retransmission.
    pub fn seq(mut self, seq: u32) -> Self {
        self.seq = seq;
        self
    }

    /// The L4 payload.
    pub fn payload(mut self, data: &[u8]) -> Self {
        self.payload = data.to_vec();
        self
    }

    fn l4_bytes(&self) -> (u8, Vec<u8>) {
        let mut out = Vec::new();
        let proto = match &self.l4 {
            Some(L4::Tcp { sport, dport, flags, options }) => {
                out.extend_from_slice(&sport.to_be_bytes());
                out.extend_from_slice(&dport.to_be_bytes());
                out.extend_from_slice(&self.seq.to_be_bytes());
                out.extend_from_slice(&2000u32.to_be_bytes()); // ack
                out.push((((20 + options.len()) / 4) as u8) << 4);
                out.push(*flags);
                out.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, csum, urg
                out.extend_from_slice(options);
                6
            }
            Some(L4::Udp { sport, dport }) => {
                out.extend_from_slice(&sport.to_be_bytes());
                out.extend_from_slice(&dport.to_be_bytes());
                out.extend_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
                out.extend_from_slice(&[0, 0]);
                17
            }
            None => 59, // IPv6 "no next header"; unused for IPv4 tests
        };
        out.extend_from_slice(&self.payload);
        (proto, out)
    }

    /// The frame.
    pub fn build(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // dst MAC
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // src MAC
        let ethertype = match &self.l3 {
            L3::V4 { .. } => 0x0800u16,
            L3::V6 { .. } => 0x86dd,
            L3::Raw(t) => *t,
        };
        for (tpid, id) in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&id.to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        let (proto, l4) = self.l4_bytes();
        match &self.l3 {
            L3::V4 { src, dst, options, frag_off } => {
                let ihl = 20 + options.len();
                f.push(0x40 | (ihl / 4) as u8);
                f.push(0);
                f.extend_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
                f.extend_from_slice(&[0, 1]);
                f.extend_from_slice(&frag_off.to_be_bytes());
                f.push(64);
                f.push(proto);
                f.extend_from_slice(&[0, 0]);
                f.extend_from_slice(&src.octets());
                f.extend_from_slice(&dst.octets());
                f.extend_from_slice(options);
            }
            L3::V6 { src, dst, ext } => {
                let ext_len: usize = ext.iter().map(|(_, b)| b.len() + 1).sum();
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&((ext_len + l4.len()) as u16).to_be_bytes());
                f.push(ext.first().map_or(proto, |(k, _)| *k));
                f.push(64);
                f.extend_from_slice(&src.octets());
                f.extend_from_slice(&dst.octets());
                for (i, (_, body)) in ext.iter().enumerate() {
                    f.push(ext.get(i + 1).map_or(proto, |(k, _)| *k));
                    f.extend_from_slice(body);
                }
            }
            L3::Raw(_) => {}
        }
        f.extend_from_slice(&l4);
        f
    }
}

/// Offsets of the headers of a frame built by [`PacketBuilder`], for corrupting them in tests.
pub fn l3_offset(frame: &[u8]) -> usize {
    let mut off = 12;
    while matches!(u16::from_be_bytes([frame[off], frame[off + 1]]), 0x8100 | 0x88a8) {
        off += 4;
    }
    off + 2
}
