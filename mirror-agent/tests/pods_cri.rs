//! Pod identity when the container runtime's CRI socket fails, with a fake runtime (a tonic
//! server of `runtime.v1.RuntimeService` on a Unix socket) that can be made absent, silent or
//! hung, and counted: a runtime that is absent, never answers, or stops answering leaves the
//! pods named from `/proc` within the configured timeout; the client asks each sandbox's status
//! once and the list at most once a second. (A real runtime, containerd, names the pods in
//! tests/tests/real_node.rs.) The fake's sandboxes match namespaces and processes set up as
//! containers are, each way of matching once: the pause process's namespace, the namespace's
//! path, the pod's address; a sandbox on the node's network never names a veth.

mod common;
mod fake_cri;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use mirror_agent::pods::{cri::Cri, resolve};
use mirror_agent::views::PodView;
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::cluster::kubelet::{plug, pod_uid, PodProcess, PodSpec};
use mirror_e2e::proc::wait_until;
use mirror_e2e::topology::netns::{Netns, Topology};

use common::{bins, find, pods, ATTACH};
use fake_cri::{FakeCri, FakeSandbox, Silent};

/// The labels the agent is told to show.
const LABELS: &str = "[app, team, app.kubernetes.io/name]";

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn pods_section(sockets: &[&Path], timeout: &str) -> String {
    let list: Vec<String> = sockets.iter().map(|p| format!("{:?}", p.display().to_string())).collect();
    format!("pods:\n  cri: [{}]\n  cri_timeout: {timeout}\n  labels: {LABELS}\n", list.join(", "))
}

/// The sandboxes of the topology's pods: `server` found through its pause process, `bare`
/// through its namespace's path, `client` through its addresses; a `hostNetwork` sandbox that
/// claims `other`'s address; none for `other`.
fn sandboxes(topo: &Topology, server_pid: u32) -> Vec<FakeSandbox> {
    let kv = |l: &[(&str, &str)]| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    vec![
        FakeSandbox {
            id: "sb-server".into(),
            name: "web-0".into(),
            namespace: "shop".into(),
            uid: pod_uid(11),
            labels: kv(&[("app", "web"), ("team", "shop"), ("pod-template-hash", "5c8d")]),
            pid: Some(server_pid),
            ..FakeSandbox::default()
        },
        FakeSandbox {
            id: "sb-bare".into(),
            name: "db-0".into(),
            namespace: "data".into(),
            uid: pod_uid(13),
            labels: kv(&[("app.kubernetes.io/name", "postgres")]),
            netns_path: Some(topo.pod("bare").ns.path()),
            ..FakeSandbox::default()
        },
        FakeSandbox {
            id: "sb-client".into(),
            name: "curl-0".into(),
            namespace: "tools".into(),
            uid: pod_uid(14),
            labels: kv(&[("app", "curl")]),
            ips: vec![topo.pod("client").v4.into(), topo.pod("client").v6.into()],
            ..FakeSandbox::default()
        },
        FakeSandbox {
            id: "sb-host".into(),
            name: "kube-proxy-x".into(),
            namespace: "kube-system".into(),
            uid: pod_uid(15),
            ips: vec![topo.pod("other").v4.into()],
            host_network: true,
            ..FakeSandbox::default()
        },
    ]
}

