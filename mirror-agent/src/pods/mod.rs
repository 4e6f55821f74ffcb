//! Pod identity: which pod each attached host-side veth leads to. The veth's peer index and
//! namespace id lead to the pod's network namespace ([`netns`]), its processes to a name,
//! Kubernetes namespace, UID and container ([`identity`]); the peer's addresses map flow
//! endpoints to pods. Without a process that says more, the pod is named after its named
//! namespace, else after the interface.
//!
//! When the container runtime's CRI socket answers ([`cri`]), its ready pod sandboxes name the
//! pods instead, with their labels: each is matched to the peer's namespace ([`sandbox`]). A
//! pod the runtime does not list (or a runtime that does not answer in time) keeps the name
//! `/proc` gives.
//!
//! One task writes the table and owns the CRI client. It follows the attached interfaces on a
//! watch channel (the engine publishes them; the task ends when the channel closes) and
//! resolves again when told that links changed (after each link event, attach and detach
//! among them), and while a pod is known by a fallback name only (a container starts after its
//! veth), has no address yet, or is not (yet) among the runtime's sandboxes: 250 ms after a
//! change, the wait doubling up to every 5 s. Readers take a copy.

pub mod cri;
pub mod cri_api;
pub mod identity;
pub mod netns;
pub mod sandbox;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::config::Pods as PodsCfg;
use crate::views::{FlowPod, FlowView, InterfaceView, PodDropView, PodView};
use identity::Source;
use netns::{Namespace, Rtnl};
use sandbox::{Index, Sandbox};

/// Link events come in bursts: resolve once after the burst.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How soon pods known by a fallback name only, or without an address, are looked at again
/// after a change: a runtime lists a new pod's sandbox a moment after its veth appears, and until
/// the pod is named the rules that select it by name do not apply to it. The wait doubles from
/// there while nothing changes.
const RECHECK_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between looks at pods still known by a fallback name only.
const RECHECK: Duration = Duration::from_secs(5);
/// Processes looked at per namespace.
const PIDS_PER_NETNS: usize = 256;

#[derive(Default)]
struct Table {
    by_ifindex: BTreeMap<u32, PodView>,
    by_addr: HashMap<IpAddr, u32>,
}

/// The pods behind the attached veths; cheap to clone.
#[derive(Clone)]
pub struct Pods {
    table: Arc<RwLock<Table>>,
    wake: Arc<Notify>,
    cfg: Arc<PodsCfg>,
}

impl Pods {
    /// A table that [`Pods::start`] keeps, as `cfg` says.
    pub fn new(cfg: PodsCfg) -> Pods {
        Pods { table: Arc::default(), wake: Arc::default(), cfg: Arc::new(cfg) }
    }

    /// The pod labels shown (`pods.labels`).
    pub fn label_keys(&self) -> &[String] {
        &self.cfg.labels
    }

    /// Starts the task that keeps the table for the interfaces `attached` lists, until that
    /// channel closes.
    pub fn start(&self, attached: watch::Receiver<Vec<InterfaceView>>) {
        let pods = self.clone();
        let mut cri = cri::Cri::new(self.cfg.cri.paths(), self.cfg.cri_timeout);
        tokio::spawn(async move {
            let mut wait = RECHECK_FIRST;
            loop {
                // Also while a pod has no address yet: addresses are set after the veth's last
                // link event (a CNI plugin configures the pod's side after plugging it). And
                // while a pod in a namespace of its own is not among the runtime's sandboxes:
                // a runtime lists a sandbox once its network is set up, after the veth.
                let fallback = pods.list().iter().any(|p| {
                    [Source::Interface.name(), Source::Netns.name()].contains(&p.source.as_str())
                        || p.addresses.is_empty()
                        || (cri.connected() && p.netns.is_some() && p.source != Source::Cri.name())
                });
                if fallback {
                    let woken = tokio::time::timeout(wait, pods.wake.notified()).await.is_ok();
                    wait = if woken { RECHECK_FIRST } else { (wait * 2).min(RECHECK) };
                } else {
                    pods.wake.notified().await;
                    wait = RECHECK_FIRST;
                }
                tokio::time::sleep(DEBOUNCE).await;
                // The engine has stopped: so do we.
                if attached.has_changed().is_err() {
                    return;
                }
                let links: Vec<(u32, String)> =
                    attached.borrow().iter().map(|i| (i.ifindex, i.name.clone())).collect();
                let sandboxes = cri.sandboxes().await;
                let keys = pods.cfg.labels.clone();
                match tokio::task::spawn_blocking(move || resolve(&links, sandboxes, &keys)).await {
                    Ok(Ok(found)) => pods.set(found),
                    Ok(Err(e)) => tracing::warn!(error = %e, "resolving pods"),
                    Err(e) => tracing::warn!(error = %e, "resolving pods"),
                }
            }
        });
    }

