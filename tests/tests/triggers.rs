//! The triggers that are not a response's status, against a real server (asyncio, which
//! resets or holds a request when asked) and real clients: `reset`, a TCP RST of an
//! established HTTP connection from either side, and `noresponse>`, a request left unanswered,
//! marked by a timer with no packet to tell. The mirror is checked against what the client's
//! capture says it must carry, the trigger event against the client's own record (its
//! addresses, when it sent and when it got answers), the replay against the request's segment
//! as the client sent it; plain connections beside them must not be mirrored at all.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use mirror_bpf::flow::monotonic_ns;
use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{Counters, FlowKey, MirrorMark, Side, TriggerEvent, TriggerKind};
use mirror_e2e::capture::pcap::{Packet, Trace};
use mirror_e2e::oracles::http_stream::{Conversation, Response};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::Netns;
use mirror_e2e::topology::testbed::{Recording, Snapshot, Testbed};
use mirror_e2e::workload::crowd::{Crowd, Held};
use mirror_e2e::workload::raw::{self, get, Conn};

/// The asyncio server's port.
const PORT: u16 = 8080;

/// A TCP RST.
const RST: u8 = 0x04;

/// A request the server answers 3 s late.
const HELD: &str = "/hold?delay_ms=3000";

/// The noresponse rule's time.
const NO_RESPONSE: Duration = Duration::from_secs(1);

/// How late past [`NO_RESPONSE`] a mark may come.
const LATE_MAX: Duration = Duration::from_millis(200);

/// The asyncio server in the server pod, the rule, replays to the sink.
fn bed(rule: &str) -> Testbed {
    let mut bed = Testbed::builder(&PODS).asyncio_server("server", PORT).rule(rule).build();
    bed.replay_to_sink();
    bed
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn finals(responses: &[Response]) -> Vec<u16> {
    responses.iter().filter(|r| !r.interim()).map(|r| r.status).collect()
}

/// Plain traffic beside the connections under test, from `ns`: three keep-alive connections
/// sending `/ok` every 25 ms and one-request connections one after another, for `span`; every
/// answer must be 200. Returns how many connections it made.
fn plain_traffic(ns: &Netns, server: SocketAddr, span: Duration) -> usize {
    let rounds = (span.as_millis() / 25) as usize;
    thread::scope(|s| {
        let keepalive: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(move || {
                    let _inside = ns.enter();
                    let mut c = Conn::open(server);
                    for _ in 0..rounds {
                        assert_eq!(finals(&c.round(&get("/ok"))), [200]);
                        thread::sleep(Duration::from_millis(25));
                    }
                })
            })
            .collect();
        let single = s.spawn(move || {
            let _inside = ns.enter();
            for _ in 0..rounds / 4 {
                assert_eq!(raw::exchange_here(server, &[get("/ok")]).finals(), [200]);
                thread::sleep(Duration::from_millis(100));
            }
        });
        for t in keepalive {
            t.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
        single.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        3 + rounds / 4
    })
}

/// The reset oracle: a connection is mirrored from its first RST after a request; the request
/// behind it is the latest before the RST.
fn reset_point(trace: &Trace) -> impl Fn(&Conversation, &[usize]) -> Option<(usize, Option<usize>)> + '_ {
    move |c, packets| {
        let first_request = c.requests.first()?.packet;
        let at = packets.iter().copied().find(|&i| i > first_request && trace.packets[i].flags & RST != 0)?;
        Some((at, c.requests.iter().rposition(|q| q.packet < at)))
    }
}

/// The noresponse oracle: a request whose answer had not begun `threshold` after it (or never
/// came) marks its connection then; the first packet after that is the first mirrored.
fn noresponse_point(
    trace: &Trace,
    threshold: Duration,
) -> impl Fn(&Conversation, &[usize]) -> Option<(usize, Option<usize>)> + '_ {
    let ts = |i: usize| trace.packets[i].ts_ns;
    move |c, packets| {
        let mut first: Option<(u64, usize)> = None;
        for (k, q) in c.requests.iter().enumerate() {
            let deadline = ts(q.packet) + threshold.as_nanos() as u64;
            let answer = c.responses.iter().find(|r| r.request == Some(k)).map(|r| ts(r.first_packet));
            if answer.is_none_or(|a| a > deadline) && first.is_none_or(|(d, _)| deadline < d) {
                first = Some((deadline, k));
            }
        }
        let (deadline, k) = first?;
        let at = packets.iter().copied().find(|&i| ts(i) > deadline)?;
        Some((at, Some(k)))
    }
}

/// The client's segment of the request of `flow` that starts with `start`.
#[track_caller]
fn request_packet<'a>(trace: &'a Trace, flow: FlowKey, start: &str) -> &'a Packet {
    trace
        .packets
        .iter()
        .find(|p| p.flow() == flow && p.payload.starts_with(start.as_bytes()))
        .unwrap_or_else(|| panic!("{flow}: no request {start:?} in the client's capture"))
}

