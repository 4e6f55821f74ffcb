//! The report: per-load tables (medians over rounds, ratios to the baseline (a) paired within
//! each round), the published figures beside ours, attaching at scale, the classifier's run
//! time under load, and the bars.

use std::fmt::Write;

use super::bpfstats::hook_total;
use super::loads::{Latency, Load};
use super::stageprof;
use super::{AttachRun, Cell, Plan, Profile, Results};
use crate::host::Host;
use crate::report::{fmt_count, write_bars, write_head, Check, RULES_MAX_GROWTH};
use crate::stats::{median, Summary};

/// Throughput of the agent passing traffic, relative to no agent.
pub const PASS_MIN_THROUGHPUT: f64 = 0.98;
/// Throughput with every HTTP flow mirrored, relative to no agent.
pub const MIRROR_MIN_THROUGHPUT: f64 = 0.95;
/// Median latency of the agent passing traffic, relative to no agent.
pub const PASS_MAX_P50: f64 = 1.03;
/// Throughput with the kernel stack latency group on, relative to no agent.
pub const STACK_MIN_THROUGHPUT: f64 = 0.90;

/// Figures of the research monitor this project comes from, as published.
const PUBLISHED_IPERF_MONITOR: f64 = 0.897;
const PUBLISHED_IPERF_QDISCS: f64 = 0.977;
const PUBLISHED_HTTP_0: f64 = 0.97;
const PUBLISHED_HTTP_100: f64 = 0.89;
const PUBLISHED_P50_PASS: f64 = 1.06;
const PUBLISHED_P50_MIRROR: f64 = 1.13;

/// Everything the header says.
pub struct Meta<'a> {
    pub host: &'a Host,
    pub plan: &'a Plan,
    /// Settings lines: (label, value).
    pub settings: Vec<(&'a str, String)>,
}

/// One cell summarized against the baseline of its load.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub throughput: Option<Summary>,
    /// Median over rounds of throughput / baseline throughput of the same round.
    pub throughput_ratio: Option<Summary>,
    /// Medians over rounds of each percentile.
    pub latency: Option<Latency>,
    /// Median over rounds of p50 / baseline p50 of the same round, and of p99.
    pub p50_ratio: Option<Summary>,
    pub p99_ratio: Option<Summary>,
    /// Medians over rounds.
    pub copies: f64,
    pub lost: f64,
}

/// Per-round ratios `x[i] / base[i]`, summarized (median, min, max).
fn paired(x: &[f64], base: &[f64]) -> Summary {
    let r: Vec<f64> = x.iter().zip(base).map(|(x, b)| x / b).collect();
    Summary::of(&r)
}

impl Stats {
    pub fn of(cell: &Cell, base: &Cell) -> Stats {
        let series = |c: &Cell, f: &dyn Fn(&super::Sample) -> Option<f64>| -> Option<Vec<f64>> {
            c.runs.iter().map(|(s, _)| f(s)).collect()
        };
        let thr = |s: &super::Sample| s.throughput;
        let p = |pick: fn(&Latency) -> f64| move |s: &super::Sample| s.latency.as_ref().map(pick);
        let (p50, p99, p999) = (p(|l| l.p50), p(|l| l.p99), p(|l| l.p999));
        let t = series(cell, &thr);
        let tb = series(base, &thr);
        let l50 = series(cell, &p50);
        let l99 = series(cell, &p99);
        let l999 = series(cell, &p999);
        let obs = |f: fn(&super::Observed) -> u64| {
            median(&cell.runs.iter().map(|(_, o)| f(o) as f64).collect::<Vec<_>>())
        };
        Stats {
            throughput: t.as_deref().map(Summary::of),
            throughput_ratio: t.as_deref().zip(tb.as_deref()).map(|(t, b)| paired(t, b)),
            latency: match (&l50, &l99, &l999) {
                (Some(a), Some(b), Some(c)) => {
                    Some(Latency { p50: median(a), p99: median(b), p999: median(c) })
                }
                _ => None,
            },
            p50_ratio: l50.as_deref().zip(series(base, &p50).as_deref()).map(|(x, b)| paired(x, b)),
            p99_ratio: l99.as_deref().zip(series(base, &p99).as_deref()).map(|(x, b)| paired(x, b)),
            copies: obs(|o| o.copies),
            lost: obs(|o| o.lost),
        }
    }
}

