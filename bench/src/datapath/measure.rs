//! Timing one case beside the empty program, interleaved (empty, case, empty, case ...) so that
//! drift in clock speed or in the machine's other load hits both alike.

use anyhow::{bail, ensure, Result};
use libbpf_rs::ProgramMut;
use mirror_bpf::testing::{run_repeat, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::Counters;

use super::cases::{Case, Reset, Timing, NO_FAILURES};
use super::fixture::{Fixture, Instance};
use crate::stats::median;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Iterations of one test_run (repeated cases).
    pub repeat: u32,
    /// Runs per case; the report gives their median.
    pub runs: usize,
    /// Single-packet test_runs per run of the cases timed in shots.
    pub shots: u32,
}

impl Plan {
    pub const FULL: Plan = Plan { repeat: 1_000_000, runs: 7, shots: 20_000 };
    pub const QUICK: Plan = Plan { repeat: 100_000, runs: 3, shots: 2_000 };
}

/// One run of one case: ns per packet of the case and of the empty program.
#[derive(Debug, Clone, Copy)]
pub struct RunSample {
    pub case_ns: f64,
    pub empty_ns: f64,
}

/// Trigger events drained after this many shots: well below the ring buffer's ~1,500.
const DRAIN_EVERY: u32 = 256;

/// Runs the frames that put the case's flow in the state it measures.
pub fn prime(fx: &Fixture, case: &Case) -> Result<()> {
    let inst = fx.instance(case.rules);
    for frame in &case.prime {
        run_once(inst.prog(), frame, fx.ctx)?;
    }
    Ok(())
}

/// Measures one run of `case`, checking from the counters that it took the intended path.
pub fn run(fx: &Fixture, case: &Case, plan: &Plan) -> Result<RunSample> {
    let inst = fx.instance(case.rules);
    let before = inst.counters()?;
    let sample = match case.timing {
        Timing::Repeated => repeated(fx, inst, case, plan.repeat)?,
        Timing::Shots { key, reset } => {
            let mut case_ns = Vec::with_capacity(plan.shots as usize);
            let mut empty_ns = Vec::with_capacity(plan.shots as usize);
            for shot in 0..plan.shots {
                match reset {
                    Reset::Flow => inst.forget(&key)?,
                    Reset::Stream | Reset::StreamAndMark => inst.rewind(&key)?,
                }
                let s = repeated(fx, inst, case, 1)?;
                if reset == Reset::StreamAndMark {
                    inst.unmark(&key)?;
                }
                if shot % DRAIN_EVERY == 0 {
                    inst.drain_events()?;
                }
                case_ns.push(s.case_ns);
                empty_ns.push(s.empty_ns);
            }
            inst.drain_events()?;
            RunSample { case_ns: median(&case_ns), empty_ns: median(&empty_ns) }
        }
    };
    check_path(case, &inst.counters()?.since(&before))?;
    Ok(sample)
}

fn repeated(fx: &Fixture, inst: &Instance, case: &Case, repeat: u32) -> Result<RunSample> {
    let (_, _, empty_ns) = run_repeat(fx.baseline(), &case.frame, fx.ctx, repeat);
    let (verdict, _, case_ns) = run_repeat(inst.prog(), &case.frame, fx.ctx, repeat);
    ensure!(verdict == VERDICT_CONTINUE, "{}: verdict {verdict}, not continue", case.name);
    Ok(RunSample { case_ns, empty_ns })
}

fn run_once(prog: &ProgramMut<'_>, frame: &[u8], ctx: SkbContext) -> Result<()> {
    let (verdict, _, _) = run_repeat(prog, frame, ctx, 1);
    ensure!(verdict == VERDICT_CONTINUE, "priming: verdict {verdict}, not continue");
    Ok(())
}

/// Whether the counters of a run show the path the case is meant to measure.
fn check_path(case: &Case, delta: &Counters) -> Result<()> {
    let e = &case.expect;
    let name = |idx| {
        let i = mirror_bpf::stats::COUNTER_NAMES.iter().find(|(s, _)| *s == idx);
        i.map_or("?", |(_, n)| *n)
    };
    for &idx in e.grows {
        if delta.get(idx) == 0 {
            bail!(
                "{} ({} rules): counter {} did not grow: not the path meant",
                case.name,
                case.rules,
                name(idx)
            );
        }
    }
    for &idx in e.stays.iter().chain(&NO_FAILURES) {
        if delta.get(idx) != 0 {
            bail!(
                "{} ({} rules): counter {} grew by {}: not the path meant",
                case.name,
                case.rules,
                name(idx),
                delta.get(idx)
            );
        }
    }
    Ok(())
}
