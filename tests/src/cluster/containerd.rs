//! A node made of the parts a kubelet drives: the distribution's containerd with its CRI plugin,
//! and the CNI plugins `bridge` and `host-local`, run in a node network namespace of the test's
//! own with their state, sockets and configuration under a temporary root. Pods are made as the
//! kubelet makes them and deleted as it deletes them, through crictl: `RunPodSandbox` with the
//! pod's metadata, labels (the kubelet's `io.kubernetes.pod.*` ones too) and cgroup parent, for
//! which the runtime runs the CNI ADD (a `veth…` on the node's bridge `cni0`, addresses from the
//! node's pod subnet); then `StopPodSandbox` (the CNI DEL) and `RemovePodSandbox`. Servers and
//! clients run in a pod's network namespace ([`CriPod::pod`]).
//!
//! - The pause image is the base image of `make image` with `sleep infinity` as its entrypoint
//!   (no registry), saved once per machine as an OCI archive next to the base image's cache and
//!   imported into each node's containerd (`ctr -n k8s.io images import`).
//! - containerd's CRI plugin is given `restrict_oom_score_adj = true`: it sets each sandbox's
//!   `oom_score_adj` to -998, which a root without `CAP_SYS_RESOURCE` may not (as here).
//! - The node's namespace holds containerd, the bridge, the pods' host-side veths, the bridge
//!   plugin's masquerade rules and `bridge-nf-call-iptables` (per namespace since Linux 5.3):
//!   the host's network is not touched.
//! - On drop: the pods left are deleted, containerd is stopped (SIGTERM, by pid), the pods'
//!   cgroups and the node namespace are removed, then the temporary root; so are the directories
//!   of the host that containerd and libcni make (`/run/containerd/s`, `/var/lib/cni/results`)
//!   where they did not exist before and are empty.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mirror_bpf::testing::in_ci;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::cluster::podman::{self, run_ok, BASE_IMAGE};
use crate::proc::{wait_until, Proc};
use crate::topology::netns::{Netns, Pod, Topology};

/// The pause image, as the runtime's `sandbox_image` names it.
pub const PAUSE_IMAGE: &str = "localhost/mirror-pause:bookworm";
/// The node's pod subnet (IPv4) and the bridge's address in it, the pods' gateway.
pub const POD_SUBNET4: &str = "198.18.96.0/24";
/// The bridge's IPv4 address.
pub const GATEWAY4: Ipv4Addr = Ipv4Addr::new(198, 18, 96, 1);
/// The node's pod subnet (IPv6).
pub const POD_SUBNET6: &str = "2001:2:0:96::/64";
/// The bridge's IPv6 address.
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0x96, 0, 0, 0, 1);
/// The CNI bridge, in the node's namespace.
pub const BRIDGE: &str = "cni0";
/// Where the CNI plugins are (Debian's containernetworking-plugins).
pub const CNI_BIN: &str = "/usr/lib/cni";

/// How long containerd may take to serve, and a pod to be made or deleted.
const STARTUP: Duration = Duration::from_secs(30);
/// The host directories containerd and libcni create outside the node's root.
const HOST_DIRS: [&str; 4] = ["/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"];

/// The commands a node needs on the PATH.
const TOOLS: [&str; 6] = ["containerd", "containerd-shim-runc-v2", "ctr", "crictl", "runc", "podman"];

/// Whether this machine has what a node needs (containerd, crictl, runc, podman, the CNI
/// plugins; `scripts/install-deps.sh` installs them). Without it the test fails in CI and
/// says that it did not run elsewhere.
#[track_caller]
pub fn available() -> bool {
    let on_path = |t: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    let mut missing: Vec<String> = TOOLS.iter().filter(|t| !on_path(t)).map(|t| t.to_string()).collect();
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new(CNI_BIN).join(plugin).is_file() {
            missing.push(format!("{CNI_BIN}/{plugin}"));
        }
    }
    if let Err(why) = bridge_netfilter() {
        missing.push(why);
    }
    if missing.is_empty() {
        return true;
    }
    let here = std::panic::Location::caller();
    assert!(
        !in_ci(),
        "{here}: a real node needs {missing:?} (scripts/install-deps.sh), and CI=true forbids skipping"
    );
    eprintln!("NOT RUN ({here}): a real node needs {missing:?} (scripts/install-deps.sh)");
    false
}

