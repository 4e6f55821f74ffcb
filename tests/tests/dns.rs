//! DNS failures as triggers, against real resolvers and real clients: dnsmasq and CoreDNS (built
//! from its Go module), each in turn in the server pod (a zone that answers, names that do not
//! exist, a forward to an upstream that answers SERVFAIL or REFUSED; see
//! `mirror_e2e::workload::dns` and `mirror_e2e::workload::coredns`), asked by dig (one lookup
//! per 5-tuple, its status recorded per lookup; over UDP, and over TCP with `+tcp`, a connection
//! per lookup), by glibc's getaddrinfo (A and AAAA at once on one socket) and by Go's resolver
//! (A and AAAA at once, a socket each, the sockets recorded by the client), pod to resolver and
//! through a kube-dns-like ClusterIP (UDP and TCP port 53, DNAT by iptables or nftables rules in
//! the manner of kube-proxy; IPv4, and IPv6).
//!
//! The truth is the clients' own record: dig's status of each lookup, getaddrinfo's result, and
//! the client's capture for the sockets getaddrinfo chose; Go's result and the sockets it
//! recorded. A rule `dns=RCODES` marks a client's
//! flow (its UDP socket, or its TCP connection) at the first response of it the rule covers;
//! each such flow has exactly one trigger event naming that exchange's question (id, name, type)
//! and response code, and the mirror carries, exactly once each, every datagram or segment of
//! the flow from that response on, and each query of the flow sent before the mark and answered
//! at or after it, replayed as the client sent it ahead of its answer: the query of the
//! triggering response (ahead of every copy of the flow carrying data) and, on getaddrinfo's
//! socket, the other question's when glibc sent it before the first answer (sent after it, it
//! is copied with the flow, and a replay would put it on the mirror twice). No answer reaches
//! the mirror without its query; nothing of the other lookups. The classifier's counters agree with the capture: queries, responses,
//! responses per rcode, answers timed (and how long), triggers, replays, copies.
//!
//! Where the classifier sees an exchange: the query at the client's veth (ingress: sent to the
//! resolver pod or to the ClusterIP), the response at the resolver's (ingress: from the pod,
//! before conntrack undoes the DNAT); through the ClusterIP it finds the query across NAT. Over
//! TCP it reads the message at the start of a segment and takes a response only when it answers
//! a query it kept.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mirror_bpf::testing::{in_ci, require_root};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{HistKind, TriggerEvent, TriggerKind};
use mirror_e2e::capture::pcap::Datagram;
use mirror_e2e::oracles::dns_oracle::{self, DnsExpected, Exchange, Flow, SearchLookup};
use mirror_e2e::oracles::oracle::Row;
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, Service, DNS_PORT};
use mirror_e2e::topology::testbed::{Events, Recording, Testbed};
use mirror_e2e::workload::dns::{
    self, Looked, Lookup, QType, Rcode, ResolvConf, Resolved, Resolver, ResolverKind, Responder, Transport,
    Zone, GOOD_A, GOOD_AAAA, GOOD_ZONE,
};
use mirror_e2e::workload::go_resolver::{self, GoResolved};

/// The client pod, then the resolver's.
const PODS: [&str; 2] = ["client", "server"];

/// The rule of the failures.
const FAILURES: &str = "dns=nxdomain,servfail";

/// What the client's capture keeps: DNS, both transports.
const CAPTURE: &str = "port 53";

/// glibc's "name unknown" (`EAI_NONAME`) and "try again" (`EAI_AGAIN`).
const EAI_NONAME: i32 = -2;
const EAI_AGAIN: i32 = -3;

/// The columns of a [`Row`]: lookups answered NOERROR, NXDOMAIN, SERVFAIL, anything else (or
/// nothing). `relevant`, shown after them, is the lookups whose failure the rule covers.
const ANSWERS: [Rcode; 3] = [Rcode::NOERROR, Rcode::NXDOMAIN, Rcode::SERVFAIL];
const OTHER: usize = 3;
type Table = Row<4>;

/// How the client reaches the resolver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// At the resolver pod's address.
    PodToPod,
    /// At the DNS Service's ClusterIP, kube-proxy's rules in `Flavour`.
    ClusterIp(Flavour),
    /// At the DNS Service's IPv6 ClusterIP (a single-stack IPv6 Service), kube-proxy's rules
    /// in `Flavour`.
    ClusterIp6(Flavour),
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::PodToPod => "pod -> resolver pod",
            Path::ClusterIp(Flavour::Iptables) => "pod -> ClusterIP, iptables",
            Path::ClusterIp(Flavour::Nftables) => "pod -> ClusterIP, nftables",
            Path::ClusterIp6(Flavour::Iptables) => "pod -> IPv6 ClusterIP, ip6tables",
            Path::ClusterIp6(Flavour::Nftables) => "pod -> IPv6 ClusterIP, nftables",
        }
    }
}

/// A test's world: the testbed with its rules, the resolver (dnsmasq, or a scripted responder)
/// in the server pod, the Service's NAT if the path has one. Dropped in field order: events,
/// servers, NAT, then the namespaces.
struct Dns {
    /// Go's resolver, the client's program.
    go: Option<PathBuf>,
    events: Events,
    _resolver: Option<Resolver>,
    _responder: Option<Responder>,
    kp: Option<KubeProxy>,
    bed: Testbed,
}

impl Dns {
    /// The testbed with `rules`, the resolver `kind` in the server pod, and the path's NAT;
    /// Go's resolver for the client when `go` is given.
    fn new(rules: &[&str], path: Path, kind: &ResolverKind, go: Option<PathBuf>) -> Dns {
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
    fn with_responder(rules: &[&str], zones: &[Zone]) -> Dns {
        let mut bed = rules.iter().fold(Testbed::builder(&PODS), |b, r| b.rule(r)).build();
        bed.replay_to_sink();
        let server = bed.pod("server");
        let listen = [server.addr(false), server.addr(true)];
        let responder = Responder::start(&server.ns, &listen, DNS_PORT, zones, bed.dir.path());
        Dns { go: None, events: bed.events(), _resolver: None, _responder: Some(responder), kp: None, bed }
    }

    /// Where the client sends its queries, in the family asked for.
    fn server(&self, v6: bool) -> SocketAddr {
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
    fn lookups(
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
    fn run(
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
                go = go_resolver::lookup(binary, ns, conf, go_names, dir);
            }
        });
        let took = started.elapsed();
        let exchanges = dns_oracle::exchanges(&rec.reference, DNS_PORT);
        Run { rec, looked, resolved, go, exchanges, events: self.events.take(), took }
    }
}

/// What a run recorded.
struct Run {
    rec: Recording,
    /// dig's record.
    looked: Vec<Looked>,
    /// getaddrinfo's record.
    resolved: Vec<Resolved>,
    /// Go's resolver's record.
    go: Vec<GoResolved>,
    /// The exchanges of the client's capture, UDP and TCP.
    exchanges: Vec<Exchange>,
    events: Vec<TriggerEvent>,
    took: Duration,
}

