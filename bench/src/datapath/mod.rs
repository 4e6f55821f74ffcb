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

/// How the cases timed in shots are timed, for the report.
pub fn shots_method(plan: &Plan) -> String {
    format!(
        "The classifier follows each direction's byte stream, so a repeated request or response \
         would be a retransmission of what it already read, and a repeated 500 would find its \
         flow already marked: the HTTP cases are timed as {} single-packet test_runs per run \
         (each preceded by the empty program, also run alone, and by rewinding the flow's \
         stream state from user space; the trigger's mark is deleted after it); a run's value is \
         the median of its samples. Single-packet timings include the kernel's clock reads \
         around the program, so these rows' ratios are lower than the same work repeated would \
         show.",
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