/// The cell of `load` under configuration `key`, with its load's baseline.
fn find<'a>(r: &'a Results, load: Load, key: &str) -> Option<(&'a Cell, &'a Cell)> {
    let cell = r.cells.iter().find(|c| c.load == load && c.config.key == key)?;
    let base = r.cells.iter().find(|c| c.load == load && c.config.key == "a")?;
    Some((cell, base))
}

fn stats(r: &Results, load: Load, key: &str) -> Option<Stats> {
    find(r, load, key).map(|(c, b)| Stats::of(c, b))
}

fn thr_ratio(r: &Results, load: Load, key: &str) -> Option<f64> {
    stats(r, load, key)?.throughput_ratio.map(|s| s.median)
}

fn p50_ratio(r: &Results, load: Load, key: &str) -> Option<f64> {
    stats(r, load, key)?.p50_ratio.map(|s| s.median)
}

const HTTP_0: Load = Load::Http { errors_pct: 0 };
const HTTP_50: Load = Load::Http { errors_pct: 50 };
const HTTP_100: Load = Load::Http { errors_pct: 100 };

/// The rule-count cells present, fewest rules first: (rules, key).
fn rule_cells(r: &Results) -> Vec<(u32, &'static str)> {
    [(1, "c"), (100, "c100"), (10_000, "c10k")]
        .into_iter()
        .filter(|(_, k)| find(r, HTTP_0, k).is_some())
        .collect()
}

/// Median over rounds of the change in cost per request (1/throughput) from the `lo` rules
/// cell to the `hi` one, paired within rounds.
fn rules_growth(r: &Results, lo: &str, hi: &str) -> Option<f64> {
    let (lo, _) = find(r, HTTP_0, lo)?;
    let (hi, _) = find(r, HTTP_0, hi)?;
    let t = |c: &Cell| c.runs.iter().map(|(s, _)| s.throughput).collect::<Option<Vec<f64>>>();
    let (l, h) = (t(lo)?, t(hi)?);
    Some(paired(&l, &h).median - 1.0)
}

/// The classifier's run time on real traffic over an empty program's, same hooks, same load.
const REAL_TRAFFIC_MAX_RATIO: f64 = 2.5;

/// Every bar whose cells were measured.
pub fn bars(r: &Results) -> Vec<Check> {
    let mut out = Vec::new();
    let throughput_bars: [(&str, Load, &str, f64); 6] = [
        ("iperf3 pod→pod throughput, agent passing (c)/(a)", Load::IperfPodToPod, "c", PASS_MIN_THROUGHPUT),
        ("iperf3 node→pod throughput, agent passing (c)/(a)", Load::IperfNodeToPod, "c", PASS_MIN_THROUGHPUT),
        ("HTTP throughput at 0% errors, agent passing (c)/(a)", HTTP_0, "c", PASS_MIN_THROUGHPUT),
        ("HTTP throughput at 100% errors, every flow mirrored (d)/(a)", HTTP_100, "d", MIRROR_MIN_THROUGHPUT),
        (
            "iperf3 pod→pod throughput, kernel stack latency group on (hs)/(a)",
            Load::IperfPodToPod,
            "hs",
            STACK_MIN_THROUGHPUT,
        ),
        (
            "HTTP throughput at 0% errors, kernel stack latency group on (hs)/(a)",
            HTTP_0,
            "hs",
            STACK_MIN_THROUGHPUT,
        ),
    ];
    for (what, load, key, min) in throughput_bars {
        if let Some(v) = thr_ratio(r, load, key) {
            out.push(Check { what: format!("{what}: {v:.3} (bar: at least {min})"), pass: v >= min });
        }
    }
    let mut max_bar = |what: &str, v: Option<f64>, max: f64| {
        if let Some(v) = v {
            out.push(Check { what: format!("{what}: {v:.3} (bar: at most {max})"), pass: v <= max });
        }
    };
    let headline =
        r.ratio.as_ref().filter(|(_, _, rounds)| !rounds.is_empty()).map(|(_, _, rounds)| {
            crate::stats::median(&rounds.iter().map(|r| r.ratio()).collect::<Vec<_>>())
        });
    max_bar(
        "real traffic (HTTP, nothing triggered): classifier ns/run ÷ empty program ns/run, median",
        headline,
        REAL_TRAFFIC_MAX_RATIO,
    );
    max_bar("sockperf p50 latency, agent passing (c)/(a)", p50_ratio(r, Load::Sockperf, "c"), PASS_MAX_P50);
    max_bar("HTTP p50 latency at 0% errors, agent passing (c)/(a)", p50_ratio(r, HTTP_0, "c"), PASS_MAX_P50);
    let rules = rule_cells(r);
    if let (Some(lo), Some(hi)) = (rules.first(), rules.last()) {
        if lo.0 != hi.0 {
            if let Some(g) = rules_growth(r, lo.1, hi.1) {
                out.push(Check {
                    what: format!(
                        "HTTP cost per request with {} rules vs {}: {:+.1}% (paired per round; bar: within {:.0}%)",
                        fmt_count(hi.0),
                        fmt_count(lo.0),
                        g * 100.0,
                        RULES_MAX_GROWTH * 100.0
                    ),
                    pass: g.abs() <= RULES_MAX_GROWTH,
                });
            }
        }
    }
    out
}

