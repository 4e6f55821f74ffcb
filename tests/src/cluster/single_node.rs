//! A real single-node Kubernetes cluster for the end-to-end tests: the control plane
//! ([`ControlPlane::start_for_nodes`]: etcd, kube-apiserver) with kube-scheduler and
//! kube-controller-manager in its namespace, and a node ([`CriNode`]: containerd with the CNI
//! bridge, in a node network namespace) run by a real kubelet and kube-proxy (nftables mode,
//! or iptables: [`crate::cluster::kube_proxy`]), all built by `tests/kube/build.sh`; CoreDNS as
//! the cluster's DNS ([`Cluster::install_dns`], [`crate::cluster::coredns`]).
//! Pods are made by the kubelet from API objects, Services answered through kube-proxy's rules.
//!
//! Nothing global is changed, and nothing is left:
//! - every address is in 198.18.0.0/15: pods 198.18.96.0/24 (the node's bridge), Services
//!   198.19.250.128/25 (`kubernetes` .129, `kube-dns` [`DNS_IP`](crate::cluster::coredns::DNS_IP)), the node's address the
//!   /31 of its link to the control plane ([`ControlPlane::connect`]);
//! - the kubelet and kube-proxy run in the node's network namespace: their iptables and
//!   nftables rules, net sysctls, listeners and the pods' host-side veths end with it;
//! - the kubelet runs in a mount namespace of its own, where the kernel sysctls it would set
//!   (`kernel.panic`, `kernel.panic_on_oops`, `vm.overcommit_memory`) are files of ours and its
//!   hard-coded `/var/lib/kubelet` and `/var/log/containers` directories of ours; its root
//!   directory is a shared mount of ours, so that the volumes it mounts there (service-account
//!   tokens, ConfigMaps) reach containerd, in the host's mount namespace;
//! - the node's `/run` (containerd's socket) and a BPF file system for the DaemonSet are
//!   shared mounts of ours ([`SharedMount`]), which a DaemonSet's `hostPath` names
//!   ([`Cluster::run_dir`], [`Cluster::bpffs_dir`]);
//! - on drop: kube-proxy and the kubelet stop, every sandbox is deleted through the CRI, the
//!   other components stop, our mounts go, then containerd, the node and the control plane
//!   ([`CriNode`], [`ControlPlane`]).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::cluster::containerd::CriNode;
use crate::cluster::control_plane::{binaries, rss, ControlPlane};
use crate::cluster::coredns::{self, DNS_IP};
use crate::cluster::kube_proxy::{KubeProxy, ProxyMode, ProxySetup};
use crate::cluster::podman::{self, run_ok, SharedMount};
use crate::proc::{wait_until, Proc};
use crate::topology::netns::nsenter;

/// The node's name.
pub const NODE: &str = "e2e-node";
/// How long the node may take to be Ready after the kubelet starts (0.8 s on an idle machine).
const NODE_READY: Duration = Duration::from_secs(90);

/// A single-node cluster; everything stopped and removed on drop.
pub struct Cluster {
    kube_proxy: Option<KubeProxy>,
    kubelet: Option<Proc>,
    controller_manager: Option<Proc>,
    scheduler: Option<Proc>,
    /// Directories of the host made here for the kubelet's mount namespace (removed if empty).
    host_dirs: Vec<PathBuf>,
    /// Whether the pods' cgroup (`k8s.io`, at the top of each hierarchy: no QoS cgroups) is
    /// ours to remove.
    pods_cgroup_ours: bool,
    kubelet_root: Option<SharedMount>,
    run: Option<SharedMount>,
    bpffs: Option<SharedMount>,
    /// containerd, the CNI bridge and the node's network namespace.
    pub node: CriNode,
    /// etcd and the API server.
    pub plane: ControlPlane,
    node_ip: Ipv4Addr,
    dir: TempDir,
    /// How long the start took, and its parts.
    pub timings: Timings,
}

/// What bringing the cluster up took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// etcd and the API server ready.
    pub control_plane: Duration,
    /// containerd serving, the pause image imported.
    pub containerd: Duration,
    /// From the kubelet's start to the Node Ready.
    pub node_ready: Duration,
    /// The whole start.
    pub total: Duration,
}

