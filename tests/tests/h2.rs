//! HTTP/2 cleartext and gRPC on real stacks, end to end: the classifier follows HTTP/2 on each
//! pod's veth, and rules on a response's `:status` or a call's `grpc-status` mark the
//! connection at the packet carrying that HEADERS frame ([`mirror_e2e::workload::h2_scenario`]).
//!
//! Servers, each in a pod of its own: grpc-go, grpcio (Python) and @grpc/grpc-js (Node), each
//! failing the calls whose request asks for it; nginx serving h2c with prior knowledge (`/fail`
//! 500); an h2c server on the h2 package that also takes `Upgrade: h2c`. Clients, from one pod,
//! all at once: each gRPC stack's own (channels of calls one after another, or all at once),
//! `nghttp` and `h2load` (nghttp2), `curl --http2-prior-knowledge` and `curl --http2` (the
//! upgrade). Rules: `status=500`, `grpc-status=internal,unavailable`, and `grpc-status=not_found
//! path=/mirror.Inventory/` (a NOT_FOUND elsewhere does not trigger).
//!
//! What each client recorded (per call: its connection's port, stream or index, status) is the
//! truth. First the harness: the oracle reading the client's capture (HTTP/2 frames, HPACK)
//! agrees with the clients, and tshark reads that capture as the oracle does. Then the
//! classifier: the connections the trigger events and the flow table's marks name are exactly
//! those with a call the rules match (precision and recall 1.0, a table per stack); each event
//! says what triggered (kind, code, stream, request, authority); from the packet of each such
//! connection's first matching HEADERS on, every packet of both directions is on the mirror
//! exactly once, nothing else; replayed requests only ahead of triggered flows; the HTTP/2
//! counters agree with the capture. And what tshark reads on the mirror is what a reader that
//! starts mid-connection can decode ([`h2_oracle::late_view`]: the replayed request first, then
//! the copies; HPACK entries inserted before are unknown to it): every HTTP/2 frame and the
//! fields it can resolve (tshark's gRPC dissector left out: it aborts segments whose streams'
//! headers it could not read), and, told the port is gRPC, every gRPC message.
//!
//! Then once through a ClusterIP (kube-proxy's NAT in the node): grpc-go behind a Service, one
//! flow mirrored from its INTERNAL trailers on, in both of its tuples.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mirror_bpf::testing::{in_ci, require_root};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, Counters, FlowKey, MirrorMethod, TriggerEvent, TriggerKind};
use mirror_e2e::capture::pcap::{Packet, PacketId, Trace};
use mirror_e2e::capture::tshark::{self, Aspects, Decode};
use mirror_e2e::oracles::h2_oracle::{self, frame, H2Expected, H2Kind, H2Rule, H2Trigger, LateDirection};
use mirror_e2e::oracles::nat_oracle::{self, CopyPoints, NatExpected, Point};
use mirror_e2e::oracles::oracle;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, SERVICE_PORT};
use mirror_e2e::topology::netns::MIRROR_SINK;
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::h2_scenario::{
    self, channel, grpc_conns, Stacks, GREETER, GRPC_PORT, PORTS, ROLES, RULES,
};
use mirror_e2e::workload::h2_stacks::{self, Grpc, GrpcPlan};
use mirror_e2e::workload::servers;

/// The one file of `dir` whose name starts with `prefix` (a recording's capture).
#[track_caller]
fn only_file(dir: &Path, prefix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("reading the test's dir")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .collect();
    assert_eq!(found.len(), 1, "one {prefix}* in {}: {found:?}", dir.display());
    found[0].clone()
}

/// The columns of a row of the table after its connections (the connections failed after
/// them all): the indices of `Row::counts`.
const CALLS: usize = 0;
const FAILING_CALLS: usize = 1;

/// One row of the table.
type Row = oracle::Row<2>;

/// Pushes `msg` when `ok` is false.
fn check(failures: &mut Vec<String>, ok: bool, msg: impl FnOnce() -> String) {
    if !ok {
        failures.push(msg());
    }
}