/// A runtime that answered, then stops: the pods it named are named from `/proc` again, and a
/// pod that appears meanwhile is named from `/proc` within the timeout. (Naming from a real
/// runtime, with labels, in pods, flows, events, captures and metrics: tests/tests/real_node.rs.)
#[test]
fn a_runtime_that_stops_answering_leaves_the_pods_to_proc() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&["client", "server", "bare", "other"]);
    // The server's container says another name in its environment: the runtime's wins.
    let server_proc = PodProcess::start(
        &topo.pod("server").ns,
        &PodSpec {
            env_name: Some("from-env".into()),
            env_namespace: Some("env-ns".into()),
            uid: pod_uid(11),
            ..PodSpec::default()
        },
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let fake = FakeCri::start(&dir.path().join("cri.sock"), sandboxes(&topo, server_proc.pid()));
    let absent = dir.path().join("absent.sock");
    let cfg = AgentConfig { extra: pods_section(&[&absent, &fake.socket], "1s"), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver", "vethbare", "vethother"], ATTACH);
    let mut listed = Vec::new();
    let resolved = wait_until(Duration::from_secs(5), || {
        listed = pods(&env);
        listed.iter().filter(|p| p.source == "cri").count() == 3
    });
    assert!(resolved, "{listed:#?}\n{}", agent.output());
    let server = find(&listed, "vethserver");
    assert_eq!(
        (server.label(), server.labels.clone()),
        ("shop/web-0".into(), labels(&[("app", "web"), ("team", "shop")]))
    );
    // Each sandbox's status was asked once, however often the list was.
    assert_eq!(fake.calls("PodSandboxStatusRequest"), 4, "{:?}", fake.state.lock().unwrap().calls);

    // The runtime stops answering; a pod appears: named from /proc within the timeout.
    fake.state.lock().unwrap().hang = true;
    // Past the list's cache.
    std::thread::sleep(mirror_agent::pods::cri::MIN_INTERVAL);
    let late = Netns::new("late");
    let _late_proc = PodProcess::start(
        &late,
        &PodSpec {
            env_name: Some("late-0".into()),
            env_namespace: Some("batch".into()),
            uid: pod_uid(16),
            ..PodSpec::default()
        },
    );
    let t0 = Instant::now();
    plug(&topo.node, &late, "vethlate", 40);
    agent.wait_attached(&["vethlate"], ATTACH);
    let found = wait_until(Duration::from_secs(5), || {
        pods(&env)
            .iter()
            .any(|p| p.interface == "vethlate" && p.label() == "batch/late-0" && p.source == "env")
    });
    let took = t0.elapsed();
    assert!(found, "{:#?}\n{}", pods(&env), agent.output());
    eprintln!("hung runtime: the new pod named from /proc {took:?} after its veth appeared (cri_timeout 1s)");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let log = agent.output();
    assert!(log.contains("the container runtime (CRI) failed; from /proc until it answers"), "{log}");
    // The API answered meanwhile, and the pods the runtime named are named from /proc now.
    let server = find(&pods(&env), "vethserver").clone();
    assert_eq!((server.label(), server.labels.is_empty()), ("env-ns/from-env".to_string(), true));
    agent.terminate();
}

#[test]
fn an_absent_or_silent_runtime_leaves_the_pods_to_proc() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&["server"]);
    let _proc = PodProcess::start(
        &topo.pod("server").ns,
        &PodSpec {
            env_name: Some("web-0".into()),
            env_namespace: Some("shop".into()),
            uid: pod_uid(21),
            ..PodSpec::default()
        },
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let silent_path = dir.path().join("silent.sock");
    let _silent = Silent::bind(&silent_path);
    let absent = dir.path().join("absent.sock");
    for (case, extra) in [
        ("silent", pods_section(&[&absent, &silent_path], "500ms")),
        ("absent", pods_section(&[&absent], "500ms")),
        ("none", "pods:\n  cri: none\n".to_string()),
    ] {
        // Where the pods' names come from is said at debug.
        let log = Some("info,mirror_agent::pods=debug".to_string());
        let cfg = AgentConfig { extra, log, ..AgentConfig::default() };
        let env = AgentEnv::new(&bins(), &topo.node, &cfg);
        let agent = env.start(&[]);
        agent.wait_attached(&["vethserver"], ATTACH);
        let t0 = Instant::now();
        let resolved = wait_until(Duration::from_secs(5), || {
            pods(&env).iter().any(|p| p.label() == "shop/web-0" && p.source == "env")
        });
        let took = t0.elapsed();
        assert!(resolved, "{case}: {:#?}\n{}", pods(&env), agent.output());
        eprintln!("{case} runtime: pods named from /proc {took:?} after the attach");
        // The timeout, the debounce, the polling: well within 2 s.
        assert!(took < Duration::from_secs(2), "{case}: {took:?}");
        let log = agent.terminate();
        let says = match case {
            "silent" => format!("no CRI answered: {}: no answer within 500ms", silent_path.display()),
            "absent" => format!("no CRI socket at {}", absent.display()),
            _ => "pods.cri: none".to_string(),
        };
        assert!(log.contains(&format!("pod identity: from /proc ({says}")), "{case}: {log}");
    }
}

