//! Waiting for a quiet machine: other builds and tests share these 2 cores, and a run next to
//! them measures them as much as us.

use std::time::{Duration, Instant};

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> [f64; 3] {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default()).unwrap_or([f64::NAN; 3])
}

fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// "0.42 0.61 0.80".
pub fn fmt_loadavg(l: [f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

/// The outcome of [`wait`].
#[derive(Debug, Clone, Copy)]
pub struct Quiet {
    /// The 1-minute load stayed below the threshold for the hold time.
    pub reached: bool,
    pub waited: Duration,
}

/// Waits until the 1-minute load average stays below `below` for `hold`, at most `max`.
pub fn wait(below: f64, hold: Duration, max: Duration) -> Quiet {
    let start = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    let mut last_said = Instant::now() - Duration::from_secs(3600);
    loop {
        let now = Instant::now();
        let load = loadavg()[0];
        if load < below {
            let since = *quiet_since.get_or_insert(now);
            if now - since >= hold {
                return Quiet { reached: true, waited: now - start };
            }
        } else {
            quiet_since = None;
        }
        if now - start >= max {
            return Quiet { reached: false, waited: now - start };
        }
        if now - last_said >= Duration::from_secs(30) {
            eprintln!(
                "waiting for a quiet machine: load {load:.2} (below {below} for {hold:?}, at most {max:?})"
            );
            last_said = now;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_fields() {
        assert_eq!(parse_loadavg("1.23 2.12 1.97 1/89 16887\n"), Some([1.23, 2.12, 1.97]));
        assert_eq!(parse_loadavg(""), None);
        assert_eq!(fmt_loadavg([0.5, 1.0, 1.25]), "0.50 1.00 1.25");
    }
}
