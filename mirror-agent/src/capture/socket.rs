//! An AF_PACKET socket on one interface: every frame whole (up to [`SNAPLEN`], above a GSO
//! packet's 64 KiB), its kernel time stamp, which way it went, and whether its checksum was
//! left to offload (`TP_STATUS_CSUMNOTREADY`); or, opened with [`PacketSocket::sender`], frames
//! written out of the interface (the agent's replays), which the interface's packet sockets see
//! as it transmits them.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What one read takes: a GSO packet of 64 KiB and its headers, with room to spare.
pub const SNAPLEN: u32 = 262_144;

const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;

/// A captured frame.
pub struct Frame {
    /// Its bytes.
    pub data: Vec<u8>,
    /// Its length on the wire (more than `data` when it was cut).
    pub orig_len: u32,
    /// Kernel time stamp, since the epoch.
    pub time: Duration,
    /// Sent by the interface (`PACKET_OUTGOING`), else received.
    pub outgoing: bool,
    /// Its transport checksum was left to offload: it holds the pseudo-header's sum.
    pub csum_not_ready: bool,
}

/// A socket capturing on one interface, non-blocking.
pub struct PacketSocket {
    fd: OwnedFd,
    buf: Vec<u8>,
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T, what: &str) -> io::Result<()> {
    // SAFETY: `v` points to a live value of the size given.
    let rc = unsafe { libc::setsockopt(fd, level, name, (v as *const T).cast(), size_of::<T>() as u32) };
    check(rc, what)
}

/// A non-blocking AF_PACKET socket of protocol `proto` (network order; 0: it receives nothing).
fn packet_socket(proto: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let raw = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto.into())
    };
    check(raw, "opening an AF_PACKET socket (needs CAP_NET_RAW)")?;
    // SAFETY: a descriptor we just created and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Binds packet socket `fd` of protocol `proto` to the interface `ifindex` (`what` names it).
fn bind(fd: &OwnedFd, ifindex: u32, proto: u16, what: &str) -> io::Result<()> {
    // SAFETY: zeroed is a valid sockaddr_ll.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: binding to an address of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    check(rc, &format!("binding to {what}"))
}

impl PacketSocket {
    /// Opens a capture on the interface `name` of the calling thread's network namespace.
    pub fn open(name: &str) -> io::Result<PacketSocket> {
        let cname =
            CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad name"))?;
        // SAFETY: a C string we own.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {name} in this network namespace (run mirrorctl in the agent's)"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        let fd = packet_socket(proto)?;
        let on: libc::c_int = 1;
        setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_AUXDATA, &on, "PACKET_AUXDATA")?;
        setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &on, "SO_TIMESTAMPNS")?;
        // Room for bursts of GSO packets; beyond the limit only as root (FORCE).
        let size: libc::c_int = 64 << 20;
        if setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size, "SO_RCVBUFFORCE")
            .is_err()
        {
            setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &size, "SO_RCVBUF")?;
        }
        bind(&fd, ifindex, proto, name)?;
        Ok(PacketSocket { fd, buf: vec![0; SNAPLEN as usize] })
    }

    /// Opens a socket that writes frames out of the interface `ifindex` of the calling
    /// thread's network namespace, each carrying `mark` (`SO_MARK`, which needs
    /// CAP_NET_ADMIN); it receives nothing.
    pub fn sender(ifindex: u32, mark: u32) -> io::Result<PacketSocket> {
        let fd = packet_socket(0)?;
        setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MARK, &mark, "SO_MARK")?;
        bind(&fd, ifindex, 0, &format!("ifindex {ifindex}"))?;
        Ok(PacketSocket { fd, buf: Vec::new() })
    }

    /// Writes `frame`, from its Ethernet header on, out of the interface.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is a live buffer of the length given.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame, or `None` when none is waiting.
    pub fn recv(&mut self) -> io::Result<Option<Frame>> {
        // SAFETY: zeroed is valid for these plain C structs.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        let mut cmsg = [0u64; 64];
        let mut iov = libc::iovec { iov_base: self.buf.as_mut_ptr().cast(), iov_len: self.buf.len() };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&mut sll as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 64]>();
        // SAFETY: every pointer in `msg` refers to a live buffer of the length given.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
        }
        let orig_len = n as u32;
        let taken = (n as usize).min(self.buf.len());
        let mut frame = Frame {
            data: self.buf[..taken].to_vec(),
            orig_len,
            time: Duration::ZERO,
            outgoing: sll.sll_pkttype == libc::PACKET_OUTGOING,
            csum_not_ready: false,
        };
        // SAFETY: the kernel filled `msg_controllen` bytes of control messages; CMSG_* walk them.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::SOL_PACKET, libc::PACKET_AUXDATA) => {
                        let aux = std::ptr::read_unaligned(data.cast::<libc::tpacket_auxdata>());
                        frame.csum_not_ready = aux.tp_status & TP_STATUS_CSUMNOTREADY != 0;
                    }
                    (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                        let ts = std::ptr::read_unaligned(data.cast::<libc::timespec>());
                        frame.time = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some(frame))
    }

    /// Frames the kernel dropped since the last call (the socket's buffer was full).
    pub fn drops(&self) -> u64 {
        // SAFETY: zeroed is a valid tpacket_stats.
        let mut st: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as u32;
        // SAFETY: reading into a struct of the size given.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            u64::from(st.tp_drops)
        } else {
            0
        }
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
