//! The request behind a trigger: kept by the classifier before the trigger, it reaches the
//! mirror ahead of the response (marked by its Ethernet source), and the event carries it.
//! Checked against the client's own capture: the replay is the request's segment as it passed.
//! Under a pipelining load on many connections at once, each trigger replays the request its
//! 500 answered, judged against what each client sent and received.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, FlowKey, MirrorDelivery, MirrorMethod};
use mirror_e2e::capture::pcap::Packet;
use mirror_e2e::oracles::http_stream;
use mirror_e2e::oracles::oracle::{self, check_replay, WantedReplay};
use mirror_e2e::scenario::{ALT, HTTP, PODS};
use mirror_e2e::topology::testbed::{Recording, Testbed};
use mirror_e2e::workload::raw;

/// How a test sets the mirror up.
struct Setup {
    mode: AttachMode,
    method: MirrorMethod,
    delivery: MirrorDelivery,
    v6: bool,
}

/// Rule `status=500`; one connection sends `rounds` to nginx (`/bar` answers 500); returns the
/// recording and the reference's segment of the request that triggered.
fn run(setup: &Setup, rounds: &[Vec<u8>]) -> (Testbed, Recording, Packet, Vec<mirror_bpf::TriggerEvent>) {
    let mut bed = Testbed::builder(&PODS)
        .nginx("server", HTTP)
        .mirror_via(setup.delivery)
        .rule("status=500")
        .attach(setup.mode, setup.method)
        .build();
    bed.replay_to_sink();
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(setup.v6), HTTP);
    let rec = bed.record("client", || {
        let ex = raw::exchange(&bed.pod("client").ns, server, rounds);
        assert_eq!(ex.finals(), [200, 500, 200]);
    });
    let events = events.take();
    let request = rec
        .reference
        .packets
        .iter()
        .find(|p| p.payload.starts_with(b"GET /bar "))
        .expect("the client sent GET /bar")
        .clone();
    (bed, rec, request, events)
}

/// The replay is the request's segment (as the client's capture has it, up to what was kept),
/// the first thing on the mirror, then the copies from the 500 on; counted, and in the event.
#[track_caller]
fn check(bed: &Testbed, rec: &Recording, request: &Packet, events: &[mirror_bpf::TriggerEvent]) {
    let expected = bed.check(rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1);
    assert_eq!(rec.mirror.replayed.len(), 1, "one replay: {:?}", rec.mirror.replayed);
    let replay = &rec.mirror.replayed[0];
    assert_eq!(replay.after_copies, 0, "the replay comes ahead of every copy");
    let p = &replay.packet;
    assert_eq!(
        (p.src, p.dst, p.seq, p.ack, p.flags),
        (request.src, request.dst, request.seq, request.ack, request.flags)
    );
    assert!(request.payload.starts_with(&p.payload), "the replay is the request's start");
    assert_eq!(p.len as usize, p.payload.len(), "its IP header says what it carries");
    assert_eq!(
        rec.mirror.packets.first().and_then(Packet::http_status),
        Some(500),
        "the response follows the replay"
    );
    let c = bed.counters();
    assert_eq!(c.get(stat_idx::STAT_REPLAYED), 1, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_FAILED), 0, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_MISSED), 0, "{c:?}");
    assert!(c.get(stat_idx::STAT_REPLAY_KEPT) >= 2, "{c:?}");
    assert_eq!(events.len(), 1, "{events:?}");
    let carried = events[0].request.as_ref().expect("the event carries the request");
    assert_eq!(carried.payload(), Some(&p.payload[..]), "the event has what the mirror got");
}

#[test]
fn request_behind_the_trigger_goes_ahead_of_the_response() {
    if !require_root() {
        return;
    }
    for (delivery, v6) in [(MirrorDelivery::Ingress, false), (MirrorDelivery::Egress, true)] {
        let setup = Setup { mode: AttachMode::Auto, method: MirrorMethod::Clone, delivery, v6 };
        let rounds = [raw::get("/foo"), raw::get("/bar"), raw::get("/foo")];
        let (bed, rec, request, events) = run(&setup, &rounds);
        assert_eq!(rec.mirror.replayed[0].packet.payload, request.payload, "{delivery:?}: kept whole");
        check(&bed, &rec, &request, &events);
    }
}

#[test]
fn request_behind_the_trigger_with_act_mirred() {
    if !require_root() {
        return;
    }
    let setup = Setup {
        mode: AttachMode::Tc,
        method: MirrorMethod::Mirred,
        delivery: MirrorDelivery::Egress,
        v6: false,
    };
    let rounds = [raw::get("/foo"), raw::get("/bar"), raw::get("/foo")];
    let (bed, rec, request, events) = run(&setup, &rounds);
    check(&bed, &rec, &request, &events);
}

