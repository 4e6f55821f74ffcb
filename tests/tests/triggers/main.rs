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

mod noresponse;
mod reset;
