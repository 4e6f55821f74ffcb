//! The traffic benchmark: real loads between network namespaces with no agent, the agent
//! passing or mirroring, and the classic alternatives (qdiscs only, a static tc mirror,
//! tcpdump), alternating run after run; then attaching at scale, and the classifier's run
//! time under load from the kernel's accounting.

mod agent;
pub mod attach;
mod bpfstats;
mod cmd;
mod configs;
mod footprint;
mod loads;
mod quiet;
pub mod report;
mod stageprof;
mod topology;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Result};

use crate::cli::Stage;
use mirror_e2e::agent::Binaries;

pub use agent::{binaries, Method};
pub use attach::AttachRun;
pub use bpfstats::ProgRun;
pub use configs::{Config, Observed};
pub use loads::{Load, Sample};
pub use quiet::{fmt_loadavg, loadavg, wait as wait_quiet};
pub use topology::Pinning;

use configs::{
    Ctx, StaticFilter, CLONE_TC, CPU, MIRRED, MIRROR, NO_AGENT, PASS, PASS_100, PASS_10K, QDISCS, STACK,
    STATIC, TCPDUMP, TIMING_OFF,
};
use loads::Load::{H2Data, Http, IperfNodeToPod, IperfPodToPod, Sockperf, H2};

/// What to measure and for how long.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Seconds per run.
    pub secs: u32,
    /// Runs of each (load, configuration); in each round every configuration runs once.
    pub rounds: usize,
    /// The loads and the configurations each runs under; the first is the baseline.
    pub cells: Vec<(Load, Vec<Config>)>,
    /// Veth counts of the attach measurement, and how often each is measured.
    pub veth_counts: Vec<usize>,
    pub attach_reps: usize,
    /// Runs with the kernel's BPF run-time accounting on.
    pub profiles: Vec<(Load, Config)>,
    /// The headline: the classifier's run time under a load against the empty program's on
    /// the same hooks under the same load, accounting on in both; rounds of one each.
    pub ratio: Option<(Load, Config, usize)>,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            secs: 1,
            rounds: 5,
            cells: vec![
                (
                    IperfPodToPod,
                    vec![NO_AGENT, QDISCS, PASS, STATIC, TCPDUMP, MIRRED, TIMING_OFF, STACK, CPU],
                ),
                (IperfNodeToPod, vec![NO_AGENT, QDISCS, PASS, STATIC, TCPDUMP]),
                (Sockperf, vec![NO_AGENT, QDISCS, PASS, STATIC, TCPDUMP, MIRRED]),
                (
                    Http { errors_pct: 0 },
                    vec![NO_AGENT, QDISCS, PASS, PASS_100, PASS_10K, STATIC, TCPDUMP, TIMING_OFF, STACK, CPU],
                ),
                (Http { errors_pct: 50 }, vec![NO_AGENT, MIRROR]),
                (Http { errors_pct: 100 }, vec![NO_AGENT, MIRROR, MIRRED, CLONE_TC]),
                (H2 { errors_pct: 0 }, vec![NO_AGENT, PASS]),
                (H2 { errors_pct: 100 }, vec![NO_AGENT, MIRROR]),
                (H2Data, vec![NO_AGENT, PASS]),
            ],
            veth_counts: vec![1, 100, 1000],
            attach_reps: 2,
            profiles: Self::profiles(),
            ratio: Some((Http { errors_pct: 0 }, PASS, 5)),
        }
    }

    /// Every load once, the main configurations, one round of short runs: a smoke test of the
    /// runner (each agent start costs seconds of BPF verification, so fewer agent cells).
    pub fn quick() -> Plan {
        Plan {
            secs: 5,
            rounds: 1,
            cells: vec![
                (IperfPodToPod, vec![NO_AGENT, QDISCS, PASS, STATIC, TCPDUMP]),
                (IperfNodeToPod, vec![NO_AGENT, PASS]),
                (Sockperf, vec![NO_AGENT, PASS]),
                (Http { errors_pct: 0 }, vec![NO_AGENT, PASS, PASS_100, STACK]),
                (Http { errors_pct: 50 }, vec![NO_AGENT, MIRROR]),
                (Http { errors_pct: 100 }, vec![NO_AGENT, MIRROR, MIRRED]),
                (H2 { errors_pct: 0 }, vec![NO_AGENT, PASS]),
                (H2 { errors_pct: 100 }, vec![NO_AGENT, MIRROR]),
            ],
            veth_counts: vec![1, 10],
            attach_reps: 1,
            profiles: vec![(Http { errors_pct: 100 }, MIRROR), (Http { errors_pct: 0 }, STACK)],
            ratio: Some((Http { errors_pct: 0 }, PASS, 1)),
        }
    }

    /// Drops the stages not in `only` (none dropped when it is empty).
    pub fn keep_stages(&mut self, only: &[Stage]) {
        if only.is_empty() {
            return;
        }
        if only.contains(&Stage::Bars) && !only.contains(&Stage::Loads) {
            self.cells = vec![
                (Http { errors_pct: 0 }, vec![NO_AGENT, PASS]),
                (Http { errors_pct: 100 }, vec![NO_AGENT, MIRROR]),
                (Sockperf, vec![NO_AGENT, PASS]),
            ];
            self.rounds = self.rounds.max(9);
        } else if !only.contains(&Stage::Loads) {
            self.cells.clear();
        }
        if !only.contains(&Stage::Attach) {
            self.veth_counts.clear();
        }
        if !only.contains(&Stage::Profile) {
            self.profiles.clear();
            self.ratio = None;
        }
    }

    fn profiles() -> Vec<(Load, Config)> {
        vec![
            (IperfPodToPod, PASS),
            (Sockperf, PASS),
            (Http { errors_pct: 0 }, PASS),
            (Http { errors_pct: 0 }, TIMING_OFF),
            (Http { errors_pct: 0 }, STACK),
            (Http { errors_pct: 0 }, CPU),
            (IperfPodToPod, STACK),
            (Http { errors_pct: 0 }, PASS_10K),
            (Http { errors_pct: 100 }, MIRROR),
            (Http { errors_pct: 100 }, MIRRED),
            (H2 { errors_pct: 0 }, PASS),
            (H2Data, PASS),
            (H2 { errors_pct: 100 }, MIRROR),
        ]
    }
}

