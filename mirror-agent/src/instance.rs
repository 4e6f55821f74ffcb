//! One agent per API socket: the lock `<api.socket>.lock`, taken before anything else, so a
//! second agent with the same socket refuses before it touches anything (pins, groups, the
//! socket of the running one).

use anyhow::Context;

/// Takes the single-instance lock `<api.socket>.lock` (flock, held while the agent runs; the
/// kernel releases it when the process dies, so a killed agent never blocks the next).
pub fn lock(socket: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;

    if let Some(dir) = socket.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    let path = std::path::PathBuf::from(format!("{}.lock", socket.display()));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it changes nothing but the lock.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            anyhow::bail!(
                "another mirror-agent (pid {}) runs with api.socket {}: refusing to start, nothing was changed",
                holder.trim(),
                socket.display()
            );
        }
        return Err(err).with_context(|| format!("locking {}", path.display()));
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}
