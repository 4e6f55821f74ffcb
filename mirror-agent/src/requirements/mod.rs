//! What the agent needs of a node, checked at start before anything is loaded: the kernel
//! (6.2 or later; TCX from 6.6, else tc filters), its BTF, the BPF JIT, the capabilities, a
//! BPF filesystem at `bpf.pin_path`, and that mount's propagation when the agent runs in a
//! container. Each finding says what is missing and what to do: a missing hard requirement
//! stops the start with all of them at once ([`check`]), a soft one is a warning, an expected
//! fallback is said at debug. `mirror-agent --check` prints them all ([`report`]).
//! docs/deployment.md lists every message (a test keeps them in step).

mod facts;
pub mod parse;

use crate::config::{AttachModeCfg, Config};

pub use facts::Facts;
use parse::{kernel_version, mount_of, mounts, Propagation};

/// The oldest kernel the classifier loads on: it calls [`KFUNC`] (6.2), `bpf_loop` (5.17)
/// and BPF timers (5.15).
pub const MIN_KERNEL: (u32, u32) = (6, 2);
/// The kfunc that sets the minimum, looked up in the kernel's BTF on an older-looking kernel.
pub const KFUNC: &str = "bpf_cast_to_kern_ctx";
/// TCX links; before, the classifier is attached as tc filters on a clsact qdisc.
pub const TCX_KERNEL: (u32, u32) = (6, 6);
/// Where the agent mounts a bpffs of its own when none is there ([`crate::bpffs::ensure`]).
const BPFFS: &str = "/sys/fs/bpf";

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Met.
    Ok,
    /// Met another way, as expected (a fallback): said at debug.
    Note,
    /// Soft: the agent runs, with less; a warning.
    Warning,
    /// Hard: the agent cannot run; the start stops before loading anything.
    Missing,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Note => "note",
            Level::Warning => "warning",
            Level::Missing => "MISSING",
        }
    }
}

/// One requirement as found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The requirement: `kernel`, `TCX`, `BTF`, `BPF JIT`, `capabilities`, `BPF filesystem`,
    /// `mount propagation`.
    pub requirement: &'static str,
    /// How much it matters.
    pub level: Level,
    /// What was found; when not met, what is missing and what to do.
    pub message: String,
}

fn finding(requirement: &'static str, level: Level, message: impl Into<String>) -> Finding {
    Finding { requirement, level, message: message.into() }
}

/// Checks this node for `cfg`: logs the soft findings, and fails, naming every hard one
/// missing, before anything is loaded.
pub fn check(cfg: &Config) -> anyhow::Result<Vec<Finding>> {
    let findings = evaluate(&Facts::read(cfg));
    for f in &findings {
        match f.level {
            Level::Ok => tracing::debug!(requirement = f.requirement, "{}", f.message),
            Level::Note => tracing::debug!(requirement = f.requirement, "expected: {}", f.message),
            Level::Warning => tracing::warn!(requirement = f.requirement, "{}", f.message),
            Level::Missing => {}
        }
    }
    verdict(&findings)?;
    Ok(findings)
}

/// The error that stops the start: every hard requirement missing, at once.
fn verdict(findings: &[Finding]) -> anyhow::Result<()> {
    let missing: Vec<&str> =
        findings.iter().filter(|f| f.level == Level::Missing).map(|f| f.message.as_str()).collect();
    if !missing.is_empty() {
        anyhow::bail!("node requirements not met: {}", missing.join("; "));
    }
    Ok(())
}

/// The findings as `--check` prints them, one a line.
pub fn report(findings: &[Finding]) -> String {
    let mut out = String::from("node requirements (a start checks them before loading anything):\n");
    for f in findings {
        out.push_str(&format!("  {:<8} {}: {}\n", f.level.word(), f.requirement, f.message));
    }
    if findings.iter().any(|f| f.level == Level::Missing) {
        out.push_str("the agent would not start on this node: a requirement is missing\n");
    }
    out
}