/// The runs of one configuration under one load, in round order.
#[derive(Debug, Clone)]
pub struct Cell {
    pub load: Load,
    pub config: Config,
    pub runs: Vec<(Sample, Observed)>,
}

/// Program run times during one profile run.
#[derive(Debug, Clone)]
pub struct Profile {
    pub load: Load,
    pub config: Config,
    pub progs: Vec<ProgRun>,
    /// Wall-clock seconds of the load.
    pub secs: f64,
    /// Requests the load made (HTTP loads: its requests per second times its seconds).
    pub requests: Option<u64>,
}

/// A rung of the cost ladder: what runs on the hooks during one part of a ratio round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    Empty,
    Parse,
    Floor,
    Cached,
    /// The classifier with `mirror.replay_requests: 0`.
    NoReplay,
    /// The classifier as configured (replays on, the default).
    Classifier,
    /// The classifier with rules of the other kinds of trigger too (reset, noresponse, request
    /// filters), none met: what they cost the common path.
    Triggers,
    /// The classifier of another build (`MIRROR_BENCH_BEFORE_AGENT`), as configured: a change
    /// measured against the build before it, in the same rounds.
    Before,
}

impl Rung {
    /// In the order they run in a round (and are reported).
    pub const ALL: [Rung; 7] = [
        Rung::Empty,
        Rung::Parse,
        Rung::Floor,
        Rung::Cached,
        Rung::NoReplay,
        Rung::Classifier,
        Rung::Triggers,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Rung::Empty => "empty program",
            Rung::Parse => "parse only",
            Rung::Floor => "floor: parse + per-CPU LRU flow table",
            Rung::Cached => "floor with the flow cache",
            Rung::NoReplay => "classifier, replays off",
            Rung::Classifier => "classifier (replays on, the default)",
            Rung::Triggers => "classifier, + reset, noresponse>2s and filtered rules",
            Rung::Before => "classifier of the build before (MIRROR_BENCH_BEFORE_AGENT)",
        }
    }
}

/// One round of the headline ratio: each rung of the ladder under the same load for the same
/// time, one after the other.
#[derive(Debug, Clone)]
pub struct RatioRound {
    pub rungs: Vec<(Rung, Vec<ProgRun>)>,
}

/// ns per run over all the runs of `p`.
fn per_run(p: &[ProgRun]) -> f64 {
    let runs: u64 = p.iter().map(|r| r.run_cnt).sum();
    p.iter().map(|r| r.run_time_ns).sum::<u64>() as f64 / runs.max(1) as f64
}

impl RatioRound {
    /// ns per run of all of `rung`'s runs, both hooks.
    pub fn ns_per_run(&self, rung: Rung) -> f64 {
        per_run(self.of(rung))
    }

