//! One agent per API socket, and the hand-over between two of them on an upgrade.
//!
//! An agent first takes the lock `<api.socket>.lock` (flock, released by the kernel when the
//! process dies). A second agent finds it held and refuses, unless it was started with
//! `--take-over`: then it claims the succession at once (the lock `<api.socket>.next`, held
//! while it waits), asks the running one (`POST /v1/handover` on its socket) to leave the
//! data path attached and pinned, close its socket and metrics listener and release the lock,
//! and takes the lock as soon as it is free. The old agent then stands by, holding nothing,
//! until it is stopped, and a stop then changes nothing. So a rolling update that starts the
//! new pod before it stops the old one (a DaemonSet's `maxSurge`) never leaves a packet
//! unmonitored, while any other stop (the DaemonSet deleted, a pod deleted) removes everything.
//!
//! The data path, its pins and the sink have one owner at a time: the holder of the lock. The
//! claim makes a waiting successor visible to the owner ([`successor_waiting`]), whatever comes
//! first: a stop (SIGTERM) that reaches the owner before the successor's request hands over
//! too, instead of removing what the successor is about to adopt; and while a successor waits,
//! the owner's `/readyz` says so, so that the probes of the new pod (which reach the old agent
//! while it still listens on the node's address) do not find it ready before its own agent
//! holds the data path.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a taking-over agent waits for the running one to let go.
pub const TAKE_OVER_TIMEOUT: Duration = Duration::from_secs(60);

/// The outcome of trying the lock.
pub enum Lock {
    /// Ours: held while the file is open.
    Taken(File),
    /// Held by another agent (its pid, as it wrote it).
    Held(String),
}

fn lock_path(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.lock", socket.display()))
}

/// The successor's claim beside the lock.
pub fn claim_path(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.next", socket.display()))
}

/// Tries the lock file `path` once (created if absent; its content: the holder's pid).
fn try_flock(path: &Path) -> anyhow::Result<Lock> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it changes nothing but the lock.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Ok(Lock::Held(holder.trim().to_string()));
        }
        return Err(err).with_context(|| format!("locking {}", path.display()));
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    Ok(Lock::Taken(file))
}

/// Tries the single-instance lock `<api.socket>.lock` once.
pub fn try_lock(socket: &Path) -> anyhow::Result<Lock> {
    try_flock(&lock_path(socket))
}

