//! DNS in the pods: real resolvers (dnsmasq, and CoreDNS: [`ResolverKind`]) with a zone that
//! answers, names that do not exist and a forward to an upstream that fails; a scripted responder (an upstream that
//! answers SERVFAIL or REFUSED, or a server that delays chosen names); and real clients: dig,
//! many lookups per process, and glibc's getaddrinfo (python's `socket.getaddrinfo`) reading a
//! resolv.conf of the test's.
//!
//! The resolver's names ([`Resolver`]):
//!
//! | name | answer |
//! |---|---|
//! | [`GOOD_ZONE`] and the names under it | NOERROR: A [`GOOD_A`], AAAA [`GOOD_AAAA`] |
//! | under [`FAIL_ZONE`] | SERVFAIL, the upstream's |
//! | under [`REFUSED_ZONE`] | REFUSED, the upstream's |
//! | any other under `test`, `cluster.local` or `example` | NXDOMAIN |
//! | [`CLUSTER_GOOD`] | NOERROR, as [`GOOD_ZONE`] |
//!
//! Neither resolver keeps a cache: every query is answered from its configuration or forwarded.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use mirror_bpf::testing::in_ci;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{Netns, Pod};

/// The names that resolve.
pub const GOOD_ZONE: &str = "good.test";
/// The names whose lookups the upstream answers SERVFAIL.
pub const FAIL_ZONE: &str = "fail.test";
/// The names whose lookups the upstream answers REFUSED.
pub const REFUSED_ZONE: &str = "refused.test";
/// A name of the cluster's domain that resolves (the search path finds it as `kube-dns` from
/// the namespace `kube-system`).
pub const CLUSTER_GOOD: &str = "kube-dns.kube-system.svc.cluster.local";
/// The address [`GOOD_ZONE`]'s names have.
pub const GOOD_A: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 10);
/// Their IPv6 address.
pub const GOOD_AAAA: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 250, 0, 0, 0, 0x10);

/// Where the resolver's upstream listens, in the resolver's namespace.
const UPSTREAM_PORT: u16 = 5353;
/// How long a process may take to start answering.
const STARTUP: Duration = Duration::from_secs(10);

/// A DNS response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rcode(pub u8);

impl Rcode {
    /// No error.
    pub const NOERROR: Rcode = Rcode(0);
    /// The server failed.
    pub const SERVFAIL: Rcode = Rcode(2);
    /// The name does not exist.
    pub const NXDOMAIN: Rcode = Rcode(3);
    /// The server refused.
    pub const REFUSED: Rcode = Rcode(5);

    const NAMES: [&'static str; 11] = [
        "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET", "NXRRSET",
        "NOTAUTH", "NOTZONE",
    ];

    /// From its name as dig prints it (`NXDOMAIN`).
    pub fn from_name(name: &str) -> Option<Rcode> {
        Self::NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)).map(|i| Rcode(i as u8))
    }
}

impl fmt::Display for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Self::NAMES.get(usize::from(self.0)) {
            Some(n) => f.write_str(n),
            None => write!(f, "RCODE{}", self.0),
        }
    }
}

/// A question's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QType(pub u16);

impl QType {
    /// An IPv4 address.
    pub const A: QType = QType(1);
    /// An IPv6 address.
    pub const AAAA: QType = QType(28);

    /// Its name (`A`, `AAAA`, or `TYPE<n>`).
    pub fn name(self) -> String {
        match self {
            QType::A => "A".into(),
            QType::AAAA => "AAAA".into(),
            QType(n) => format!("TYPE{n}"),
        }
    }

    /// From its name as dig prints it.
    pub fn from_name(name: &str) -> Option<QType> {
        match name {
            "A" => Some(QType::A),
            "AAAA" => Some(QType::AAAA),
            _ => name.strip_prefix("TYPE")?.parse().ok().map(QType),
        }
    }
}

