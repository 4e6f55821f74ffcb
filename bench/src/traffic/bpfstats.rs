//! Run time of the agent's BPF programs during a load, from the kernel's own accounting
//! (BPF_ENABLE_STATS: run_time_ns and run_cnt per program). Accounting costs two clock reads
//! per run, so it is on only for the profile runs, never while throughput is measured.

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::query::ProgInfoIter;
use mirror_bpf::attach::TcxLink;
use mirror_bpf::skel::baseline::BaselineSkel;
use mirror_e2e::topology::netns::Netns;

/// Keeps run-time accounting on while held.
pub struct StatsOn {
    _fd: OwnedFd,
}

impl StatsOn {
    pub fn enable() -> Result<StatsOn> {
        // SAFETY: plain syscall wrapper; a non-negative return is a new fd we own.
        let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
        if fd < 0 {
            bail!("BPF_ENABLE_STATS: {}", std::io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: fd is open and ours alone.
        Ok(StatsOn { _fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }
}

/// One program's accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgRun {
    pub name: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

impl ProgRun {
    /// Mean ns per run.
    pub fn ns_per_run(&self) -> f64 {
        self.run_time_ns as f64 / self.run_cnt.max(1) as f64
    }
}

/// Accounting of the programs process `pid` holds open (its loaded skeleton), by name.
pub fn programs_of(pid: u32) -> Result<Vec<ProgRun>> {
    let ids = prog_ids(pid)?;
    let mut out: Vec<ProgRun> = ProgInfoIter::default()
        .filter(|p| ids.contains(&p.id))
        .map(|p| ProgRun {
            name: p.name.to_string_lossy().into_owned(),
            run_cnt: p.run_cnt,
            run_time_ns: p.run_time_ns,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The change from `before` to `after`, for programs that ran meanwhile.
pub fn delta(before: &[ProgRun], after: &[ProgRun]) -> Vec<ProgRun> {
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.name == a.name);
            let run_cnt = a.run_cnt - b.map_or(0, |b| b.run_cnt);
            let run_time_ns = a.run_time_ns - b.map_or(0, |b| b.run_time_ns);
            (run_cnt > 0).then(|| ProgRun { name: a.name.clone(), run_cnt, run_time_ns })
        })
        .collect()
}

/// The baseline programs, attached with TCX at both hooks of some interfaces: what the
/// classifier's run time is compared with, on the same hooks under the same load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// The empty program.
    Empty,
    /// The parser alone.
    Parse,
    /// The floor of a flow monitor: parse, the packet's time and one per-CPU LRU flow-table
    /// update.
    Floor,
    /// The same floor with the classifier's flow cache in front of the table.
    Cached,
}

impl Baseline {
    fn prefix(self) -> &'static str {
        match self {
            Baseline::Empty => "tcx_empty",
            Baseline::Parse => "tcx_parse",
            Baseline::Floor => "tcx_floor",
            Baseline::Cached => "tcx_cached",
        }
    }
}

/// A baseline attached (see [`Baseline`]); detached when dropped.
pub struct BaselineAttached {
    which: Baseline,
    _links: Vec<TcxLink>,
    _skel: BaselineSkel<'static>,
}

impl BaselineAttached {
    /// Attaches `which` to `veths` of the namespace `node` (at the head of each hook, as the agent).
    pub fn new(node: &Netns, veths: &[&str], which: Baseline) -> Result<BaselineAttached> {
        let skel = mirror_bpf::testing::empty_program()?;
        let _in = node.enter();
        let mut links = Vec::new();
        for veth in veths {
            let ifindex = mirror_bpf::testing::ifindex(veth);
            let p = &skel.progs;
            let progs = match which {
                Baseline::Empty => [&p.tcx_empty_ingress, &p.tcx_empty_egress],
                Baseline::Parse => [&p.tcx_parse_ingress, &p.tcx_parse_egress],
                Baseline::Floor => [&p.tcx_floor_ingress, &p.tcx_floor_egress],
                Baseline::Cached => [&p.tcx_cached_ingress, &p.tcx_cached_egress],
            };
            for (prog, egress) in progs.into_iter().zip([false, true]) {
                let link = mirror_bpf::attach::attach_tcx(prog, ifindex, egress)
                    .with_context(|| format!("attaching the {which:?} program to {veth}"))?;
                links.push(link);
            }
        }
        Ok(BaselineAttached { which, _links: links, _skel: skel })
    }

    /// The accounting of the attached programs (this process holds them).
    pub fn programs(&self) -> Result<Vec<ProgRun>> {
        let prefix = self.which.prefix();
        Ok(programs_of(std::process::id())?.into_iter().filter(|p| p.name.starts_with(prefix)).collect())
    }
}

/// Runs and run time of the programs of one hook kind ("ingress" or "egress") in `progs`.
pub fn hook_total(progs: &[ProgRun], hook: &str) -> ProgRun {
    let of: Vec<&ProgRun> = progs.iter().filter(|p| p.name.contains(hook)).collect();
    ProgRun {
        name: hook.into(),
        run_cnt: of.iter().map(|p| p.run_cnt).sum(),
        run_time_ns: of.iter().map(|p| p.run_time_ns).sum(),
    }
}

/// Ids of the BPF programs behind the file descriptors of `pid` ("prog_id:" in fdinfo).
fn prog_ids(pid: u32) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let text = std::fs::read_to_string(entry?.path()).unwrap_or_default();
        ids.extend(fdinfo_prog_id(&text));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

fn fdinfo_prog_id(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, run_cnt: u64, run_time_ns: u64) -> ProgRun {
        ProgRun { name: name.into(), run_cnt, run_time_ns }
    }

    #[test]
    fn delta_keeps_programs_that_ran() {
        let before = [p("tcx_ingress_mir", 10, 1000), p("tc_empty", 5, 50)];
        let after = [p("tcx_ingress_mir", 110, 21000), p("tc_empty", 5, 50), p("tcx_egress_mirr", 4, 400)];
        assert_eq!(delta(&before, &after), [p("tcx_ingress_mir", 100, 20000), p("tcx_egress_mirr", 4, 400)]);
        assert_eq!(delta(&before, &after)[0].ns_per_run(), 200.0);
    }

    #[test]
    fn hook_totals_sum_the_programs_of_a_hook() {
        let progs =
            [p("tcx_ingress_mir", 10, 1000), p("tcx_empty_ingr", 5, 50), p("tcx_egress_mirr", 4, 400)];
        assert_eq!(hook_total(&progs, "ingr"), p("ingr", 15, 1050));
        assert_eq!(hook_total(&progs, "egre").ns_per_run(), 100.0);
    }

    #[test]
    fn prog_id_from_fdinfo() {
        let prog =
            "pos:\t0\nflags:\t02000002\nprog_type:\t3\nprog_jited:\t1\nprog_id:\t812\nrun_time_ns:\t0\n";
        assert_eq!(fdinfo_prog_id(prog), Some(812));
        assert_eq!(fdinfo_prog_id("pos:\t0\nmap_type:\t1\nmap_id:\t3\n"), None);
    }
}
