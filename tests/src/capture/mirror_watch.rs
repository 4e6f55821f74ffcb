//! The mirror as it happens: a packet socket on the sink's capture side that records when each
//! TCP copy arrived and its ports, bound again whenever the link is recreated (a sink deleted
//! and made anew has another index). Tells how soon mirroring resumed after a fault.

use std::mem::{size_of, zeroed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::topology::netns::{join, Netns};

/// A copy seen on the sink: when, and its TCP ports.
#[derive(Debug, Clone, Copy)]
pub struct Copy {
    /// When the socket read it.
    pub at: Instant,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

/// Records the TCP copies arriving on a link until dropped.
pub struct MirrorWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Copy>>>,
    thread: Option<JoinHandle<()>>,
}

impl MirrorWatch {
    /// Watches `link` in `node` (waiting for it to exist, and following it when recreated).
    pub fn start(node: &Netns, link: &str) -> MirrorWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (flag, out, link, ns) = (stop.clone(), seen.clone(), link.to_string(), node.path());
        let thread = thread::spawn(move || {
            join(&ns);
            watch(&link, &flag, &out);
        });
        MirrorWatch { stop, seen, thread: Some(thread) }
    }

    /// Arrival times of the copies of the connection whose endpoint has `port`.
    pub fn copies_of(&self, port: u16) -> Vec<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|c| c.sport == port || c.dport == port).map(|c| c.at).collect()
    }

    /// The first copy of that connection after `since`, waiting up to `timeout` for it.
    pub fn next_copy(&self, port: u16, since: Instant, timeout: Duration) -> Option<Instant> {
        let mut found = None;
        crate::proc::wait_until(timeout, || {
            found = self.copies_of(port).into_iter().find(|t| *t > since);
            found.is_some()
        });
        found
    }
}

impl Drop for MirrorWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).expect("a link name");
    // SAFETY: a valid C string, only read.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// A packet socket bound to `index`, with a 20 ms receive timeout.
fn bind(index: u32) -> Option<i32> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket calls on a descriptor we own; the address is a zeroed sockaddr_ll
    // with the fields the kernel reads set.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(proto));
        assert!(fd >= 0, "a packet socket: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 20_000 };
        let tv_len = size_of::<libc::timeval>() as u32;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            tv_len,
        );
        let mut sll: libc::sockaddr_ll = zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        let len = size_of::<libc::sockaddr_ll>() as u32;
        if libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), len) != 0 {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

fn watch(link: &str, stop: &AtomicBool, seen: &Mutex<Vec<Copy>>) {
    let mut buf = vec![0u8; 65536 + 256];
    let mut bound: Option<(u32, i32)> = None;
    while !stop.load(Ordering::Relaxed) {
        let index = ifindex(link);
        let Some((_, fd)) = bound.filter(|(i, _)| *i == index) else {
            if let Some((_, fd)) = bound.take() {
                // SAFETY: our descriptor, closed once.
                unsafe { libc::close(fd) };
            }
            match (index != 0).then(|| bind(index)).flatten() {
                Some(fd) => bound = Some((index, fd)),
                None => thread::sleep(Duration::from_millis(5)),
            }
            continue;
        };
        // Reads until the timeout, then looks at the link again.
        loop {
            // SAFETY: reading into a buffer we own, within its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                break;
            }
            if let Some((sport, dport)) = tcp_ports(&buf[..n as usize]) {
                seen.lock().unwrap().push(Copy { at: Instant::now(), sport, dport });
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    if let Some((_, fd)) = bound {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
    }
}

/// The ports of an Ethernet frame carrying IPv4 or IPv6 TCP (no extension headers).
fn tcp_ports(f: &[u8]) -> Option<(u16, u16)> {
    let be = |o: usize| Some(u16::from_be_bytes([*f.get(o)?, *f.get(o + 1)?]));
    let l4 = match be(12)? {
        0x0800 if f.get(23) == Some(&6) => 14 + usize::from(f.get(14)? & 0x0f) * 4,
        0x86dd if f.get(20) == Some(&6) => 14 + 40,
        _ => return None,
    };
    Some((be(l4)?, be(l4 + 2)?))
}
