//! The kernel's drops by pod, and drops in the pods' own stacks, with the real agent. Every drop
//! of a pod's packet is counted by reason and by pod, whether a rule asks or not: at the pod it
//! was going to (the node's policy dropping a connection to the server pod, a port nothing
//! listens on, a full socket queue), else at the pod it came from (the client pod's own firewall
//! dropping what it sends); the node's own drops are not counted. The counts are exact against
//! the clients' own record (their captures, the datagrams they sent and the server received).
//! A full socket queue (a UDP socket that never reads, with the smallest receive buffer) and a
//! port nothing listens on trigger as the kernel names them (`socket_rcvbuff`, `no_socket`).

mod drop_common;

use std::net::SocketAddr;
use std::time::Duration;

use drop_common::{connect, drop_config, drop_metrics, events, pod_label, start_attached, syns_to, RST};
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentEnv, Binaries};
use mirror_e2e::capture::pcap::Packet;
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::proc::Proc;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{nsenter, Netns, Topology};

/// The port the node's rule drops.
const DROPPED: u16 = 8080;
/// A port nothing listens on.
const CLOSED: u16 = 9;
/// The server pod's UDP socket that never reads.
const FULL: u16 = 5000;
/// The port the client pod's own firewall drops.
const EGRESS: u16 = 7;
/// Datagrams sent to the full socket.
const DATAGRAMS: u32 = 100;

/// A UDP socket on `addr` in `ns` with the smallest receive buffer, that reads nothing until
/// told, then reads what was queued and says how many.
fn full_socket(ns: &Netns, addr: SocketAddr) -> Proc {
    let script = format!(
        "import socket, sys\n\
         s = socket.socket(socket.AF_INET6 if {v6} else socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)\n\
         s.bind(('{ip}', {port}))\n\
         print('ready', flush=True)\n\
         sys.stdin.readline()\n\
         s.setblocking(False)\n\
         n = 0\n\
         while True:\n\
         \x20   try:\n\
         \x20       s.recv(65535)\n\
         \x20   except BlockingIOError:\n\
         \x20       break\n\
         \x20   n += 1\n\
         print('received', n, flush=True)\n",
        v6 = if addr.is_ipv6() { "True" } else { "False" },
        ip = addr.ip(),
        port = addr.port()
    );
    let mut cmd = nsenter(&ns.path(), "python3");
    cmd.args(["-c", &script]);
    let mut p = Proc::spawn_with_input("a UDP socket that never reads", &mut cmd);
    p.wait_for_output("ready", Duration::from_secs(5));
    p
}

/// Sends `n` datagrams of 512 bytes from `ns` to `to`: how many the kernel refused at once
/// (`EPERM`: the pod's own firewall dropped them).
fn send_datagrams(ns: &Netns, to: SocketAddr, n: u32) -> u32 {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET6 if {v6} else socket.AF_INET, socket.SOCK_DGRAM)\n\
         refused = 0\n\
         for i in range({n}):\n\
         \x20   try:\n\
         \x20       s.sendto(b'x' * 512, ('{ip}', {port}))\n\
         \x20   except PermissionError:\n\
         \x20       refused += 1\n\
         print(refused)\n",
        v6 = if to.is_ipv6() { "True" } else { "False" },
        ip = to.ip(),
        port = to.port()
    );
    let out = ns.command("python3").args(["-c", &script]).output().expect("python3");
    assert!(out.status.success(), "sending datagrams: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count")
}

/// The kernel's count of UDP datagrams a full receive buffer refused, in `ns`.
fn rcvbuf_errors(ns: &Netns) -> u64 {
    let snmp = ns.sh("cat /proc/net/snmp");
    let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    let [names, values] = udp[..] else { panic!("no Udp lines: {snmp}") };
    let i = names.split_whitespace().position(|n| n == "RcvbufErrors").expect("RcvbufErrors");
    values.split_whitespace().nth(i).and_then(|v| v.parse().ok()).expect("a count")
}

