//! A latency histogram drawn in the terminal, one row per power of two (as bpftrace's `hist`).

use crate::views::HistogramView;

/// Width of the longest bar.
const BAR: usize = 40;

fn human(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{}s", n / 1_000_000_000),
        n if n >= 1_000_000 => format!("{}ms", n / 1_000_000),
        n if n >= 1_000 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// Merges histograms (same kind and class, several interfaces) into one.
pub fn merge(hists: &[&HistogramView]) -> Option<HistogramView> {
    let mut out = (*hists.first()?).clone();
    out.interface.clear();
    out.count = hists.iter().map(|h| h.count).sum();
    out.sum_seconds = hists.iter().map(|h| h.sum_seconds).sum();
    let mut rows: std::collections::BTreeMap<u64, [u64; 3]> = std::collections::BTreeMap::new();
    for [lo, hi, n] in hists.iter().flat_map(|h| &h.buckets) {
        rows.entry(*lo).or_insert([*lo, *hi, 0])[2] += n;
    }
    out.buckets = rows.into_values().collect();
    Some(out)
}

/// Quantile over the buckets, interpolated within one (as the agent computes it).
pub fn quantile(h: &HistogramView, q: f64) -> f64 {
    let total: u64 = h.buckets.iter().map(|b| b[2]).sum();
    let rank = (q * total as f64).max(1.0);
    let mut seen = 0u64;
    for [lo, hi, n] in &h.buckets {
        if (seen + n) as f64 >= rank {
            let within = (rank - seen as f64) / *n as f64;
            return (*lo as f64 + (hi - lo) as f64 * within) / 1e6;
        }
        seen += n;
    }
    0.0
}

/// The histogram's rows: `[lo, hi)  count |@@@@   |`, fine buckets grouped by power of two.
pub fn render(h: &HistogramView) -> String {
    let mut rows: Vec<(u64, u64, u64)> = Vec::new();
    for [lo, _, n] in &h.buckets {
        let octave = if *lo == 0 { 0 } else { 1u64 << (63 - lo.leading_zeros()) };
        match rows.last_mut() {
            Some(r) if r.0 == octave => r.2 += n,
            _ => rows.push((octave, if octave == 0 { 1 } else { octave * 2 }, *n)),
        }
    }
    let max = rows.iter().map(|r| r.2).max().unwrap_or(1).max(1);
    let labels: Vec<String> =
        rows.iter().map(|(lo, hi, _)| format!("[{}, {})", human(*lo), human(*hi))).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0);
    let mut out = String::new();
    for (label, (_, _, n)) in labels.iter().zip(&rows) {
        let bar = "@".repeat(((*n as f64 / max as f64) * BAR as f64).ceil() as usize);
        out += &format!("{label:<width$} {n:>8} |{bar:<BAR$}|\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_group_by_power_of_two() {
        let h = HistogramView {
            interface: "veth0".into(),
            ifindex: 3,
            kind: "http_response".into(),
            class: Some(2),
            count: 12,
            sum_seconds: 0.6,
            p50_ms: 50.0,
            p90_ms: 50.0,
            p99_ms: 50.0,
            buckets: vec![[50_331_648, 58_720_256, 10], [58_720_256, 67_108_864, 2]],
        };
        let text = render(&h);
        assert_eq!(text.lines().count(), 1, "one power of two: {text}");
        assert!(text.contains("[33ms, 67ms)") && text.contains("12"), "{text}");
        // Rank 6 of 12 is 0.6 into the first bucket: 50.33 + 0.6 * 8.39 ms.
        assert!((quantile(&h, 0.5) - 55.37).abs() < 0.01, "{}", quantile(&h, 0.5));
    }
}
