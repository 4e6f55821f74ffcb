//! The classifier under BPF_PROG_TEST_RUN: parsing, HTTP recognition, rules, marks, limits,
//! exactly-once across interfaces, fail-open. Needs root (fails without it in CI).

use std::os::fd::AsFd;
use std::thread::sleep;
use std::time::Duration;

use libbpf_rs::skel::Skel;

use mirror_bpf::testing::rig::{self, Rig};
use mirror_bpf::testing::{self, consts::*, fixtures, packet::*, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{AttachMode, Counters, Datapath, DatapathOptions, FlowKey, MirrorMethod};

type Dp = Datapath<'static>;

/// Runs `frame` through the ingress program; asserts it passed untouched; returns counter deltas.
fn ingress(dp: &Dp, frame: &[u8]) -> Counters {
    run_on(dp, frame, false, SkbContext::default())
}

fn run_on(dp: &Dp, frame: &[u8], egress: bool, ctx: SkbContext) -> Counters {
    let before = dp.counters().unwrap();
    let p = &dp.skel().progs;
    let prog = if egress { &p.tc_egress_mirror } else { &p.tc_ingress_mirror };
    let (ret, out) = testing::run(prog, frame, ctx);
    assert_eq!(ret, VERDICT_CONTINUE, "verdict must always be 'continue'");
    assert_eq!(out, frame, "the frame must pass untouched");
    dp.counters().unwrap().since(&before)
}

fn flow(dp: &Dp, key: &FlowKey) -> Option<mirror_bpf::Flow> {
    dp.flows().unwrap().into_iter().find(|f| f.key == *key)
}

fn v4_flow(cport: u16, sport: u16) -> FlowKey {
    FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), cport),
        std::net::SocketAddr::new(V4_SERVER.into(), sport),
        6,
    )
}

fn load() -> Option<Dp> {
    testing::require_root().then(|| testing::load(&DatapathOptions::default()))
}

