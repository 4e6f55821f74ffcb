//! Expedited RCU grace periods while TCX links are created or removed.
//!
//! Creating or removing a TCX link swaps the hook's program array and then waits, holding the
//! kernel's RTNL lock, for an RCU grace period (`synchronize_rcu` in `tcx_entry_sync`), so
//! that no packet still runs on the old array. A normal grace period takes about 14 ms on a
//! 2-CPU VM with HZ 1000 (tickless), so a veth (two hooks) costs about 28 ms, and a burst of
//! 50 new veths attaches serially in about 1.4 s: RTNL allows no overlap. With
//! `/sys/kernel/rcu_expedited` set, the same wait is an expedited grace period (an IPI to each
//! CPU), about 20 µs: the 50 veths attach in a few milliseconds.
//!
//! The switch is global to the host, so it is held only around our own link changes and put
//! back as found. A marker file records that it is on, so that an agent killed in between
//! (SIGKILL) lets the next one put it back ([`recover`]).

use std::io;
use std::path::{Path, PathBuf};

/// The kernel's switch: while it is non-zero, `synchronize_rcu` waits for an expedited grace
/// period.
pub const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

fn read_switch() -> io::Result<bool> {
    Ok(std::fs::read_to_string(RCU_EXPEDITED)?.trim() != "0")
}

fn write_switch(on: bool) -> io::Result<()> {
    std::fs::write(RCU_EXPEDITED, if on { "1" } else { "0" })
}

/// Expedited grace periods until dropped, if they were not on already; the switch is then put
/// back. Failing to read or write the switch (no sysfs, read-only /sys in a container) leaves
/// grace periods as they are: attaching is slower, never wrong.
#[derive(Debug)]
pub struct Expedited {
    /// The marker we wrote, when we turned the switch on.
    marker: Option<PathBuf>,
}

impl Expedited {
    /// Turns expedited grace periods on unless they are on, recording that in `marker`.
    pub fn begin(marker: &Path) -> Expedited {
        match read_switch() {
            Ok(false) => {}
            // On already (by the host's configuration or another tool): leave it to them.
            Ok(true) => return Expedited { marker: None },
            Err(e) => {
                tracing::debug!(error = %e, "reading {RCU_EXPEDITED}");
                return Expedited { marker: None };
            }
        }
        // The marker first: a kill between the two leaves a marker and no switch, harmless.
        if let Err(e) = std::fs::write(marker, b"1\n") {
            tracing::debug!(error = %e, marker = %marker.display(), "writing the expedited-RCU marker");
            return Expedited { marker: None };
        }
        match write_switch(true) {
            Ok(()) => Expedited { marker: Some(marker.to_path_buf()) },
            Err(e) => {
                tracing::debug!(error = %e, "writing {RCU_EXPEDITED}");
                let _ = std::fs::remove_file(marker);
                Expedited { marker: None }
            }
        }
    }

    /// Whether this guard turned the switch on.
    pub fn switched(&self) -> bool {
        self.marker.is_some()
    }
}

impl Drop for Expedited {
    fn drop(&mut self) {
        if let Some(marker) = self.marker.take() {
            if let Err(e) = write_switch(false) {
                tracing::warn!(error = %e, "putting {RCU_EXPEDITED} back to 0");
                return;
            }
            let _ = std::fs::remove_file(marker);
        }
    }
}

/// Puts the switch back if `marker` says an earlier process turned it on and did not live
/// to turn it off. Returns whether it did.
pub fn recover(marker: &Path) -> io::Result<bool> {
    if !marker.exists() {
        return Ok(false);
    }
    write_switch(false)?;
    std::fs::remove_file(marker)?;
    Ok(true)
}
