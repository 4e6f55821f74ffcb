//! The kernel's drops of the pods' packets: the drop program (`include/drop.h`, on the
//! `kfree_skb` tracepoint) is loaded with the classifier, whose maps it shares, and attached
//! beside it; here whether this kernel has it, its link, and its counts by reason.

use std::ffi::CString;

use libbpf_rs::{MapCore, MapFlags, MapMut};

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