/// Every fixture, on a classifier with the fixtures' rule and a mirror veth: its decision on
/// the first run, and the same decision when it runs again as the benchmark repeats it.
#[test]
fn fixtures_decide_as_expected() {
    if !testing::require_root() {
        return;
    }
    testing::enter_private_netns();
    let rig = Rig::new(1, rig::mirror_veth());
    let mut failed = Vec::new();
    for fx in fixtures::all() {
        let decided =
            rig.decide(&fx).and_then(|p| rig.decide_again(&fx, &p).and_then(|()| rig.decide_again(&fx, &p)));
        failed.extend(decided.err());
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// No map lookup, update or delete of the data path or of the tracing programs is left to the
/// kernel's generic helper: each is inlined or a direct call (see `generic_map_calls`). A
/// lookup of the rules' status array that the compiler merged with a hash lookup once cost
/// every HTTP/2 answer a call through the map's operations.
#[test]
fn every_map_call_of_the_data_path_is_inlined_or_direct() {
    let Some(mut dp) = load() else { return };
    let loaded = |obj: &libbpf_rs::Object| -> Vec<(String, std::os::fd::OwnedFd)> {
        let progs = obj.progs().filter(|p| p.autoload());
        progs
            .map(|p| (p.name().to_string_lossy().into_owned(), p.as_fd().try_clone_to_owned().unwrap()))
            .collect()
    };
    let mut progs = loaded(dp.skel().object());
    progs.extend(loaded(dp.load_tracing().expect("loading the tracing programs").skel().object()));
    let mut generic = Vec::new();
    for (name, fd) in &progs {
        let at = mirror_bpf::programs::generic_map_calls(fd.as_fd()).expect("the translated program");
        if !at.is_empty() {
            generic.push(format!("{name}: at {at:?}"));
        }
    }
    assert!(progs.len() >= 10, "only {} programs were checked", progs.len());
    assert!(progs.iter().any(|(name, _)| name == "cpu_softirq_entry"), "no tracing program was checked");
    assert!(generic.is_empty(), "calls of the generic map helpers: {}", generic.join("; "));
}

/// test_run itself refuses frames shorter than Ethernet + 1 byte, and untagged IPv4/IPv6
/// frames shorter than their base IP header: truncations below that cannot reach a program.
fn test_run_min_len(frame: &[u8]) -> usize {
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => 14 + 20,
        0x86dd => 14 + 40,
        _ => 15,
    }
}

#[test]
fn truncation_at_every_offset_is_malformed_and_passes() {
    let Some(mut dp) = load() else { return };
    dp.add_rule("status=5xx".parse().unwrap()).unwrap();
    for fx in fixtures::truncation_fixtures() {
        let full = fixtures::v4_response(PORT_HTTP, PORT_CLIENT, RESP_500);
        for frame in [fx.frame.clone(), full] {
            for cut in test_run_min_len(&frame)..frame.len() {
                let d = ingress(&dp, &frame[..cut]);
                assert_eq!(d.get(S::STAT_MALFORMED), 1, "{} cut at {cut}", fx.name);
                assert_eq!(d.get(S::STAT_TRIGGERS), 0, "{} cut at {cut}", fx.name);
            }
        }
    }
    assert!(dp.flows().unwrap().is_empty(), "no flow from a truncated frame");
}

#[test]
fn rules_match_by_status_class_range_and_port() {
    let Some(mut dp) = load() else { return };
    let cases: &[(&str, u16, &[u8], bool)] = &[
        ("status=500", PORT_HTTP, RESP_500, true),
        ("status=500", PORT_HTTP, RESP_503_V10, false),
        ("status=5xx", PORT_HTTP, RESP_503_V10, true),
        ("status=5xx", PORT_HTTP, RESP_200, false),
        ("status=500-503", PORT_HTTP, RESP_503_V10, true),
        ("status=501-504", PORT_HTTP, RESP_500, false),
        ("port=8080 status=503", PORT_ALT, RESP_503_V10, true),
        ("port=8080 status=503", PORT_HTTP, RESP_503_V10, false),
    ];
    for (i, (rule, sport, payload, triggers)) in cases.iter().enumerate() {
        let id = dp.add_rule(rule.parse().unwrap()).unwrap();
        let cport = 41000 + i as u16;
        let d = ingress(&dp, &fixtures::v4_response(*sport, cport, payload));
        assert_eq!(d.get(S::STAT_TRIGGERS), u64::from(*triggers), "{rule} from port {sport}");
        let mark = dp.mark(&v4_flow(cport, *sport)).unwrap();
        assert_eq!(mark.map(|m| m.rule_id), triggers.then_some(id), "{rule}");
        let hits = dp.rules().unwrap().into_iter().find(|r| r.id == id).unwrap().hits;
        assert_eq!(hits, u64::from(*triggers), "{rule}");
        dp.remove_rule(id).unwrap();
    }
    // Once removed, a rule matches nothing.
    let d = ingress(&dp, &fixtures::v4_response(PORT_HTTP, 41100, RESP_500));
    assert_eq!(d.get(S::STAT_TRIGGERS), 0);
}

#[test]
fn ten_thousand_rules_still_match_exactly() {
    let Some(mut dp) = load() else { return };
    for port in 1..=10_000u16 {
        dp.add_rule(format!("port={port} status=502").parse().unwrap()).unwrap();
    }
    let resp_502 = b"HTTP/1.1 502 Bad Gateway\r\n\r\n";
    let d = ingress(&dp, &fixtures::v4_response(5000, 42000, resp_502));
    assert_eq!(d.get(S::STAT_TRIGGERS), 1);
    assert_eq!(dp.mark(&v4_flow(42000, 5000)).unwrap().unwrap().rule_id, 5000);
    let d = ingress(&dp, &fixtures::v4_response(10_001, 42001, resp_502));
    assert_eq!(d.get(S::STAT_TRIGGERS), 0, "port 10001 has no rule");
}

/// A private netns with a veth pair whose first end is the mirror interface.
fn mirror_veth(dp: &Dp) -> u32 {
    testing::enter_private_netns();
    let ifx = rig::mirror_veth();
    dp.set_mirror_ifindex(ifx).unwrap();
    ifx
}

#[test]
fn a_marked_flow_is_mirrored_both_ways_from_the_trigger_on() {
    let Some(mut dp) = load() else { return };
    mirror_veth(&dp);
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    let (cport, key) = (43000, v4_flow(43000, PORT_HTTP));
    let request = fixtures::v4_request(cport, PORT_HTTP, REQ_GET_BAR);

    let d = ingress(&dp, &request);
    assert_eq!(d.get(S::STAT_MIRRORED_PACKETS), 0, "nothing before the trigger");
    let rx_before = testing::link_packets("mir1").0;

    let trigger = fixtures::v4_response(PORT_HTTP, cport, RESP_500);
    let d = ingress(&dp, &trigger);
    assert_eq!((d.get(S::STAT_TRIGGERS), d.get(S::STAT_MIRRORED_PACKETS)), (1, 1));
    // Both directions, on either hook.
    let ack = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(cport, PORT_HTTP, tcp_flags::ACK).build();
    let d = ingress(&dp, &ack);
    assert_eq!(d.get(S::STAT_MIRRORED_PACKETS), 1);
    let d = run_on(&dp, &trigger, true, SkbContext::default());
    assert_eq!((d.get(S::STAT_MIRRORED_PACKETS), d.get(S::STAT_TRIGGERS)), (1, 0));
    assert_eq!(d.get(S::STAT_MIRROR_ERRORS), 0);

    let mark = dp.mark(&key).unwrap().unwrap();
    assert_eq!((mark.packets, mark.status, mark.ended), (3, 500, false));
    let f = flow(&dp, &key).unwrap();
    assert_eq!((f.forward.packets, f.reverse.packets), (2, 2));
    assert_eq!(f.mark, Some(mark));
    // The copies really reached the mirror veth.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while testing::link_packets("mir1").0 < rx_before + 3 && std::time::Instant::now() < deadline {
        sleep(Duration::from_millis(10));
    }
    assert_eq!(testing::link_packets("mir1").0, rx_before + 3);
}