impl Run {
    /// The flows of the lookups the clients record as failed in a way `covers` says: dig's
    /// lookups (UDP and TCP) by the answer dig got; getaddrinfo's calls by the sockets that
    /// carried their questions (the capture), those with a covered response; Go's lookups by
    /// the sockets it recorded, those with a covered response.
    fn truth(&self, covers: impl Fn(&Exchange) -> bool) -> BTreeSet<Flow> {
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
    fn of_go<'a>(&'a self, g: &'a GoResolved) -> impl Iterator<Item = &'a Exchange> + 'a {
        self.exchanges.iter().filter(|e| {
            g.sockets.iter().any(|s| (s.transport, s.local, s.server) == (e.transport, e.client, e.server))
        })
    }

    /// The exchange of dig's lookup `l` whose answer dig got, as the capture has it.
    fn answered(&self, l: &Looked) -> Option<&Exchange> {
        let id = l.answer?.id;
        self.exchanges
            .iter()
            .find(|e| (e.transport, e.client, e.id) == (l.lookup.transport, l.lookup.local, id))
    }

    /// The exchanges of a getaddrinfo call: those of its name and of its search candidates,
    /// on sockets neither dig nor Go's resolver used.
    fn of_call<'a>(&'a self, r: &'a Resolved) -> impl Iterator<Item = &'a Exchange> + 'a {
        let name = r.name.trim_end_matches('.').to_ascii_lowercase();
        let go = self.go.iter().flat_map(|g| g.sockets.iter().map(|s| s.local));
        let dig: BTreeSet<SocketAddr> = self.looked.iter().map(|l| l.lookup.local).chain(go).collect();
        self.exchanges.iter().filter(move |e| {
            !dig.contains(&e.client) && (e.qname == name || e.qname.starts_with(&format!("{name}.")))
        })
    }

    /// The table's row of these lookups (each dig lookup, getaddrinfo call and Go lookup one), with the
    /// events scored against `expected`.
    fn row(&self, expected: &DnsExpected, matched: usize) -> Table {
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

/// One client's failed lookups against its events: lookups, flows its record says failed as
/// the rule covers, its events, those of such a flow, and such flows with an event.
#[derive(Debug, Clone, Copy, Default)]
struct ClientScore {
    lookups: usize,
    failed: usize,
    events: usize,
    correct: usize,
    found: usize,
}

impl ClientScore {
    fn add(&mut self, o: &ClientScore) {
        self.lookups += o.lookups;
        self.failed += o.failed;
        self.events += o.events;
        self.correct += o.correct;
        self.found += o.found;
    }

    fn precision(&self) -> f64 {
        if self.events == 0 {
            1.0
        } else {
            self.correct as f64 / self.events as f64
        }
    }

    fn recall(&self) -> f64 {
        if self.failed == 0 {
            1.0
        } else {
            self.found as f64 / self.failed as f64
        }
    }
}

impl Run {
    /// Each client's score (dig over UDP, dig over TCP, getaddrinfo, Go's resolver; those that
    /// ran): its flows, those of them in [`Run::truth`], the events of its flows.
    fn by_client(&self, covers: impl Fn(&Exchange) -> bool + Copy) -> Vec<(&'static str, ClientScore)> {
        let dig = |t: Transport| {
            let of: Vec<&Looked> = self.looked.iter().filter(|l| l.lookup.transport == t).collect();
            let flows =
                of.iter().map(|l| Flow { transport: t, client: l.lookup.local, server: l.lookup.server });
            (of.len(), flows.collect::<BTreeSet<Flow>>())
        };
        let gai = self.resolved.iter().flat_map(|r| self.of_call(r).map(Exchange::flow)).collect();
        let go = self.go.iter().flat_map(|g| self.of_go(g).map(Exchange::flow)).collect();
        let clients = [
            ("dig, UDP", dig(Transport::Udp)),
            ("dig, TCP", dig(Transport::Tcp)),
            ("getaddrinfo", (self.resolved.len(), gai)),
            ("Go's resolver", (self.go.len(), go)),
        ];
        let truth = self.truth(covers);
        let of_flow = |ev: &TriggerEvent, f: &Flow| {
            dns_oracle::names(ev, f.client) && ev.key.proto == f.transport.proto()
        };
        clients
            .into_iter()
            .filter(|(_, (lookups, _))| *lookups > 0)
            .map(|(name, (lookups, flows))| {
                let failed: BTreeSet<&Flow> = flows.iter().filter(|f| truth.contains(f)).collect();
                let events: Vec<&TriggerEvent> =
                    self.events.iter().filter(|ev| flows.iter().any(|f| of_flow(ev, f))).collect();
                let correct = events.iter().filter(|ev| failed.iter().any(|f| of_flow(ev, f))).count();
                let found = failed.iter().filter(|f| events.iter().any(|ev| of_flow(ev, f))).count();
                (name, ClientScore { lookups, failed: failed.len(), events: events.len(), correct, found })
            })
            .collect()
    }
}

/// The table of clients' scores by resolver.
fn clients_table(scores: &[(String, &'static str, ClientScore)]) -> String {
    let mut lines = vec![
        "| resolver | client | lookups | failed, covered (flows) | events | precision | recall |".to_string(),
        "|---|---|--:|--:|--:|--:|--:|".to_string(),
    ];
    for (resolver, client, s) in scores {
        lines.push(format!(
            "| {resolver} | {client} | {} | {} | {} | {:.3} | {:.3} |",
            s.lookups,
            s.failed,
            s.events,
            s.precision(),
            s.recall()
        ));
    }
    lines.join("\n")
}

/// Pushes `msg` when `ok` is false.
fn check(failures: &mut Vec<String>, ok: bool, msg: impl FnOnce() -> String) {
    if !ok {
        failures.push(msg());
    }
}

/// The checks every run shares, their failures pushed to `failures`: the clients' record
/// against the capture (the harness), the events against the triggers `covers` says (the flow
/// of each, its question and rcode; the rule that matched, `rule_of`), the mirror against the
/// capture (no answer on it without its query), the flow table's marks, and the counters
/// against the capture. Returns the run's row.
fn verify(
    d: &Dns,
    run: &Run,
    covers: impl Fn(&Exchange) -> bool + Copy,
    rule_of: impl Fn(&Exchange) -> Option<u32>,
    failures: &mut Vec<String>,
) -> Table {
    // The harness: dig (over UDP and TCP) got what the capture has, and only one exchange.
    for l in &run.looked {
        let answered = l.answer.map(|a| (a.id, a.rcode));
        let of_lookup: Vec<&Exchange> = run
            .exchanges
            .iter()
            .filter(|e| (e.transport, e.client) == (l.lookup.transport, l.lookup.local))
            .collect();
        let seen: Vec<_> = of_lookup.iter().map(|e| (e.id, e.rcode.unwrap_or(Rcode(255)))).collect();
        check(failures, answered.is_some() && seen == answered.into_iter().collect::<Vec<_>>(), || {
            format!(
                "dig {} {} from {} over {:?}: answered {answered:?}, captured {seen:?}",
                l.lookup.name, l.lookup.qtype, l.lookup.local, l.lookup.transport
            )
        });
    }
    // Go's resolver: each socket it recorded carried one exchange, answered, and its result
    // agrees with their rcodes (found: one NOERROR at least; failed: the rcode its error tells,
    // on every socket, or, for an error that tells none, no NOERROR, NXDOMAIN nor SERVFAIL).
    for g in &run.go {
        let rcodes: Vec<Option<Rcode>> = run.of_go(g).map(|e| e.rcode).collect();
        let agrees = match &g.result {
            Ok(_) => rcodes.contains(&Some(Rcode::NOERROR)),
            Err(e) => match e.rcode() {
                Some(r) => rcodes.iter().all(|x| *x == Some(r)),
                None => rcodes.iter().all(|x| x.is_some_and(|x| !ANSWERS.contains(&x))),
            },
        };
        let answered = rcodes.iter().all(Option::is_some);
        check(failures, rcodes.len() == g.sockets.len() && !rcodes.is_empty() && answered && agrees, || {
            format!("Go's resolver {}: {:?} on {:?}, captured {rcodes:?}", g.name, g.result, g.sockets)
        });
    }
    let expected = DnsExpected::new(&run.rec.reference, &run.exchanges, DNS_PORT, covers);
    let marked: BTreeSet<Flow> = expected.triggered.iter().map(|t| t.flow()).collect();
    let truth = run.truth(covers);
    check(failures, marked == truth, || {
        format!("the oracle's triggers {marked:?}, the clients' failures {truth:?}")
    });

    // The events.
    let (matched, problems) = expected.score(&run.exchanges, &run.events);
    failures.extend(problems);
    for ev in &run.events {
        let t = expected.triggered.iter().find(|t| dns_oracle::names(ev, t.client));
        let want = t.and_then(|t| rule_of(&run.exchanges[t.exchange]));
        check(failures, Some(ev.rule_id) == want, || {
            format!("event of rule {}, rule {want:?} expected: {ev:?}", ev.rule_id)
        });
        check(failures, ev.request_to_response.is_some(), || {
            format!("an event without the time to answer: {ev:?}")
        });
    }

    // The mirror.
    if let Err(diff) = expected.compare_mirror(&run.rec.mirror) {
        failures.push(format!("mirror:\n{diff}"));
    }
    let alone = dns_oracle::answers_without_query(&run.rec.mirror);
    check(failures, alone == 0, || format!("{alone} answers on the mirror without their query"));

    // The flow table: the triggered flows (UDP sockets, TCP connections) are marked, by their
    // rcode, and no other flow.
    let flows = d.bed.dp.flows().expect("reading flows");
    let mut marks: BTreeMap<(u8, SocketAddr), u16> = BTreeMap::new();
    for f in &flows {
        let Some(m) = f.mark else { continue };
        let client = [f.key.lo, f.key.hi].into_iter().find(|a| a.port() != DNS_PORT);
        let client = client.filter(|_| [6, 17].contains(&f.key.proto));
        check(failures, m.kind == TriggerKind::Dns && client.is_some(), || {
            format!("a mark {m:?} of {}", f.key)
        });
        if let Some(c) = client {
            marks.insert((f.key.proto, c), m.status);
        }
    }
    let want: BTreeMap<(u8, SocketAddr), u16> = expected
        .triggered
        .iter()
        .map(|t| {
            let rcode = run.exchanges[t.exchange].rcode.map_or(0, |r| u16::from(r.0));
            ((t.transport.proto(), t.client), rcode)
        })
        .collect();
    check(failures, marks == want, || {
        format!("marked flows (protocol, client) and their rcodes {marks:?}, expected {want:?}")
    });

    // The counters, against the capture.
    let c = d.bed.counters();
    let queries = run.exchanges.len() as u64;
    let responses = run.exchanges.iter().filter(|e| e.response.is_some()).count() as u64;
    let triggers = expected.triggered.len() as u64;
    let mirrored = (run.rec.mirror.datagrams.len() + run.rec.mirror.packets.len()) as u64;
    let counted = [
        ("DNS queries", stat_idx::STAT_DNS_QUERIES, queries),
        ("DNS responses", stat_idx::STAT_DNS_RESPONSES, responses),
        ("DNS responses unmatched", stat_idx::STAT_DNS_UNMATCHED, 0),
        ("DNS messages malformed", stat_idx::STAT_DNS_MALFORMED, 0),
        ("triggers", stat_idx::STAT_TRIGGERS, triggers),
        ("DNS triggers", stat_idx::STAT_DNS_TRIGGERS, triggers),
        ("replayed", stat_idx::STAT_REPLAYED, expected.replays() as u64),
        ("replays missed", stat_idx::STAT_REPLAY_MISSED, 0),
        ("replays failed", stat_idx::STAT_REPLAY_FAILED, 0),
        ("mirrored", stat_idx::STAT_MIRRORED_PACKETS, mirrored),
        ("copy errors", stat_idx::STAT_MIRROR_ERRORS, 0),
        ("ring buffer drops", stat_idx::STAT_RINGBUF_DROPS, 0),
        // DNS over TCP is DNS, no HTTP.
        ("HTTP requests", stat_idx::STAT_HTTP_REQUESTS, 0),
        ("HTTP responses", stat_idx::STAT_HTTP_RESPONSES, 0),
    ];
    for (what, idx, want) in counted {
        check(failures, c.get(idx) == want, || format!("{what} counted {}, {want} expected", c.get(idx)));
    }
    let mut by_rcode = [0u64; 16];
    for e in &run.exchanges {
        if let Some(r) = e.rcode {
            by_rcode[usize::from(r.0)] += 1;
        }
    }
    let rcodes = d.bed.dp.dns_rcodes().expect("reading the rcode counts");
    check(failures, rcodes == by_rcode, || {
        format!("responses by rcode counted {rcodes:?}, captured {by_rcode:?}")
    });
    // Every answer timed (latency.dns is on by default), as long as the capture says within a
    // few ms on average (the capture is a hop away from where the classifier sees both).
    let times = d.bed.histogram(HistKind::DnsResponse, None);
    let (timed, sum_ns) = times.map_or((0, 0), |h| (h.count, h.sum_ns));
    let captured_ns: u64 = run.exchanges.iter().filter_map(|e| e.took_ns(&run.rec.reference)).sum();
    let off_ms = (sum_ns as f64 - captured_ns as f64).abs() / 1e6 / responses.max(1) as f64;
    check(failures, timed == responses && off_ms < 2.0, || {
        format!("{timed} answers timed ({sum_ns} ns in all), {responses} captured ({captured_ns} ns)")
    });
    let hits: u64 = d.bed.dp.rules().expect("reading rules").iter().map(|r| r.hits).sum();
    check(failures, hits == triggers, || format!("rule hits {hits}, {triggers} triggers"));
    run.row(&expected, matched)
}

/// The header of the tables.
fn table(rows: &[(String, Table)]) -> String {
    let mut lines = vec![
        "| lookups | all | NOERROR | NXDOMAIN | SERVFAIL | other | failed, covered | events | precision | recall | mirrored / expected (copies and replays) |".to_string(),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|".to_string(),
    ];
    let mut total = Table::default();
    for (name, r) in rows {
        lines.push(r.line(name, OTHER + 1));
        total.add(r);
    }
    if rows.len() > 1 {
        lines.push(total.line("all", OTHER + 1));
    }
    lines.join("\n")
}

/// Asserts that `failures` is empty, showing them all.
#[track_caller]
fn assert_none(what: &str, failures: &[String]) {
    assert!(failures.is_empty(), "{what}: {} failure(s)\n\n{}", failures.len(), failures.join("\n\n"));
}

/// The lookups of the mix, by dig over UDP: names that resolve, do not exist, fail upstream
/// (SERVFAIL) and are refused upstream (REFUSED, not covered by the rule).
const MIX: [(&str, QType); 9] = [
    ("good.test", QType::A),
    ("good.test", QType::AAAA),
    ("www.good.test", QType::A),
    ("missing-1.test", QType::A),
    ("missing-2.test", QType::AAAA),
    ("a.fail.test", QType::A),
    ("b.fail.test", QType::AAAA),
    ("c.refused.test", QType::A),
    ("www.good.test", QType::AAAA),
];

/// The same over IPv6, on the path that has it.
const MIX6: [(&str, QType); 4] = [
    ("good.test", QType::AAAA),
    ("missing-6.test", QType::A),
    ("d.fail.test", QType::AAAA),
    ("good.test", QType::A),
];

/// Over TCP (a connection per lookup): the failures trigger as over UDP.
const MIX_TCP: [(&str, QType); 3] =
    [("missing-tcp.test", QType::A), ("e.fail.test", QType::A), ("good.test", QType::AAAA)];

/// By getaddrinfo (absolute names: no search list applies).
const MIX_GAI: [&str; 3] = ["good.test.", "missing-gai.test.", "f.fail.test."];

/// By Go's resolver (A and AAAA at once, each on a socket of its own; absolute names).
const MIX_GO: [&str; 4] = ["good.test.", "missing-go.test.", "g.fail.test.", "h.refused.test."];

/// Whether the rule [`FAILURES`] covers an exchange.
fn failed(e: &Exchange) -> bool {
    matches!(e.rcode, Some(Rcode::NXDOMAIN | Rcode::SERVFAIL))
}

/// The mix of lookups along `path` to the resolver `kind`, rule [`FAILURES`]: the clients'
/// record and the checks of [`verify`]. Returns the row and the failures.
fn failures_along(
    path: Path,
    kind: &ResolverKind,
    go: Option<PathBuf>,
) -> (Table, Vec<(&'static str, ClientScore)>, Vec<String>) {
    let go_names: &[&str] = if go.is_some() { &MIX_GO } else { &[] };
    let d = Dns::new(&[FAILURES], path, kind, go);
    let rule = d.bed.rule_ids()[0];
    let mut ports = 20_000;
    // Through an IPv6 Service, every client asks over IPv6.
    let v6 = matches!(path, Path::ClusterIp6(_));
    let mut lookups =
        if v6 { Vec::new() } else { d.lookups(&MIX, d.server(false), Transport::Udp, &mut ports) };
    if path == Path::PodToPod || v6 {
        lookups.extend(d.lookups(&MIX6, d.server(true), Transport::Udp, &mut ports));
    }
    lookups.extend(d.lookups(&MIX_TCP, d.server(v6), Transport::Tcp, &mut ports));
    let run = d.run(&lookups, 1, &ResolvConf::plain(d.server(v6).ip()), &MIX_GAI, go_names);
    let mut failures = Vec::new();
    for l in &run.looked {
        let want = Resolver::rcode_of(&l.lookup.name);
        check(&mut failures, l.rcode() == Some(want), || format!("dig {l:?}: {want} expected"));
    }
    let want_gai = [Ok(vec![IpAddr::V4(GOOD_A), IpAddr::V6(GOOD_AAAA)]), Err(EAI_NONAME), Err(EAI_AGAIN)];
    let got_gai: Vec<_> = run.resolved.iter().map(|r| r.result.clone()).collect();
    check(&mut failures, got_gai == want_gai, || {
        format!("getaddrinfo {MIX_GAI:?}: {got_gai:?}, {want_gai:?} expected")
    });
    // Go's resolver: found, or failed with the resolver's rcode (REFUSED tells none), each
    // lookup on two sockets (A and AAAA).
    for g in &run.go {
        let want = Resolver::rcode_of(&g.name);
        let got = g.result.as_ref().map_or_else(|e| e.rcode(), |_| Some(Rcode::NOERROR));
        let want_got = if want == Rcode::REFUSED { None } else { Some(want) };
        let addrs = g.result.as_ref().map_or(true, |a| {
            let mut a = a.clone();
            a.sort();
            a == [IpAddr::V4(GOOD_A), IpAddr::V6(GOOD_AAAA)]
        });
        check(&mut failures, got == want_got && addrs && g.sockets.len() == 2, || {
            format!(
                "Go's resolver {}: {:?} on {} sockets, {want} expected",
                g.name,
                g.result,
                g.sockets.len()
            )
        });
    }
    let tcp = run.exchanges.iter().filter(|e| e.transport == Transport::Tcp && e.response.is_some()).count();
    check(&mut failures, tcp == MIX_TCP.len(), || {
        format!("{tcp} exchanges answered over TCP, {} lookups", MIX_TCP.len())
    });
    let row = verify(&d, &run, failed, |_| Some(rule), &mut failures);
    // The resolver's table: the failures the rule covers, one flow each (a getaddrinfo call's
    // socket asks both types, which fail alike).
    let covered = |name: &str| matches!(Resolver::rcode_of(name), Rcode::NXDOMAIN | Rcode::SERVFAIL);
    let want_tcp = MIX_TCP.iter().filter(|(n, _)| covered(n)).count();
    let want = lookups.iter().filter(|l| covered(&l.name)).count()
        + MIX_GAI.iter().filter(|n| covered(n)).count()
        + 2 * go_names.iter().filter(|n| covered(n)).count();
    check(&mut failures, row.relevant == want, || {
        format!("{} flows to trigger, {want} failed", row.relevant)
    });
    let over_tcp = run.events.iter().filter(|ev| ev.key.proto == 6).count();
    check(&mut failures, over_tcp == want_tcp, || format!("{over_tcp} events over TCP, {want_tcp} expected"));
    let replays = (run.rec.mirror.replayed_datagrams.len(), run.rec.mirror.replayed.len());
    let name = format!("{}, {}", kind.name(), path.name());
    eprintln!(
        "{name}: {} lookups, {} exchanges ({tcp} over TCP), {} events ({over_tcp} over TCP), replays: {} datagrams, {} segments, {:.2} s",
        row.connections,
        run.exchanges.len(),
        run.events.len(),
        replays.0,
        replays.1,
        run.took.as_secs_f64()
    );
    let clients = run.by_client(failed);
    (row, clients, failures.into_iter().map(|f| format!("{name}: {f}")).collect())
}

/// The paths of [`dns_failures_are_mirrored_with_their_query`].
const PATHS: [Path; 4] = [
    Path::PodToPod,
    Path::ClusterIp(Flavour::Iptables),
    Path::ClusterIp(Flavour::Nftables),
    Path::ClusterIp6(Flavour::Nftables),
];

/// Rule `dns=nxdomain,servfail`; from the client pod, by dig over UDP: names that resolve, do
/// not exist, fail upstream (SERVFAIL) and are refused upstream (REFUSED, not covered), over
/// IPv4 and (pod to pod) IPv6; by dig over TCP: the same kinds, each failure a trigger of its
/// connection (key protocol 6); by getaddrinfo (A and AAAA on one socket): a name that
/// resolves, one that does not exist, one that fails; by Go's resolver (A and AAAA each on a
/// socket of its own): the same and a name refused. Each resolver (dnsmasq, CoreDNS) in turn;
/// pod to the resolver pod, through the DNS Service's ClusterIP with iptables and with nftables
/// rules, and through an IPv6 DNS Service (nftables; every client over IPv6). Against the
/// clients' record, altogether and per resolver and client:
/// precision and recall 1.0 (each failed lookup has exactly one event naming its flow, id,
/// name, type and rcode; no other lookup has one); on the mirror, each failed lookup's query
/// (replayed first) and its response exactly once (a getaddrinfo socket: the other query too,
/// replayed ahead of its answer, or copied when sent after the first answer; a TCP connection:
/// the query's segment, then every segment from the response on), nothing of the others;
/// marks, counters and rcode counts as the capture says.
#[test]
fn dns_failures_are_mirrored_with_their_query() {
    if !require_root() {
        return;
    }
    let (resolvers, go) = (ResolverKind::available(), go_resolver::binary());
    check_go(&go);
    let started = Instant::now();
    let (mut rows, mut failures, mut clients) =
        (Vec::new(), Vec::new(), Vec::<(String, _, ClientScore)>::new());
    for kind in &resolvers {
        for path in PATHS {
            let (row, scores, f) = failures_along(path, kind, go.clone());
            rows.push((format!("{}, {}", kind.name(), path.name()), row));
            failures.extend(f);
            for (client, score) in scores {
                match clients.iter_mut().find(|(r, c, _)| r == kind.name() && *c == client) {
                    Some((_, _, s)) => s.add(&score),
                    None => clients.push((kind.name().to_string(), client, score)),
                }
            }
        }
    }
    eprintln!(
        "rule {FAILURES}, {:.1} s\n{}\nby resolver and client, the paths together\n{}",
        started.elapsed().as_secs_f64(),
        table(&rows),
        clients_table(&clients)
    );
    assert_none("DNS failures", &failures);
    for (name, r) in &rows {
        assert!(r.relevant >= 8, "{name}: {} failed lookups covered", r.relevant);
        assert_eq!((r.precision(), r.recall()), (1.0, 1.0), "{name}");
    }
    for (resolver, client, s) in &clients {
        assert!(s.failed > 0, "{resolver}, {client}: no failed lookup");
        assert_eq!((s.precision(), s.recall()), (1.0, 1.0), "{resolver}, {client}: {s:?}");
    }
}

/// Go's resolver is there, or (outside CI) the test says it runs without it.
fn check_go(go: &Option<PathBuf>) {
    if go.is_none() {
        let needs = "a Go toolchain (go in PATH or /usr/local/go/bin/go)";
        assert!(!in_ci(), "Go's resolver needs {needs}, and CI=true forbids leaving it out");
        eprintln!("NOT RUN: Go's resolver ({needs} not found)");
    }
}

/// Rule `dns=nxdomain`; 1,000 lookups by dig over UDP through the DNS Service's ClusterIP
/// (iptables), from four clients at once, one in ten of a name that does not exist (A and
/// AAAA alternately): precision and recall against the clients' record (1.0), every failed
/// lookup's query and response on the mirror once, nothing of the others; the classifier
/// counted 1,000 queries, 1,000 responses, 900 NOERROR and 100 NXDOMAIN.
#[test]
fn dns_failures_under_a_thousand_lookups() {
    if !require_root() {
        return;
    }
    const LOOKUPS: usize = 1000;
    const CLIENTS: usize = 4;
    for kind in &ResolverKind::available() {
        let d = Dns::new(&["dns=nxdomain"], Path::ClusterIp(Flavour::Iptables), kind, None);
        // Four clients at once: tcpdump must lose nothing.
        d.bed.capture_buffer_kib(64 * 1024);
        let rule = d.bed.rule_ids()[0];
        let names: Vec<(String, QType)> = (0..LOOKUPS)
            .map(|i| {
                let qtype = if i % 2 == 0 { QType::A } else { QType::AAAA };
                let name =
                    if i % 10 == 3 { format!("missing-{i}.test") } else { format!("host-{i}.{GOOD_ZONE}") };
                (name, qtype)
            })
            .collect();
        let names: Vec<(&str, QType)> = names.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let mut ports = 20_000;
        let lookups = d.lookups(&names, d.server(false), Transport::Udp, &mut ports);
        let run = d.run(&lookups, CLIENTS, &ResolvConf::plain(d.server(false).ip()), &[], &[]);
        let mut failures = Vec::new();
        let wrong: Vec<&Looked> =
            run.looked.iter().filter(|l| l.rcode() != Some(Resolver::rcode_of(&l.lookup.name))).collect();
        check(&mut failures, wrong.is_empty(), || {
            format!("{} lookups answered otherwise: {wrong:?}", wrong.len())
        });
        let nxdomain = |e: &Exchange| e.rcode == Some(Rcode::NXDOMAIN);
        let row = verify(&d, &run, nxdomain, |_| Some(rule), &mut failures);
        eprintln!(
            "{}: rule dns=nxdomain, {LOOKUPS} lookups from {CLIENTS} clients at once through the ClusterIP in {:.2} s\n{}",
            kind.name(),
            run.took.as_secs_f64(),
            table(&[("dig, UDP".to_string(), row)])
        );
        // The classifier's counts against the clients' record.
        let (c, rcodes) = (d.bed.counters(), d.bed.dp.dns_rcodes().expect("reading the rcode counts"));
        let counted =
            (c.get(stat_idx::STAT_DNS_QUERIES), c.get(stat_idx::STAT_DNS_RESPONSES), rcodes[0], rcodes[3]);
        eprintln!(
            "counted: {} queries, {} responses, {} NOERROR, {} NXDOMAIN",
            counted.0, counted.1, counted.2, counted.3
        );
        let name = kind.name();
        assert_none(&format!("{name}: a thousand lookups"), &failures);
        let counts = (row.connections, row.counts[0], row.counts[1], row.relevant);
        assert_eq!(counts, (LOOKUPS, 900, 100, 100), "{name}");
        assert_eq!(counted, (LOOKUPS as u64, LOOKUPS as u64, 900, 100), "{name}");
        assert_eq!((row.precision(), row.recall()), (1.0, 1.0), "{name}");
    }
}

/// Two filtered rules: `dns=nxdomain qname=.team-a.test` (the names under team-a.test, in any
/// case, not team-a.test itself nor a name that only ends with its text) and `dns=servfail
/// qtype=AAAA`. Only the failures they pass trigger, each by its rule; the others (other
/// names, other types, other rcodes) are neither events nor on the mirror.
#[test]
fn dns_qname_and_qtype_filters_pick_the_failures() {
    if !require_root() {
        return;
    }
    for kind in &ResolverKind::available() {
        let rules = ["dns=nxdomain qname=.team-a.test", "dns=servfail qtype=AAAA"];
        let d = Dns::new(&rules, Path::PodToPod, kind, None);
        let (by_name, by_type) = (d.bed.rule_ids()[0], d.bed.rule_ids()[1]);
        let names = [
            ("x.team-a.test", QType::A),
            ("y.team-a.test", QType::AAAA),
            ("Z.Team-A.TEST", QType::A),
            ("team-a.test", QType::A),
            ("xteam-a.test", QType::A),
            ("x.team-b.test", QType::A),
            ("s.fail.test", QType::AAAA),
            ("t.fail.test", QType::A),
            ("r.refused.test", QType::AAAA),
            ("good.test", QType::AAAA),
        ];
        let mut ports = 20_000;
        let lookups = d.lookups(&names, d.server(false), Transport::Udp, &mut ports);
        let run = d.run(&lookups, 1, &ResolvConf::plain(d.server(false).ip()), &[], &[]);
        let rule_of = |e: &Exchange| match e.rcode {
            Some(Rcode::NXDOMAIN) if e.qname.ends_with(".team-a.test") => Some(by_name),
            Some(Rcode::SERVFAIL) if e.qtype == QType::AAAA => Some(by_type),
            _ => None,
        };
        let mut failures = Vec::new();
        let row = verify(&d, &run, |e| rule_of(e).is_some(), rule_of, &mut failures);
        let triggered: Vec<String> = run
            .events
            .iter()
            .filter_map(dns_oracle::event_question)
            .map(|(_, n, t)| format!("{n} {t}"))
            .collect();
        let name = kind.name();
        eprintln!("{name}: filters: triggered {triggered:?}\n{}", table(&[("dig, UDP".to_string(), row)]));
        assert_none(&format!("{name}: filters"), &failures);
        assert_eq!(row.relevant, 4, "{name}: x, y and Z under team-a.test, s.fail.test AAAA");
        let filtered = d.bed.counters().get(stat_idx::STAT_FILTERED_OUT);
        assert!(filtered > 0, "{name}: no rule was turned down by its filter");
    }
}

/// Rule `dns=any latency>150ms`, a scripted server in the server pod that answers names under
/// slow.test and slownx.test 300 ms late (NOERROR, NXDOMAIN) and the others at once: the slow
/// answers trigger, whatever their rcode, the others do not; each event's time to answer is the
/// capture's within 20 ms; every answer was timed (as in every test here).
#[test]
fn dns_slow_answers_trigger_latency_rules() {
    if !require_root() {
        return;
    }
    const DELAY: Duration = Duration::from_millis(300);
    const OVER: Duration = Duration::from_millis(150);
    let zones = [
        Zone::new("slow.test", Rcode::NOERROR).delayed(DELAY),
        Zone::new("slownx.test", Rcode::NXDOMAIN).delayed(DELAY),
        Zone::new("fast.test", Rcode::NOERROR),
        Zone::new("fastnx.test", Rcode::NXDOMAIN),
    ];
    let d = Dns::with_responder(&[&format!("dns=any latency>{}ms", OVER.as_millis())], &zones);
    let rule = d.bed.rule_ids()[0];
    let names = [
        ("a.slow.test", QType::A),
        ("b.slownx.test", QType::AAAA),
        ("c.fast.test", QType::A),
        ("d.fastnx.test", QType::A),
        ("e.fast.test", QType::AAAA),
    ];
    let mut ports = 20_000;
    let lookups = d.lookups(&names, d.server(false), Transport::Udp, &mut ports);
    let run = d.run(&lookups, names.len(), &ResolvConf::plain(d.server(false).ip()), &[], &[]);
    let slow = |e: &Exchange| e.took_ns(&run.rec.reference).is_some_and(|t| t > OVER.as_nanos() as u64);
    let mut failures = Vec::new();
    let row = verify(&d, &run, slow, |_| Some(rule), &mut failures);
    let mut times = Vec::new();
    for ev in &run.events {
        let Some((id, name, _)) = dns_oracle::event_question(ev) else { continue };
        let Some(e) = run.exchanges.iter().find(|e| e.id == id && e.qname == name) else { continue };
        let captured = e.took_ns(&run.rec.reference).unwrap_or(0) as i64;
        let took = ev.request_to_response.map_or(0, |t| t.as_nanos() as i64);
        times.push(format!("{name}: {:.1} ms (capture {:.1} ms)", took as f64 / 1e6, captured as f64 / 1e6));
        check(&mut failures, (took - captured).abs() < 20_000_000, || {
            format!("{name}: answered after {took} ns by the event, {captured} ns by the capture")
        });
    }
    eprintln!("latency>{OVER:?}: {}\n{}", times.join(", "), table(&[("dig, UDP".to_string(), row)]));
    assert_none("latency", &failures);
    assert_eq!(row.relevant, 2, "the two slow answers");
}

/// The names looked up through the kubelet-like resolv.conf, each with the NXDOMAINs its lookup
/// gets (two per candidate that fails: A and AAAA): an external name that does not exist, asked
/// as given after the search list (its three expansions and itself); another with `ndots` dots,
/// asked as given first; a name of the cluster found by the search list's second candidate (one
/// NXDOMAIN pair before it); an external name found as given after the whole list; a name of
/// the cluster's zone that does not exist (each of its candidates in the zone).
const SEARCHED: [(&str, usize); 5] = [
    ("api.partner.example", 8),
    ("a.b.c.d.e.example", 8),
    ("kube-dns.kube-system", 2),
    ("good.test", 6),
    ("nosuch.kube-system.svc.cluster.local", 8),
];

/// The cluster's zone, where the kubelet's search domains are.
const ZONE: &str = "cluster.local";

/// The search-path mode: NXDOMAINs of names outside the cluster's zone.
const OUTSIDE_ZONE: &str = "dns=nxdomain qname=!.cluster.local";

/// Whether `name` is the cluster's zone or under it.
fn in_zone(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == ZONE || name.ends_with(&format!(".{ZONE}"))
}

/// What a rule covers, by the exchange.
type Covers = fn(&Exchange) -> bool;

/// What `dns=nxdomain` covers.
fn nxdomain(e: &Exchange) -> bool {
    e.rcode == Some(Rcode::NXDOMAIN)
}

/// What [`OUTSIDE_ZONE`] covers.
fn nxdomain_outside_zone(e: &Exchange) -> bool {
    nxdomain(e) && !in_zone(&e.qname)
}

/// One lookup of [`SEARCHED`] under one rule: its NXDOMAINs, its events (each with the name it
/// names) and what the mirror carried of its sockets: queries replayed, queries copied (sent
/// after the mark), answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Searched {
    nx: usize,
    events: Vec<String>,
    replays: usize,
    queries: usize,
    answers: usize,
}

/// A kubelet-like resolv.conf (`ndots:5`, search `shop.svc.cluster.local svc.cluster.local
/// cluster.local`, the resolver's `cluster.local` zone) with the DNS Service's ClusterIP as
/// nameserver; getaddrinfo of each of [`SEARCHED`], once under `dns=nxdomain` and once, on a
/// testbed of its own, under the search-path mode [`OUTSIDE_ZONE`]. The candidates tried are
/// the search list's, in glibc's order, each on a socket of its own, A and AAAA on it, each
/// answered as the resolver's table says. `dns=nxdomain` marks every candidate's socket that got
/// an NXDOMAIN (one event per candidate that failed). The search-path mode marks exactly one
/// flow per lookup of an external name that failed as a whole (the name as given, the only
/// candidate outside the zone), none for the lookups that succeed (their expansions' NXDOMAINs
/// are all in the zone) and none for the name of the zone that does not exist (what the mode
/// misses by design); on the mirror, each of its socket's two queries once (replayed ahead of
/// its answer, or copied when glibc sent it after the first answer marked the socket) and the
/// two answers once. Each run passes the checks of [`verify`].
#[test]
fn dns_search_path_lookups_through_a_kubelet_resolv_conf() {
    if !require_root() {
        return;
    }
    let names: Vec<&str> = SEARCHED.iter().map(|(n, _)| *n).collect();
    // Each rule, what it covers, and whether it is the search-path mode.
    let rules: [(&str, Covers, bool); 2] =
        [("dns=nxdomain", nxdomain, false), (OUTSIDE_ZONE, nxdomain_outside_zone, true)];
    for kind in &ResolverKind::available() {
        let mut failures = Vec::new();
        let (mut rows, mut results, mut seen) = (Vec::new(), Vec::new(), Vec::new());
        for (rule, covers, mode) in rules {
            let d = Dns::new(&[rule], Path::ClusterIp(Flavour::Iptables), kind, None);
            let conf = ResolvConf::kubelet("shop", d.server(false).ip());
            check(&mut failures, conf.search.iter().all(|s| in_zone(s)), || {
                format!("search domains {:?} outside the resolver's zone {ZONE}", conf.search)
            });
            let run = d.run(&[], 1, &conf, &names, &[]);
            let row = verify(&d, &run, covers, |_| d.bed.rule_ids().first().copied(), &mut failures);
            let f = &mut failures;
            for e in &run.exchanges {
                let want = Resolver::rcode_of(&e.qname);
                check(f, e.rcode == Some(want), || {
                    format!("{rule}: {} {} answered {:?}, {want}", e.qname, e.qtype, e.rcode)
                });
            }
            let mut of_rule = Vec::new();
            for ((name, want_nx), r) in SEARCHED.iter().zip(&run.resolved) {
                let candidates = conf.candidates(name);
                let lookup = SearchLookup::new(&run.exchanges, &candidates);
                let (tried, sockets, queries) = (&lookup.tried, lookup.sockets.len(), lookup.exchanges.len());
                // glibc's order: the candidates up to the one found (all when none is), each asked A
                // and AAAA on one socket (a socket of its own, or, at times, the previous
                // candidate's, which glibc then kept open).
                let found = |c: &String| {
                    lookup.exchanges.iter().any(|e| &e.qname == c && e.rcode == Some(Rcode::NOERROR))
                };
                let until = candidates.iter().position(found).map_or(candidates.len(), |i| i + 1);
                check(f, tried[..] == candidates[..until], || {
                    format!("{rule}: {name}: tried {tried:?}, {:?} expected", &candidates[..until])
                });
                check(f, queries == 2 * tried.len() && (1..=tried.len()).contains(&sockets), || {
                    format!(
                        "{rule}: {name}: {queries} queries on {sockets} sockets for {} candidates",
                        tried.len()
                    )
                });
                let mirror = &run.rec.mirror;
                let searched = Searched {
                    nx: lookup.answered(Rcode::NXDOMAIN),
                    events: lookup
                        .events(&run.events)
                        .iter()
                        .map(|ev| dns_oracle::event_question(ev).map_or_else(String::new, |q| q.1))
                        .collect(),
                    replays: mirror
                        .replayed_datagrams
                        .iter()
                        .filter(|r| lookup.sockets.contains(&r.datagram.src))
                        .count(),
                    queries: mirror.datagrams.iter().filter(|c| lookup.sockets.contains(&c.src)).count(),
                    answers: mirror.datagrams.iter().filter(|c| lookup.sockets.contains(&c.dst)).count(),
                };
                check(f, searched.nx == *want_nx, || {
                    format!("{rule}: {name}: {} NXDOMAINs, {want_nx} expected", searched.nx)
                });
                // What each rule must mark, from the resolver's table and getaddrinfo's result: every
                // candidate that failed; the name as given when the lookup of an external name failed.
                let bare = name.to_ascii_lowercase();
                let want: Vec<String> = if !mode {
                    // A flow is marked once: a later failure on a socket already marked (one glibc
                    // kept for the next candidate) is mirrored, not named again.
                    let mut marked = Vec::new();
                    let socket_of =
                        |c: &String| lookup.exchanges.iter().find(|e| &e.qname == c).map(|e| e.client);
                    tried
                        .iter()
                        .filter(|c| Resolver::rcode_of(c) == Rcode::NXDOMAIN)
                        .filter(|c| match socket_of(c) {
                            Some(sock) if !marked.contains(&sock) => {
                                marked.push(sock);
                                true
                            }
                            _ => false,
                        })
                        .cloned()
                        .collect()
                } else if r.result.is_err() && !in_zone(name) {
                    vec![bare]
                } else {
                    Vec::new()
                };
                let mut named = searched.events.clone();
                named.sort();
                let mut want_sorted = want.clone();
                want_sorted.sort();
                check(f, named == want_sorted, || {
                    format!("{rule}: {name}: events naming {named:?}, {want_sorted:?} expected")
                });
                // On the mirror, of each socket marked: each of its queries once (replayed ahead of
                // its answer, or copied when sent after the mark) and each answer once; nothing of
                // the others.
                for socket in &lookup.sockets {
                    let marked =
                        lookup.exchanges.iter().any(|e| e.client == *socket && want.contains(&e.qname));
                    let of_socket = |d: &&Datagram| d.src == *socket || d.dst == *socket;
                    let mut sent: Vec<&[u8]> = run
                        .rec
                        .reference
                        .datagrams
                        .iter()
                        .filter(of_socket)
                        .filter(|_| marked)
                        .map(|d| &d.payload[..])
                        .collect();
                    let replayed = mirror.replayed_datagrams.iter().map(|r| &r.datagram);
                    let mut mirrored: Vec<&[u8]> = mirror
                        .datagrams
                        .iter()
                        .chain(replayed)
                        .filter(of_socket)
                        .map(|d| &d.payload[..])
                        .collect();
                    sent.sort_unstable();
                    mirrored.sort_unstable();
                    check(f, mirrored == sent, || {
                        format!(
                            "{rule}: {name}: {} messages of {socket} on the mirror, {} expected (marked: {marked})",
                            mirrored.len(),
                            sent.len()
                        )
                    });
                }
                of_rule.push(searched);
            }
            let ok: Vec<bool> = run.resolved.iter().map(|r| r.result.is_ok()).collect();
            check(f, ok == [false, false, true, true, false], || format!("{rule}: found {ok:?}"));
            rows.push((format!("getaddrinfo, {rule}"), row));
            results.push(run.resolved.iter().map(|r| r.result.clone()).collect::<Vec<_>>());
            seen.push((of_rule, lookups_tried(&conf, &run)));
        }
        let mut lines = vec![
            format!("| name | result | candidates tried | queries | sockets | NXDOMAINs | events, dns=nxdomain | events, {OUTSIDE_ZONE} | on the mirror under it: queries replayed + copied, answers |"),
            "|---|---|--:|--:|--:|--:|--:|--:|--:|".to_string(),
        ];
        let (plain, outside) = (&seen[0], &seen[1]);
        for (i, (name, _)) in SEARCHED.iter().enumerate() {
            let result = match &results[0][i] {
                Ok(_) => "found".to_string(),
                Err(e) => format!("error {e}"),
            };
            let (tried, queries, sockets) = plain.1[i];
            let (p, o) = (&plain.0[i], &outside.0[i]);
            check(&mut failures, p.nx == o.nx && results[0][i] == results[1][i], || {
                format!(
                    "{name}: {} and {} NXDOMAINs, {:?} and {:?} in the two runs",
                    p.nx, o.nx, results[0][i], results[1][i]
                )
            });
            lines.push(format!(
                "| {name} | {result} | {tried} | {queries} | {sockets} | {} | {} | {} | {} + {}, {} |",
                p.nx,
                p.events.len(),
                o.events.len(),
                o.replays,
                o.queries,
                o.answers
            ));
        }
        let name = kind.name();
        eprintln!(
            "{name}: kubelet resolv.conf through the ClusterIP (iptables)\n{}\n{}",
            lines.join("\n"),
            table(&rows)
        );
        assert_none(&format!("{name}: search path"), &failures);
        let marked: usize = outside.0.iter().map(|s| s.events.len()).sum();
        assert_eq!(marked, 2, "{name}: one flow for each of the two external names that failed");
    }
}

/// Per name of [`SEARCHED`], the candidates `run` tried, its queries and its sockets.
fn lookups_tried(conf: &ResolvConf, run: &Run) -> Vec<(usize, usize, usize)> {
    SEARCHED
        .iter()
        .map(|(name, _)| {
            let lookup = SearchLookup::new(&run.exchanges, &conf.candidates(name));
            (lookup.tried.len(), lookup.exchanges.len(), lookup.sockets.len())
        })
        .collect()
}

/// Rule `noresponse>1s`, a scripted server in the server pod that answers names under late.test
/// 1.6 s late, never answers those under silent.test, answers half.test 500 ms late and
/// fast.test at once: the late and the silent query each mark their socket 1.0-1.3 s after
/// they were sent (by the tick: no packet needed), the event of kind noresponse naming the
/// query; from the mark on the socket is mirrored (the late answer), the query is not replayed
/// by the data path (the agent replays it from the event), so the late answer is on the mirror
/// without it; the others neither trigger nor reach the mirror. The query marked stays kept:
/// its late answer is matched (nothing unmatched) and timed, every answer in the histogram as
/// long as the capture says.
#[test]
fn dns_queries_left_unanswered_are_marked_by_noresponse() {
    if !require_root() {
        return;
    }
    const WAIT: Duration = Duration::from_secs(1);
    const LATE_MAX: Duration = Duration::from_millis(300);
    let zones = [
        Zone::new("late.test", Rcode::NOERROR).delayed(Duration::from_millis(1600)),
        Zone::new("silent.test", Rcode::NOERROR).silent(),
        Zone::new("half.test", Rcode::NOERROR).delayed(Duration::from_millis(500)),
        Zone::new("fast.test", Rcode::NOERROR),
    ];
    let d = Dns::with_responder(&[&format!("noresponse>{}s", WAIT.as_secs())], &zones);
    let names = [
        ("a.late.test", QType::A),
        ("b.silent.test", QType::AAAA),
        ("c.half.test", QType::A),
        ("d.fast.test", QType::A),
    ];
    let mut ports = 20_000;
    let lookups = d.lookups(&names, d.server(false), Transport::Udp, &mut ports);
    let run = d.run(&lookups, names.len(), &ResolvConf::plain(d.server(false).ip()), &[], &[]);
    let mut failures = Vec::new();
    let answered: Vec<Option<Rcode>> = run.looked.iter().map(Looked::rcode).collect();
    let want = [Some(Rcode::NOERROR), None, Some(Rcode::NOERROR), Some(Rcode::NOERROR)];
    check(&mut failures, answered == want, || format!("dig's record {answered:?}, {want:?} expected"));

    let expected = DnsExpected::unanswered(&run.rec.reference, &run.exchanges, DNS_PORT, WAIT);
    let marked: BTreeSet<SocketAddr> = expected.triggered.iter().map(|t| t.client).collect();
    let want: BTreeSet<SocketAddr> = lookups[..2].iter().map(|l| l.local).collect();
    check(&mut failures, marked == want, || format!("the oracle marks {marked:?}, {want:?} expected"));
    let (matched, problems) = expected.score(&run.exchanges, &run.events);
    failures.extend(problems);
    let mut waits = Vec::new();
    for ev in &run.events {
        let waited = ev.request_to_response.unwrap_or_default();
        waits.push(format!("{:.1} ms", waited.as_secs_f64() * 1e3));
        check(&mut failures, ev.by.is_none() && waited >= WAIT && waited < WAIT + LATE_MAX, || {
            format!("marked after {waited:?} (by {:?}): {ev:?}", ev.by)
        });
    }
    if let Err(diff) = expected.compare_mirror(&run.rec.mirror) {
        failures.push(format!("mirror:\n{diff}"));
    }
    let alone = dns_oracle::answers_without_query(&run.rec.mirror);
    check(&mut failures, alone == 1, || {
        format!("{alone} answers without their query, the late one expected")
    });
    let flows = d.bed.dp.flows().expect("reading flows");
    let mut marks: Vec<(SocketAddr, TriggerKind)> = flows
        .iter()
        .filter_map(|f| {
            Some(([f.key.lo, f.key.hi].into_iter().find(|a| a.port() != DNS_PORT)?, f.mark?.kind))
        })
        .collect();
    marks.sort();
    let want: Vec<(SocketAddr, TriggerKind)> = want.iter().map(|c| (*c, TriggerKind::NoResponse)).collect();
    check(&mut failures, marks == want, || format!("marks {marks:?}, {want:?} expected"));
    let c = d.bed.counters();
    let counted = [
        stat_idx::STAT_NORESPONSE_TRIGGERS,
        stat_idx::STAT_TRIGGERS,
        stat_idx::STAT_REPLAYED,
        stat_idx::STAT_REPLAY_FAILED,
        stat_idx::STAT_RINGBUF_DROPS,
        stat_idx::STAT_NORESPONSE_FAILED,
        stat_idx::STAT_DNS_QUERIES,
        stat_idx::STAT_DNS_RESPONSES,
        stat_idx::STAT_DNS_UNMATCHED,
        stat_idx::STAT_MIRRORED_PACKETS,
    ]
    .map(|k| c.get(k));
    let want = [2, 2, 0, 0, 0, 0, 4, 3, 0, run.rec.mirror.datagrams.len() as u64];
    check(&mut failures, counted == want, || format!("counted {counted:?}, {want:?} expected: {c:?}"));
    // Every answer timed, the late one too (its query kept past the mark), as long as the
    // capture says within a few ms each.
    let times = d.bed.histogram(HistKind::DnsResponse, None);
    let (timed, sum_ns) = times.map_or((0, 0), |h| (h.count, h.sum_ns));
    let captured: Vec<u64> = run.exchanges.iter().filter_map(|e| e.took_ns(&run.rec.reference)).collect();
    let captured_ns: u64 = captured.iter().sum();
    let off_ms = (sum_ns as f64 - captured_ns as f64).abs() / 1e6 / captured.len().max(1) as f64;
    check(&mut failures, timed == 3 && captured.len() == 3 && off_ms < 2.0, || {
        format!("{timed} answers timed ({sum_ns} ns in all), {} captured ({captured_ns} ns)", captured.len())
    });
    eprintln!(
        "noresponse>{WAIT:?}: marked after {}\n{}",
        waits.join(", "),
        table(&[("dig, UDP".to_string(), run.row(&expected, matched))])
    );
    assert_none("noresponse", &failures);
}