impl Cluster {
    /// Starts the control plane, the scheduler, the controller-manager, containerd, the
    /// kubelet and kube-proxy, and waits until the Node is Ready and the `default` namespace has
    /// its service account.
    pub fn start() -> Cluster {
        let t0 = Instant::now();
        let bin = binaries().to_path_buf();
        let plane = ControlPlane::start_for_nodes();
        let control_plane = t0.elapsed();
        let t = Instant::now();
        let node = CriNode::start();
        let containerd = t.elapsed();
        let node_ip = plane.connect(&node.node);
        // The Service range through the same link, as a node's default route would take it:
        // the node's own clients (hostNetwork pods) reach ClusterIPs, translated by kube-proxy.
        let gateway = Ipv4Addr::from(u32::from(node_ip) - 1);
        node.node.sh(&format!(
            "ip route add {} via {gateway} dev {}",
            crate::cluster::control_plane::SERVICE_RANGE,
            crate::cluster::control_plane::NODE_LINK
        ));
        let dir = tempfile::Builder::new().prefix("mirror-e2e-cluster").tempdir().expect("a temp dir");
        let mut c = Cluster {
            kube_proxy: None,
            kubelet: None,
            controller_manager: None,
            scheduler: None,
            host_dirs: Vec::new(),
            pods_cgroup_ours: !pod_cgroups().iter().any(|p| p.exists()),
            kubelet_root: None,
            run: None,
            bpffs: None,
            node,
            plane,
            node_ip,
            dir,
            timings: Timings { control_plane, containerd, ..Timings::default() },
        };
        let kc = c.plane.admin_kubeconfig().display().to_string();
        let common = |port: u16| {
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                // Else a lookup of the request-header CA, logged as missing every second.
                "--authentication-skip-lookup=true".to_string(),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                "--leader-elect=false".to_string(),
            ]
        };
        let plane_ns = c.plane.netns().path();
        c.scheduler = Some(Proc::spawn(
            "kube-scheduler",
            nsenter(&plane_ns, bin.join("kube-scheduler")).args(common(10259)),
        ));
        let sa_key = c.plane.dir().join("sa.key");
        c.controller_manager = Some(Proc::spawn(
            "kube-controller-manager",
            nsenter(&plane_ns, bin.join("kube-controller-manager")).args(common(10257)).args([
                format!("--service-account-private-key-file={}", sa_key.display()),
                format!("--root-ca-file={}", c.plane.ca_path().display()),
                format!("--service-cluster-ip-range={}", crate::cluster::control_plane::SERVICE_RANGE),
                "--allocate-node-cidrs=false".to_string(),
            ]),
        ));
        // The node's /run (containerd's socket) and a directory for the DaemonSet's bpffs,
        // shared as a systemd host's are (HostToContainer and Bidirectional need it).
        c.run = Some(SharedMount::new(&c.node.run_dir()));
        c.bpffs = Some(SharedMount::new(&c.dir.path().join("bpf")));
        let t = Instant::now();
        c.start_kubelet();
        c.wait_node_ready();
        c.timings.node_ready = t.elapsed();
        c.kube_proxy = Some(KubeProxy::start(
            ProxySetup {
                node: crate::topology::netns::Netns::existing(c.node.node.name()),
                dir: c.dir.path().to_path_buf(),
                kubeconfig: c.plane.admin_kubeconfig().to_path_buf(),
                node_ip,
                node_name: NODE.to_string(),
            },
            ProxyMode::Nftables,
        ));
        let sa = wait_until(Duration::from_secs(60), || {
            c.plane.kubectl(&["-n", "default", "get", "serviceaccount", "default"]).status.success()
        });
        assert!(sa, "no default service account: {}", c.logs());
        c.timings.total = t0.elapsed();
        c
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The kubelet, in the node's network namespace and a mount namespace of its own.
    fn start_kubelet(&mut self) {
        for d in ["kubelet", "pod-logs", "mask", "var-lib-kubelet", "var-log-containers"] {
            std::fs::create_dir_all(self.path(d)).expect("creating the kubelet's directories");
        }
        // Its root directory, shared: its volume mounts reach containerd.
        self.kubelet_root = Some(SharedMount::new(&self.path("kubelet")));
        // The mount points of its hard-coded directories (kept empty on the host).
        for d in ["/var/lib/kubelet", "/var/log/containers"] {
            if !Path::new(d).exists() {
                std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {d}: {e}"));
                self.host_dirs.push(PathBuf::from(d));
            }
        }
        // The values the kubelet wants for the kernel's sysctls, in files of ours.
        for (name, value) in [("overcommit_memory", "1"), ("panic", "10"), ("panic_on_oops", "1")] {
            std::fs::write(self.path(&format!("mask/{name}")), format!("{value}\n")).expect("writing a mask");
        }
        let d = self.dir.path().display();
        let sock = self.node.socket();
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: unix://{sock}
imageServiceEndpoint: unix://{sock}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
oomScoreAdj: 0
maxOpenFiles: 20000
makeIPTablesUtilChains: false
podLogsDir: {d}/pod-logs
clusterDomain: cluster.local
clusterDNS: [{DNS_IP}]
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
rotateCertificates: false
serverTLSBootstrap: false
"#,
            ip = self.node_ip,
            sock = sock.display()
        );
        std::fs::write(self.path("kubelet.yaml"), config).expect("writing the kubelet's config");
        let script = format!(
            "set -e
mount --make-private /proc
mount --bind {d}/mask/overcommit_memory /proc/sys/vm/overcommit_memory
mount --bind {d}/mask/panic /proc/sys/kernel/panic
mount --bind {d}/mask/panic_on_oops /proc/sys/kernel/panic_on_oops
mount --bind {d}/var-lib-kubelet /var/lib/kubelet
mount --bind {d}/var-log-containers /var/log/containers
exec {kubelet} --config={d}/kubelet.yaml --kubeconfig={kc} --root-dir={d}/kubelet --cert-dir={d}/kubelet/pki \
  --hostname-override={NODE} --node-ip={ip}",
            kubelet = binaries().join("kubelet").display(),
            kc = self.plane.admin_kubeconfig().display(),
            ip = self.node_ip,
        );
        let mut cmd = nsenter(&self.node.node.path(), "unshare");
        cmd.args(["-m", "--propagation", "unchanged", "sh", "-c", &script]);
        self.kubelet = Some(Proc::spawn("kubelet", &mut cmd));
    }

    fn wait_node_ready(&mut self) {
        let ready = wait_until(NODE_READY, || {
            let out = self.plane.kubectl(&[
                "get",
                "node",
                NODE,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
            ]);
            String::from_utf8_lossy(&out.stdout).trim() == "True"
                || !self.kubelet.as_mut().is_some_and(Proc::running)
        });
        let running = self.kubelet.as_mut().is_some_and(Proc::running);
        assert!(ready && running, "the node is not Ready: {}", self.logs());
    }

    /// The node's address (its InternalIP; the address of hostNetwork pods).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The directory standing for the node's `/run` (containerd's socket at
    /// `containerd/containerd.sock`), a shared mount: for the DaemonSet's `host-run` volume.
    pub fn run_dir(&self) -> PathBuf {
        self.node.run_dir()
    }

    /// A shared mount standing for the node's `/sys/fs/bpf`, for the DaemonSet's `bpffs`
    /// volume: its init container mounts a BPF file system there.
    pub fn bpffs_dir(&self) -> PathBuf {
        self.path("bpf")
    }

    /// A directory of the node for a test's `hostPath` volumes, removed with the cluster.
    pub fn host_dir(&self, name: &str) -> PathBuf {
        let p = self.path(&format!("host/{name}"));
        std::fs::create_dir_all(&p).expect("creating a host directory");
        p
    }

    /// Imports a podman image into the node's containerd (`podman save`, `ctr import`).
    #[track_caller]
    pub fn import_image(&self, tag: &str) {
        let archive = self.path("image.tar");
        run_ok(podman::podman().args(["save", "-q", "--format", "oci-archive", "-o"]).arg(&archive).arg(tag));
        self.node.import_image(&archive);
        let _ = std::fs::remove_file(&archive);
    }

    /// `kubectl` as the admin, from the control plane's namespace; panics unless it succeeds.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.plane.kubectl_ok(args)
    }

    /// `kubectl apply -f -` of `yaml`.
    #[track_caller]
    pub fn apply(&self, yaml: &str) -> String {
        self.plane.apply_yaml(yaml)
    }

    /// `kubectl rollout status` of `what` (`ds/NAME`, `deploy/NAME`) in `ns`, within `timeout`;
    /// panics with the namespace's pods and events, and the kubelet's log, unless it completes.
    #[track_caller]
    pub fn rollout(&self, ns: &str, what: &str, timeout: Duration) -> Duration {
        let t = Instant::now();
        let out = self.plane.kubectl(&[
            "-n",
            ns,
            "rollout",
            "status",
            what,
            &format!("--timeout={}s", timeout.as_secs()),
        ]);
        assert!(
            out.status.success(),
            "rollout of {ns}/{what}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.describe(ns)
        );
        t.elapsed()
    }

    /// The pods and events of namespace `ns`, as a user reads them when something is wrong.
    pub fn describe(&self, ns: &str) -> String {
        let o = |args: &[&str]| {
            let out = self.plane.kubectl(args);
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        };
        format!(
            "{}\n{}\n{}",
            o(&["-n", ns, "get", "pods", "-o", "wide"]),
            o(&["-n", ns, "get", "events", "--sort-by=.lastTimestamp"]),
            o(&["-n", ns, "describe", "pods"])
        )
    }

    /// The components' logs' last lines.
    pub fn logs(&self) -> String {
        let tail = |p: &Option<Proc>| {
            let out = p.as_ref().map(Proc::output).unwrap_or_default();
            let lines: Vec<&str> = out.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "kubelet:\n{}\nkube-proxy:\n{}\ncontroller-manager:\n{}\ncontainerd:\n{}",
            tail(&self.kubelet),
            self.kube_proxy
                .as_ref()
                .map(|p| {
                    let out = p.output();
                    let lines: Vec<&str> = out.lines().collect();
                    lines[lines.len().saturating_sub(30)..].join("\n")
                })
                .unwrap_or_default(),
            tail(&self.controller_manager),
            self.node.log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
        )
    }

    /// Resident memory of the node's components (kubelet, kube-proxy, scheduler,
    /// controller-manager), in bytes.
    pub fn node_memory(&self) -> u64 {
        self.pids().into_iter().map(rss).sum()
    }

    /// The pids of the node's components (kubelet, kube-proxy, scheduler, controller-manager).
    pub fn pids(&self) -> Vec<u32> {
        [&self.kubelet, &self.scheduler, &self.controller_manager]
            .into_iter()
            .flatten()
            .map(Proc::pid)
            .chain(self.kube_proxy.as_ref().and_then(KubeProxy::pid))
            .collect()
    }

    /// kube-proxy, to read its mode and rules or switch it to another mode.
    pub fn kube_proxy(&mut self) -> &mut KubeProxy {
        self.kube_proxy.as_mut().expect("kube-proxy runs")
    }

    /// The cluster's own directory (its mounts are below it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs a shell command in the node's network namespace (the host network of its pods).
    #[track_caller]
    pub fn node_sh(&self, cmd: &str) -> String {
        self.node.node.sh(cmd)
    }

    /// CoreDNS as the cluster's DNS ([`crate::cluster::coredns`]); returns once rolled out.
    #[track_caller]
    pub fn install_dns(&self) -> Duration {
        self.apply(&coredns::manifests());
        self.rollout("kube-system", "deploy/coredns", Duration::from_secs(120))
    }
}