/// Makes sure bridged packets can be made to pass the node's iptables (the node sets
/// `bridge-nf-call-iptables`, which a Service in front of pods on the bridge needs):
/// br_netfilter, built into the kernel or loaded with `modprobe br_netfilter`. Its switches are
/// then in every network namespace, the node's too. Why not, otherwise.
fn bridge_netfilter() -> Result<(), String> {
    let switch = Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables");
    if switch.exists() {
        return Ok(());
    }
    let loaded = match Command::new("modprobe").arg("br_netfilter").output() {
        Ok(out) if out.status.success() => String::new(),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("running modprobe: {e}"),
    };
    if switch.exists() {
        return Ok(());
    }
    Err(format!(
        "br_netfilter (no {} after modprobe br_netfilter: {loaded:?}; the kernel needs \
         CONFIG_BRIDGE_NETFILTER)",
        switch.display()
    ))
}

/// The pause image as an OCI archive, made once per machine (under the base image's cache,
/// `$MIRROR_IMAGE_CACHE` or /var/cache/mirror-agent): the base image first
/// (`scripts/base-image.sh`), then `sleep infinity` as its entrypoint.
pub fn pause_archive() -> PathBuf {
    let cache = std::env::var_os("MIRROR_IMAGE_CACHE")
        .map_or_else(|| "/var/cache/mirror-agent".into(), PathBuf::from);
    std::fs::create_dir_all(&cache).unwrap_or_else(|e| panic!("creating {}: {e}", cache.display()));
    let archive = cache.join("pause-bookworm.oci.tar");
    let lock = std::fs::File::create(cache.join("pause.lock")).expect("creating the pause image's lock");
    // SAFETY: flock on a file we hold open; released when it is closed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0, "locking the pause image");
    if archive.is_file() {
        return archive;
    }
    let t = Instant::now();
    run_ok(Command::new(podman::repo_root().join("scripts/base-image.sh")).arg(BASE_IMAGE));
    let ctx = tempfile::Builder::new().prefix("mirror-pause").tempdir().expect("a temp dir");
    let file = ctx.path().join("Containerfile");
    std::fs::write(&file, format!("FROM {BASE_IMAGE}\nENTRYPOINT [\"/bin/sleep\", \"infinity\"]\n"))
        .expect("writing the Containerfile");
    run_ok(podman::podman().args(["build", "-q", "-t", PAUSE_IMAGE, "-f"]).arg(&file).arg(ctx.path()));
    let partial = cache.join("pause-bookworm.oci.tar.partial");
    let _ = std::fs::remove_file(&partial);
    run_ok(
        podman::podman().args(["save", "-q", "--format", "oci-archive", "-o"]).arg(&partial).arg(PAUSE_IMAGE),
    );
    std::fs::rename(&partial, &archive).expect("keeping the pause image");
    eprintln!("pause image {PAUSE_IMAGE} made in {:.1} s: {}", t.elapsed().as_secs_f64(), archive.display());
    archive
}

/// What the kubelet gives `RunPodSandbox`.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// The pod's name.
    pub name: String,
    /// Its Kubernetes namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// Its labels (the kubelet adds its `io.kubernetes.pod.*` ones).
    pub labels: BTreeMap<String, String>,
}

