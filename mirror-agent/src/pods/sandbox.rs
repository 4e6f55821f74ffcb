//! Pod sandboxes as the container runtime describes them, and which one is behind a veth.
//!
//! A sandbox is matched to the network namespace of a veth's peer, best first:
//! - by the namespace itself: the inode of the sandbox's network namespace file (the path the
//!   runtime gives in its verbose `info`, `runtimeSpec.linux.namespaces`, else the pause
//!   process's `/proc/PID/ns/net`) is the inode of the peer's namespace;
//! - by address: the sandbox's IPs (`status.network`) are the peer's;
//! - by the pod's UID, which the cgroup path of a process in the namespace gave.
//!
//! Sandboxes on the node's network (`hostNetwork`) have no veth and are left out.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// What the runtime says about one ready pod sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// The sandbox's id (its pause container's).
    pub id: String,
    /// The pod's name.
    pub name: String,
    /// Its Kubernetes namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// Its labels, all of them.
    pub labels: BTreeMap<String, String>,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
    /// The pause process (the node's pid namespace), from the verbose info.
    pub pid: Option<u32>,
    /// Its network namespace's file, from the verbose info.
    pub netns_path: Option<PathBuf>,
    /// On the node's network namespace (`hostNetwork`).
    pub host_network: bool,
}

/// The pause process and the network namespace's path in a runtime's verbose `info`: a JSON
/// document under `info` (containerd and CRI-O alike), with `pid` and
/// `runtimeSpec.linux.namespaces[{type: network, path}]`; containerd also gives
/// `sandboxMetadata.NetNSPath`.
pub fn from_info(info: &HashMap<String, String>) -> (Option<u32>, Option<PathBuf>) {
    let docs = info.get("info").into_iter().chain(info.iter().filter(|(k, _)| *k != "info").map(|(_, v)| v));
    for doc in docs {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(doc) else { continue };
        let pid = v.get("pid").and_then(serde_json::Value::as_u64).and_then(|p| u32::try_from(p).ok());
        let spec_path = v
            .pointer("/runtimeSpec/linux/namespaces")
            .and_then(serde_json::Value::as_array)
            .and_then(|nss| {
                nss.iter().find(|ns| ns.get("type").and_then(serde_json::Value::as_str) == Some("network"))
            })
            .and_then(|ns| ns.get("path")?.as_str());
        let meta_path = v.pointer("/sandboxMetadata/NetNSPath").and_then(serde_json::Value::as_str);
        let path = spec_path.or(meta_path).filter(|p| !p.is_empty()).map(PathBuf::from);
        let pid = pid.filter(|p| *p > 0);
        if pid.is_some() || path.is_some() {
            return (pid, path);
        }
    }
    (None, None)
}

/// How a sandbox was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// Its network namespace is the peer's.
    Netns,
    /// Its address is the peer's.
    Address,
    /// Its UID is the one in the cgroup path of a process in the peer's namespace.
    Uid,
}

/// The sandboxes, indexed for [`Index::find`].
#[derive(Debug, Default)]
pub struct Index {
    sandboxes: Vec<Sandbox>,
    by_ino: HashMap<u64, usize>,
    by_ip: HashMap<IpAddr, usize>,
    by_uid: HashMap<String, usize>,
}

impl Index {
    /// Indexes `sandboxes`; `ino_of` gives the inode of a namespace file (the
    /// sandbox's path is looked at first, then its pause process's).
    pub fn new(sandboxes: Vec<Sandbox>, ino_of: impl Fn(&Path) -> Option<u64>) -> Index {
        let mut ix = Index::default();
        for (i, sb) in sandboxes.iter().enumerate() {
            if sb.host_network {
                continue;
            }
            let ino = sb
                .netns_path
                .as_deref()
                .and_then(&ino_of)
                .or_else(|| ino_of(&PathBuf::from(format!("/proc/{}/ns/net", sb.pid?))));
            if let Some(ino) = ino {
                ix.by_ino.insert(ino, i);
            }
            for ip in &sb.ips {
                ix.by_ip.insert(*ip, i);
            }
            if !sb.uid.is_empty() {
                ix.by_uid.insert(sb.uid.clone(), i);
            }
        }
        ix.sandboxes = sandboxes;
        ix
    }

