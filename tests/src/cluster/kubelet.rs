//! Processes set up in a pod's namespace the way the kubelet and a container runtime set up a
//! container: in the pod's network namespace, in a cgroup named as the kubelet names them
//! (`kubepods-besteffort-pod<UID>.slice/cri-containerd-<ID>.scope` under a parent of the test's
//! own), with the environment it gives (`KUBERNETES_SERVICE_HOST`, `HOSTNAME`, the downward
//! API's `POD_NAME` / `POD_NAMESPACE`), and optionally a mount namespace of its own with the
//! files a container has (`/etc/hostname`, the service account's `namespace`).
//!
//! The cgroup lives in the cgroup2 hierarchy, under `me2e-<pid>-<n>`; the process is killed and
//! the cgroups removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{nsenter, Netns};

/// What a pod's container is given.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    /// `POD_NAME` (downward API), if set.
    pub env_name: Option<String>,
    /// `POD_NAMESPACE` (downward API), if set.
    pub env_namespace: Option<String>,
    /// `HOSTNAME` in the environment (the runtime sets it to the pod's name).
    pub hostname_env: Option<String>,
    /// A mount namespace of its own with this `/etc/hostname` and this service account
    /// namespace file (`/var/run/secrets/kubernetes.io/serviceaccount/namespace`).
    pub container_files: Option<(String, String)>,
    /// The pod's UID, in the cgroup path.
    pub uid: String,
}

/// A container's id: 64 hex digits.
pub fn container_id(n: u32) -> String {
    format!("{:064x}", 0xc0de_0000_u64 + u64::from(n))
}

/// A pod UID derived from `n`.
pub fn pod_uid(n: u32) -> String {
    format!("1b4e28ba-2fa1-11d2-883f-{:012x}", u64::from(n))
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host).
pub fn cgroup2_root() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mount = pre.split(' ').nth(4)?;
            (post.split(' ').next() == Some("cgroup2")).then(|| PathBuf::from(mount))
        })
        .expect("no cgroup2 hierarchy mounted")
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A container-like process in a pod's namespace.
pub struct PodProcess {
    proc: Proc,
    /// Cgroups created, innermost first.
    cgroups: Vec<PathBuf>,
    /// Its container id.
    pub container: String,
}

impl PodProcess {
    /// Starts `sleep` in `ns` as `spec` says and waits until it sits in its cgroup.
    pub fn start(ns: &Netns, spec: &PodSpec) -> PodProcess {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let container = container_id(std::process::id() * 100 + n);
        let top = cgroup2_root().join(format!("me2e-{}-{n}", std::process::id()));
        let pod = top.join(format!("kubepods-besteffort-pod{}.slice", spec.uid.replace('-', "_")));
        let leaf = pod.join(format!("cri-containerd-{container}.scope"));
        std::fs::create_dir_all(&leaf).unwrap_or_else(|e| panic!("creating {}: {e}", leaf.display()));

        let mut env = vec![("KUBERNETES_SERVICE_HOST".to_string(), "198.18.255.1".to_string())];
        env.extend(spec.env_name.clone().map(|v| ("POD_NAME".into(), v)));
        env.extend(spec.env_namespace.clone().map(|v| ("POD_NAMESPACE".into(), v)));
        env.extend(spec.hostname_env.clone().map(|v| ("HOSTNAME".into(), v)));
        // The process moves itself into its cgroup before it becomes the container.
        let mut script = format!("echo $$ > {}/cgroup.procs && ", leaf.display());
        let mut cmd = nsenter(&ns.path(), "env");
        cmd.arg("-i");
        for (k, v) in &env {
            cmd.arg(format!("{k}={v}"));
        }
        if let Some((hostname, namespace)) = &spec.container_files {
            // A private mount namespace: the mounts below stay the container's.
            script += &format!(
                "mount -t tmpfs tmpfs /var/run && mkdir -p /var/run/secrets/kubernetes.io/serviceaccount \
                 && echo {namespace} > /var/run/secrets/kubernetes.io/serviceaccount/namespace \
                 && echo {hostname} > /var/run/hostname && mount --bind /var/run/hostname /etc/hostname && "
            );
            cmd.args(["unshare", "--mount", "--propagation", "private"]);
        }
        script += "echo ready && exec sleep 600";
        cmd.args(["/bin/sh", "-c", &script]);
        let mut proc = Proc::spawn(&format!("pod process in {}", ns.name()), &mut cmd);
        proc.wait_for_output("ready", Duration::from_secs(5));
        // nsenter, env, unshare and the shell each exec the next: the child is the container.
        let procs = std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap_or_default();
        assert_eq!(procs.trim(), proc.pid().to_string(), "the pod process is not in {}", leaf.display());
        PodProcess { proc, cgroups: vec![leaf, pod, top], container }
    }

    /// Its pid (nsenter execs env, which execs the shell, which execs sleep: one process).
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        self.proc.stop(libc::SIGKILL, Duration::from_secs(2));
        for cg in &self.cgroups {
            // The kernel frees a cgroup once its last process has gone: retry a moment.
            let gone = wait_until(Duration::from_secs(2), || remove(cg));
            if !gone {
                eprintln!("removing cgroup {}", cg.display());
            }
        }
    }
}

fn remove(cg: &Path) -> bool {
    match std::fs::remove_dir(cg) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Creates a veth pair `veth` (in `node`) and `eth0` (in `pod`), with addresses, as a CNI
/// plugin does for a pod that appears while the agent runs.
pub fn plug(node: &Netns, pod: &Netns, veth: &str, subnet: u8) {
    let status = Command::new("ip")
        .args([
            "-n",
            node.name(),
            "link",
            "add",
            veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ])
        .status()
        .expect("running ip");
    assert!(status.success(), "creating {veth}");
    node.sh(&format!("ip addr add 198.18.{subnet}.1/24 dev {veth} && ip link set {veth} up"));
    pod.sh(&format!(
        "ip addr add 198.18.{subnet}.2/24 dev eth0 && ip link set eth0 up && ip route add default via 198.18.{subnet}.1"
    ));
}