    /// The runs of one rung.
    pub fn of(&self, rung: Rung) -> &[ProgRun] {
        self.rungs.iter().find(|(r, _)| *r == rung).map_or(&[], |(_, p)| p.as_slice())
    }

    /// ns per run of all of `rung`'s runs (both hooks) over the empty program's.
    pub fn ratio_of(&self, rung: Rung) -> f64 {
        per_run(self.of(rung)) / per_run(self.of(Rung::Empty))
    }

    /// The headline: the classifier (as configured) over the empty program.
    pub fn ratio(&self) -> f64 {
        self.ratio_of(Rung::Classifier)
    }

    /// The same for the floor program: what a flow table alone costs.
    pub fn floor_ratio(&self) -> f64 {
        self.ratio_of(Rung::Floor)
    }
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct Results {
    pub cells: Vec<Cell>,
    pub attach: Vec<AttachRun>,
    pub profiles: Vec<Profile>,
    /// The headline ratio: its load and configuration, and its rounds.
    pub ratio: Option<(Load, Config, Vec<RatioRound>)>,
    /// Where the classifier's time goes under the headline's load, by stage (perf sampling).
    pub stages: Vec<stageprof::StageShare>,
    /// Load average at the start of each round.
    pub round_loads: Vec<[f64; 3]>,
    /// Per agent configuration: seconds from starting the agent to its veths attached, the
    /// first start (which adds the initial rules) and the later ones.
    pub agent_starts: Vec<(Config, Vec<f64>)>,
    /// Runs retried, and stages after the traffic runs that failed (profile, attach):
    /// reported, the rest kept.
    pub failures: Vec<String>,
    pub static_filter: &'static str,
    pub offloads: String,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM end the benchmark after the current run, through the normal error path,
/// so that every namespace, process, qdisc and pin it made is removed.
fn stop_on_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

fn check_stop() -> Result<()> {
    if STOP.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    Ok(())
}

/// Runs the whole plan.
pub fn run(plan: &Plan, bins: &Binaries, pins: Pinning) -> Result<Results> {
    stop_on_signals();
    let bed = topology::Bed::new(pins)?;
    let static_filter = StaticFilter::probe(bed.node());
    let ctx = Ctx { bed: &bed, agents: agent::Agents::new(bins, bed.node(), pins.agent), static_filter };
    let mut cells: Vec<Cell> = plan
        .cells
        .iter()
        .flat_map(|(load, cfgs)| cfgs.iter().map(|c| Cell { load: *load, config: *c, runs: Vec::new() }))
        .collect();
    let mut round_loads = Vec::new();
    let mut retries = Vec::new();
    for round in 0..plan.rounds {
        round_loads.push(loadavg());
        eprintln!("round {}/{} (load {})", round + 1, plan.rounds, fmt_loadavg(loadavg()));
        for (load, cfgs) in &plan.cells {
            // Each round starts one configuration later, so none is always first after a load
            // change; the baseline still runs in every round, beside the others.
            for i in 0..cfgs.len() {
                let cfg = cfgs[(i + round) % cfgs.len()];
                check_stop()?;
                let started = Instant::now();
                let what = || format!("{} under ({}) {}", load.name(), cfg.key, cfg.label);
                // One retry: a stall of the shared machine (an error or a harness panic) should
                // not end a half-hour benchmark; an interrupt does.
                let (sample, seen) = match attempt(|| configs::run(&cfg, &ctx, *load, plan.secs)) {
                    Ok(r) => r,
                    Err(e) => {
                        check_stop()?;
                        eprintln!("  {} failed, retrying once: {e}", what());
                        retries.push(format!("{} in round {}: {e}", what(), round + 1));
                        attempt(|| configs::run(&cfg, &ctx, *load, plan.secs))
                            .map_err(|e| anyhow::anyhow!("{}: {e}", what()))?
                    }
                };
                eprintln!(
                    "  {:<20} ({:>4}) {:<42} {} [{:.1} s]",
                    load.name(),
                    cfg.key,
                    cfg.label,
                    describe(&sample, &seen),
                    started.elapsed().as_secs_f64()
                );
                let cell = cells.iter_mut().find(|c| c.load == *load && c.config == cfg).expect("planned");
                cell.runs.push((sample, seen));
            }
        }
    }
    let mut profiles = Vec::new();
    // Retried runs are reported with the stages that failed.
    let mut failures: Vec<String> = retries.into_iter().map(|r| format!("retried: {r}")).collect();
    for (load, cfg) in &plan.profiles {
        check_stop()?;
        let what = format!("profile of {} under ({})", load.name(), cfg.key);
        if let Some((progs, secs, sample)) =
            stage(&what, &mut failures, || profile(&ctx, *load, cfg, plan.secs))
        {
            eprintln!("  {what}: {progs:?}");
            let requests = load.is_http().then(|| sample.throughput.map(|t| (t * secs) as u64)).flatten();
            profiles.push(Profile { load: *load, config: *cfg, progs, secs, requests });
        }
    }
    let mut ratio = None;
    let mut stages = Vec::new();
    if let Some((load, cfg, rounds)) = plan.ratio {
        let what = format!("classifier against the empty program under {} ({})", load.name(), cfg.key);
        // The agent of another build, measured in the same rounds (a before-and-after).
        let before_bins = std::env::var_os("MIRROR_BENCH_BEFORE_AGENT")
            .map(|agent| Binaries { agent: agent.into(), ctl: bins.ctl.clone() });
        let before = before_bins.as_ref().map(|b| Ctx {
            bed: &bed,
            agents: agent::Agents::new(b, bed.node(), pins.agent),
            static_filter: ctx.static_filter,
        });
        let mut done = Vec::new();
        for round in 0..rounds {
            check_stop()?;
            if let Some(r) =
                stage(&what, &mut failures, || ratio_round(&ctx, before.as_ref(), load, &cfg, plan.secs))
            {
                let ladder: Vec<String> = r
                    .rungs
                    .iter()
                    .map(|&(g, _)| {
                        let ingress = bpfstats::hook_total(r.of(g), "ingr").ns_per_run();
                        format!("{} {ingress:.0} ns in, {:.2}x", g.label(), r.ratio_of(g))
                    })
                    .collect();
                eprintln!("  {what}, round {}: {}", round + 1, ladder.join("; "));
                done.push(r);
            }
        }
        ratio = Some((load, cfg, done));
        let what = format!("stage profile under {} ({})", load.name(), cfg.key);
        if !stageprof::available() {
            failures.push(format!("{what}: perf is not installed"));
        } else if let Some(s) = stage(&what, &mut failures, || stage_profile(&ctx, load, &cfg, plan.secs)) {
            stages = s;
        }
    }
    let offloads = bed.offloads();
    let agent_starts = start_times(&ctx.agents.start_times(), &plan.cells);
    drop(ctx);
    drop(bed);
    let mut attach = Vec::new();
    for rep in 0..plan.attach_reps {
        for &n in &plan.veth_counts {
            for method in attach::METHODS {
                check_stop()?;
                let what = format!("attaching to {n} veths ({method:?})");
                if let Some(run) = stage(&what, &mut failures, || attach::measure(bins, n, method)) {
                    eprintln!(
                        "  attach {n} veths, {} (rep {}): created in {:.3} s, all attached in {:.3} s, \
                         p50 {:.2} ms, all forgotten in {:.3} s",
                        run.mode,
                        rep + 1,
                        run.create_s,
                        run.all_attached_s,
                        run.p50_ms,
                        run.all_gone_s
                    );
                    attach.push(run);
                }
            }
        }
    }
    Ok(Results {
        cells,
        attach,
        profiles,
        ratio,
        stages,
        round_loads,
        agent_starts,
        failures,
        static_filter: static_filter.describe(),
        offloads,
    })
}

/// Runs `f`, turning its error or panic (the harness panics on a failed command; its guards
/// clean up while unwinding) into text.
fn attempt<T>(f: impl FnOnce() -> Result<T>) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())),
    }
}

