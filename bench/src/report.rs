//! The results: one row per case, the bars they are held to, and the markdown report.

use std::fmt::Write;

use crate::host::Host;
use crate::stats::{growth, median, Summary};

/// A packet that triggers nothing costs at most this many times the empty program.
pub const QUIET_MAX_RATIO: f64 = 3.0;
/// The most rules measured cost at most this much more than one rule.
pub const RULES_MAX_GROWTH: f64 = 0.05;

/// One case's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub case: String,
    pub rules: u32,
    /// Triggers nothing: held to [`QUIET_MAX_RATIO`].
    pub quiet: bool,
    /// ns per packet of each run, in run order.
    pub runs: Vec<f64>,
    /// Their summary.
    pub ns: Summary,
    /// Median ns per packet of the empty program, measured beside it.
    pub empty_ns: f64,
    /// Median over runs of case/empty within the run: drift between runs cancels.
    pub ratio: f64,
}

impl Row {
    /// A row from (case ns, empty ns) per run.
    pub fn from_samples(case: &str, rules: u32, quiet: bool, runs: impl Iterator<Item = (f64, f64)>) -> Self {
        let (case_ns, empty_ns): (Vec<f64>, Vec<f64>) = runs.unzip();
        let ratios: Vec<f64> = case_ns.iter().zip(&empty_ns).map(|(c, e)| c / e).collect();
        Row {
            case: case.into(),
            rules,
            quiet,
            ns: Summary::of(&case_ns),
            runs: case_ns,
            empty_ns: median(&empty_ns),
            ratio: median(&ratios),
        }
    }
}

/// One bar applied to one case.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub what: String,
    pub pass: bool,
}

/// Every bar on every row it applies to.
pub fn checks(rows: &[Row]) -> Vec<Check> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.quiet) {
        out.push(Check {
            what: format!(
                "{} ({}): {:.2}x the empty program (bar: at most {QUIET_MAX_RATIO}x)",
                r.case,
                fmt_rules(r.rules),
                r.ratio
            ),
            pass: r.ratio <= QUIET_MAX_RATIO,
        });
    }
    let mut names: Vec<&str> = rows.iter().map(|r| r.case.as_str()).collect();
    names.dedup();
    for name in names {
        let mut same: Vec<&Row> = rows.iter().filter(|r| r.case == name).collect();
        same.sort_by_key(|r| r.rules);
        let (Some(&lo), Some(&hi)) = (same.first(), same.last()) else { continue };
        if lo.rules == hi.rules {
            continue;
        }
        let between: Vec<String> = same[1..same.len() - 1]
            .iter()
            .map(|r| format!("{}: {:+.1}%; ", fmt_rules(r.rules), paired_growth(lo, r) * 100.0))
            .collect();
        let g = paired_growth(lo, hi);
        out.push(Check {
            what: format!(
                "{name}: {} vs {}: {:+.1}% ({}median over runs of the two ns measured in the same run; \
                 bar: within {:.0}%)",
                fmt_rules(hi.rules),
                fmt_rules(lo.rules),
                g * 100.0,
                between.concat(),
                RULES_MAX_GROWTH * 100.0
            ),
            pass: g.abs() <= RULES_MAX_GROWTH,
        });
    }
    out
}

/// Median over runs of the change from `lo` to `hi`: pairs from the same run share its drift.
fn paired_growth(lo: &Row, hi: &Row) -> f64 {
    let per_run: Vec<f64> = lo.runs.iter().zip(&hi.runs).map(|(l, h)| growth(*l, *h)).collect();
    median(&per_run)
}

/// What the report says besides the table.
pub struct Header<'a> {
    pub title: &'a str,
    pub host: &'a Host,
    /// (label, value) lines: mode, repeat, runs, command ...
    pub settings: Vec<(&'a str, String)>,
    /// Paragraphs on the method.
    pub method: Vec<String>,
}

/// The markdown report.
pub fn render(h: &Header<'_>, rows: &[Row], checks: &[Check]) -> String {
    let mut s = String::new();
    write_head(&mut s, h.title, h.host, &h.settings);
    let _ = writeln!(s, "\n## Method\n");
    for p in &h.method {
        let _ = writeln!(s, "{p}\n");
    }
    let _ = writeln!(s, "## Results\n");
    let _ = writeln!(s, "| case | rules | ns/packet (median) | min-max | empty program ns | ratio |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1}-{:.1} | {:.1} | {:.2}x |",
            r.case,
            fmt_count(r.rules),
            r.ns.median,
            r.ns.min,
            r.ns.max,
            r.empty_ns,
            r.ratio
        );
    }
    write_bars(&mut s, checks);
    s
}