#[test]
fn trigger_event_carries_the_request() {
    let Some(mut dp) = load() else { return };
    let id = dp.add_rule("status=500".parse().unwrap()).unwrap();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let rb = dp.events(move |e| sink.lock().unwrap().push(e)).unwrap();
    // A target longer than the first word of the head: the event's head is taken from the
    // request's queue entry at the trigger, not only what the response's timing read of it.
    let request = b"GET /bar/a/target/longer/than/a/word?with=query HTTP/1.1\r\nHost: x\r\n\r\n";
    ingress(&dp, &fixtures::v4_request(44000, PORT_HTTP, request));
    sleep(Duration::from_millis(2));
    ingress(&dp, &fixtures::v4_response(PORT_HTTP, 44000, RESP_500));
    Datapath::poll_events(&rb, Duration::from_millis(100)).unwrap();
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!((e.rule_id, e.status, e.key), (id, 500, v4_flow(44000, PORT_HTTP)));
    assert_eq!(
        (e.method.as_deref(), e.target.as_deref()),
        (Some("GET"), Some("/bar/a/target/longer/than/a/word?with=query"))
    );
    let rtt = e.request_to_response.expect("request seen");
    assert!(rtt >= Duration::from_millis(2) && rtt < Duration::from_secs(5), "{rtt:?}");
    assert!(e.reverse, "the server (hi endpoint) sent the response");
}

/// The request behind a trigger is kept in a request_replay slot, one per flow, when
/// `replay_requests` gives slots; with none (0) triggers still fire, and nothing is kept.
#[test]
fn requests_are_kept_only_where_replay_requests_gives_slots() {
    if !testing::require_root() {
        return;
    }
    for (replay_requests, kept) in [(DatapathOptions::REPLAY_REQUESTS, true), (0, false)] {
        let mut dp = testing::load(&DatapathOptions { replay_requests, ..Default::default() });
        dp.add_rule("status=500".parse().unwrap()).unwrap();
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = events.clone();
        let rb = dp.events(move |e| sink.lock().unwrap().push(e)).unwrap();
        let request = b"GET /kept HTTP/1.1\r\nHost: x\r\n\r\n";
        let d = ingress(&dp, &fixtures::v4_request(44100, PORT_HTTP, request));
        assert_eq!(d.get(S::STAT_REPLAY_KEPT), u64::from(kept), "{replay_requests} slots");
        let d = ingress(&dp, &fixtures::v4_response(PORT_HTTP, 44100, RESP_500));
        assert_eq!(d.get(S::STAT_TRIGGERS), 1, "{replay_requests} slots");
        assert_eq!(d.get(S::STAT_REPLAY_MISSED), 0, "{replay_requests} slots");
        Datapath::poll_events(&rb, Duration::from_millis(100)).unwrap();
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 1, "{replay_requests} slots");
        let payload = events[0].request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
        assert_eq!(payload.as_deref(), kept.then_some(&request[..]), "{replay_requests} slots");
        assert_eq!(dp.set_replay(true).is_ok(), kept, "{replay_requests} slots");
    }
    // Neither 0 nor a power of two from 64: refused before anything is loaded.
    let storage = Box::leak(Box::new(std::mem::MaybeUninit::uninit()));
    let opts = DatapathOptions { replay_requests: 1000, ..Default::default() };
    let e = Datapath::load(storage, &opts).err().expect("1000 slots are refused");
    assert!(e.to_string().contains("replay_requests: 1000: 0 (off) or a power of two"), "{e}");
}

