//! What the data path's maps can hold and what they cost, known before anything is loaded:
//! the bound the kernel puts on a hash map's `max_entries`, the kernel memory of the
//! classifier's maps (the tables `flows.max` and `flows.marks_max` size, and the others,
//! per-CPU ones on this host's CPUs) and the memory this agent may take (the rule maps'
//! capacity is the data path's: [`mirror_bpf::rule::capacity::Capacity`]). The configuration
//! is checked against these (`mirror-agent --check`, and at start before the classifier is
//! loaded).

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapType, OpenObject};

use mirror_bpf::skel::classifier::ClassifierSkelBuilder;
use mirror_bpf::DatapathOptions;

/// The most entries the kernel gives a hash map: its bucket array (`max_entries` rounded up to
/// a power of two, 16 bytes a bucket) must stay within 4 GiB, else the map create fails with
/// E2BIG ("Argument list too long").
pub const HASH_MAX_ENTRIES: u32 = 1 << 28;

/// Bytes of a hash map bucket and of an element's header (`struct bucket`, `struct htab_elem`
/// on 64-bit kernels).
const BUCKET: u64 = 16;
const ELEM_HEADER: u64 = 48;

fn round8(n: u32) -> u64 {
    u64::from(n).div_ceil(8) * 8
}

/// A map as the classifier's object declares it.
#[derive(Debug, Clone)]
struct MapSpec {
    name: String,
    kind: MapType,
    key: u32,
    value: u32,
    entries: u32,
}

impl MapSpec {
    /// Kernel memory of the map with `entries` on `cpus` possible CPUs, as the kernel counts
    /// it (hash maps are preallocated: buckets, elements, and per-CPU values for each CPU).
    fn bytes(&self, entries: u32, cpus: u32) -> u64 {
        let (n, cpus) = (u64::from(entries), u64::from(cpus));
        let buckets = n.next_power_of_two() * BUCKET;
        let (k, v) = (round8(self.key), round8(self.value));
        match self.kind {
            MapType::Hash | MapType::LruHash => buckets + n * (ELEM_HEADER + k + v),
            MapType::PercpuHash | MapType::LruPercpuHash => {
                buckets + n * (ELEM_HEADER + k + 8) + n * v * cpus
            }
            MapType::Array => n * v,
            MapType::PercpuArray => n * (8 + v * cpus),
            MapType::RingBuf => n + (16 << 10),
            _ => n * (k + v),
        }
    }
}

/// The maps `flows.max` sizes, the one `flows.marks_max` sizes, the one
/// `mirror.replay_requests` sizes (as the data path's loader sets them), the event ring
/// (which the agent leaves at its default size) and the flow cache (its declared slots for
/// each possible CPU); every other map keeps the size its object declares.
const FLOW_MAPS: [&str; 4] = ["flow_table", "flow_timing", "flow_timing_index", "flow_nat"];
const MARK_MAP: &str = "mirror_marks";
const REPLAY_MAP: &str = "request_replay";
const EVENTS_MAP: &str = "events";
const CACHE_MAP: &str = "flow_cache";

/// What the classifier's object declares, read once (opened, not loaded: no privilege
/// needed).
struct Object {
    maps: Vec<MapSpec>,
}

fn object() -> &'static Object {
    static OBJECT: OnceLock<Object> = OnceLock::new();
    OBJECT.get_or_init(|| {
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let open = ClassifierSkelBuilder::default()
            .open(&mut storage)
            .expect("the classifier's embedded object opens");
        let maps = open
            .open_object()
            .maps()
            .map(|m| MapSpec {
                name: m.name().to_string_lossy().into_owned(),
                kind: m.map_type(),
                key: m.key_size(),
                value: m.value_size(),
                entries: m.max_entries(),
            })
            .collect();
        Object { maps }
    })
}

/// Kernel memory of the classifier's maps with the configured sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMemory {
    /// `flow_table` (per CPU), `flow_timing` (and its index) and `flow_nat`, sized by `flows.max`.
    pub flows: u64,
    /// `mirror_marks`, sized by `flows.marks_max`.
    pub marks: u64,
    /// `request_replay`, sized by `mirror.replay_requests`.
    pub replay: u64,
    /// Every other map, at the size its object declares (per-CPU ones grow with the CPUs).
    pub fixed: u64,
    /// The largest of those, and its bytes.
    pub largest_fixed: (String, u64),
}