/// Runs a stage after the traffic runs; its failure is recorded in `failures` instead of
/// losing the whole report.
fn stage<T>(what: &str, failures: &mut Vec<String>, f: impl FnOnce() -> Result<T>) -> Option<T> {
    let error = match attempt(f) {
        Ok(v) => return Some(v),
        Err(e) => e,
    };
    // The first line: agent logs can follow.
    let first = error.lines().next().unwrap_or("").to_string();
    eprintln!("  {what} FAILED: {error}");
    failures.push(format!("{what}: {first}"));
    None
}

/// Start times by configuration: the first configuration planned with each agent spec.
fn start_times(
    by_spec: &[(agent::AgentSpec, Vec<f64>)],
    cells: &[(Load, Vec<Config>)],
) -> Vec<(Config, Vec<f64>)> {
    by_spec
        .iter()
        .filter_map(|(spec, times)| {
            let cfg = cells.iter().flat_map(|(_, c)| c).find(|c| c.setup == configs::Setup::Agent(*spec))?;
            Some((*cfg, times.clone()))
        })
        .collect()
}

/// One run of `load` under the agent of `cfg` with BPF run-time accounting on: the agent's
/// programs' runs and run time, the run's seconds and what the load measured.
fn profile(ctx: &Ctx<'_>, load: Load, cfg: &Config, secs: u32) -> Result<(Vec<ProgRun>, f64, Sample)> {
    let configs::Setup::Agent(spec) = cfg.setup else { bail!("profiles are of agent configurations") };
    let _on = bpfstats::StatsOn::enable()?;
    let veths = ctx.bed.pod_veths();
    let (out, _) = ctx.agents.run(spec, &veths, |pid| {
        let before = bpfstats::programs_of(pid)?;
        let started = Instant::now();
        let sample = load.run(ctx.bed, secs)?;
        let secs = started.elapsed().as_secs_f64();
        Ok((bpfstats::delta(&before, &bpfstats::programs_of(pid)?), secs, sample))
    })?;
    Ok(out)
}

