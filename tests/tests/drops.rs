//! Packets the kernel drops, as triggers, with the real agent: a rule like a NetworkPolicy
//! (iptables, then nftables, dropping a pod's port in the node's forward path) drops the
//! client's SYN; the agent writes the dropped SYN to the mirror (Ethernet source
//! 02:64:72:6f:70:73) with the reason `netfilter_drop` and the kernel's location in its event,
//! and the flow is marked, so the client's retransmissions are copied from its veth. A port
//! nothing listens on (`no_socket`, dropped by the server pod's own stack) triggers the same
//! way; traffic to other ports, and drops of the node's own traffic, trigger nothing. Each is
//! checked against the client's own capture (the SYNs it sent) and the mirror's.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::pcap::{Packet, Trace};
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::proc::Proc;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{nsenter, Netns, Topology};
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

/// `mirrorctl capture` of the agent of `env` in `node`, into `file`, running.
fn ctl_capture(bins: &Binaries, node: &Netns, env: &AgentEnv, file: &Path) -> Proc {
    let mut cmd = nsenter(&node.path(), &bins.ctl);
    cmd.arg("--socket").arg(env.socket()).args(["capture", "-w"]).arg(file);
    let mut p = Proc::spawn("mirrorctl capture", &mut cmd);
    p.wait_for_output("capturing", Duration::from_secs(5));
    p
}

/// tshark's reading of pcapng `file`: per frame, its comment and summary, tab-separated.
fn tshark_lines(file: &Path) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-e", "eth.src", "-e", "frame.comment", "-e", "_ws.col.Info"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
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
    let ctl_file = dir.path().join("mirrorctl.pcapng");
    let mut ctl = ctl_capture(&bins, &topo.node, &env, &ctl_file);
    let server: IpAddr = topo.pod("server").addr(false);
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
    assert!(first.starts_with("02:64:72:6f:70:73\t"), "the drop's copy first: {lines:?}");
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

/// The kernel's ids of the BPF programs process `pid` holds (from its descriptors' fdinfo).
fn prog_ids(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok()))
        .collect()
}

/// Run count and run time (ns) of the drop program of process `pid`, by the kernel's accounting.
fn drop_program_runs(pid: u32) -> (u64, u64) {
    let ids = prog_ids(pid);
    libbpf_rs::query::ProgInfoIter::default()
        .filter(|p| ids.contains(&p.id) && p.name.to_string_lossy() == "drop_trace")
        .map(|p| (p.run_cnt, p.run_time_ns))
        .next()
        .expect("the agent's drop program")
}

/// CPU time of process `pid`, clock ticks (utime + stime).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the agent's stat");
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A flood of 100,000 SYNs, each a flow of its own, that the node's rule drops: every one is
/// counted by its reason; the rule triggers at most its rate (100 a second), the rest counted as
/// limited, none lost from the ring; the agent's memory stays put; a connection to another port
/// meanwhile is untouched.
#[test]
fn a_flood_of_drops_is_counted_and_its_triggers_rate_limited() {
    if !require_root() {
        return;
    }
    const FLOOD: u32 = 100_000;
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let _open = Server::asyncio(&topo.pod("server").ns, OPEN, dir.path());
    let cfg = AgentConfig { rules: vec!["drop=netfilter_drop".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    // The flood goes to ports 1 and 2 of the server pod: dropped in the forward path.
    topo.node.sh(&format!("iptables -I FORWARD -d {} -p tcp --dport 1:2 -j DROP", server.v4));
    let pid = agent.pid();
    let (_, rss_before) = mirror_e2e::capture::footprint::process(pid);
    let cpu_before = cpu_ticks(pid);
    let stats = {
        // SAFETY: a plain syscall wrapper; a non-negative return is a descriptor we own.
        let fd =
            unsafe { libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME) };
        assert!(fd >= 0, "BPF_ENABLE_STATS: {}", std::io::Error::from_raw_os_error(-fd));
        // SAFETY: fd is open and ours alone.
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    };
    let runs_before = drop_program_runs(pid);
    let took = mirror_e2e::workload::flood::syn_flood(&client.ns, client.v4, server.v4, FLOOD);
    assert!(
        connect(&client.ns, SocketAddr::new(server.addr(false), OPEN), Duration::from_secs(2)),
        "open port"
    );
    std::thread::sleep(SETTLE);
    let runs_after = drop_program_runs(pid);
    drop(stats);
    let cpu = cpu_ticks(pid) - cpu_before;
    let (_, rss_after) = mirror_e2e::capture::footprint::process(pid);

    let st = env.status();
    let c = &st["counters"];
    let count = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no counter {k}: {c}"));
    assert_eq!(st["drops"]["netfilter_drop"], FLOOD, "every dropped SYN counted: {}", st["drops"]);
    let (triggers, limited) = (count("drop_triggers"), count("drop_limited"));
    assert_eq!(triggers + limited, u64::from(FLOOD), "each drop triggered or was limited: {c}");
    // The rate: 100 a second, per one-second window; the flood spans a window or a few more.
    let windows = took.as_secs() + 2;
    assert!(triggers >= 100 && triggers <= 100 * windows, "{triggers} triggers in {took:?}");
    assert_eq!(count("ringbuf_drops"), 0, "no event lost: {c}");
    let evs = events(&env);
    let drops = evs.iter().filter(|e| e["kind"] == "drop").count();
    assert_eq!(drops as u64, triggers.min(evs.len() as u64), "an event per trigger (as the log keeps)");
    let growth = rss_after.saturating_sub(rss_before);
    assert!(growth < 4096, "the agent's RSS grew by {growth} KiB over the flood");
    let (n, ns) = (runs_after.0 - runs_before.0, runs_after.1 - runs_before.1);
    assert!(n >= u64::from(FLOOD), "the drop program ran {n} times");
    eprintln!(
        "{FLOOD} SYNs dropped in {} ms: {triggers} triggers, {limited} limited; agent CPU {} ms, RSS +{growth} KiB; \
         drop program: {n} runs, {:.0} ns per run",
        took.as_millis(),
        cpu * 10,
        ns as f64 / n as f64
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
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
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