/// One map's kernel memory with the configured sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapMemory {
    /// The map's name in the classifier.
    pub name: String,
    /// Its entries (for the ring buffer: its bytes).
    pub entries: u32,
    /// Its kernel memory.
    pub bytes: u64,
    /// The setting that sizes it, if any.
    pub sized_by: Option<&'static str>,
}

/// Every classifier map's kernel memory with `flows` flows, `marks` marks and `replay` request
/// slots on `cpus` possible CPUs, largest first: what `mirror-agent --check` prints.
pub fn map_memory(flows: u32, marks: u32, replay: u32, cpus: u32) -> Vec<MapMemory> {
    let mut maps: Vec<MapMemory> = object()
        .maps
        .iter()
        .map(|spec| {
            let (entries, sized_by) = match spec.name.as_str() {
                n if FLOW_MAPS.contains(&n) => (flows, Some("flows.max")),
                MARK_MAP => (marks, Some("flows.marks_max")),
                REPLAY_MAP => (replay.max(1), Some("mirror.replay_requests")),
                EVENTS_MAP => (DatapathOptions::RINGBUF_BYTES, None),
                CACHE_MAP => (spec.entries * cpus, None),
                _ => (spec.entries, None),
            };
            MapMemory { name: spec.name.clone(), entries, bytes: spec.bytes(entries, cpus), sized_by }
        })
        .collect();
    maps.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    maps
}

impl TableMemory {
    /// The classifier's maps with `flows` flows, `marks` marks and `replay` request slots on
    /// `cpus` possible CPUs.
    pub fn of(flows: u32, marks: u32, replay: u32, cpus: u32) -> Self {
        let mut m =
            TableMemory { flows: 0, marks: 0, replay: 0, fixed: 0, largest_fixed: (String::new(), 0) };
        for map in map_memory(flows, marks, replay, cpus) {
            match map.sized_by {
                Some("flows.max") => m.flows += map.bytes,
                Some("flows.marks_max") => m.marks += map.bytes,
                Some(_) => m.replay += map.bytes,
                None => {
                    m.fixed += map.bytes;
                    if map.bytes > m.largest_fixed.1 {
                        m.largest_fixed = (map.name, map.bytes);
                    }
                }
            }
        }
        m
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.flows + self.marks + self.replay + self.fixed
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

/// Memory the agent keeps for itself under a cgroup's limit: its heap, its threads, the
/// API's connections.
pub const AGENT_RESERVE: u64 = 16 << 20;

/// What this host gives the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Possible CPUs: per-CPU maps hold a value for each.
    pub cpus: u32,
    /// Bytes of memory the agent may use: the host's, or its cgroup's limit when lower (map
    /// memory is charged to the cgroup of the process that creates the map).
    pub memory: u64,
    /// The cgroup whose memory.max is `memory`, when that is lower than the host's memory.
    pub cgroup: Option<PathBuf>,
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
        let (memory, cgroup) = match cgroup_memory_limit() {
            Some((limit, dir)) if limit < total => (limit, Some(dir)),
            _ => (total, None),
        };
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct we own.
        let open_files = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur
        } else {
            u64::MAX
        };
        Ok(Host { cpus, memory, cgroup, open_files })
    }

    /// What the classifier's maps may take of [`Host::memory`]: under a cgroup's limit, all
    /// but [`AGENT_RESERVE`] for the agent itself (past the limit the kernel refuses the maps,
    /// near it the agent is killed); of the host's memory, half (a node agent taking more is
    /// a mistake).
    pub fn map_budget(&self) -> u64 {
        match self.cgroup {
            Some(_) => self.memory.saturating_sub(AGENT_RESERVE),
            None => self.memory / 2,
        }
    }

    /// [`Host::map_budget`] in words, for messages.
    pub fn map_budget_text(&self) -> String {
        match &self.cgroup {
            Some(dir) => format!(
                "the memory limit of the agent's cgroup {} ({}) less {} for the agent itself",
                dir.display(),
                human(self.memory),
                human(AGENT_RESERVE)
            ),
            None => format!("half of the host's memory ({})", human(self.memory)),
        }
    }
}

