//! The agent on a node made of the real parts ([`mirror_e2e::cluster::containerd`]):
//! containerd's CRI plugin makes the pods and the CNI bridge plugin their `veth…` links, as on
//! a kubelet's node. The agent, told the runtime's socket, attaches to the veths as pods come
//! and go, names the pods from the runtime (name, namespace, UID, sandbox, the configured
//! labels) in `mirrorctl pods`, flows, events, captures and metrics, and mirrors a 500's
//! connection exactly once from the trigger on; a pod deleted while its connection is mirrored;
//! the agent killed and started again while pods change; a ClusterIP in front of the pods
//! (kube-proxy's iptables rules, with `bridge-nf-call-iptables`).
//!
//! The tests run one at a time: each has a containerd, a node and an agent of its own, and
//! timing bounds that two at once on a small machine would blur.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mirror_bpf::attach::tcx_prog_ids;
use mirror_bpf::testing::{ifindex, require_root};
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::tcpdump::Recorder;
use mirror_e2e::cluster::containerd::{self, CriNode, CriPod, SandboxSpec};
use mirror_e2e::cluster::kube::{Manifests, Node};
use mirror_e2e::cluster::podman::{build_prebuilt, Container, SharedMount};
use mirror_e2e::oracles::nat_oracle::{self, CopyPoints, NatExpected, Point};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::scenario::HTTP;
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, SERVICE_PORT};
use mirror_e2e::topology::netns::nsenter;
use mirror_e2e::workload::client::{self, url, Session};
use mirror_e2e::workload::servers::Server;
use serde_json::Value;

/// How long the agent may take to attach to a new veth, and to name its pod from the runtime
/// (the runtime lists a sandbox once its network is up, after the veth's link events: the
/// agent looks again within its 5 s recheck).
const ATTACH: Duration = Duration::from_secs(5);
const NAMED: Duration = Duration::from_secs(10);
/// The labels the agent is told to show.
const LABELS: &str = "[app, team]";
/// Where the metrics listen, in the node's namespace.
const METRICS: &str = "127.0.0.1:9464";

static SERIAL: Mutex<()> = Mutex::new(());

/// One test's node, started once the tests before it have ended (a failed one does not stop
/// the others).
struct Bed {
    node: CriNode,
    t0: Instant,
    _serial: MutexGuard<'static, ()>,
}

impl Bed {
    /// `None` where the test cannot run (it fails instead in CI).
    #[track_caller]
    fn start() -> Option<Bed> {
        if !require_root() || !containerd::available() {
            return None;
        }
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        Some(Bed { node: CriNode::start(), t0, _serial: serial })
    }

