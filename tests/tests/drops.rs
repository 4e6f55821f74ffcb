//! Packets the kernel drops, as triggers, with the real agent: a rule like a NetworkPolicy
//! (iptables, nftables, ip6tables over IPv6, dropping a pod's port in the node's forward path)
//! drops the client's SYN; the agent writes the dropped SYN to the mirror (Ethernet source
//! 02:64:72:6f:70:73) with the reason `netfilter_drop` and the kernel's location in its event,
//! and the flow is marked, so the client's retransmissions are copied from its veth; traffic
//! to other ports is untouched. A connection through a Service's ClusterIP (kube-proxy's DNAT)
//! dropped after the translation names the Service's pod and both tuples; a packet conntrack
//! finds invalid triggers the rule of its port. Each is checked against the client's own
//! capture (the SYNs it sent) and the mirror's. Drops in the pods' own stacks and the counts
//! by pod: `drops_pods.rs`; a flood: `drops_flood.rs`.

mod drop_common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use drop_common::{
    connect, ctl_capture, drop_config, events, pod_label, start_attached, syns_to, tshark_lines, DROP_SRC,
};
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::pcap::Packet;
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, SERVICE_PORT};
use mirror_e2e::topology::netns::{Netns, Topology};
use mirror_e2e::workload::servers::Server;

/// The port the node's rule drops.
const DROPPED: u16 = 8080;
/// A port left alone.
const OPEN: u16 = 8081;

/// How the node drops the port.
#[derive(Debug, Clone, Copy)]
enum Firewall {
    Iptables,
    Nftables,
    /// ip6tables, the client connecting over IPv6.
    Ip6tables,
}

impl Firewall {
    fn drop_port(self, node: &Netns, port: u16) {
        match self {
            Firewall::Iptables => {
                node.sh(&format!("iptables -I FORWARD -p tcp --dport {port} -j DROP"));
            }
            Firewall::Ip6tables => {
                node.sh(&format!("ip6tables -I FORWARD -p tcp --dport {port} -j DROP"));
            }
            Firewall::Nftables => {
                node.sh("nft add table inet podpolicy");
                node.sh("nft add chain inet podpolicy podfwd '{ type filter hook forward priority 0; }'");
                node.sh(&format!("nft add rule inet podpolicy podfwd tcp dport {port} drop"));
            }
        }
    }
}