#[test]
fn limits_end_the_mirroring() {
    let Some(mut dp) = load() else { return };
    mirror_veth(&dp);
    dp.add_rule("status=500 packets=3".parse().unwrap()).unwrap();
    dp.add_rule("port=8080 status=500 duration=50ms".parse().unwrap()).unwrap();
    dp.add_rule("port=8081 status=500 bytes=200".parse().unwrap()).unwrap();

    // Packets: the trigger and two more, then nothing.
    let trigger = fixtures::v4_response(PORT_HTTP, 45000, RESP_500);
    let total: u64 = (0..6).map(|_| ingress(&dp, &trigger).get(S::STAT_MIRRORED_PACKETS)).sum();
    assert_eq!(total, 3);
    let mark = dp.mark(&v4_flow(45000, PORT_HTTP)).unwrap().unwrap();
    assert!(mark.ended && mark.packets == 3, "{mark:?}");

    // Time.
    let trigger = fixtures::v4_response(PORT_ALT, 45001, RESP_500);
    assert_eq!(ingress(&dp, &trigger).get(S::STAT_MIRRORED_PACKETS), 1);
    sleep(Duration::from_millis(60));
    let d = ingress(&dp, &trigger);
    assert_eq!((d.get(S::STAT_MIRRORED_PACKETS), d.get(S::STAT_MIRROR_ENDED)), (0, 1));

    // Bytes: mirrored while under the budget when the packet starts.
    let trigger = fixtures::v4_response(8081, 45002, RESP_500);
    let len = trigger.len() as u64;
    let total: u64 = (0..5).map(|_| ingress(&dp, &trigger).get(S::STAT_MIRRORED_PACKETS)).sum();
    assert_eq!(total, 200u64.div_ceil(len));
}

#[test]
fn egress_skips_packets_already_seen_at_an_attached_ingress() {
    let Some(mut dp) = load() else { return };
    mirror_veth(&dp);
    testing::sh("ip link add pa type veth peer name pb && ip link set pa up && ip link set pb up");
    let pa = testing::ifindex("pa");
    let att = dp.attach(pa, AttachMode::Tc, MirrorMethod::Clone).unwrap();
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    let trigger = fixtures::v4_response(PORT_HTTP, 46000, RESP_500);

    // Came in through attached `pa`: handled there, not again at egress.
    let d = run_on(&dp, &trigger, true, SkbContext { ingress_ifindex: pa, ..Default::default() });
    assert_eq!((d.get(S::STAT_DUPLICATE), d.get(S::STAT_TRIGGERS)), (1, 0));
    // Came from elsewhere (or from this host): handled at egress.
    let d = run_on(
        &dp,
        &trigger,
        true,
        SkbContext { ingress_ifindex: testing::ifindex("pb"), ..Default::default() },
    );
    assert_eq!(
        (d.get(S::STAT_DUPLICATE), d.get(S::STAT_TRIGGERS), d.get(S::STAT_MIRRORED_PACKETS)),
        (0, 1, 1)
    );
    dp.detach(att).unwrap();
    let d = run_on(&dp, &trigger, true, SkbContext { ingress_ifindex: pa, ..Default::default() });
    assert_eq!(d.get(S::STAT_DUPLICATE), 0, "detached: no longer an attached ingress");
}

#[test]
fn fail_open_without_or_with_a_broken_mirror_target() {
    let Some(mut dp) = load() else { return };
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    let trigger = fixtures::v4_response(PORT_HTTP, 47000, RESP_500);
    let d = ingress(&dp, &trigger);
    assert_eq!(
        (d.get(S::STAT_TRIGGERS), d.get(S::STAT_MIRROR_NO_TARGET), d.get(S::STAT_MIRRORED_PACKETS)),
        (1, 1, 0)
    );
    dp.set_mirror_ifindex(1_000_000).unwrap();
    let d = ingress(&dp, &trigger);
    assert_eq!((d.get(S::STAT_MIRROR_ERRORS), d.get(S::STAT_MIRRORED_PACKETS)), (1, 0));
}

