//! The uninstall (`kubectl delete -k`: nothing of the agent's left on the node), a node whose
//! BPF file system is a private mount (refused, in the runtime's words), and the cluster's
//! teardown (nothing of it left on the host).

use std::path::Path;
use std::time::{Duration, Instant};

use mirror_e2e::cluster::single_node::{pod_cgroups, Cluster};
use mirror_e2e::proc::wait_until;

use crate::workloads::write_overlay;

/// What the host had before the cluster: the kubelet's directories, pods' cgroups.
pub(crate) struct HostBefore {
    kubelet_dirs: bool,
    pod_cgroups: bool,
}

impl HostBefore {
    pub(crate) fn now() -> HostBefore {
        HostBefore {
            kubelet_dirs: Path::new("/var/lib/kubelet").exists() || Path::new("/var/log/containers").exists(),
            pod_cgroups: pod_cgroups().iter().any(|p| p.exists()),
        }
    }
}

/// `kubectl delete -k` of the overlay in `overlay`: the agent's pod gone, and no sink, program
/// or pin left on the node. Returns its time.
pub(crate) fn uninstall(c: &Cluster, overlay: &Path) -> Duration {
    let t = Instant::now();
    c.kubectl_ok(&["delete", "-k", &overlay.display().to_string(), "--wait=true", "--timeout=120s"]);
    let gone = pods_gone(c);
    assert!(gone, "{}", c.describe("mirror"));
    let took = t.elapsed();
    let links = c.node_sh("ip -o link show");
    assert!(!links.contains("mirror0"), "the sink outlived the agent: {links}");
    let tcx = c.node_sh("for l in $(ls /sys/class/net); do bpftool net show dev $l 2>/dev/null; done");
    assert!(!tcx.contains("tcx") && !tcx.contains("mirror"), "programs left on the node: {tcx}");
    // A new bpffs holds the kernel's own iterators, `maps.debug` and `progs.debug`: nothing else.
    let pins: Vec<_> = std::fs::read_dir(c.bpffs_dir())
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !p.ends_with("maps.debug") && !p.ends_with("progs.debug"))
        .collect();
    assert!(pins.is_empty(), "pins left: {pins:?}");
    took
}

/// Whether the agent's pods are gone within a minute.
fn pods_gone(c: &Cluster) -> bool {
    wait_until(Duration::from_secs(60), || {
        !c.plane.kubectl(&["-n", "mirror", "get", "pods", "-o", "name"]).stdout.iter().any(|_| true)
    })
}

/// A node whose /sys/fs/bpf is a private mount: the runtime refuses the init container
/// (Bidirectional), in the words docs/deployment.md quotes; the agent never starts.
pub(crate) fn private_mount_refused(c: &Cluster, overlay: &Path) {
    let private = c.host_dir("private-bpf");
    let p = private.display();
    mirror_bpf::testing::sh(&format!("mount --bind {p} {p} && mount --make-private {p}"));
    write_overlay(overlay, c, &private, None);
    c.kubectl_ok(&["apply", "-k", &overlay.display().to_string()]);
    let (mut said, mut status) = (String::new(), String::new());
    let refused = wait_until(Duration::from_secs(60), || {
        let out = |args: &[&str]| String::from_utf8_lossy(&c.plane.kubectl(args).stdout).trim().to_string();
        said = out(&["-n", "mirror", "get", "events", "-o", "jsonpath={.items[*].message}"]);
        status = out(&[
            "-n",
            "mirror",
            "get",
            "pods",
            "-o",
            "jsonpath={.items[*].status.initContainerStatuses[0].state.waiting.reason}",
        ]);
        said.contains(&format!("path \"{p}\" is mounted on \"{p}\" but it is not a shared mount"))
            && status == "CreateContainerError"
    });
    // Its pods gone is what this step needs before the mount goes: the objects of the overlay
    // applied again just after their deletion are not waited for (the API server's cleanup of
    // a custom resource definition deleted that soon after its creation once outlasted 120 s;
    // `uninstall` waits for all of them).
    c.kubectl_ok(&["delete", "-k", &overlay.display().to_string(), "--wait=false"]);
    let gone = pods_gone(c);
    mirror_bpf::testing::sh(&format!("umount {p}"));
    assert!(refused, "the private mount not refused as expected: pod {status}, events: {said}");
    assert!(gone, "{}", c.describe("mirror"));
}

/// The cluster torn down: no mount, network namespace, process, kube-proxy rule, kubelet
/// directory or pod cgroup of it left on the host (`before`: what was there already).
pub(crate) fn torn_down(c: Cluster, before: HostBefore) {
    let (pids, dir, netns) = (c.pids(), c.dir().display().to_string(), c.node.node.name().to_string());
    let t = Instant::now();
    drop(c);
    eprintln!("cluster torn down in {:.1} s", t.elapsed().as_secs_f64());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let ours: Vec<&str> =
        mounts.lines().filter(|l| l.contains(&dir) || l.contains("mirror-containerd")).collect();
    assert!(ours.is_empty(), "mounts left: {ours:?}");
    assert!(!Path::new(&format!("/run/netns/{netns}")).exists(), "the node's namespace is left");
    let alive: Vec<u32> = pids.into_iter().filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
    assert!(alive.is_empty(), "processes left: {alive:?}");
    let host_rules =
        mirror_bpf::testing::sh("nft list tables; iptables-save 2>/dev/null | grep -c KUBE- || true");
    assert!(!host_rules.contains("kube-proxy"), "kube-proxy's rules on the host: {host_rules}");
    assert_eq!(host_rules.lines().last().map(str::trim), Some("0"), "KUBE- chains on the host: {host_rules}");
    if !before.kubelet_dirs {
        assert!(!Path::new("/var/lib/kubelet").exists() && !Path::new("/var/log/containers").exists());
    }
    if !before.pod_cgroups {
        let left: Vec<_> = pod_cgroups().into_iter().filter(|p| p.exists()).collect();
        assert!(left.is_empty(), "pods' cgroups left: {left:?}");
    }
}
