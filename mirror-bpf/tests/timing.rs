//! Response and handshake times under BPF_PROG_TEST_RUN: per flow, in the kernel's histograms,
//! and as trigger conditions. Needs root (fails without it in CI).

use std::net::SocketAddr;
use std::thread::sleep;
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags};
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
    // The kernel's bucket for the interval is the one whose bounds user space reads it by.
    let b = h.buckets.iter().position(|&c| c == 1).expect("one bucket counted");
    let (lo, hi) = mirror_bpf::latency::bucket_bounds(b);
    assert!(lo <= h.sum_ns && h.sum_ns < hi, "{} ns in bucket {b}: [{lo}, {hi})", h.sum_ns);
    let p50 = h.quantile(0.5).unwrap();
    assert!(p50 >= Duration::from_millis(20) && p50 < Duration::from_millis(40), "{p50:?}");
    assert_eq!(h.ifindex, 1, "test_run runs on loopback");
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(50000)).unwrap();
    assert_eq!(f.http_timed, 1);
    assert!(f.http_time_max.unwrap() >= Duration::from_millis(20));
    assert!(hist(&dp, HistKind::HttpResponse, 5).is_none());
}

/// Sends `frame` out of `ifindex` through a packet socket, stamped with the CLOCK_MONOTONIC
/// departure time `at_ns` (SO_TXTIME: the stamp TCP puts on its segments, set by hand).
fn send_stamped(ifindex: u32, frame: &[u8], at_ns: u64) {
    #[repr(C)]
    struct SockTxtime {
        clockid: libc::clockid_t,
        flags: u32,
    }
    // SAFETY: plain syscalls on a socket this function owns, with buffers that outlive them.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
        let txt = SockTxtime { clockid: libc::CLOCK_MONOTONIC, flags: 0 };
        let rc = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TXTIME,
            (&txt as *const SockTxtime).cast(),
            std::mem::size_of::<SockTxtime>() as u32,
        );
        assert_eq!(rc, 0, "SO_TXTIME: {}", std::io::Error::last_os_error());
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        sll.sll_halen = 6;
        let mut iov = libc::iovec { iov_base: frame.as_ptr() as *mut _, iov_len: frame.len() };
        let mut cbuf = [0u64; 8];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = (&mut sll as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(8) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_TXTIME;
        (*c).cmsg_len = libc::CMSG_LEN(8) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u64>(), at_ns);
        let sent = libc::sendmsg(fd, &msg, 0);
        assert_eq!(sent, frame.len() as isize, "sendmsg: {}", std::io::Error::last_os_error());
        libc::close(fd);
    }
}

/// A segment carrying its sender's departure time (TCP stamps every segment it sends, and the
/// stamp crosses the veth) is timed by that stamp at the classifier's TCX ingress, not by the
/// clock; one without (test_run cannot stamp) is timed by the clock.
#[test]
fn the_departure_stamp_times_a_segment_that_has_one() {
    let Some(dp) = load() else { return };
    testing::enter_private_netns();
    testing::sh("ip link add mtsa type veth peer name mtsb && ip link set mtsa up && ip link set mtsb up");
    let (a, b) = (testing::ifindex("mtsa"), testing::ifindex("mtsb"));
    let _link =
        mirror_bpf::attach::attach_tcx(&dp.skel().progs.tcx_ingress_mirror, a, false).expect("attach");
    // Far from now, so the clock could not give these times.
    let base = 1_000_000_000_000_000;
    send_stamped(b, &fixtures::v4_request(50001, PORT_HTTP, REQ_GET_BAR), base);
    send_stamped(b, &fixtures::v4_response(PORT_HTTP, 50001, RESP_200), base + 7_654_321);
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(50001)).expect("the flow, seen at ingress");
    assert_eq!(f.http_timed, 1);
    assert_eq!(f.http_time_max, Some(Duration::from_nanos(7_654_321)), "timed by the stamps");
    let last = f.forward.last_seen_ns.max(f.reverse.last_seen_ns);
    assert_eq!(last, base + 7_654_321, "the flow's times are the stamps too");

    run(&dp, &fixtures::v4_request(50002, PORT_HTTP, REQ_GET_BAR));
    sleep(Duration::from_millis(5));
    run(&dp, &fixtures::v4_response(PORT_HTTP, 50002, RESP_200));
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(50002)).unwrap();
    let took = f.http_time_max.unwrap();
    assert!(took >= Duration::from_millis(5) && took < Duration::from_secs(1), "{took:?}");
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

/// A busy flow keeps its shared entry (its pending requests) while nine times as many new flows
/// as there are slots take one: the hand that gives slots out passes over slots used since its
/// last pass. And the index holds exactly the slots' owners.
#[test]
fn a_busy_flow_keeps_its_shared_entry_through_a_churn_of_new_flows() {
    const SLOTS: u32 = 64;
    let Some(dp) = testing::require_root()
        .then(|| testing::load(&DatapathOptions { flows_max: SLOTS, ..Default::default() }))
    else {
        return;
    };
    let request = |cport: u16, seq: u32| {
        PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
            .tcp(cport, PORT_HTTP, 0x18)
            .seq(seq)
            .payload(REQ_GET_BAR)
            .build()
    };
    let (busy, rounds) = (50000u16, 10u64);
    let mut new_port = 20000u16;
    let mut new_flows = |dp: &Dp, n: u32| {
        for _ in 0..n {
            run(dp, &request(new_port, 1));
            new_port += 1;
        }
    };
    let (mut cseq, mut sseq) = (1000u32, 5000u32);
    let mut exchange = |dp: &Dp, churn: u32| {
        run(dp, &request(busy, cseq));
        cseq += REQ_GET_BAR.len() as u32;
        // The request is pending while new flows take three quarters of the slots: given out
        // in turn, its slot would go to one of them every other round. Touched more often than
        // the hand comes round, it keeps its slot (as it would keep an LRU entry).
        new_flows(dp, churn);
        let answer = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
            .tcp(PORT_HTTP, busy, 0x18)
            .seq(sseq)
            .payload(RESP_200)
            .build();
        run(dp, &answer);
        sseq += RESP_200.len() as u32;
        new_flows(dp, 10);
    };
    exchange(&dp, 0);
    for _ in 0..rounds {
        exchange(&dp, SLOTS * 3 / 4);
    }
    // Only the busy flow is answered (its flow_table entry, as small, may have gone).
    let timed = hist(&dp, HistKind::HttpResponse, 2).map_or(0, |h| h.count);
    assert_eq!(timed, rounds + 1, "every response of the busy flow found its request");
    assert_eq!(dp.counters().unwrap().get(S::STAT_TIMING_INSERT_FAILED), 0);

    // The index: every entry names a slot its key owns, and there are no more than the slots.
    let maps = &dp.skel().maps;
    let mut owners = 0;
    for k in maps.flow_timing_index.keys() {
        let slot = maps.flow_timing_index.lookup(&k, MapFlags::ANY).unwrap().expect("an index entry");
        let v = maps.flow_timing.lookup(&slot, MapFlags::ANY).unwrap().expect("its slot");
        assert_eq!(&v[..k.len()], &k[..], "slot {slot:?} is owned by the key that names it");
        owners += 1;
    }
    assert!(owners > 0 && owners <= SLOTS as usize, "{owners} index entries for {SLOTS} slots");
}
