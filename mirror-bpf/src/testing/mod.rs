//! Helpers for tests and benchmarks that run the classifier: loading, `BPF_PROG_TEST_RUN`,
//! privileges, throwaway network namespaces, the shared test addresses, and the fixtures that
//! both the tests and the data-path benchmark run (with the rig that runs them).

pub mod bed;
pub mod consts;
pub mod dns;
pub mod fixtures;
pub mod fuzz;
pub mod h2;
pub mod packet;
pub mod reference;
pub mod rig;

use std::mem::MaybeUninit;
use std::process::Command;

use libbpf_rs::{OpenObject, ProgramInput, ProgramMut};

use crate::datapath::{Datapath, DatapathOptions};
use crate::shared::types;

/// The verdict of every entry point but the mirred ones: "continue" (TC_ACT_UNSPEC / TCX_NEXT).
pub const VERDICT_CONTINUE: u32 = u32::MAX;

/// True when the tests run in CI (`CI=true`): missing privileges then fail instead of skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether this process may load BPF and create namespaces. Without root it fails in CI and
/// returns false elsewhere, after saying that the test did not run.
#[track_caller]
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let here = std::panic::Location::caller();
    assert!(!in_ci(), "{here}: this test needs root (BPF, netns) and CI=true forbids skipping it");
    eprintln!("NOT RUN ({here}): needs root");
    false
}

/// Loads the classifier for a test (its object lives as long as the process).
pub fn load(opts: &DatapathOptions) -> Datapath<'static> {
    let storage = Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit()));
    Datapath::load(storage, opts).unwrap_or_else(|e| panic!("loading the classifier: {e}"))
}

/// Loads the empty programs, the baseline every per-packet cost is compared with: `tc_empty`
/// for test_run and clsact, `tcx_empty_ingress`/`tcx_empty_egress` for TCX links (its object
/// lives as long as the process).
pub fn empty_program() -> crate::error::Result<crate::skel::baseline::BaselineSkel<'static>> {
    use crate::error::Context;
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    let storage = Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit()));
    let mut open = crate::skel::baseline::BaselineSkelBuilder::default()
        .open(storage)
        .context(|| "opening the empty program".into())?;
    crate::flow::size_cache(&mut open.maps.flow_cache)?;
    open.load().context(|| "loading the empty program".into())
}

/// A `__sk_buff` context for test_run.
#[derive(Debug, Clone, Copy, Default)]
pub struct SkbContext {
    /// skb->ifindex (must exist in the caller's netns; 0 = loopback).
    pub ifindex: u32,
    /// skb->skb_iif.
    pub ingress_ifindex: u32,
}

/// A flow key's bytes, as the maps take them.
pub fn key_bytes(key: &types::flow_key) -> &[u8] {
    crate::shared::bytes_of(key)
}

/// The flow_timing slot that the flow of `key` owns, if any.
pub fn timing_slot(dp: &Datapath<'_>, key: &types::flow_key) -> Option<u32> {
    use libbpf_rs::{MapCore, MapFlags};
    let v = dp.skel().maps.flow_timing_index.lookup(key_bytes(key), MapFlags::ANY).ok()??;
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

/// Changes the shared entry (flow_timing slot) of the flow of `key` with `change`, as a state
/// the classifier could be in but a test cannot bring it to with packets alone (two CPUs at
/// once). Returns the entry as it was, or `None` when the flow has none.
pub fn change_timing(
    dp: &Datapath<'_>,
    key: &types::flow_key,
    change: impl FnOnce(&mut types::flow_timing),
) -> Result<Option<types::flow_timing>, libbpf_rs::Error> {
    use libbpf_rs::{MapCore, MapFlags};
    let m = &dp.skel().maps;
    let Some(slot) = timing_slot(dp, key) else { return Ok(None) };
    let Some(bytes) = m.flow_timing.lookup(&slot.to_ne_bytes(), MapFlags::ANY)? else { return Ok(None) };
    let was: types::flow_timing = crate::shared::read_plain(&bytes);
    let mut now = was;
    change(&mut now);
    m.flow_timing.update(&slot.to_ne_bytes(), crate::shared::bytes_of(&now), MapFlags::ANY)?;
    Ok(Some(was))
}

/// Gives back the flow_timing slot the flow of `key` owns, if any (the slot zeroed, its index
/// entry deleted).
pub fn forget_timing(dp: &Datapath<'_>, key: &types::flow_key) -> Result<(), libbpf_rs::Error> {
    use libbpf_rs::{MapCore, MapFlags};
    let m = &dp.skel().maps;
    if let Some(slot) = timing_slot(dp, key) {
        let free = vec![0u8; std::mem::size_of::<types::flow_timing>()];
        m.flow_timing.update(&slot.to_ne_bytes(), &free, MapFlags::ANY)?;
        m.flow_timing_index.delete(key_bytes(key))?;
    }
    Ok(())
}

/// Makes the classifier forget the flow of `key`: its traffic (in the table and in every CPU's
/// cache), shared entry, tuples and mark.
pub fn forget_flow(dp: &Datapath<'_>, key: &types::flow_key) {
    use libbpf_rs::{MapCore, MapFlags};
    let m = &dp.skel().maps;
    forget_timing(dp, key).expect("freeing a flow_timing slot");
    let slots = m.flow_cache.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY).expect("reading flow_cache");
    let free = vec![0u8; std::mem::size_of::<types::flow_cache_slot>()];
    for (k, v) in slots {
        if v[..std::mem::size_of::<types::flow_key>()] == *key_bytes(key) {
            m.flow_cache.update(&k, &free, MapFlags::ANY).expect("freeing a flow_cache slot");
        }
    }
    for map in [&m.flow_table, &m.flow_nat, &m.mirror_marks] {
        // Absent already is fine.
        let _ = map.delete(key_bytes(key));
    }
    // Its DNS queries (struct dns_key: the flow key first, then the id).
    let queries: Vec<Vec<u8>> = m.dns_queries.keys().filter(|k| k.starts_with(key_bytes(key))).collect();
    for k in queries {
        let _ = m.dns_queries.delete(&k);
    }
}

