//! What one step of a program costs on this CPU, its mitigations included: a call of a BPF
//! function and its return, a read of packet bytes with bpf_skb_load_bytes, and a tail call,
//! each timed under test_run against the same program without it (`baseline.bpf.c`). They
//! price the data path's choices (what a stage inlines, how often it reads the payload, where
//! a program ends) and tell one CPU's ladder from another's.

use std::fmt::Write;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};
use mirror_bpf::testing::{self, fixtures, run_repeat, SkbContext};

use crate::stats::median;

/// The steps each of `tc_unit_calls` and `tc_unit_reads` takes (UNIT_STEPS in the program).
const STEPS: f64 = 8.0;

/// ns per step, medians over the runs.
pub struct Units {
    pub call_ns: f64,
    pub read_ns: f64,
    pub tail_ns: f64,
    pub runs: usize,
    pub repeat: u32,
}

/// Times each program `runs` times, `repeat` packets per test_run, interleaved.
pub fn measure(runs: usize, repeat: u32) -> Result<Units> {
    let skel = testing::empty_program()?;
    let p = &skel.progs;
    let target = p.tc_empty.as_fd().as_raw_fd() as u32;
    skel.maps
        .unit_tail_to
        .update(&0u32.to_ne_bytes(), &target.to_ne_bytes(), MapFlags::ANY)
        .context("filling the tail call's program array")?;
    let frame = fixtures::v4_request(40000, 80, b"GET /foo HTTP/1.1\r\nHost: 198.18.2.2\r\n\r\n");
    let ctx = SkbContext::default();
    let time = |prog| run_repeat(prog, &frame, ctx, repeat).2;
    let (mut call, mut read, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    time(&p.tc_unit_calls); // warm-up
    for _ in 0..runs.max(1) {
        let (inline, calls) = (time(&p.tc_unit_inline), time(&p.tc_unit_calls));
        let (empty, reads, tails) = (time(&p.tc_empty), time(&p.tc_unit_reads), time(&p.tc_unit_tail));
        call.push((calls - inline) / STEPS);
        read.push((reads - empty) / STEPS);
        tail.push(tails - empty);
    }
    Ok(Units { call_ns: median(&call), read_ns: median(&read), tail_ns: median(&tail), runs, repeat })
}

/// The "Unit costs" section of the report.
pub fn render(u: &Units) -> String {
    let mut s = String::from("\n## Unit costs on this CPU\n\n");
    let _ = writeln!(
        s,
        "Each step timed under test_run ({} packets per run, median of {} runs) against the same \
         program without it (`baseline.bpf.c`); the kernel reports whole ns per packet, so a \
         step taken {STEPS} times is good to about {:.2} ns and the tail call to 1 ns. Reads come \
         from the linear area here: TCP payload on a veth sits in page fragments and costs more \
         to read.\n",
        u.repeat,
        u.runs,
        1.0 / STEPS
    );
    let _ = writeln!(s, "| step | ns |");
    let _ = writeln!(s, "|---|---:|");
    let _ = writeln!(s, "| a call of a BPF function, and its return | {:.1} |", u.call_ns);
    let _ = writeln!(s, "| a read of 16 packet bytes (bpf_skb_load_bytes) | {:.1} |", u.read_ns);
    let _ = writeln!(s, "| a tail call | {:.0} |", u.tail_ns);
    s
}