    /// Links changed: resolve again soon.
    pub fn refresh(&self) {
        self.wake.notify_one();
    }

    fn set(&self, found: Vec<PodView>) {
        let mut t = Table::default();
        for p in found {
            for a in &p.addresses {
                if let Ok(ip) = a.parse() {
                    t.by_addr.insert(ip, p.ifindex);
                }
            }
            t.by_ifindex.insert(p.ifindex, p);
        }
        let changed = {
            let old = self.table.read().expect("pods lock");
            old.by_ifindex != t.by_ifindex
        };
        if changed {
            for p in t.by_ifindex.values() {
                tracing::debug!(
                    interface = %p.interface,
                    pod = %p.label(),
                    source = %p.source,
                    addresses = ?p.addresses,
                    "pod"
                );
            }
        }
        *self.table.write().expect("pods lock") = t;
    }

    /// Every pod, by interface index.
    pub fn list(&self) -> Vec<PodView> {
        self.table.read().expect("pods lock").by_ifindex.values().cloned().collect()
    }

    /// The pod behind interface `ifindex`.
    pub fn by_ifindex(&self, ifindex: u32) -> Option<PodView> {
        self.table.read().expect("pods lock").by_ifindex.get(&ifindex).cloned()
    }

    /// The pod whose address `ip` is.
    pub fn by_addr(&self, ip: IpAddr) -> Option<PodView> {
        let t = self.table.read().expect("pods lock");
        t.by_addr.get(&ip).and_then(|i| t.by_ifindex.get(i)).cloned()
    }

    /// Names the pod of each count of drops by pod: (the pod's veth ifindex, 0 for none;
    /// reason; packets). An interface with no pod known is named as no pod.
    pub fn name_drops(&self, counts: &[(u32, String, u64)]) -> Vec<PodDropView> {
        let t = self.table.read().expect("pods lock");
        counts
            .iter()
            .map(|(i, reason, n)| {
                let pod = t.by_ifindex.get(i);
                PodDropView {
                    pod: pod.map(PodView::label).unwrap_or_default(),
                    interface: pod.map(|p| p.interface.clone()).unwrap_or_default(),
                    reason: reason.clone(),
                    packets: *n,
                }
            })
            .collect()
    }

    /// Names the pods among each flow's endpoints (both tuples of a translated connection).
    pub fn annotate(&self, flows: &mut [FlowView]) {
        for f in flows {
            let nat = f.nat.iter().flat_map(|n| [&n.lo, &n.hi]);
            for ep in [&f.lo, &f.hi].into_iter().chain(nat) {
                if f.pods.iter().any(|p| &p.endpoint == ep) {
                    continue;
                }
                let Ok(sa) = ep.parse::<SocketAddr>() else { continue };
                if let Some(p) = self.by_addr(sa.ip()) {
                    f.pods.push(FlowPod {
                        endpoint: ep.clone(),
                        pod: p.label(),
                        interface: p.interface,
                        labels: p.labels,
                    });
                }
            }
        }
    }
}