/// The one event of `flow`.
#[track_caller]
fn event_of(events: &[TriggerEvent], flow: FlowKey) -> &TriggerEvent {
    match &events.iter().filter(|e| e.key == flow).collect::<Vec<_>>()[..] {
        [ev] => ev,
        other => panic!("{flow}: one event expected: {other:?}"),
    }
}

/// The replay of `request`'s flow on the mirror: one, that segment as the client sent it,
/// ahead of every copy of its flow; the event carries the same. Returns the first copy after it.
#[track_caller]
fn assert_replayed<'a>(rec: &'a Recording, request: &Packet, ev: &TriggerEvent) -> &'a Packet {
    let flow = request.flow();
    let replay = match &rec.mirror.replayed.iter().filter(|r| r.packet.flow() == flow).collect::<Vec<_>>()[..]
    {
        [r] => *r,
        other => panic!("{flow}: one replay expected: {other:?}"),
    };
    let p = &replay.packet;
    assert_eq!(
        (p.src, p.dst, p.seq, p.ack, p.flags, &p.payload),
        (request.src, request.dst, request.seq, request.ack, request.flags, &request.payload),
        "the replay is the request's segment"
    );
    let copies = &rec.mirror.packets;
    assert!(
        copies[..replay.after_copies].iter().all(|c| c.flow() != flow),
        "{flow}: a copy came ahead of the replay"
    );
    let carried = ev.request.as_ref().expect("the event carries the request");
    assert_eq!(carried.payload(), Some(&p.payload[..]), "the event has what the mirror got");
    copies[replay.after_copies..]
        .iter()
        .find(|c| c.flow() == flow)
        .unwrap_or_else(|| panic!("{flow}: no copy after the replay"))
}

/// The counters of the kind's triggers and of replays since `since`: `n` of each, none missed.
#[track_caller]
fn assert_counted(bed: &Testbed, since: &Snapshot, kind: stat_idx, n: u64) -> Counters {
    let c = bed.snapshot().counters.since(&since.counters);
    assert_eq!(c.get(kind), n, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAYED), n, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_MISSED), 0, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_FAILED), 0, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_RINGBUF_DROPS), 0, "{c:?}");
    c
}

/// `took` (a reset's request_to_response) matches the gap between the request and the RST in
/// the client's capture, within 20 ms (the classifier sees both a hop away from it).
#[track_caller]
fn assert_took(took: Option<Duration>, request: &Packet, rst: &Packet) {
    let took = took.expect("a reset's event has the time from its request");
    let gap = rst.ts_ns - request.ts_ns;
    let diff = took.as_nanos() as i64 - gap as i64;
    assert!(diff.abs() < 20_000_000, "request to reset: event {took:?}, capture {:.3} ms", ms(gap));
}

/// The RST of `flow` in a trace.
#[track_caller]
fn rst_of(trace: &Trace, flow: FlowKey) -> &Packet {
    trace
        .packets
        .iter()
        .find(|p| p.flow() == flow && p.flags & RST != 0)
        .unwrap_or_else(|| panic!("{flow}: no RST"))
}

/// The server resets a connection (SO_LINGER 0, then close) after reading `/abort`, on a
/// keep-alive connection after three requests answered (IPv4) and on a connection of that
/// request alone (IPv6), while plain connections run beside it: that connection alone is
/// marked, from the RST, and `/abort` is replayed ahead of the RST's copy.
#[test]
fn server_reset_marks_the_connection_and_replays_the_request() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let rule = bed.rule_ids()[0];
    let events = bed.events();
    for (answered_before, v6) in [(3, false), (0, true)] {
        let since = bed.snapshot();
        let server = SocketAddr::new(bed.pod("server").addr(v6), PORT);
        let ns = &bed.pod("client").ns;
        let mut aborted = None;
        let rec = bed.record("client", || {
            thread::scope(|s| {
                let plain = s.spawn(|| plain_traffic(ns, server, Duration::from_millis(400)));
                let _inside = ns.enter();
                thread::sleep(Duration::from_millis(100));
                let mut c = Conn::open(server);
                for _ in 0..answered_before {
                    assert_eq!(finals(&c.round(&get("/ok"))), [200]);
                }
                c.send(&get("/abort"));
                aborted = Some(c.local());
                c.expect_reset();
                plain.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            })
        });
        let flow = FlowKey::new(aborted.unwrap(), server, 6);
        let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
        let expected = bed.check_since(&rec, expected, &since);
        assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), [flow]);
        assert!(expected.untriggered().count() >= 4, "plain connections ran beside it");
        assert_eq!(expected.triggered[0].target.as_deref(), Some("/abort"));
        let rst = rst_of(&rec.reference, flow);
        assert_eq!(rst.src, server, "the server reset it");
        let mirrored: Vec<_> = rec.mirror.packets.iter().map(Packet::id).collect();
        assert_eq!(mirrored, [rst.id()], "the mirror has the RST and nothing else");
        assert_eq!(rec.mirror.replayed.len(), 1, "one replay: {:?}", rec.mirror.replayed);

        let events = events.take();
        let ev = event_of(&events, flow);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (ev.kind, ev.by, ev.status, ev.rule_id),
            (TriggerKind::Reset, Some(Side::Server), 0, rule)
        );
        assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some("GET"), Some("/abort")));
        let request = request_packet(&rec.reference, flow, "GET /abort ");
        assert_took(ev.request_to_response, request, rst);
        assert_eq!(assert_replayed(&rec, request, ev).id(), rst.id(), "the RST follows the replay");
        assert_counted(&bed, &since, stat_idx::STAT_RESET_TRIGGERS, 1);
    }
}