/// The markdown report.
pub fn render(meta: &Meta<'_>, r: &Results) -> String {
    let mut s = String::new();
    write_head(
        &mut s,
        "Traffic benchmark: the overhead of monitoring and mirroring",
        meta.host,
        &meta.settings,
    );
    let _ = writeln!(s, "- offloads of the pod veths: {}", r.offloads);
    let _ = writeln!(s, "- static mirror filter: {}", r.static_filter);
    let loads: Vec<String> = r.round_loads.iter().map(|l| format!("{:.2}", l[0])).collect();
    let _ = writeln!(s, "- 1-minute load average at the start of each round: {}", loads.join(", "));

    let _ = writeln!(s, "\n## Method\n");
    for p in method(meta.plan) {
        let _ = writeln!(s, "{p}\n");
    }
    let _ = writeln!(s, "## Configurations\n");
    let mut seen: Vec<&str> = Vec::new();
    for c in &r.cells {
        if !seen.contains(&c.config.key) {
            seen.push(c.config.key);
            let _ = writeln!(s, "- ({}) {}", c.config.key, c.config.label);
        }
    }

    ratio_table(&mut s, r);
    summary_table(&mut s, r);
    let _ = writeln!(s, "\n## Results per load\n");
    let _ = writeln!(
        s,
        "Medians over rounds; the ratio is to (a) in the same round, median (min-max) over rounds. \
         copies: packets copied per run (mirrored by the agent, sent by the static mirror, \
         captured by tcpdump); lost: copies that failed (tcpdump: dropped by the kernel).\n"
    );
    let mut loads: Vec<Load> = Vec::new();
    for c in &r.cells {
        if !loads.contains(&c.load) {
            loads.push(c.load);
        }
    }
    for load in loads {
        load_table(&mut s, r, load);
    }
    rules_table(&mut s, r);
    starts_table(&mut s, &r.agent_starts);
    attach_table(&mut s, &r.attach);
    profile_table(&mut s, &r.profiles);
    stages_table(&mut s, r);
    if !r.failures.is_empty() {
        let _ = writeln!(s, "### Runs retried and stages that failed\n");
        for f in &r.failures {
            let _ = writeln!(s, "- {f}");
        }
        let _ = writeln!(s);
    }
    write_bars(&mut s, &bars(r));
    s
}

fn method(plan: &Plan) -> Vec<String> {
    vec![
        format!(
            "A node namespace routes between a client pod (198.18.1.2) and a server pod (198.18.2.2), \
             each joined to it by a veth pair; monitors attach to the node-side veths. In every round \
             each configuration of a load runs once for {} s, the baseline (a) among them, one after \
             the other (a b c ... a b c ...; each round starts one configuration later), {} rounds; \
             the agent, qdiscs, filters and tcpdump are set up before a run and removed after it.",
            plan.secs, plan.rounds
        ),
        "Loads: iperf3 (one TCP stream, 1 s of slow start omitted) client pod → server pod, crossing \
         both veths, and node → server pod, crossing one; sockperf TCP ping-pong (round-trip time, \
         p50/p99/p99.9) client → server; wrk (2 threads, 4 keep-alive HTTP/1.1 connections) against \
         nginx (1 worker, `/foo` answers 200, `/bar` 500): at 0% errors every connection asks /foo, \
         at 100% /bar, at 50% the connections of one thread ask /foo and of the other /bar, so half \
         the requests are answered 500 and half the connections mirrored; wrk reports requests/s and \
         latency percentiles."
            .into(),
        "The agent runs as `mirror-agent --config` in the node namespace (nsenter --net) with a \
         config, API socket, state file and pin path of its own, a veth sink it creates, metrics \
         off, attached to the two pod veths, everything else at its default (attach mode auto, \
         i.e. TCX here; the latency groups on by default, http and handshake); passing: the rule `status=599` (no server answers it) \
         plus, for the rule-count rows, rules `port=P status=500` on ports no service uses; \
         mirroring: `status=500 packets=0 bytes=0 duration=0`, so a flow is copied from its first \
         500 to its end. After each run the agent's counters must show the traffic seen, nothing \
         triggered when passing, packets mirrored when mirroring; the static mirror and tcpdump \
         must have copied packets."
            .into(),
        "The static mirror (e) is what an operator can do without a classifier: clsact on the pod \
         veths, and on the server's veth filters with `action mirred egress mirror` copying the \
         service port's traffic to a spare veth. tcpdump (f) captures the service port on the \
         server's veth to a file (whole packets, default buffer, a ring of two 256 MB files)."
            .into(),
        "Attaching: a running agent; N veth pairs created at once with `ip -batch` in its namespace; \
         the time until `mirrorctl -o json status` lists all N (polled every 100 ms), the agent's \
         own attach latency (link event received to classifier attached), its RSS before and after, \
         its peak RSS, and the CPU time it used (utime+stime from /proc). Profile: one more run \
         with the kernel's BPF run-time accounting on (BPF_ENABLE_STATS), reading run_time_ns and \
         run_cnt of the agent's programs before and after; accounting adds two clock reads per \
         run, so it is never on while throughput is measured."
            .into(),
    ]
}