/// Finds the pod behind each attached interface `(ifindex, name)`: from the runtime's
/// `sandboxes` when given (showing their labels among `keys`), else from `/proc`.
pub fn resolve(
    attached: &[(u32, String)],
    sandboxes: Option<Vec<Sandbox>>,
    keys: &[String],
) -> std::io::Result<Vec<PodView>> {
    use std::os::unix::fs::MetadataExt;
    let index = sandboxes.map(|s| Index::new(s, |p| std::fs::metadata(p).ok().map(|m| m.ino())));
    let mut rtnl = Rtnl::open()?;
    let peers = netns::peers(&mut rtnl)?;
    let own_mnt = std::fs::metadata("/proc/self/ns/mnt").ok().map(|m| m.ino());
    // The node's namespaces by the id ours gives them; read once, only when a veth needs it.
    let mut by_nsid: Option<HashMap<i32, Namespace>> = None;
    let mut out = Vec::new();
    for (ifindex, name) in attached {
        let mut pod = PodView {
            interface: name.clone(),
            ifindex: *ifindex,
            name: name.clone(),
            namespace: None,
            uid: None,
            container: None,
            sandbox: None,
            labels: BTreeMap::new(),
            pid: None,
            netns: None,
            peer: None,
            addresses: Vec::new(),
            source: Source::Interface.name().into(),
        };
        let peer = peers.get(ifindex).copied();
        if let Some(nsid) = peer.and_then(|p| p.nsid) {
            let spaces = match &mut by_nsid {
                Some(s) => s,
                None => by_nsid.insert(namespaces_by_nsid(&mut rtnl)?),
            };
            if let Some(ns) = spaces.get(&nsid) {
                describe(&mut pod, ns, peer.expect("has a peer").ifindex, own_mnt);
                if let Some(ix) = &index {
                    from_sandbox(&mut pod, ix, Some(ns.ino), keys);
                }
            }
        }
        out.push(pod);
    }
    Ok(out)
}

fn namespaces_by_nsid(rtnl: &mut Rtnl) -> std::io::Result<HashMap<i32, Namespace>> {
    let own = netns::own_ino()?;
    let mut out = HashMap::new();
    for ns in netns::namespaces(own) {
        let Ok(file) = std::fs::File::open(&ns.path) else { continue };
        if let Ok(Some(id)) = rtnl.nsid_of(&file) {
            out.insert(id, ns);
        }
    }
    Ok(out)
}

/// Fills in what the namespace of the veth's peer (`peer`, its index there) tells.
fn describe(pod: &mut PodView, ns: &Namespace, peer: u32, own_mnt: Option<u64>) {
    pod.netns = Some(ns.name.clone().unwrap_or_else(|| ns.path.display().to_string()));
    match netns::link_in(&ns.path, peer) {
        Ok((name, addrs)) => {
            pod.peer = Some(name);
            pod.addresses = addrs.iter().map(IpAddr::to_string).collect();
        }
        Err(e) => tracing::debug!(interface = %pod.interface, error = %e, "reading the pod side of the veth"),
    }
    let best = ns
        .pids
        .iter()
        .take(PIDS_PER_NETNS)
        .map(|pid| (*pid, identity::of_process(*pid, own_mnt)))
        .filter(|(_, id)| id.source.is_some())
        .min_by_key(|(_, id)| (id.source, id.namespace.is_none()));
    pod.pid = best.as_ref().map(|(pid, _)| *pid).or_else(|| ns.pids.first().copied());
    match best {
        Some((_, id)) => {
            pod.name = id.name.unwrap_or_else(|| pod.interface.clone());
            pod.namespace = id.namespace;
            pod.uid = id.uid;
            pod.container = id.container;
            pod.source = id.source.map_or(Source::Interface, |s| s).name().into();
        }
        None => {
            if let Some(n) = &ns.name {
                pod.name = n.clone();
                pod.source = Source::Netns.name().into();
            }
        }
    }
}

/// Names the pod after its sandbox, if the runtime lists one for it: the namespace whose inode
/// is `ino`, else the pod's addresses, else the UID its cgroup path gave.
fn from_sandbox(pod: &mut PodView, ix: &Index, ino: Option<u64>, keys: &[String]) {
    let addrs: Vec<IpAddr> = pod.addresses.iter().filter_map(|a| a.parse().ok()).collect();
    let Some((sb, how)) = ix.find(ino, &addrs, pod.uid.as_deref()) else { return };
    tracing::debug!(interface = %pod.interface, sandbox = %sb.id, matched = ?how, "pod sandbox");
    pod.name = sb.name.clone();
    pod.namespace = Some(sb.namespace.clone()).filter(|n| !n.is_empty());
    pod.uid = Some(sb.uid.clone()).filter(|u| !u.is_empty()).or(pod.uid.take());
    pod.sandbox = Some(sb.id.clone());
    pod.labels = sandbox::pick_labels(sb, keys);
    pod.source = Source::Cri.name().into();
}