/// The event of a trigger as the spec has it: its kind and code, stream, request and
/// authority. What differs.
fn check_event(e: &TriggerEvent, t: &H2Trigger) -> Option<String> {
    let mut wrong = Vec::new();
    let kind = match t.kind {
        H2Kind::Status => TriggerKind::Status,
        H2Kind::Grpc => TriggerKind::Grpc,
    };
    if (e.kind, u32::from(e.status)) != (kind, t.code) {
        wrong.push(format!("kind {:?} status {}, expected {kind:?} {}", e.kind, e.status, t.code));
    }
    if e.stream != Some(t.stream) {
        wrong.push(format!("stream {:?}, expected {}", e.stream, t.stream));
    }
    match &t.request {
        Some(r) => {
            let target: String = r.path.chars().take(64).collect();
            if (e.method.as_deref(), e.target.as_deref()) != (Some(r.method.as_str()), Some(target.as_str()))
            {
                wrong.push(format!("request {:?} {:?}, expected {} {target}", e.method, e.target, r.method));
            }
            // The upgrade's request is HTTP/1.1: its Host is no :authority, either is right. An
            // IPv6 literal may keep its brackets.
            let upgraded = t.stream == 1 && r.method == "GET" && e.authority.is_none();
            let authority = r.authority.as_deref().map(|a| h2_oracle::host_of(a).to_ascii_lowercase());
            let bracketed = authority.as_ref().map(|a| format!("[{a}]"));
            if e.authority != authority && e.authority != bracketed && !upgraded {
                wrong.push(format!("authority {:?}, expected {authority:?}", e.authority));
            }
        }
        None => wrong.push("the oracle saw no request".to_string()),
    }
    (!wrong.is_empty()).then(|| format!("event of {} (stream {}): {}", t.flow, t.stream, wrong.join("; ")))
}

/// Each triggered flow that reached the mirror as a reader of the mirror sees it: the request
/// replayed ahead, if any, then the copies from its trigger's packet on. (A flow missing from
/// the mirror is reported by the comparison of the copies.)
fn mirror_views(e: &H2Expected, reference: &Trace, mirror: &Trace) -> Vec<(FlowKey, Vec<LateDirection>)> {
    let on_mirror: BTreeSet<FlowKey> = mirror.packets.iter().map(|p| p.flow()).collect();
    e.triggers
        .iter()
        .filter(|t| on_mirror.contains(&t.flow))
        .map(|t| {
            let c = e.conversation(t.flow).expect("a triggered conversation");
            let replayed: Vec<&Packet> =
                mirror.replayed.iter().map(|r| &r.packet).filter(|p| p.flow() == t.flow).collect();
            (t.flow, h2_oracle::late_view(c, reference, t.packet, &replayed))
        })
        .collect()
}

/// The client's segments that carried the first and the last byte of `t`'s request: its
/// HEADERS frame, or for stream 1 of an upgrade the HTTP/1.1 request.
fn request_segments<'a>(e: &H2Expected, t: &H2Trigger, reference: &'a Trace) -> Vec<&'a Packet> {
    let Some(d) = e.conversation(t.flow).and_then(|c| c.to_server.as_ref()) else { return Vec::new() };
    let frame = d
        .blocks
        .iter()
        .find(|b| b.stream == t.stream && b.kind == frame::HEADERS)
        .map(|b| &d.frames[b.frame]);
    let (first, last) = match frame {
        Some(f) => (f.first_packet, f.packet),
        None if t.stream == 1 && d.start == h2_oracle::Start::Upgrade => {
            (d.bytes.packet_at(0), d.bytes.packet_at(d.frames_at - h2_oracle::PREFACE.len() - 1))
        }
        None => return Vec::new(),
    };
    vec![&reference.packets[first], &reference.packets[last]]
}

/// The counters of the HTTP/2 stage and the copies, for reports.
fn h2_counters(c: &Counters) -> String {
    let names = [
        ("h2_connections", stat_idx::STAT_H2_CONNECTIONS),
        ("h2_requests", stat_idx::STAT_H2_REQUESTS),
        ("h2_responses", stat_idx::STAT_H2_RESPONSES),
        ("h2_trailers", stat_idx::STAT_H2_TRAILERS),
        ("h2_unresolved", stat_idx::STAT_H2_UNRESOLVED),
        ("h2_lost", stat_idx::STAT_H2_LOST),
        ("h2_continuation", stat_idx::STAT_H2_CONTINUATION),
        ("h2_stream_missed", stat_idx::STAT_H2_STREAM_MISSED),
        ("grpc_triggers", stat_idx::STAT_GRPC_TRIGGERS),
        ("triggers", stat_idx::STAT_TRIGGERS),
        ("filtered_out", stat_idx::STAT_FILTERED_OUT),
        ("mirrored_packets", stat_idx::STAT_MIRRORED_PACKETS),
        ("replayed", stat_idx::STAT_REPLAYED),
        ("replay_missed", stat_idx::STAT_REPLAY_MISSED),
    ];
    names.iter().map(|(n, i)| format!("{n} {}", c.get(*i))).collect::<Vec<_>>().join(", ")
}