/// Every requirement, in the order a start checks them.
pub fn evaluate(f: &Facts) -> Vec<Finding> {
    let mut out = kernel(f);
    out.push(btf(f));
    out.push(jit(f));
    out.extend(capabilities(f));
    out.extend(bpffs(f));
    out.extend(runtime_socket(f));
    out
}

fn kernel(f: &Facts) -> Vec<Finding> {
    let r = &f.release;
    let Some(v) = kernel_version(r) else {
        let w = format!(
            "the kernel release '{r}' has no version the agent can read: going on without this check"
        );
        return vec![finding("kernel", Level::Warning, w)];
    };
    let kernel = if v >= MIN_KERNEL {
        finding("kernel", Level::Ok, format!("Linux {r}"))
    } else if f.kfunc == Some(true) {
        finding(
            "kernel",
            Level::Warning,
            format!(
                "Linux {r} reports a version before 6.2 but its BTF has {KFUNC} (a backport): going on; \
                 should the classifier not load, upgrade the node's kernel to 6.2 or later"
            ),
        )
    } else {
        finding(
            "kernel",
            Level::Missing,
            format!(
                "Linux {r} is older than 6.2, the oldest the classifier loads on (it calls the kfunc {KFUNC}): \
                 upgrade the node's kernel"
            ),
        )
    };
    let tcx = match f.attach_mode {
        AttachModeCfg::Auto if v >= TCX_KERNEL => finding("TCX", Level::Ok, "TCX links (Linux 6.6+)"),
        AttachModeCfg::Auto => finding(
            "TCX",
            Level::Note,
            format!(
                "Linux {r} has no TCX (6.6): the classifier is attached as tc filters on a clsact qdisc \
                 instead, as expected on this kernel"
            ),
        ),
        // The configuration's check asks the kernel itself.
        AttachModeCfg::Tcx => finding("TCX", Level::Ok, "attach.mode: tcx (checked with the configuration)"),
        AttachModeCfg::Tc => finding("TCX", Level::Ok, "not used (attach.mode: tc)"),
    };
    vec![kernel, tcx]
}

fn btf(f: &Facts) -> Finding {
    if f.btf {
        return finding("BTF", Level::Ok, facts::VMLINUX_BTF);
    }
    finding(
        "BTF",
        Level::Missing,
        format!(
            "{} is missing: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF), which loading the classifier \
             needs: use a kernel built with it, as the major distributions' are",
            facts::VMLINUX_BTF
        ),
    )
}

fn jit(f: &Facts) -> Finding {
    match f.jit.as_deref() {
        Some("0") => finding(
            "BPF JIT",
            Level::Missing,
            "net.core.bpf_jit_enable is 0: the classifier's tail calls need the BPF JIT: \
             sysctl -w net.core.bpf_jit_enable=1",
        ),
        Some(_) => finding("BPF JIT", Level::Ok, "on"),
        None => {
            finding("BPF JIT", Level::Note, "net.core.bpf_jit_enable not readable here: left to the load")
        }
    }
}

fn capabilities(f: &Facts) -> Vec<Finding> {
    let Some(caps) = f.caps else {
        return vec![finding(
            "capabilities",
            Level::Note,
            "not readable (/proc/self/status): left to the load",
        )];
    };
    let has = |cap: u32| caps & (1 << cap) != 0;
    // CAP_SYS_ADMIN stands for CAP_BPF and CAP_PERFMON (the kernel's bpf_capable() and
    // perfmon_capable()).
    let admin = has(CAP_SYS_ADMIN);
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF", admin),
        (CAP_PERFMON, "CAP_PERFMON", admin),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN", false),
    ]
    .into_iter()
    .filter(|(cap, _, instead)| !has(*cap) && !instead)
    .map(|(_, name, _)| name)
    .collect();
    if !missing.is_empty() {
        return vec![finding(
            "capabilities",
            Level::Missing,
            format!(
                "missing capabilities {}: run mirror-agent as root, or with CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN \
                 and CAP_SYS_PTRACE (as the DaemonSet and the systemd unit do)",
                missing.join(", ")
            ),
        )];
    }
    let mut out = vec![finding("capabilities", Level::Ok, "CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN")];
    if !has(CAP_SYS_PTRACE) {
        out.push(finding(
            "capabilities",
            Level::Warning,
            "no CAP_SYS_PTRACE: pods whose processes run as another user are not found from /proc, and are \
             named after their network namespace or interface unless the container runtime names them",
        ));
    }
    out
}

