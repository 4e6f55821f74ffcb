//! Lookups through a kubelet's resolv.conf: the search path's NXDOMAINs are not failures.

use super::*;

/// The names looked up through the kubelet-like resolv.conf, each with the NXDOMAINs its lookup
/// gets (two per candidate that fails: A and AAAA): an external name that does not exist, asked
/// as given after the search list (its three expansions and itself); another with `ndots` dots,
/// asked as given first; a name of the cluster found by the search list's second candidate (one
/// NXDOMAIN pair before it); an external name found as given after the whole list; a name of
/// the cluster's zone that does not exist (each of its candidates in the zone).
pub(crate) const SEARCHED: [(&str, usize); 5] = [
    ("api.partner.example", 8),
    ("a.b.c.d.e.example", 8),
    ("kube-dns.kube-system", 2),
    ("good.test", 6),
    ("nosuch.kube-system.svc.cluster.local", 8),
];

/// The cluster's zone, where the kubelet's search domains are.
pub(crate) const ZONE: &str = "cluster.local";

/// The search-path mode: NXDOMAINs of names outside the cluster's zone.
pub(crate) const OUTSIDE_ZONE: &str = "dns=nxdomain qname=!.cluster.local";

/// Whether `name` is the cluster's zone or under it.
pub(crate) fn in_zone(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == ZONE || name.ends_with(&format!(".{ZONE}"))
}

/// What a rule covers, by the exchange.
pub(crate) type Covers = fn(&Exchange) -> bool;

/// What `dns=nxdomain` covers.
pub(crate) fn nxdomain(e: &Exchange) -> bool {
    e.rcode == Some(Rcode::NXDOMAIN)
}

/// What [`OUTSIDE_ZONE`] covers.
pub(crate) fn nxdomain_outside_zone(e: &Exchange) -> bool {
    nxdomain(e) && !in_zone(&e.qname)
}

/// One lookup of [`SEARCHED`] under one rule: its NXDOMAINs, its events (each with the name it
/// names) and what the mirror carried of its sockets: queries replayed, queries copied (sent
/// after the mark), answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Searched {
    pub(crate) nx: usize,
    pub(crate) events: Vec<String>,
    pub(crate) replays: usize,
    pub(crate) queries: usize,
    pub(crate) answers: usize,
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
pub(crate) fn dns_search_path_lookups_through_a_kubelet_resolv_conf() {
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
pub(crate) fn lookups_tried(conf: &ResolvConf, run: &Run) -> Vec<(usize, usize, usize)> {
    SEARCHED
        .iter()
        .map(|(name, _)| {
            let lookup = SearchLookup::new(&run.exchanges, &conf.candidates(name));
            (lookup.tried.len(), lookup.exchanges.len(), lookup.sockets.len())
        })
        .collect()
}
