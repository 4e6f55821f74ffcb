//! The resolvers in the server pod: dnsmasq and CoreDNS ([`ResolverKind`]), and the scripted
//! responder (an upstream that fails, or a server that delays chosen names).

use super::*;

/// The scripted responder: a DNS server over UDP and TCP that answers each question by the
/// longest [`Zone`] its name falls in (a name in none: REFUSED), each after the zone's delay
/// (the others meanwhile answered) or never, with the question and, for NOERROR, the zone's
/// records. Stopped on drop.
pub struct Responder {
    _proc: Proc,
}

impl Responder {
    /// Starts it in `ns` on `port` of each of `listen`, its script written in `dir`.
    pub fn start(ns: &Netns, listen: &[IpAddr], port: u16, zones: &[Zone], dir: &Path) -> Responder {
        let script = dir.join("dns_responder.py");
        std::fs::write(&script, RESPONDER).unwrap_or_else(|e| panic!("writing {}: {e}", script.display()));
        let listen: Vec<String> = listen.iter().map(|a| format!("\"{a}\"")).collect();
        let zones: Vec<String> = zones.iter().map(Zone::json).collect();
        let conf =
            format!(r#"{{"listen":[{}],"port":{port},"zones":[{}]}}"#, listen.join(","), zones.join(","));
        let mut cmd = ns.command("python3");
        cmd.arg(&script).arg(conf);
        let mut proc = Proc::spawn(&format!("DNS responder in {}", ns.name()), &mut cmd);
        proc.wait_for_output("listening", STARTUP);
        Responder { _proc: proc }
    }
}

/// A resolver program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolverKind {
    /// dnsmasq, from the distribution.
    Dnsmasq,
    /// CoreDNS, built from its Go module ([`crate::workload::coredns`]): its binary.
    CoreDns(PathBuf),
}

impl ResolverKind {
    /// Its name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            ResolverKind::Dnsmasq => "dnsmasq",
            ResolverKind::CoreDns(_) => "CoreDNS",
        }
    }

    /// The resolvers this machine has: dnsmasq, and CoreDNS (built into the tests' cache once)
    /// where a Go toolchain is; without one, CoreDNS fails in CI and is left out elsewhere.
    pub fn available() -> Vec<ResolverKind> {
        let mut kinds = vec![ResolverKind::Dnsmasq];
        match crate::workload::coredns::binary() {
            Some(b) => kinds.push(ResolverKind::CoreDns(b)),
            None => {
                let needs = "a Go toolchain (go in PATH or /usr/local/go/bin/go)";
                assert!(!in_ci(), "CoreDNS is built from its Go module: it needs {needs}, and CI=true forbids leaving it out");
                eprintln!("NOT RUN: CoreDNS ({needs} not found)");
            }
        }
        kinds
    }
}

/// A resolver ([`ResolverKind`]) in a pod, on port 53 (UDP and TCP) of its addresses (both
/// families), answering as this module's table says, with an upstream [`Responder`] on the
/// pod's loopback for the zones that fail. Stopped on drop.
pub struct Resolver {
    _server: Proc,
    _upstream: Responder,
    /// Its IPv4 address.
    pub v4: Ipv4Addr,
    /// Its IPv6 address.
    pub v6: Ipv6Addr,
}

impl Resolver {
    /// Starts the upstream, then the resolver `kind`, in `pod`; returns once it listens on
    /// both addresses over UDP and TCP. Files go to `dir`.
    pub fn start(kind: &ResolverKind, pod: &Pod, dir: &Path) -> Resolver {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let zones = [Zone::new(FAIL_ZONE, Rcode::SERVFAIL), Zone::new(REFUSED_ZONE, Rcode::REFUSED)];
        let upstream = Responder::start(&pod.ns, &[loopback], UPSTREAM_PORT, &zones, dir);
        let mut cmd = match kind {
            ResolverKind::Dnsmasq => dnsmasq(pod),
            ResolverKind::CoreDns(binary) => {
                crate::workload::coredns::command(binary, pod, SocketAddr::new(loopback, UPSTREAM_PORT), dir)
            }
        };
        let what = format!("{} in {}", kind.name(), pod.ns.name());
        let mut server = Proc::spawn(&what, &mut cmd);
        let mut exited = false;
        let listening = wait_until(STARTUP, || {
            exited = !server.running();
            let bound = |ss: &str| {
                let out = pod.ns.sh(&format!("ss -Hln{ss} sport = :53"));
                out.contains(&pod.v4.to_string()) && out.contains(&pod.v6.to_string())
            };
            exited || (bound("u") && bound("t"))
        });
        assert!(listening && !exited, "{what} is not listening: {}", server.output());
        Resolver { _server: server, _upstream: upstream, v4: pod.v4, v6: pod.v6 }
    }

