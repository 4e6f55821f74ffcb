//! Rules as Kubernetes resources, against a real API server (kube-apiserver and etcd built from
//! their Go modules, [`mirror_e2e::cluster::control_plane`]) and two nodes: a node namespace
//! each, with pods whose processes say who they are as the kubelet's do, their API objects
//! bound to the node, real HTTP servers, and an agent with a kubeconfig of the DaemonSet's
//! service account (so that the RBAC of `deploy/` is what it runs with).
//!
//! On both nodes, by the agents' own API and the rules' status in the cluster:
//! - a rule created, changed and deleted through the API reaches both agents within a second;
//! - a pod selector mirrors one service's 500s and not its neighbour's on the same node, and a
//!   namespaced rule does not reach the pods of another namespace (same labels); a
//!   ClusterMirrorRule does, by namespace selector;
//! - each rule's status has an entry per node that has something to say (state, pods, hits,
//!   latest trigger), and a trigger is an Event on its pod; the latest trigger's capture is
//!   named there (id, node) and fetched by that id from the node's agent;
//! - an invalid rule gets a `Valid: False` condition in words; an expired one ends everywhere;
//! - the API server stopped for 30 s: the rules keep working, the status resumes after, and
//!   nothing is doubled (rules, ids, status entries);
//! - what the agents cost the API server, from its audit log.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::cluster::control_plane::{self, ControlPlane};
use mirror_e2e::cluster::kube::deploy_dir;
use mirror_e2e::cluster::kubelet::{pod_uid, PodProcess, PodSpec};
use mirror_e2e::proc::wait_until;
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client;
use mirror_e2e::workload::servers::Server;
use serde_json::Value;

/// The servers' port.
const PORT: u16 = 8080;
/// The agents' user, as the audit log names it.
const AGENT: &str = "system:serviceaccount:mirror:mirror-agent";
/// How long a rule may take to reach every agent.
const PROPAGATION: Duration = Duration::from_secs(1);
/// The agents' `cluster.status_interval` here.
const STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// The pods of each node: (role, Kubernetes namespace, app label).
const PODS: [(&str, &str, &str); 4] = [
    ("client", "shop", "client"),
    ("checkout", "shop", "checkout"),
    ("cart", "shop", "cart"),
    ("vault", "bank", "checkout"),
];

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// One node: its namespace, pods, servers and agent files.
struct Node {
    name: String,
    topo: Topology,
    env: AgentEnv,
    _procs: Vec<PodProcess>,
    _servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl Node {
    fn new(cp: &ControlPlane, bins: &Binaries, name: &str, zone: &str, n: u32) -> Node {
        let roles: Vec<&str> = PODS.iter().map(|p| p.0).collect();
        let topo = Topology::new(&roles);
        cp.connect(&topo.node);
        cp.create_node(name, &[("topology.kubernetes.io/zone", zone)]);
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Vec::new();
        let mut servers = Vec::new();
        for (i, (role, ns, app)) in PODS.iter().enumerate() {
            let pod_name = format!("{role}-{name}");
            cp.create_pod(ns, &pod_name, &[("app", app)], name);
            let spec = PodSpec {
                env_name: Some(pod_name.clone()),
                env_namespace: Some(ns.to_string()),
                uid: pod_uid(n * 10 + i as u32),
                ..Default::default()
            };
            procs.push(PodProcess::start(&topo.pod(role).ns, &spec));
            if *role != "client" {
                servers.push(Server::python(&topo.pod(role).ns, PORT, dir.path()));
            }
        }
        let kubeconfig =
            cp.kubeconfig_for_service_account("mirror", "mirror-agent", Duration::from_secs(3600));
        let cfg = AgentConfig {
            extra: format!(
                "cluster:\n  mode: on\n  kubeconfig: {}\n  node: {name}\n  status_interval: {}s\n",
                kubeconfig.display(),
                STATUS_INTERVAL.as_secs()
            ),
            ..Default::default()
        };
        let env = AgentEnv::new(bins, &topo.node, &cfg);
        Node { name: name.into(), topo, env, _procs: procs, _servers: servers, _dir: dir }
    }

    /// The agent's rules (`mirrorctl -o json rules list`).
    fn rules(&self) -> Vec<Value> {
        json(&self.env.ctl_ok(&["-o", "json", "rules", "list"])).as_array().cloned().unwrap_or_default()
    }

    /// The agent's rule from resource `source`.
    fn rule(&self, source: &str) -> Option<Value> {
        self.rules().into_iter().find(|r| r["source"] == source)
    }

    /// The agent's events.
    fn events(&self) -> Vec<Value> {
        json(&self.env.ctl_ok(&["-o", "json", "events"])).as_array().cloned().unwrap_or_default()
    }

    /// The agent's captures (`mirrorctl -o json captures`).
    fn captures(&self) -> Vec<Value> {
        json(&self.env.ctl_ok(&["-o", "json", "captures"])).as_array().cloned().unwrap_or_default()
    }

    /// GETs `/fail` (a 500) of the pod with `role`, from the client pod, on a new connection.
    fn fail(&self, role: &str) {
        let url = client::url(self.topo.pod(role).addr(false), PORT, "/fail");
        let got = client::get(&self.topo.pod("client").ns, &[url]);
        assert_eq!(got[0].status, 500, "{role} on {}", self.name);
    }

    /// Events on the pod of `role` by rule `id`.
    fn triggers(&self, role: &str, id: u64) -> usize {
        let pod = format!("/{role}-{}", self.name);
        self.events()
            .iter()
            .filter(|e| e["rule_id"] == id && e["pod"].as_str().is_some_and(|p| p.ends_with(&pod)))
            .count()
    }
}

/// How long until `cond` holds on every node, polling; panics past `within`.
#[track_caller]
fn until_all(nodes: &[Node], within: Duration, what: &str, cond: impl Fn(&Node) -> bool) -> Duration {
    let t0 = Instant::now();
    let mut done = vec![false; nodes.len()];
    while Instant::now() < t0 + within {
        for (d, n) in done.iter_mut().zip(nodes) {
            *d = *d || cond(n);
        }
        if done.iter().all(|d| *d) {
            return t0.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what}: not on every node within {within:?} (done: {done:?})");
}

/// A rule's status (`kubectl get -o json`).
fn status(cp: &ControlPlane, what: &str, ns: Option<&str>) -> Value {
    let mut args = vec!["get", what, "-o", "json"];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    json(&cp.kubectl_ok(&args))["status"].clone()
}

/// A condition of a status (`Null` when absent).
fn condition(status: &Value, kind: &str) -> Value {
    let found = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == kind));
    found.cloned().unwrap_or_default()
}