/// The title of a report and its list of what was measured on, and how.
pub fn write_head(s: &mut String, title: &str, host: &Host, settings: &[(&str, String)]) {
    let _ = writeln!(s, "# {title}\n");
    let _ = writeln!(s, "- machine: {}, {} cores", host.cpu, host.cores);
    let _ = writeln!(s, "- kernel: {}", host.kernel);
    let _ = writeln!(s, "- date: {}", host.date);
    for (label, value) in settings {
        let _ = writeln!(s, "- {label}: {value}");
    }
}

/// The "Bars" section of a report: each check, PASS or MISSED, and the tally.
pub fn write_bars(s: &mut String, checks: &[Check]) {
    let _ = writeln!(s, "\n## Bars\n");
    let _ =
        writeln!(s, "Benchmark bars, not tests: a miss is reported here and the benchmark still succeeds.\n");
    for c in checks {
        let _ = writeln!(s, "- {}: {}", if c.pass { "PASS" } else { "MISSED" }, c.what);
    }
    let missed = checks.iter().filter(|c| !c.pass).count();
    let _ = writeln!(
        s,
        "\n{} of {} bars passed{}",
        checks.len() - missed,
        checks.len(),
        if missed > 0 { "; MISSED bars above" } else { "" }
    );
}

/// "1 rule", "10,000 rules".
fn fmt_rules(n: u32) -> String {
    format!("{} rule{}", fmt_count(n), if n == 1 { "" } else { "s" })
}

/// 10000 as "10,000".
pub fn fmt_count(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, rules: u32, quiet: bool, ns: f64, empty: f64) -> Row {
        Row::from_samples(case, rules, quiet, [(ns, empty), (ns + 1.0, empty), (ns - 1.0, empty)].into_iter())
    }

    #[test]
    fn row_takes_medians_and_per_run_ratios() {
        let r = Row::from_samples("c", 1, true, [(30.0, 10.0), (50.0, 20.0), (20.0, 10.0)].into_iter());
        assert_eq!(r.ns, Summary { median: 30.0, min: 20.0, max: 50.0 });
        assert_eq!(r.runs, [30.0, 50.0, 20.0]);
        assert_eq!(r.empty_ns, 10.0);
        assert_eq!(r.ratio, 2.5);
    }

    #[test]
    fn bars_pass_and_miss() {
        let rows = [
            row("quiet", 1, true, 20.0, 10.0),
            row("loud", 1, true, 31.0, 10.0),
            row("resp", 1, false, 100.0, 10.0),
            row("resp", 10_000, false, 104.0, 10.0),
            row("resp", 100, false, 102.0, 10.0),
            row("slow", 1, false, 100.0, 10.0),
            row("slow", 10_000, false, 110.0, 10.0),
            row("odd", 1, false, 100.0, 10.0),
            row("odd", 10_000, false, 90.0, 10.0),
        ];
        let c = checks(&rows);
        assert!(
            c[2].what.starts_with("resp: 10,000 rules vs 1 rule: +4.0% (100 rules: +2.0%; "),
            "{}",
            c[2].what
        );
        let pass: Vec<(bool, &str)> = c.iter().map(|c| (c.pass, c.what.split(':').next().unwrap())).collect();
        assert_eq!(
            pass,
            [
                (true, "quiet (1 rule)"),
                (false, "loud (1 rule)"),
                (true, "resp"),
                (false, "slow"),
                (false, "odd")
            ]
        );
    }

    #[test]
    fn report_says_missed() {
        let host = Host { cpu: "cpu".into(), cores: 2, kernel: "k".into(), date: "d".into() };
        let h = Header {
            title: "t",
            host: &host,
            settings: vec![("runs", "3".into())],
            method: vec!["m".into()],
        };
        let rows = [row("loud", 10_000, true, 31.0, 10.0)];
        let text = render(&h, &rows, &checks(&rows));
        assert!(text.contains("| loud | 10,000 | 31.0 | 30.0-32.0 | 10.0 | 3.10x |"), "{text}");
        assert!(text.contains("- MISSED: loud"), "{text}");
        assert!(text.contains("0 of 1 bars passed; MISSED"), "{text}");
        assert_eq!(fmt_count(1_000_000), "1,000,000");
    }
}