impl fmt::Display for QType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// What the scripted responder answers for a name and the names under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// The name (lower case, no final dot).
    pub suffix: String,
    /// The response code.
    pub rcode: Rcode,
    /// How long it waits before answering; `None`: it never answers.
    pub delay: Option<Duration>,
    /// With NOERROR: A records.
    pub a: Vec<Ipv4Addr>,
    /// With NOERROR: AAAA records.
    pub aaaa: Vec<Ipv6Addr>,
}

impl Zone {
    /// Names answered at once with `rcode` (and, with NOERROR, [`GOOD_A`] and [`GOOD_AAAA`]).
    pub fn new(suffix: &str, rcode: Rcode) -> Zone {
        let noerror = rcode == Rcode::NOERROR;
        Zone {
            suffix: suffix.to_ascii_lowercase(),
            rcode,
            delay: Some(Duration::ZERO),
            a: if noerror { vec![GOOD_A] } else { Vec::new() },
            aaaa: if noerror { vec![GOOD_AAAA] } else { Vec::new() },
        }
    }

    /// The same, answered `delay` late.
    pub fn delayed(mut self, delay: Duration) -> Zone {
        self.delay = Some(delay);
        self
    }

    /// The same, never answered.
    pub fn silent(mut self) -> Zone {
        self.delay = None;
        self
    }

    fn json(&self) -> String {
        let list = |v: Vec<String>| v.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(",");
        format!(
            r#"{{"suffix":"{}","rcode":{},"delay_ms":{},"a":[{}],"aaaa":[{}]}}"#,
            self.suffix,
            self.rcode.0,
            self.delay.map_or("null".to_string(), |d| d.as_millis().to_string()),
            list(self.a.iter().map(ToString::to_string).collect()),
            list(self.aaaa.iter().map(ToString::to_string).collect()),
        )
    }
}

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

/// The transport of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    /// One datagram each way.
    Udp,
    /// A TCP connection (dig's `+tcp`).
    Tcp,
}

impl Transport {
    /// Its IP protocol number, as flow keys carry it.
    pub fn proto(self) -> u8 {
        match self {
            Transport::Udp => 17,
            Transport::Tcp => 6,
        }
    }
}

/// One lookup dig makes: a question to a server, from a given local address and port (so that
/// each lookup is a 5-tuple of its own, known beforehand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The name asked (no final dot).
    pub name: String,
    /// Its type.
    pub qtype: QType,
    /// The server (a resolver or a ClusterIP) and its port.
    pub server: SocketAddr,
    /// The client's address and port.
    pub local: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
}

/// The answer dig got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigAnswer {
    /// The message's id.
    pub id: u16,
    /// Its response code.
    pub rcode: Rcode,
}

/// A lookup and what dig made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Looked {
    /// The lookup.
    pub lookup: Lookup,
    /// Its answer; `None` when none came (dig's one try timed out).
    pub answer: Option<DigAnswer>,
}

impl Looked {
    /// The answer's response code, `None` without an answer.
    pub fn rcode(&self) -> Option<Rcode> {
        self.answer.map(|a| a.rcode)
    }
}

