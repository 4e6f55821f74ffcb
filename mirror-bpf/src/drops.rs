//! The kernel's drops of the pods' packets: the drop program (`include/drop.h`, on the
//! `kfree_skb` tracepoint) is loaded with the classifier, whose maps it shares, and attached
//! beside it; here whether this kernel has it, its link, and its counts by reason and by pod.

use std::ffi::CString;

use libbpf_rs::{MapCore, MapFlags, MapMut};
use std::collections::BTreeMap;

use crate::error::{Context, Result};
use crate::rule::drop::{reasons, DROP_REASONS};
use crate::shared::{read_plain, types};

/// Whether this kernel can run the drop program: the `kfree_skb` tracepoint with a drop reason
/// (5.17+, with BTF); else why not.
pub fn supported() -> std::result::Result<(), String> {
    let name = CString::new("kfree_skb").expect("no NUL");
    // SAFETY: a NUL-terminated name; libbpf only reads the kernel's BTF.
    let tp = unsafe { libbpf_sys::libbpf_find_vmlinux_btf_id(name.as_ptr(), libbpf_sys::BPF_TRACE_RAW_TP) };
    if tp <= 0 {
        return Err("the kernel's BTF has no kfree_skb tracepoint".into());
    }
    if reasons().is_empty() {
        return Err("the kernel names no drop reasons (enum skb_drop_reason: 5.17+)".into());
    }
    Ok(())
}

/// The pods' packets the kernel dropped, by reason, summed over CPUs: (reason, count) for the
/// reasons counted; reason 0 holds those of a subsystem (their values above the core's).
pub type DropCounts = Vec<(u16, u64)>;

/// Reads `drop_counts`.
pub(crate) fn read_counts(map: &MapMut<'_>) -> Result<DropCounts> {
    let per_cpu =
        map.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).context(|| "reading drop_counts".into())?;
    let mut sum = vec![0u64; usize::from(DROP_REASONS)];
    for b in per_cpu.unwrap_or_default() {
        let c: types::drop_counts = read_plain(&b);
        for (s, v) in sum.iter_mut().zip(c.v.iter()) {
            *s += v;
        }
    }
    Ok(sum.into_iter().enumerate().filter(|(_, n)| *n != 0).map(|(r, n)| (r as u16, n)).collect())
}

/// The pods' packets the kernel dropped, by pod and reason, summed over CPUs: (ifindex of the
/// pod's attached veth, 0 when no pod was found, reason as in [`DropCounts`], count), in order.
pub type PodDropCounts = Vec<(u32, u16, u64)>;

/// Reads `drop_pods`.
pub(crate) fn read_pod_counts(map: &MapMut<'_>) -> Result<PodDropCounts> {
    let mut sum: BTreeMap<(u32, u16), u64> = BTreeMap::new();
    for k in map.keys() {
        let key: types::drop_pod_key = read_plain(&k);
        // Deleted meanwhile (its interface detached): gone.
        let Some(per_cpu) = map.lookup_percpu(&k, MapFlags::ANY).context(|| "reading drop_pods".into())?
        else {
            continue;
        };
        let n: u64 = per_cpu.iter().map(|b| read_plain::<u64>(b)).sum();
        *sum.entry((key.ifindex, key.reason as u16)).or_default() += n;
    }
    Ok(sum.into_iter().filter(|(_, n)| *n != 0).map(|((i, r), n)| (i, r, n)).collect())
}

/// Deletes the counts of the pod behind `ifindex` (its interface detached), so that an index
/// given again later starts from nothing and the map keeps room for the pods there are.
pub(crate) fn forget_pod(map: &MapMut<'_>, ifindex: u32) {
    let stale: Vec<Vec<u8>> =
        map.keys().filter(|k| read_plain::<types::drop_pod_key>(k).ifindex == ifindex).collect();
    for k in stale {
        let _ = map.delete(&k);
    }
}
