//! Many nodes, one collector: two node namespaces, each with its pods and an agent whose sink
//! is a VXLAN tunnel (`mirror.create: vxlan`, one VNI per node) to a collector namespace
//! reached over an uplink; tshark there decodes the inner flows of both nodes, the large
//! response (GSO-sized copies) whole. And the node-wide budget: under a flood of mirrored
//! packets, what is copied stays within packets/s, the rest is counted as refused. And the
//! request behind a noresponse mark, replayed by the agent, at the collector at the mark.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{Netns, Topology};
use mirror_e2e::workload::client::Session;
use mirror_e2e::workload::servers::Server;

/// python's port in the server pods.
const PORT: u16 = 8080;
/// The body of the large 500: many GSO-sized copies.
const BIG: usize = 300_000;

/// Joins `node` to `collector` by a veth pair: the node's `uplink` 198.19.N.1/24, the
/// collector's `nodeN` 198.19.N.2/24. Returns (node address, collector address).
fn uplink(node: &Netns, collector: &Netns, n: u8) -> (String, String) {
    let (local, remote) = (format!("198.19.{n}.1"), format!("198.19.{n}.2"));
    node.sh(&format!(
        "ip link add uplink type veth peer name node{n} netns {c} && ip addr add {local}/24 dev uplink \
         && ip link set uplink up",
        c = collector.name()
    ));
    collector.sh(&format!("ip addr add {remote}/24 dev node{n} && ip link set node{n} up"));
    (local, remote)
}

fn vxlan_agent(
    bins: &Binaries,
    node: &Netns,
    local: &str,
    remote: &str,
    vni: u8,
    extra: &[(&str, &str)],
) -> AgentEnv {
    let mut mirror =
        vec![("tunnel".to_string(), format!("{{remote: \"{remote}\", local: \"{local}\", id: {vni}}}"))];
    mirror.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let cfg =
        AgentConfig { sink: "mirror0".into(), sink_create: "vxlan".into(), mirror, ..AgentConfig::default() };
    AgentEnv::new(bins, node, &cfg)
}

/// One decoded VXLAN packet at the collector.
#[derive(Debug)]
struct Inner {
    vni: u32,
    outer_src: String,
    inner_src: String,
    tcp_len: usize,
    status: Option<u16>,
}

/// tshark's reading of the collector's capture: the VXLAN packets and what they carry (not
/// the ones quoted in the collector's ICMP port-unreachable answers: nothing listens there).
fn decode(file: &std::path::Path) -> Vec<Inner> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-Y", "vxlan && !icmp", "-T", "fields", "-E", "separator=|"])
        .args(["-e", "vxlan.vni", "-e", "ip.src", "-e", "tcp.len", "-e", "http.response.code"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let (outer, inner) = f.get(1)?.split_once(',')?;
            Some(Inner {
                vni: f.first()?.parse().ok()?,
                outer_src: outer.to_string(),
                inner_src: inner.to_string(),
                tcp_len: f.get(2).and_then(|v| v.parse().ok()).unwrap_or(0),
                status: f.get(3).and_then(|v| v.split(',').next()?.parse().ok()),
            })
        })
        .collect()
}

