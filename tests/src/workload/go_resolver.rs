//! Go's resolver as a client of the DNS tests: `net.Resolver` with `PreferGo` (the stub
//! resolver of the Go programs in a cluster, which does not go through glibc), in a program of
//! the tests (`tests/dns/resolver`, the standard library only) built once per machine into the
//! tests' cache. It looks up each name's addresses in turn, A and AAAA at once, each question on
//! a socket of its own, reading a resolv.conf of the test's, and records per lookup its result
//! and every socket it opened (what the client itself knows of which exchanges were its own).
//! Its sockets take ports of their own from a first one on: ephemeral ports, which the kernel
//! may hand out again, would now and then make two lookups one flow.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::topology::netns::Netns;
use crate::workload::cache;
use crate::workload::dns::{with_resolv_conf, Rcode, ResolvConf, Transport};
use crate::workload::servers;

/// The program's binary, built into the tests' cache once; `None` without a Go toolchain.
pub fn binary() -> Option<PathBuf> {
    let go = servers::go_toolchain()?;
    Some(cache::build_go(&go, "go-resolver", &Path::new(env!("CARGO_MANIFEST_DIR")).join("dns/resolver")))
}

/// A socket the resolver opened for a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoSocket {
    /// UDP, or TCP (a truncated answer asked again).
    pub transport: Transport,
    /// Its local address and port.
    pub local: SocketAddr,
    /// The server it was connected to.
    pub server: SocketAddr,
}

/// Why a lookup failed, as Go's `*net.DNSError` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoError {
    /// Its text (`no such host`, `server misbehaving`, ...).
    pub text: String,
    /// `IsNotFound`: the name does not exist (NXDOMAIN).
    pub not_found: bool,
    /// `IsTemporary`: SERVFAIL among others.
    pub temporary: bool,
    /// `IsTimeout`: no answer in time.
    pub timeout: bool,
}

impl GoError {
    /// The response code behind it, where Go tells it apart: NXDOMAIN (`no such host`, not
    /// found), SERVFAIL (`server misbehaving`, temporary); `None` for anything else (another
    /// rcode is `server misbehaving` too, but not temporary).
    pub fn rcode(&self) -> Option<Rcode> {
        if self.not_found {
            Some(Rcode::NXDOMAIN)
        } else if self.temporary && !self.timeout && self.text == "server misbehaving" {
            Some(Rcode::SERVFAIL)
        } else {
            None
        }
    }
}

/// One lookup of Go's resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoResolved {
    /// The name asked.
    pub name: String,
    /// Its addresses, or the error.
    pub result: Result<Vec<IpAddr>, GoError>,
    /// The sockets it opened, in order.
    pub sockets: Vec<GoSocket>,
}

/// A line of the program's output.
#[derive(Deserialize)]
struct Line {
    name: String,
    addrs: Vec<IpAddr>,
    #[serde(default)]
    error: String,
    not_found: bool,
    temporary: bool,
    timeout: bool,
    sockets: Vec<LineSocket>,
}

#[derive(Deserialize)]
struct LineSocket {
    transport: String,
    local: SocketAddr,
    server: SocketAddr,
}

/// Looks up each of `names` in turn with the program `binary`, from `ns`, reading `conf` as its
/// resolv.conf, its sockets bound to `first_port` and the ports after it. Files go to `dir`.
#[track_caller]
pub fn lookup(
    binary: &Path,
    ns: &Netns,
    conf: &ResolvConf,
    names: &[&str],
    first_port: u16,
    dir: &Path,
) -> Vec<GoResolved> {
    let mut cmd = with_resolv_conf(ns, conf, dir, binary);
    cmd.arg(format!("-first-port={first_port}")).args(names);
    let out = cmd.output().expect("running Go's resolver");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Go's resolver {names:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved: Vec<GoResolved> =
        stdout.lines().map(|l| parse(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect();
    let asked: Vec<&str> = resolved.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(asked, names, "Go's resolver: {stdout}");
    let mut ports: Vec<u16> =
        resolved.iter().flat_map(|r| r.sockets.iter().map(|s| s.local.port())).collect();
    let opened = ports.len();
    ports.sort_unstable();
    ports.dedup();
    assert!(
        ports.len() == opened && ports.first().is_none_or(|p| *p >= first_port),
        "Go's resolver: its sockets not on ports of their own from {first_port}: {stdout}"
    );
    resolved
}

/// A line of the program's output, read.
fn parse(line: &str) -> Result<GoResolved, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let sockets = l
        .sockets
        .into_iter()
        .map(|s| {
            let transport = match s.transport.as_str() {
                "udp" => Transport::Udp,
                "tcp" => Transport::Tcp,
                other => return Err(format!("a socket of transport {other}")),
            };
            Ok(GoSocket { transport, local: s.local, server: s.server })
        })
        .collect::<Result<_, _>>()?;
    let result = if l.error.is_empty() {
        Ok(l.addrs)
    } else {
        Err(GoError { text: l.error, not_found: l.not_found, temporary: l.temporary, timeout: l.timeout })
    };
    Ok(GoResolved { name: l.name, result, sockets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_s_lines_are_read() {
        let ok = r#"{"name":"good.test.","addrs":["198.18.250.10","2001:2:0:250::10"],"not_found":false,"temporary":false,"timeout":false,"sockets":[{"transport":"udp","local":"198.18.1.2:41000","server":"198.18.2.2:53"},{"transport":"udp","local":"198.18.1.2:41001","server":"198.18.2.2:53"}]}"#;
        let r = parse(ok).unwrap();
        assert_eq!(r.result.as_ref().unwrap().len(), 2);
        assert_eq!(r.sockets[1].local, "198.18.1.2:41001".parse().unwrap());
        let servfail = r#"{"name":"f.fail.test.","addrs":[],"error":"server misbehaving","not_found":false,"temporary":true,"timeout":false,"sockets":[]}"#;
        assert_eq!(parse(servfail).unwrap().result.unwrap_err().rcode(), Some(Rcode::SERVFAIL));
        let nx = r#"{"name":"x.test.","addrs":[],"error":"no such host","not_found":true,"temporary":false,"timeout":false,"sockets":[]}"#;
        assert_eq!(parse(nx).unwrap().result.unwrap_err().rcode(), Some(Rcode::NXDOMAIN));
        let refused = r#"{"name":"r.refused.test.","addrs":[],"error":"server misbehaving","not_found":false,"temporary":false,"timeout":false,"sockets":[]}"#;
        assert_eq!(parse(refused).unwrap().result.unwrap_err().rcode(), None);
        assert!(parse(r#"{"name":"x","addrs":[],"not_found":false,"temporary":false,"timeout":false,"sockets":[{"transport":"sctp","local":"198.18.1.2:1","server":"198.18.2.2:53"}]}"#).is_err());
    }
}