/// The lowest memory limit on the path from this process's cgroup to the root, with the
/// directory that sets it: memory.max (cgroup v2) or memory.limit_in_bytes (v1's memory
/// controller).
fn cgroup_memory_limit() -> Option<(u64, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(&own, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_limit`] for `/proc/self/cgroup` text `own`, with cgroup filesystems under
/// `fs`.
fn cgroup_limit_in(own: &str, fs: &Path) -> Option<(u64, PathBuf)> {
    own.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let (root, file) = if controllers.is_empty() {
                (fs.to_path_buf(), "memory.max")
            } else if controllers.split(',').any(|c| c == "memory") {
                (fs.join("memory"), "memory.limit_in_bytes")
            } else {
                return None;
            };
            let dir = root.join(path.trim().trim_start_matches('/'));
            // In a cgroup namespace (a container) the root of the mount is the container's
            // cgroup, with its limit; the host's root cgroup has none ("max" or no file).
            dir.ancestors()
                .take_while(|d| d.starts_with(&root))
                .filter_map(|d| {
                    let v = std::fs::read_to_string(d.join(file)).ok()?;
                    Some((v.trim().parse::<u64>().ok()?, d.to_path_buf()))
                })
                .min_by_key(|(v, _)| *v)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_memory_counts_every_map() {
        // 65536 flows on 2 CPUs: flow_table 2^16 x (16 + 96 + 2 x 112), flow_timing (an
        // array) 2^16 x 968, its index 2^16 x (16 + 96), flow_nat 2^16 x (16 + 208); 16384
        // marks x (16 + 200).
        let m = TableMemory::of(65_536, 16_384, 4096, 2);
        assert_eq!(m.flows, 65_536 * (336 + 968 + 112 + 224));
        assert_eq!(m.marks, 16_384 * 216);
        // Buckets are a power of two.
        assert_eq!(TableMemory::of(0, 65_537, 1, 1).marks, 131_072 * 16 + 65_537 * 200);
        // One slot of 704 bytes per flow whose request is kept.
        assert_eq!(m.replay, 4096 * 704);
        // The other maps: 46,162,656 bytes as the kernel counted them (bpftool's memlock) on 2
        // CPUs, the flow cache (1,052,672), the HTTP/2 maps (h2_conns 4,211,584, h2_streams
        // 2,425,728 then, an LRU hash; 2,490,368 as the array of buckets it is now), the DNS
        // queries awaiting their responses (dns_queries 1,704,832) and iface_scopes (328,720;
        // port_rules, 11,011,264, kept its size with the scope in its key: keys take 8 bytes
        // either way) among them; the per-CPU latency histograms are the largest and grow with
        // CPUs.
        // The drop program's maps (drop_events, drop_windows, drop_counts, drop_scratch) and
        // status_rules' 256 slots of drop reasons came after that count: added as modelled.
        let drops: u64 = map_memory(65_536, 16_384, 4096, 2)
            .iter()
            .filter(|m| m.name.starts_with("drop_"))
            .map(|m| m.bytes)
            .sum::<u64>()
            + 256 * 96;
        assert!(drops > 512 << 10 && drops < 1 << 20, "{drops}");
        let kernel = 46_162_656f64 + drops as f64;
        assert!((m.fixed as f64 - kernel).abs() < kernel * 0.01, "{m:?}");
        assert_eq!(m.largest_fixed.0, "latency_hists");
        let big = TableMemory::of(65_536, 16_384, 4096, 64);
        assert!(big.fixed > 500 << 20 && big.largest_fixed.0 == "latency_hists", "{big:?}");
        assert_eq!(human(3 << 20), "3.0 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }

    #[test]
    fn cgroup_limits_v2_and_v1() {
        let fs = tempfile::tempdir().unwrap();
        let put = |dir: &str, file: &str, v: &str| {
            let d = fs.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), v).unwrap();
        };
        // v2: the lowest limit on the way up, "max" is none.
        put("kubepods/pod1", "memory.max", "max\n");
        put("kubepods", "memory.max", "268435456\n");
        let got = cgroup_limit_in("0::/kubepods/pod1/agent\n", fs.path());
        assert_eq!(got, Some((256 << 20, fs.path().join("kubepods"))));
        // In a cgroup namespace the own cgroup is the root of the mount.
        put("", "memory.max", "536870912\n");
        assert_eq!(cgroup_limit_in("0::/\n", fs.path()), Some((512 << 20, fs.path().to_path_buf())));
        // v1's memory controller, beside others.
        put("memory/docker/abc", "memory.limit_in_bytes", "134217728\n");
        let own = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n";
        assert_eq!(cgroup_limit_in(own, fs.path()).map(|(v, _)| v), Some(128 << 20));
        assert_eq!(cgroup_limit_in("3:cpu:/x\n", fs.path()), None);
    }

    #[test]
    fn this_host_is_read() {
        let h = Host::this().unwrap();
        assert!(h.cpus >= 1 && h.memory > 1 << 20 && h.open_files > 0, "{h:?}");
    }
}
