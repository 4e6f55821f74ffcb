//! Timing one case beside the empty program, interleaved (empty, case, empty, case ...) so that
//! drift in clock speed or in the machine's other load hits both alike; and what the cases run
//! against.

use anyhow::{anyhow, ensure, Result};
use libbpf_rs::ProgramMut;
use mirror_bpf::skel::baseline::BaselineSkel;
use mirror_bpf::testing::fixtures::{Fixture, Repeat};
use mirror_bpf::testing::rig::{self, Primed, Rig};
use mirror_bpf::testing::{self, run_repeat, VERDICT_CONTINUE};

use crate::stats::median;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Iterations of one test_run (the cases that repeat as they are).
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

/// One fixture under one rule count.
#[derive(Debug, Clone)]
pub struct Case {
    pub fx: Fixture,
    pub rules: u32,
}

/// One run of one case: ns per packet of the case and of the empty program.
#[derive(Debug, Clone, Copy)]
pub struct RunSample {
    pub case_ns: f64,
    pub empty_ns: f64,
}

/// Trigger events drained after this many shots: well below the ring buffer's ~1,500.
const DRAIN_EVERY: u32 = 256;

/// Everything the cases run against, in the calling thread's network namespace (which must be
/// private: links are created in it): the empty tc program and one classifier per rule count
/// (so that cases with different rule sets can be interleaved), copying to a veth.
pub struct Bed {
    baseline: BaselineSkel<'static>,
    rigs: Vec<Rig>,
}

impl Bed {
    pub fn new(rule_counts: &[u32]) -> Result<Self> {
        let mirror = rig::mirror_veth();
        let rigs = rule_counts.iter().map(|&n| Rig::new(n, mirror)).collect();
        Ok(Bed { baseline: testing::empty_program()?, rigs })
    }

    fn rig(&self, rules: u32) -> &Rig {
        self.rigs.iter().find(|r| r.rules == rules).expect("a classifier per rule count")
    }

    /// Decides the case's fixture once, as the tests do, which leaves its flow primed.
    pub fn prime(&self, case: Case) -> Result<(Case, Primed)> {
        let primed =
            self.rig(case.rules).decide(&case.fx).map_err(|e| anyhow!("{e} ({} rules)", case.rules))?;
        Ok((case, primed))
    }

    /// Measures one run of a case, checking from the counters that every packet of it took the
    /// fixture's decision.
    pub fn run(&self, (case, primed): &(Case, Primed), plan: &Plan) -> Result<RunSample> {
        let (fx, rig) = (&case.fx, self.rig(case.rules));
        let before = rig.counters();
        let (sample, packets) = if fx.repeat == Repeat::AsIs {
            (self.pair(rig, fx, plan.repeat)?, plan.repeat)
        } else {
            let mut case_ns = Vec::with_capacity(plan.shots as usize);
            let mut empty_ns = Vec::with_capacity(plan.shots as usize);
            for shot in 0..plan.shots {
                rig.reset(fx, primed).map_err(anyhow::Error::msg)?;
                let s = self.pair(rig, fx, 1)?;
                if shot % DRAIN_EVERY == 0 {
                    rig.drain_events();
                }
                case_ns.push(s.case_ns);
                empty_ns.push(s.empty_ns);
            }
            rig.drain_events();
            (RunSample { case_ns: median(&case_ns), empty_ns: median(&empty_ns) }, plan.shots)
        };
        rig::check(fx, &rig.counters().since(&before), packets.into())
            .map_err(|e| anyhow!("{e} ({} rules): not the path meant", case.rules))?;
        Ok(sample)
    }

    /// The empty program, then the case, each `repeat` times over the frame.
    fn pair(&self, rig: &Rig, fx: &Fixture, repeat: u32) -> Result<RunSample> {
        let (_, _, empty_ns) = run_repeat(self.baseline(), &fx.frame, rig.ctx, repeat);
        let (verdict, _, case_ns) = run_repeat(rig.prog(), &fx.frame, rig.ctx, repeat);
        ensure!(verdict == VERDICT_CONTINUE, "{}: verdict {verdict}, not continue", fx.name);
        Ok(RunSample { case_ns, empty_ns })
    }

    fn baseline(&self) -> &ProgramMut<'static> {
        &self.baseline.progs.tc_empty
    }
}
