//! A raw HTTP/1.x client on `std::net`, for byte layouts curl does not make: each round of
//! requests goes out in one write (TCP_NODELAY), several pipelined requests in one segment;
//! responses are read with their framing ([`crate::oracles::http_stream`]). The client closes
//! first, unless it resets the connection ([`Conn::abort`]) or waits for the server's reset
//! ([`Conn::expect_reset`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::oracles::http_stream::{self, Parsed, Response};
use crate::topology::netns::Netns;

/// How long to wait for a connection or for the next bytes of a response.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What one connection exchanged.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The client's address.
    pub local: SocketAddr,
    /// Every response, interim ones included, in order.
    pub responses: Vec<Response>,
}

impl Exchange {
    /// The statuses of every response, interim ones included.
    pub fn statuses(&self) -> Vec<u16> {
        self.responses.iter().map(|r| r.status).collect()
    }

    /// The statuses of the final responses, one per request.
    pub fn finals(&self) -> Vec<u16> {
        self.responses.iter().filter(|r| !r.interim()).map(|r| r.status).collect()
    }
}

/// `GET path` with a Host header.
pub fn get(path: &str) -> Vec<u8> {
    request("GET", path, "test")
}

/// `method target` with a Host header; a POST carries a 3-byte form body.
pub fn request(method: &str, target: &str, host: &str) -> Vec<u8> {
    let body = if method == "POST" { "a=1" } else { "" };
    let length = if body.is_empty() { String::new() } else { format!("Content-Length: {}\r\n", body.len()) };
    format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{length}\r\n{body}").into_bytes()
}

/// Requests for every path, concatenated: one write, pipelined.
pub fn pipelined(paths: &[&str]) -> Vec<u8> {
    paths.iter().flat_map(|p| get(p)).collect()
}

/// Like [`exchange_here`], from a thread inside `ns`.
#[track_caller]
pub fn exchange(ns: &Netns, server: SocketAddr, rounds: &[Vec<u8>]) -> Exchange {
    in_ns(ns, || exchange_here(server, rounds))
}

/// Runs `f` on a thread inside `ns` and returns what it returns (its panic, if it panics).
pub fn in_ns<T: Send>(ns: &Netns, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _inside = ns.enter();
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Connects to `server` from the calling thread's namespace; writes each round in one write and
/// reads the responses to its requests before the next round; then closes. Panics on a
/// connection error, a timeout or a response that does not parse.
pub fn exchange_here(server: SocketAddr, rounds: &[Vec<u8>]) -> Exchange {
    let rounds: Vec<Vec<Vec<u8>>> = rounds.iter().map(|r| vec![r.clone()]).collect();
    exchange_writes_here(server, &rounds)
}

/// Like [`exchange_here`], each round made of several writes sent one after another (each its
/// own segment, unless TCP joins them) before the round's responses are read.
pub fn exchange_writes_here(server: SocketAddr, rounds: &[Vec<Vec<u8>>]) -> Exchange {
    let mut conn = Conn::open(server);
    let responses = rounds.iter().flat_map(|round| conn.round_writes(round)).collect();
    Exchange { local: conn.local(), responses }
}

/// One client connection, from the calling thread's namespace, read with its framing.
pub struct Conn {
    stream: TcpStream,
    local: SocketAddr,
    server: SocketAddr,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl Conn {
    /// Connects (TCP_NODELAY); panics when it cannot.
    #[track_caller]
    pub fn open(server: SocketAddr) -> Conn {
        let stream = TcpStream::connect_timeout(&server, TIMEOUT)
            .unwrap_or_else(|e| panic!("connecting to {server}: {e}"));
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream.set_read_timeout(Some(TIMEOUT)).expect("a read timeout");
        let local = stream.local_addr().expect("the local address");
        Conn { stream, local, server, buf: Vec::new(), pos: 0, eof: false }
    }

    /// Its local address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Writes `round` (whole requests) in one write.
    #[track_caller]
    pub fn send(&mut self, round: &[u8]) {
        let (local, server) = (self.local, self.server);
        self.stream.write_all(round).unwrap_or_else(|e| panic!("{local} -> {server}: writing: {e}"));
    }

    /// Writes `round` in one write and reads the responses to its requests (interim ones
    /// included). Panics on an error, a timeout or a response that does not parse.
    #[track_caller]
    pub fn round(&mut self, round: &[u8]) -> Vec<Response> {
        self.round_writes(&[round.to_vec()])
    }

    /// Like [`Conn::round`], the round made of several writes sent one after another.
    #[track_caller]
    pub fn round_writes(&mut self, writes: &[Vec<u8>]) -> Vec<Response> {
        let methods: Vec<String> = writes.iter().flat_map(|w| methods(w)).collect();
        for w in writes {
            self.send(w);
        }
        let mut responses = Vec::new();
        for method in &methods {
            loop {
                let r = self.next_response(method);
                let interim = r.interim();
                responses.push(r);
                if !interim {
                    break;
                }
            }
        }
        responses
    }

    #[track_caller]
    fn next_response(&mut self, method: &str) -> Response {
        let (local, server) = (self.local, self.server);
        loop {
            match http_stream::response(&self.buf[self.pos..], Some(method), self.eof) {
                Parsed::Done(r, n) => {
                    self.pos += n;
                    return r;
                }
                Parsed::Incomplete if self.eof => {
                    panic!("{local} -> {server}: closed inside a response: {:?}", text(&self.buf[self.pos..]))
                }
                Parsed::Incomplete => match self.read() {
                    Ok(()) => {}
                    Err(e) => panic!("{local} -> {server}: reading: {e}; so far {:?}", text(&self.buf)),
                },
                Parsed::Invalid(e) => panic!("{local} -> {server}: {e}: {:?}", text(&self.buf[self.pos..])),
            }
        }
    }

    /// Reads what comes next into the buffer (notes the end of the stream).
    fn read(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 16384];
        match self.stream.read(&mut chunk)? {
            0 => self.eof = true,
            n => self.buf.extend_from_slice(&chunk[..n]),
        }
        Ok(())
    }

    /// Waits for the server to reset the connection; panics if it sends anything, closes
    /// instead or is silent for the read timeout.
    #[track_caller]
    pub fn expect_reset(mut self) {
        let (local, server) = (self.local, self.server);
        let seen = self.buf.len();
        match self.read() {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("{local} -> {server}: expected a reset: {e}"),
            Ok(()) if self.eof => panic!("{local} -> {server}: closed instead of reset"),
            Ok(()) => panic!("{local} -> {server}: expected a reset, got {:?}", text(&self.buf[seen..])),
        }
    }

    /// Resets the connection: SO_LINGER with a zero timeout, then close, sends a RST (with
    /// whatever is pending discarded).
    pub fn abort(self) {
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt on a socket we own, with a linger struct and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
        drop(self.stream);
    }
}

/// The method of each request in `round`.
fn methods(round: &[u8]) -> Vec<String> {
    let mut methods = Vec::new();
    let mut off = 0;
    while off < round.len() {
        match http_stream::request(&round[off..]) {
            Parsed::Done(r, n) => {
                methods.push(r.method);
                off += n;
            }
            other => panic!("a round must hold whole requests: {other:?} in {:?}", text(round)),
        }
    }
    methods
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