/// Whether a successor has claimed the succession and waits for the data path (another
/// process holds `<api.socket>.next`). Read by the lock's holder; an unreadable claim counts as
/// none (the stop then removes everything, as without a successor).
pub fn successor_waiting(socket: &Path) -> bool {
    let path = claim_path(socket);
    if !path.exists() {
        return false;
    }
    let Ok(file) = std::fs::File::open(&path) else { return false };
    // SAFETY: flock on a descriptor we own; a lock taken here is released when it closes.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
    !taken && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// The pids holding a flock on the file of device `dev` (major, minor) and inode `ino`, from
/// the text of `/proc/locks` (`1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`; the device's
/// numbers in hex; a waiter's line, `1: -> FLOCK ...`, holds nothing).
fn flock_holders(locks: &str, dev: (u32, u32), ino: u64) -> Vec<u32> {
    let file = format!("{:02x}:{:02x}:{ino}", dev.0, dev.1);
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, "FLOCK", _, _, pid, at, ..] if *at == file => pid.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// Whether the agent that holds the data path (the lock `<api.socket>.lock`) runs in this
/// process's cgroup: in a container, whether it is the container's own agent and not the one
/// it takes over from, whose lock stays in the node's `/run` until the hand-over. `Ok` with
/// its pid, else why not. Reads `/proc/locks` and the cgroups; takes no lock.
pub fn held_here(socket: &Path) -> Result<u32, String> {
    use std::os::unix::fs::MetadataExt;
    let path = lock_path(socket);
    let meta = std::fs::metadata(&path).map_err(|e| format!("no agent's lock {}: {e}", path.display()))?;
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let locks = std::fs::read_to_string("/proc/locks").map_err(|e| format!("reading /proc/locks: {e}"))?;
    let cgroup = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
    let ours = cgroup("self").map_err(|e| format!("reading this process's cgroup: {e}"))?;
    let holders = flock_holders(&locks, dev, meta.ino());
    let Some(&pid) = holders.first() else {
        return Err(format!("no agent holds {}", path.display()));
    };
    match cgroup(&pid.to_string()) {
        Ok(theirs) if theirs == ours => Ok(pid),
        Ok(_) => Err(format!("{} is held by the agent with pid {pid}, of another cgroup", path.display())),
        Err(e) => Err(format!("{} is held by pid {pid}, whose cgroup is unreadable: {e}", path.display())),
    }
}

/// The start of the single-instance lock, before anything else of the agent's start.
pub enum Begin {
    /// The lock is ours.
    Owner(File),
    /// Another agent holds it, and this one (`--take-over`) has claimed the succession: the
    /// claim is held until [`acquire`] has the lock.
    Successor {
        /// The running agent's pid, as it wrote it.
        holder: String,
        /// The claim `<api.socket>.next`.
        claim: File,
    },
}

/// Tries the lock; when another agent holds it, refuses, or with `take_over` claims the
/// succession (visible to the running agent at once, see [`successor_waiting`]). Nothing is
/// asked of the running agent yet: that is [`acquire`]'s, once this one's own checks passed.
pub fn begin(socket: &Path, take_over: bool) -> anyhow::Result<Begin> {
    let holder = match try_lock(socket)? {
        Lock::Taken(f) => return Ok(Begin::Owner(f)),
        Lock::Held(pid) => pid,
    };
    if !take_over {
        anyhow::bail!(
            "another mirror-agent (pid {holder}) runs with api.socket {}: refusing to start, nothing was \
             changed (--take-over asks it to hand over)",
            socket.display()
        );
    }
    // The running agent's look at the claim holds it for an instant: tried a few times.
    let mut tries = 0;
    loop {
        match try_flock(&claim_path(socket))? {
            Lock::Taken(claim) => return Ok(Begin::Successor { holder, claim }),
            Lock::Held(_) if tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Lock::Held(other) => anyhow::bail!(
                "another mirror-agent (pid {other}) is already taking over from the one with pid {holder} \
                 (api.socket {}): refusing to start, nothing was changed",
                socket.display()
            ),
        }
    }
}

/// Has the lock: at once when [`begin`] got it, else has the running agent hand over and waits
/// (at most [`TAKE_OVER_TIMEOUT`]) until it has let go; the claim goes with the lock taken.
pub async fn acquire(socket: &Path, begun: Begin) -> anyhow::Result<File> {
    let (holder, claim) = match begun {
        Begin::Owner(f) => return Ok(f),
        Begin::Successor { holder, claim } => (holder, claim),
    };
    tracing::info!(pid = %holder, socket = %socket.display(), "another agent runs: asking it to hand over");
    let client = crate::api::client::Client::new(socket);
    let asked: anyhow::Result<serde_json::Value> =
        client.call(hyper::Method::POST, "/v1/handover", None).await;
    if let Err(e) = asked {
        // It may have let go already (the reply is lost when it closes its socket at once).
        tracing::debug!(error = format!("{e:#}"), "hand-over request");
    }
    let start = Instant::now();
    loop {
        if let Lock::Taken(f) = try_lock(socket)? {
            // The owner now: the claim's file stays (opened by the next successor), its lock goes.
            drop(claim);
            tracing::info!(
                pid = %holder,
                waited_ms = start.elapsed().as_millis() as u64,
                "the running agent handed over: adopting its data path"
            );
            return Ok(f);
        }
        if start.elapsed() > TAKE_OVER_TIMEOUT {
            anyhow::bail!(
                "the mirror-agent with pid {holder} did not hand over within {}s (api.socket {})",
                TAKE_OVER_TIMEOUT.as_secs(),
                socket.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_holders_are_read_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 17 fd:01:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 99 fd:01:12345 0 EOF\n\
                     4: FLOCK  ADVISORY  READ 7 00:1a:1234 0 EOF\n";
        assert_eq!(flock_holders(locks, (0xfd, 1), 1234), vec![4242]);
        assert_eq!(flock_holders(locks, (0, 0x1a), 1234), vec![7]);
        assert!(flock_holders(locks, (0xfd, 1), 1).is_empty());
    }

    #[test]
    fn the_lock_is_held_here_once_taken() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let socket = dir.path().join("api.sock");
        assert!(held_here(&socket).unwrap_err().contains("no agent's lock"));
        let Lock::Taken(file) = try_lock(&socket).expect("the lock") else { panic!("held") };
        assert_eq!(held_here(&socket), Ok(std::process::id()));
        drop(file);
        assert!(held_here(&socket).unwrap_err().contains("no agent holds"));
    }
}
