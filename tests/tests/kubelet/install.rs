//! The product installed as a user installs it (`kubectl apply -k` of an overlay), its probes
//! and metrics, and the cluster's rule that selects web.

use std::path::Path;
use std::time::{Duration, Instant};

use mirror_e2e::cluster::single_node::Cluster;
use mirror_e2e::proc::wait_until;
use serde_json::Value;

use crate::workloads::{client_logs, http_record, write_overlay};

/// The agent's pod, installed.
pub(crate) struct Installed {
    /// Its name (`pod/...`).
    pub(crate) pod: String,
    /// From `kubectl apply -k` to the DaemonSet rolled out.
    pub(crate) rollout: Duration,
}

/// `kubectl apply -k` of the overlay written in `overlay`, rolled out: the agent reads the
/// overlay's settings, its pod is Ready with no restart, its metrics answer on the pod's
/// address (the node's), and the clients go on answered (fail-open).
pub(crate) fn install(c: &Cluster, overlay: &Path) -> Installed {
    write_overlay(overlay, c, &c.bpffs_dir(), None);
    let t = Instant::now();
    let applied = c.kubectl_ok(&["apply", "-k", &overlay.display().to_string()]);
    assert!(applied.contains("daemonset.apps/mirror-agent created"), "{applied}");
    c.rollout("mirror", "ds/mirror-agent", Duration::from_secs(180));
    let rollout = t.elapsed();
    let pod = c.kubectl_ok(&[
        "-n",
        "mirror",
        "get",
        "pod",
        "-l",
        "app.kubernetes.io/name=mirror-agent",
        "-o",
        "name",
    ]);
    let pod = pod.trim().to_string();
    let log = c.kubectl_ok(&["-n", "mirror", "logs", &pod]);
    assert!(
        log.contains("config /etc/mirror-agent/overrides.yaml over /etc/mirror-agent/agent.yaml"),
        "{log}"
    );
    // Probes: Ready (readiness passed) and never restarted (liveness); metrics through the
    // pod's address, as Prometheus scrapes it from the annotations.
    let status: Value =
        serde_json::from_str(&c.kubectl_ok(&["-n", "mirror", "get", &pod, "-o", "json"])).expect("JSON");
    assert_eq!(status["status"]["containerStatuses"][0]["restartCount"], 0, "{status}");
    let pod_ip = status["status"]["podIP"].as_str().expect("a pod IP").to_string();
    assert_eq!(pod_ip, c.node_ip().to_string());
    let metrics = c.node_sh(&format!("curl -sf http://{pod_ip}:9464/metrics"));
    assert!(metrics.contains("mirror_"), "{metrics}");

    // The clients go on answered with the agent attached (fail-open).
    let (w0, a0) = (http_record(c, "web").len(), http_record(c, "api").len());
    let going = wait_until(Duration::from_secs(60), || {
        http_record(c, "web").len() > w0 + 4 && http_record(c, "api").len() > a0 + 4
    });
    assert!(going, "the clients stopped with the agent attached:\n{}", client_logs(c));
    Installed { pod, rollout }
}

/// The `MirrorRule` `status: "500"` selecting web, until its status says it is active on the
/// node's one pod of web (`pod`: the agent's, for failures).
pub(crate) fn rule(c: &Cluster, pod: &str) {
    c.apply(
        "apiVersion: mirror.ebpf.io/v1alpha1\nkind: MirrorRule\nmetadata: {name: web-500s, namespace: shop}\n\
         spec:\n  status: \"500\"\n  podSelector: {matchLabels: {app: web}}\n",
    );
    let active = wait_until(Duration::from_secs(30), || {
        rule_status(c, "{.status.nodes[0].state}/{.status.nodes[0].pods}") == "Active/1"
    });
    assert!(
        active,
        "{}\nthe agent's log:\n{}",
        c.kubectl_ok(&["-n", "shop", "get", "mirrorrule", "web-500s", "-o", "yaml"]),
        c.kubectl_ok(&["-n", "mirror", "logs", pod])
    );
}

/// Fields of the rule's status, as `kubectl get -o jsonpath=...` prints them.
pub(crate) fn rule_status(c: &Cluster, jsonpath: &str) -> String {
    let out = c.plane.kubectl(&[
        "-n",
        "shop",
        "get",
        "mirrorrule",
        "web-500s",
        "-o",
        &format!("jsonpath={jsonpath}"),
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