fn fmt_thr(load: Load, v: f64) -> String {
    match load {
        Load::Http { .. } | Load::H2 { .. } | Load::H2Data => fmt_count(v.round() as u32),
        _ => format!("{v:.2}"),
    }
}

fn fmt_ratio(s: &Option<Summary>) -> String {
    s.map_or("-".into(), |s| format!("{:.3} ({:.3}-{:.3})", s.median, s.min, s.max))
}

fn load_table(s: &mut String, r: &Results, load: Load) {
    let unit = match load {
        Load::Http { .. } | Load::H2 { .. } | Load::H2Data => "requests/s",
        Load::Sockperf => "",
        _ => "Gbit/s",
    };
    let _ = writeln!(s, "### {}\n", load.name());
    let lat = load == Load::Sockperf || matches!(load, Load::Http { .. });
    let thr = load != Load::Sockperf;
    let mut head = vec!["config".to_string()];
    if thr {
        head.extend([format!("{unit} (min-max)"), "ratio to (a)".into()]);
    }
    if lat {
        head.extend([
            "p50 µs".into(),
            "p99 µs".into(),
            "p99.9 µs".into(),
            "p50 ratio".into(),
            "p99 ratio".into(),
        ]);
    }
    head.extend(["copies".into(), "lost".into()]);
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(head.len() - 1));
    for c in r.cells.iter().filter(|c| c.load == load) {
        let Some(st) = stats(r, load, c.config.key) else { continue };
        let mut row = vec![format!("({}) {}", c.config.key, c.config.label)];
        if thr {
            let t = st.throughput.expect("a throughput load");
            row.push(format!(
                "{} ({}-{})",
                fmt_thr(load, t.median),
                fmt_thr(load, t.min),
                fmt_thr(load, t.max)
            ));
            row.push(fmt_ratio(&st.throughput_ratio));
        }
        if lat {
            let l = st.latency.expect("a latency load");
            row.extend([format!("{:.1}", l.p50), format!("{:.1}", l.p99), format!("{:.1}", l.p999)]);
            row.extend([fmt_ratio(&st.p50_ratio), fmt_ratio(&st.p99_ratio)]);
        }
        row.extend([fmt_count(st.copies.round() as u32), fmt_count(st.lost.round() as u32)]);
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    let _ = writeln!(s);
}

fn pct(v: Option<f64>) -> String {
    v.map_or("not measured".into(), |v| format!("{:.1}%", v * 100.0))
}

