//! Failures mirrored with their query: every path, every client, both resolvers; a thousand
//! lookups; the qname and qtype filters; slow answers and latency rules.

use super::*;

/// The lookups of the mix, by dig over UDP: names that resolve, do not exist, fail upstream
/// (SERVFAIL) and are refused upstream (REFUSED, not covered by the rule).
pub(crate) const MIX: [(&str, QType); 9] = [
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
pub(crate) const MIX6: [(&str, QType); 4] = [
    ("good.test", QType::AAAA),
    ("missing-6.test", QType::A),
    ("d.fail.test", QType::AAAA),
    ("good.test", QType::A),
];

/// Over TCP (a connection per lookup): the failures trigger as over UDP.
pub(crate) const MIX_TCP: [(&str, QType); 3] =
    [("missing-tcp.test", QType::A), ("e.fail.test", QType::A), ("good.test", QType::AAAA)];

/// By getaddrinfo (absolute names: no search list applies).
pub(crate) const MIX_GAI: [&str; 3] = ["good.test.", "missing-gai.test.", "f.fail.test."];

/// By Go's resolver (A and AAAA at once, each on a socket of its own; absolute names).
pub(crate) const MIX_GO: [&str; 4] = ["good.test.", "missing-go.test.", "g.fail.test.", "h.refused.test."];

/// Whether the rule [`FAILURES`] covers an exchange.
pub(crate) fn failed(e: &Exchange) -> bool {
    matches!(e.rcode, Some(Rcode::NXDOMAIN | Rcode::SERVFAIL))
}

/// The mix of lookups along `path` to the resolver `kind`, rule [`FAILURES`]: the clients'
/// record and the checks of [`verify`]. Returns the row and the failures.
pub(crate) fn failures_along(
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
pub(crate) const PATHS: [Path; 4] = [
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
pub(crate) fn dns_failures_are_mirrored_with_their_query() {
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
pub(crate) fn check_go(go: &Option<PathBuf>) {
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
pub(crate) fn dns_failures_under_a_thousand_lookups() {
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
pub(crate) fn dns_qname_and_qtype_filters_pick_the_failures() {
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
pub(crate) fn dns_slow_answers_trigger_latency_rules() {
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
