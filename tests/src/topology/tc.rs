//! The tc state of an interface as `tc` shows it, and foreign filters that count packets:
//! what attach and detach must leave alone. This kernel has only the u32 and bpf classifiers
//! and the mirred action, so a foreign filter counts with a mirred copy to a spare veth.

use std::collections::BTreeSet;

use mirror_bpf::attach::TC_HANDLE;

use crate::topology::netns::Netns;

/// A clsact hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Ingress.
    Ingress,
    /// Egress.
    Egress,
}

impl Hook {
    /// Both hooks.
    pub const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    fn name(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

/// Priority of the foreign filters.
pub const FOREIGN_PRIO: u16 = 100;
/// Where foreign filters copy the packets they count.
const FOREIGN_SINK: &str = "fgn0";

/// `tc -s filter show` of one hook.
pub fn filters(ns: &Netns, dev: &str, hook: Hook) -> String {
    ns.sh(&format!("tc -s filter show dev {dev} {}", hook.name()))
}

/// The priorities in use on one hook.
pub fn prios(ns: &Netns, dev: &str, hook: Hook) -> BTreeSet<u16> {
    filters(ns, dev, hook)
        .lines()
        .filter_map(|l| l.strip_prefix("filter "))
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "pref").nth(1)?.parse().ok())
        .collect()
}

/// Whether one of our filters (our handle) is on the hook.
pub fn has_ours(ns: &Netns, dev: &str, hook: Hook) -> bool {
    filters(ns, dev, hook).contains(&format!("handle {TC_HANDLE:#x} "))
}

/// Whether the interface has a clsact qdisc.
pub fn has_clsact(ns: &Netns, dev: &str) -> bool {
    ns.sh(&format!("tc qdisc show dev {dev}")).contains("qdisc clsact")
}

/// Adds clsact and, at priority [`FOREIGN_PRIO`], a classic-bytecode bpf filter (the kind of
/// ours, with another handle) at ingress and a u32 filter at egress; each matches every
/// packet and counts it with a mirred copy.
pub fn add_foreign_filters(ns: &Netns, dev: &str) {
    let mirror = format!("action mirred egress mirror dev {FOREIGN_SINK} continue");
    ns.sh(&format!(
        "ip link add {FOREIGN_SINK} type veth peer name fgn1 && ip link set {FOREIGN_SINK} up && ip link set fgn1 up \
         && tc qdisc add dev {dev} clsact \
         && tc filter add dev {dev} ingress prio {FOREIGN_PRIO} bpf bytecode '1,6 0 0 4294967295,' {mirror} \
         && tc filter add dev {dev} egress prio {FOREIGN_PRIO} u32 match u32 0 0 {mirror}"
    ));
}

/// Packets counted by the foreign filter of a hook; panics unless it is there.
#[track_caller]
pub fn foreign_packets(ns: &Netns, dev: &str, hook: Hook) -> u64 {
    let text = filters(ns, dev, hook);
    assert!(
        text.contains(&format!("pref {FOREIGN_PRIO} ")),
        "the foreign filter of {dev} {hook:?} is gone:\n{text}"
    );
    // "Sent 1234 bytes 10 pkt (dropped 0, ...)", once per action.
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Sent "))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum()
}
