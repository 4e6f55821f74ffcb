//! `noresponse>`: a request left unanswered, marked by a timer with no packet to tell.

use super::*;

/// One event as the test saw it arrive.
struct Arrival {
    /// When user space received it, monotonic ns.
    at: u64,
    ev: TriggerEvent,
    /// The flow's mark, read at once.
    mark: Option<MirrorMark>,
    /// Whether the held request had been answered then.
    answered: bool,
}

/// A noresponse run: the recording, the events as they arrived, the held request's flow, when
/// its request was sent and when its answer came (monotonic ns).
struct HeldRun {
    rec: Recording,
    arrivals: Vec<Arrival>,
    flow: FlowKey,
    sent: u64,
    answered: u64,
}

/// Runs `held` (which stores when it sent the request that is held and when its answer came)
/// beside plain traffic and a request held 500 ms (under the rule's time), polling events
/// meanwhile and reading each one's mark as it arrives.
fn noresponse_run(
    bed: &Testbed,
    held: impl FnOnce(SocketAddr, &AtomicU64, &AtomicU64) -> SocketAddr + Send,
) -> HeldRun {
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let ns = &bed.pod("client").ns;
    let events = bed.events();
    let (sent, answered) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut arrivals = Vec::new();
    let mut local = None;
    let rec = bed.record("client", || {
        thread::scope(|s| {
            let plain = s.spawn(|| plain_traffic(ns, server, Duration::from_millis(3500)));
            let short = s.spawn(|| {
                let _inside = ns.enter();
                raw::exchange_here(server, &[get("/ok"), get("/hold?delay_ms=500"), get("/ok")]).finals()
            });
            let held = s.spawn(|| {
                let _inside = ns.enter();
                held(server, &sent, &answered)
            });
            while !(held.is_finished() && plain.is_finished() && short.is_finished()) {
                for (at, ev) in events.poll(Duration::from_millis(10)) {
                    let mark = bed.dp.mark(&ev.key).expect("reading a mark");
                    arrivals.push(Arrival { at, ev, mark, answered: answered.load(Ordering::SeqCst) != 0 });
                }
            }
            local = Some(held.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            plain.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            let short = short.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            assert_eq!(short, [200, 200, 200]);
        })
    });
    let late = events.take();
    assert!(late.is_empty(), "events after the traffic: {late:?}");
    let flow = FlowKey::new(local.unwrap(), server, 6);
    HeldRun { rec, arrivals, flow, sent: sent.into_inner(), answered: answered.into_inner() }
}

/// Checks a noresponse run whose held request was `target`, answered 3 s late: one event, soon
/// after the rule's time, carrying the request, the flow marked before the answer; the mirror
/// from the answer on, with no replay by the data path (the agent makes it, at the mark); no
/// other flow marked. Returns the event.
#[track_caller]
fn check_noresponse(bed: &Testbed, run: &HeldRun, target: &str) -> TriggerEvent {
    let HeldRun { rec, arrivals, flow, sent, answered } = run;
    let (flow, sent, answered) = (*flow, *sent, *answered);
    let [a] = &arrivals[..] else {
        panic!("one event expected: {:?}", arrivals.iter().map(|a| &a.ev).collect::<Vec<_>>())
    };
    let ev = &a.ev;
    assert_eq!((ev.kind, ev.by, ev.status, ev.key), (TriggerKind::NoResponse, None, 0, flow), "{ev:?}");
    assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some("GET"), Some(target)));
    let waited = ev.request_to_response.expect("the event has the time waited");
    let (event_after, arrived_after) = (ev.ts_ns - sent, a.at - sent);
    eprintln!(
        "noresponse>1s: event's wait {:.3} ms; marked {:.3} ms and received {:.3} ms after the client sent; \
         answered {:.3} ms after",
        ms(waited.as_nanos() as u64),
        ms(event_after),
        ms(arrived_after),
        ms(answered - sent)
    );
    for (what, d) in
        [("the event's wait", waited.as_nanos() as u64), ("mark", event_after), ("arrival", arrived_after)]
    {
        let d = Duration::from_nanos(d);
        assert!(d >= NO_RESPONSE && d < NO_RESPONSE + LATE_MAX, "{what} {d:?} after the request");
    }
    let mark = a.mark.expect("the flow is marked when its event arrives");
    assert_eq!((mark.kind, mark.status), (TriggerKind::NoResponse, 0));
    assert!(!a.answered && mark.trigger_ns < answered, "the mark comes before the answer");
    assert!(answered - sent >= 3_000_000_000, "the answer came {:.3} ms after", ms(answered - sent));

    let expected = Expected::from_packets(&rec.reference, noresponse_point(&rec.reference, NO_RESPONSE));
    let expected = bed.check_since(rec, expected, &Snapshot::default());
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), [flow]);
    assert!(expected.untriggered().count() >= 5, "plain connections ran beside it");
    // The request of a mark made without a packet is replayed by the agent, from the event
    // (noresponse_replay.rs): the data path alone makes no replay of it, at the mark or with
    // the late answer.
    assert!(rec.mirror.replayed.is_empty(), "replayed by the data path: {:?}", rec.mirror.replayed);
    let request = request_packet(&rec.reference, flow, &format!("GET {target} "));
    let carried = ev.request.as_ref().expect("the event carries the request");
    assert_eq!(carried.payload(), Some(&request.payload[..]), "the event carries the request's segment");
    let first = rec.mirror.packets.iter().find(|c| c.flow() == flow).expect("copies of the flow");
    assert_eq!((first.src.port(), first.http_status()), (PORT, Some(200)), "the late answer is copied first");
    let c = bed.snapshot().counters.since(&Snapshot::default().counters);
    let counted = [
        stat_idx::STAT_NORESPONSE_TRIGGERS,
        stat_idx::STAT_REPLAYED,
        stat_idx::STAT_REPLAY_MISSED,
        stat_idx::STAT_REPLAY_FAILED,
        stat_idx::STAT_RINGBUF_DROPS,
        stat_idx::STAT_NORESPONSE_FAILED,
    ]
    .map(|k| c.get(k));
    assert_eq!(counted, [1, 0, 0, 0, 0, 0], "{c:?}");
    eprintln!("no-response ticks {}", c.get(stat_idx::STAT_NORESPONSE_TICKS));
    ev.clone()
}