/// One round of the headline ratio: `load` under each rung of the ladder in turn, the
/// baselines attached with TCX to the same veths as the agent, the agent of `cfg` with replays
/// off and as configured; BPF run-time accounting on in all.
fn ratio_round(
    ctx: &Ctx<'_>,
    before: Option<&Ctx<'_>>,
    load: Load,
    cfg: &Config,
    secs: u32,
) -> Result<RatioRound> {
    let veths = ctx.bed.pod_veths();
    let mut rungs = Vec::new();
    let all = Rung::ALL.into_iter().chain(before.map(|_| Rung::Before));
    for rung in all {
        let baseline = match rung {
            Rung::Empty => Some(bpfstats::Baseline::Empty),
            Rung::Parse => Some(bpfstats::Baseline::Parse),
            Rung::Floor => Some(bpfstats::Baseline::Floor),
            Rung::Cached => Some(bpfstats::Baseline::Cached),
            Rung::NoReplay | Rung::Classifier | Rung::Triggers | Rung::Before => None,
        };
        let runs = match baseline {
            Some(which) => {
                let _on = bpfstats::StatsOn::enable()?;
                let attached = bpfstats::BaselineAttached::new(ctx.bed.node(), &veths, which)?;
                let before = attached.programs()?;
                load.run(ctx.bed, secs)?;
                bpfstats::delta(&before, &attached.programs()?)
            }
            None => {
                let cfg = match rung {
                    Rung::NoReplay => cfg.without_replays(),
                    Rung::Triggers => cfg.with_rules(agent::Rules::Triggers),
                    _ => *cfg,
                };
                let agents = if rung == Rung::Before { before.unwrap_or(ctx) } else { ctx };
                profile(agents, load, &cfg, secs)?.0
            }
        };
        if runs.is_empty() {
            bail!("no runs counted under the {}", rung.label());
        }
        rungs.push((rung, runs));
    }
    Ok(RatioRound { rungs })
}

/// `load` under the agent of `cfg` with `perf` sampling every CPU: the samples under each
/// entry program, by the stage they were in.
fn stage_profile(ctx: &Ctx<'_>, load: Load, cfg: &Config, secs: u32) -> Result<Vec<stageprof::StageShare>> {
    let configs::Setup::Agent(spec) = cfg.setup else { bail!("stage profiles are of agent configurations") };
    let veths = ctx.bed.pod_veths();
    let (out, _) = ctx.agents.run(spec, &veths, |_| {
        let rec = stageprof::Recording::start(secs)?;
        load.run(ctx.bed, secs)?;
        // The programs the entry programs tail-call replace their frames: entries of their own.
        rec.finish(&[
            "tcx_ingress_mirror",
            "tcx_egress_mirror",
            "tc_ingress_mirror",
            "tc_egress_mirror",
            "proto_http1",
            "proto_http2",
            "stage_reset",
        ])
    })?;
    Ok(out)
}

fn describe(s: &Sample, seen: &Observed) -> String {
    let mut out = Vec::new();
    if let Some(t) = s.throughput {
        out.push(format!("{t:.2}"));
    }
    if let Some(l) = s.latency {
        out.push(format!("p50 {:.1} µs p99 {:.1} µs", l.p50, l.p99));
    }
    if seen.copies > 0 {
        out.push(format!("copies {} lost {}", seen.copies, seen.lost));
    }
    out.join(", ")
}