    /// The sandbox of the namespace whose inode is `ino`, with addresses `addrs`, where a
    /// process's cgroup path gave the pod's UID `uid`.
    pub fn find(&self, ino: Option<u64>, addrs: &[IpAddr], uid: Option<&str>) -> Option<(&Sandbox, Match)> {
        let at = ino
            .and_then(|i| self.by_ino.get(&i))
            .map(|i| (*i, Match::Netns))
            .or_else(|| addrs.iter().find_map(|a| self.by_ip.get(a)).map(|i| (*i, Match::Address)))
            .or_else(|| uid.and_then(|u| self.by_uid.get(u)).map(|i| (*i, Match::Uid)))?;
        Some((&self.sandboxes[at.0], at.1))
    }

    /// How many sandboxes.
    pub fn len(&self) -> usize {
        self.sandboxes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty()
    }
}

/// The labels among `keys` that the sandbox carries.
pub fn pick_labels(sb: &Sandbox, keys: &[String]) -> BTreeMap<String, String> {
    keys.iter().filter_map(|k| Some((k.clone(), sb.labels.get(k)?.clone()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_info_of_containerd_and_crio() {
        let containerd = r#"{"pid":4242,"processStatus":"running","netNamespaceClosed":false,
            "runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}},
            "sandboxMetadata":{"NetNSPath":"/var/run/netns/cni-1"}}"#;
        let info = HashMap::from([("info".to_string(), containerd.to_string())]);
        assert_eq!(from_info(&info), (Some(4242), Some(PathBuf::from("/var/run/netns/cni-1"))));
        // CRI-O: the same keys; an older containerd: only the metadata's path.
        let crio = r#"{"pid":77,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/x"}]}}}"#;
        assert_eq!(
            from_info(&HashMap::from([("info".into(), crio.into())])),
            (Some(77), Some("/var/run/netns/x".into()))
        );
        let old = r#"{"sandboxMetadata":{"NetNSPath":"/run/netns/y"}}"#;
        assert_eq!(
            from_info(&HashMap::from([("info".into(), old.into())])),
            (None, Some("/run/netns/y".into()))
        );
        // Not JSON, or nothing useful: nothing.
        assert_eq!(from_info(&HashMap::from([("info".into(), "not json".into())])), (None, None));
        assert_eq!(from_info(&HashMap::from([("info".into(), r#"{"pid":0}"#.into())])), (None, None));
        assert_eq!(from_info(&HashMap::new()), (None, None));
    }

    fn sb(id: &str, ips: &[&str], pid: Option<u32>, uid: &str) -> Sandbox {
        Sandbox {
            id: id.into(),
            name: format!("pod-{id}"),
            namespace: "ns".into(),
            uid: uid.into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            pid,
            ..Sandbox::default()
        }
    }

    #[test]
    fn matched_by_namespace_then_address_then_uid() {
        let mut host = sb("h", &["198.18.0.1"], Some(1), "");
        host.host_network = true;
        let mut by_path = sb("a", &["198.18.1.2"], None, "u-a");
        by_path.netns_path = Some("/run/netns/a".into());
        let sandboxes =
            vec![by_path, sb("b", &["198.18.2.2"], Some(200), "u-b"), sb("c", &[], None, "u-c"), host];
        let ino_of = |p: &Path| match p.to_str()? {
            "/run/netns/a" => Some(10),
            "/proc/200/ns/net" => Some(20),
            "/proc/1/ns/net" => Some(1),
            _ => None,
        };
        let ix = Index::new(sandboxes, ino_of);
        let ip = |s: &str| vec![s.parse::<IpAddr>().unwrap()];
        let id = |m: Option<(&Sandbox, Match)>| m.map(|(s, how)| (s.id.clone(), how));
        assert_eq!(id(ix.find(Some(10), &[], None)), Some(("a".into(), Match::Netns)));
        assert_eq!(id(ix.find(Some(20), &ip("198.18.1.2"), None)), Some(("b".into(), Match::Netns)));
        assert_eq!(id(ix.find(Some(99), &ip("198.18.1.2"), None)), Some(("a".into(), Match::Address)));
        assert_eq!(id(ix.find(None, &[], Some("u-c"))), Some(("c".into(), Match::Uid)));
        // The node's own namespace and address are never a pod's.
        assert_eq!(id(ix.find(Some(1), &ip("198.18.0.1"), None)), None);
        assert_eq!(id(ix.find(Some(99), &ip("198.18.9.9"), Some("u-z"))), None);
    }

    #[test]
    fn only_the_configured_labels() {
        let mut s = sb("a", &[], None, "");
        s.labels = [("app", "web"), ("pod-template-hash", "5c8d"), ("team", "shop")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let keys = ["app".to_string(), "app.kubernetes.io/name".to_string(), "team".to_string()];
        assert_eq!(
            pick_labels(&s, &keys),
            BTreeMap::from([("app".into(), "web".into()), ("team".into(), "shop".into())])
        );
    }
}
