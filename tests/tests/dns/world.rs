//! A test's world (the testbed, the resolver, the Service's NAT) and what a run recorded.

use super::*;

/// How the client reaches the resolver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// At the resolver pod's address.
    PodToPod,
    /// At the DNS Service's ClusterIP, kube-proxy's rules in `Flavour`.
    ClusterIp(Flavour),
    /// At the DNS Service's IPv6 ClusterIP (a single-stack IPv6 Service), kube-proxy's rules
    /// in `Flavour`.
    ClusterIp6(Flavour),
}

impl Path {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::PodToPod => "pod -> resolver pod",
            Path::ClusterIp(Flavour::Iptables) => "pod -> ClusterIP, iptables",
            Path::ClusterIp(Flavour::Nftables) => "pod -> ClusterIP, nftables",
            Path::ClusterIp6(Flavour::Iptables) => "pod -> IPv6 ClusterIP, ip6tables",
            Path::ClusterIp6(Flavour::Nftables) => "pod -> IPv6 ClusterIP, nftables",
        }
    }
}

/// The first port of Go's resolver: above dig's ports (20,000 on), below the kernel's
/// ephemeral ones (32,768 on, getaddrinfo's).
const GO_PORTS: u16 = 30_000;

/// A test's world: the testbed with its rules, the resolver (dnsmasq, or a scripted responder)
/// in the server pod, the Service's NAT if the path has one. Dropped in field order: events,
/// servers, NAT, then the namespaces.
pub(crate) struct Dns {
    /// Go's resolver, the client's program.
    pub(crate) go: Option<PathBuf>,
    pub(crate) events: Events,
    pub(crate) _resolver: Option<Resolver>,
    pub(crate) _responder: Option<Responder>,
    pub(crate) kp: Option<KubeProxy>,
    pub(crate) bed: Testbed,
}

impl Dns {
    /// The testbed with `rules`, the resolver `kind` in the server pod, and the path's NAT;
    /// Go's resolver for the client when `go` is given.
    pub(crate) fn new(rules: &[&str], path: Path, kind: &ResolverKind, go: Option<PathBuf>) -> Dns {
        let mut bed = rules.iter().fold(Testbed::builder(&PODS), |b, r| b.rule(r)).build();
        bed.replay_to_sink();
        let resolver = Resolver::start(kind, bed.pod("server"), bed.dir.path());
        let kp = match path {
            Path::PodToPod => None,
            Path::ClusterIp(flavour) | Path::ClusterIp6(flavour) => {
                let v6 = matches!(path, Path::ClusterIp6(_));
                let backend = bed.pod("server").addr(v6);
                Some(KubeProxy::install_service(bed.node(), flavour, v6, backend, Service::kube_dns()))
            }
        };
        Dns { go, events: bed.events(), _resolver: Some(resolver), _responder: None, kp, bed }
    }

    /// The testbed with `rules` and the scripted responder on port 53 of the server pod,
    /// answering `zones`.
    pub(crate) fn with_responder(rules: &[&str], zones: &[Zone]) -> Dns {
        let mut bed = rules.iter().fold(Testbed::builder(&PODS), |b, r| b.rule(r)).build();
        bed.replay_to_sink();
        let server = bed.pod("server");
        let listen = [server.addr(false), server.addr(true)];
        let responder = Responder::start(&server.ns, &listen, DNS_PORT, zones, bed.dir.path());
        Dns { go: None, events: bed.events(), _resolver: None, _responder: Some(responder), kp: None, bed }
    }

    /// Where the client sends its queries, in the family asked for.
    pub(crate) fn server(&self, v6: bool) -> SocketAddr {
        let ip = match &self.kp {
            Some(kp) => {
                assert_eq!(kp.vip().is_ipv6(), v6, "the Service is of the other family");
                kp.vip()
            }
            None => self.bed.pod("server").addr(v6),
        };
        SocketAddr::new(ip, DNS_PORT)
    }

    /// Lookups of `names` (each with its type) from the client pod to `server`, each from a port
    /// of its own from `ports` on.
    pub(crate) fn lookups(
        &self,
        names: &[(&str, QType)],
        server: SocketAddr,
        transport: Transport,
        ports: &mut u16,
    ) -> Vec<Lookup> {
        let local = self.bed.pod("client").addr(server.is_ipv6());
        names
            .iter()
            .map(|(name, qtype)| {
                *ports += 1;
                Lookup {
                    name: name.to_string(),
                    qtype: *qtype,
                    server,
                    local: SocketAddr::new(local, *ports),
                    transport,
                }
            })
            .collect()
    }