/// Header blocks the oracle read in the capture: requests (`:method`), responses (`:status`),
/// trailers (ending a stream, with `grpc-status`).
fn block_counts(e: &H2Expected) -> (u64, u64, u64) {
    let (mut req, mut resp, mut trailers) = (0, 0, 0);
    for c in &e.conversations {
        req += c.to_server.iter().flat_map(|d| &d.blocks).filter(|b| b.field(":method").is_some()).count()
            as u64;
        for b in c.to_client.iter().flat_map(|d| &d.blocks) {
            resp += u64::from(b.status().is_some());
            trailers += u64::from(b.grpc_status().is_some());
        }
    }
    (req, resp, trailers)
}

/// The first `n` lines of `lines`, indented, and how many there were.
fn some(lines: &[String], n: usize) -> String {
    let shown: Vec<String> = lines.iter().take(n).map(|l| format!("  {l}")).collect();
    format!("{} in all:\n{}", lines.len(), shown.join("\n"))
}

#[test]
fn http2_and_grpc_triggers_are_exact_on_real_stacks() {
    if !require_root() {
        return;
    }
    let start = Instant::now();
    if !tshark::available() {
        assert!(!in_ci(), "tshark is needed and CI=true forbids leaving it out");
        eprintln!("NOT RUN: tshark not found");
        return;
    }
    let rules: Vec<H2Rule> = h2_scenario::rules();
    let stacks = Stacks::find();
    let built = start.elapsed();

    let mut bed = Testbed::new(&ROLES);
    let daemons = stacks.start(&bed.topo, bed.dir.path());
    bed.mirror_to_sink();
    for r in RULES {
        bed.add_rule(r);
    }
    bed.replay_to_sink();
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);
    let events = bed.events();
    let setup = start.elapsed() - built;

    bed.capture_buffer_kib(64 * 1024);
    let dir = bed.dir.path();
    let traffic = Instant::now();
    let mut conns = Vec::new();
    let rec = bed.record("client", || conns = stacks.run_clients(&bed.topo, dir));
    let traffic = traffic.elapsed();
    let events: Vec<TriggerEvent> = events.take();

    // The harness first: the oracle and tshark against the clients.
    let judged = h2_scenario::judge(&rec.reference, &only_file(dir, "reference-"), &conns, &rules);
    let e = &judged.expected;

    // The classifier: events and marks against the clients.
    let mut failures: Vec<String> = Vec::new();
    let by_events: BTreeSet<FlowKey> = events.iter().map(|e| e.key).collect();
    let flow_table = bed.dp.flows().expect("reading flows");
    let by_marks: BTreeSet<FlowKey> = flow_table.iter().filter(|f| f.mark.is_some()).map(|f| f.key).collect();
    let triggered: BTreeSet<FlowKey> = by_events.union(&by_marks).copied().collect();
    let mut mirrored: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for p in &rec.mirror.packets {
        *mirrored.entry(p.flow()).or_default() += 1;
    }
    let expected_packets: BTreeMap<FlowKey, &oracle::TriggeredFlow> =
        e.expected.triggered.iter().map(|t| (t.flow, t)).collect();
    let mut rows: Vec<(&str, Row)> = Vec::new();
    for (c, f) in conns.iter().zip(&judged.flows) {
        let i = rows.iter().position(|(r, _)| *r == c.row).unwrap_or_else(|| {
            rows.push((c.row, Row::default()));
            rows.len() - 1
        });
        let row = &mut rows[i].1;
        let (fail, hit) = (judged.failed.contains(f), triggered.contains(f));
        row.connections += 1;
        row.counts[CALLS] += c.calls.len();
        row.counts[FAILING_CALLS] += c.calls.iter().filter(|k| k.fails(&rules)).count();
        row.relevant += usize::from(fail);
        row.triggered += usize::from(hit);
        row.correct += usize::from(hit && fail);
        row.mirrored += mirrored.get(f).copied().unwrap_or(0);
        row.expected_mirrored += expected_packets.get(f).map_or(0, |t| t.packets);
    }
    let mut total = Row::default();
    rows.iter().for_each(|(_, r)| total.add(r));
    let mut table = vec![
        "| stack | connections | calls | calls matching a rule | connections failed | triggered | precision | recall | mirrored / expected packets |".to_string(),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|".to_string(),
    ];
    table.extend(rows.iter().map(|(n, r)| r.line(n, FAILING_CALLS + 1)));
    table.push(total.line("all", FAILING_CALLS + 1));
    let show = |set: &BTreeSet<FlowKey>| set.iter().map(|f| format!("  {f}")).collect::<Vec<_>>().join("\n");
    let false_triggers: BTreeSet<FlowKey> = triggered.difference(&judged.failed).copied().collect();
    let missed: BTreeSet<FlowKey> = judged.failed.difference(&triggered).copied().collect();
    check(&mut failures, false_triggers.is_empty() && missed.is_empty(), || {
        format!(
            "precision {:.3}, recall {:.3}\nfalse triggers:\n{}\nmissed:\n{}",
            total.precision(),
            total.recall(),
            show(&false_triggers),
            show(&missed)
        )
    });
    check(&mut failures, by_events == by_marks, || {
        format!("trigger events and marks disagree: events {by_events:?}, marks {by_marks:?}")
    });
    // Each trigger's event, and its mark: what the oracle read.
    for t in &e.triggers {
        let mine: Vec<&TriggerEvent> = events.iter().filter(|ev| ev.key == t.flow).collect();
        match mine.as_slice() {
            [ev] => failures.extend(check_event(ev, t)),
            [] => {}
            _ => failures.push(format!("{}: {} events, one expected: {mine:?}", t.flow, mine.len())),
        }
        if let Some(f) = flow_table.iter().find(|f| f.key == t.flow) {
            let want = expected_packets[&t.flow];
            check(&mut failures, f.mark.is_none_or(|m| want.admits(m.packets) && !m.ended), || {
                format!(
                    "{}: mark {:?}, {} packets expected ({} more crossed the trigger)",
                    t.flow, f.mark, want.packets, want.crossing
                )
            });
        }
    }
    // Exactly once, from each trigger on.
    if let Err(diff) = e.expected.compare_mirror(&rec.mirror) {
        failures.push(format!("mirror: {diff}"));
    }
    // Counters.
    let c = bed.counters();
    let count = |i| c.get(i);
    let n_status = e.triggers.iter().filter(|t| t.kind == H2Kind::Status).count() as u64;
    let n_grpc = e.triggers.iter().filter(|t| t.kind == H2Kind::Grpc).count() as u64;
    let (requests, responses, trailers) = block_counts(e);
    check(&mut failures, count(stat_idx::STAT_GRPC_TRIGGERS) == n_grpc, || {
        format!("grpc_triggers {}, {n_grpc} expected", count(stat_idx::STAT_GRPC_TRIGGERS))
    });
    let triggers = count(stat_idx::STAT_TRIGGERS);
    check(&mut failures, triggers == n_status || triggers == n_status + n_grpc, || {
        format!(
            "triggers {triggers}, {n_status} (the :status triggers) or {} (with the {n_grpc} grpc-status ones) expected",
            n_status + n_grpc
        )
    });
    check(&mut failures, count(stat_idx::STAT_MIRRORED_PACKETS) == rec.mirror.packets.len() as u64, || {
        format!(
            "mirrored_packets {}, {} on the sink",
            count(stat_idx::STAT_MIRRORED_PACKETS),
            rec.mirror.packets.len()
        )
    });
    check(
        &mut failures,
        count(stat_idx::STAT_MIRROR_ERRORS) == 0 && count(stat_idx::STAT_MIRROR_NO_TARGET) == 0,
        || format!("copy errors: {c:?}"),
    );
    check(&mut failures, count(stat_idx::STAT_H2_LOST) == 0, || {
        format!("h2_lost {}", count(stat_idx::STAT_H2_LOST))
    });
    let h2_blocks = (
        count(stat_idx::STAT_H2_REQUESTS),
        count(stat_idx::STAT_H2_RESPONSES),
        count(stat_idx::STAT_H2_TRAILERS),
    );
    check(&mut failures, h2_blocks == (requests, responses, trailers), || {
        format!(
            "h2_requests, h2_responses, h2_trailers {h2_blocks:?}; the capture has {requests} request header \
             blocks, {responses} with :status, {trailers} trailers with grpc-status"
        )
    });
    // Replays: only of triggered flows, at most one each, ahead of their copies (but those near
    // the trigger, which another CPU's queue may hand a reader first).
    let oracle_flows: BTreeSet<FlowKey> = e.triggers.iter().map(|t| t.flow).collect();
    let near: BTreeMap<FlowKey, Vec<PacketId>> =
        e.triggers.iter().map(|t| (t.flow, oracle::near(&rec.reference, t.packet))).collect();
    let mut replays: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for r in &rec.mirror.replayed {
        let flow = r.packet.flow();
        *replays.entry(flow).or_default() += 1;
        let before = rec.mirror.packets[..r.after_copies]
            .iter()
            .filter(|p| p.flow() == flow && !near.get(&flow).is_some_and(|n| n.contains(&p.id())))
            .count();
        check(&mut failures, oracle_flows.contains(&flow) && before == 0, || {
            format!("replay {} of a flow not triggered, or after {before} of its copies", r.packet.id())
        });
    }
    check(&mut failures, replays.values().all(|n| *n == 1), || format!("replays per flow: {replays:?}"));
    // Each one the segment that carried its trigger's request (its HEADERS, or the HTTP/1.1
    // request an upgrade answered on stream 1), as far as it was kept.
    for r in &rec.mirror.replayed {
        let Some(t) = e.triggers.iter().find(|t| t.flow == r.packet.flow()) else { continue };
        let wanted = request_segments(e, t, &rec.reference);
        let p = &r.packet;
        let is = |q: &Packet| (q.src, q.dst, q.seq, q.ack, q.flags) == (p.src, p.dst, p.seq, p.ack, p.flags);
        let whole = wanted.iter().find(|q| is(q));
        check(&mut failures, whole.is_some_and(|q| q.payload.starts_with(&p.payload)), || {
            let wanted: Vec<String> = wanted.iter().map(|q| q.id().to_string()).collect();
            format!(
                "{} (stream {}): the replay is {}, the request's segment {wanted:?}",
                t.flow,
                t.stream,
                p.id()
            )
        });
    }

    // tshark on the mirror: what a reader that starts at each trigger can decode.
    let views = mirror_views(e, &rec.reference, &rec.mirror);
    let mirror_file = only_file(dir, "mirror-");
    // HTTP/2: frames and fields (tshark's gRPC dissector left out: see `Decode::no_grpc`).
    let unaided = tshark::dissect(
        &mirror_file,
        &Decode { http2_ports: PORTS.to_vec(), no_grpc: true, ..Decode::default() },
    );
    let (wrong, agreed) = tshark::compare(&unaided, &views, Aspects { fields: true, grpc: None });
    check(&mut failures, wrong.is_empty(), || {
        format!(
            "tshark on the mirror, packets that differ from what a late reader decodes: {}",
            some(&wrong, 20)
        )
    });
    // gRPC, told the port is gRPC: every message of the mirrored DATA frames.
    let grpc_views: Vec<(FlowKey, Vec<LateDirection>)> =
        views.iter().filter(|(f, _)| f.lo.port() == GRPC_PORT || f.hi.port() == GRPC_PORT).cloned().collect();
    let told = tshark::dissect(
        &mirror_file,
        &Decode { http2_ports: PORTS.to_vec(), grpc_ports: vec![GRPC_PORT], no_grpc: false },
    );
    let (wrong_told, agreed_told) =
        tshark::compare(&told, &grpc_views, Aspects { fields: false, grpc: Some(&[GRPC_PORT]) });
    check(&mut failures, wrong_told.is_empty(), || {
        format!("tshark on the mirror, told the port is gRPC, packets that differ: {}", some(&wrong_told, 20))
    });
    let on_mirror: Vec<&H2Trigger> =
        e.triggers.iter().filter(|t| views.iter().any(|(f, _)| *f == t.flow)).collect();
    let trigger_seen = on_mirror
        .iter()
        .filter(|t| {
            let at = unaided.get(&rec.reference.packets[t.packet].id());
            at.is_some_and(|d| d.frames.contains(&(frame::HEADERS, t.stream)))
        })
        .count();
    check(&mut failures, trigger_seen == on_mirror.len(), || {
        format!(
            "tshark found the triggering HEADERS on the mirror for {trigger_seen} of the {} flows mirrored",
            on_mirror.len()
        )
    });
    let aligned = views.iter().flat_map(|(_, d)| d).filter(|d| d.aligned).count();
    let replays_read = views.iter().flat_map(|(_, d)| d).filter(|d| d.replayed.is_some()).count();
    let mut unaligned: BTreeMap<&str, usize> = BTreeMap::new();
    for why in views.iter().flat_map(|(_, d)| d).filter_map(|d| d.unaligned) {
        *unaligned.entry(why).or_default() += 1;
    }
    let directions: usize = views.iter().map(|(_, d)| d.len()).sum();

    let crossing = e.expected.crossing.len();
    let crossed = rec.mirror.packets.iter().filter(|p| e.expected.crossing.contains(&p.id())).count();
    eprintln!(
        "HTTP/2 and gRPC, rules {RULES:?}: {} connections, {} calls (stacks ready {:.1} s, set-up {:.1} s, \
         traffic {:.1} s)\n{}\n\
         events {}, marks {}; the oracle: {} triggers ({n_status} :status, {n_grpc} grpc-status), {} packets to \
         mirror and {crossing} that crossed a trigger ({crossed} of them mirrored); the capture's header blocks: {requests} requests, {responses} with :status, {trailers} trailers; \
         replays on the sink {}\ncounters: {}\n\
         tshark, client's capture: {} HEADERS frames, {} fields, {} gRPC messages as the oracle reads them\n\
         tshark, mirror: {aligned} of {directions} mirrored directions begin at a frame ({replays_read} with a replayed \
         request ahead; the others: {unaligned:?}); {} HEADERS frames, {} fields resolved, {} <unknown>; {} gRPC \
         messages when told the port",
        conns.len(),
        conns.iter().map(|c| c.calls.len()).sum::<usize>(),
        built.as_secs_f64(),
        setup.as_secs_f64(),
        traffic.as_secs_f64(),
        table.join("\n"),
        by_events.len(),
        by_marks.len(),
        e.triggers.len(),
        e.expected.packets.len(),
        rec.mirror.replayed.len(),
        h2_counters(&c),
        judged.plain_agreed[0],
        judged.plain_agreed[1],
        judged.plain_agreed[3],
        agreed[0],
        agreed[1],
        agreed[2],
        agreed_told[3],
    );
    drop(daemons);
    assert!(failures.is_empty(), "{} failure(s):\n\n{}", failures.len(), failures.join("\n\n"));
    eprintln!("h2: {:.1} s in all", start.elapsed().as_secs_f64());
}

