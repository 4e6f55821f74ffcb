//! What an agent holds, to compare before and after a churn or a flood: its descriptors and
//! resident memory, the node's links, the filters and TCX programs on the attached veths, the
//! files under its pin path and the entries of its pinned maps.

use std::fmt;
use std::path::Path;

use libbpf_rs::MapCore;

use crate::agent::AgentEnv;
use crate::topology::netns::Netns;

/// Entries of a pinned map of the agent.
#[track_caller]
pub fn map_entries(env: &AgentEnv, map: &str) -> usize {
    let path = env.pin_path().join(map);
    let m =
        libbpf_rs::MapHandle::from_pinned_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    m.keys().count()
}

/// The `max_entries` of a pinned map of the agent.
#[track_caller]
pub fn map_size(env: &AgentEnv, map: &str) -> usize {
    let path = env.pin_path().join(map);
    let m =
        libbpf_rs::MapHandle::from_pinned_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    m.max_entries() as usize
}

/// Files under the agent's pin directory (maps and links).
pub fn pins(env: &AgentEnv) -> usize {
    fn count(p: &Path) -> usize {
        std::fs::read_dir(p)
            .map_or(0, |d| d.flatten().map(|e| if e.path().is_dir() { count(&e.path()) } else { 1 }).sum())
    }
    count(env.pin_path())
}

/// A process's open descriptors and resident memory (KiB).
#[track_caller]
pub fn process(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("reading the agent's fds").count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading its status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    (fds, rss)
}

/// CPU time of process `pid` so far (user and system), from its `/proc` stat (clock ticks of
/// 10 ms).
#[track_caller]
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: a plain query of a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    std::time::Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// The kernel's accounting of BPF programs' run time, on while held (`BPF_ENABLE_STATS`).
pub struct RunTimeStats {
    _on: std::os::fd::OwnedFd,
}

impl RunTimeStats {
    /// Turns the accounting on until dropped.
    pub fn on() -> std::io::Result<RunTimeStats> {
        // SAFETY: a plain syscall wrapper; a non-negative return is a descriptor we own.
        let fd =
            unsafe { libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME) };
        if fd < 0 {
            return Err(std::io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: fd is open and ours alone.
        Ok(RunTimeStats { _on: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) } })
    }
}

/// Runs and run time (ns) so far of the BPF program `name` that process `pid` holds, as the
/// kernel counts them (while [`RunTimeStats`] are on); `None` when it holds none of that name.
pub fn program_runs(pid: u32, name: &str) -> Option<(u64, u64)> {
    let ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok()))
        .collect();
    libbpf_rs::query::ProgInfoIter::default()
        .filter(|p| ids.contains(&p.id) && p.name.to_string_lossy() == name)
        .map(|p| (p.run_cnt, p.run_time_ns))
        .next()
}

/// Links in the node namespace.
pub fn links(node: &Netns) -> usize {
    node.sh("ip -o link show").lines().count()
}

/// TCX programs and tc filters on both hooks of the veths `veths` of `node`.
pub fn filters(node: &Netns, veths: &[&str]) -> usize {
    let tc: usize = veths
        .iter()
        .map(|v| {
            let out = node.sh(&format!("tc filter show dev {v} ingress; tc filter show dev {v} egress"));
            out.lines().filter(|l| l.starts_with("filter")).count()
        })
        .sum();
    let path = node.path();
    let tcx: usize = std::thread::scope(|s| {
        s.spawn(|| {
            crate::topology::netns::join(&path);
            veths
                .iter()
                .map(|v| {
                    let i = mirror_bpf::testing::ifindex(v);
                    [false, true]
                        .map(|egress| mirror_bpf::attach::tcx_prog_ids(i, egress).map_or(0, |ids| ids.len()))
                        .iter()
                        .sum::<usize>()
                })
                .sum()
        })
        .join()
        .expect("querying TCX")
    });
    tc + tcx
}

/// An agent and the kernel state it holds, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// The agent's open descriptors.
    pub fds: usize,
    /// Its resident memory, KiB.
    pub rss_kib: u64,
    /// Links in the node namespace.
    pub links: usize,
    /// TCX programs and tc filters on the watched veths.
    pub filters: usize,
    /// Files under the pin path.
    pub pins: usize,
    /// Entries of each watched pinned map.
    pub entries: Vec<(String, usize)>,
}

impl Footprint {
    /// Takes the figures of the agent `pid` of `env` in `node`, its filters on `veths`, the
    /// entries of `maps`.
    pub fn take(pid: u32, env: &AgentEnv, node: &Netns, veths: &[&str], maps: &[&str]) -> Footprint {
        let (fds, rss_kib) = process(pid);
        Footprint {
            fds,
            rss_kib,
            links: links(node),
            filters: filters(node, veths),
            pins: pins(env),
            entries: maps.iter().map(|m| (m.to_string(), map_entries(env, m))).collect(),
        }
    }

    /// Entries of `map` (one of those taken).
    #[track_caller]
    pub fn entries(&self, map: &str) -> usize {
        self.entries.iter().find(|(m, _)| m == map).unwrap_or_else(|| panic!("{map} not taken")).1
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fds {}, RSS {} KiB, links {}, filters {}, pins {}",
            self.fds, self.rss_kib, self.links, self.filters, self.pins
        )?;
        for (m, n) in &self.entries {
            write!(f, ", {m} {n}")?;
        }
        Ok(())
    }
}