/// One run with `firewall` dropping [`DROPPED`]: the dropped SYN on the mirror with its reason,
/// the retransmissions copied, the open port untouched. Returns the copy's lateness, ms.
fn dropped_by_the_node(firewall: Firewall) -> f64 {
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let server_ns = &topo.pod("server").ns;
    let _dropped = Server::asyncio(server_ns, DROPPED, dir.path());
    let _open = Server::asyncio(server_ns, OPEN, dir.path());
    let cfg = drop_config(&["drop=netfilter_drop"], false);
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);
    firewall.drop_port(&topo.node, DROPPED);

    let (client_file, sink_file) = (dir.path().join("client.pcap"), dir.path().join("sink.pcap"));
    let client_cap = Capture::start(&topo.pod("client").ns, "eth0", "tcp", &client_file);
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), "tcp", &sink_file);
    let ctl_file = dir.path().join("mirrorctl.pcapng");
    let mut ctl = ctl_capture(&bins, &topo.node, &env, &ctl_file);
    let server: IpAddr = topo.pod("server").addr(matches!(firewall, Firewall::Ip6tables));
    let client_ns = &topo.pod("client").ns;
    // The SYN at 0, its retransmissions at 1 s and 3 s.
    assert!(!connect(client_ns, SocketAddr::new(server, DROPPED), Duration::from_millis(3500)));
    assert!(connect(client_ns, SocketAddr::new(server, OPEN), Duration::from_secs(2)), "the open port");
    std::thread::sleep(SETTLE);
    let (client_trace, sink_trace) = (client_cap.stop(), sink_cap.stop());
    let status = ctl.stop(libc::SIGTERM, Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "mirrorctl capture: {}", ctl.output());

    let sent = syns_to(&client_trace, DROPPED);
    assert!(sent.len() >= 3, "the client's SYN and two retransmissions: {sent:?}");
    let flow = sent[0].flow();
    // The first SYN, dropped before anything marked the flow: the agent's copy of it.
    let dropped: Vec<&Packet> =
        sink_trace.dropped.iter().map(|d| &d.packet).filter(|p| p.flow() == flow).collect();
    assert_eq!(dropped.len(), 1, "the dropped SYN once on the mirror: {:?}", sink_trace.dropped);
    assert_eq!(dropped[0].id(), sent[0].id(), "the copy is the client's first SYN");
    // Its retransmissions, copied from the client's veth (dropped too, after the mark).
    let copied: Vec<_> = sink_trace.packets.iter().filter(|p| p.flow() == flow).map(Packet::id).collect();
    let retransmitted: Vec<_> = sent[1..].iter().map(|p| p.id()).collect();
    assert_eq!(copied, retransmitted, "the retransmissions, each once");
    // The open port's connection is not on the mirror.
    assert!(
        sink_trace
            .packets
            .iter()
            .chain(sink_trace.dropped.iter().map(|d| &d.packet))
            .all(|p| p.dst.port() != OPEN && p.src.port() != OPEN),
        "nothing of the open port mirrored"
    );

    let evs = events(&env);
    assert_eq!(evs.len(), 1, "one trigger: {evs:?}");
    let ev = &evs[0];
    assert_eq!((&ev["kind"], &ev["drop"]["reason"]), (&"drop".into(), &"netfilter_drop".into()), "{ev}");
    assert_eq!(ev["client_side"]["client"], sent[0].src.to_string(), "{ev}");
    assert_eq!(ev["server_side"]["server"], sent[0].dst.to_string(), "{ev}");
    let location = ev["drop"]["location"].as_str().expect("a location");
    // Where netfilter frees it: nf_hook_slow, or the nftables chain (iptables-nft too).
    assert!(
        ["nf_", "nft_", "ipt_"].iter().any(|p| location.starts_with(p)) && location.contains("+0x"),
        "dropped in netfilter: {location}"
    );
    assert_eq!(ev["pod"], pod_label(&env, "vethserver").as_str(), "the pod it was going to: {ev}");
    let copied_ms = ev["drop"]["copied_ms"].as_f64().expect("the copy written");
    let st = env.status();
    let retrans = u64::try_from(retransmitted.len()).unwrap();
    assert!(
        st["drops"]["netfilter_drop"].as_u64().unwrap_or(0) > retrans,
        "every SYN counted by its reason: {}",
        st["drops"]
    );
    assert_eq!(st["counters"]["drop_triggers"], 1, "{}", st["counters"]);
    // mirrorctl's capture, read by tshark: the dropped SYN first, commented with its reason and
    // location, then its retransmissions.
    let lines = tshark_lines(&ctl_file);
    for l in &lines {
        eprintln!("tshark: {l}");
    }
    let [first, rest @ ..] = &lines[..] else { panic!("nothing in mirrorctl's capture") };
    assert!(first.starts_with(&format!("{DROP_SRC}\t")), "the drop's copy first: {lines:?}");
    assert!(
        first.contains(&format!("dropped by the kernel: netfilter_drop at {location}; mirrored by rule 1")),
        "{first}"
    );
    assert_eq!(rest.len(), retransmitted.len(), "then the retransmissions: {lines:?}");
    eprintln!(
        "{firewall:?}: the dropped SYN written to the sink {copied_ms:.3} ms after the drop; at {location}"
    );
    drop(agent);
    copied_ms
}

/// iptables DROP of a pod's port in the forward path.
#[test]
fn a_syn_dropped_by_iptables_reaches_the_mirror_with_its_reason() {
    if !require_root() {
        return;
    }
    dropped_by_the_node(Firewall::Iptables);
}

/// ip6tables DROP of a pod's port in the forward path, the client connecting over IPv6.
#[test]
fn a_syn_dropped_by_ip6tables_over_ipv6_reaches_the_mirror_with_its_reason() {
    if !require_root() {
        return;
    }
    dropped_by_the_node(Firewall::Ip6tables);
}

/// nftables drop of a pod's port in the forward path.
#[test]
fn a_syn_dropped_by_nftables_reaches_the_mirror_with_its_reason() {
    if !require_root() {
        return;
    }
    dropped_by_the_node(Firewall::Nftables);
}