/// The client resets two connections (SO_LINGER 0, then close): one while its request waits
/// on the server (held 1 s), one after its request was answered. Both are marked, by the
/// client; the request behind each is the one pending, else the latest.
#[test]
fn client_reset_marks_the_connection() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let ns = &bed.pod("client").ns;
    let (mut after_answer, mut pending) = (None, None);
    let rec = bed.record("client", || {
        thread::scope(|s| {
            let plain = s.spawn(|| plain_traffic(ns, server, Duration::from_millis(500)));
            let _inside = ns.enter();
            thread::sleep(Duration::from_millis(50));
            let mut c = Conn::open(server);
            assert_eq!(finals(&c.round(&get("/ok"))), [200]);
            thread::sleep(Duration::from_millis(50));
            after_answer = Some(c.local());
            c.abort();
            let mut c = Conn::open(server);
            c.send(&get("/hold?delay_ms=1000"));
            thread::sleep(Duration::from_millis(100));
            pending = Some(c.local());
            c.abort();
            plain.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        })
    });
    let flows = [after_answer, pending].map(|local| FlowKey::new(local.unwrap(), server, 6));
    let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
    let expected = bed.check_since(&rec, expected, &Snapshot::default());
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), flows);
    assert_eq!(rec.mirror.replayed.len(), 2, "a replay each: {:?}", rec.mirror.replayed);
    let events = events.take();
    assert_eq!(events.len(), 2, "{events:?}");
    for (flow, target) in flows.into_iter().zip(["/ok", "/hold?delay_ms=1000"]) {
        let ev = event_of(&events, flow);
        assert_eq!((ev.kind, ev.by, ev.status), (TriggerKind::Reset, Some(Side::Client), 0), "{ev:?}");
        assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some("GET"), Some(target)));
        let rst = rst_of(&rec.reference, flow);
        assert_ne!(rst.src, server, "the client reset it");
        let request = request_packet(&rec.reference, flow, &format!("GET {target} "));
        assert_took(ev.request_to_response, request, rst);
        assert_eq!(assert_replayed(&rec, request, ev).id(), rst.id(), "the RST reaches the mirror");
    }
    assert_counted(&bed, &Snapshot::default(), stat_idx::STAT_RESET_TRIGGERS, 2);
}

/// RSTs of connections that carried no request do not trigger: the answer to a SYN to a
/// closed port, and a connection the client resets before sending anything. A connection the
/// server resets after a request, last, shows the rule was live.
#[test]
fn reset_without_an_http_request_does_not_trigger() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let closed = SocketAddr::new(server.ip(), 9);
    let mut control = None;
    let rec = bed.record("client", || {
        raw::in_ns(&bed.pod("client").ns, || {
            let refused = std::net::TcpStream::connect_timeout(&closed, Duration::from_secs(2));
            assert_eq!(refused.map_err(|e| e.kind()).err(), Some(std::io::ErrorKind::ConnectionRefused));
            let c = Conn::open(server);
            thread::sleep(Duration::from_millis(20));
            c.abort();
            thread::sleep(Duration::from_millis(20));
            let mut c = Conn::open(server);
            c.send(&get("/abort"));
            control = Some(c.local());
            c.expect_reset();
        })
    });
    let resets: Vec<&Packet> = rec.reference.packets.iter().filter(|p| p.flags & RST != 0).collect();
    assert_eq!(resets.len(), 3, "the port's answer, the client's reset, the control's: {resets:?}");
    assert_eq!(resets[0].src, closed, "the closed port answered with a RST");
    let control = FlowKey::new(control.unwrap(), server, 6);
    let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
    let expected = bed.check_since(&rec, expected, &Snapshot::default());
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), [control]);
    let events = events.take();
    assert_eq!(events.iter().map(|e| e.key).collect::<Vec<_>>(), [control], "{events:?}");
    assert_counted(&bed, &Snapshot::default(), stat_idx::STAT_RESET_TRIGGERS, 1);
}

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