#[test]
fn a_long_request_is_replayed_cut_with_its_length_fixed() {
    if !require_root() {
        return;
    }
    let setup = Setup {
        mode: AttachMode::Auto,
        method: MirrorMethod::Clone,
        delivery: MirrorDelivery::Ingress,
        v6: false,
    };
    let long = format!("GET /bar HTTP/1.1\r\nHost: test\r\nX-Pad: {}\r\n\r\n", "p".repeat(1200)).into_bytes();
    let rounds = [raw::get("/foo"), long, raw::get("/foo")];
    let (bed, rec, request, events) = run(&setup, &rounds);
    check(&bed, &rec, &request, &events);
    let p = &rec.mirror.replayed[0].packet;
    assert!(p.payload.len() < request.payload.len(), "cut: {} bytes", p.payload.len());
    assert!(p.payload.len() >= 500, "the first 512 bytes or so are kept: {}", p.payload.len());
    let carried = events[0].request.as_ref().unwrap();
    assert!(carried.wire_len as usize > carried.frame.len());
}

/// Connections of the pipelining load, all at once, and requests on each.
const CONNECTIONS: usize = 16;
const REQUESTS: usize = 20;

/// What connection `i` of the load sends: each request's target (`/fail?...` answered 500,
/// `/ok?...` 200 by the raw server; the query makes every request line unique) and how they
/// are written: in rounds of at most 4 (the requests a flow may have pending at once), each
/// round's responses read before the next, a round in one write or in several.
struct Plan {
    targets: Vec<String>,
    /// Per round, the requests of each write.
    rounds: Vec<Vec<usize>>,
}

impl Plan {
    fn new(i: usize) -> Plan {
        let mut fail = [false; REQUESTS];
        // Two connections never fail; the others first at a request that moves with i, for some
        // also at the next (in the same round or the next) or at the last.
        if i % 8 != 5 {
            let first = (i * 7 + 2) % REQUESTS;
            fail[first] = true;
            if i.is_multiple_of(3) && first + 1 < REQUESTS {
                fail[first + 1] = true;
            }
            if i % 4 == 1 {
                fail[REQUESTS - 1] = true;
            }
        }
        let targets =
            (0..REQUESTS).map(|r| format!("/{}?c={i}&r={r}", if fail[r] { "fail" } else { "ok" })).collect();
        let pattern: &[&[usize]] = match i % 4 {
            0 => &[&[4]],
            1 => &[&[2, 2]],
            2 => &[&[1, 1, 1]],
            _ => &[&[3], &[1]],
        };
        let mut rounds = Vec::new();
        let mut left = REQUESTS;
        for round in pattern.iter().cycle() {
            if left == 0 {
                break;
            }
            let mut writes = Vec::new();
            for &w in *round {
                let w = w.min(left);
                if w > 0 {
                    writes.push(w);
                    left -= w;
                }
            }
            rounds.push(writes);
        }
        Plan { targets, rounds }
    }

    /// The bytes of each write, by round.
    fn writes(&self) -> Vec<Vec<Vec<u8>>> {
        let mut targets = self.targets.iter();
        self.rounds
            .iter()
            .map(|round| {
                round.iter().map(|&w| targets.by_ref().take(w).flat_map(|t| raw::get(t)).collect()).collect()
            })
            .collect()
    }
}

/// What one connection sent and received, by the client's own record.
struct Client {
    flow: FlowKey,
    targets: Vec<String>,
    statuses: Vec<u16>,
}

impl Client {
    /// The first request answered 500: the one its flow's trigger answered.
    fn first_500(&self) -> Option<usize> {
        self.statuses.iter().position(|s| *s == 500)
    }
}

