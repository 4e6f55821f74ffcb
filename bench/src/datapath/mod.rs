//! The data-path benchmark: ns/packet of the classifier on the path fixtures of the BPF tests
//! (`mirror_bpf::testing::fixtures::paths`) with BPF_PROG_TEST_RUN, beside the empty tc program
//! measured in the same run.

pub mod loads;
mod measure;
pub mod timers;
pub mod units;

use anyhow::{Context, Result};
use mirror_bpf::testing::rig::{FIRST_RULE_PORT, RULE};
use mirror_bpf::testing::{self, fixtures};

pub use measure::Plan;

use crate::report::Row;
use measure::{Bed, Case, RunSample};

/// Rule counts measured for the fixtures with a response; the others run with the first.
const RULE_COUNTS: [u32; 3] = [1, 100, 10_000];

/// How the cases are measured, for the report.
pub fn method(plan: &Plan) -> Vec<String> {
    vec![
        "Each case is a path fixture of the BPF tests (`mirror_bpf::testing::fixtures::paths`): \
         one packet run through `tc_ingress_mirror` with BPF_PROG_TEST_RUN, after the fixture's \
         setup frames brought its flow to the needed state (flow created, request seen, or flow \
         marked), and decided once as the tests decide it before it is timed. In every run the \
         empty tc program is timed on the same frame just before the case (empty, case, empty, \
         case ...), and the ratio is the median over runs of case/empty within a run, so that \
         drift between runs cancels. Counters are checked after every run to prove that every \
         packet took the fixture's decision (flow created or not, conntrack asked, HTTP \
         messages, trigger, copy) and that no copy, event or insert failed. The kernel reports \
         whole ns per packet (rounded down): on an empty program of about 20 ns that is up to \
         5% in the ratio, so the rule-count bar compares the ns of the two rule counts measured \
         in the same run instead."
            .into(),
        format!(
            "Rules: the fixtures' `{RULE}`, plus port-scoped `port=N status=500` rules (N from \
             {FIRST_RULE_PORT}) up to the count shown; responses come from port 80, so they miss \
             every port-scoped rule. Mirror copies go to one end of a veth pair whose peer is up, \
             in a private network namespace."
        ),
        format!(
            "The classifier follows each direction's byte stream, so a repeated request or \
             response would be a retransmission of what it already read, a repeated 500 would \
             find its flow already marked and a repeated first packet its flow created: those \
             cases are timed as {} single-packet test_runs per run, each preceded by the empty \
             program, also run alone, and by putting the flow back from user space (its shared \
             entry of streams and pending requests, and its mark, as the fixture's setup left \
             them; a new flow's entries deleted); a run's value is the median of its samples. \
             Single-packet timings include the kernel's clock reads around the program, so these \
             rows' ratios are lower than the same work repeated would show.",
            plan.shots
        ),
    ]
}

/// Measures every case; runs in a thread of its own, in a private network namespace.
pub fn run(plan: Plan, cpu: usize) -> Result<Vec<Row>> {
    std::thread::spawn(move || {
        testing::enter_private_netns();
        testing::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
        measure_all(&plan)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The path fixtures in report order, those with a response under every rule count.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for fx in fixtures::paths() {
        let counts = if fx.expect.responses > 0 { &RULE_COUNTS[..] } else { &RULE_COUNTS[..1] };
        out.extend(counts.iter().map(|&rules| Case { fx: fx.clone(), rules }));
    }
    out
}

fn measure_all(plan: &Plan) -> Result<Vec<Row>> {
    let bed = Bed::new(&RULE_COUNTS)?;
    // Each case decided once as the tests decide it, which primes its flow.
    let primed = cases().into_iter().map(|c| bed.prime(c)).collect::<Result<Vec<_>>>()?;
    // One run at a tenth of the plan, discarded: warms caches, JIT images and map entries.
    let warm = Plan { repeat: (plan.repeat / 10).max(1), runs: 1, shots: (plan.shots / 10).max(1) };
    for case in &primed {
        bed.run(case, &warm)?;
    }
    // Cases inside runs, not runs inside cases: a slow stretch of the machine spreads over
    // every case instead of landing on one.
    let mut samples: Vec<Vec<RunSample>> = vec![Vec::with_capacity(plan.runs); primed.len()];
    for run in 0..plan.runs {
        eprintln!("run {}/{}", run + 1, plan.runs);
        for (case, s) in primed.iter().zip(&mut samples) {
            s.push(bed.run(case, plan)?);
        }
    }
    Ok(primed
        .iter()
        .zip(&samples)
        .map(|((c, _), s)| {
            Row::from_samples(&c.fx.name, c.rules, c.fx.quiet(), s.iter().map(|s| (s.case_ns, s.empty_ns)))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_cases_cover_every_rule_count() {
        let cases = cases();
        for name in ["HTTP 200 response, no rule", "HTTP 500 response, trigger"] {
            let rules: Vec<u32> = cases.iter().filter(|c| c.fx.name == name).map(|c| c.rules).collect();
            assert_eq!(rules, RULE_COUNTS);
        }
        assert_eq!(cases.len(), fixtures::paths().len() + 2 * (RULE_COUNTS.len() - 1));
    }
}
