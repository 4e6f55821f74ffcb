//! The node-wide budget of copies (`mirror.budget`): each CPU's share of the node's rates in
//! `budget_config`, and what each CPU refused in its `budget_state` (see `include/budget.h`).

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::{bytes_of, read_plain, types, ZERO};

/// The node's ceiling on copies; 0: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Copies per second, over the node.
    pub packets_per_second: u64,
    /// Bytes of copies per second, over the node.
    pub bytes_per_second: u64,
}

/// Copies the budget refused, over every CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    /// Copies not made.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One CPU's share of `rate` over `cpus` CPUs: at least 1 where the node has a limit.
fn share(rate: u64, cpus: u32) -> u64 {
    if rate == 0 {
        0
    } else {
        (rate / u64::from(cpus.max(1))).max(1)
    }
}

/// Writes the share of `budget` that each of `cpus` CPUs spends.
pub(crate) fn set(map: &MapMut<'_>, budget: Budget, cpus: u32) -> Result<()> {
    let c = types::budget_config {
        packets_per_sec: share(budget.packets_per_second, cpus),
        bytes_per_sec: share(budget.bytes_per_second, cpus),
    };
    map.update(&ZERO, bytes_of(&c), MapFlags::ANY).context(|| "writing budget_config".into())
}

/// What the budget refused, summed over CPUs.
pub(crate) fn refused(map: &MapMut<'_>) -> Result<Refused> {
    let per_cpu = map.lookup_percpu(&ZERO, MapFlags::ANY).context(|| "reading budget_state".into())?;
    let mut r = Refused::default();
    for b in per_cpu.unwrap_or_default() {
        let s: types::budget_state = read_plain(&b);
        r.packets += s.refused_packets;
        r.bytes += s.refused_bytes;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn the_node_rate_is_split_over_the_cpus() {
        assert_eq!(share(0, 4), 0);
        assert_eq!(share(1000, 4), 250);
        // A limit never becomes "no limit".
        assert_eq!(share(3, 4), 1);
        assert_eq!(share(10, 0), 10);
    }
}