/// The pods module on its own: the CRI client against the fake runtime (cached, bounded), and
/// the resolution from its sandboxes and from /proc, timed.
#[test]
fn the_pods_module_resolves_from_the_runtime_within_its_bounds() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&["client", "server", "bare", "other"]);
    let server_proc = PodProcess::start(
        &topo.pod("server").ns,
        &PodSpec { env_name: Some("from-env".into()), uid: pod_uid(11), ..PodSpec::default() },
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let fake = FakeCri::start(&dir.path().join("cri.sock"), sandboxes(&topo, server_proc.pid()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let timeout = Duration::from_millis(500);
    let mut cri = Cri::new(vec![dir.path().join("absent.sock"), fake.socket.clone()], timeout);

    let t0 = Instant::now();
    let first = rt.block_on(cri.sandboxes()).expect("the fake runtime's sandboxes");
    let connect_and_list = t0.elapsed();
    assert_eq!(first.len(), 4);
    let t0 = Instant::now();
    let cached = rt.block_on(cri.sandboxes()).expect("cached");
    let from_cache = t0.elapsed();
    assert_eq!(cached, first);
    assert_eq!(fake.calls("ListPodSandboxRequest"), 1, "asked again within the minimum interval");
    std::thread::sleep(mirror_agent::pods::cri::MIN_INTERVAL);
    let t0 = Instant::now();
    let again = rt.block_on(cri.sandboxes()).expect("listed again");
    let list_only = t0.elapsed();
    assert_eq!(again, first);
    assert_eq!((fake.calls("ListPodSandboxRequest"), fake.calls("PodSandboxStatusRequest")), (2, 4));

    // Resolve in the node's namespace, with the sandboxes and without.
    let keys: Vec<String> = ["app", "team"].map(String::from).into();
    let _in_node = topo.node.enter();
    let attached: Vec<(u32, String)> = ["vethclient", "vethserver", "vethbare", "vethother"]
        .iter()
        .map(|n| {
            let c = std::ffi::CString::new(*n).unwrap();
            // SAFETY: a valid C string, only read.
            (unsafe { libc::if_nametoindex(c.as_ptr()) }, n.to_string())
        })
        .collect();
    assert!(attached.iter().all(|(i, _)| *i != 0), "{attached:?}");
    let t0 = Instant::now();
    let with = resolve(&attached, Some(again.clone()), &keys).expect("resolving");
    let with_cri = t0.elapsed();
    let t0 = Instant::now();
    let without = resolve(&attached, None, &keys).expect("resolving");
    let proc_only = t0.elapsed();
    let by = |v: &[PodView], i: &str| find(v, i).clone();
    assert_eq!(
        ["vethserver", "vethbare", "vethclient", "vethother"]
            .map(|i| (by(&with, i).label(), by(&with, i).source)),
        [
            ("shop/web-0".to_string(), "cri".to_string()),
            ("data/db-0".into(), "cri".into()),
            ("tools/curl-0".into(), "cri".into()),
            // The netns' name: no process, no sandbox but the hostNetwork one with its address.
            (topo.pod("other").ns.name().to_string(), "netns".into()),
        ]
    );
    assert_eq!(by(&with, "vethserver").labels, labels(&[("app", "web"), ("team", "shop")]));
    assert_eq!(
        (by(&without, "vethserver").name.as_str(), by(&without, "vethserver").source.as_str()),
        ("from-env", "env")
    );
    assert!(without.iter().all(|p| p.labels.is_empty() && p.sandbox.is_none()), "{without:?}");

    // A runtime that hangs: no sandboxes, within the timeout; then none asked for a while.
    fake.state.lock().unwrap().hang = true;
    std::thread::sleep(mirror_agent::pods::cri::MIN_INTERVAL);
    let t0 = Instant::now();
    assert_eq!(rt.block_on(cri.sandboxes()), None);
    let hung = t0.elapsed();
    assert!(hung >= timeout && hung < timeout + Duration::from_secs(1), "{hung:?}");
    let t0 = Instant::now();
    assert_eq!(rt.block_on(cri.sandboxes()), None);
    let backoff = t0.elapsed();
    assert!(backoff < Duration::from_millis(50), "{backoff:?}");
    eprintln!(
        "CRI: connect + Version + list + 4 statuses {connect_and_list:?}, cached {from_cache:?}, list again {list_only:?}; \
         resolve 4 veths with sandboxes {with_cri:?}, from /proc only {proc_only:?}; hung runtime given up after {hung:?}, \
         then {backoff:?} while backing off"
    );
}
