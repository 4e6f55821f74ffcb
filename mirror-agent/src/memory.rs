//! The data path's maps in kernel memory, as an operator reads it: each map on this node and
//! the total, the limit they must fit, and what the configured `flows.max` gives on other CPU
//! counts (per-CPU maps grow with the CPUs). One report from the model of [`crate::capacity`]
//! (the one the start checks the configuration against), printed by `mirror-agent --check` and
//! served in `GET /v1/status` for `mirrorctl status`.

use crate::capacity::{self, human, Host};
use crate::config::{Config, FlowsMax};
use crate::views::{CpuMemoryView, MapMemoryView, MemoryLimitView, MemoryView};

/// The CPU counts the report gives besides this node's.
pub const OTHER_CPUS: [u32; 3] = [4, 16, 64];

/// Maps below this are summed on one line of the text.
const SMALL: u64 = 1 << 20;

/// The flow table's entries for `flows.max` on `cpus` possible CPUs (`auto` keeps the table's
/// memory bounded: fewer flows on more CPUs).
pub fn flows_on(max: FlowsMax, cpus: u32) -> u32 {
    max.resolve(cpus, std::mem::size_of::<mirror_bpf::types::flow_traffic>() as u32)
}

/// The entries of the maps that settings size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The flow tables (`flows.max`).
    pub flows: u32,
    /// The marks (`flows.marks_max`).
    pub marks: u32,
    /// The kept requests (`mirror.replay_requests`).
    pub replay: u32,
}

/// What the report needs of a node besides the sizes of its maps: the configuration's
/// settings, the node's CPUs and its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMemory {
    /// `flows.max` as configured.
    pub flows_max: FlowsMax,
    /// `flows.marks_max`.
    pub marks_max: u32,
    /// `mirror.replay_requests`.
    pub replay_requests: u32,
    /// Possible CPUs.
    pub cpus: u32,
    /// What the maps may take here.
    pub limit: Option<MemoryLimitView>,
}

impl NodeMemory {
    /// `cfg` on `host`.
    pub fn new(cfg: &Config, host: &Host) -> NodeMemory {
        NodeMemory {
            flows_max: cfg.flows.max,
            marks_max: cfg.flows.marks_max,
            replay_requests: cfg.mirror.replay_requests,
            cpus: host.cpus,
            limit: Some(MemoryLimitView { bytes: host.map_budget(), what: host.map_budget_text() }),
        }
    }

    /// The sizes the configuration gives on `cpus` CPUs.
    pub fn configured(&self, cpus: u32) -> Sizes {
        Sizes { flows: flows_on(self.flows_max, cpus), marks: self.marks_max, replay: self.replay_requests }
    }

    /// The report for this node's maps with `sizes` (the configuration's, or those of maps
    /// adopted from an earlier agent, which keep theirs).
    pub fn report(&self, sizes: Sizes) -> MemoryView {
        let maps: Vec<MapMemoryView> =
            capacity::map_memory(sizes.flows, sizes.marks, sizes.replay, self.cpus)
                .into_iter()
                .map(|m| MapMemoryView {
                    name: m.name,
                    entries: m.entries,
                    bytes: m.bytes,
                    sized_by: m.sized_by.map(String::from),
                })
                .collect();
        let other_cpus = OTHER_CPUS
            .iter()
            .map(|&cpus| {
                let s = self.configured(cpus);
                let total =
                    capacity::map_memory(s.flows, s.marks, s.replay, cpus).iter().map(|m| m.bytes).sum();
                CpuMemoryView { cpus, flows: s.flows, total_bytes: total }
            })
            .collect();
        MemoryView {
            cpus: self.cpus,
            total_bytes: maps.iter().map(|m| m.bytes).sum(),
            maps,
            limit: self.limit.clone(),
            flows_max: match self.flows_max {
                FlowsMax::Auto => "auto".into(),
                FlowsMax::Fixed(n) => n.to_string(),
            },
            other_cpus,
        }
    }
}

