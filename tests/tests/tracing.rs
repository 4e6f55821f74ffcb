//! Kernel stack latency and network-stack CPU cost, from the tracing programs, on real
//! pod-to-pod and node-to-pod traffic.

use mirror_bpf::testing::require_root;
use mirror_bpf::{AttachMode, HistKind, MirrorMethod, TraceGroup, Tracing};
use mirror_e2e::client::{self, url};
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::testbed::Testbed;

fn hist(bed: &Testbed, kind: HistKind) -> Option<mirror_bpf::Histogram> {
    let hs: Vec<_> = bed.dp.histograms().unwrap().into_iter().filter(|h| h.kind == kind).collect();
    let mut all = hs.first()?.clone();
    for h in &hs[1..] {
        all.merge(h);
    }
    Some(all)
}

#[test]
fn stack_stages_are_present_and_ordered_for_pod_to_pod_packets() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::new(&PODS);
    bed.nginx("server", HTTP);
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);
    let mut tracing = Tracing::load(&bed.dp).unwrap();
    eprintln!("fexit: {:?}", tracing.fexit());
    tracing.set(&mut bed.dp, TraceGroup::Stack, true).unwrap();

    let server = bed.pod("server").addr(false);
    let urls: Vec<String> = (0..20).map(|_| url(server, HTTP, "/foo")).collect();
    assert!(client::get_keepalive(&bed.pod("client").ns, &urls).iter().all(|s| *s == 200));

    let rx_tc = hist(&bed, HistKind::StackRxTc).expect("netif_receive_skb to tc ingress");
    let tc_xmit = hist(&bed, HistKind::StackTcXmit).expect("tc ingress to the other veth");
    let total = hist(&bed, HistKind::StackXmit).expect("netif_receive_skb to the other veth");
    // Every forwarded packet has all three, and the stages add up in order.
    assert!(total.count >= 40, "{} packets", total.count);
    assert_eq!((rx_tc.count, tc_xmit.count), (total.count, total.count));
    let (a, b, t) = (rx_tc.mean().unwrap(), tc_xmit.mean().unwrap(), total.mean().unwrap());
    assert!(a <= t && b <= t, "rx->tc {a:?}, tc->xmit {b:?}, total {t:?}");
    let sum = (a + b).as_nanos() as i128;
    assert!((sum - t.as_nanos() as i128).abs() * 10 <= t.as_nanos() as i128 + 1000, "{a:?} + {b:?} vs {t:?}");

    // Off: no more samples.
    tracing.set(&mut bed.dp, TraceGroup::Stack, false).unwrap();
    client::get_keepalive(&bed.pod("client").ns, &urls[..5]);
    assert_eq!(hist(&bed, HistKind::StackXmit).unwrap().count, total.count);
}

#[test]
fn stack_stages_for_packets_read_by_a_local_socket() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::new(&PODS);
    bed.nginx("server", HTTP);
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);
    let mut tracing = Tracing::load(&bed.dp).unwrap();
    tracing.set(&mut bed.dp, TraceGroup::Stack, true).unwrap();
    let server = bed.pod("server").addr(false);
    let urls: Vec<String> = (0..10).map(|_| url(server, HTTP, "/foo")).collect();
    client::get_keepalive(bed.node(), &urls);
    let read = hist(&bed, HistKind::StackRead).expect("netif_receive_skb to the socket read");
    let tc_read = hist(&bed, HistKind::StackTcRead).expect("tc ingress to the socket read");
    assert!(read.count >= 10 && tc_read.count == read.count, "{} / {}", read.count, tc_read.count);
    assert!(tc_read.mean() <= read.mean());
}

#[test]
fn network_cpu_time_is_counted_while_on() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::new(&PODS);
    bed.nginx("server", HTTP);
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);
    let mut tracing = Tracing::load(&bed.dp).unwrap();
    let before: u64 = tracing.cpu_times().unwrap().iter().map(|c| c.syscall_ns + c.softirq_rx_ns).sum();
    assert_eq!(before, 0, "off by default");
    tracing.set(&mut bed.dp, TraceGroup::Cpu, true).unwrap();
    let server = bed.pod("server").addr(false);
    let urls: Vec<String> = (0..20).map(|_| url(server, HTTP, "/foo")).collect();
    client::get_keepalive(&bed.pod("client").ns, &urls);
    let times = tracing.cpu_times().unwrap();
    let syscall: u64 = times.iter().map(|c| c.syscall_ns).sum();
    let softirq: u64 = times.iter().map(|c| c.softirq_rx_ns + c.softirq_tx_ns).sum();
    assert!(syscall > 0 && softirq > 0, "{times:?}");
    // Far below the wall time of the exchange: nothing counted twice or while asleep.
    assert!(syscall + softirq < 2_000_000_000, "{times:?}");
}