/// Runs `frame` through `dp`'s tc ingress program and returns how its counters moved; the
/// verdict must be "continue" and the frame left untouched.
pub fn ingress(dp: &Datapath<'_>, frame: &[u8]) -> crate::stats::Counters {
    let before = dp.counters().expect("reading the counters");
    let (ret, out) = run(&dp.skel().progs.tc_ingress_mirror, frame, SkbContext::default());
    assert_eq!(ret, VERDICT_CONTINUE, "verdict must always be 'continue'");
    assert_eq!(out, frame, "the frame must pass untouched");
    dp.counters().expect("reading the counters").since(&before)
}

/// Runs `prog` once over `frame`; returns its verdict and the frame it left.
pub fn run(prog: &ProgramMut<'_>, frame: &[u8], ctx: SkbContext) -> (u32, Vec<u8>) {
    let (ret, out, _) = run_repeat(prog, frame, ctx, 1);
    (ret, out)
}

/// Runs `prog` `repeat` times over `frame`; returns the verdict, the frame and ns per run.
// ProgramInput is non-exhaustive: it can only be built from its default.
#[allow(clippy::field_reassign_with_default)]
pub fn run_repeat(prog: &ProgramMut<'_>, frame: &[u8], ctx: SkbContext, repeat: u32) -> (u32, Vec<u8>, f64) {
    try_run_repeat(prog, frame, ctx, repeat).unwrap_or_else(|e| {
        panic!("test_run of {} on {} bytes: {e}", prog.name().to_string_lossy(), frame.len())
    })
}

/// [`run_repeat`], or the kernel's refusal of the run (a frame BPF_PROG_TEST_RUN cannot make
/// an skb of).
#[allow(clippy::field_reassign_with_default)]
pub fn try_run_repeat(
    prog: &ProgramMut<'_>,
    frame: &[u8],
    ctx: SkbContext,
    repeat: u32,
) -> libbpf_rs::Result<(u32, Vec<u8>, f64)> {
    // Built byte by byte: the kernel refuses any non-zero byte outside the few fields it
    // accepts, padding included.
    use std::mem::offset_of;
    let mut ctx_bytes = vec![0u8; std::mem::size_of::<types::__sk_buff>()];
    let mut put = |off: usize, v: u32| ctx_bytes[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    put(offset_of!(types::__sk_buff, ifindex), ctx.ifindex);
    put(offset_of!(types::__sk_buff, ingress_ifindex), ctx.ingress_ifindex);
    // The kernel refuses a wire length below the frame's.
    put(offset_of!(types::__sk_buff, wire_len), frame.len() as u32);
    let mut out = vec![0u8; frame.len() + 256];
    let mut input = ProgramInput::default();
    input.data_in = Some(frame);
    input.data_out = Some(&mut out);
    input.context_in = Some(&mut ctx_bytes);
    input.repeat = repeat;
    let output = prog.test_run(input)?;
    let ret = output.return_value;
    let ns = output.duration.as_nanos() as f64;
    let len = output.data.as_ref().map_or(0, |d| d.len());
    out.truncate(len.min(frame.len() + 256));
    Ok((ret, out, ns))
}

/// Runs a command, panicking with its output when it fails.
#[track_caller]
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Moves the calling thread into a new, anonymous network namespace: what the test creates in
/// it (and in processes it starts) disappears when the thread ends. Loopback is brought up.
pub fn enter_private_netns() {
    // SAFETY: unshare only changes the calling thread's namespace.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    sh("ip link set lo up");
}

/// Pins the calling thread to `cpu`: what the classifier keeps per CPU (flow table entries,
/// what it learnt of a direction) stays in one slot, and the caches stay warm.
pub fn pin_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// ifindex of a link in the calling thread's netns.
pub fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: a valid C string; if_nametoindex reads it only.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(i, 0, "no link named {name}");
    i
}

/// Packets a link has sent and received, from netlink (via ip -s), in the caller's netns.
pub fn link_packets(name: &str) -> (u64, u64) {
    let out = sh(&format!("ip -s -o link show dev {name}"));
    // "... RX: bytes packets ... \    <rx bytes> <rx packets> ... TX: ... \    <tx bytes> <tx packets>"
    let nums: Vec<u64> = out
        .split('\\')
        .filter_map(|part| {
            let f: Vec<&str> = part.split_whitespace().collect();
            (f.len() >= 2 && f[0].parse::<u64>().is_ok()).then(|| f[1].parse().unwrap_or(0))
        })
        .collect();
    (nums.first().copied().unwrap_or(0), nums.get(1).copied().unwrap_or(0))
}