impl SandboxSpec {
    /// A pod `name` in `namespace`, UID from `n`, with `labels`.
    pub fn new(name: &str, namespace: &str, n: u32, labels: &[(&str, &str)]) -> SandboxSpec {
        SandboxSpec {
            name: name.into(),
            namespace: namespace.into(),
            uid: crate::cluster::kubelet::pod_uid(n),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }
}

/// A ready pod sandbox of the node.
pub struct CriPod {
    /// Its sandbox id.
    pub id: String,
    /// What it was made from.
    pub spec: SandboxSpec,
    /// Its network namespace (the runtime's `cni-…`), the veth the CNI plugin made for it,
    /// its addresses and gateways; role: the pod's name.
    pub pod: Pod,
    /// Its pause process.
    pub pause_pid: u32,
}

impl CriPod {
    /// `namespace/name`, as the agent labels a pod.
    pub fn label(&self) -> String {
        format!("{}/{}", self.spec.namespace, self.spec.name)
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// containerd, the CNI bridge and the pods, in a node namespace.
pub struct CriNode {
    containerd: Option<Proc>,
    /// Sandbox ids not deleted yet, and their namespaces' paths.
    live: std::cell::RefCell<Vec<(String, String)>>,
    /// The top cgroup of the pods (`<top>/kubepods/besteffort/pod<UID>`), in every hierarchy.
    cgroup_top: String,
    /// Host directories absent when the node started.
    host_dirs: Vec<&'static str>,
    made: AtomicU32,
    /// The node's network namespace: containerd, the bridge, the host-side veths.
    pub node: Netns,
    dir: TempDir,
}

impl CriNode {
    /// Starts containerd in a new node namespace with a CNI configuration of its own, and
    /// imports the pause image. Panics with containerd's log if it does not serve.
    pub fn start() -> CriNode {
        let archive = pause_archive();
        let unique = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let host_dirs = HOST_DIRS.into_iter().filter(|d| !Path::new(d).exists()).collect();
        let dir = tempfile::Builder::new().prefix("mirror-containerd").tempdir().expect("a temp dir");
        let node = Netns::new("crinode");
        // The bridge plugin enables forwarding itself; bridged IPv4 and IPv6 pass the node's
        // iptables (kube-proxy's Services need it).
        node.sh("sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1");
        let mut n = CriNode {
            containerd: None,
            live: Default::default(),
            cgroup_top: format!("me2e-{unique}"),
            host_dirs,
            made: AtomicU32::new(0),
            node,
            dir,
        };
        n.write_config(&format!("me2e-{unique}"));
        let t = Instant::now();
        let mut cmd = crate::topology::netns::nsenter(&n.node.path(), "containerd");
        cmd.arg("--config").arg(n.path("config.toml"));
        let mut proc = Proc::spawn(&format!("containerd in {}", n.node.name()), &mut cmd);
        let serving = wait_until(STARTUP, || n.crictl(&["version"]).status.success() || !proc.running());
        assert!(serving && proc.running(), "containerd did not serve: {}", proc.output());
        n.containerd = Some(proc);
        let served = t.elapsed();
        let t = Instant::now();
        n.ctr(&["-n", "k8s.io", "images", "import", "--all-platforms"], &archive);
        eprintln!(
            "containerd serving in {:.1} s, pause image imported in {:.1} s",
            served.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        n
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The directory standing for the node's `/run`: containerd's socket is at
    /// `containerd/containerd.sock` in it, where `pods.cri: auto` and the DaemonSet look.
    pub fn run_dir(&self) -> PathBuf {
        self.path("run")
    }

    /// containerd's CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.run_dir().join("containerd/containerd.sock")
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        self.containerd.as_ref().map(Proc::output).unwrap_or_default()
    }

    fn write_config(&self, network: &str) {
        for d in ["run/containerd", "cni", "pods", "logs"] {
            std::fs::create_dir_all(self.path(d)).expect("creating the node's directories");
        }
        let d = self.dir.path().display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d}/cni"
    max_conf_num = 1
"#,
            socket = self.socket().display()
        );
        std::fs::write(self.path("config.toml"), config).expect("writing containerd's config");
        // As a cluster's CNI configuration puts it: a bridge the pods' gateway, their
        // addresses from host-local, hairpin for a pod reaching itself through a Service.
        let cni = json!({
            "cniVersion": "1.0.0",
            "name": network,
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": self.path("ipam"),
                    "ranges": [[{"subnet": POD_SUBNET4}], [{"subnet": POD_SUBNET6}]],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                },
            }],
        });
        std::fs::write(self.path("cni/10-pods.conflist"), serde_json::to_string_pretty(&cni).expect("JSON"))
            .expect("writing the CNI configuration");
        let crictl = format!(
            "runtime-endpoint: unix://{s}\nimage-endpoint: unix://{s}\ntimeout: 20\n",
            s = self.socket().display()
        );
        std::fs::write(self.path("crictl.yaml"), crictl).expect("writing crictl's config");
    }

    /// Runs crictl against this node's containerd.
    pub fn crictl(&self, args: &[&str]) -> Output {
        Command::new("crictl")
            .arg("--config")
            .arg(self.path("crictl.yaml"))
            .args(args)
            .output()
            .expect("running crictl")
    }

    /// Like [`CriNode::crictl`]; panics unless it succeeds, returns stdout.
    #[track_caller]
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        let out = self.crictl(args);
        assert!(
            out.status.success(),
            "crictl {args:?}: {}{}\ncontainerd:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports an image archive (`podman save`, OCI or docker format) into the namespace the
    /// kubelet's pods use (`k8s.io`).
    #[track_caller]
    pub fn import_image(&self, archive: &Path) {
        self.ctr(&["-n", "k8s.io", "images", "import", "--all-platforms"], archive);
    }

    /// Deletes every pod sandbox of the node, the kubelet's too (`StopPodSandbox`,
    /// `RemovePodSandbox`): what a node's drain leaves, before containerd stops.
    pub fn delete_all_pods(&self) {
        let out = self.crictl(&["pods", "-q", "--no-trunc"]);
        for id in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()) {
            let ok = [["stopp", id], ["rmp", id]].iter().all(|a| self.crictl(a).status.success());
            if !ok {
                eprintln!("deleting sandbox {id}: failed");
            }
        }
        self.live.borrow_mut().clear();
    }

    #[track_caller]
    fn ctr(&self, args: &[&str], file: &Path) {
        run_ok(Command::new("ctr").arg("--address").arg(self.socket()).args(args).arg(file));
    }

    /// Makes a pod as the kubelet does (`RunPodSandbox`: the runtime starts the pause container
    /// and runs the CNI ADD) and returns it once ready, with its namespace, veth and addresses.
    #[track_caller]
    pub fn run_pod(&self, spec: &SandboxSpec) -> CriPod {
        let mut labels = spec.labels.clone();
        labels.insert("io.kubernetes.pod.name".into(), spec.name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), spec.namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), spec.uid.clone());
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let log_dir = self.path(&format!("logs/{}_{}_{}", spec.namespace, spec.name, spec.uid));
        // The kubelet's cgroupfs parent of a BestEffort pod, under a top of this node's own.
        let cgroup_parent = format!("/{}/kubepods/besteffort/pod{}", self.cgroup_top, spec.uid);
        let config = json!({
            "metadata": {"name": spec.name, "namespace": spec.namespace, "uid": spec.uid, "attempt": 0},
            "hostname": spec.name,
            "log_directory": log_dir,
            "labels": labels,
            "annotations": {"kubernetes.io/config.source": "api"},
            "linux": {
                "cgroup_parent": cgroup_parent,
                // Network and IPC of the pod, PID of each container: the kubelet's defaults.
                "security_context": {"namespace_options": {"network": 0, "pid": 1, "ipc": 0}},
            },
        });
        let file = self.path(&format!("pods/{}-{n}.json", spec.name));
        std::fs::write(&file, config.to_string()).expect("writing the pod's config");
        let file = file.display().to_string();
        let id = self.crictl_ok(&["runp", &file]).trim().to_string();
        let status: Value = serde_json::from_str(&self.crictl_ok(&["inspectp", "-o", "json", &id]))
            .expect("inspectp prints JSON");
        assert_eq!(status["status"]["state"], "SANDBOX_READY", "{status}");
        let netns_path = status["info"]["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .and_then(|nss| nss.iter().find(|ns| ns["type"] == "network"))
            .and_then(|ns| ns["path"].as_str())
            .unwrap_or_else(|| panic!("no network namespace in {status}"))
            .to_string();
        self.live.borrow_mut().push((id.clone(), netns_path.clone()));
        let ns =
            Netns::existing(Path::new(&netns_path).file_name().and_then(|f| f.to_str()).expect("a name"));
        let ip = |v: &Value| v["ip"].as_str().and_then(|s| s.parse::<std::net::IpAddr>().ok());
        let net = &status["status"]["network"];
        let ips: Vec<std::net::IpAddr> = std::iter::once(&net)
            .copied()
            .chain(net["additionalIps"].as_array().into_iter().flatten())
            .filter_map(ip)
            .collect();
        let v4 = ips.iter().find_map(|a| match a {
            std::net::IpAddr::V4(a) => Some(*a),
            _ => None,
        });
        let v6 = ips.iter().find_map(|a| match a {
            std::net::IpAddr::V6(a) => Some(*a),
            _ => None,
        });
        let (Some(v4), Some(v6)) = (v4, v6) else { panic!("not dual-stack: {net}") };
        let pause_pid = status["info"]["pid"].as_u64().expect("the pause process") as u32;
        let veth = self.host_veth(&ns);
        CriPod {
            id,
            spec: spec.clone(),
            pod: Pod::new(&spec.name, ns, &veth, v4, v6, GATEWAY4, GATEWAY6),
            pause_pid,
        }
    }

    /// The node and `pods`, each under a role, as a test's topology with a mirror sink of its
    /// own ([`crate::topology::testbed::Testbed::builder_on`]: the classifier loaded by the
    /// test, attached to the CNI's veths). The namespaces stay this node's: the topology
    /// deletes none.
    pub fn topology(&self, pods: &[(&str, &CriPod)]) -> Topology {
        let pods = pods
            .iter()
            .map(|(role, p)| {
                let Pod { ns, veth, v4, v6, gw4, gw6, .. } = &p.pod;
                Pod::new(role, Netns::existing(ns.name()), veth, *v4, *v6, *gw4, *gw6)
            })
            .collect();
        Topology::adopt(Netns::existing(self.node.name()), pods)
    }

    /// The node-side end of the veth whose other end is the pod's `eth0`.
    fn host_veth(&self, pod: &Netns) -> String {
        let eth0: Value = serde_json::from_str(&pod.sh("ip -j link show eth0")).expect("ip -j prints JSON");
        let peer = eth0[0]["link_index"].as_u64().unwrap_or_else(|| panic!("eth0 has no peer: {eth0}"));
        let links: Value = serde_json::from_str(&self.node.sh("ip -j link show")).expect("ip -j prints JSON");
        let link = links
            .as_array()
            .and_then(|l| l.iter().find(|l| l["ifindex"].as_u64() == Some(peer)))
            .unwrap_or_else(|| panic!("no link {peer} in the node: {links}"));
        assert_eq!(link["master"], BRIDGE, "{link}");
        link["ifname"].as_str().expect("a link name").to_string()
    }

    /// Deletes a pod as the kubelet does: `StopPodSandbox` (the CNI DEL: its veth goes) and
    /// `RemovePodSandbox`.
    #[track_caller]
    pub fn delete_pod(&self, pod: CriPod) {
        self.delete(&pod.id);
        assert!(!Path::new(&pod.pod.ns.path()).exists(), "{} outlived its sandbox", pod.pod.ns.path());
    }

    #[track_caller]
    fn delete(&self, id: &str) {
        self.crictl_ok(&["stopp", id]);
        self.crictl_ok(&["rmp", id]);
        self.live.borrow_mut().retain(|(live, _)| live != id);
    }

    /// The ids of the ready sandboxes, as `crictl pods` lists them.
    pub fn ready_sandboxes(&self) -> Vec<String> {
        let out = self.crictl_ok(&["pods", "-q", "--state", "ready", "--no-trunc"]);
        out.lines().map(str::to_string).collect()
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        let t = Instant::now();
        let live: Vec<(String, String)> = self.live.borrow().clone();
        for (id, netns) in &live {
            let ok = [["stopp", id], ["rmp", id]].iter().all(|a| self.crictl(a).status.success());
            if !ok || Path::new(netns).exists() {
                eprintln!("deleting sandbox {id}: failed\n{}", self.log());
            }
        }
        if let Some(mut proc) = self.containerd.take() {
            if proc.stop(libc::SIGTERM, Duration::from_secs(10)).is_none() {
                eprintln!("containerd ignored SIGTERM: killed");
            }
        }
        // runc leaves the pods' cgroups' parents: every hierarchy, deepest first.
        let root = Path::new("/sys/fs/cgroup");
        let mounts: Vec<PathBuf> = std::fs::read_dir(root)
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        for m in std::iter::once(root.to_path_buf()).chain(mounts) {
            let top = m.join(&self.cgroup_top);
            if top.is_dir() {
                let _ = Command::new("find")
                    .arg(&top)
                    .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", "+"])
                    .status();
                if top.exists() {
                    eprintln!("removing cgroup {}: not empty", top.display());
                }
            }
        }
        for d in &self.host_dirs {
            // Only when empty: another runtime may have put something there meanwhile.
            let _ = std::fs::remove_dir(d);
        }
        eprintln!("node removed in {:.1} s", t.elapsed().as_secs_f64());
    }
}
