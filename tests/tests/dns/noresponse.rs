//! Queries left unanswered, marked by `noresponse>`.

use super::*;

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
pub(crate) fn dns_queries_left_unanswered_are_marked_by_noresponse() {
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
