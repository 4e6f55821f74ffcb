//! Who a process in a pod's namespace is, from what the kubelet and the container runtime
//! leave in `/proc`, without asking the runtime:
//!
//! - the environment: `POD_NAME` / `POD_NAMESPACE` (the downward API's usual names, also
//!   `MY_POD_*` and `K8S_POD_*`), and `HOSTNAME`, which the runtime sets to the pod's name, in
//!   a process that the kubelet gave `KUBERNETES_SERVICE_HOST`;
//! - the container's own files, read through `/proc/PID/root` when it has a mount namespace
//!   of its own: `/etc/hostname` (the pod's name) and the service account's `namespace`;
//! - the cgroup path: the pod's UID (`kubepods-...-pod<UID>.slice`, `kubepods/.../pod<UID>/`)
//!   and the container's id (`cri-containerd-<ID>.scope`, `crio-<ID>.scope`, `docker-<ID>.scope`,
//!   or the bare id).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How a pod was named, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The container runtime's sandbox (CRI), matched to the namespace (see `sandbox`).
    Cri,
    /// `POD_NAME` in a process's environment.
    Env,
    /// The container's `/etc/hostname`.
    Hostname,
    /// `HOSTNAME` in the environment of a process the kubelet started.
    HostnameEnv,
    /// Only the pod's UID, from the cgroup path.
    Cgroup,
    /// The name of the namespace (`/run/netns/NAME`).
    Netns,
    /// Nothing found: the host-side interface's name.
    Interface,
}

impl Source {
    /// As the API shows it.
    pub fn name(self) -> &'static str {
        match self {
            Source::Cri => "cri",
            Source::Env => "env",
            Source::Hostname => "hostname",
            Source::HostnameEnv => "hostname-env",
            Source::Cgroup => "cgroup",
            Source::Netns => "netns",
            Source::Interface => "interface",
        }
    }
}

/// What one process says about its pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The pod's name.
    pub name: Option<String>,
    /// Its Kubernetes namespace.
    pub namespace: Option<String>,
    /// Its UID.
    pub uid: Option<String>,
    /// The container's id.
    pub container: Option<String>,
    /// Where the name came from (`None`: no name).
    pub source: Option<Source>,
}

/// The pod's UID and the container's id in a cgroup path (one line of `/proc/PID/cgroup`, or
/// the path alone).
pub fn from_cgroup(path: &str) -> (Option<String>, Option<String>) {
    let path = path.rsplit(':').next().unwrap_or(path);
    let mut uid = None;
    let mut container = None;
    for part in path.split('/') {
        let part = part.strip_suffix(".slice").unwrap_or(part);
        if let Some(pos) = part.rfind("pod") {
            // systemd escapes the UID's dashes as underscores.
            let cand = part[pos + 3..].replace('_', "-");
            if is_uid(&cand) {
                uid = Some(cand);
            }
        }
        let bare = part.strip_suffix(".scope").unwrap_or(part);
        let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
            .iter()
            .find_map(|p| bare.strip_prefix(p))
            .unwrap_or(bare);
        if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            container = Some(id.to_string());
        }
    }
    (uid, container)
}

fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The environment of a process (`/proc/PID/environ`: NUL-separated `KEY=VALUE`).
pub fn parse_environ(raw: &[u8]) -> HashMap<String, String> {
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

fn first<'a>(env: &'a HashMap<String, String>, keys: &[&str]) -> Option<&'a String> {
    keys.iter().find_map(|k| env.get(*k).filter(|v| !v.is_empty()))
}

/// `rel` inside the root directory `root` (`/proc/PID/root`), with symbolic links resolved
/// inside that root: the kernel would resolve an absolute link (`/var/run -> /run`) in ours.
fn in_root(root: &Path, rel: &str) -> Option<PathBuf> {
    let mut todo: Vec<String> = rel.split('/').filter(|c| !c.is_empty()).rev().map(String::from).collect();
    let mut at: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => {}
        }
        at.push(c);
        let path = at.iter().fold(root.to_path_buf(), |p, c| p.join(c));
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > 16 {
                return None;
            }
            let target = std::fs::read_link(&path).ok()?;
            at.pop();
            let target = target.to_str()?;
            if target.starts_with('/') {
                at.clear();
            }
            todo.extend(target.split('/').filter(|c| !c.is_empty()).rev().map(String::from));
        }
    }
    Some(at.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// Whether the /etc/hostname a process under `root` sees is the very file we see: a mount
/// namespace of its own over the node's files (`ip netns exec`, `unshare -m`) is no container.
fn node_hostname(root: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let theirs = in_root(root, "etc/hostname").and_then(|p| id(&p));
    theirs.is_some() && theirs == id(Path::new("/etc/hostname"))
}

fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty() && s.len() <= 253).then(|| s.to_string())
}