/// With no rule for them, the node's policy dropping a connection to the server pod, the client
/// pod's own firewall dropping what it sends, and a port nothing listens on are counted by
/// reason and pod; a drop rule for the full socket queue's reason triggers on its first drop,
/// and all its drops are counted at the server pod, exactly as many as the server did not get.
#[test]
fn drops_are_counted_by_reason_and_pod_a_rule_or_not() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let cfg = drop_config(&["drop=socket_rcvbuff"], true);
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    let (client_pod, server_pod) = (pod_label(&env, "vethclient"), pod_label(&env, "vethserver"));
    topo.node.sh(&format!("iptables -I FORWARD -p tcp --dport {DROPPED} -j DROP"));
    client.ns.sh(&format!("iptables -I OUTPUT -p udp --dport {EGRESS} -j DROP"));
    let mut socket = full_socket(&server.ns, SocketAddr::new(server.addr(false), FULL));
    let errors_before = rcvbuf_errors(&server.ns);

    // The node's own: to a closed port on its loopback.
    assert!(!connect(&topo.node, SocketAddr::new([127, 0, 0, 1].into(), CLOSED), Duration::from_secs(1)));
    let client_file = dir.path().join("client.pcap");
    let client_cap = Capture::start(&client.ns, "eth0", "tcp or udp", &client_file);
    // The SYN at 0, its retransmission at 1 s.
    assert!(!connect(&client.ns, SocketAddr::new(server.addr(false), DROPPED), Duration::from_millis(1500)));
    assert!(!connect(&client.ns, SocketAddr::new(server.addr(false), CLOSED), Duration::from_secs(1)));
    let refused = send_datagrams(&client.ns, SocketAddr::new(server.addr(false), EGRESS), 3);
    assert_eq!(refused, 3, "the client pod's firewall refused each");
    assert_eq!(send_datagrams(&client.ns, SocketAddr::new(server.addr(false), FULL), DATAGRAMS), 0);
    std::thread::sleep(SETTLE);
    let client_trace = client_cap.stop();
    socket.send("read");
    socket.wait_for_output("received", Duration::from_secs(5));
    let received: u64 = socket
        .output()
        .lines()
        .find_map(|l| l.strip_prefix("received ")?.trim().parse().ok())
        .expect("how many the server read");

    let forwarded = syns_to(&client_trace, DROPPED).len() as u64;
    assert!(forwarded >= 2, "the SYN and its retransmission");
    assert_eq!(syns_to(&client_trace, CLOSED).len(), 1, "one SYN, refused");
    let sent = client_trace.datagrams.iter().filter(|d| d.dst.port() == FULL).count() as u64;
    assert_eq!(sent, u64::from(DATAGRAMS), "the client's datagrams on its link");
    assert!(client_trace.datagrams.iter().all(|d| d.dst.port() != EGRESS), "none passed its firewall");
    let overflowed = sent - received;
    assert!(received >= 1 && overflowed >= 1, "{received} of {sent} queued");
    assert_eq!(rcvbuf_errors(&server.ns) - errors_before, overflowed, "the kernel's own count");

    let mut want = vec![
        ("netfilter_drop".to_string(), client_pod.clone(), 3),
        ("netfilter_drop".to_string(), server_pod.clone(), forwarded),
        ("no_socket".to_string(), server_pod.clone(), 1),
        ("socket_rcvbuff".to_string(), server_pod.clone(), overflowed),
    ];
    want.sort();
    assert_eq!(drop_metrics(&topo.node), want, "mirror_drops_total by reason and pod");
    let st = env.status();
    let by_reason = serde_json::json!({
        "netfilter_drop": forwarded + 3, "no_socket": 1, "socket_rcvbuff": overflowed
    });
    assert_eq!(st["drops"], by_reason, "by reason: {}", st["drops"]);
    // The rule's reason triggered once, at the server pod; the others, asked for by no rule, not.
    let evs = events(&env);
    let [ev] = &evs[..] else { panic!("one trigger: {evs:?}") };
    assert_eq!(
        (&ev["drop"]["reason"], &ev["pod"]),
        (&"socket_rcvbuff".into(), &server_pod.as_str().into()),
        "{ev}"
    );
    assert_eq!(ev["server_side"]["server"], SocketAddr::new(server.addr(false), FULL).to_string(), "{ev}");
    assert_eq!(st["counters"]["drop_triggers"], 1, "{}", st["counters"]);
    eprintln!("by pod: {:?}; {received} of {sent} datagrams queued", drop_metrics(&topo.node));
    drop(agent);
}

/// A port nothing listens on: the server pod's stack drops the SYN (`no_socket`) and answers
/// with a RST, both on the mirror. The node's own connection to a closed port of its own, also a
/// `no_socket` drop, triggers nothing and is not counted.
#[test]
fn a_closed_port_triggers_and_the_nodes_own_drops_do_not() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let cfg = drop_config(&["drop"], false);
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);

    // The node's own: to a closed port on its loopback.
    assert!(!connect(&topo.node, SocketAddr::new([127, 0, 0, 1].into(), CLOSED), Duration::from_secs(1)));
    std::thread::sleep(SETTLE);
    assert!(events(&env).is_empty(), "the node's own drop triggered");
    assert!(env.status()["drops"].as_object().is_none_or(|d| d.is_empty()), "{}", env.status()["drops"]);

    let (client_file, sink_file) = (dir.path().join("client.pcap"), dir.path().join("sink.pcap"));
    let client_cap = Capture::start(&topo.pod("client").ns, "eth0", "tcp", &client_file);
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), "tcp", &sink_file);
    let server = SocketAddr::new(topo.pod("server").addr(false), CLOSED);
    assert!(!connect(&topo.pod("client").ns, server, Duration::from_secs(1)), "refused");
    std::thread::sleep(SETTLE);
    let (client_trace, sink_trace) = (client_cap.stop(), sink_cap.stop());
    let sent = syns_to(&client_trace, CLOSED);
    assert_eq!(sent.len(), 1, "one SYN, refused: {sent:?}");
    let flow = sent[0].flow();
    let dropped: Vec<&Packet> =
        sink_trace.dropped.iter().map(|d| &d.packet).filter(|p| p.flow() == flow).collect();
    assert_eq!(dropped.len(), 1, "{:?}", sink_trace.dropped);
    assert_eq!(dropped[0].id(), sent[0].id(), "the copy is the client's SYN");
    let rst: Vec<&Packet> =
        client_trace.packets.iter().filter(|p| p.flow() == flow && p.flags & RST != 0).collect();
    let copied: Vec<_> = sink_trace.packets.iter().filter(|p| p.flow() == flow).map(Packet::id).collect();
    assert_eq!(
        copied,
        rst.iter().map(|p| p.id()).collect::<Vec<_>>(),
        "the server's RST copied after the mark"
    );
    let evs = events(&env);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["drop"]["reason"], "no_socket", "{}", evs[0]);
    assert_eq!(evs[0]["pod"], pod_label(&env, "vethserver").as_str(), "{}", evs[0]);
    assert_eq!(env.status()["drops"]["no_socket"], 1, "{}", env.status()["drops"]);
    drop(agent);
}
