//! A TCX link held by its file descriptor. libbpf attaches a program with the hook its expected
//! attach type names; the classifier's entry programs are loaded as plain tc programs (one
//! program array serves them all, and the kernel's tail calls need one attach type), so the
//! hook is given here instead, at `bpf_link_create`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use libbpf_rs::Program;

/// A TCX link: detached when dropped unless pinned (the kernel keeps a pinned link).
#[derive(Debug)]
pub struct TcxLink {
    fd: OwnedFd,
}

/// The errno of a libbpf call's negative return value.
fn check(rc: i32) -> io::Result<i32> {
    if rc < 0 {
        Err(io::Error::from_raw_os_error(-rc))
    } else {
        Ok(rc)
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

impl TcxLink {
    /// Attaches `prog` at the head of the ingress (or `egress`) hook of `ifindex`.
    pub fn attach(prog: &Program<'_>, ifindex: u32, egress: bool) -> io::Result<Self> {
        // SAFETY: a plain C struct (with a union of plain structs); all-zero is its default.
        let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
        // Before every other program: we only observe and always pass packets on.
        opts.flags = libbpf_sys::BPF_F_BEFORE;
        let hook = if egress { libbpf_sys::BPF_TCX_EGRESS } else { libbpf_sys::BPF_TCX_INGRESS };
        // SAFETY: the program's fd is valid while `prog` is borrowed; opts outlives the call.
        // (The kernel creates the link under the RTNL lock and waits for an RCU grace period
        // there: about 15 ms in a VM, during which other link changes on the node wait too.)
        let fd = check(unsafe {
            libbpf_sys::bpf_link_create(prog.as_fd().as_raw_fd(), ifindex as i32, hook, &opts)
        })?;
        // SAFETY: bpf_link_create returned a new descriptor that nothing else owns.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Opens the link pinned at `path`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let p = c_path(path)?;
        // SAFETY: `p` is a valid C string for the duration of the call.
        let fd = check(unsafe { libbpf_sys::bpf_obj_get(p.as_ptr()) })?;
        // SAFETY: bpf_obj_get returned a new descriptor that nothing else owns.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Makes the link run `prog` instead, without a moment with no program on the hook.
    pub fn update_prog(&self, prog: &Program<'_>) -> io::Result<()> {
        // SAFETY: both descriptors are valid while borrowed; NULL opts are the defaults.
        check(unsafe {
            libbpf_sys::bpf_link_update(self.fd.as_raw_fd(), prog.as_fd().as_raw_fd(), std::ptr::null())
        })
        .map(drop)
    }

    /// Pins the link at `path`: it outlives this process.
    pub fn pin(&self, path: &Path) -> io::Result<()> {
        let p = c_path(path)?;
        // SAFETY: the descriptor is valid and `p` a valid C string for the call.
        check(unsafe { libbpf_sys::bpf_obj_pin(self.fd.as_raw_fd(), p.as_ptr()) }).map(drop)
    }

    /// Detaches the link from its hook now (pinned or not: the pin then holds a dead link).
    pub fn detach(&self) -> io::Result<()> {
        // SAFETY: the descriptor is valid while borrowed.
        check(unsafe { libbpf_sys::bpf_link_detach(self.fd.as_raw_fd()) }).map(drop)
    }
}