#[test]
fn pipelining_connections_replay_the_request_of_each_first_500() {
    if !require_root() {
        return;
    }
    let start = Instant::now();
    let mut bed = Testbed::builder(&PODS).raw_server("server", ALT).rule("status=500").build();
    bed.replay_to_sink();
    bed.capture_buffer_kib(64 * 1024);
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(false), ALT);
    let client_ns = &bed.pod("client").ns;
    let mut clients: Vec<Client> = Vec::new();
    let rec = bed.record("client", || {
        std::thread::scope(|scope| {
            let running: Vec<_> = (0..CONNECTIONS)
                .map(|i| {
                    scope.spawn(move || {
                        let _inside = client_ns.enter();
                        let plan = Plan::new(i);
                        let ex = raw::exchange_writes_here(server, &plan.writes());
                        Client {
                            flow: FlowKey::new(ex.local, server, 6),
                            targets: plan.targets,
                            statuses: ex.statuses(),
                        }
                    })
                })
                .collect();
            clients = running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect();
        });
    });
    for c in &clients {
        let want: Vec<u16> =
            c.targets.iter().map(|t| if t.starts_with("/fail") { 500 } else { 200 }).collect();
        assert_eq!(c.statuses, want, "{}: the server's answers", c.flow);
    }
    let failing: BTreeMap<FlowKey, &Client> =
        clients.iter().filter(|c| c.first_500().is_some()).map(|c| (c.flow, c)).collect();
    // The load is what it means to be: pipelined, with 500s, and some connections without.
    let segments = rec.reference.packets.iter().filter(|p| p.payload.starts_with(b"GET ")).count();
    let pipelined = rec
        .reference
        .packets
        .iter()
        .filter(|p| p.payload.windows(5).filter(|w| w == b"GET /").count() > 1)
        .count();
    assert!(
        failing.len() >= CONNECTIONS / 2 && failing.len() < CONNECTIONS,
        "{} connections got a 500",
        failing.len()
    );
    assert!(pipelined >= CONNECTIONS, "{pipelined} of {segments} request segments carried several requests");

    // The copies: from each first 500 on, once, nothing else (the classifier's counts agree).
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), failing.len(), "{:?}", expected.triggered);

    // Each trigger's replay: the segment of the request its 500 answered, as the client's
    // capture has it, ahead of the flow's copies; the event names that request and carries the
    // segment replayed.
    let conversations = http_stream::conversations(&rec.reference);
    let events = events.take();
    let mut wrong: Vec<String> = Vec::new();
    let mut named: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for e in &events {
        *named.entry(e.key).or_default() += 1;
        let Some(client) = failing.get(&e.key) else {
            wrong.push(format!("{}: an event, but the client got no 500", e.key));
            continue;
        };
        let k = client.first_500().expect("a 500");
        let target = &client.targets[k];
        let line = format!("GET {target} ");
        let conversation = conversations.iter().find(|c| c.flow == e.key);
        // Packets handled as the 500 was, on another CPU, may reach the mirror's reader first.
        let near = conversation
            .and_then(|c| c.responses.get(k))
            .map_or_else(Vec::new, |r| oracle::near(&rec.reference, r.packet));
        let segment = conversation
            .and_then(|c| c.requests.get(k))
            .filter(|q| q.target == *target)
            .map(|q| &rec.reference.packets[q.packet])
            .unwrap_or_else(|| panic!("{}: request {k} ({target}) is not in the client's capture", e.key));
        let mut why = Vec::new();
        if e.target.as_deref() != Some(target.as_str()) {
            why.push(format!("the event names {:?} {:?}", e.method, e.target));
        }
        match check_replay(&rec.mirror, &WantedReplay { keys: &[e.key], segment, line: &line, near: &near }) {
            Ok(r) => {
                let carried = e.request.as_ref().and_then(|q| q.payload());
                if carried != Some(&r.packet.payload[..]) {
                    why.push(format!(
                        "the event carries {:?}",
                        carried.map(|c| String::from_utf8_lossy(c).into_owned())
                    ));
                }
            }
            Err(e) => why.push(e),
        }
        if !why.is_empty() {
            wrong.push(format!("{} (request {k}, {target}): {}", e.key, why.join("; ")));
        }
    }
    let correct = events.len() - wrong.len();
    for flow in failing.keys() {
        let n = named.get(flow).copied().unwrap_or(0);
        if n != 1 {
            wrong.push(format!("{flow}: {n} events, one expected"));
        }
    }
    let c = bed.counters();
    let counted = (
        c.get(stat_idx::STAT_REPLAYED),
        c.get(stat_idx::STAT_REPLAY_MISSED),
        c.get(stat_idx::STAT_REPLAY_FAILED),
    );
    if counted != (failing.len() as u64, 0, 0) || rec.mirror.replayed.len() != failing.len() {
        wrong.push(format!(
            "replayed, missed, failed counted {counted:?}; {} replays on the sink, {} connections got a 500",
            rec.mirror.replayed.len(),
            failing.len()
        ));
    }
    eprintln!(
        "pipelining: {CONNECTIONS} connections x {REQUESTS} requests, {} got a 500, {pipelined} of {segments} \
         request segments pipelined; {correct}/{} trigger events replayed their 500's request first ({:.1} s)",
        failing.len(),
        events.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        wrong.is_empty(),
        "{correct}/{} trigger events replayed the request of their first 500 ahead of the flow's copies \
         ({} connections got a 500):\n{}",
        events.len(),
        failing.len(),
        wrong.join("\n")
    );
}
