//! Network namespaces and the topology of a test: a "node" namespace that routes between "pod"
//! namespaces, each joined to it by a veth pair (pod side `eth0`, node side `veth<role>`), and
//! a mirror sink veth pair in the node (`mir0` -> `mir1`).
//!
//! Namespace names are unique per process and test (tests run in parallel); interface names
//! only need to be unique inside their namespace. Every namespace is deleted on drop.

use std::fs::File;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use mirror_bpf::testing::sh;

/// The interface the classifier mirrors to, in the node namespace.
pub const MIRROR_DEV: &str = "mir0";
/// Its peer, where the mirror is captured.
pub const MIRROR_SINK: &str = "mir1";

/// A named network namespace, deleted on drop unless another owns it ([`Netns::existing`]).
pub struct Netns {
    name: String,
    owned: bool,
}

static NEXT_NS: AtomicU32 = AtomicU32::new(0);
static REAP: Once = Once::new();

/// Deletes the namespaces and bpffs pins that test processes no longer alive left behind (a run
/// killed before its drops ran): their names carry the pid of the process that made them.
fn reap_stale() {
    let dead = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists())
    };
    let entries = |dir: &str| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    };
    for name in entries("/run/netns").into_iter().filter(|n| dead(n, "me2e-")) {
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
    }
    for name in entries(crate::agent::PIN_ROOT).into_iter().filter(|n| dead(n, crate::agent::PIN_PREFIX)) {
        let _ = std::fs::remove_dir_all(Path::new(crate::agent::PIN_ROOT).join(name));
    }
}

impl Netns {
    /// Creates a namespace named after the process, a counter and `role`, with loopback up and
    /// without IPv6 duplicate address detection (addresses are usable at once).
    pub fn new(role: &str) -> Netns {
        REAP.call_once(reap_stale);
        let name = format!("me2e-{}-{}-{role}", std::process::id(), NEXT_NS.fetch_add(1, Ordering::Relaxed));
        sh(&format!("ip netns add {name}"));
        let ns = Netns { name, owned: true };
        ns.sh("ip link set lo up && sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0");
        ns
    }

    /// A namespace of `/run/netns` that something else made and deletes (a container
    /// runtime's pod sandbox): used as any other, left alone on drop.
    #[track_caller]
    pub fn existing(name: &str) -> Netns {
        let ns = Netns { name: name.to_string(), owned: false };
        assert!(Path::new(&ns.path()).exists(), "no network namespace {}", ns.path());
        ns
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Its bind mount, what `setns` and `nsenter --net` take.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs a shell command inside the namespace; panics with its output when it fails.
    #[track_caller]
    pub fn sh(&self, cmd: &str) -> String {
        sh(&format!("ip netns exec {} sh -c '{}'", self.name, cmd.replace('\'', r"'\''")))
    }

    /// Moves the calling thread into the namespace until the guard is dropped. Netlink and
    /// attach calls act in the calling thread's namespace.
    pub fn enter(&self) -> Entered {
        let open = |path: &str| File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        let previous = open("/proc/thread-self/ns/net");
        setns(&open(&self.path()));
        Entered { previous, _thread_bound: PhantomData }
    }
}

/// A command that runs `program` in the network namespace at `path` only. Unlike `ip netns
/// exec`, it keeps the mount namespace: /sys/fs/bpf is the host's, so pins outlive the process.
pub fn nsenter(path: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={path}")).arg("--").arg(program);
    c
}

/// Moves the calling thread into the namespace at `path` for the rest of its life (a thread
/// spawned to run there).
pub fn join(path: &str) {
    setns(&File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}")));
}

fn setns(ns: &File) {
    // SAFETY: setns on a namespace file we hold open; it only changes this thread's namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let out = Command::new("ip").args(["netns", "del", &self.name]).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("deleting netns {}: {out:?}", self.name);
        }
    }
}

/// The calling thread is inside a namespace; dropping this goes back where it was.
pub struct Entered {
    previous: File,
    // A namespace belongs to a thread: the guard must be dropped on the thread that entered.
    _thread_bound: PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        setns(&self.previous);
    }
}

/// A pod: its namespace, addresses and the node-side end of its veth.
pub struct Pod {
    /// Its namespace.
    pub ns: Netns,
    /// The node-side veth.
    pub veth: String,
    /// Address of its `eth0`.
    pub v4: Ipv4Addr,
    /// IPv6 address of its `eth0`.
    pub v6: Ipv6Addr,
    /// The node's address on the link.
    pub gw4: Ipv4Addr,
    /// The node's IPv6 address on the link.
    pub gw6: Ipv6Addr,
    role: String,
}

