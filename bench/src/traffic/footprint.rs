//! What a process costs the node: resident memory from /proc/<pid>/status and CPU time from
//! /proc/<pid>/stat.

use anyhow::{Context, Result};

/// Memory (kB) and CPU time (s) of a process at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// VmRSS.
    pub rss_kb: u64,
    /// VmHWM: the peak of VmRSS.
    pub peak_rss_kb: u64,
    /// utime + stime.
    pub cpu_s: f64,
}

impl Footprint {
    pub fn of(pid: u32) -> Result<Footprint> {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/{f}"))
                .with_context(|| format!("reading /proc/{pid}/{f}"))
        };
        let status = read("status")?;
        let kb = |key| status_kb(&status, key).with_context(|| format!("no {key} in /proc/{pid}/status"));
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let cpu_ticks =
            stat_cpu_ticks(&read("stat")?).with_context(|| format!("parsing /proc/{pid}/stat"))?;
        Ok(Footprint { rss_kb: kb("VmRSS")?, peak_rss_kb: kb("VmHWM")?, cpu_s: cpu_ticks as f64 / ticks })
    }
}

/// "VmRSS: 21992 kB" (tab-separated) -> 21992.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
}

/// utime + stime (fields 14 and 15) in clock ticks. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its last ')'.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 3 is the first after ')'
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_from_status() {
        let status = "Name:\tmirror-agent\nVmHWM:\t   30000 kB\nVmRSS:\t   21992 kB\nThreads:\t5\n";
        assert_eq!(status_kb(status, "VmRSS"), Some(21992));
        assert_eq!(status_kb(status, "VmHWM"), Some(30000));
        assert_eq!(status_kb(status, "VmSwap"), None);
    }

    #[test]
    fn cpu_ticks_from_stat() {
        let stat = "4242 (mirror (agent)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 5 0";
        assert_eq!(stat_cpu_ticks(stat), Some(175));
        assert_eq!(stat_cpu_ticks("4242 (x) S 1"), None);
    }
}