/// The node's entry of a status.
fn entry<'a>(status: &'a Value, node: &str) -> Option<&'a Value> {
    status["nodes"].as_array()?.iter().find(|e| e["node"] == node)
}

fn mirror_rule(name: &str, ns: &str, spec: &str) -> String {
    format!("apiVersion: mirror.ebpf.io/v1alpha1\nkind: MirrorRule\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n{spec}")
}

fn total(counts: &BTreeMap<(String, String), u64>) -> u64 {
    counts.values().sum()
}

#[test]
fn rules_follow_the_cluster() {
    if !require_root() || !control_plane::available() {
        return;
    }
    let bins =
        Binaries::locate().expect("the agent's binaries (cargo build --release -p mirror-agent --bins)");
    let mut cp = ControlPlane::start();
    // Applied as a first-time user does: without a warning ("unrecognized format" and the like).
    let crds = cp.kubectl(&[
        "apply",
        "--warnings-as-errors",
        "-f",
        &deploy_dir().join("crds.yaml").display().to_string(),
    ]);
    assert!(
        crds.status.success(),
        "kubectl apply -f deploy/crds.yaml: {}{}",
        String::from_utf8_lossy(&crds.stdout),
        String::from_utf8_lossy(&crds.stderr)
    );
    cp.wait_crds_established();
    cp.kubectl_ok(&["apply", "-f", &deploy_dir().join("namespace.yaml").display().to_string()]);
    cp.kubectl_ok(&["apply", "-f", &deploy_dir().join("rbac.yaml").display().to_string()]);
    cp.create_namespace("shop", &[("team", "web")]);
    cp.create_namespace("bank", &[("team", "money")]);
    let nodes = [Node::new(&cp, &bins, "node-a", "a", 1), Node::new(&cp, &bins, "node-b", "b", 2)];
    let agents: Vec<_> = nodes.iter().map(|n| n.env.start(&[])).collect();
    for (a, n) in agents.iter().zip(&nodes) {
        let veths: Vec<String> = PODS.iter().map(|p| format!("veth{}", p.0)).collect();
        a.wait_attached(&veths.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(10));
        // The pods named as the kubelet's processes say (the agent looks again every 5 s).
        wait_until(Duration::from_secs(15), || {
            let pods = json(&n.env.ctl_ok(&["-o", "json", "pods"]));
            PODS.iter().all(|(role, ns, _)| {
                pods.as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == format!("{role}-{}", n.name) && p["namespace"] == *ns)
            })
        });
    }
    let mut report: Vec<(String, String)> = Vec::new();

    // Created: on both nodes within a second.
    let source = "MirrorRule shop/checkout-500s";
    cp.apply_yaml(&mirror_rule(
        "checkout-500s",
        "shop",
        "  status: \"500\"\n  podSelector:\n    matchLabels: {app: checkout}\n",
    ));
    let created = until_all(&nodes, PROPAGATION, "the new rule", |n| n.rule(source).is_some());
    report.push(("rule created -> on both agents".into(), format!("{} ms", created.as_millis())));

    // A pod selector: the checkout service's 500s, not the cart's beside it, nor those of the
    // pod of another namespace with the same labels.
    for n in &nodes {
        for role in ["checkout", "cart", "vault"] {
            n.fail(role);
        }
    }
    for n in &nodes {
        let id = n.rule(source).unwrap()["id"].as_u64().unwrap();
        wait_until(Duration::from_secs(5), || n.triggers("checkout", id) == 1);
        assert_eq!(n.triggers("checkout", id), 1, "{}: {:?}", n.name, n.events());
        assert_eq!(n.triggers("cart", id), 0, "{}: the neighbour was mirrored: {:?}", n.name, n.events());
        assert_eq!(
            n.triggers("vault", id),
            0,
            "{}: another namespace was mirrored: {:?}",
            n.name,
            n.events()
        );
    }

    // The status: an entry per node, with the hit and the trigger; an Event on each pod.
    let t0 = Instant::now();
    wait_until(Duration::from_secs(15), || {
        let s = status(&cp, "mirrorrule/checkout-500s", Some("shop"));
        nodes.iter().all(|n| {
            entry(&s, &n.name).is_some_and(|e| {
                e["state"] == "Active"
                    && e["hits"] == 1
                    && e["pods"] == 1
                    && e["lastTrigger"]["pod"].as_str().is_some_and(|p| p.starts_with("shop/checkout-"))
            })
        })
    });
    let s = status(&cp, "mirrorrule/checkout-500s", Some("shop"));
    assert!(
        nodes.iter().all(|n| entry(&s, &n.name).is_some_and(|e| e["state"] == "Active" && e["hits"] == 1)),
        "{s:#}"
    );
    assert_eq!(s["rule"], "status=500 packets=10000 bytes=0 duration=60s", "{s:#}");
    report.push((
        "first trigger -> both nodes' hits in the status".into(),
        format!("{} ms", t0.elapsed().as_millis()),
    ));
    for n in &nodes {
        let pod = format!("checkout-{}", n.name);
        let found = wait_until(Duration::from_secs(10), || {
            cp.kubectl_ok(&["describe", "pod", &pod, "-n", "shop"]).contains("Mirrored")
        });
        let described = cp.kubectl_ok(&["describe", "pod", &pod, "-n", "shop"]);
        assert!(found, "no Mirrored event on {pod}:\n{described}");
        assert!(described.contains(source), "{described}");
    }

    // A second trigger: the status names its capture (id, node), the latest, and that capture
    // is fetched by its id from the node's agent, as `kubectl exec ... mirrorctl captures get`
    // would.
    for n in &nodes {
        n.fail("checkout");
    }
    let latest = |n: &Node| -> Option<Value> {
        let id = n.rule(source)?["id"].as_u64()?;
        let pod = format!("shop/checkout-{}", n.name);
        n.events()
            .into_iter()
            .filter(|e| e["rule_id"] == id && e["pod"] == pod.as_str())
            .max_by_key(|e| e["seq"].as_u64())
    };
    let named = wait_until(Duration::from_secs(15), || {
        let s = status(&cp, "mirrorrule/checkout-500s", Some("shop"));
        nodes.iter().all(|n| {
            let ev = latest(n);
            entry(&s, &n.name).is_some_and(|e| {
                e["hits"] == 2 && ev.as_ref().is_some_and(|ev| e["lastTrigger"]["capture"] == ev["capture"])
            })
        })
    });
    let s = status(&cp, "mirrorrule/checkout-500s", Some("shop"));
    assert!(
        named,
        "the status does not name the latest captures: {s:#}\n{:?}",
        nodes.iter().map(latest).collect::<Vec<_>>()
    );
    for n in &nodes {
        let last = &entry(&s, &n.name).unwrap()["lastTrigger"];
        let (id, node) = (last["capture"]["id"].as_u64().unwrap(), last["capture"]["node"].as_str().unwrap());
        assert_eq!(node, n.name, "{last:#}");
        let first = n.events().iter().filter_map(|e| e["capture"]["id"].as_u64()).min().unwrap();
        assert!(id > first, "{}: capture {id} is not the latest trigger's (the first was {first})", n.name);
        let closed = wait_until(Duration::from_secs(10), || {
            n.captures().iter().any(|c| c["id"] == id && c["state"] == "complete")
        });
        let listed = n.captures().into_iter().find(|c| c["id"] == id);
        assert!(closed, "{}: capture {id}: {listed:?}", n.name);
        let listed = listed.unwrap();
        assert_eq!((&listed["flow"], &listed["pod"]), (&last["flow"], &last["pod"]), "{listed:#} {last:#}");
        let file = n._dir.path().join(format!("capture-{id}.pcapng"));
        n.env.ctl_ok(&["captures", "get", &id.to_string(), "-w", file.to_str().unwrap()]);
        let read =
            std::process::Command::new("tshark").arg("-r").arg(&file).output().expect("running tshark");
        assert!(
            read.status.success(),
            "tshark -r {}: {}",
            file.display(),
            String::from_utf8_lossy(&read.stderr)
        );
        let packets = String::from_utf8_lossy(&read.stdout).lines().count() as u64;
        assert!(
            packets >= 4 && Some(packets) == listed["packets"].as_u64(),
            "{}: {packets} packets read: {listed:#}",
            n.name
        );
    }

    // Changed: both agents hold the new form within a second.
    cp.apply_yaml(&mirror_rule(
        "checkout-500s",
        "shop",
        "  status: \"503\"\n  podSelector:\n    matchLabels: {app: checkout}\n",
    ));
    let changed = until_all(&nodes, PROPAGATION, "the changed rule", |n| {
        n.rule(source).is_some_and(|r| r["rule"].as_str().is_some_and(|t| t.starts_with("status=503")))
    });
    report.push(("rule changed -> on both agents".into(), format!("{} ms", changed.as_millis())));

    // A ClusterMirrorRule reaches the other namespace by its selector.
    cp.apply_yaml(
        "apiVersion: mirror.ebpf.io/v1alpha1\nkind: ClusterMirrorRule\nmetadata:\n  name: bank-500s\nspec:\n  \
         status: \"500\"\n  namespaceSelector:\n    matchLabels: {team: money}\n",
    );
    until_all(&nodes, PROPAGATION, "the cluster rule", |n| n.rule("ClusterMirrorRule bank-500s").is_some());
    for n in &nodes {
        n.fail("vault");
        n.fail("cart");
        let id = n.rule("ClusterMirrorRule bank-500s").unwrap()["id"].as_u64().unwrap();
        wait_until(Duration::from_secs(5), || n.triggers("vault", id) == 1);
        assert_eq!(n.triggers("vault", id), 1, "{}: {:?}", n.name, n.events());
        assert_eq!(n.triggers("cart", id), 0, "{}: {:?}", n.name, n.events());
    }

    // Invalid: a condition in words (the same from every node: no entry of their own), nothing
    // installed.
    cp.apply_yaml(&mirror_rule("broken", "shop", "  status: \"5xz\"\n"));
    wait_until(Duration::from_secs(10), || {
        condition(&status(&cp, "mirrorrule/broken", Some("shop")), "Valid")["status"] == "False"
    });
    let s = status(&cp, "mirrorrule/broken", Some("shop"));
    let valid = condition(&s, "Valid");
    assert!(s["nodes"].as_array().is_none_or(Vec::is_empty), "{s:#}");
    assert_eq!(valid["status"], "False", "{s:#}");
    assert!(valid["message"].as_str().is_some_and(|m| m.starts_with("spec.status: 'status=5xz'")), "{s:#}");
    assert!(nodes.iter().all(|n| n.rule("MirrorRule shop/broken").is_none()));
    let printed = cp.kubectl_ok(&["get", "mirrorrules", "-n", "shop"]);
    assert!(printed.contains("VALID") && printed.contains("False"), "{printed}");
    report
        .push(("invalid rule: condition".into(), valid["message"].as_str().unwrap_or_default().to_string()));

    // Expired: ends on every node by itself.
    cp.apply_yaml(&mirror_rule("brief", "shop", "  status: \"500\"\n  ttl: 4s\n"));
    until_all(&nodes, Duration::from_secs(3), "the brief rule", |n| {
        n.rule("MirrorRule shop/brief").is_some()
    });
    let ended = until_all(&nodes, Duration::from_secs(8), "the brief rule's end", |n| {
        n.rule("MirrorRule shop/brief").is_none()
    });
    let expired = wait_until(Duration::from_secs(10), || {
        condition(&status(&cp, "mirrorrule/brief", Some("shop")), "Expired")["status"] == "True"
    });
    assert!(expired, "{:#}", status(&cp, "mirrorrule/brief", Some("shop")));
    report.push((
        "ttl 4s rule -> gone from both agents".into(),
        format!("{} ms after it was seen", ended.as_millis()),
    ));

    // Deleted: off both nodes within a second.
    cp.kubectl_ok(&["delete", "mirrorrule", "checkout-500s", "-n", "shop"]);
    let deleted = until_all(&nodes, PROPAGATION, "the deleted rule", |n| n.rule(source).is_none());
    report.push(("rule deleted -> off both agents".into(), format!("{} ms", deleted.as_millis())));

    // A hot rule: every node triggers it over and over; the status writes stay bounded.
    let hot = "MirrorRule shop/cart-500s";
    cp.apply_yaml(&mirror_rule(
        "cart-500s",
        "shop",
        "  status: \"500\"\n  podSelector:\n    matchLabels: {app: cart}\n",
    ));
    until_all(&nodes, PROPAGATION, "the hot rule", |n| n.rule(hot).is_some());
    let (before, cpu0) = (cp.audit_counts(AGENT), cp.cpu_time());
    let window = Duration::from_secs(12);
    let t0 = Instant::now();
    let mut sent = 0;
    while t0.elapsed() < window {
        for n in &nodes {
            n.fail("cart");
            sent += 1;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let (after, cpu1) = (cp.audit_counts(AGENT), cp.cpu_time());
    let patches = |c: &BTreeMap<(String, String), u64>| {
        c.get(&("patch".to_string(), "mirrorrules.mirror.ebpf.io/status".to_string())).copied().unwrap_or(0)
    };
    let hot_writes = patches(&after) - patches(&before);
    let secs = t0.elapsed().as_secs_f64();
    report.push((
        format!("hot rule, {sent} triggers in {secs:.0} s on 2 nodes: status writes"),
        format!(
            "{hot_writes} ({:.2}/s per agent; bound 1/{}s); API server + etcd CPU {} ms",
            hot_writes as f64 / secs / 2.0,
            STATUS_INTERVAL.as_secs(),
            (cpu1 - cpu0).as_millis()
        ),
    ));
    // At most one write per interval per node, and one more for the state each started with.
    let bound = 2 * ((secs / STATUS_INTERVAL.as_secs_f64() * 1.12).ceil() as u64 + 1);
    assert!(hot_writes <= bound, "{hot_writes} status writes in {secs:.1} s, bound {bound}");

    // Quiet: the rules set, no trigger. What do two agents cost the API server then?
    std::thread::sleep(STATUS_INTERVAL * 2);
    let (before, cpu0, t0) = (cp.audit_counts(AGENT), cp.cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(20));
    let (after, cpu1) = (cp.audit_counts(AGENT), cp.cpu_time());
    let quiet = total(&after) - total(&before);
    report.push((
        format!("quiet {:.0} s: the agents' requests, API server + etcd CPU", t0.elapsed().as_secs_f64()),
        format!("{quiet} requests, {} ms CPU", (cpu1 - cpu0).as_millis()),
    ));
    assert!(quiet <= 2, "{quiet} requests from idle agents: {after:?}");

    // The API server away 30 s: rules keep working, the status resumes, nothing doubles.
    let ids: Vec<u64> = nodes.iter().map(|n| n.rule(hot).unwrap()["id"].as_u64().unwrap()).collect();
    let rules_before: Vec<usize> = nodes.iter().map(|n| n.rules().len()).collect();
    let hits_before: Vec<u64> =
        nodes.iter().map(|n| n.rule(hot).unwrap()["hits"].as_u64().unwrap()).collect();
    cp.stop_apiserver();
    let away = Instant::now();
    for n in &nodes {
        n.fail("cart");
    }
    for (n, before) in nodes.iter().zip(&hits_before) {
        let id = n.rule(hot).unwrap()["id"].as_u64().unwrap();
        wait_until(Duration::from_secs(5), || {
            n.rule(hot).is_some_and(|r| r["hits"].as_u64() > Some(*before))
        });
        assert!(
            n.rule(hot).unwrap()["hits"].as_u64() > Some(*before),
            "{}: no trigger while the API server is away",
            n.name
        );
        assert!(n.triggers("cart", id) >= 1);
    }
    // An agent restarted meanwhile starts with the cluster's rules of its state file: its
    // selected rule works before the API server answers.
    let mut agents = agents;
    let restarted = agents.remove(0).terminate();
    assert!(!restarted.contains("panicked"), "{restarted}");
    agents.insert(0, nodes[0].env.start(&[]));
    let veths: Vec<String> = PODS.iter().map(|p| format!("veth{}", p.0)).collect();
    agents[0].wait_attached(&veths.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(10));
    let restored = nodes[0].rule(hot).expect("the cluster's rule restored from the state file");
    assert_eq!(restored["id"].as_u64(), Some(ids[0]), "{restored}");
    let id = ids[0];
    let seen = nodes[0].triggers("cart", id);
    // The pods are named again (every 5 s at most), then the 500 of the selected pod triggers.
    let worked = wait_until(Duration::from_secs(15), || {
        nodes[0].fail("cart");
        nodes[0].triggers("cart", id) > seen
    });
    assert!(worked, "the restarted agent's selected rule did not trigger: {:?}", nodes[0].events());
    std::thread::sleep(Duration::from_secs(30).saturating_sub(away.elapsed()));
    cp.start_apiserver();
    let back = Instant::now();
    let want: Vec<u64> = nodes.iter().map(|n| n.rule(hot).unwrap()["hits"].as_u64().unwrap()).collect();
    wait_until(Duration::from_secs(30), || {
        let out = cp.kubectl(&["get", "mirrorrule/cart-500s", "-n", "shop", "-o", "json"]);
        if !out.status.success() {
            return false;
        }
        let s = json(&String::from_utf8_lossy(&out.stdout))["status"].clone();
        nodes
            .iter()
            .zip(&want)
            .all(|(n, w)| entry(&s, &n.name).is_some_and(|e| e["hits"].as_u64() == Some(*w)))
    });
    let s = status(&cp, "mirrorrule/cart-500s", Some("shop"));
    assert!(
        nodes
            .iter()
            .zip(&want)
            .all(|(n, w)| entry(&s, &n.name).is_some_and(|e| e["hits"].as_u64() == Some(*w))),
        "{s:#}"
    );
    assert_eq!(s["nodes"].as_array().map(Vec::len), Some(2), "{s:#}");
    report
        .push(("API server back -> status up to date".into(), format!("{} ms", back.elapsed().as_millis())));
    std::thread::sleep(Duration::from_secs(2));
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            n.rule(hot).unwrap()["id"].as_u64(),
            Some(ids[i]),
            "{}: the rule was installed again",
            n.name
        );
        assert_eq!(n.rules().len(), rules_before[i], "{}: {:?}", n.name, n.rules());
    }

    // What two agents cost the API server over the whole test.
    let counts = cp.audit_counts(AGENT);
    let mem = cp.memory();
    report.push((
        "API server / etcd resident memory at the end".into(),
        format!("{} MB / {} MB", mem.apiserver >> 20, mem.etcd >> 20),
    ));
    println!("\nrequests of the agents' service account (2 agents), whole test:");
    for ((verb, resource), n) in &counts {
        println!("  {verb:<8} {resource:<45} {n}");
    }
    println!("  total {}", total(&counts));
    println!("\n| measured | value |\n|---|---|");
    for (what, v) in &report {
        println!("| {what} | {v} |");
    }
    for a in agents {
        let out = a.terminate();
        assert!(!out.contains("panicked"), "{out}");
    }
}