    /// Runs dig's `lookups` (in `clients` processes at once), getaddrinfo of `names` and Go's
    /// resolver of `go_names` with `conf`, one after the other, while capturing DNS at the
    /// client and the mirror.
    pub(crate) fn run(
        &self,
        lookups: &[Lookup],
        clients: usize,
        conf: &ResolvConf,
        names: &[&str],
        go_names: &[&str],
    ) -> Run {
        let (mut looked, mut resolved, mut go) = (Vec::new(), Vec::new(), Vec::new());
        let ns = &self.bed.pod("client").ns;
        let dir = self.bed.dir.path();
        let started = Instant::now();
        let rec = self.bed.record_filtered("client", CAPTURE, || {
            if !lookups.is_empty() {
                looked = dns::dig(ns, lookups, clients, dir);
            }
            if !names.is_empty() {
                resolved = dns::getaddrinfo(ns, conf, names, dir);
            }
            if !go_names.is_empty() {
                let binary = self.go.as_ref().expect("a test with Go's lookups builds its resolver");
                go = go_resolver::lookup(binary, ns, conf, go_names, GO_PORTS, dir);
            }
        });
        let took = started.elapsed();
        let exchanges = dns_oracle::exchanges(&rec.reference, DNS_PORT);
        Run { rec, looked, resolved, go, exchanges, events: self.events.take(), took }
    }
}

/// What a run recorded.
pub(crate) struct Run {
    pub(crate) rec: Recording,
    /// dig's record.
    pub(crate) looked: Vec<Looked>,
    /// getaddrinfo's record.
    pub(crate) resolved: Vec<Resolved>,
    /// Go's resolver's record.
    pub(crate) go: Vec<GoResolved>,
    /// The exchanges of the client's capture, UDP and TCP.
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) events: Vec<TriggerEvent>,
    pub(crate) took: Duration,
}

impl Run {
    /// The flows of the lookups the clients record as failed in a way `covers` says: dig's
    /// lookups (UDP and TCP) by the answer dig got; getaddrinfo's calls by the sockets that
    /// carried their questions (the capture), those with a covered response; Go's lookups by
    /// the sockets it recorded, those with a covered response.
    pub(crate) fn truth(&self, covers: impl Fn(&Exchange) -> bool) -> BTreeSet<Flow> {
        let mut truth: BTreeSet<Flow> = self
            .looked
            .iter()
            .filter(|l| self.answered(l).is_some_and(&covers))
            .map(|l| Flow { transport: l.lookup.transport, client: l.lookup.local, server: l.lookup.server })
            .collect();
        for r in &self.resolved {
            truth.extend(self.of_call(r).filter(|e| covers(e)).map(Exchange::flow));
        }
        for g in self.go.iter().filter(|g| g.result.is_err()) {
            truth.extend(self.of_go(g).filter(|e| covers(e)).map(Exchange::flow));
        }
        truth
    }

    /// The exchanges of a lookup of Go's resolver: those of the sockets it recorded.
    pub(crate) fn of_go<'a>(&'a self, g: &'a GoResolved) -> impl Iterator<Item = &'a Exchange> + 'a {
        self.exchanges.iter().filter(|e| {
            g.sockets.iter().any(|s| (s.transport, s.local, s.server) == (e.transport, e.client, e.server))
        })
    }

    /// The exchange of dig's lookup `l` whose answer dig got, as the capture has it.
    pub(crate) fn answered(&self, l: &Looked) -> Option<&Exchange> {
        let id = l.answer?.id;
        self.exchanges
            .iter()
            .find(|e| (e.transport, e.client, e.id) == (l.lookup.transport, l.lookup.local, id))
    }

    /// The exchanges of a getaddrinfo call: those of its name and of its search candidates,
    /// on sockets neither dig nor Go's resolver used.
    pub(crate) fn of_call<'a>(&'a self, r: &'a Resolved) -> impl Iterator<Item = &'a Exchange> + 'a {
        let name = r.name.trim_end_matches('.').to_ascii_lowercase();
        let go = self.go.iter().flat_map(|g| g.sockets.iter().map(|s| s.local));
        let dig: BTreeSet<SocketAddr> = self.looked.iter().map(|l| l.lookup.local).chain(go).collect();
        self.exchanges.iter().filter(move |e| {
            !dig.contains(&e.client) && (e.qname == name || e.qname.starts_with(&format!("{name}.")))
        })
    }

    /// The table's row of these lookups (each dig lookup, getaddrinfo call and Go lookup one), with the
    /// events scored against `expected`.
    pub(crate) fn row(&self, expected: &DnsExpected, matched: usize) -> Table {
        let mut row = Table::default();
        let mut count = |rcode: Option<Rcode>| {
            row.connections += 1;
            match ANSWERS.iter().position(|a| Some(*a) == rcode) {
                Some(i) => row.counts[i] += 1,
                None => row.counts[OTHER] += 1,
            }
        };
        self.looked.iter().for_each(|l| count(l.rcode()));
        for r in &self.resolved {
            let last = self.of_call(r).last().and_then(|e| e.rcode);
            count(if r.result.is_ok() { Some(Rcode::NOERROR) } else { last });
        }
        for g in &self.go {
            count(g.result.as_ref().map_or_else(|e| e.rcode(), |_| Some(Rcode::NOERROR)));
        }
        row.relevant = expected.triggered.len();
        row.triggered = self.events.len();
        row.correct = matched;
        let m = &self.rec.mirror;
        row.mirrored = m.datagrams.len() + m.packets.len() + m.replayed_datagrams.len() + m.replayed.len();
        row.expected_mirrored = (expected.copies() + expected.replays()) as u64;
        row
    }
}