/// What process `pid` says about its pod; `own_mnt`: the inode of our mount namespace (a
/// process that shares it has the host's `/etc/hostname`, not a container's).
pub fn of_process(pid: u32, own_mnt: Option<u64>) -> Identity {
    use std::os::unix::fs::MetadataExt;
    let proc = Path::new("/proc").join(pid.to_string());
    let env = std::fs::read(proc.join("environ")).map(|r| parse_environ(&r)).unwrap_or_default();
    let cgroup = std::fs::read_to_string(proc.join("cgroup")).unwrap_or_default();
    let (uid, container) = cgroup.lines().map(from_cgroup).find(|(u, _)| u.is_some()).unwrap_or((None, None));
    let mnt = std::fs::metadata(proc.join("ns/mnt")).ok().map(|m| m.ino());
    let own_root = mnt.is_none() || mnt == own_mnt;
    let root = proc.join("root");
    let in_container = |rel: &str| if own_root { None } else { read_trimmed(&in_root(&root, rel)?) };

    let kubelet = env.contains_key("KUBERNETES_SERVICE_HOST");
    let (name, source) = if let Some(n) = first(&env, &["POD_NAME", "MY_POD_NAME", "K8S_POD_NAME"]) {
        (Some(n.clone()), Some(Source::Env))
    } else if let Some(h) = in_container("etc/hostname").filter(|_| !node_hostname(&root)) {
        (Some(h), Some(Source::Hostname))
    } else if let Some(h) = env.get("HOSTNAME").filter(|h| kubelet && !h.is_empty()) {
        (Some(h.clone()), Some(Source::HostnameEnv))
    } else if let Some(u) = &uid {
        (Some(format!("pod-{u}")), Some(Source::Cgroup))
    } else {
        (None, None)
    };
    let namespace = first(&env, &["POD_NAMESPACE", "MY_POD_NAMESPACE", "K8S_POD_NAMESPACE"])
        .cloned()
        .or_else(|| in_container("var/run/secrets/kubernetes.io/serviceaccount/namespace"));
    Identity { name, namespace, uid, container, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_of_the_kubelet_drivers() {
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice/cri-containerd-4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f.scope";
        assert_eq!(
            from_cgroup(systemd),
            (
                Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427".into()),
                Some("4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f".into())
            )
        );
        let cgroupfs = "0::/kubepods/besteffort/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427/4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f4c2f0e9a3b7d8e1f";
        assert_eq!(from_cgroup(cgroupfs).0.as_deref(), Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
        assert!(from_cgroup(cgroupfs).1.is_some());
        assert_eq!(from_cgroup("0::/user.slice/user-0.slice/session-1.scope"), (None, None));
        // "pod" followed by something that is not a UID.
        assert_eq!(from_cgroup("0::/system.slice/podman.service"), (None, None));
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let root = tempfile::tempdir().expect("a temp dir");
        let r = root.path();
        std::fs::create_dir_all(r.join("run/secrets")).unwrap();
        std::fs::write(r.join("run/secrets/namespace"), "shop\n").unwrap();
        std::os::unix::fs::symlink("/run", r.join("varrun")).unwrap();
        std::os::unix::fs::symlink("../run/secrets", r.join("run/up")).unwrap();
        assert_eq!(in_root(r, "varrun/secrets/namespace"), Some(r.join("run/secrets/namespace")));
        assert_eq!(read_trimmed(&in_root(r, "/run/up/namespace").unwrap()).as_deref(), Some("shop"));
        // A link that climbs above the root stays in it.
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::write(r.join("etc/hostname"), "web-0").unwrap();
        std::os::unix::fs::symlink("../../../../etc", r.join("escape")).unwrap();
        assert_eq!(in_root(r, "escape/hostname"), Some(r.join("etc/hostname")));
    }

    #[test]
    fn environ_is_split_on_nul() {
        let env = parse_environ(b"PATH=/bin\0POD_NAME=web-0\0EMPTY=\0");
        assert_eq!(env.get("POD_NAME").map(String::as_str), Some("web-0"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(first(&env, &["EMPTY", "POD_NAME"]).map(String::as_str), Some("web-0"));
    }

    #[test]
    fn a_mount_namespace_over_our_root_is_not_a_pod() {
        // unshare -m needs root.
        if !mirror_bpf::testing::require_root() {
            return;
        }
        use std::os::unix::fs::MetadataExt;
        // What `ip netns exec` starts: a mount namespace of its own, the node's root.
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "30"])
            .spawn()
            .expect("unshare");
        let own_mnt = std::fs::metadata("/proc/self/ns/mnt").ok().map(|m| m.ino());
        let mnt = |pid: u32| std::fs::metadata(format!("/proc/{pid}/ns/mnt")).ok().map(|m| m.ino());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // unshare execs sleep once its namespace is made.
        while mnt(child.id()) == own_mnt && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_ne!(mnt(child.id()), own_mnt, "unshare made no mount namespace");
        let id = of_process(child.id(), own_mnt);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!((id.name, id.source), (None, None), "the node's hostname taken for a pod's");
    }
}