/// Runs `lookups` from `ns`, in `clients` dig processes at once (each a share of them, one
/// after another, one try of at most 2 s each); files go to `dir`. Returns every lookup with
/// its answer, in the order given.
#[track_caller]
pub fn dig(ns: &Netns, lookups: &[Lookup], clients: usize, dir: &Path) -> Vec<Looked> {
    let mut sockets: Vec<(u16, bool)> =
        lookups.iter().map(|l| (l.local.port(), l.server.is_ipv6())).collect();
    sockets.sort_unstable();
    sockets.dedup();
    assert_eq!(
        sockets.len(),
        lookups.len(),
        "two lookups share a local port: each must be a 5-tuple of its own"
    );
    // dig applies the transport and the family of its command line to every line of a batch.
    let mut batches: Vec<Vec<&Lookup>> = Vec::new();
    for group in
        [(Transport::Udp, false), (Transport::Udp, true), (Transport::Tcp, false), (Transport::Tcp, true)]
    {
        let of: Vec<&Lookup> =
            lookups.iter().filter(|l| (l.transport, l.server.is_ipv6()) == group).collect();
        if of.is_empty() {
            continue;
        }
        let per = of.len().div_ceil(clients.max(1));
        batches.extend(of.chunks(per).map(<[&Lookup]>::to_vec));
    }
    let answers: Vec<Vec<(u16, DigMessage)>> = thread::scope(|s| {
        let runs: Vec<_> =
            batches.iter().enumerate().map(|(i, b)| s.spawn(move || dig_batch(ns, b, i, dir))).collect();
        runs.into_iter().map(|r| r.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let answers: std::collections::HashMap<(u16, bool), DigMessage> = batches
        .iter()
        .zip(answers)
        .flat_map(|(b, a)| {
            let v6 = b[0].server.is_ipv6();
            a.into_iter().map(move |(port, m)| ((port, v6), m))
        })
        .collect();
    lookups
        .iter()
        .map(|l| {
            let m = answers.get(&(l.local.port(), l.server.is_ipv6()));
            let answer = m.filter(|m| m.question == (l.name.to_ascii_lowercase(), l.qtype)).map(|m| m.answer);
            Looked { lookup: l.clone(), answer }
        })
        .collect()
}

/// A response as dig's YAML output gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DigMessage {
    question: (String, QType),
    answer: DigAnswer,
}

/// One dig process for `lookups` (of one transport and family); the responses it printed,
/// by the local port they came to.
fn dig_batch(ns: &Netns, lookups: &[&Lookup], n: usize, dir: &Path) -> Vec<(u16, DigMessage)> {
    let first = lookups[0];
    let batch: String = lookups
        .iter()
        .map(|l| {
            let local = match l.local {
                SocketAddr::V4(a) => format!("{}#{}", a.ip(), a.port()),
                SocketAddr::V6(a) => format!("{}#{}", a.ip(), a.port()),
            };
            format!("@{} -p {} -b {local} {} {}\n", l.server.ip(), l.server.port(), l.name, l.qtype)
        })
        .collect();
    let file = dir.join(format!("dig-{}-{n}.batch", std::process::id()));
    std::fs::write(&file, batch).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    let mut cmd: Command = ns.command("dig");
    cmd.args([if first.server.is_ipv6() { "-6" } else { "-4" }, "+tries=1", "+time=2", "+yaml"]);
    if first.transport == Transport::Tcp {
        cmd.arg("+tcp");
    }
    cmd.arg("-f").arg(&file);
    let out = cmd.output().expect("running dig");
    let stdout = String::from_utf8_lossy(&out.stdout);
    parse_dig_yaml(&stdout)
}

/// The responses of dig's `+yaml` output (`- type: MESSAGE` items; errors are other items),
/// with the local port each came to.
fn parse_dig_yaml(out: &str) -> Vec<(u16, DigMessage)> {
    let mut found = Vec::new();
    for item in out.split("\n- type: ").map(|i| i.trim_start_matches("- type: ")) {
        if !item.starts_with("MESSAGE") {
            continue;
        }
        let field = |key: &str| {
            item.lines().find_map(|l| {
                l.trim().strip_prefix(key)?.strip_prefix(": ").map(|v| v.trim().trim_matches('"'))
            })
        };
        let question = item
            .lines()
            .skip_while(|l| l.trim() != "QUESTION_SECTION:")
            .nth(1)
            .map(|l| l.trim().trim_start_matches("- ").trim_matches('\''))
            .and_then(|q| {
                let mut parts = q.split_whitespace();
                let name = parts.next()?.trim_end_matches('.').to_ascii_lowercase();
                let qtype = QType::from_name(parts.nth(1)?)?;
                Some((name, qtype))
            });
        let parsed = (|| {
            let port = field("query_port")?.parse().ok()?;
            let id = field("id")?.parse().ok()?;
            let rcode = Rcode::from_name(field("status")?)?;
            Some((port, DigMessage { question: question?, answer: DigAnswer { id, rcode } }))
        })();
        found.push(parsed.unwrap_or_else(|| panic!("dig printed a message that does not parse:\n{item}")));
    }
    found
}

/// A resolv.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvConf {
    /// Its `nameserver` lines.
    pub nameservers: Vec<IpAddr>,
    /// Its `search` list (none: no `search` line).
    pub search: Vec<String>,
    /// `options ndots:`.
    pub ndots: u8,
}

impl ResolvConf {
    /// One nameserver, no search list, `ndots:1`.
    pub fn plain(nameserver: IpAddr) -> ResolvConf {
        ResolvConf { nameservers: vec![nameserver], search: Vec::new(), ndots: 1 }
    }

    /// What the kubelet writes for a pod of namespace `namespace` (with the cluster's DNS
    /// Service at `nameserver`): the search list `<namespace>.svc.cluster.local
    /// svc.cluster.local cluster.local`, `ndots:5`.
    pub fn kubelet(namespace: &str, nameserver: IpAddr) -> ResolvConf {
        let search =
            [format!("{namespace}.svc.cluster.local"), "svc.cluster.local".into(), "cluster.local".into()];
        ResolvConf { nameservers: vec![nameserver], search: search.into(), ndots: 5 }
    }

    /// The names glibc asks, in order, for `name`: as given first when it has at least `ndots`
    /// dots, then with each domain of the search list, then as given last if not yet asked; an
    /// absolute name (a final dot) alone. Lower case, without the final dot. A lookup stops at
    /// the first found.
    pub fn candidates(&self, name: &str) -> Vec<String> {
        let bare = name.trim_end_matches('.').to_ascii_lowercase();
        if name.ends_with('.') {
            return vec![bare];
        }
        let first = bare.matches('.').count() >= usize::from(self.ndots);
        let mut names: Vec<String> =
            self.search.iter().map(|d| format!("{bare}.{}", d.to_ascii_lowercase())).collect();
        if first {
            names.insert(0, bare);
        } else {
            names.push(bare);
        }
        names
    }

    /// Its text. One try of at most 2 s per query, as the tests' dig makes.
    pub fn text(&self) -> String {
        let mut s: String = self.nameservers.iter().map(|n| format!("nameserver {n}\n")).collect();
        if !self.search.is_empty() {
            s += &format!("search {}\n", self.search.join(" "));
        }
        s + &format!("options ndots:{} timeout:2 attempts:1\n", self.ndots)
    }
}

/// What one getaddrinfo call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name asked.
    pub name: String,
    /// Its addresses, or getaddrinfo's error (`EAI_NONAME` is -2, `EAI_AGAIN` -3).
    pub result: Result<Vec<IpAddr>, i32>,
}