impl Pod {
    /// A pod whose namespace and link something else set up (a CNI plugin): `veth` in the
    /// node, `eth0` with these addresses in `ns`, the node's addresses on the link.
    pub fn new(
        role: &str,
        ns: Netns,
        veth: &str,
        v4: Ipv4Addr,
        v6: Ipv6Addr,
        gw4: Ipv4Addr,
        gw6: Ipv6Addr,
    ) -> Pod {
        Pod { ns, veth: veth.to_string(), v4, v6, gw4, gw6, role: role.to_string() }
    }

    /// Its role.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Its address in the family asked for.
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.v6)
        } else {
            IpAddr::V4(self.v4)
        }
    }

    /// The node's address on this pod's link (its default gateway).
    pub fn gateway(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.gw6)
        } else {
            IpAddr::V4(self.gw4)
        }
    }
}

/// A node namespace with pods and a mirror sink.
pub struct Topology {
    /// The pods, in the order given.
    pub pods: Vec<Pod>,
    /// The node namespace (routes between pods, holds the mirror sink).
    pub node: Netns,
}

impl Topology {
    /// Builds the node, one pod per role (at most 11 characters: `veth<role>` is a link name)
    /// and the mirror sink. Pod `i` (from 1) has 198.18.i.2/24 and 2001:2:0:i::2/64; the node
    /// is `.1`/`::1`.
    pub fn new(roles: &[&str]) -> Topology {
        let topo = Topology::without_sink(roles);
        topo.add_sink();
        topo
    }

    /// A node and pods that something else set up (a container runtime and its CNI plugin),
    /// with a mirror sink added to the node.
    pub fn adopt(node: Netns, pods: Vec<Pod>) -> Topology {
        let topo = Topology { pods, node };
        topo.add_sink();
        topo
    }

    fn add_sink(&self) {
        // The sink carries nothing of its own: no IPv6, so no neighbour discovery on it.
        self.node.sh(&format!(
            "ip link add {MIRROR_DEV} type veth peer name {MIRROR_SINK} \
             && sysctl -qw net.ipv6.conf.{MIRROR_DEV}.disable_ipv6=1 net.ipv6.conf.{MIRROR_SINK}.disable_ipv6=1 \
             && ip link set {MIRROR_DEV} up && ip link set {MIRROR_SINK} up"
        ));
    }

    /// Like [`Topology::new`] without the mirror sink (for an agent that makes its own).
    pub fn without_sink(roles: &[&str]) -> Topology {
        let node = Netns::new("node");
        node.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1");
        let mut pods = Vec::new();
        for (i, role) in roles.iter().enumerate() {
            assert!(role.len() <= 11, "role {role} is too long for a link name");
            let i = i as u8 + 1;
            let pod = Pod {
                ns: Netns::new(role),
                veth: format!("veth{role}"),
                v4: Ipv4Addr::new(198, 18, i, 2),
                v6: Ipv6Addr::new(0x2001, 2, 0, u16::from(i), 0, 0, 0, 2),
                gw4: Ipv4Addr::new(198, 18, i, 1),
                gw6: Ipv6Addr::new(0x2001, 2, 0, u16::from(i), 0, 0, 0, 1),
                role: role.to_string(),
            };
            let Pod { veth, v4, v6, gw4, gw6, .. } = &pod;
            node.sh(&format!(
                "ip link add {veth} type veth peer name eth0 netns {} \
                 && ip addr add {gw4}/24 dev {veth} && ip addr add {gw6}/64 dev {veth} nodad \
                 && ip link set {veth} up",
                pod.ns.name()
            ));
            pod.ns.sh(&format!(
                "ip addr add {v4}/24 dev eth0 && ip addr add {v6}/64 dev eth0 nodad && ip link set eth0 up \
                 && ip route add default via {gw4} && ip -6 route add default via {gw6}"
            ));
            pods.push(pod);
        }
        Topology { pods, node }
    }

    /// The pod with that role.
    #[track_caller]
    pub fn pod(&self, role: &str) -> &Pod {
        self.pods.iter().find(|p| p.role == role).unwrap_or_else(|| panic!("no pod {role}"))
    }
}