    /// Says how long the test took.
    fn done(&self, what: &str) {
        eprintln!("{what}: {:.1} s", self.t0.elapsed().as_secs_f64());
    }
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The web server's pod and the client's.
fn web(n: u32) -> SandboxSpec {
    SandboxSpec::new("web-0", "shop", n, &[("app", "web"), ("team", "shop"), ("pod-template-hash", "5c8d")])
}
fn curl() -> SandboxSpec {
    SandboxSpec::new("curl-0", "tools", 2, &[("app", "curl")])
}

/// The agent's `RUST_LOG` where a test reads which runtime names the pods.
const PODS_DEBUG: &str = "info,mirror_agent::pods=debug";

/// An agent on `node`, asking its containerd for the pods, with metrics.
fn agent_env(node: &CriNode) -> AgentEnv {
    let bins = Binaries::locate().expect("the binaries");
    let cfg = AgentConfig {
        metrics: METRICS.into(),
        extra: format!(
            "pods:\n  cri: [{:?}]\n  cri_timeout: 2s\n  labels: {LABELS}\n",
            node.socket().display().to_string()
        ),
        // Which runtime names the pods is said at debug.
        log: Some(PODS_DEBUG.into()),
        ..AgentConfig::default()
    };
    AgentEnv::new(&bins, &node.node, &cfg)
}

#[track_caller]
fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `mirrorctl -o json pods`.
fn pods(env: &AgentEnv) -> Vec<Value> {
    json(&env.ctl_ok(&["-o", "json", "pods"])).as_array().cloned().unwrap_or_default()
}

/// Waits until the agent names every one of `want` from the runtime, on its veth, with its
/// sandbox; returns the pods listed.
#[track_caller]
fn wait_named(env: &AgentEnv, want: &[&CriPod]) -> Vec<Value> {
    let mut listed = Vec::new();
    let t = Instant::now();
    let named = wait_until(NAMED, || {
        listed = pods(env);
        want.iter().all(|p| {
            listed.iter().any(|v| {
                v["interface"] == p.pod.veth.as_str() && v["sandbox"] == p.id.as_str() && v["source"] == "cri"
            })
        })
    });
    assert!(named, "not named from the runtime within {NAMED:?}: {listed:#?}");
    eprintln!("named from the runtime {:.2} s after asking", t.elapsed().as_secs_f64());
    listed
}

/// Asserts what the agent says of `p`: all the runtime gave, the configured labels only.
#[track_caller]
fn assert_pod(listed: &[Value], p: &CriPod, want_labels: &[(&str, &str)]) {
    let v = listed
        .iter()
        .find(|v| v["interface"] == p.pod.veth.as_str())
        .unwrap_or_else(|| panic!("no pod on {}: {listed:#?}", p.pod.veth));
    assert_eq!(
        (&v["name"], &v["namespace"], &v["uid"], &v["sandbox"], &v["source"]),
        (
            &Value::from(p.spec.name.as_str()),
            &Value::from(p.spec.namespace.as_str()),
            &Value::from(p.spec.uid.as_str()),
            &Value::from(p.id.as_str()),
            &Value::from("cri")
        ),
        "{v:#}"
    );
    assert_eq!(v["labels"], serde_json::to_value(labels(want_labels)).unwrap(), "{v:#}");
    assert_eq!(v["netns"], p.pod.ns.name(), "{v:#}");
    // What /proc tells stays: the pause process, its container (the sandbox's) from its cgroup.
    assert_eq!(
        (&v["pid"], &v["container"]),
        (&Value::from(p.pause_pid), &Value::from(p.id.as_str())),
        "{v:#}"
    );
    assert_eq!(v["peer"], "eth0", "{v:#}");
    let addrs: Vec<&str> =
        v["addresses"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for a in [p.pod.v4.to_string(), p.pod.v6.to_string()] {
        assert!(addrs.contains(&a.as_str()), "{a} not in {v:#}");
    }
}

/// Asserts that the classifier is on both hooks of `veth` once (the calling thread in the node).
#[track_caller]
fn hooked_once(veth: &str) {
    let i = ifindex(veth);
    for egress in [false, true] {
        assert_eq!(tcx_prog_ids(i, egress).expect("querying TCX").len(), 1, "{veth} egress={egress}");
    }
}

/// `mirrorctl -o json events`.
fn events(env: &AgentEnv) -> Vec<Value> {
    json(&env.ctl_ok(&["-o", "json", "events"])).as_array().cloned().unwrap_or_default()
}

/// `mirrorctl -o json flows`.
fn flows(env: &AgentEnv) -> Vec<Value> {
    json(&env.ctl_ok(&["-o", "json", "flows", "--limit", "1000"])).as_array().cloned().unwrap_or_default()
}

/// tshark's interface name of every packet of a pcapng file.
fn interface_names(file: &std::path::Path) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-e", "frame.interface_name"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn containerd_pods_are_attached_named_and_mirrored_as_they_come_and_go() {
    let Some(bed) = Bed::start() else { return };
    let node = &bed.node;
    let env = agent_env(node);
    let agent = env.start(&[]);
    let _inside = node.node.enter();

    // Pods come after the agent: it attaches to the CNI's veths and names them from the runtime.
    let t = Instant::now();
    let server = node.run_pod(&web(1));
    let client = node.run_pod(&curl());
    eprintln!("two pods made by containerd and the CNI in {:.2} s", t.elapsed().as_secs_f64());
    assert!(server.pod.veth.starts_with("veth") && client.pod.veth.starts_with("veth"));
    agent.wait_attached(&[&server.pod.veth, &client.pod.veth], ATTACH);
    hooked_once(&server.pod.veth);
    hooked_once(&client.pod.veth);
    let listed = wait_named(&env, &[&server, &client]);
    assert_pod(&listed, &server, &[("app", "web"), ("team", "shop")]);
    assert_pod(&listed, &client, &[("app", "curl")]);
    let table = env.ctl_ok(&["pods"]);
    assert!(
        table.lines().any(|l| l.starts_with(&server.pod.veth)
            && l.contains("web-0")
            && l.contains("app=web,team=shop")),
        "{table}"
    );
    let log = agent.output();
    assert!(
        log.contains("pod identity: asking the container runtime (CRI)") && log.contains("containerd"),
        "{log}"
    );

    // A 500, mirrored exactly once from the trigger on; a capture names the pods.
    let _nginx = Server::nginx(&server.pod, HTTP, env.dir());
    env.ctl_ok(&["rules", "add", "status=500"]);
    let pcapng = env.dir().join("pods.pcapng");
    let mut capture = Proc::spawn(
        "mirrorctl capture",
        nsenter(&node.node.path(), &Binaries::locate().expect("binaries").ctl)
            .arg("--socket")
            .arg(env.socket())
            .args(["capture", "-w"])
            .arg(&pcapng),
    );
    capture.wait_for_output("capturing copies received by", Duration::from_secs(5));
    let recorder = Recorder::new(env.dir());
    let target = server.pod.addr(false);
    let rec = recorder.record(&client.pod.ns, Some((&node.node, env.sink_peer().as_str())), || {
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(target, HTTP, p));
        assert_eq!(client::get_keepalive(&client.pod.ns, &urls), [200, 500, 200]);
        let urls = ["/foo", "/foo"].map(|p| url(target, HTTP, p));
        assert_eq!(client::get_keepalive(&client.pod.ns, &urls), [200, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 1, "{:?}", expected.triggered);
    assert!(expected.triggered[0].packets >= 4, "{:?}", expected.triggered);

    // The event, the flows, the histograms and the capture name the pods from the runtime.
    let ev = events(&env);
    let [e] = ev.as_slice() else { panic!("one event expected: {ev:#?}") };
    assert_eq!(
        (&e["pod"], &e["labels"], &e["status"], &e["target"], &e["interface"]),
        (
            &Value::from("shop/web-0"),
            &serde_json::to_value(labels(&[("app", "web"), ("team", "shop")])).unwrap(),
            &Value::from(500),
            &Value::from("/bar"),
            &Value::from(server.pod.veth.as_str())
        ),
        "{e:#}"
    );
    let all = flows(&env);
    let f = all.iter().find(|f| f["status"] == 500).unwrap_or_else(|| panic!("no mirrored flow: {all:#?}"));
    let named: BTreeMap<String, Value> = f["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["pod"].as_str().unwrap_or_default().to_string(), p["labels"].clone()))
        .collect();
    assert_eq!(
        named,
        BTreeMap::from([
            ("tools/curl-0".to_string(), serde_json::to_value(labels(&[("app", "curl")])).unwrap()),
            (
                "shop/web-0".to_string(),
                serde_json::to_value(labels(&[("app", "web"), ("team", "shop")])).unwrap()
            ),
        ]),
        "{f:#}"
    );
    let metrics = node.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("mirror_http_response_seconds_count{")
                && l.contains(&format!("interface=\"{}\"", server.pod.veth))
                && l.contains("class=\"5xx\"")
        })
        .unwrap_or_else(|| panic!("no 5xx response time of {}: {metrics}", server.pod.veth));
    for want in ["pod=\"shop/web-0\"", "label_app=\"web\"", "label_team=\"shop\""] {
        assert!(line.contains(want), "{want} not in {line}");
    }
    let st = capture.stop(libc::SIGINT, Duration::from_secs(5));
    assert!(st.is_some_and(|s| s.success()), "mirrorctl capture: {st:?} {}", capture.output());
    let names: std::collections::BTreeSet<String> = interface_names(&pcapng).into_iter().collect();
    assert_eq!(
        names,
        [format!("tools/curl-0 ({})", client.pod.veth), format!("shop/web-0 ({})", server.pod.veth)].into(),
        "{}",
        capture.output()
    );

    // The server pod deleted while its connection is mirrored: the kubelet stops its
    // containers (the server goes: its FIN is mirrored), then the sandbox (the CNI DEL takes
    // the veth). The agent forgets it; the connection's packets are mirrored once up to then.
    let mut nginx = Some(_nginx);
    let gone = server.pod.veth.clone();
    let mut quiet = None;
    let rec = recorder.record(&client.pod.ns, Some((&node.node, env.sink_peer().as_str())), || {
        let mut session = Session::open(&client.pod.ns, target, HTTP);
        let (code, port) = session.get("/bar");
        assert_eq!(code, 500);
        assert_eq!(session.get("/foo"), (200, port));
        drop(nginx.take());
        std::thread::sleep(Duration::from_millis(200));
        node.delete_pod(server);
        // The session stays open (and quiet) until the captures have stopped.
        quiet = Some(session);
    });
    drop(quiet);
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 1, "{:?}", expected.triggered);
    let forgotten = wait_until(ATTACH, || {
        !env.attached().contains(&gone) && !pods(&env).iter().any(|p| p["interface"] == gone.as_str())
    });
    assert!(forgotten, "{gone} not forgotten: {:?} {:#?}", env.attached(), pods(&env));

    // The pod made again (a StatefulSet's): a new sandbox, UID, veth and address, named anew.
    let again = node.run_pod(&web(3));
    assert_ne!(again.pod.veth, gone);
    agent.wait_attached(&[&again.pod.veth], ATTACH);
    let listed = wait_named(&env, &[&again, &client]);
    assert_pod(&listed, &again, &[("app", "web"), ("team", "shop")]);
    let _nginx = Server::nginx(&again.pod, HTTP, env.dir());
    let target = again.pod.addr(true);
    let rec = recorder.record(&client.pod.ns, Some((&node.node, env.sink_peer().as_str())), || {
        let urls = ["/bar", "/foo"].map(|p| url(target, HTTP, p));
        assert_eq!(client::get_keepalive(&client.pod.ns, &urls), [500, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    // The connection to the deleted pod stays marked: the client's FIN to it, retransmitted
    // with no one to answer, may still be mirrored now. This part is about the new pod's.
    let mut mirror = rec.mirror.clone();
    mirror.packets.retain(|p| p.src.ip() == target || p.dst.ip() == target);
    expected.assert_mirror(&mirror);
    assert_eq!(expected.triggered.len(), 1, "{:?}", expected.triggered);
    let ev = events(&env);
    assert!(
        ev.iter().any(|e| e["pod"] == "shop/web-0" && e["interface"] == again.pod.veth.as_str()),
        "{ev:#?}"
    );
    let st = env.status();
    assert_eq!(st["counters"]["mirror_errors"], 0, "{st:#}");
    let log = agent.terminate();
    assert!(!log.contains("panicked"), "{log}");
    bed.done("containerd's pods");
}

#[test]
fn the_agent_killed_while_pods_change_adopts_the_data_path_and_catches_up() {
    let Some(bed) = Bed::start() else { return };
    let node = &bed.node;
    let env = agent_env(node);
    let _inside = node.node.enter();
    let server = node.run_pod(&web(1));
    let client = node.run_pod(&curl());
    let old = node.run_pod(&SandboxSpec::new("job-0", "batch", 4, &[("app", "job")]));
    // Pods there before the agent: attached at its start.
    let agent = env.start(&[]);
    agent.wait_attached(&[&server.pod.veth, &client.pod.veth, &old.pod.veth], ATTACH);
    wait_named(&env, &[&server, &client, &old]);
    let _nginx = Server::nginx(&server.pod, HTTP, env.dir());
    env.ctl_ok(&["rules", "add", "status=500"]);

    let recorder = Recorder::new(env.dir());
    let target = server.pod.addr(false);
    let old_veth = old.pod.veth.clone();
    let mut last = None;
    let rec = recorder.record(&client.pod.ns, Some((&node.node, env.sink_peer().as_str())), || {
        let mut session = Session::open(&client.pod.ns, target, HTTP);
        let (code, port) = session.get("/bar");
        assert_eq!(code, 500);
        let mut same_connection =
            |path: &str, want: u16| assert_eq!(session.get(path), (want, port), "{path}");

        // SIGKILL: the data path stays pinned and attached, and mirrors.
        agent.kill();
        same_connection("/foo", 200);
        // While no agent runs, the kubelet deletes a pod and makes another.
        node.delete_pod(old);
        let new = node.run_pod(&SandboxSpec::new("job-1", "batch", 5, &[("app", "job")]));
        same_connection("/foo", 200);

        let agent = env.start(&[]);
        let live = [&server.pod.veth, &client.pod.veth, &new.pod.veth];
        agent.wait_attached(&live.map(String::as_str), ATTACH);
        let st = env.status();
        assert_eq!(st["adopted"], true, "{st:#}\n{}", agent.output());
        let mut now = env.attached();
        now.sort();
        let mut want: Vec<String> = live.iter().map(|v| v.to_string()).collect();
        want.sort();
        assert_eq!(now, want, "the deleted pod's veth is forgotten, the new one attached");
        for v in live {
            hooked_once(v);
        }
        let listed = wait_named(&env, &[&server, &client, &new]);
        assert_pod(&listed, &new, &[("app", "job")]);
        assert!(
            !listed.iter().any(|p| p["interface"] == old_veth.as_str() || p["name"] == "job-0"),
            "{listed:#?}"
        );
        same_connection("/foo", 200);
        assert_eq!(client::get_keepalive(&client.pod.ns, &[url(target, HTTP, "/bar")]), [500]);
        last = Some((agent, new));
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 2, "{:?}", expected.triggered);
    // The session's mark, set before the kill, counted every packet since.
    let t = &expected.triggered[0];
    let all = flows(&env);
    let f = all
        .iter()
        .find(|f| f["lo"] == t.flow.lo.to_string().as_str() && f["hi"] == t.flow.hi.to_string().as_str())
        .unwrap_or_else(|| panic!("{t:?} not in {all:#?}"));
    assert!(
        f["status"] == 500 && f["mirrored_packets"].as_u64().is_some_and(|n| t.admits(n)),
        "{t:?}: {f:#}"
    );
    let ev = events(&env);
    assert!(ev.iter().any(|e| e["pod"] == "shop/web-0" && e["status"] == 500), "{ev:#?}");
    let (agent, _new) = last.expect("the second agent");
    agent.terminate();
    bed.done("the agent killed while pods change");
}

#[test]
fn a_cluster_ip_in_front_of_the_pods_is_one_flow_named_on_both_sides() {
    let Some(bed) = Bed::start() else { return };
    let node = &bed.node;
    let env = agent_env(node);
    let server = node.run_pod(&web(1));
    let client = node.run_pod(&curl());
    let _nginx = Server::nginx(&server.pod, HTTP, env.dir());
    let kp = KubeProxy::install(&node.node, Flavour::Iptables, false, server.pod.addr(false));
    let vip = kp.vip();

    // The reply of the server pod to the client pod is bridged: without bridge-nf-call-iptables
    // it passes no conntrack, keeps the pod's address where the client expects the ClusterIP's,
    // and the connection never opens.
    node.node.sh("sysctl -qw net.bridge.bridge-nf-call-iptables=0");
    let out = client
        .pod
        .ns
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2"])
        .arg(url(vip, SERVICE_PORT, "/foo"))
        .output()
        .expect("running curl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "000",
        "the ClusterIP answered without bridge-nf-call-iptables"
    );
    node.node.sh("sysctl -qw net.bridge.bridge-nf-call-iptables=1 && conntrack -F 2>/dev/null || true");

    let agent = env.start(&[]);
    agent.wait_attached(&[&server.pod.veth, &client.pod.veth], ATTACH);
    wait_named(&env, &[&server, &client]);
    env.ctl_ok(&["rules", "add", "status=500"]);
    // The client's packets are copied where they enter the node (its veth's ingress, to the
    // ClusterIP), the server's where they leave the server pod (from the pod's address).
    let points = CopyPoints {
        to_server: Point::ingress(&client.pod.veth),
        to_client: Point::ingress(&server.pod.veth),
    };
    let rec = nat_oracle::record(&node.node, env.dir(), &points, &env.sink_peer(), || {
        let urls = ["/foo", "/bar", "/foo", "/foo"].map(|p| url(vip, SERVICE_PORT, p));
        assert_eq!(client::get_keepalive(&client.pod.ns, &urls), [200, 500, 200, 200]);
        let urls = ["/foo", "/foo"].map(|p| url(vip, SERVICE_PORT, p));
        assert_eq!(client::get_keepalive(&client.pod.ns, &urls), [200, 200]);
    });
    let expected = NatExpected::from_recording(&rec, |status, _| status == 500);
    assert_eq!((expected.connections.len(), expected.triggered.len()), (2, 1), "{:?}", expected.connections);
    if let Err(diff) = expected.compare_mirror(&rec.mirror) {
        panic!("mirror through the ClusterIP: {diff}");
    }
    let t = expected.triggered[0];
    let conn = expected.connections[t.conn];
    let conntrack = kp.conntrack(&node.node);
    let nat = conntrack
        .iter()
        .find(|c| c.reply_key() == conn.to_client)
        .unwrap_or_else(|| panic!("{conn} not in conntrack: {conntrack:?}"));
    assert!(nat.translated(), "{nat:?}");
    let (client_side, server_side) = (nat.original, nat.reply);

    // The event: the pod that answered, both tuples.
    let ev = events(&env);
    let [e] = ev.as_slice() else { panic!("one event expected: {ev:#?}") };
    assert_eq!(
        (
            &e["pod"],
            &e["nat"],
            &e["client_side"]["server"],
            &e["server_side"]["server"],
            &e["server_side"]["client"]
        ),
        (
            &Value::from("shop/web-0"),
            &Value::from(true),
            &Value::from(client_side.1.to_string()),
            &Value::from(server_side.0.to_string()),
            &Value::from(server_side.1.to_string())
        ),
        "{e:#} {nat:?}"
    );
    // The flow: listed once with both tuples; the pods named on each side of the translation.
    let all = flows(&env);
    let listed: Vec<&Value> = all
        .iter()
        .filter(|f| {
            let ends = [&f["lo"], &f["hi"], &f["nat"]["lo"], &f["nat"]["hi"]];
            ends.iter().any(|e| {
                **e == client_side.1.to_string().as_str() || **e == server_side.0.to_string().as_str()
            }) && ends.iter().any(|e| **e == client_side.0.to_string().as_str())
        })
        .collect();
    let [f] = listed.as_slice() else { panic!("the connection listed {} times: {all:#?}", listed.len()) };
    assert_eq!((&f["status"], f["mirrored_packets"].as_u64()), (&Value::from(500), Some(t.packets)), "{f:#}");
    assert!(!f["nat"].is_null(), "{f:#}");
    let named: BTreeMap<String, String> = f["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (p["endpoint"].as_str().unwrap_or_default().into(), p["pod"].as_str().unwrap_or_default().into())
        })
        .collect();
    assert_eq!(named.get(&client_side.0.to_string()).map(String::as_str), Some("tools/curl-0"), "{f:#}");
    assert_eq!(named.get(&server_side.0.to_string()).map(String::as_str), Some("shop/web-0"), "{f:#}");
    agent.terminate();
    bed.done("a ClusterIP");
}

/// The DaemonSet's pod spec run with podman on the node, as `tests/tests/image.rs` runs it: the
/// image `make image` builds, the init container, then the agent with the ConfigMap's
/// configuration, which finds containerd's socket through the node's `/run` (mounted read-only
/// at `/host/run`) and names the pods from it.
#[test]
fn the_daemonset_agent_names_containerd_pods_through_the_nodes_run() {
    let Some(bed) = Bed::start() else { return };
    let node = &bed.node;
    let m = Manifests::load();
    let bins = Binaries::locate().expect("the binaries");
    let built = build_prebuilt(&bins, &m.image("mirror-agent"));
    let server = node.run_pod(&web(1));
    let client = node.run_pod(&curl());
    let dir = tempfile::Builder::new().prefix("mirror-ds").tempdir().expect("a temp dir");
    let bpffs = SharedMount::new(&dir.path().join("bpf"));
    let (state, run, config) = (dir.path().join("state"), dir.path().join("run"), dir.path().join("config"));
    for d in [&state, &run, &config] {
        std::fs::create_dir_all(d).expect("creating a host directory");
    }
    m.write_config_files(&config);
    let kube_node = Node {
        host_paths: BTreeMap::from([
            ("/sys/fs/bpf", bpffs.path().to_path_buf()),
            ("/var/lib/mirror-agent", state),
            ("/run/mirror-agent", run.clone()),
            // The node's /run, where containerd's socket is.
            ("/run", node.run_dir()),
        ]),
        config_maps: BTreeMap::from([("mirror-agent", config)]),
        fields: BTreeMap::from([
            ("status.hostIP", containerd::GATEWAY4.to_string()),
            ("spec.nodeName", "e2e-node".to_string()),
        ]),
        netns_path: node.node.path(),
    };
    Container::run_to_end(&m.podman_args("mount-bpffs", &kube_node));
    let _nginx = Server::nginx(&server.pod, HTTP, dir.path());
    // The DaemonSet's, with which runtime names the pods said (at debug).
    let args: Vec<String> = m
        .podman_args("agent", &kube_node)
        .into_iter()
        .map(|a| if a.starts_with("--env=RUST_LOG=") { format!("--env=RUST_LOG={PODS_DEBUG}") } else { a })
        .collect();
    let agent = Container::start(&format!("mirror-e2e-{}-node", std::process::id()), &args);
    let socket = run.join("api.sock");
    let serving =
        wait_until(Duration::from_secs(30), || std::os::unix::net::UnixStream::connect(&socket).is_ok());
    assert!(serving, "the agent did not serve: {}", agent.logs());

    let mut listed = Vec::new();
    let named = wait_until(NAMED, || {
        let out = agent.exec(&["mirrorctl", "-o", "json", "pods"]);
        listed = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        [&server, &client].iter().all(|p| {
            listed.iter().any(|v| {
                v["interface"] == p.pod.veth.as_str()
                    && v["sandbox"] == p.id.as_str()
                    && v["source"] == "cri"
                    && v["name"] == p.spec.name.as_str()
                    && v["namespace"] == p.spec.namespace.as_str()
            })
        })
    });
    assert!(named, "not named from the runtime: {listed:#?}\n{}", agent.logs());
    // The ConfigMap's labels: `app` (and `app.kubernetes.io/name`, which these pods lack).
    let web_pod = listed.iter().find(|v| v["interface"] == server.pod.veth.as_str()).expect("listed");
    assert_eq!(web_pod["labels"], serde_json::to_value(labels(&[("app", "web")])).unwrap(), "{web_pod:#}");
    let logs = agent.logs();
    assert!(
        logs.contains("pod identity: asking the container runtime (CRI)")
            && logs.contains("/host/run/containerd/containerd.sock"),
        "{logs}"
    );

    agent.exec_ok(&["mirrorctl", "rules", "add", "status=500"]);
    let target = server.pod.addr(false);
    assert_eq!(client::get_keepalive(&client.pod.ns, &[url(target, HTTP, "/bar")]), [500]);
    let mut ev = Vec::new();
    let seen = wait_until(Duration::from_secs(5), || {
        ev = json(&agent.exec_ok(&["mirrorctl", "-o", "json", "events"]))
            .as_array()
            .cloned()
            .unwrap_or_default();
        !ev.is_empty()
    });
    assert!(seen, "no event: {}", agent.logs());
    assert_eq!(
        (&ev[0]["pod"], &ev[0]["labels"]["app"]),
        (&Value::from("shop/web-0"), &Value::from("web")),
        "{ev:#?}"
    );
    let (code, log) = agent.stop(Duration::from_secs(30));
    assert_eq!(code, 0, "{log}");
    eprintln!("image built in {:.1} s", built.build_s);
    bed.done("the DaemonSet's agent");
}