#[test]
fn two_nodes_mirror_to_one_collector_over_vxlan() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let collector = Netns::new("collector");
    let nodes: Vec<Topology> = (0..2).map(|_| Topology::without_sink(&PODS)).collect();
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut servers = Vec::new();
    let mut envs = Vec::new();
    for (i, topo) in nodes.iter().enumerate() {
        let n = i as u8 + 1;
        let (local, remote) = uplink(&topo.node, &collector, n);
        servers.push(Server::python(&topo.pod("server").ns, PORT, dir.path()));
        envs.push((vxlan_agent(&bins, &topo.node, &local, &remote, n, &[]), local));
    }
    let agents: Vec<_> = envs.iter().map(|(e, _)| e.start(&[])).collect();
    for ((env, _), agent) in envs.iter().zip(&agents) {
        agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
        env.ctl_ok(&["rules", "add", "status=500"]);
        let st = env.status();
        assert_eq!(st["mirror"]["kind"], "vxlan", "{st}");
        assert_eq!(st["mirror"]["delivery"], "egress", "{st}");
    }

    // One capture per uplink of the collector, of every IP packet: a copy larger than the
    // uplink's MTU arrives in outer IP fragments (tshark reassembles them), the later ones
    // without a UDP header. Large buffers: the big answer comes as a burst.
    let files: Vec<_> = (1..=2).map(|n| dir.path().join(format!("collector-node{n}.pcap"))).collect();
    let captures: Vec<Capture> = files
        .iter()
        .enumerate()
        .map(|(i, f)| Capture::start_with_buffer(&collector, &format!("node{}", i + 1), "ip", f, 65536))
        .collect();
    for topo in &nodes {
        let mut s = Session::open(&topo.pod("client").ns, topo.pod("server").addr(false), PORT);
        assert_eq!(s.get("/ok").0, 200);
        assert_eq!(s.get(&format!("/fail?bytes={BIG}")).0, 500);
        assert_eq!(s.get("/ok").0, 200);
    }
    std::thread::sleep(Duration::from_millis(300));
    for c in captures {
        drop(c.stop());
    }
    let seen: Vec<Inner> = files.iter().flat_map(|f| decode(f)).collect();

    for (i, (env, local)) in envs.iter().enumerate() {
        let vni = i as u32 + 1;
        let server = nodes[i].pod("server").addr(false).to_string();
        let from_node: Vec<&Inner> = seen.iter().filter(|p| p.vni == vni).collect();
        assert!(from_node.iter().all(|p| &p.outer_src == local), "VNI {vni} from another address");
        assert!(
            from_node.iter().any(|p| p.status == Some(500) && p.inner_src == server),
            "no 500 of node {vni} at the collector: {from_node:?}"
        );
        // Every byte the server sent from the 500 on: the large body and the next answer.
        let body: usize = from_node.iter().filter(|p| p.inner_src == server).map(|p| p.tcp_len).sum();
        assert!(
            body >= BIG,
            "node {vni}: {body} bytes of the server's side reached the collector, sent {BIG}+"
        );
        let counters = &env.status()["counters"];
        assert_eq!(counters["mirror_errors"], 0, "node {vni}: {counters}");
        let mirrored = counters["mirrored_packets"].as_u64().expect("a counter");
        eprintln!(
            "node {vni}: {mirrored} copies, {} tunnel packets at the collector, {body} bytes of the server's side",
            from_node.len()
        );
    }
    drop(agents);
    // A clean stop removes the tunnel.
    for topo in &nodes {
        assert!(!topo.node.sh("ip -o link show").contains("mirror0"), "the vxlan sink outlived its agent");
    }
}

/// One keep-alive connection, marked by its first answer, then as many requests as it takes
/// for `seconds`: prints the requests made and the seconds they took.
const FLOOD: &str = r#"import http.client, sys, time
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)
conn.request("GET", "/fail"); conn.getresponse().read()
start = time.monotonic(); n = 0
while time.monotonic() - start < float(sys.argv[3]):
    conn.request("GET", "/ok"); conn.getresponse().read(); n += 1
print(n, time.monotonic() - start)
"#;

#[test]
fn the_node_budget_caps_what_is_copied_and_counts_the_rest() {
    if !require_root() {
        return;
    }
    // python's client and server answer about 20 requests a second on one connection (Nagle
    // and delayed ACKs), some 110 packets a second: the budget is well below.
    const PPS: u64 = 40;
    const SECONDS: f64 = 3.0;
    let bins = Binaries::locate().expect("the binaries");
    let collector = Netns::new("collector");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let (local, remote) = uplink(&topo.node, &collector, 1);
    let _server = Server::python(&topo.pod("server").ns, PORT, dir.path());
    let budget = format!("{{packets_per_second: {PPS}}}");
    let env = vxlan_agent(&bins, &topo.node, &local, &remote, 7, &[("budget", &budget)]);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    // Every packet of the marked flow is to be copied: no per-flow limit.
    env.ctl_ok(&["rules", "add", "status=500", "packets=0", "duration=0"]);

    let file = dir.path().join("collector.pcap");
    let capture = Capture::start(&collector, "node1", "ip", &file);
    let server = topo.pod("server").addr(false).to_string();
    let out = topo
        .pod("client")
        .ns
        .command("python3")
        .args(["-c", FLOOD, &server, &PORT.to_string(), &SECONDS.to_string()])
        .output()
        .expect("the flood");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let (requests, took) = text.trim().split_once(' ').expect("requests and seconds");
    let (requests, took): (u64, f64) = (requests.parse().expect("a count"), took.parse().expect("seconds"));
    std::thread::sleep(Duration::from_millis(300));
    drop(capture.stop());
    let at_collector = decode(&file).len() as u64;

    let counters = env.status()["counters"].clone();
    let get = |k: &str| counters[k].as_u64().unwrap_or_else(|| panic!("no counter {k}: {counters}"));
    let (allowed, refused) = (get("mirrored_packets"), get("budget_refused_packets"));
    let offered = allowed + refused;
    let cpus = mirror_bpf::possible_cpus().expect("CPUs") as f64;
    eprintln!(
        "budget {PPS}/s over {cpus} CPUs, {took:.2} s, {requests} requests: {offered} packets offered, {allowed} copied \
         ({:.0}/s), {refused} refused ({:.0}/s), {at_collector} at the collector",
        allowed as f64 / took,
        refused as f64 / took
    );
    assert!(refused > 0, "the flood stayed within the budget: {counters}");
    // Never above the node's rate, its 100 ms burst and the trigger's start.
    let ceiling = PPS as f64 * (took + 0.3);
    assert!((allowed as f64) <= ceiling, "{allowed} copies in {took:.2} s, above {PPS}/s");
    // At least one CPU's share all along.
    let floor = PPS as f64 / cpus * took * 0.8;
    assert!((allowed as f64) >= floor, "{allowed} copies in {took:.2} s, below {floor:.0}");
    // What was copied (and the request replayed ahead of the trigger) reached the collector;
    // what was refused did not.
    let sent = allowed + get("replayed");
    assert!(
        at_collector <= sent && at_collector + 5 >= sent,
        "{at_collector} at the collector, {allowed} copied and {} replayed",
        get("replayed")
    );
    drop(agent);
}

