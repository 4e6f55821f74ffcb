//! Packets the kernel drops, as triggers, with the real agent: a rule like a NetworkPolicy
//! (iptables, then nftables, dropping a pod's port in the node's forward path) drops the
//! client's SYN; the agent writes the dropped SYN to the mirror (Ethernet source
//! 02:64:72:6f:70:73) with the reason `netfilter_drop` and the kernel's location in its event,
//! and the flow is marked, so the client's retransmissions are copied from its veth. A port
//! nothing listens on (`no_socket`, dropped by the server pod's own stack) triggers the same
//! way; traffic to other ports, and drops of the node's own traffic, trigger nothing. Each is
//! checked against the client's own capture (the SYNs it sent) and the mirror's.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::pcap::{Packet, Trace};
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{Netns, Topology};
use mirror_e2e::workload::servers::Server;
use serde_json::Value;

/// The port the node's rule drops.
const DROPPED: u16 = 8080;
/// A port left alone.
const OPEN: u16 = 8081;
/// A port nothing listens on.
const CLOSED: u16 = 9;
/// A SYN.
const SYN: u8 = 0x02;
/// A RST.
const RST: u8 = 0x04;

/// How the node drops the port.
#[derive(Debug, Clone, Copy)]
enum Firewall {
    Iptables,
    Nftables,
}

impl Firewall {
    fn drop_port(self, node: &Netns, port: u16) {
        match self {
            Firewall::Iptables => {
                node.sh(&format!("iptables -I FORWARD -p tcp --dport {port} -j DROP"));
            }
            Firewall::Nftables => {
                node.sh("nft add table inet podpolicy");
                node.sh("nft add chain inet podpolicy podfwd '{ type filter hook forward priority 0; }'");
                node.sh(&format!("nft add rule inet podpolicy podfwd tcp dport {port} drop"));
            }
        }
    }
}

/// Connects from `ns` to `to`, giving up after `wait`: whether it connected.
fn connect(ns: &Netns, to: SocketAddr, wait: Duration) -> bool {
    let _inside = ns.enter();
    TcpStream::connect_timeout(&to, wait).is_ok()
}

/// The SYNs the client sent to `port`, first one first.
fn syns_to(client: &Trace, port: u16) -> Vec<&Packet> {
    client.packets.iter().filter(|p| p.flags & SYN != 0 && p.dst.port() == port).collect()
}

/// The agent's events, as JSON.
fn events(env: &AgentEnv) -> Vec<Value> {
    let v: Value = serde_json::from_str(&env.ctl_ok(&["-o", "json", "events"])).expect("events as JSON");
    v.as_array().expect("a list of events").clone()
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
    let cfg = AgentConfig { rules: vec!["drop=netfilter_drop".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    firewall.drop_port(&topo.node, DROPPED);

    let (client_file, sink_file) = (dir.path().join("client.pcap"), dir.path().join("sink.pcap"));
    let client_cap = Capture::start(&topo.pod("client").ns, "eth0", "tcp", &client_file);
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), "tcp", &sink_file);
    let server: IpAddr = topo.pod("server").addr(false);
    let client_ns = &topo.pod("client").ns;
    // The SYN at 0, its retransmissions at 1 s and 3 s.
    assert!(!connect(client_ns, SocketAddr::new(server, DROPPED), Duration::from_millis(3500)));
    assert!(connect(client_ns, SocketAddr::new(server, OPEN), Duration::from_secs(2)), "the open port");
    std::thread::sleep(SETTLE);
    let (client_trace, sink_trace) = (client_cap.stop(), sink_cap.stop());

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
    let copied_ms = ev["drop"]["copied_ms"].as_f64().expect("the copy written");
    let st = env.status();
    let retrans = u64::try_from(retransmitted.len()).unwrap();
    assert!(
        st["drops"]["netfilter_drop"].as_u64().unwrap_or(0) > retrans,
        "every SYN counted by its reason: {}",
        st["drops"]
    );
    assert_eq!(st["counters"]["drop_triggers"], 1, "{}", st["counters"]);
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

/// nftables drop of a pod's port in the forward path.
#[test]
fn a_syn_dropped_by_nftables_reaches_the_mirror_with_its_reason() {
    if !require_root() {
        return;
    }
    dropped_by_the_node(Firewall::Nftables);
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
    let cfg = AgentConfig { rules: vec!["drop".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));

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
    assert_eq!(env.status()["drops"]["no_socket"], 1, "{}", env.status()["drops"]);
    drop(agent);
}
