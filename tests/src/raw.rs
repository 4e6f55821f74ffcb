//! A raw HTTP/1.x client on `std::net`, for byte layouts curl does not make: each round of
//! requests goes out in one write (TCP_NODELAY), several pipelined requests in one segment;
//! responses are read with their framing ([`crate::http_stream`]). The client closes first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::http_stream::{self, Parsed, Response};
use crate::netns::Netns;

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
    format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes()
}

/// Requests for every path, concatenated: one write, pipelined.
pub fn pipelined(paths: &[&str]) -> Vec<u8> {
    paths.iter().flat_map(|p| get(p)).collect()
}

/// Like [`exchange_here`], from a thread inside `ns`.
#[track_caller]
pub fn exchange(ns: &Netns, server: SocketAddr, rounds: &[Vec<u8>]) -> Exchange {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _inside = ns.enter();
            exchange_here(server, rounds)
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
    let mut conn = TcpStream::connect_timeout(&server, TIMEOUT)
        .unwrap_or_else(|e| panic!("connecting to {server}: {e}"));
    conn.set_nodelay(true).expect("TCP_NODELAY");
    conn.set_read_timeout(Some(TIMEOUT)).expect("a read timeout");
    let local = conn.local_addr().expect("the local address");
    let mut buf = Vec::new();
    let (mut pos, mut eof) = (0, false);
    let mut responses = Vec::new();
    for round in rounds {
        let methods: Vec<String> = round.iter().flat_map(|w| methods(w)).collect();
        for write in round {
            conn.write_all(write).unwrap_or_else(|e| panic!("{local} -> {server}: writing: {e}"));
        }
        for method in &methods {
            loop {
                match http_stream::response(&buf[pos..], Some(method), eof) {
                    Parsed::Done(r, n) => {
                        pos += n;
                        let interim = r.interim();
                        responses.push(r);
                        if !interim {
                            break;
                        }
                    }
                    Parsed::Incomplete if eof => {
                        panic!("{local} -> {server}: closed inside a response: {:?}", text(&buf[pos..]))
                    }
                    Parsed::Incomplete => {
                        let mut chunk = [0u8; 16384];
                        match conn.read(&mut chunk) {
                            Ok(0) => eof = true,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            Err(e) => panic!("{local} -> {server}: reading: {e}; so far {:?}", text(&buf)),
                        }
                    }
                    Parsed::Invalid(e) => panic!("{local} -> {server}: {e}: {:?}", text(&buf[pos..])),
                }
            }
        }
    }
    Exchange { local, responses }
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