fn bpffs(f: &Facts) -> Vec<Finding> {
    let pin = f.pin_path.display();
    let all = mounts(&f.mountinfo);
    let Some(mount) = mount_of(&all, &f.pin_path).filter(|m| m.fstype == "bpf") else {
        if !f.pin_path.starts_with(BPFFS) {
            // As the configuration's check says it.
            let m = format!("bpf.pin_path: {pin} is not on a BPF filesystem (mount -t bpf bpf DIR)");
            return vec![finding("BPF filesystem", Level::Missing, m)];
        }
        if f.caps.is_some_and(|c| c & (1 << CAP_SYS_ADMIN) != 0) {
            let m = format!(
                "no BPF filesystem at {BPFFS}: the agent mounts one of its own, whose pins end with it (said below)"
            );
            return vec![finding("BPF filesystem", Level::Note, m)];
        }
        let m = format!(
            "no BPF filesystem at {BPFFS} for bpf.pin_path {pin}, and no CAP_SYS_ADMIN to mount one: mount it on \
             the node (mount -t bpf bpf {BPFFS}; systemd does at boot) and, in a container, the node's {BPFFS} \
             into it"
        );
        return vec![finding("BPF filesystem", Level::Missing, m)];
    };
    let on = finding("BPF filesystem", Level::Ok, format!("{pin} on the bpffs at {}", mount.point.display()));
    let propagation = match (f.in_container, mount.propagation) {
        (Some(false), _) => finding("mount propagation", Level::Ok, "the node's own mount namespace"),
        (None, _) => finding(
            "mount propagation",
            Level::Note,
            "whether the agent runs in a container is not readable (/proc/1/ns/mnt): not checked",
        ),
        (Some(true), Propagation::Shared) => finding("mount propagation", Level::Ok, "shared with the node"),
        (Some(true), Propagation::Slave) => {
            finding("mount propagation", Level::Ok, "a slave of the node's mount (HostToContainer)")
        }
        (Some(true), Propagation::Private) => finding(
            "mount propagation",
            Level::Warning,
            format!(
                "bpf.pin_path {pin} is on a private mount of the agent's container: a BPF filesystem the node \
                 mounts there later does not reach the agent: mount the node's {BPFFS} with propagation (in a \
                 pod, mountPropagation: HostToContainer, which needs the node's mount shared: mount \
                 --make-rshared /)"
            ),
        ),
    };
    vec![on, propagation]
}

/// In a container, the propagation of the mount that holds the container runtime's socket
/// (`pods.cri`: the DaemonSet mounts the node's `/run` at `/host/run`). Sockets on the
/// container's own root file system (no mount of the node's there) are not the node's: nothing
/// to say of them.
fn runtime_socket(f: &Facts) -> Vec<Finding> {
    if f.in_container != Some(true) {
        return Vec::new();
    }
    let all = mounts(&f.mountinfo);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for sock in &f.cri_sockets {
        let Some(mount) = mount_of(&all, sock).filter(|m| m.point != std::path::Path::new("/")) else {
            continue;
        };
        if seen.contains(&mount.point) {
            continue;
        }
        seen.push(mount.point.clone());
        let point = mount.point.display();
        out.push(match mount.propagation {
            Propagation::Shared | Propagation::Slave => finding(
                "mount propagation",
                Level::Ok,
                format!("the runtime's socket directory {point}: with propagation from the node"),
            ),
            Propagation::Private => finding(
                "mount propagation",
                Level::Warning,
                format!(
                    "the container runtime's socket {} is on a private mount of the agent's container ({point}): \
                     a socket directory the node mounts there after the agent started (a runtime restarted with \
                     its own mount) does not reach the agent, whose pods are then named from /proc only: mount \
                     the node's directory with mountPropagation: HostToContainer (which needs the node's mount \
                     shared: mount --make-rshared /)",
                    sock.display()
                ),
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests;