/// grpc-go behind a ClusterIP (kube-proxy's iptables NAT in the node), from the client pod:
/// one channel gets INTERNAL at its fourth call, another only OKs. The failing connection is
/// one flow, mirrored from its trailers on, both directions once each in the form they have
/// where they are copied (the client's tuple towards the VIP, the pod's back), nothing of the
/// other; one event naming both tuples, the call's stream and request.
#[test]
fn grpc_through_a_cluster_ip_is_one_flow_mirrored_from_its_trailers_on() {
    if !require_root() {
        return;
    }
    let Some(go) = servers::go_toolchain() else {
        h2_scenario::missing("grpc-go", "a Go toolchain (go in PATH or /usr/local/go/bin/go)");
        return;
    };
    let go = Grpc::Go(h2_stacks::build_grpc_go(&go));
    let rule = "grpc-status=internal,unavailable";
    let rules = [H2Rule::parse(rule)];
    let mut bed = Testbed::builder(&PODS).rule(rule).build();
    let server = go.server(&bed.pod("server").ns, SERVICE_PORT);
    let kp = KubeProxy::install(bed.node(), Flavour::Iptables, false, bed.pod("server").addr(false));
    bed.replay_to_sink();
    let events = bed.events();
    let vip = SocketAddr::new(kp.vip(), SERVICE_PORT);
    let points = CopyPoints {
        to_server: Point::ingress(&bed.pod("client").veth),
        to_client: Point::ingress(&bed.pod("server").veth),
    };
    let plan =
        GrpcPlan { channels: vec![channel(vip, false, 8, &[(3, GREETER, 13)]), channel(vip, false, 6, &[])] };
    let client = bed.pod("client");
    let mut calls = Vec::new();
    let rec = nat_oracle::record(bed.node(), bed.dir.path(), &points, MIRROR_SINK, || {
        calls = go.client(&client.ns, &plan, bed.dir.path());
    });
    let conns = grpc_conns("grpc-go via ClusterIP", &plan, &calls, client);
    let failing: Vec<FlowKey> =
        conns.iter().filter(|c| c.first_failing(&rules).is_some()).map(|c| c.flow(&rec.to_server)).collect();
    assert_eq!(failing.len(), 1, "{conns:?}");

    // The harness: the oracle finds the client's failing connection.
    let expected = NatExpected::from_triggers(&rec, |trace| h2_oracle::trigger_packets(trace, &rules));
    assert_eq!(expected.connections.len(), 2, "{:?}", expected.connections);
    assert_eq!(expected.triggered.len(), 1, "{:?}", expected.triggered);
    let t = expected.triggered[0];
    let conn = expected.connections[t.conn];
    assert_eq!(conn.to_server, failing[0], "the oracle's failing connection is the client's");
    assert_eq!(t.status, 13);

    let mut failures = Vec::new();
    if let Err(diff) = expected.compare_mirror(&rec.mirror) {
        failures.push(format!("mirror: {diff}"));
    }
    let c = bed.counters();
    check(&mut failures, c.get(stat_idx::STAT_GRPC_TRIGGERS) == 1, || {
        format!("grpc_triggers: {}", h2_counters(&c))
    });
    check(&mut failures, c.get(stat_idx::STAT_MIRRORED_PACKETS) == rec.mirror.packets.len() as u64, || {
        format!(
            "mirrored packets counted {}, on the sink {}",
            c.get(stat_idx::STAT_MIRRORED_PACKETS),
            rec.mirror.packets.len()
        )
    });
    let ev = events.take();
    match ev.as_slice() {
        [e] => {
            let named = [Some(e.key), e.nat];
            check(
                &mut failures,
                named.contains(&Some(conn.to_server)) && named.contains(&Some(conn.to_client)),
                || format!("the event names {} and {:?}; the connection is {conn}", e.key, e.nat),
            );
            check(&mut failures, (e.kind, e.status, e.stream) == (TriggerKind::Grpc, 13, Some(7)), || {
                format!(
                    "event: kind {:?} status {} stream {:?}, expected Grpc 13 stream 7",
                    e.kind, e.status, e.stream
                )
            });
            check(
                &mut failures,
                (e.method.as_deref(), e.target.as_deref()) == (Some("POST"), Some(GREETER)),
                || format!("event without the request: {:?} {:?}", e.method, e.target),
            );
        }
        _ => failures.push(format!("{} trigger events, one expected: {ev:?}", ev.len())),
    }
    let flows = bed.dp.flows().expect("reading flows");
    let listed: Vec<_> = flows
        .iter()
        .filter(|f| [conn.to_server, conn.to_client].iter().any(|k| f.key == *k || f.nat == Some(*k)))
        .collect();
    match listed.as_slice() {
        [f] => check(&mut failures, f.mark.is_some_and(|m| m.packets == t.packets && !m.ended), || {
            format!("its flow's mark {:?}, {} packets expected", f.mark, t.packets)
        }),
        _ => failures.push(format!("the connection is listed {} times: {listed:?}", listed.len())),
    }
    let marked = flows.iter().filter(|f| f.mark.is_some()).count();
    check(&mut failures, marked == 1, || format!("{marked} flows marked, one expected"));
    eprintln!(
        "ClusterIP {vip}: {} calls; mirrored {} packets, {} expected; replays {}; counters: {}",
        calls.len(),
        rec.mirror.packets.len(),
        expected.packets.len(),
        rec.mirror.replayed.len(),
        h2_counters(&c)
    );
    drop(server);
    assert!(failures.is_empty(), "{} failure(s):\n\n{}", failures.len(), failures.join("\n\n"));
}