fn summary_table(s: &mut String, r: &Results) {
    let _ = writeln!(s, "\n## Summary: ours beside the published figures\n");
    let _ = writeln!(
        s,
        "Relative to no agent (a), medians over rounds. \"Published\" is the research monitor this \
         project comes from, on its own hardware and loads: compare the direction and size, not \
         the digits.\n"
    );
    let _ = writeln!(s, "| measure | ours | published |");
    let _ = writeln!(s, "|---|---:|---:|");
    let rows: [(&str, Option<f64>, Option<f64>); 12] = [
        (
            "iperf3 pod→pod throughput, agent passing (c)",
            thr_ratio(r, Load::IperfPodToPod, "c"),
            Some(PUBLISHED_IPERF_MONITOR),
        ),
        (
            "iperf3 pod→pod throughput, qdiscs only (b)",
            thr_ratio(r, Load::IperfPodToPod, "b"),
            Some(PUBLISHED_IPERF_QDISCS),
        ),
        ("iperf3 pod→pod throughput, static tc mirror (e)", thr_ratio(r, Load::IperfPodToPod, "e"), None),
        ("iperf3 pod→pod throughput, tcpdump (f)", thr_ratio(r, Load::IperfPodToPod, "f"), None),
        ("iperf3 node→pod throughput, agent passing (c)", thr_ratio(r, Load::IperfNodeToPod, "c"), None),
        ("HTTP throughput, 0% mirrored (c)", thr_ratio(r, HTTP_0, "c"), Some(PUBLISHED_HTTP_0)),
        ("HTTP throughput, 50% of requests 500, mirrored (d)", thr_ratio(r, HTTP_50, "d"), None),
        ("HTTP throughput, 100% mirrored (d)", thr_ratio(r, HTTP_100, "d"), Some(PUBLISHED_HTTP_100)),
        ("HTTP throughput, 100% mirrored, mirred method (g)", thr_ratio(r, HTTP_100, "g"), None),
        (
            "sockperf p50 latency, agent passing (c)",
            p50_ratio(r, Load::Sockperf, "c"),
            Some(PUBLISHED_P50_PASS),
        ),
        ("HTTP p50 latency, agent passing (c)", p50_ratio(r, HTTP_0, "c"), Some(PUBLISHED_P50_PASS)),
        ("HTTP p50 latency, 100% mirrored (d)", p50_ratio(r, HTTP_100, "d"), Some(PUBLISHED_P50_MIRROR)),
    ];
    for (what, ours, published) in rows {
        let _ =
            writeln!(s, "| {what} | {} | {} |", pct(ours), published.map_or("-".into(), |p| pct(Some(p))));
    }
}

/// Left- and right-aligned table columns.
const L: &str = "---";
const R: &str = "---:";

/// Opens a table section: its heading, what it shows (skipped when empty), and the header row
/// of (alignment, name) columns.
fn table_head(s: &mut String, title: &str, intro: &str, columns: &[(&str, &str)]) {
    let _ = writeln!(s, "### {title}\n");
    if !intro.is_empty() {
        let _ = writeln!(s, "{intro}\n");
    }
    let names: Vec<&str> = columns.iter().map(|c| c.1).collect();
    let aligns: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let _ = writeln!(s, "| {} |", names.join(" | "));
    let _ = writeln!(s, "|{}|", aligns.join("|"));
}

fn rules_table(s: &mut String, r: &Results) {
    let rules = rule_cells(r);
    if rules.len() < 2 {
        return;
    }
    table_head(
        s,
        "Rules (HTTP at 0% errors: every response's status is looked up)",
        "",
        &[(R, "rules"), (R, "requests/s"), (R, "ratio to (a)"), (R, "cost per request vs 1 rule (paired)")],
    );
    for (n, key) in &rules {
        let Some(st) = stats(r, HTTP_0, key) else { continue };
        let g = rules_growth(r, rules[0].1, key).map_or("-".into(), |g| format!("{:+.1}%", g * 100.0));
        let t = st.throughput.map_or(f64::NAN, |t| t.median);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {g} |",
            fmt_count(*n),
            fmt_count(t.round() as u32),
            fmt_ratio(&st.throughput_ratio)
        );
    }
    let _ = writeln!(s);
}

fn starts_table(s: &mut String, starts: &[(super::Config, Vec<f64>)]) {
    if starts.is_empty() {
        return;
    }
    table_head(
        s,
        "Agent start",
        "From starting `mirror-agent` to both pod veths attached. The first start of a \
         configuration adds its initial rules; later starts restore them from its state file.",
        &[(L, "config"), (R, "first start (s)"), (R, "later starts, median (min-max) (s)")],
    );
    for (cfg, times) in starts {
        let later = match times.get(1..) {
            Some(t) if !t.is_empty() => {
                let sm = Summary::of(t);
                format!("{:.2} ({:.2}-{:.2}), {} starts", sm.median, sm.min, sm.max, t.len())
            }
            _ => "-".into(),
        };
        let _ = writeln!(s, "| ({}) {} | {:.2} | {later} |", cfg.key, cfg.label, times[0]);
    }
    let _ = writeln!(s);
}

