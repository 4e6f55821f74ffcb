//! deploy/ against a real API server (etcd and kube-apiserver, no kubelet: see
//! tests/src/cluster/control_plane.rs): `kubectl apply -k deploy/` as an operator runs it, then
//! what the agent's service account may do, asked with `kubectl auth can-i` both by the admin
//! impersonating it and with the account's own token (TokenRequest) from a node namespace:
//! every permission the agent needs is granted, a list of what it must never do is refused, and
//! the rules it holds beyond those of any service account are exactly the ones it needs. Also
//! that a plane with the rules' CustomResourceDefinitions answers as a cluster does: objects
//! stored and listed back, watches, the audit log and metrics, an API server restart.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::cluster::control_plane::{self, ControlPlane, ADMIN};
use mirror_e2e::cluster::kube::deploy_dir;
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::topology::netns::Netns;
use serde_json::Value;

/// The agent's identity.
const AGENT: &str = "system:serviceaccount:mirror:mirror-agent";
/// A namespace with a pod, where the agent reads, reports and records Events.
const APP_NS: &str = "shop";
/// The rules' resources.
const RULES: &str = "mirrorrules.mirror.ebpf.io";
const CLUSTER_RULES: &str = "clustermirrorrules.mirror.ebpf.io";

fn runnable() -> bool {
    require_root() && control_plane::available()
}

/// The kustomization an operator applies.
fn deploy() -> PathBuf {
    deploy_dir()
}

/// One `kubectl auth can-i` question and the answer deploy/rbac.yaml must give.
struct Check {
    verb: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    /// None: every namespace (or a cluster-scoped resource).
    namespace: Option<&'static str>,
    allowed: bool,
}

const fn check(
    verb: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    namespace: Option<&'static str>,
    allowed: bool,
) -> Check {
    Check { verb, resource, subresource, namespace, allowed }
}

const ALL: Option<&str> = None;
const APP: Option<&str> = Some(APP_NS);
const OWN: Option<&str> = Some("mirror");
const STATUS: Option<&str> = Some("status");

/// What the agent needs (yes) and a list of what it must not do (no).
const CHECKS: &[Check] = &[
    // The rules, read everywhere.
    check("get", RULES, None, ALL, true),
    check("list", RULES, None, ALL, true),
    check("watch", RULES, None, ALL, true),
    check("watch", RULES, None, APP, true),
    check("get", CLUSTER_RULES, None, ALL, true),
    check("list", CLUSTER_RULES, None, ALL, true),
    check("watch", CLUSTER_RULES, None, ALL, true),
    // Its node's entry in their status.
    check("patch", RULES, STATUS, APP, true),
    check("patch", CLUSTER_RULES, STATUS, ALL, true),
    // What selectors select.
    check("get", "pods", None, APP, true),
    check("list", "pods", None, ALL, true),
    check("watch", "pods", None, ALL, true),
    check("get", "namespaces", None, ALL, true),
    check("list", "namespaces", None, ALL, true),
    check("watch", "namespaces", None, ALL, true),
    check("get", "nodes", None, ALL, true),
    check("list", "nodes", None, ALL, true),
    check("watch", "nodes", None, ALL, true),
    // Events on pods.
    check("create", "events.events.k8s.io", None, APP, true),
    check("patch", "events.events.k8s.io", None, APP, true),
    // Never the rules' spec, nor their whole status.
    check("create", RULES, None, APP, false),
    check("update", RULES, None, APP, false),
    check("patch", RULES, None, APP, false),
    check("delete", RULES, None, APP, false),
    check("deletecollection", RULES, None, APP, false),
    check("create", CLUSTER_RULES, None, ALL, false),
    check("update", CLUSTER_RULES, None, ALL, false),
    check("patch", CLUSTER_RULES, None, ALL, false),
    check("delete", CLUSTER_RULES, None, ALL, false),
    check("update", RULES, STATUS, APP, false),
    check("update", CLUSTER_RULES, STATUS, ALL, false),
    // No secrets, no configuration.
    check("get", "secrets", None, APP, false),
    check("list", "secrets", None, ALL, false),
    check("watch", "secrets", None, ALL, false),
    check("get", "secrets", None, OWN, false),
    check("list", "configmaps", None, ALL, false),
    check("get", "configmaps", None, OWN, false),
    // No change to workloads.
    check("create", "pods", None, APP, false),
    check("patch", "pods", None, APP, false),
    check("update", "pods", None, APP, false),
    check("delete", "pods", None, APP, false),
    check("patch", "pods", STATUS, APP, false),
    check("create", "pods", Some("exec"), APP, false),
    check("get", "pods", Some("log"), APP, false),
    check("create", "pods", Some("eviction"), APP, false),
    check("patch", "daemonsets.apps", None, OWN, false),
    // Events: created and patched only, through events.k8s.io only.
    check("delete", "events.events.k8s.io", None, APP, false),
    check("update", "events.events.k8s.io", None, APP, false),
    check("list", "events.events.k8s.io", None, ALL, false),
    check("create", "events", None, APP, false),
    // Nodes and namespaces: read only.
    check("update", "nodes", None, ALL, false),
    check("patch", "nodes", None, ALL, false),
    check("patch", "nodes", STATUS, ALL, false),
    check("delete", "nodes", None, ALL, false),
    check("create", "namespaces", None, ALL, false),
    check("patch", "namespaces", None, ALL, false),
    // No way to more rights.
    check("create", "clusterrolebindings.rbac.authorization.k8s.io", None, ALL, false),
    check("create", "rolebindings.rbac.authorization.k8s.io", None, OWN, false),
    check("escalate", "clusterroles.rbac.authorization.k8s.io", None, ALL, false),
    check("bind", "clusterroles.rbac.authorization.k8s.io", None, ALL, false),
    check("impersonate", "users", None, ALL, false),
    check("impersonate", "serviceaccounts", None, OWN, false),
    check("create", "serviceaccounts", Some("token"), OWN, false),
    check("update", "customresourcedefinitions.apiextensions.k8s.io", None, ALL, false),
    check("*", "*", None, ALL, false),
];

