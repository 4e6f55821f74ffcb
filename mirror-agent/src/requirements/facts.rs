//! What the requirements are checked against, read from this node: the kernel's release and
//! BTF, the BPF JIT's sysctl, the process's capabilities, its mounts, and whether it runs in a
//! mount namespace of its own (a container).

use std::path::{Path, PathBuf};

use crate::config::{AttachModeCfg, Config};

use super::{KFUNC, MIN_KERNEL};

/// Where the kernel's BTF is.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// The BPF JIT's switch.
const JIT_SYSCTL: &str = "/proc/sys/net/core/bpf_jit_enable";

/// What the checks read of this node.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The kernel's release (`uname -r`).
    pub release: String,
    /// The kernel's BTF exists.
    pub btf: bool,
    /// Whether the kernel's BTF has [`KFUNC`]: looked up only on a kernel that reports a version
    /// before [`MIN_KERNEL`] (a distribution's backport).
    pub kfunc: Option<bool>,
    /// `net.core.bpf_jit_enable` (none: not readable here).
    pub jit: Option<String>,
    /// The effective capabilities (none: not readable).
    pub caps: Option<u64>,
    /// `/proc/self/mountinfo`.
    pub mountinfo: String,
    /// `bpf.pin_path`, with the symlinks of its existing part resolved.
    pub pin_path: PathBuf,
    /// The container runtime sockets of `pods.cri`, with the symlinks of their existing part
    /// resolved.
    pub cri_sockets: Vec<PathBuf>,
    /// Whether this process runs in another mount namespace than PID 1 (with the host's PID
    /// namespace, as the DaemonSet runs: a container); none when that cannot be read.
    pub in_container: Option<bool>,
    /// `attach.mode`.
    pub attach_mode: AttachModeCfg,
}

impl Facts {
    /// This node, for `cfg`.
    pub fn read(cfg: &Config) -> Facts {
        let release = uname_release();
        let older = super::parse::kernel_version(&release).is_some_and(|v| v < MIN_KERNEL);
        let btf = Path::new(VMLINUX_BTF).exists();
        let kfunc = (older && btf).then(has_kfunc);
        let mnt_ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        let in_container = match (mnt_ns("self"), mnt_ns("1")) {
            (Some(own), Some(init)) => Some(own != init),
            _ => None,
        };
        Facts {
            release,
            btf,
            kfunc,
            jit: std::fs::read_to_string(JIT_SYSCTL).ok().map(|s| s.trim().to_string()),
            caps: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| super::parse::effective_caps(&s)),
            mountinfo: std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            pin_path: resolved(&cfg.bpf.pin_path),
            cri_sockets: cfg.pods.cri.paths().iter().map(|p| resolved(p)).collect(),
            in_container,
            attach_mode: cfg.attach.mode,
        }
    }
}

/// `uname -r`.
fn uname_release() -> String {
    // SAFETY: uname fills the struct we own; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return String::new();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr()).to_string_lossy().into_owned()
    }
}

/// Whether the kernel's BTF has the kfunc the classifier needs.
fn has_kfunc() -> bool {
    libbpf_rs::btf::Btf::from_vmlinux()
        .ok()
        .is_some_and(|btf| btf.type_by_name::<libbpf_rs::btf::types::Func<'_>>(KFUNC).is_some())
}

/// `path` with the symlinks of its nearest existing ancestor resolved (the rest does not exist
/// yet).
fn resolved(path: &Path) -> PathBuf {
    for dir in path.ancestors() {
        if let Ok(real) = dir.canonicalize() {
            return match path.strip_prefix(dir) {
                Ok(rest) if !rest.as_os_str().is_empty() => real.join(rest),
                _ => real,
            };
        }
    }
    path.to_path_buf()
}
