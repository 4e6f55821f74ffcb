//! What loading costs, per attach mode and mirror method: the time to load the classifier
//! (the verifier's share dominates) and the instructions the verifier walked per program.

use std::fmt::Write;
use std::os::fd::AsFd;
use std::time::Instant;

use anyhow::{Context, Result};
use libbpf_rs::skel::Skel;
use mirror_bpf::{testing, AttachMode, DatapathOptions, MirrorMethod};

/// One load.
pub struct Load {
    /// Mode and method.
    pub what: &'static str,
    /// Median of the load times, ms.
    pub ms: f64,
    /// Each loaded program and the instructions the verifier processed for it.
    pub programs: Vec<(String, u32)>,
}

const MODES: [(&str, AttachMode, MirrorMethod); 3] = [
    ("TCX, clone", AttachMode::Tcx, MirrorMethod::Clone),
    ("tc, clone", AttachMode::Tc, MirrorMethod::Clone),
    ("tc, mirred", AttachMode::Tc, MirrorMethod::Mirred),
];

/// Loads each mode `repeat` times (the first load of a process also pays for BTF parsing).
pub fn measure(repeat: usize) -> Result<Vec<Load>> {
    MODES
        .iter()
        .map(|&(what, mode, method)| {
            let mut times = Vec::new();
            let mut programs = Vec::new();
            for _ in 0..repeat.max(1) {
                let opts = DatapathOptions { only: Some((mode, method)), ..DatapathOptions::default() };
                let start = Instant::now();
                let dp = testing::load(&opts);
                times.push(start.elapsed().as_secs_f64() * 1e3);
                programs = dp
                    .skel()
                    .object()
                    .progs()
                    .filter(|p| p.autoload())
                    .map(|p| Ok((p.name().to_string_lossy().into_owned(), verified_insns(p.as_fd())?)))
                    .collect::<Result<Vec<_>>>()?;
            }
            times.sort_by(f64::total_cmp);
            Ok(Load { what, ms: times[times.len() / 2], programs })
        })
        .collect()
}

/// The instructions the verifier processed for a loaded program (kernel 5.16+).
fn verified_insns(fd: std::os::fd::BorrowedFd<'_>) -> Result<u32> {
    let (_, insns) = mirror_bpf::programs::prog_info(fd).context("reading program info")?;
    Ok(insns)
}

/// The "Program loads" section of the report.
pub fn render(loads: &[Load]) -> String {
    let mut s = String::from("\n## Program loads\n\n");
    let _ = writeln!(s, "| mode, method | load (ms, median) | program: instructions verified |");
    let _ = writeln!(s, "|---|---:|---|");
    for l in loads {
        let progs: Vec<String> = l.programs.iter().map(|(n, i)| format!("{n}: {i}")).collect();
        let _ = writeln!(s, "| {} | {:.0} | {} |", l.what, l.ms, progs.join(", "));
    }
    s
}