/// A connection to a Service's ClusterIP (kube-proxy's iptables DNAT to the server pod)
/// dropped in the forward path after its translation: the dropped SYN on the mirror as the
/// kernel held it (to the pod), the event naming the Service's pod and both tuples, the
/// retransmissions (to the ClusterIP) copied from the client's veth.
#[test]
fn a_syn_to_a_cluster_ip_dropped_after_its_translation_names_the_services_pod() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    let _web = Server::asyncio(&server.ns, SERVICE_PORT, dir.path());
    let proxy = KubeProxy::install(&topo.node, Flavour::Iptables, false, server.addr(false));
    let cfg = drop_config(&["drop=netfilter_drop"], false);
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);
    // The policy protects the pod's port: it sees the pod's own address, after the DNAT.
    topo.node.sh(&format!("iptables -I FORWARD -d {} -p tcp --dport {SERVICE_PORT} -j DROP", server.v4));

    let (client_file, sink_file) = (dir.path().join("client.pcap"), dir.path().join("sink.pcap"));
    let client_cap = Capture::start(&client.ns, "eth0", "tcp", &client_file);
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), "tcp", &sink_file);
    let vip = SocketAddr::new(proxy.vip(), SERVICE_PORT);
    // The SYN at 0, its retransmission at 1 s.
    assert!(!connect(&client.ns, vip, Duration::from_millis(1500)), "dropped");
    std::thread::sleep(SETTLE);
    let (client_trace, sink_trace) = (client_cap.stop(), sink_cap.stop());

    let sent = syns_to(&client_trace, SERVICE_PORT);
    assert!(sent.len() >= 2 && sent.iter().all(|p| p.dst == vip), "SYNs to the ClusterIP: {sent:?}");
    let pod = SocketAddr::new(server.addr(false), SERVICE_PORT);
    let dropped: Vec<&Packet> = sink_trace.dropped.iter().map(|d| &d.packet).collect();
    let [d] = dropped[..] else { panic!("the dropped SYN once on the mirror: {dropped:?}") };
    assert_eq!((d.src, d.dst, d.seq, d.flags), (sent[0].src, pod, sent[0].seq, sent[0].flags), "{d:?}");
    let copied: Vec<_> = sink_trace.packets.iter().filter(|p| p.src == sent[0].src).map(Packet::id).collect();
    let retransmitted: Vec<_> = sent[1..].iter().map(|p| p.id()).collect();
    assert_eq!(copied, retransmitted, "the retransmissions, each once, as the client sent them");

    let evs = events(&env);
    let [ev] = &evs[..] else { panic!("one trigger: {evs:?}") };
    assert_eq!(ev["drop"]["reason"], "netfilter_drop", "{ev}");
    assert_eq!(ev["pod"], pod_label(&env, "vethserver").as_str(), "the Service's pod: {ev}");
    assert_eq!(ev["nat"], true, "{ev}");
    assert_eq!(
        (&ev["client_side"]["server"], &ev["server_side"]["server"]),
        (&vip.to_string().into(), &pod.to_string().into()),
        "both tuples: {ev}"
    );
    drop(agent);
}

/// A packet conntrack finds invalid (a SYN/ACK no SYN came before), dropped by the node's
/// `--ctstate INVALID` rule: the rule's port (`port=`) and reason match, and the packet reaches
/// the mirror; a drop rule for another port does not trigger on it.
#[test]
fn a_packet_conntrack_finds_invalid_reaches_the_mirror() {
    if !require_root() {
        return;
    }
    const PORT: u16 = 8082;
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let rules = vec![format!("drop=netfilter_drop port={PORT}"), "drop=netfilter_drop port=9999".into()];
    let cfg = AgentConfig { rules, ..AgentConfig::default() };
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);
    topo.node.sh("iptables -I FORWARD -m conntrack --ctstate INVALID -j DROP");
    let sink_file = dir.path().join("sink.pcap");
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), "tcp", &sink_file);
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    mirror_e2e::workload::flood::segment(&client.ns, (client.v4, 40_000), (server.v4, PORT), 0x12);
    std::thread::sleep(SETTLE);
    let sink_trace = sink_cap.stop();
    let dropped: Vec<&Packet> = sink_trace.dropped.iter().map(|d| &d.packet).collect();
    let [p] = dropped[..] else { panic!("the invalid SYN/ACK once on the mirror: {dropped:?}") };
    assert_eq!((p.src.port(), p.dst.port(), p.flags), (40_000, PORT, 0x12), "{p:?}");
    let evs = events(&env);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(
        (&evs[0]["rule_id"], &evs[0]["drop"]["reason"]),
        (&1.into(), &"netfilter_drop".into()),
        "{}",
        evs[0]
    );
    drop(agent);
}