#[test]
fn a_full_flow_table_evicts_and_passes() {
    let Some(dp) = testing::require_root()
        .then(|| testing::load(&DatapathOptions { flows_max: 64, ..Default::default() }))
    else {
        return;
    };
    for port in 0..1000u16 {
        let frame = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(20000 + port, 80, tcp_flags::SYN).build();
        let d = ingress(&dp, &frame);
        assert_eq!(d.get(S::STAT_FLOW_INSERT_FAILED), 0);
    }
    let in_table = libbpf_rs::MapCore::keys(&dp.skel().maps.flow_table).count() as u64;
    let created = dp.counters().unwrap().get(S::STAT_FLOWS_CREATED);
    assert_eq!(created, 1000);
    assert!(in_table <= 64 + 2 * 64, "LRU keeps the table near its size, got {in_table}");
    // What the flow cache holds besides (flows the table evicted meanwhile) is shown too, and
    // never more than its slots.
    let shown = dp.flows().unwrap().len() as u64;
    let cpus = u64::from(mirror_bpf::possible_cpus().unwrap());
    let cached = cpus * u64::from(mirror_bpf::types::mirror_limits::FLOW_CACHE_SLOTS.0);
    assert!(shown >= in_table && shown <= in_table + cached, "{shown} flows shown, {in_table} in the table");
}

#[test]
fn mirred_programs_match_exactly_the_marked_flows() {
    let Some(mut dp) = load() else { return };
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    let p = &dp.skel().progs;
    let ok = fixtures::v4_response(PORT_HTTP, 48000, RESP_200);
    let (ret, _) = testing::run(&p.tc_ingress_mirred, &ok, SkbContext::default());
    assert_eq!(ret, 0, "no match: act_mirred does not run");
    // The next response of the stream: after the 200 (whose framing the classifier follows).
    let trigger = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .tcp(PORT_HTTP, 48000, tcp_flags::ACK | tcp_flags::PSH)
        .seq(1000 + RESP_200.len() as u32)
        .payload(RESP_500)
        .build();
    let (ret, _) = testing::run(&p.tc_ingress_mirred, &trigger, SkbContext::default());
    assert_eq!(ret, u32::MAX, "match (-1): act_mirred copies");
    let (ret, _) = testing::run(&p.tc_egress_mirred, &ok, SkbContext::default());
    assert_eq!(ret, u32::MAX, "later packets of the marked flow match too");
}

/// One direction of a response stream, segment by segment, from the server's port 80.
fn response_segments(dp: &Dp, cport: u16, segments: &[&[u8]]) -> Counters {
    let before = dp.counters().unwrap();
    let mut seq = 1000u32;
    for seg in segments {
        let frame = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
            .tcp(PORT_HTTP, cport, tcp_flags::ACK | tcp_flags::PSH)
            .seq(seq)
            .payload(seg)
            .build();
        ingress(dp, &frame);
        seq = seq.wrapping_add(seg.len() as u32);
    }
    dp.counters().unwrap().since(&before)
}

#[test]
fn a_direction_that_never_began_a_message_is_no_longer_looked_at() {
    let Some(mut dp) = load() else { return };
    // What the classifier learns of a direction is kept per CPU: one CPU, one slot.
    testing::pin_thread(0).unwrap();
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    let fail: &[u8] = b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n";
    let other = [0x17u8; 100]; // TLS application data records, say
    let n = mirror_bpf::types::mirror_limits::HTTP_GIVE_UP.0 as usize;

    // Given up after HTTP_GIVE_UP segments that began no message: what follows is not read.
    let mut segs: Vec<&[u8]> = vec![&other; n];
    segs.push(fail);
    let c = response_segments(&dp, 61010, &segs);
    assert_eq!((c.get(S::STAT_HTTP_RESPONSES), c.get(S::STAT_TRIGGERS)), (0, 0), "given up");

    // One segment fewer: still looked at.
    let mut segs: Vec<&[u8]> = vec![&other; n - 1];
    segs.push(fail);
    let c = response_segments(&dp, 61011, &segs);
    assert_eq!((c.get(S::STAT_HTTP_RESPONSES), c.get(S::STAT_TRIGGERS)), (1, 1), "not yet given up");

    // A direction that spoke HTTP is always looked at, even after its framing was lost (a
    // header block longer than the scan) and many segments that begin nothing.
    let long_head = format!("HTTP/1.1 200 OK\r\nX-Long: {}\r\nContent-Length: 10\r\n\r\n", "a".repeat(600));
    let mut segs: Vec<&[u8]> = vec![long_head.as_bytes()];
    segs.extend(std::iter::repeat_n(&other[..], 2 * n));
    segs.push(fail);
    let c = response_segments(&dp, 61012, &segs);
    assert_eq!((c.get(S::STAT_HTTP_RESPONSES), c.get(S::STAT_TRIGGERS)), (2, 1), "spoke HTTP");
}
