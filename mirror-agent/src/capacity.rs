//! What the data path's maps can hold and what they cost, known before anything is loaded:
//! the bound the kernel puts on a hash map's `max_entries`, the kernel memory of the tables
//! that `flows.max` and `flows.marks_max` size, the memory this agent may take, and the rule
//! maps' capacity. The configuration is checked against these (`mirror-agent --check`, and at
//! start before the classifier is loaded).

use std::mem::{size_of, MaybeUninit};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::OpenObject;

use mirror_bpf::skel::classifier::ClassifierSkelBuilder;
use mirror_bpf::types;

/// The most entries the kernel gives a hash map: its bucket array (`max_entries` rounded up to
/// a power of two, 16 bytes a bucket) must stay within 4 GiB, else the map create fails with
/// E2BIG ("Argument list too long").
pub const HASH_MAX_ENTRIES: u32 = 1 << 28;

/// Bytes of a hash map bucket and of an element's header (`struct bucket`, `struct htab_elem`
/// on 64-bit kernels).
const BUCKET: u64 = 16;
const ELEM_HEADER: u64 = 48;

fn round8(n: usize) -> u64 {
    (n as u64).div_ceil(8) * 8
}

/// Kernel memory of a preallocated hash map (LRU maps always are): buckets, elements and, for
/// a per-CPU map, one value per possible CPU.
fn hash_map_bytes(entries: u32, key: usize, value: usize, per_cpu: Option<u32>) -> u64 {
    let n = u64::from(entries);
    let buckets = n.next_power_of_two() * BUCKET;
    match per_cpu {
        Some(cpus) => buckets + n * (ELEM_HEADER + round8(key) + 8) + n * round8(value) * u64::from(cpus),
        None => buckets + n * (ELEM_HEADER + round8(key) + round8(value)),
    }
}

/// Kernel memory of the tables the configuration sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableMemory {
    /// `flow_table` (per CPU), `flow_timing` and `flow_nat`, sized by `flows.max`.
    pub flows: u64,
    /// `mirror_marks`, sized by `flows.marks_max`.
    pub marks: u64,
}

impl TableMemory {
    /// The tables of `flows` flows and `marks` marks on `cpus` possible CPUs.
    pub fn of(flows: u32, marks: u32, cpus: u32) -> Self {
        let key = size_of::<types::flow_key>();
        let flows = hash_map_bytes(flows, key, size_of::<types::flow_traffic>(), Some(cpus))
            + hash_map_bytes(flows, key, size_of::<types::flow_timing>(), None)
            + hash_map_bytes(flows, key, size_of::<types::flow_nat>(), None);
        let marks = hash_map_bytes(marks, key, size_of::<types::mirror_mark>(), None);
        Self { flows, marks }
    }

    /// Both.
    pub fn total(&self) -> u64 {
        self.flows + self.marks
    }
}

/// Bytes as MiB or GiB with one decimal, for messages.
pub fn human(bytes: u64) -> String {
    let mib = bytes as f64 / f64::from(1 << 20);
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// What this host gives the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Possible CPUs: per-CPU maps hold a value for each.
    pub cpus: u32,
    /// Bytes of memory the agent may use: the host's, or its cgroup's limit when lower (map
    /// memory is charged to the cgroup of the process that creates the map).
    pub memory: u64,
    /// Where `memory` comes from, for messages.
    pub memory_from: String,
    /// RLIMIT_NOFILE (soft): descriptors the agent may hold.
    pub open_files: u64,
}

impl Host {
    /// This host, as the agent started now would see it.
    pub fn this() -> anyhow::Result<Host> {
        let cpus = mirror_bpf::possible_cpus()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let total = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .ok_or_else(|| anyhow::anyhow!("no MemTotal in /proc/meminfo"))?
            * 1024;
        let (memory, memory_from) = match cgroup_memory_limit() {
            Some((limit, dir)) if limit < total => {
                (limit, format!("the memory.max of the agent's cgroup {}", dir.display()))
            }
            _ => (total, "the host's memory".to_string()),
        };
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct we own.
        let open_files = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur
        } else {
            u64::MAX
        };
        Ok(Host { cpus, memory, memory_from, open_files })
    }

    /// The share of [`Host::memory`] the sized tables may take: half, so that the agent, the
    /// other maps and whatever shares the cgroup keep room.
    pub fn table_budget(&self) -> u64 {
        self.memory / 2
    }
}

/// The lowest memory.max (cgroup v2) on the path from this process's cgroup to the root, with
/// the directory that sets it.
fn cgroup_memory_limit() -> Option<(u64, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim().trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let dir = root.join(rel);
    dir.ancestors()
        .take_while(|d| d.starts_with(root) && *d != root)
        .filter_map(|d| {
            let v = std::fs::read_to_string(d.join("memory.max")).ok()?;
            Some((v.trim().parse::<u64>().ok()?, d.to_path_buf()))
        })
        .min_by_key(|(v, _)| *v)
}

/// The entries of a map pinned at `pin_path` by an earlier agent, if there is one: an agent
/// adopts pinned maps as they are (with their flows), whatever the configuration now says.
pub fn pinned_entries(pin_path: &Path, map: &str) -> Option<u32> {
    let path = pin_path.join(map);
    if !path.exists() {
        return None;
    }
    libbpf_rs::MapHandle::from_pinned_path(&path).ok().map(|m| libbpf_rs::MapCore::max_entries(&m))
}

/// What the classifier's rule maps hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleCapacity {
    /// Rules at once: one hit-counter slot each (slot 0 is never used).
    pub rules: usize,
    /// Distinct (port, status) pairs of the port-scoped rules: entries of `port_rules`.
    pub port_keys: usize,
}

impl RuleCapacity {
    /// The classifier's, read from its object file (opened, not loaded: no privilege needed).
    pub fn classifier() -> RuleCapacity {
        static CAP: OnceLock<RuleCapacity> = OnceLock::new();
        *CAP.get_or_init(|| {
            let mut storage = MaybeUninit::<OpenObject>::uninit();
            let open = ClassifierSkelBuilder::default()
                .open(&mut storage)
                .expect("the classifier's embedded object opens");
            RuleCapacity {
                rules: types::mirror_limits::RULE_SLOTS.0 as usize - 1,
                port_keys: open.maps.port_rules.max_entries() as usize,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_memory_counts_every_sized_map() {
        // 65536 flows on 2 CPUs: flow_table 2^16 x (16 + 96 + 2 x 112), flow_timing
        // 2^16 x (16 + 584), flow_nat 2^16 x (16 + 208); 16384 marks x (16 + 192).
        let m = TableMemory::of(65_536, 16_384, 2);
        assert_eq!(m.flows, 65_536 * (336 + 600 + 224));
        assert_eq!(m.marks, 16_384 * 208);
        // Buckets are a power of two.
        assert_eq!(TableMemory::of(0, 65_537, 1).marks, 131_072 * 16 + 65_537 * 192);
        assert_eq!(human(3 << 20), "3.0 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }

    #[test]
    fn this_host_is_read() {
        let h = Host::this().unwrap();
        assert!(h.cpus >= 1 && h.memory > 1 << 20 && h.open_files > 0, "{h:?}");
    }

    #[test]
    fn rule_capacity_comes_from_the_object() {
        let c = RuleCapacity::classifier();
        assert_eq!(c.rules, 16_383);
        assert_eq!(c.port_keys, 65_536);
    }
}
