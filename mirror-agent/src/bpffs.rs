//! Makes sure the pin path lives on a BPF filesystem, mounting /sys/fs/bpf when it is not
//! (as in a fresh container or a `ip netns exec` mount namespace).

use std::ffi::CString;
use std::path::Path;

use anyhow::{bail, Context};

/// statfs magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs is mounted by convention.
const BPFFS: &str = "/sys/fs/bpf";

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: statfs writes into the struct we own; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// Whether `pin_path` (or its nearest existing ancestor) is on a bpffs.
fn on_bpffs(pin_path: &Path) -> bool {
    let existing = pin_path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    is_bpffs(existing)
}

/// Whether pins can go to `pin_path`: it is on a bpffs, or below /sys/fs/bpf where
/// [`ensure`] mounts one.
pub fn check(pin_path: &Path) -> Result<(), String> {
    if on_bpffs(pin_path) || pin_path.starts_with(BPFFS) {
        Ok(())
    } else {
        Err(format!("{} is not on a BPF filesystem (mount -t bpf bpf DIR)", pin_path.display()))
    }
}

/// Checks that `pin_path` (or its nearest existing ancestor) is on a bpffs; mounts one on
/// /sys/fs/bpf when the pin path is below it and nothing is mounted there.
pub fn ensure(pin_path: &Path) -> anyhow::Result<()> {
    if on_bpffs(pin_path) {
        return Ok(());
    }
    if let Err(e) = check(pin_path) {
        bail!("bpf.pin_path {e}");
    }
    std::fs::create_dir_all(BPFFS).with_context(|| format!("creating {BPFFS}"))?;
    let (src, dir, fs) = (c"bpf", CString::new(BPFFS)?, c"bpf");
    // SAFETY: valid C strings; no mount data.
    let rc = unsafe { libc::mount(src.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("mounting bpffs on {BPFFS}"));
    }
    // A bpffs mounted here lives in this process's mount namespace only (a container without
    // the host's /sys/fs/bpf, or `ip netns exec`): the pins, and with them the TCX links, go
    // when the agent goes, so a restart adopts nothing and the data path stops meanwhile.
    tracing::warn!(
        "mounted a bpffs on {BPFFS} in the agent's own mount namespace: pins (and TCX links) \
         end with this process, so the data path stops when the agent stops or is killed and a \
         restart starts from empty maps; mount the host's /sys/fs/bpf (bidirectional) to keep \
         the data path across restarts"
    );
    Ok(())
}
