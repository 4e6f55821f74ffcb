//! Benchmarks of the mirror. `mirror-bench datapath [--quick] [--out FILE]` measures the
//! classifier's cost per packet against the empty tc program (needs root).

mod cli;
mod datapath;
mod host;
mod report;
mod stats;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};

use datapath::Plan;
use host::Host;

fn main() -> ExitCode {
    match cli::parse(std::env::args().skip(1)) {
        Ok(cli::Command::Help) => println!("{}", cli::USAGE),
        Ok(cli::Command::Datapath { quick, out }) => {
            if let Err(e) = run_datapath(quick, out.as_deref()) {
                eprintln!("mirror-bench: {e:#}");
                return ExitCode::FAILURE;
            }
        }
        Err(e) => {
            eprintln!("mirror-bench: {e}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

fn run_datapath(quick: bool, out: Option<&Path>) -> Result<()> {
    if !mirror_bpf::testing::require_root() {
        anyhow::bail!("the data-path benchmark needs root (BPF_PROG_TEST_RUN, network namespaces)");
    }
    let plan = if quick { Plan::QUICK } else { Plan::FULL };
    let host = Host::probe();
    // The last CPU: the first one takes most of the interrupts.
    let cpu = host.cores.saturating_sub(1);
    let rows = datapath::run(plan, cpu)?;
    let checks = report::checks(&rows);
    let mut command = String::from("cargo run --release -p mirror-bench -- datapath");
    if quick {
        command.push_str(" --quick");
    }
    if let Some(out) = out {
        command.push_str(&format!(" --out {}", out.display()));
    }
    let header = report::Header {
        title: "Data-path micro-benchmark",
        host: &host,
        settings: vec![
            (
                "mode",
                if quick { "quick (smoke test: numbers are indicative only)".into() } else { "full".into() },
            ),
            (
                "repeat",
                format!(
                    "{} packets per test_run, {} runs per case; median of the runs",
                    plan.repeat, plan.runs
                ),
            ),
            ("pinned to CPU", cpu.to_string()),
            ("command", format!("`{command}`")),
        ],
        method: vec![
            "Each case is one packet run through `tc_ingress_mirror` with BPF_PROG_TEST_RUN; \
             its flow is brought to the needed state first (flow created, request seen, or flow \
             marked). In every run the empty tc program is timed on the same frame just before \
             the case (empty, case, empty, case ...), and the ratio is the median over runs of \
             case/empty within a run, so that drift between runs cancels. Counters are checked \
             after every run to prove the case took the intended path (and that no copy, \
             event or insert failed). The kernel reports whole ns per packet (rounded down): \
             on an empty program of about 20 ns that is up to 5% in the ratio, so the rule-count \
             bar compares the ns of the two rule counts measured in the same run instead."
                .into(),
            "Rules: the global `status=500 packets=0 bytes=0 duration=0`, plus port-scoped \
             `port=N status=500` rules (N from 1000) up to the count shown; responses come from \
             port 80, so they miss every port-scoped rule. Mirror copies go to one end of a \
             veth pair whose peer is up, in a private network namespace."
                .into(),
            datapath::trigger_method(&plan),
        ],
    };
    let text = report::render(&header, &rows, &checks);
    println!("{text}");
    if let Some(out) = out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("written to {}", out.display());
    }
    Ok(())
}
