//! A flood of new flows: TCP SYNs, each of a flow of its own (source and destination ports
//! vary), written through a raw IPv4 socket from a pod, so that every one crosses the pod's
//! veth and its classifier. Aimed at an address the node drops ([`blackhole`]): the flood
//! fills the flow table and reaches no server.

use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::topology::netns::{join, Netns};

/// Flows per destination port: source ports 1024..=65023.
const SOURCE_PORTS: u32 = 64_000;

/// Makes the node drop what is sent to `dst` (a blackhole route), so a flood ends there.
pub fn blackhole(node: &Netns, dst: Ipv4Addr) {
    node.sh(&format!("ip route replace blackhole {dst}/32"));
}

/// Sends `flows` SYNs from `src` (an address of `ns`) to `dst`, flow `i` from port
/// `1024 + i % 64000` to port `1 + i / 64000`; returns how long it took. Panics on a send error.
pub fn syn_flood(ns: &Netns, src: Ipv4Addr, dst: Ipv4Addr, flows: u32) -> Duration {
    let path = ns.path();
    std::thread::scope(|s| {
        s.spawn(|| {
            join(&path);
            send(src, dst, flows)
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Sends one TCP segment without payload from `src:sport` (an address of `ns`) to `dst:dport`,
/// with the TCP flags `flags` (a SYN/ACK no SYN came before, say), through a raw socket.
pub fn segment(ns: &Netns, (src, sport): (Ipv4Addr, u16), (dst, dport): (Ipv4Addr, u16), flags: u8) {
    let path = ns.path();
    std::thread::scope(|s| {
        s.spawn(|| {
            join(&path);
            send_one(dst, &syn_with(src, dst, sport, dport, 1, flags));
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

fn send_one(dst: Ipv4Addr, pkt: &[u8]) {
    let n = RawSocket::new(dst).send(pkt);
    assert_eq!(n, pkt.len() as isize, "sending a segment: {}", std::io::Error::last_os_error());
}

fn send(src: Ipv4Addr, dst: Ipv4Addr, flows: u32) -> Duration {
    let sock = RawSocket::new(dst);
    let start = Instant::now();
    for i in 0..flows {
        let sport = 1024 + (i % SOURCE_PORTS) as u16;
        let dport = 1 + (i / SOURCE_PORTS) as u16;
        let pkt = syn(src, dst, sport, dport, i);
        let n = sock.send(&pkt);
        assert_eq!(n, pkt.len() as isize, "SYN {i}: {}", std::io::Error::last_os_error());
    }
    start.elapsed()
}

/// A raw IPv4 socket (IPPROTO_RAW: we write the IP header, the kernel fills its checksum and
/// id) sending to one address; closed on drop.
struct RawSocket {
    fd: i32,
    to: libc::sockaddr_in,
}

impl RawSocket {
    fn new(dst: Ipv4Addr) -> Self {
        // SAFETY: a raw socket we own, closed on drop.
        let fd =
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
        assert!(fd >= 0, "a raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a zeroed sockaddr_in with family and address set.
        let mut to: libc::sockaddr_in = unsafe { zeroed() };
        to.sin_family = libc::AF_INET as u16;
        to.sin_addr.s_addr = u32::from(dst).to_be();
        Self { fd, to }
    }

    /// Sends `pkt` (an IPv4 packet); returns what sendto returned.
    fn send(&self, pkt: &[u8]) -> isize {
        // SAFETY: sending a buffer we own to an address we own, with their lengths.
        unsafe {
            libc::sendto(
                self.fd,
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&self.to as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as u32,
            )
        }
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// An IPv4 TCP SYN without options, its TCP checksum computed.
fn syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) -> [u8; 40] {
    syn_with(src, dst, sport, dport, seq, 0x02)
}

/// An IPv4 TCP segment without options nor payload, with `flags`, its TCP checksum computed.
fn syn_with(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32, flags: u8) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut sum: u32 = 0;
    let words = |b: &[u8]| b.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    sum += words(&src.octets()) + words(&dst.octets()) + 6 + 20;
    sum += words(t);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    t[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p
}