/// glibc's getaddrinfo (python's `socket.getaddrinfo`, any family: A and AAAA asked at once, on
/// one socket) of each of `names` in turn, from `ns`, reading `conf` as its resolv.conf (bound
/// over /etc/resolv.conf in a mount namespace of the process's own). Files go to `dir`.
#[track_caller]
pub fn getaddrinfo(ns: &Netns, conf: &ResolvConf, names: &[&str], dir: &Path) -> Vec<Resolved> {
    let script = dir.join("getaddrinfo.py");
    std::fs::write(&script, GETADDRINFO).unwrap_or_else(|e| panic!("writing {}: {e}", script.display()));
    let mut cmd = with_resolv_conf(ns, conf, dir, Path::new("python3"));
    cmd.arg(&script).args(names);
    let out = cmd.output().expect("running getaddrinfo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "getaddrinfo {names:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let resolved: Vec<Resolved> = stdout
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            let (name, kind) = (f.next().unwrap_or_default().to_string(), f.next());
            let result = match kind {
                Some("ok") => {
                    Ok(f.map(|a| a.parse().unwrap_or_else(|_| panic!("getaddrinfo printed {l:?}"))).collect())
                }
                Some("error") => {
                    Err(f.next().and_then(|e| e.parse().ok()).unwrap_or_else(|| panic!("{l:?}")))
                }
                _ => panic!("getaddrinfo printed {l:?}"),
            };
            Resolved { name, result }
        })
        .collect();
    assert_eq!(resolved.len(), names.len(), "getaddrinfo {names:?}: {stdout}");
    resolved
}