/// The report as text: the total on this node and its limit, each map of 1 MiB or more
/// (entries, the setting that sizes it), the rest on one line, and the other CPU counts, e.g.
///
/// ```text
/// kernel memory of the data path's maps on 2 CPUs: 150.9 MiB (the limit here: 11.8 GiB, half of the host's memory (23.5 GiB))
///   flow_timing                60.5 MiB      65536 entries  (flows.max)
///   ...
///   the others                  3.3 MiB  (27 maps under 1 MiB)
/// on 4/16/64 CPUs: 172.1 MiB, 262.6 MiB, 616.0 MiB (flows.max auto: 65536, 32768, 8192 flows)
/// ```
pub fn render(v: &MemoryView) -> String {
    let limit = v
        .limit
        .as_ref()
        .map_or(String::new(), |l| format!(" (the limit here: {}, {})", human(l.bytes), l.what));
    let mut out = format!(
        "kernel memory of the data path's maps on {} CPUs: {}{limit}\n",
        v.cpus,
        human(v.total_bytes)
    );
    let (mut small, mut small_bytes) = (0, 0u64);
    for m in &v.maps {
        if m.bytes < SMALL {
            (small, small_bytes) = (small + 1, small_bytes + m.bytes);
            continue;
        }
        let by = m.sized_by.as_ref().map(|k| format!("  ({k})")).unwrap_or_default();
        out.push_str(&format!("  {:<22} {:>10}  {:>9} entries{by}\n", m.name, human(m.bytes), m.entries));
    }
    if small > 0 {
        out.push_str(&format!(
            "  {:<22} {:>10}  ({small} maps under 1 MiB)\n",
            "the others",
            human(small_bytes)
        ));
    }
    if !v.other_cpus.is_empty() {
        let join = |f: &dyn Fn(&CpuMemoryView) -> String, sep: &str| {
            v.other_cpus.iter().map(f).collect::<Vec<_>>().join(sep)
        };
        out.push_str(&format!(
            "on {} CPUs: {} (flows.max {}: {} flows)\n",
            join(&|c| c.cpus.to_string(), "/"),
            join(&|c| human(c.total_bytes), ", "),
            v.flows_max,
            join(&|c| c.flows.to_string(), ", "),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(flows_max: FlowsMax, cpus: u32) -> NodeMemory {
        NodeMemory { flows_max, marks_max: 16_384, replay_requests: 4096, cpus, limit: None }
    }

    #[test]
    fn the_report_lists_every_map_and_other_cpu_counts() {
        let n = node(FlowsMax::Auto, 2);
        let v = n.report(n.configured(2));
        assert_eq!(v.total_bytes, v.maps.iter().map(|m| m.bytes).sum::<u64>());
        assert!(v.maps.windows(2).all(|w| w[0].bytes >= w[1].bytes), "{v:?}");
        let flow_table = v.maps.iter().find(|m| m.name == "flow_table").unwrap();
        assert_eq!((flow_table.entries, flow_table.sized_by.as_deref()), (65_536, Some("flows.max")));
        // auto: fewer flows on more CPUs, more memory all the same (the per-CPU maps).
        let flows: Vec<u32> = v.other_cpus.iter().map(|c| c.flows).collect();
        assert_eq!(flows, [65_536, 32_768, 8192]);
        assert!(v.other_cpus.windows(2).all(|w| w[0].total_bytes < w[1].total_bytes), "{v:?}");
        assert!(v.other_cpus[0].total_bytes > v.total_bytes);
        // A fixed size is the same everywhere.
        let fixed = node(FlowsMax::Fixed(4096), 2).report(Sizes { flows: 4096, marks: 64, replay: 64 });
        assert!(fixed.other_cpus.iter().all(|c| c.flows == 4096), "{fixed:?}");
        assert_eq!(fixed.flows_max, "4096");
    }

    #[test]
    fn the_text_names_the_total_the_large_maps_and_the_scaling() {
        let mut n = node(FlowsMax::Auto, 2);
        n.limit = Some(MemoryLimitView { bytes: 240 << 20, what: "a cgroup's limit".into() });
        let text = render(&n.report(n.configured(2)));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("kernel memory of the data path's maps on 2 CPUs: ")
                && lines[0].ends_with(" MiB (the limit here: 240.0 MiB, a cgroup's limit)"),
            "{text}"
        );
        assert!(lines
            .iter()
            .any(|l| l.starts_with("  flow_table ") && l.ends_with("65536 entries  (flows.max)")));
        assert!(lines.iter().any(|l| l.starts_with("  the others ") && l.ends_with("maps under 1 MiB)")));
        let last = lines.last().unwrap();
        assert!(
            last.starts_with("on 4/16/64 CPUs: ")
                && last.ends_with(" (flows.max auto: 65536, 32768, 8192 flows)")
        );
        // Without a limit, no word of one.
        n.limit = None;
        assert!(!render(&n.report(n.configured(2))).contains("limit"));
    }
}
