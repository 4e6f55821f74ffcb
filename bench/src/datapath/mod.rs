//! The data-path benchmark: ns/packet of the classifier per case with BPF_PROG_TEST_RUN,
//! beside the empty tc program measured in the same run.

mod cases;
mod fixture;
pub mod loads;
mod measure;

use anyhow::{Context, Result};
use mirror_bpf::testing;

pub use measure::Plan;

use crate::host;
use crate::report::Row;
use cases::Case;
use fixture::Fixture;
use measure::RunSample;

/// How the trigger case is timed, for the report.
pub fn trigger_method(plan: &Plan) -> String {
    format!(
        "A repeated 500 response would find its flow already marked after the first iteration, \
         so the trigger is timed as {} single-packet test_runs per run (each preceded by the empty \
         program, also run alone, and followed by deleting the flow's mark from user space); a \
         run's value is the median of its samples. Single-packet timings include the kernel's \
         clock reads around the program, so this row's ratio is lower than the same work \
         repeated would show.",
        plan.shots
    )
}

/// Measures every case; runs in a thread of its own, in a private network namespace.
pub fn run(plan: Plan, cpu: usize) -> Result<Vec<Row>> {
    std::thread::spawn(move || {
        testing::enter_private_netns();
        host::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
        measure_all(&plan)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn measure_all(plan: &Plan) -> Result<Vec<Row>> {
    let fx = Fixture::new(&cases::RULE_COUNTS)?;
    let cases = cases::all();
    for case in &cases {
        measure::prime(&fx, case)?;
    }
    // One run at a tenth of the plan, discarded: warms caches, JIT images and map entries.
    let warm = Plan { repeat: (plan.repeat / 10).max(1), runs: 1, shots: (plan.shots / 10).max(1) };
    for case in &cases {
        measure::run(&fx, case, &warm)?;
    }
    // Cases inside runs, not runs inside cases: a slow stretch of the machine spreads over
    // every case instead of landing on one.
    let mut samples: Vec<Vec<RunSample>> = vec![Vec::with_capacity(plan.runs); cases.len()];
    for run in 0..plan.runs {
        eprintln!("run {}/{}", run + 1, plan.runs);
        for (case, s) in cases.iter().zip(&mut samples) {
            s.push(measure::run(&fx, case, plan)?);
        }
    }
    Ok(cases.iter().zip(&samples).map(|(c, s)| row(c, s)).collect())
}

fn row(case: &Case, samples: &[RunSample]) -> Row {
    Row::from_samples(case.name, case.rules, case.quiet, samples.iter().map(|s| (s.case_ns, s.empty_ns)))
}