/// The rules the agent holds beyond those of any service account: (resource, verb).
const EXPECTED_RULES: &[(&str, &[&str])] = &[
    (RULES, &["get", "list", "watch"]),
    (CLUSTER_RULES, &["get", "list", "watch"]),
    ("mirrorrules.mirror.ebpf.io/status", &["patch"]),
    ("clustermirrorrules.mirror.ebpf.io/status", &["patch"]),
    ("pods", &["get", "list", "watch"]),
    ("namespaces", &["get", "list", "watch"]),
    ("nodes", &["get", "list", "watch"]),
    ("events.events.k8s.io", &["create", "patch"]),
];

/// kubectl's answer to `auth can-i`: whether allowed; panics on anything but yes or no.
#[track_caller]
fn answer(c: &Check, out: &std::process::Output) -> bool {
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.split_whitespace().next() {
        Some("yes") => true,
        Some("no") => false,
        _ => panic!(
            "kubectl auth can-i {} {}: {stdout}{}",
            c.verb,
            c.resource,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn can_i_args(c: &Check) -> Vec<String> {
    let mut a = vec!["auth".to_string(), "can-i".into(), c.verb.into(), c.resource.into()];
    if let Some(s) = c.subresource {
        a.push(format!("--subresource={s}"));
    }
    match c.namespace {
        Some(ns) => a.extend(["-n".into(), ns.into()]),
        None => a.push("--all-namespaces".into()),
    }
    a
}

/// The rules of a `kubectl auth can-i --list` table: (resource, verb) pairs, non-resource URLs
/// left out.
fn rules_of(table: &str) -> BTreeSet<(String, String)> {
    let mut rules = BTreeSet::new();
    for line in table.lines().skip(1) {
        let Some(open) = line.find('[') else { continue };
        let resource = line[..open].trim();
        if resource.is_empty() {
            continue;
        }
        // Resources, then [non-resource URLs] [resource names] [verbs].
        let groups: Vec<&str> =
            line[open..].split('[').filter_map(|g| g.split_once(']').map(|(inner, _)| inner)).collect();
        let (Some(names), Some(verbs)) = (groups.get(1), groups.get(2)) else { continue };
        if !names.trim().is_empty() {
            continue; // a rule on named objects only (none of ours)
        }
        for verb in verbs.split_whitespace() {
            rules.insert((resource.to_string(), verb.to_string()));
        }
    }
    rules
}

#[track_caller]
fn stdout_ok(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_agents_service_account_may_do_what_the_agent_needs_and_nothing_more() {
    if !runnable() {
        return;
    }
    let t = Instant::now();
    let plane = ControlPlane::start();
    let started = t.elapsed();
    let dir = deploy();
    assert!(
        dir.join("crds.yaml").is_file(),
        "{} is missing (deploy/kustomization.yaml lists it)",
        dir.join("crds.yaml").display()
    );
    // As the README says: kustomize's output, applied with kubectl (client-side).
    plane.kubectl_ok(&["apply", "-k", &dir.to_string_lossy()]);
    plane.wait_crds_established();
    plane.create_namespace(APP_NS, &[]);
    plane.create_node("node-a", &[]);
    plane.create_pod(APP_NS, "web", &[("app", "web")], "node-a");

    // The agent's own credentials, from a node.
    let node = Netns::new("node");
    plane.connect(&node);
    let kubeconfig =
        plane.kubeconfig_for_service_account("mirror", "mirror-agent", Duration::from_secs(3600));
    let own = |args: &[&str]| plane.kubectl_from(&node, &kubeconfig, args);
    let whoami = stdout_ok(
        "kubectl auth whoami",
        own(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]),
    );
    assert_eq!(whoami, AGENT);

    // Each question both ways: impersonated by the admin, and with the agent's token.
    let as_agent = format!("--as={AGENT}");
    let answers: Vec<(bool, bool)> = std::thread::scope(|s| {
        let impersonated = s.spawn(|| {
            CHECKS
                .iter()
                .map(|c| {
                    let mut args = can_i_args(c);
                    args.push(as_agent.clone());
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    answer(c, &plane.kubectl(&args))
                })
                .collect::<Vec<bool>>()
        });
        let token: Vec<bool> = CHECKS
            .iter()
            .map(|c| {
                let args = can_i_args(c);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                answer(c, &own(&args))
            })
            .collect();
        impersonated.join().expect("the impersonated checks").into_iter().zip(token).collect()
    });

    eprintln!(
        "\n{:<16} {:<56} {:<10} {:<8} {:<6} {:<6}",
        "verb", "resource", "namespace", "expected", "--as", "token"
    );
    let mut wrong = Vec::new();
    for (c, (imp, tok)) in CHECKS.iter().zip(&answers) {
        let yn = |b: bool| if b { "yes" } else { "no" };
        let resource = match c.subresource {
            Some(s) => format!("{} --subresource={s}", c.resource),
            None => c.resource.to_string(),
        };
        let bad = *imp != c.allowed || *tok != c.allowed;
        eprintln!(
            "{:<16} {:<56} {:<10} {:<8} {:<6} {:<6}{}",
            c.verb,
            resource,
            c.namespace.unwrap_or("(all)"),
            yn(c.allowed),
            yn(*imp),
            yn(*tok),
            if bad { "  <-- WRONG" } else { "" }
        );
        if bad {
            wrong.push(format!("{} {resource} in {:?}", c.verb, c.namespace));
        }
    }
    assert!(wrong.is_empty(), "answers other than expected: {wrong:?}");

    // Nothing more: the rules the agent holds, less those any service account holds (discovery,
    // self reviews), are exactly the expected ones; both ways again.
    let list = |extra: &[&str], from_node: bool| -> BTreeSet<(String, String)> {
        let mut args = vec!["auth", "can-i", "--list", "-n", APP_NS];
        args.extend(extra);
        let out = if from_node { own(&args) } else { plane.kubectl(&args) };
        rules_of(&stdout_ok("kubectl auth can-i --list", out))
    };
    let baseline = list(&["--as=system:serviceaccount:mirror:nobody"], false);
    assert!(!baseline.is_empty(), "no rules for an unbound service account");
    let expected: BTreeSet<(String, String)> = EXPECTED_RULES
        .iter()
        .flat_map(|(r, verbs)| verbs.iter().map(|v| (r.to_string(), v.to_string())))
        .collect();
    for (how, rules) in [("impersonated", list(&[&as_agent], false)), ("own token", list(&[], true))] {
        let extra: BTreeSet<&(String, String)> = rules.difference(&baseline).collect();
        let unexpected: Vec<_> = extra.iter().filter(|r| !expected.contains(r)).collect();
        let missing: Vec<_> = expected.iter().filter(|r| !extra.contains(r)).collect();
        assert!(
            unexpected.is_empty() && missing.is_empty(),
            "{how}: the agent holds {unexpected:?} beyond what it needs, and lacks {missing:?}"
        );
    }

    // The audit log saw each question once as the agent: both ways, and the two lists.
    let reviews =
        |what: &str| plane.audit_counts(AGENT).get(&("create".into(), what.into())).copied().unwrap_or(0);
    let ssar = "selfsubjectaccessreviews.authorization.k8s.io";
    let counted = wait_until(Duration::from_secs(5), || reviews(ssar) == 2 * CHECKS.len() as u64);
    assert!(counted, "{} access reviews audited, {} asked", reviews(ssar), 2 * CHECKS.len());
    assert_eq!(reviews("selfsubjectrulesreviews.authorization.k8s.io"), 2);
    eprintln!(
        "{} checks both ways; control plane ready in {:.1} s, whole test {:.1} s",
        CHECKS.len(),
        started.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn a_plane_with_the_rules_crds_answers_as_a_cluster_does() {
    if !runnable() {
        return;
    }
    let mut plane = ControlPlane::start();
    let crds = deploy().join("crds.yaml");
    plane.kubectl_ok(&["apply", "-f", &crds.to_string_lossy()]);
    plane.wait_crds_established();
    plane.create_namespace(APP_NS, &[("team", "checkout")]);
    plane.create_node("node-a", &[("topology.kubernetes.io/zone", "z1")]);
    plane.create_node("node-b", &[]);
    plane.create_pod(APP_NS, "web", &[("app", "web")], "node-a");
    plane.create_pod(APP_NS, "db", &[("app", "db")], "node-b");

    // Listed back as the agent lists them: its node's pods, by field selector.
    let json =
        |args: &[&str]| -> Value { serde_json::from_str(&plane.kubectl_ok(args)).expect("kubectl's JSON") };
    let pods = json(&["get", "pods", "-A", "--field-selector=spec.nodeName=node-a", "-o", "json"]);
    let items = pods["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{pods}");
    assert_eq!(items[0]["metadata"]["name"], "web");
    assert_eq!(items[0]["metadata"]["labels"]["app"], "web");
    assert_eq!(items[0]["spec"]["nodeName"], "node-a");
    assert_eq!(items[0]["status"]["phase"], "Pending", "no kubelet runs it");
    let ns = json(&["get", "namespace", APP_NS, "-o", "json"]);
    assert_eq!(ns["metadata"]["labels"]["team"], "checkout");
    let node = json(&["get", "node", "node-a", "-o", "json"]);
    assert_eq!(node["metadata"]["labels"]["topology.kubernetes.io/zone"], "z1");
    for rules in [RULES, CLUSTER_RULES] {
        let list = json(&["get", rules, "-A", "-o", "json"]);
        assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    }

    // A watch is audited once, at its start.
    let mut watch = plane.kubectl_command(&plane.netns().path(), plane.admin_kubeconfig());
    watch.args(["get", "pods", "-A", "--watch-only", "-o", "name"]);
    let watcher = Proc::spawn("kubectl get pods --watch-only", &mut watch);
    let watches = || plane.audit_counts(ADMIN).get(&("watch".into(), "pods".into())).copied().unwrap_or(0);
    assert!(wait_until(Duration::from_secs(10), || watches() == 1), "watches audited: {}", watches());
    // The metrics count a watch when it ends.
    drop(watcher);
    let mut totals = Default::default();
    let total = |t: &std::collections::BTreeMap<(String, String), u64>, verb: &str, resource: &str| {
        t.get(&(verb.into(), resource.into())).copied().unwrap_or(0)
    };
    let counted = wait_until(Duration::from_secs(10), || {
        totals = plane.request_totals();
        total(&totals, "WATCH", "pods") == 1
    });
    assert!(
        counted && total(&totals, "LIST", "pods") >= 1 && total(&totals, "LIST", RULES) >= 1,
        "{totals:?}"
    );

    let memory = plane.memory();
    eprintln!(
        "ready in {:.1} s; resident: kube-apiserver {} MB, etcd {} MB",
        plane.startup().as_secs_f64(),
        memory.apiserver >> 20,
        memory.etcd >> 20
    );

    // Stopped, the API server answers nobody; started again on the same etcd, address and
    // certificate, it has everything and the same kubeconfigs work.
    plane.stop_apiserver();
    assert!(!plane.kubectl(&["get", "pods", "-A", "--request-timeout=2s"]).status.success());
    plane.start_apiserver();
    eprintln!("restarted in {:.1} s", plane.startup().as_secs_f64());
    let names = plane.kubectl_ok(&["get", "pods", "-n", APP_NS, "-o", "name"]);
    assert_eq!(names.lines().collect::<BTreeSet<_>>(), BTreeSet::from(["pod/db", "pod/web"]));
    plane.wait_crds_established();
}

#[test]
fn can_i_list_tables_are_read_into_rules() {
    let table = "\
Resources                                       Non-Resource URLs   Resource Names   Verbs
selfsubjectreviews.authentication.k8s.io        []                  []               [create]
pods                                            []                  []               [get list watch]
mirrorrules.mirror.ebpf.io/status               []                  []               [patch]
                                                [/api/*]            []               [get]
configmaps                                      []                  [one]            [get]
";
    let rules = rules_of(table);
    let want: BTreeSet<(String, String)> = [
        ("selfsubjectreviews.authentication.k8s.io", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("mirrorrules.mirror.ebpf.io/status", "patch"),
    ]
    .iter()
    .map(|(r, v)| (r.to_string(), v.to_string()))
    .collect();
    assert_eq!(rules, want);
}
