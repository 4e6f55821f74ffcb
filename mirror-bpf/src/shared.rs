//! Types shared with the BPF programs. Every one is defined once, in `src/bpf/include/types.h`,
//! and reaches Rust through the skeleton; this module asserts their layout, marks them as plain
//! old data, and converts them to and from the bytes of map keys and values.

use crate::skel;

/// Types shared with the BPF programs (from `types.h`, through BTF).
pub use skel::classifier::types;

macro_rules! plain_types {
    ($($t:ident = $size:expr),* $(,)?) => {$(
        // SAFETY: repr(C) structs of integers and arrays of integers, with every padding byte
        // spelled out as a field (the size assert below fails otherwise): any bit pattern is valid.
        unsafe impl plain::Plain for types::$t {}
        const _: () = assert!(std::mem::size_of::<types::$t>() == $size);
    )*};
}

plain_types! {
    flow_key = 40,
    flow_dir_stats = 40,
    flow_traffic = 112,
    flow_cache_dir = 24,
    flow_cache_slot = 128,
    rule_action = 40,
    rule_entry = 96,
    rule_filter = 248,
    port_status_key = 8,
    mirror_mark = 112,
    ct_tuple = 36,
    flow_nat = 120,
    http_stream = 24,
    http_request = 104,
    flow_timing = 968,
    hist_key = 8,
    latency_hist = 16 + 8 * types::mirror_limits::HIST_BUCKETS.0 as usize,
    trigger_event = 936,
    replay_slot = 704,
    settings = 40,
    dns_rcode_counts = 8 * types::mirror_limits::DNS_RCODES.0 as usize,
    drop_counts = 8 * types::mirror_limits::DROP_REASONS.0 as usize,
    drop_pod_key = 8,
    budget_config = 16,
    budget_state = 40,
    counters = 8 * types::stat_idx::STAT_MAX.0 as usize,
}

// SAFETY: as above: integers only, no implicit padding (asserted).
unsafe impl plain::Plain for skel::tracing::types::net_cpu_time {}
const _: () = assert!(std::mem::size_of::<skel::tracing::types::net_cpu_time>() == 24);

/// The key of single-entry array maps (settings, counters).
pub(crate) const ZERO: [u8; 4] = 0u32.to_ne_bytes();

/// The bytes of a shared value, as a map wants them.
pub(crate) fn bytes_of<T: plain::Plain>(v: &T) -> &[u8] {
    // SAFETY: T is Plain: every byte of it is initialised (no implicit padding).
    unsafe { plain::as_bytes(v) }
}

/// A shared value read back from map bytes (which need not be aligned).
pub(crate) fn read_plain<T: plain::Plain + Default>(b: &[u8]) -> T {
    let mut v = T::default();
    plain::copy_from_bytes(&mut v, b).expect("map value has the size of its BTF type");
    v
}

/// CPUs the kernel may bring up: per-CPU maps hold a value for each.
pub fn possible_cpus() -> std::io::Result<u32> {
    libbpf_rs::num_possible_cpus().map(|n| n as u32).map_err(|e| std::io::Error::other(e.to_string()))
}