/// The request behind a `noresponse>` mark, replayed by the agent at the mark (no packet of
/// the flow comes: the server never answers), reaches the collector through the tunnel: once,
/// the request's segment with the replay MAC as its inner Ethernet source, 1.0-1.3 s after the
/// client sent it (the collector's capture against the client's).
#[test]
fn the_request_behind_a_noresponse_mark_reaches_the_collector_at_the_mark() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let collector = Netns::new("collector");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let (local, remote) = uplink(&topo.node, &collector, 1);
    let _server = Server::silent(&topo.pod("server").ns, PORT, dir.path());
    let env = vxlan_agent(&bins, &topo.node, &local, &remote, 5, &[]);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    env.ctl_ok(&["rules", "add", "noresponse>1s"]);

    let (file, client_file) = (dir.path().join("collector.pcap"), dir.path().join("client.pcap"));
    let capture = Capture::start(&collector, "node1", "ip", &file);
    let client_capture = Capture::start(&topo.pod("client").ns, "eth0", "tcp", &client_file);
    {
        let _inside = topo.pod("client").ns.enter();
        let mut c = TcpStream::connect((topo.pod("server").addr(false), PORT)).expect("connecting");
        c.write_all(b"GET /hang HTTP/1.1\r\nHost: shop.example\r\n\r\n").expect("sending the request");
        // Waiting for an answer that never comes, until the connection is closed.
        std::thread::sleep(Duration::from_millis(2000));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(capture.stop());
    let client = client_capture.stop();
    let request = client.packets.iter().find(|p| p.payload.starts_with(b"GET /hang")).expect("the request");

    // Not the copies quoted in the collector's ICMP port-unreachable answers (see decode).
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args(["-Y", "vxlan && !icmp && eth.src == 02:72:65:70:6c:79", "-T", "fields", "-E", "separator=|"])
        .args(["-e", "vxlan.vni", "-e", "frame.time_epoch", "-e", "tcp.payload"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let replays: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    let [replay] = &replays[..] else { panic!("one replay at the collector: {text}") };
    let hex: String = request.payload.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!((replay[0], replay[2]), ("5", hex.as_str()), "the request's segment, in the node's VNI");
    let (secs, frac) = replay[1].split_once('.').expect("seconds.nanoseconds");
    let at = secs.parse::<u64>().expect("seconds") * 1_000_000_000
        + format!("{frac:0<9}")[..9].parse::<u64>().expect("ns");
    let after = Duration::from_nanos(at - request.ts_ns);
    eprintln!("the replay reached the collector {after:?} after the client sent the request");
    assert!(after >= Duration::from_secs(1) && after < Duration::from_millis(1300), "{after:?}");
    let counters = env.status()["counters"].clone();
    assert_eq!((&counters["replayed"], &counters["replay_failed"]), (&1.into(), &0.into()), "{counters}");
    drop(agent);
}

#[test]
fn a_tunnel_kind_the_kernel_lacks_is_a_clear_error() {
    if !require_root() {
        return;
    }
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    for kind in ["geneve", "gretap", "erspan"] {
        let cfg = AgentConfig {
            sink: "mirror0".into(),
            sink_create: kind.into(),
            mirror: vec![("tunnel".into(), "{remote: \"198.19.9.2\"}".into())],
            ..AgentConfig::default()
        };
        let env = AgentEnv::new(&bins, &topo.node, &cfg);
        // Where the kernel has the type the agent runs: stopped by the timeout, the sink made.
        // The sink's creation is said at debug.
        let out = Command::new("timeout")
            .env("RUST_LOG", "info,mirror_agent::sink=debug")
            .args(["-s", "TERM", "8"])
            .arg("nsenter")
            .arg(format!("--net={}", topo.node.path()))
            .arg(&bins.agent)
            .arg("--config")
            .arg(env.config_path())
            .output()
            .expect("running the agent");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if log.contains("mirror sink created") {
            eprintln!("{kind}: this kernel has it");
            assert!(log.contains(&format!("kind={}", kind[..1].to_uppercase() + &kind[1..])), "{log}");
            continue;
        }
        assert!(!out.status.success(), "{kind}: {log}");
        let want = format!("this kernel has no {kind} link type (no {kind} module): mirror.create: {kind} cannot be used here");
        assert!(log.contains(&want), "{kind}: {log}");
        eprintln!("{kind}: refused, as this kernel lacks it");
    }
}