/// Where containerd puts the kubelet's pods without QoS cgroups: `k8s.io` at the top of every
/// cgroup hierarchy.
pub fn pod_cgroups() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut tops = vec![root.join("k8s.io")];
    if let Ok(d) = std::fs::read_dir(root) {
        tops.extend(d.flatten().map(|e| e.path().join("k8s.io")));
    }
    tops
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let t = Instant::now();
        // No new pods, no rules rewritten; then every sandbox through the CRI (the CNI DEL).
        if let Some(p) = &mut self.kubelet {
            p.stop(libc::SIGTERM, Duration::from_secs(10));
        }
        self.kube_proxy.take();
        self.node.delete_all_pods();
        for p in [&mut self.controller_manager, &mut self.scheduler].into_iter().flatten() {
            p.stop(libc::SIGTERM, Duration::from_secs(5));
        }
        // The kubelet's volume mounts under its root, the bpffs, the node's /run.
        self.kubelet_root.take();
        self.bpffs.take();
        self.run.take();
        for d in &self.host_dirs {
            let _ = std::fs::remove_dir(d);
        }
        if self.pods_cgroup_ours {
            for top in pod_cgroups().iter().filter(|p| p.exists()) {
                let _ = Command::new("find")
                    .arg(top)
                    .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", "+"])
                    .status();
                if top.exists() {
                    eprintln!("removing cgroup {}: not empty", top.display());
                }
            }
        }
        eprintln!("cluster's node components stopped in {:.1} s", t.elapsed().as_secs_f64());
    }
}
