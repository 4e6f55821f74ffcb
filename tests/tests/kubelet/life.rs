//! A node's life under the capture: a rolling upgrade of the DaemonSet, kube-proxy switched
//! to another mode, web's pod rescheduled. Each waits for more of web's 500s after it; indices
//! are into the client's record of web from the rule on (`web_from`).

use std::path::Path;
use std::time::{Duration, Instant};

use mirror_e2e::cluster::kube_proxy::ProxyMode;
use mirror_e2e::cluster::single_node::Cluster;
use mirror_e2e::proc::wait_until;
use serde_json::Value;

use crate::workloads::{http_record, more_500s, write_overlay};
use crate::{AGENT_IMAGE, UPGRADE_TAG};

/// The upgrade: the record's indices of web during it, the new agent's pod, its time.
pub(crate) struct Upgrade {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) new_pod: String,
    pub(crate) took: Duration,
}

/// kube-proxy's switch: the record's index of web at its start and once the new rules were
/// there, and its time (until 12 more 500s).
pub(crate) struct Switch {
    pub(crate) from: usize,
    pub(crate) at: usize,
    pub(crate) took: Duration,
}

/// web's pod rescheduled: the new pod's name, the record's length (of all of it) when it was
/// Ready, the time it took.
pub(crate) struct Rescheduled {
    pub(crate) new_web: String,
    pub(crate) from: usize,
    pub(crate) took: Duration,
}

/// The agent's pods, by name.
fn agent_pods(c: &Cluster) -> Vec<String> {
    c.kubectl_ok(&["-n", "mirror", "get", "pods", "-l", "app.kubernetes.io/name=mirror-agent", "-o", "name"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// A rolling upgrade to a second tag, as a user upgrades: the overlay's image, applied. The new
/// agent adopts the old one's data path (`pod`'s) and its sink, with no restart.
pub(crate) fn upgrade(c: &Cluster, overlay: &Path, pod: &str, web_from: usize) -> Upgrade {
    let sink_index = || c.node_sh("cat /sys/class/net/mirror0/ifindex").trim().to_string();
    let sink_before = sink_index();
    let upgraded = format!("localhost/mirror-agent:{UPGRADE_TAG}");
    mirror_e2e::cluster::podman::run_ok(mirror_e2e::cluster::podman::podman().args([
        "tag",
        AGENT_IMAGE,
        &upgraded,
    ]));
    c.import_image(&upgraded);
    write_overlay(overlay, c, &c.bpffs_dir(), Some(UPGRADE_TAG));
    let upgrade_from = http_record(c, "web").len() - web_from;
    let t = Instant::now();
    c.kubectl_ok(&["apply", "-k", &overlay.display().to_string()]);
    c.rollout("mirror", "ds/mirror-agent", Duration::from_secs(180));
    let old_log = {
        let out = c.plane.kubectl(&["-n", "mirror", "logs", pod]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let replaced = wait_until(Duration::from_secs(60), || {
        let pods = agent_pods(c);
        pods.len() == 1 && pods[0] != pod
    });
    let took = t.elapsed();
    assert!(replaced, "the old agent's pod is left: {}", c.describe("mirror"));
    let upgrade_to = http_record(c, "web").len() - web_from;
    let new_pod = agent_pods(c).remove(0);
    let new_log = c.kubectl_ok(&["-n", "mirror", "logs", &new_pod]);
    assert!(new_log.contains("the running agent handed over: adopting its data path"), "{new_log}");
    let new_status: Value = serde_json::from_str(&c.kubectl_ok(&[
        "-n",
        "mirror",
        "exec",
        &new_pod,
        "--",
        "mirrorctl",
        "-o",
        "json",
        "status",
    ]))
    .expect("mirrorctl's JSON");
    assert_eq!(
        new_status["adopted"],
        true,
        "the new agent did not adopt the data path: {new_status}\nits log:\n{new_log}\nthe old agent's log:\n{old_log}\n\
         bpffs mounts: {}",
        c.node_sh(&format!("grep {} /proc/self/mountinfo || true", c.bpffs_dir().display()))
    );
    let spec: Value =
        serde_json::from_str(&c.kubectl_ok(&["-n", "mirror", "get", &new_pod, "-o", "json"])).expect("JSON");
    assert_eq!(spec["spec"]["containers"][0]["image"], upgraded.as_str());
    assert_eq!(spec["status"]["containerStatuses"][0]["restartCount"], 0, "{spec}");
    assert_eq!(sink_index(), sink_before, "the sink was removed and made anew during the upgrade");
    more_500s(c, "after the upgrade", 5);
    Upgrade { from: upgrade_from, to: upgrade_to, new_pod, took }
}

/// kube-proxy switched from nftables to iptables mode as an operator switches it (stopped,
/// `kube-proxy --cleanup`, started in the other mode): web's next connections go through
/// iptables' NAT. While no rules exist the ClusterIP answers nothing.
pub(crate) fn switch_proxy(c: &mut Cluster, web_from: usize) -> Switch {
    let switch_from = http_record(c, "web").len() - web_from;
    let t = Instant::now();
    assert_eq!(c.kube_proxy().mode(), ProxyMode::Nftables);
    c.kube_proxy().switch(ProxyMode::Iptables);
    let rules_now = |c: &mut Cluster| {
        let rules = c.kube_proxy().rules();
        let chains: u32 = rules.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
        (!rules.contains("kube-proxy") && chains > 0, rules)
    };
    let iptables = wait_until(Duration::from_secs(30), || rules_now(c).0);
    let rules = rules_now(c).1;
    assert!(iptables, "kube-proxy's iptables rules never came: {rules}\n{}", c.kube_proxy().output());
    let switched_at = http_record(c, "web").len() - web_from;
    more_500s(c, "after kube-proxy switched to iptables", 12);
    Switch { from: switch_from, at: switched_at, took: t.elapsed() }
}

/// web's pod rescheduled: deleted, made again by its Deployment (a new veth, a new address).
pub(crate) fn reschedule(c: &Cluster) -> Rescheduled {
    let web_pod = |c: &Cluster| -> (String, String) {
        let out = c.kubectl_ok(&[
            "-n",
            "shop",
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name} {.items[*].status.podIP}",
        ]);
        let mut f = out.split_whitespace().map(str::to_string);
        (f.next().unwrap_or_default(), f.next().unwrap_or_default())
    };
    let (old_web, old_ip) = web_pod(c);
    let veths_before = c.node_sh("ip -o link show type veth | grep -o \"veth[0-9a-f]*@\" | sort");
    let t = Instant::now();
    c.kubectl_ok(&["-n", "shop", "delete", "pod", &old_web, "--grace-period=1", "--wait=true"]);
    c.rollout("shop", "deploy/web", Duration::from_secs(120));
    let (new_web, new_ip) = web_pod(c);
    assert!(
        new_web != old_web && new_ip != old_ip && !new_ip.is_empty(),
        "{old_web} {old_ip} {new_web} {new_ip}"
    );
    let veths_after = c.node_sh("ip -o link show type veth | grep -o \"veth[0-9a-f]*@\" | sort");
    assert_ne!(veths_before, veths_after, "no new veth for the new pod");
    let rescheduled_from = http_record(c, "web").len();
    let took = t.elapsed();
    more_500s(c, "after web's pod was rescheduled", 5);
    Rescheduled { new_web, from: rescheduled_from, took }
}