    /// Its address in the family asked for.
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.v6)
        } else {
            IpAddr::V4(self.v4)
        }
    }

    /// The response code it answers for `name` (any case, with or without the final dot) to a
    /// question of type A or AAAA: the table at the top of this module.
    pub fn rcode_of(name: &str) -> Rcode {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let under = |zone: &str| name == zone || name.ends_with(&format!(".{zone}"));
        if under(GOOD_ZONE) || name == CLUSTER_GOOD {
            Rcode::NOERROR
        } else if under(FAIL_ZONE) {
            Rcode::SERVFAIL
        } else if under(REFUSED_ZONE) {
            Rcode::REFUSED
        } else {
            Rcode::NXDOMAIN
        }
    }
}

/// dnsmasq in `pod` with the names of this module's table, no cache, its failing zones sent
/// to the upstream.
fn dnsmasq(pod: &Pod) -> Command {
    let mut cmd = pod.ns.command("dnsmasq");
    cmd.args(["--no-daemon", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--pid-file="]);
    cmd.args(["--port=53", "--bind-interfaces", "--cache-size=0", "--log-facility=-"]);
    cmd.arg(format!("--listen-address={}", pod.v4)).arg(format!("--listen-address={}", pod.v6));
    for name in [GOOD_ZONE, CLUSTER_GOOD] {
        cmd.arg(format!("--address=/{name}/{GOOD_A}")).arg(format!("--address=/{name}/{GOOD_AAAA}"));
    }
    for zone in [FAIL_ZONE, REFUSED_ZONE] {
        cmd.arg(format!("--server=/{zone}/127.0.0.1#{UPSTREAM_PORT}"));
    }
    cmd.args(["--local=/test/", "--local=/cluster.local/", "--local=/example/"]);
    cmd
}

/// The responder's script: its configuration as JSON in argv[1]: `listen` (addresses), `port`,
/// `zones` (`suffix`, `rcode`, `delay_ms`, `a`, `aaaa`).
const RESPONDER: &str = r#"import asyncio, ipaddress, json, struct, sys

conf = json.loads(sys.argv[1])
zones = sorted(conf["zones"], key=lambda z: -len(z["suffix"]))


def question(msg):
    """(name lower case, type, offset past the question), or None."""
    if len(msg) < 12 or struct.unpack("!H", msg[4:6])[0] != 1:
        return None
    labels, at = [], 12
    while at < len(msg) and msg[at]:
        n = msg[at]
        if n & 0xC0:
            return None
        labels.append(msg[at + 1 : at + 1 + n].decode("ascii", "replace").lower())
        at += 1 + n
    at += 1
    if at + 4 > len(msg):
        return None
    return ".".join(labels), struct.unpack("!H", msg[at : at + 2])[0], at + 4


def answer(msg):
    """(the response, its delay in seconds), or None."""
    q = question(msg)
    if q is None:
        return None
    name, qtype, end = q
    zone = next((z for z in zones if name == z["suffix"] or name.endswith("." + z["suffix"])), None)
    zone = zone or {"rcode": 5, "delay_ms": 0}
    if zone["delay_ms"] is None:
        return None
    records = []
    if zone["rcode"] == 0:
        for addr in zone.get({1: "a", 28: "aaaa"}.get(qtype, ""), []):
            raw = ipaddress.ip_address(addr).packed
            records.append(struct.pack("!HHHIH", 0xC00C, qtype, 1, 30, len(raw)) + raw)
    flags = 0x8080 | (struct.unpack("!H", msg[2:4])[0] & 0x7900) | zone["rcode"]
    head = struct.pack("!HHHHHH", struct.unpack("!H", msg[:2])[0], flags, 1, len(records), 0, 0)
    return head + msg[12:end] + b"".join(records), zone["delay_ms"] / 1000


class Udp(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        a = answer(data)
        if a:
            asyncio.get_running_loop().call_later(a[1], self.transport.sendto, a[0], addr)


async def tcp(reader, writer):
    try:
        while True:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
            a = answer(await reader.readexactly(n))
            if a:
                await asyncio.sleep(a[1])
                writer.write(struct.pack("!H", len(a[0])) + a[0])
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    loop = asyncio.get_running_loop()
    for host in conf["listen"]:
        await loop.create_datagram_endpoint(Udp, local_addr=(host, conf["port"]))
        await asyncio.start_server(tcp, host, conf["port"])
    print("listening", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"#;