/// A request held 3 s, after one answered at once on its connection, beside plain traffic and
/// a request held 500 ms: marked by `noresponse>1s` 1.0-1.2 s after it was sent, before the
/// answer; the event carries the request, and the data path does not replay it with the late
/// answer.
#[test]
fn noresponse_marks_a_request_held_too_long() {
    if !require_root() {
        return;
    }
    let bed = bed("noresponse>1s");
    let run = noresponse_run(&bed, |server, sent, answered| {
        let mut c = Conn::open(server);
        assert_eq!(finals(&c.round(&get("/ok"))), [200]);
        sent.store(monotonic_ns(), Ordering::SeqCst);
        let r = c.round(&get(HELD));
        answered.store(monotonic_ns(), Ordering::SeqCst);
        assert_eq!(finals(&r), [200]);
        c.local()
    });
    check_noresponse(&bed, &run, HELD);
}

/// Three requests written at once, the first held 3 s: one trigger, on the first; the request
/// its event carries is the segment that carried the three.
#[test]
fn noresponse_with_pipelined_requests() {
    if !require_root() {
        return;
    }
    let bed = bed("noresponse>1s");
    let round = [get(HELD), get("/ok"), get("/ok")].concat();
    let run = noresponse_run(&bed, |server, sent, answered| {
        let mut c = Conn::open(server);
        sent.store(monotonic_ns(), Ordering::SeqCst);
        let r = c.round(&round);
        answered.store(monotonic_ns(), Ordering::SeqCst);
        assert_eq!(finals(&r), [200, 200, 200]);
        c.local()
    });
    let ev = check_noresponse(&bed, &run, HELD);
    let request = request_packet(&run.rec.reference, run.flow, &format!("GET {HELD} "));
    assert_eq!(request.payload, round, "the three requests went in one segment");
    assert_eq!(ev.request.unwrap().payload(), Some(&round[..]));
}

/// `q`-quantile of sorted `v`.
fn quantile(v: &[i64], q: f64) -> i64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// "p50 / p99 / max" of how much later than `NO_RESPONSE` each of `waits` (ns) came.
fn lateness(waits: impl Iterator<Item = u64>) -> (String, i64) {
    let mut late: Vec<i64> = waits.map(|w| w as i64 - NO_RESPONSE.as_nanos() as i64).collect();
    if late.is_empty() {
        return ("no events".into(), i64::MAX);
    }
    late.sort_unstable();
    let (p50, p99, max) = (quantile(&late, 0.5), quantile(&late, 0.99), *late.last().unwrap());
    let in_ms = |ns: i64| ns as f64 / 1e6;
    (
        format!(
            "p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (min {:.3} ms)",
            in_ms(p50),
            in_ms(p99),
            in_ms(max),
            in_ms(late[0])
        ),
        p99,
    )
}