/// A command that runs `program` in `ns` reading `conf` (written to `dir`) as its
/// /etc/resolv.conf: bound over it in a mount namespace of the process's own. Its arguments
/// follow.
pub fn with_resolv_conf(ns: &Netns, conf: &ResolvConf, dir: &Path, program: &Path) -> Command {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let resolv = dir.join(format!("resolv-{}-{n}.conf", ns.name()));
    std::fs::write(&resolv, conf.text()).unwrap_or_else(|e| panic!("writing {}: {e}", resolv.display()));
    let mut cmd = ns.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"]);
    cmd.arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#);
    cmd.arg(&resolv).arg(program);
    cmd
}

/// `getaddrinfo.py NAME...`: prints `NAME ok ADDR...` or `NAME error EAI` for each.
const GETADDRINFO: &str = r#"import socket, sys
for name in sys.argv[1:]:
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
        print(name, "ok", *sorted({a[4][0] for a in found}), flush=True)
    except socket.gaierror as e:
        print(name, "error", e.errno, flush=True)
"#;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dig_yaml_is_read() {
        let out = r#"- type: MESSAGE
  message:
    type: RECURSIVE_RESPONSE
    socket_protocol: UDP
    response_address: "198.18.2.2"
    response_port: 53
    query_address: "198.18.1.2"
    query_port: 40002
    response_message_data:
      opcode: QUERY
      status: NXDOMAIN
      id: 22007
      flags: qr rd ra
      QUESTION: 1
      QUESTION_SECTION:
        - 'Missing.test. IN AAAA'
- type: DIG_ERROR
  message: |
    no servers could be reached
"#;
        let m = parse_dig_yaml(out);
        assert_eq!(
            m,
            [(
                40002,
                DigMessage {
                    question: ("missing.test".into(), QType::AAAA),
                    answer: DigAnswer { id: 22007, rcode: Rcode::NXDOMAIN }
                }
            )]
        );
    }

    #[test]
    fn the_resolver_s_answers() {
        let answers = ["www.Good.test.", "a.fail.test", "b.refused.test", "missing.test", "x.cluster.local"]
            .map(Resolver::rcode_of);
        assert_eq!(
            answers,
            [Rcode::NOERROR, Rcode::SERVFAIL, Rcode::REFUSED, Rcode::NXDOMAIN, Rcode::NXDOMAIN]
        );
        assert_eq!(Resolver::rcode_of(CLUSTER_GOOD), Rcode::NOERROR);
    }

    #[test]
    fn names_of_codes_and_types() {
        assert_eq!(Rcode::from_name("SERVFAIL"), Some(Rcode::SERVFAIL));
        assert_eq!(
            (Rcode::NXDOMAIN.to_string(), Rcode(12).to_string()),
            ("NXDOMAIN".into(), "RCODE12".into())
        );
        assert_eq!(
            (QType::from_name("AAAA"), QType::from_name("TYPE65")),
            (Some(QType::AAAA), Some(QType(65)))
        );
    }

    #[test]
    fn kubelet_resolv_conf() {
        let conf = ResolvConf::kubelet("shop", "198.19.0.53".parse().unwrap());
        assert_eq!(conf.candidates("api.partner.example")[0], "api.partner.example.shop.svc.cluster.local");
        assert_eq!(conf.candidates("api.partner.example").last().unwrap(), "api.partner.example");
        assert_eq!(conf.candidates("a.b.c.d.e.f").len(), 4);
        assert_eq!(conf.candidates("a.b.c.d.e.f")[0], "a.b.c.d.e.f");
        assert_eq!(conf.candidates("Abs.Example."), ["abs.example"]);
        assert_eq!(
            conf.text(),
            "nameserver 198.19.0.53\nsearch shop.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5 timeout:2 attempts:1\n"
        );
    }
}