fn attach_table(s: &mut String, runs: &[AttachRun]) {
    if runs.is_empty() {
        return;
    }
    table_head(
        s,
        "Attaching",
        "Medians over repetitions. Links created: how long `ip -batch` took to create the veths \
         while the agent attached (another tool's link changes wait for the kernel's RTNL lock, \
         which a TCX attach holds through an RCU grace period per hook). Attach latency is the \
         agent's own (link event to classifier attached); RSS before the links appear → once \
         all are attached; CPU: the agent's utime+stime while attaching.",
        &[
            (R, "veths"),
            (L, "mode"),
            (R, "links created (s)"),
            (R, "all attached (s)"),
            (R, "attach p50 / p99 / max (ms)"),
            (R, "RSS (MB)"),
            (R, "peak RSS (MB)"),
            (R, "CPU (s)"),
            (R, "all deleted links forgotten (s)"),
            (R, "repetitions"),
        ],
    );
    let mut keys: Vec<(usize, &str)> = runs.iter().map(|r| (r.veths, r.mode.as_str())).collect();
    keys.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
    keys.dedup();
    let mb = |kb: u64| kb as f64 / 1024.0;
    for (n, mode) in keys {
        let rs: Vec<&AttachRun> = runs.iter().filter(|r| r.veths == n && r.mode == mode).collect();
        let m = |f: &dyn Fn(&AttachRun) -> f64| median(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let _ = writeln!(
            s,
            "| {} | {mode} | {:.3} | {:.3} | {:.2} / {:.2} / {:.2} | {:.1} → {:.1} | {:.1} | {:.3} | {:.3} | {} |",
            fmt_count(n as u32),
            m(&|r| r.create_s),
            m(&|r| r.all_attached_s),
            m(&|r| r.p50_ms),
            m(&|r| r.p99_ms),
            m(&|r| r.max_ms),
            m(&|r| mb(r.idle.rss_kb)),
            m(&|r| mb(r.attached.rss_kb)),
            m(&|r| mb(r.attached.peak_rss_kb)),
            m(&|r| r.cpu_s()),
            m(&|r| r.all_gone_s),
            rs.len()
        );
    }
    let _ = writeln!(s);
}

/// The headline: the classifier against the empty program on the same hooks, same load, with
/// the ladder of what it is built on measured in the same rounds.
fn ratio_table(s: &mut String, r: &Results) {
    let Some((load, cfg, rounds)) = &r.ratio else { return };
    if rounds.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Headline: the classifier against an empty program on real traffic\n");
    let _ = writeln!(
        s,
        "{} under each rung of a ladder in turn, on the same veths, for the same time, in every round: an \
         empty program, the parser alone, the floor of a flow monitor (parse, the packet's time, \
         one lookup in a per-CPU LRU flow table keyed as the classifier's), the same floor with \
         the classifier's flow cache in front of the table, the agent ({}) {} with replays off \
         (`mirror.replay_requests: 0`), as configured (replays on), and with a rule of each \
         other kind of trigger besides, none of which the load meets (`reset`, \
         `noresponse>2s`, a status rule with method, path and host filters). The baselines are attached \
         by TCX at both hooks, at egress counting only what no ingress saw. The kernel's BPF \
         run-time accounting on in all (it adds two clock reads per run to each). Both hooks: ns \
         per run over all the runs, ingress and egress; its ratio to the empty program is paired \
         within each round.\n",
        load.name(),
        cfg.key,
        cfg.label
    );
    let _ = writeln!(s, "| rung | ingress ns/run | egress ns/run | both hooks ns/run | both hooks / empty |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    let range = |v: Vec<f64>, digits: usize| {
        let m = Summary::of(&v);
        format!("{:.d$} ({:.d$}-{:.d$})", m.median, m.min, m.max, d = digits)
    };
    for &(rung, _) in &rounds[0].rungs {
        let ns = |hook: &str| {
            range(rounds.iter().map(|round| hook_total(round.of(rung), hook).ns_per_run()).collect(), 0)
        };
        let both = range(rounds.iter().map(|round| round.ns_per_run(rung)).collect(), 0);
        let ratio = range(rounds.iter().map(|round| round.ratio_of(rung)).collect(), 2);
        let _ = writeln!(s, "| {} | {} | {} | {} | {}x |", rung.label(), ns("ingr"), ns("egre"), both, ratio);
    }
    let ratio = Summary::of(&rounds.iter().map(|r| r.ratio()).collect::<Vec<_>>());
    let floor = Summary::of(&rounds.iter().map(|r| r.floor_ratio()).collect::<Vec<_>>());
    let _ = writeln!(
        s,
        "\nMedians (min-max) over {} rounds. Ratio: the classifier {:.2}x the empty program (min \
         {:.2}x, max {:.2}x); the floor {:.2}x (min {:.2}x, max {:.2}x).\n",
        rounds.len(),
        ratio.median,
        ratio.min,
        ratio.max,
        floor.median,
        floor.min,
        floor.max
    );
}

/// Where the classifier's time goes, by stage, under the headline's load.
fn stages_table(s: &mut String, r: &Results) {
    let (Some((load, cfg, _)), false) = (&r.ratio, r.stages.is_empty()) else { return };
    table_head(
        s,
        "Where the classifier's time goes, by stage (perf sampling)",
        &format!(
            "{} under ({}) {}, `perf record -a -g` with bpf_jit_kallsyms on: each sample under an \
             entry program goes to the innermost BPF function on its stack (each stage is a global \
             function; the helpers a stage calls count with it).",
            load.name(),
            cfg.key,
            cfg.label
        ),
        &[(L, "entry program"), (L, "stage"), (R, "samples"), (R, "share of the entry's")],
    );
    let all = r.stages.iter().find(|x| x.entry == stageprof::ALL_SAMPLES).map_or(0, |x| x.samples);
    let ours: u64 = r.stages.iter().filter(|x| x.entry != stageprof::ALL_SAMPLES).map(|x| x.samples).sum();
    for st in r.stages.iter().filter(|x| x.entry != stageprof::ALL_SAMPLES) {
        let total: u64 = r.stages.iter().filter(|x| x.entry == st.entry).map(|x| x.samples).sum();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1}% |",
            st.entry,
            st.stage,
            st.samples,
            100.0 * st.samples as f64 / total.max(1) as f64
        );
    }
    let _ = writeln!(
        s,
        "\nThe classifier's programs (the helpers they call included): {ours} of {all} samples of every \
         CPU, {:.2}% of all CPU time under the load.\n",
        100.0 * ours as f64 / all.max(1) as f64
    );
}

