//! Response and handshake times under BPF_PROG_TEST_RUN: per flow, in the kernel's histograms,
//! and as trigger conditions. Needs root (fails without it in CI).

use std::net::SocketAddr;
use std::thread::sleep;
use std::time::Duration;

use mirror_bpf::testing::{self, consts::*, fixtures, packet::*, SkbContext};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{Datapath, DatapathOptions, FlowKey, HistKind};

type Dp = Datapath<'static>;

fn load() -> Option<Dp> {
    testing::require_root().then(|| testing::load(&DatapathOptions::default()))
}

fn run(dp: &Dp, frame: &[u8]) {
    let (ret, _) = testing::run(&dp.skel().progs.tc_ingress_mirror, frame, SkbContext::default());
    assert_eq!(ret, testing::VERDICT_CONTINUE);
}

fn key(cport: u16) -> FlowKey {
    FlowKey::new(SocketAddr::new(V4_CLIENT.into(), cport), SocketAddr::new(V4_SERVER.into(), PORT_HTTP), 6)
}

fn hist(dp: &Dp, kind: HistKind, class: u8) -> Option<mirror_bpf::Histogram> {
    dp.histograms().unwrap().into_iter().find(|h| h.kind == kind && h.class == class)
}

#[test]
fn response_time_is_kept_per_flow_and_in_the_histogram() {
    let Some(dp) = load() else { return };
    run(&dp, &fixtures::v4_request(50000, PORT_HTTP, REQ_GET_BAR));
    sleep(Duration::from_millis(20));
    run(&dp, &fixtures::v4_response(PORT_HTTP, 50000, RESP_200));
    // A status line without a new request is not timed again.
    run(&dp, &fixtures::v4_response(PORT_HTTP, 50000, RESP_200));

    let h = hist(&dp, HistKind::HttpResponse, 2).expect("a 2xx histogram");
    assert_eq!(h.count, 1);
    let p50 = h.quantile(0.5).unwrap();
    assert!(p50 >= Duration::from_millis(20) && p50 < Duration::from_millis(40), "{p50:?}");
    assert_eq!(h.ifindex, 1, "test_run runs on loopback");
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(50000)).unwrap();
    assert_eq!(f.http_timed, 1);
    assert!(f.http_time_max.unwrap() >= Duration::from_millis(20));
    assert!(hist(&dp, HistKind::HttpResponse, 5).is_none());
}

#[test]
fn latency_rules_trigger_only_on_slow_responses() {
    let Some(mut dp) = load() else { return };
    let slow = dp.add_rule("latency>10ms".parse().unwrap()).unwrap();
    dp.add_rule("status=503".parse().unwrap()).unwrap();
    let exchange = |cport: u16, wait_ms: u64, resp: &[u8]| {
        run(&dp, &fixtures::v4_request(cport, PORT_HTTP, REQ_GET_BAR));
        sleep(Duration::from_millis(wait_ms));
        let before = dp.counters().unwrap();
        run(&dp, &fixtures::v4_response(PORT_HTTP, cport, resp));
        dp.counters().unwrap().since(&before).get(S::STAT_TRIGGERS)
    };
    assert_eq!(exchange(51000, 0, RESP_200), 0, "fast");
    assert_eq!(exchange(51001, 15, RESP_200), 1, "slow");
    assert_eq!(dp.mark(&key(51001)).unwrap().unwrap().rule_id, slow);
    assert_eq!(exchange(51002, 0, RESP_503_V10), 1, "the unconditional rule on 503");
    // No request seen: no time, so no slowness trigger.
    let before = dp.counters().unwrap();
    run(&dp, &fixtures::v4_response(PORT_HTTP, 51003, RESP_200));
    assert_eq!(dp.counters().unwrap().since(&before).get(S::STAT_TRIGGERS), 0);
}

#[test]
fn status_and_latency_together() {
    let Some(mut dp) = load() else { return };
    dp.add_rule("status=500 latency>10ms".parse().unwrap()).unwrap();
    for (cport, wait, resp, triggers) in
        [(52000, 0, RESP_500, 0), (52001, 15, RESP_200, 0), (52002, 15, RESP_500, 1)]
    {
        run(&dp, &fixtures::v4_request(cport, PORT_HTTP, REQ_GET_BAR));
        sleep(Duration::from_millis(wait));
        let before = dp.counters().unwrap();
        run(&dp, &fixtures::v4_response(PORT_HTTP, cport, resp));
        assert_eq!(dp.counters().unwrap().since(&before).get(S::STAT_TRIGGERS), triggers, "port {cport}");
    }
}

#[test]
fn handshake_time_from_syn_to_the_completing_ack() {
    let Some(dp) = load() else { return };
    let c2s = |flags| PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(53000, PORT_HTTP, flags).build();
    let s2c = |flags| PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).tcp(PORT_HTTP, 53000, flags).build();
    run(&dp, &c2s(tcp_flags::SYN));
    sleep(Duration::from_millis(5));
    run(&dp, &s2c(tcp_flags::SYN | tcp_flags::ACK));
    run(&dp, &s2c(tcp_flags::ACK)); // the server's direction: not the completing ACK
    sleep(Duration::from_millis(1));
    run(&dp, &c2s(tcp_flags::ACK));
    run(&dp, &c2s(tcp_flags::ACK)); // measured once
    let h = hist(&dp, HistKind::TcpHandshake, 0).expect("a handshake histogram");
    assert_eq!(h.count, 1);
    assert!(h.quantile(0.5).unwrap() >= Duration::from_millis(6), "{:?}", h.quantile(0.5));
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(53000)).unwrap();
    assert!(f.handshake.unwrap() >= Duration::from_millis(6));
}

#[test]
fn timing_groups_switch_at_run_time() {
    let Some(dp) = load() else { return };
    assert!(dp.timing(mirror_bpf::TimingGroup::Http).unwrap(), "on by default");
    dp.set_timing(mirror_bpf::TimingGroup::Http, false).unwrap();
    run(&dp, &fixtures::v4_request(54000, PORT_HTTP, REQ_GET_BAR));
    run(&dp, &fixtures::v4_response(PORT_HTTP, 54000, RESP_200));
    assert!(hist(&dp, HistKind::HttpResponse, 2).is_none(), "off: nothing timed");
    dp.set_timing(mirror_bpf::TimingGroup::Http, true).unwrap();
    // Another connection: the same segments again would be retransmissions.
    run(&dp, &fixtures::v4_request(54001, PORT_HTTP, REQ_GET_BAR));
    run(&dp, &fixtures::v4_response(PORT_HTTP, 54001, RESP_200));
    assert_eq!(hist(&dp, HistKind::HttpResponse, 2).unwrap().count, 1);
}