/// 10,000 connections at once, each with one request the server holds 2.5 s: every flow is
/// marked exactly once, each soon after its request's second; the lateness of the marks is
/// reported.
#[test]
fn noresponse_with_ten_thousand_requests_pending() {
    if !require_root() {
        return;
    }
    const CONNECTIONS: usize = 10_000;
    let bed = bed("noresponse>1s");
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let events = bed.events();
    let mut crowd =
        Crowd::start(&bed.pod("client").ns, server, CONNECTIONS, "/hold?delay_ms=2500", bed.dir.path());
    let mut arrivals = Vec::new();
    while crowd.running() {
        arrivals.extend(events.poll(Duration::from_millis(20)));
    }
    let held = crowd.finish(Duration::from_secs(5));
    arrivals.extend(events.poll(Duration::from_millis(100)));

    assert!(held.iter().all(|h| h.status == 200 && h.answered_ns - h.sent_ns >= 2_500_000_000));
    let by_flow: HashMap<FlowKey, &Held> =
        held.iter().map(|h| (FlowKey::new(h.local, server, 6), h)).collect();
    assert_eq!(by_flow.len(), CONNECTIONS);
    let mut seen = HashSet::new();
    for (_, ev) in &arrivals {
        assert!(by_flow.contains_key(&ev.key), "an event of another flow: {ev:?}");
        assert!(seen.insert(ev.key), "{}: a second event", ev.key);
        assert_eq!((ev.kind, ev.by, ev.status), (TriggerKind::NoResponse, None, 0), "{ev:?}");
        assert_eq!(ev.target.as_deref(), Some("/hold?delay_ms=2500"), "{ev:?}");
    }
    let marked: Vec<_> =
        bed.dp.flows().expect("reading flows").into_iter().filter(|f| f.mark.is_some()).collect();
    let c = bed.counters();
    let span = held.iter().map(|h| h.sent_ns).max().unwrap() - held.iter().map(|h| h.sent_ns).min().unwrap();
    let (wait, wait_p99) =
        lateness(arrivals.iter().map(|(_, ev)| ev.request_to_response.map_or(0, |d| d.as_nanos() as u64)));
    let (mark, mark_p99) = lateness(arrivals.iter().map(|(_, ev)| ev.ts_ns - by_flow[&ev.key].sent_ns));
    let (arrival, _) = lateness(arrivals.iter().map(|(at, ev)| at - by_flow[&ev.key].sent_ns));
    eprintln!(
        "{CONNECTIONS} requests held, sent over {:.0} ms: {} events, {} flows marked; {} ticks of the no-response timer",
        ms(span),
        arrivals.len(),
        marked.len(),
        c.get(stat_idx::STAT_NORESPONSE_TICKS)
    );
    eprintln!("lateness past 1 s, the event's wait: {wait}");
    eprintln!("lateness past 1 s, the mark after the client sent: {mark}");
    eprintln!("lateness past 1 s, the event received after the client sent: {arrival}");
    assert_eq!(c.get(stat_idx::STAT_RINGBUF_DROPS), 0, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_NORESPONSE_FAILED), 0, "the tick always ran: {c:?}");
    assert_eq!(seen.len(), CONNECTIONS, "every flow has its event");
    assert_eq!(marked.len(), CONNECTIONS, "every flow is marked, no other");
    for f in &marked {
        assert!(by_flow.contains_key(&f.key), "{} is marked", f.key);
        assert_eq!(f.mark.unwrap().kind, TriggerKind::NoResponse);
    }
    assert_eq!(c.get(stat_idx::STAT_NORESPONSE_TRIGGERS), CONNECTIONS as u64, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_TRIGGERS), CONNECTIONS as u64, "{c:?}");
    let bound = LATE_MAX.as_nanos() as i64;
    assert!(wait_p99 >= 0 && wait_p99 < bound, "p99 of the wait past 1 s: {wait}");
    assert!(mark_p99 < bound, "p99 of the mark past 1 s: {mark}");
}
