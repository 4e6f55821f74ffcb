//! Benchmarks of the mirror (both need root): `mirror-bench datapath` measures the
//! classifier's cost per packet against the empty tc program; `mirror-bench traffic` the
//! overhead of the agent on real traffic beside no agent and the classic alternatives.

mod churn;
mod cli;
mod datapath;
mod drops;
mod host;
mod mirrorpath;
mod report;
mod stats;
mod traffic;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

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
        Ok(cli::Command::Traffic(args)) => {
            if let Err(e) = run_traffic(&args) {
                eprintln!("mirror-bench: {e:#}");
                return ExitCode::FAILURE;
            }
        }
        Ok(cli::Command::MirrorPath { quick, out, test_run, traffic, rounds }) => {
            if let Err(e) = run_mirror_path(quick, out.as_deref(), test_run, traffic, rounds) {
                eprintln!("mirror-bench: {e:#}");
                return ExitCode::FAILURE;
            }
        }
        Ok(cli::Command::Churn { quick, out, veths, rounds }) => {
            if let Err(e) = run_churn(quick, out.as_deref(), veths, rounds) {
                eprintln!("mirror-bench: {e:#}");
                return ExitCode::FAILURE;
            }
        }
        Ok(cli::Command::Drops { quick, out }) => {
            if let Err(e) = run_drops(quick, out.as_deref()) {
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

/// The command that ran this benchmark, for the report: every argument as given.
fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo run --release -p mirror-bench -- {}", args.join(" "))
}

fn run_drops(quick: bool, out: Option<&Path>) -> Result<()> {
    if !mirror_bpf::testing::require_root() {
        anyhow::bail!("the drops benchmark needs root (network namespaces, BPF)");
    }
    let (paced, flood) = if quick { (50, 10_000) } else { (500, 100_000) };
    let bins = traffic::binaries()?;
    let host = Host::probe();
    let r = drops::run(&bins.bins, paced, flood)?;
    let settings = vec![("mode", mode(quick)), ("command", format!("`{}`", command_line()))];
    let text = drops::render(&host, &settings, &r);
    println!("{text}");
    if let Some(out) = out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

fn run_churn(quick: bool, out: Option<&Path>, veths: usize, rounds: Option<usize>) -> Result<()> {
    if !mirror_bpf::testing::require_root() {
        anyhow::bail!("the churn benchmark needs root (network namespaces, BPF)");
    }
    let rounds = rounds.unwrap_or(if quick { 1 } else { 3 });
    let bins = traffic::binaries()?;
    let host = Host::probe();
    let results = churn::run(&bins.bins, veths, rounds)?;
    let settings = vec![
        ("mode", mode(quick)),
        ("bursts", format!("{rounds} per way of attaching, {veths} veths each")),
        ("command", format!("`{}`", command_line())),
    ];
    let text = churn::render(&host, &settings, &results);
    println!("{text}");
    if let Some(out) = out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
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
    let loads = datapath::loads::measure(if quick { 1 } else { 5 })?;
    let timers = datapath::timers::measure(10_000, std::time::Duration::from_secs(1))?;
    let units = datapath::units::measure(plan.runs, plan.repeat)?;
    let checks = report::checks(&rows);
    let command = command_line();
    let header = report::Header {
        title: "Data-path micro-benchmark",
        host: &host,
        settings: vec![
            ("mode", mode(quick)),
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
        method: datapath::method(&plan),
    };
    let mut text = report::render(&header, &rows, &checks);
    text.push_str(&datapath::loads::render(&loads));
    text.push_str(&datapath::timers::render(&timers));
    text.push_str(&datapath::units::render(&units));
    publish(&text, out)
}

/// The report's "mode" line.
fn mode(quick: bool) -> String {
    if quick { "quick (smoke test: numbers are indicative only)" } else { "full" }.into()
}

fn run_mirror_path(
    quick: bool,
    out: Option<&Path>,
    test_run: bool,
    traffic: bool,
    rounds: Option<usize>,
) -> Result<()> {
    if !mirror_bpf::testing::require_root() {
        anyhow::bail!("the mirror-path benchmark needs root (BPF, network namespaces, perf)");
    }
    let mut plan = if quick { mirrorpath::Plan::QUICK } else { mirrorpath::Plan::FULL };
    if let Some(n) = rounds {
        plan.traffic.rounds = n;
    }
    let host = Host::probe();
    // The last CPU runs the load (the first takes most interrupts); the first one the rest.
    let cpu = host.cores.saturating_sub(1);
    let other = if cpu > 0 { 0 } else { cpu };
    let tr = test_run.then(|| mirrorpath::testrun::run(plan.test_run, cpu)).transpose()?;
    let tf = traffic.then(|| mirrorpath::traffic::run(plan.traffic, cpu, other)).transpose()?;
    // The variants chosen by the environment are part of the command.
    let command = match std::env::var("MIRROR_BENCH_VARIANTS") {
        Ok(v) if !v.is_empty() => format!("MIRROR_BENCH_VARIANTS={v} {}", command_line()),
        _ => command_line(),
    };
    publish(&mirrorpath::report::render(&host, &command, tr.as_ref(), tf.as_ref()), out)
}

/// Prints the report and writes it to `out`.
fn publish(text: &str, out: Option<&Path>) -> Result<()> {
    println!("{text}");
    if let Some(out) = out {
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("written to {}", out.display());
    }
    Ok(())
}

/// The full run waits for the 1-minute load average to stay below this for 30 s, at most
/// 10 minutes: other builds on a shared machine would be measured too.
const QUIET_LOAD: f64 = 0.7;
const QUIET_HOLD: Duration = Duration::from_secs(30);

fn run_traffic(args: &cli::TrafficArgs) -> Result<()> {
    if !mirror_bpf::testing::require_root() {
        anyhow::bail!("the traffic benchmark needs root (network namespaces, tc, BPF)");
    }
    let mut plan = if args.quick { traffic::Plan::quick() } else { traffic::Plan::full() };
    plan.keep_stages(&args.only);
    if let (Some(ladder), Some((load, _, _))) = (args.ladder, plan.ratio.as_mut()) {
        *load = match ladder {
            cli::LadderLoad::Http => traffic::Load::Http { errors_pct: 0 },
            cli::LadderLoad::H2 => traffic::Load::H2 { errors_pct: 0 },
            cli::LadderLoad::H2Data => traffic::Load::H2Data,
        };
    }
    let cores = Host::probe().cores.max(1);
    // On this kind of VM a wakeup across CPUs costs tens of µs and iperf3 retransmits across
    // them, so by default client and server share the last CPU (the first takes most
    // interrupts); the agent gets the first CPU the loads do not use, tcpdump is unpinned.
    let (client, server) = args.cpus.unwrap_or((cores - 1, cores - 1));
    anyhow::ensure!(client < cores && server < cores, "--cpus: this machine has {cores} CPUs");
    let agent = (0..cores).find(|c| *c != client && *c != server);
    let pins = traffic::Pinning { client, server, agent };
    let bins = traffic::binaries()?;
    // Now, when the agent was built: others may commit while the benchmark runs.
    let source = source();
    let quiet = (!args.quick && !args.no_wait)
        .then(|| traffic::wait_quiet(QUIET_LOAD, QUIET_HOLD, Duration::from_secs(600)));
    let load_start = traffic::loadavg();
    let host = Host::probe();
    let results = traffic::run(&plan, &bins.bins, pins)?;
    let load_end = traffic::loadavg();

    let command = command_line();
    let quiet_text = match quiet {
        None => "not waited for".to_string(),
        Some(q) if q.reached => {
            format!(
                "below {QUIET_LOAD} for {} s after waiting {:.0} s",
                QUIET_HOLD.as_secs(),
                q.waited.as_secs_f64()
            )
        }
        Some(q) => {
            format!(
                "not below {QUIET_LOAD} for {} s within {:.0} s: started anyway",
                QUIET_HOLD.as_secs(),
                q.waited.as_secs_f64()
            )
        }
    };
    let meta = traffic::report::Meta {
        host: &host,
        plan: &plan,
        settings: vec![
            ("mode", mode(args.quick)),
            ("runs", format!("{} rounds of {} s per configuration and load", plan.rounds, plan.secs)),
            (
                "CPU pinning",
                match agent {
                    Some(a) => format!(
                        "clients on CPU {client}, servers on CPU {server}, the agent on CPU {a} (taskset, \
                         all threads); tcpdump unpinned"
                    ),
                    None => format!(
                        "clients on CPU {client}, servers on CPU {server} (taskset); the agent and tcpdump unpinned"
                    ),
                },
            ),
            (
                "load average (1, 5, 15 min)",
                format!(
                    "{} at the start, {} at the end; quiet machine: {quiet_text}",
                    traffic::fmt_loadavg(load_start),
                    traffic::fmt_loadavg(load_end)
                ),
            ),
            ("tools", tool_versions()),
            ("source", source),
            ("command", format!("`{command}`")),
        ],
    };
    publish(&traffic::report::render(&meta, &results), args.out.as_deref())
}

/// The commit the agent and classifier were built from, and whether their sources differed
/// from it.
fn source() -> String {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).output().ok();
        out.filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else { return "unknown (not a git tree)".into() };
    let dirty =
        git(&["status", "--porcelain", "--", "mirror-bpf", "mirror-agent"]).is_some_and(|s| !s.is_empty());
    let note = if dirty { ", with uncommitted changes in mirror-bpf/ or mirror-agent/" } else { "" };
    format!("the agent and classifier measured were built from commit {head}{note}")
}

/// First lines of the load tools' versions.
fn tool_versions() -> String {
    let version = |prog: &str, arg: &str| {
        let out = std::process::Command::new(prog).arg(arg).output().ok();
        let text = out
            .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
        let line = text.as_deref().and_then(|t| t.lines().find(|l| !l.trim().is_empty())).unwrap_or("?");
        line.trim().to_string()
    };
    [("iperf3", "--version"), ("sockperf", "--version"), ("wrk", "-v"), ("nginx", "-v")]
        .iter()
        .map(|(p, a)| version(p, a))
        .collect::<Vec<_>>()
        .join("; ")
}