fn profile_table(s: &mut String, profiles: &[Profile]) {
    if profiles.is_empty() {
        return;
    }
    table_head(
        s,
        "The agent's programs' run time under load (kernel BPF accounting)",
        "ns/run includes the accounting itself (two clock reads per run). CPU: run time per second \
         of the load, in ms (1,000 = one CPU). Per packet: the program's run time divided by the \
         packets delivered to the pods (the classifier's egress runs): what each hook adds to a \
         packet. Per request (HTTP loads): all the programs' run time divided by the requests the \
         client made (its requests per second times the run's seconds).",
        &[
            (L, "load"),
            (L, "config"),
            (L, "program"),
            (R, "runs"),
            (R, "ns/run"),
            (R, "CPU ms/s"),
            (R, "ns per packet"),
            (R, "ns per request"),
        ],
    );
    for p in profiles {
        let packets =
            p.progs.iter().filter(|r| r.name.contains("egress")).map(|r| r.run_cnt).max().unwrap_or(0);
        for prog in &p.progs {
            let _ = writeln!(
                s,
                "| {} | ({}) {} | {} | {} | {:.0} | {:.1} | {} | |",
                p.load.name(),
                p.config.key,
                p.config.label,
                prog.name,
                prog.run_cnt,
                prog.ns_per_run(),
                prog.run_time_ns as f64 / 1e6 / p.secs.max(1e-9),
                if packets > 0 {
                    format!("{:.0}", prog.run_time_ns as f64 / packets as f64)
                } else {
                    "-".into()
                }
            );
        }
        let total: u64 = p.progs.iter().map(|r| r.run_time_ns).sum();
        if packets > 0 && p.progs.len() > 1 {
            let per_request = p
                .requests
                .filter(|r| *r > 0)
                .map_or("-".into(), |r| format!("{:.0}", total as f64 / r as f64));
            let _ = writeln!(
                s,
                "| {} | ({}) | all | | | {:.1} | {:.0} | {per_request} |",
                p.load.name(),
                p.config.key,
                total as f64 / 1e6 / p.secs.max(1e-9),
                total as f64 / packets as f64
            );
        }
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::super::configs::{MIRROR, NO_AGENT, PASS, PASS_10K};
    use super::super::{Observed, Sample};
    use super::*;

    fn http(rps: &[f64], p50: &[f64]) -> Vec<(Sample, Observed)> {
        rps.iter()
            .zip(p50)
            .map(|(&t, &l)| {
                let sample = Sample {
                    throughput: Some(t),
                    latency: Some(Latency { p50: l, p99: 2.0 * l, p999: 3.0 * l }),
                };
                (sample, Observed { copies: 10, lost: 0 })
            })
            .collect()
    }

    fn results() -> Results {
        let cell = |load, config, runs| Cell { load, config, runs };
        Results {
            cells: vec![
                cell(HTTP_0, NO_AGENT, http(&[100.0, 200.0, 100.0], &[10.0, 5.0, 10.0])),
                // Same rounds: 0.99, 0.99, 0.99 of the baseline even though it drifts.
                cell(HTTP_0, PASS, http(&[99.0, 198.0, 99.0], &[10.2, 5.1, 10.2])),
                cell(HTTP_0, PASS_10K, http(&[90.0, 180.0, 90.0], &[10.2, 5.1, 10.2])),
                cell(HTTP_100, NO_AGENT, http(&[100.0, 100.0, 100.0], &[10.0, 10.0, 10.0])),
                cell(HTTP_100, MIRROR, http(&[96.0, 94.0, 97.0], &[11.0, 11.0, 11.0])),
            ],
            attach: vec![],
            profiles: vec![],
            ratio: None,
            stages: vec![],
            round_loads: vec![[0.1, 0.2, 0.3]; 3],
            agent_starts: vec![(PASS_10K, vec![120.0, 3.0, 4.0, 3.5])],
            failures: vec!["attaching to 1000 veths: timed out".into()],
            static_filter: "u32",
            offloads: "tso on".into(),
        }
    }

    #[test]
    fn ratios_are_paired_within_rounds() {
        let r = results();
        let st = stats(&r, HTTP_0, "c").unwrap();
        let ratio = st.throughput_ratio.unwrap();
        assert!((ratio.median - 0.99).abs() < 1e-12 && (ratio.max - 0.99).abs() < 1e-12, "{ratio:?}");
        assert_eq!(st.throughput.unwrap().median, 99.0);
        assert!((st.p50_ratio.unwrap().median - 1.02).abs() < 1e-12);
        let l = st.latency.unwrap();
        assert_eq!((l.p50, l.p99), (10.2, 20.4));
        assert_eq!(st.copies, 10.0);
    }

    #[test]
    fn bars_pass_and_miss() {
        let r = results();
        let b: Vec<(bool, String)> = bars(&r).into_iter().map(|b| (b.pass, b.what)).collect();
        assert_eq!(b.len(), 4, "{b:?}");
        assert!(
            b[0].0 && b[0].1.starts_with("HTTP throughput at 0% errors, agent passing (c)/(a): 0.990"),
            "{b:?}"
        );
        assert!(b[1].0 && b[1].1.contains("(d)/(a): 0.960"), "{b:?}");
        assert!(b[2].0 && b[2].1.contains("HTTP p50 latency at 0% errors"), "{b:?}");
        assert!(!b[3].0 && b[3].1.contains("10,000 rules vs 1: +10.0%"), "{b:?}");
    }

    #[test]
    fn report_has_tables_and_published_figures() {
        let host = Host { cpu: "cpu".into(), cores: 2, kernel: "k".into(), date: "d".into() };
        let plan = Plan::quick();
        let meta = Meta { host: &host, plan: &plan, settings: vec![("mode", "quick".into())] };
        let text = render(&meta, &results());
        assert!(text.contains("| HTTP throughput, 100% mirrored (d) | 96.0% | 89.0% |"), "{text}");
        assert!(
            text.contains("| iperf3 pod→pod throughput, agent passing (c) | not measured | 89.7% |"),
            "{text}"
        );
        assert!(
            text.contains("| (c) agent, 1 rule, nothing triggered | 99 (99-198) | 0.990 (0.990-0.990) |"),
            "{text}"
        );
        assert!(text.contains("| 10,000 | 90 |"), "{text}");
        assert!(text.contains("3 of 4 bars passed; MISSED"), "{text}");
        assert!(text.contains("| 120.00 | 3.50 (3.00-4.00), 3 starts |"), "{text}");
        assert!(
            text.contains("### Runs retried and stages that failed\n\n- attaching to 1000 veths: timed out"),
            "{text}"
        );
    }
}
