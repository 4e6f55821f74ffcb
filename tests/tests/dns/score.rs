//! A run scored against the clients' own record: per client, per path, the mirror and the counters.

use super::*;

/// One client's failed lookups against its events: lookups, flows its record says failed as
/// the rule covers, its events, those of such a flow, and such flows with an event.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClientScore {
    pub(crate) lookups: usize,
    pub(crate) failed: usize,
    pub(crate) events: usize,
    pub(crate) correct: usize,
    pub(crate) found: usize,
}

impl ClientScore {
    pub(crate) fn add(&mut self, o: &ClientScore) {
        self.lookups += o.lookups;
        self.failed += o.failed;
        self.events += o.events;
        self.correct += o.correct;
        self.found += o.found;
    }

    pub(crate) fn precision(&self) -> f64 {
        if self.events == 0 {
            1.0
        } else {
            self.correct as f64 / self.events as f64
        }
    }

    pub(crate) fn recall(&self) -> f64 {
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
    pub(crate) fn by_client(
        &self,
        covers: impl Fn(&Exchange) -> bool + Copy,
    ) -> Vec<(&'static str, ClientScore)> {
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
pub(crate) fn clients_table(scores: &[(String, &'static str, ClientScore)]) -> String {
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
pub(crate) fn check(failures: &mut Vec<String>, ok: bool, msg: impl FnOnce() -> String) {
    if !ok {
        failures.push(msg());
    }
}

/// The checks every run shares, their failures pushed to `failures`: the clients' record
/// against the capture (the harness), the events against the triggers `covers` says (the flow
/// of each, its question and rcode; the rule that matched, `rule_of`), the mirror against the
/// capture (no answer on it without its query), the flow table's marks, and the counters
/// against the capture. Returns the run's row.
pub(crate) fn verify(
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
    // A second query sent just before the mark may reach the classifier after it: copied with
    // its flow then, not replayed.
    let late = match expected.compare_mirror(&run.rec.mirror) {
        Ok(late) => late,
        Err(diff) => {
            failures.push(format!("mirror:\n{diff}"));
            0
        }
    };
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
        ("replayed", stat_idx::STAT_REPLAYED, (expected.replays() - late) as u64),
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
pub(crate) fn table(rows: &[(String, Table)]) -> String {
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
pub(crate) fn assert_none(what: &str, failures: &[String]) {
    assert!(failures.is_empty(), "{what}: {} failure(s)\n\n{}", failures.len(), failures.join("\n\n"));
}
