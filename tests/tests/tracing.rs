//! Kernel stack latency and network-stack CPU cost, from the tracing programs, on real
//! pod-to-pod and node-to-pod traffic.

use mirror_bpf::testing::require_root;
use mirror_bpf::{HistKind, TraceGroup, Tracing};
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::client::{self, url};

/// A client and an nginx server pod, attached, with the tracing programs loaded and `group` on.
fn bed_with(group: TraceGroup) -> Testbed {
    let mut bed = Testbed::builder(&PODS).nginx("server", HTTP).no_mirror().build();
    let tracing = bed.dp.load_tracing().unwrap();
    // Every packet: the stages' counts are compared with the packets sent.
    tracing.set_stack_sample(1);
    // Loaded is not on: nothing is measured before a group is switched on.
    let cpu: u64 = tracing.cpu_times().unwrap().iter().map(|c| c.syscall_ns + c.softirq_rx_ns).sum();
    assert_eq!(cpu, 0);
    assert!(bed.histogram(HistKind::StackXmit, None).is_none());
    bed.dp.set_trace_group(group, true).unwrap();
    bed
}

/// The tracing programs the data path of `bed` holds.
fn tracing(bed: &Testbed) -> &Tracing {
    bed.dp.tracing().expect("loaded by bed_with")
}

/// `n` keep-alive requests for nginx's /foo.
fn foo_urls(bed: &Testbed, n: usize) -> Vec<String> {
    let server = bed.pod("server").addr(false);
    (0..n).map(|_| url(server, HTTP, "/foo")).collect()
}

#[test]
fn stack_stages_are_present_and_ordered_for_pod_to_pod_packets() {
    if !require_root() {
        return;
    }
    let mut bed = bed_with(TraceGroup::Stack);
    eprintln!("fexit: {:?}", tracing(&bed).fexit());
    let urls = foo_urls(&bed, 20);
    assert!(client::get_keepalive(&bed.pod("client").ns, &urls).iter().all(|s| *s == 200));

    let rx_tc = bed.histogram(HistKind::StackRxTc, None).expect("netif_receive_skb to tc ingress");
    let tc_xmit = bed.histogram(HistKind::StackTcXmit, None).expect("tc ingress to the other veth");
    let total = bed.histogram(HistKind::StackXmit, None).expect("netif_receive_skb to the other veth");
    // Every forwarded packet has all three, and the stages add up in order.
    assert!(total.count >= 40, "{} packets", total.count);
    assert_eq!((rx_tc.count, tc_xmit.count), (total.count, total.count));
    let (a, b, t) = (rx_tc.mean().unwrap(), tc_xmit.mean().unwrap(), total.mean().unwrap());
    assert!(a <= t && b <= t, "rx->tc {a:?}, tc->xmit {b:?}, total {t:?}");
    let sum = (a + b).as_nanos() as i128;
    assert!((sum - t.as_nanos() as i128).abs() * 10 <= t.as_nanos() as i128 + 1000, "{a:?} + {b:?} vs {t:?}");

    // 1 in 4: the same exchange gives about a quarter of the samples.
    bed.dp.tracing_mut().unwrap().set_stack_sample(4);
    assert!(client::get_keepalive(&bed.pod("client").ns, &urls).iter().all(|s| *s == 200));
    let sampled = bed.histogram(HistKind::StackXmit, None).unwrap().count - total.count;
    assert!(
        sampled * 8 >= total.count && sampled * 2 <= total.count,
        "{sampled} sampled of about {} packets",
        total.count
    );
    let total = bed.histogram(HistKind::StackXmit, None).unwrap();

    // Off: no more samples.
    bed.dp.set_trace_group(TraceGroup::Stack, false).unwrap();
    client::get_keepalive(&bed.pod("client").ns, &urls[..5]);
    assert_eq!(bed.histogram(HistKind::StackXmit, None).unwrap().count, total.count);
}

#[test]
fn stack_stages_for_packets_read_by_a_local_socket() {
    if !require_root() {
        return;
    }
    let bed = bed_with(TraceGroup::Stack);
    client::get_keepalive(bed.node(), &foo_urls(&bed, 10));
    let read = bed.histogram(HistKind::StackRead, None).expect("netif_receive_skb to the socket read");
    let tc_read = bed.histogram(HistKind::StackTcRead, None).expect("tc ingress to the socket read");
    assert!(read.count >= 10 && tc_read.count == read.count, "{} / {}", read.count, tc_read.count);
    assert!(tc_read.mean() <= read.mean());
}

#[test]
fn network_cpu_time_is_counted_while_on() {
    if !require_root() {
        return;
    }
    let bed = bed_with(TraceGroup::Cpu);
    client::get_keepalive(&bed.pod("client").ns, &foo_urls(&bed, 20));
    let times = tracing(&bed).cpu_times().unwrap();
    let syscall: u64 = times.iter().map(|c| c.syscall_ns).sum();
    let softirq: u64 = times.iter().map(|c| c.softirq_rx_ns + c.softirq_tx_ns).sum();
    assert!(syscall > 0 && softirq > 0, "{times:?}");
    // Far below the wall time of the exchange: nothing counted twice or while asleep.
    assert!(syscall + softirq < 2_000_000_000, "{times:?}");
}

/// Moves 1 GiB with read(2)/write(2) only, in the pod: over a TCP connection to its own
/// address (`target` = "socket"), or into a file on tmpfs ("file").
const MOVE_GIB: &str = r#"
import os, socket, sys, threading
CHUNK, N = 1 << 16, 1 << 14
buf = b"x" * CHUNK
if sys.argv[1] == "file":
    fd = os.open("/dev/shm/mirror-e2e-%d" % os.getpid(), os.O_CREAT | os.O_WRONLY)
    for i in range(N):
        if i % 256 == 0:
            os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, buf)
    os.close(fd)
    os.unlink("/dev/shm/mirror-e2e-%d" % os.getpid())
else:
    srv = socket.create_server((sys.argv[2], 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    def drain():
        left = CHUNK * N
        while left:
            left -= len(os.read(s.fileno(), 1 << 20))
    t = threading.Thread(target=drain)
    t.start()
    for _ in range(N):
        view = memoryview(buf)
        while view:
            view = view[os.write(c.fileno(), view):]
    t.join()
"#;

#[test]
fn read_and_write_count_on_ip_sockets_and_not_on_files() {
    if !require_root() {
        return;
    }
    let bed = bed_with(TraceGroup::Cpu);
    let syscall_ns = || tracing(&bed).cpu_times().unwrap().iter().map(|c| c.syscall_ns).sum::<u64>();
    let pod = bed.pod("client");
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), MOVE_GIB).unwrap();
    let run = |args: &str| {
        let before = syscall_ns();
        pod.ns.sh(&format!("python3 {} {args}", script.path().display()));
        syscall_ns() - before
    };
    let file = run("file");
    let socket = run(&format!("socket {}", pod.addr(false)));
    // 1 GiB through TCP costs well over 100 ms of system time; the same written to a file
    // must add next to nothing (other tests' few requests at most).
    assert!(socket > 100_000_000, "socket {socket} ns, file {file} ns");
    assert!(file * 10 < socket, "socket {socket} ns, file {file} ns");
}
