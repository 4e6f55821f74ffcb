//! The mirror sinks compared, created side by side in one network namespace, and the ways of
//! copying to them (variants).

use anyhow::{bail, Result};
use mirror_bpf::{MirrorDelivery, MirrorMethod};

/// A kind of sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// A veth pair, both ends up: the agent's `create: veth` (captures on the peer).
    Veth,
    /// A veth pair whose peer is down.
    VethPeerDown,
    /// An ifb device.
    Ifb,
    /// A dummy device (the agent's default `create: dummy`), where the kernel has them.
    Dummy,
}

impl SinkKind {
    pub const ALL: [SinkKind; 4] = [SinkKind::Veth, SinkKind::VethPeerDown, SinkKind::Ifb, SinkKind::Dummy];

    /// The sink's name (and, for a veth pair, its peer's).
    pub fn dev(self) -> &'static str {
        match self {
            SinkKind::Veth => "mpveth0",
            SinkKind::VethPeerDown => "mpdown0",
            SinkKind::Ifb => "mpifb0",
            SinkKind::Dummy => "mpdum0",
        }
    }

    pub fn peer(self) -> Option<&'static str> {
        match self {
            SinkKind::Veth => Some("mpveth0p"),
            SinkKind::VethPeerDown => Some("mpdown0p"),
            _ => None,
        }
    }

    /// Shell commands creating it (IPv6 off on it: nothing of its own on captures).
    fn create(self) -> String {
        let dev = self.dev();
        let quiet = |d: &str| format!("sysctl -qw net.ipv6.conf.{d}.disable_ipv6=1");
        match self {
            SinkKind::Veth | SinkKind::VethPeerDown => {
                let peer = self.peer().expect("a veth has a peer");
                let peer_up =
                    if self == SinkKind::Veth { format!(" && ip link set {peer} up") } else { String::new() };
                format!(
                    "ip link add {dev} mtu 65535 type veth peer name {peer} mtu 65535 && {} && {} \
                     && ip link set {dev} up{peer_up}",
                    quiet(dev),
                    quiet(peer)
                )
            }
            SinkKind::Ifb => {
                format!("ip link add {dev} mtu 65535 type ifb && {} && ip link set {dev} up", quiet(dev))
            }
            SinkKind::Dummy => {
                format!("ip link add {dev} mtu 65535 type dummy && {} && ip link set {dev} up", quiet(dev))
            }
        }
    }
}

/// Runs `cmd` with `sh -c` through `spawn` (which puts it in the right namespace); its stderr
/// on failure.
pub fn try_sh(mut cmd: std::process::Command) -> Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates every sink kind the kernel has, with `sh(cmd)`; returns the kinds created and, for
/// the others, why not.
pub fn create_all(sh: impl Fn(&str) -> Result<String>) -> (Vec<SinkKind>, Vec<(SinkKind, String)>) {
    let mut made = Vec::new();
    let mut missing = Vec::new();
    for kind in SinkKind::ALL {
        match sh(&kind.create()) {
            Ok(_) => made.push(kind),
            Err(e) => {
                // Half made (the link but not its settings): remove it.
                let _ = sh(&format!("ip link del {} 2>/dev/null", kind.dev()));
                missing.push((kind, e.to_string()));
            }
        }
    }
    (made, missing)
}

/// Where a variant copies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// No interface: marked packets are counted, not copied (the classifier's own cost).
    None,
    /// The sink.
    Sink(SinkKind),
    /// The peer of a veth sink.
    Peer(SinkKind),
}

/// One way of copying marked packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Short name, for the report's tables.
    pub key: &'static str,
    pub what: &'static str,
    pub target: Target,
    pub delivery: MirrorDelivery,
    pub method: MirrorMethod,
}

impl Variant {
    /// The interface copies are sent to, if any.
    pub fn dev(&self) -> Option<&'static str> {
        match self.target {
            Target::None => None,
            Target::Sink(k) => Some(k.dev()),
            Target::Peer(k) => k.peer(),
        }
    }

    pub fn sink(&self) -> Option<SinkKind> {
        match self.target {
            Target::None => None,
            Target::Sink(k) | Target::Peer(k) => Some(k),
        }
    }

    /// Where a capture reads the copies: the peer for copies sent out of a veth whose peer is
    /// up, else the interface they are delivered to.
    pub fn capture_dev(&self) -> Option<&'static str> {
        match (self.target, self.delivery) {
            (Target::Sink(SinkKind::Veth), MirrorDelivery::Egress) => SinkKind::Veth.peer(),
            _ => self.dev(),
        }
    }

    /// Whether this variant can be measured with BPF_PROG_TEST_RUN (act_mirred is a tc action,
    /// which test_run does not run).
    pub fn test_run(&self) -> bool {
        self.method == MirrorMethod::Clone
    }
}

const fn clone(key: &'static str, what: &'static str, target: Target, delivery: MirrorDelivery) -> Variant {
    Variant { key, what, target, delivery, method: MirrorMethod::Clone }
}

/// act_mirred copies to the sink's egress only: its ingress mirror keeps the packet's
/// addressing, so the node takes the copy for its own and routes it again.
const fn mirred(key: &'static str, what: &'static str, target: Target) -> Variant {
    Variant { key, what, target, delivery: MirrorDelivery::Egress, method: MirrorMethod::Mirred }
}

use MirrorDelivery::{Egress, Ingress};

/// Every variant, the baseline first.
pub const VARIANTS: [Variant; 10] = [
    clone("none", "no copy (flow marked, no mirror interface)", Target::None, Egress),
    clone(
        "veth-egress",
        "clone, egress of a veth (peer up; today's default)",
        Target::Sink(SinkKind::Veth),
        Egress,
    ),
    clone("veth-ingress", "clone, ingress of the veth sink itself", Target::Sink(SinkKind::Veth), Ingress),
    clone("peer-ingress", "clone, ingress of the veth sink's peer", Target::Peer(SinkKind::Veth), Ingress),
    clone(
        "down-egress",
        "clone, egress of a veth whose peer is down",
        Target::Sink(SinkKind::VethPeerDown),
        Egress,
    ),
    clone(
        "down-ingress",
        "clone, ingress of a veth whose peer is down",
        Target::Sink(SinkKind::VethPeerDown),
        Ingress,
    ),
    clone("ifb-egress", "clone, egress of an ifb", Target::Sink(SinkKind::Ifb), Egress),
    clone("ifb-ingress", "clone, ingress of an ifb", Target::Sink(SinkKind::Ifb), Ingress),
    clone("dummy-egress", "clone, egress of a dummy", Target::Sink(SinkKind::Dummy), Egress),
    mirred("mirred-veth", "act_mirred egress mirror, veth (peer up)", Target::Sink(SinkKind::Veth)),
];

/// The variants to measure: all, or those named in `MIRROR_BENCH_VARIANTS` (comma-separated
/// keys; the baseline is always in).
pub fn selected() -> Vec<Variant> {
    let only = std::env::var("MIRROR_BENCH_VARIANTS").unwrap_or_default();
    let keys: Vec<&str> = only.split(',').map(str::trim).filter(|k| !k.is_empty()).collect();
    VARIANTS.iter().copied().filter(|v| keys.is_empty() || v.key == "none" || keys.contains(&v.key)).collect()
}
