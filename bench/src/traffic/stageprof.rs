//! Where the classifier's time goes, by stage: `perf record -a -g` during a load, with
//! `net.core.bpf_jit_kallsyms` on so that every JITed BPF function (each stage is a global
//! function) has a symbol. Each sample whose stack holds an entry program is attributed to the
//! innermost BPF function on it: the helpers a stage calls (map lookups, clock reads, packet
//! loads) count with that stage, as their cost is the stage's.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use super::cmd;

/// Sampling rate, per CPU: high enough for a few thousand samples in the programs in 5 s.
const FREQ: &str = "10000";

/// A `perf record` running over the whole machine, and the kallsyms setting to restore.
pub struct Recording {
    child: Child,
    data: tempfile::TempPath,
    kallsyms_was: String,
}

/// Whether `perf` is installed (the stage is left out of the report, with the reason, if not).
pub fn available() -> bool {
    Command::new("perf").arg("--version").output().is_ok_and(|o| o.status.success())
}

impl Recording {
    /// Starts sampling every CPU for `secs` seconds.
    pub fn start(secs: u32) -> Result<Recording> {
        let kallsyms_was = std::fs::read_to_string(KALLSYMS).context("reading bpf_jit_kallsyms")?;
        std::fs::write(KALLSYMS, "1").context("turning bpf_jit_kallsyms on")?;
        let data = tempfile::Builder::new().prefix("stageprof").suffix(".data").tempfile()?.into_temp_path();
        let child = Command::new("perf")
            .args(["record", "-F", FREQ, "-a", "-g", "-q", "-o"])
            .arg(&data)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf record")?;
        Ok(Recording { child, data, kallsyms_was })
    }

    /// Waits for the recording to end; the samples under each of `entries`, by stage.
    pub fn finish(mut self, entries: &[&str]) -> Result<Vec<StageShare>> {
        let status = self.child.wait().context("waiting for perf record")?;
        anyhow::ensure!(status.success(), "perf record failed ({status})");
        let mut script = Command::new("perf");
        script.args(["script", "-F", "ip,sym", "-i"]).arg(&self.data);
        let out = cmd::run(script, "perf script")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(file) = std::env::var_os("MIRROR_BENCH_LINES") {
            // The programs are still loaded: their JITed lines can be read now.
            let lines = hot_lines(&text, &mirror_bpf::programs::jited_lines(entries));
            std::fs::write(&file, lines).with_context(|| format!("writing {}", file.to_string_lossy()))?;
        }
        Ok(attribute(&text, entries))
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::write(KALLSYMS, self.kallsyms_was.trim());
    }
}

const KALLSYMS: &str = "/proc/sys/net/core/bpf_jit_kallsyms";

/// The pseudo-entry whose one share counts every sample of every CPU (the denominator of the
/// programs' share of all CPU time).
pub const ALL_SAMPLES: &str = "*";

/// Samples of one stage under one entry program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageShare {
    pub entry: String,
    pub stage: String,
    pub samples: u64,
}

/// The BPF function a JITed symbol names ("bpf_prog_<tag>_<name>"), if it is one.
fn bpf_name(sym: &str) -> Option<&str> {
    let rest = sym.strip_prefix("bpf_prog_")?;
    let (tag, name) = rest.split_once('_')?;
    (tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// Attributes the samples of `perf script -F ip,sym` output (one stack per block, innermost
/// frame first) whose stack holds one of `entries` to the innermost BPF function on it.
pub fn attribute(script: &str, entries: &[&str]) -> Vec<StageShare> {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut frames: Vec<&str> = Vec::new();
    let mut flush = |frames: &mut Vec<&str>| {
        if !frames.is_empty() {
            *counts.entry((ALL_SAMPLES.to_string(), ALL_SAMPLES.to_string())).or_default() += 1;
        }
        let names: Vec<&str> = frames.iter().filter_map(|s| bpf_name(s)).collect();
        if let Some(entry) = names.iter().find(|n| entries.contains(n)) {
            *counts.entry((entry.to_string(), names[0].to_string())).or_default() += 1;
        }
        frames.clear();
    };
    for line in script.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some(ip), Some(sym)) if ip.bytes().all(|b| b.is_ascii_hexdigit()) => {
                frames.push(sym.split('+').next().unwrap_or(sym));
            }
            _ if line.trim().is_empty() => flush(&mut frames),
            _ => {}
        }
    }
    flush(&mut frames);
    let mut out: Vec<StageShare> =
        counts.into_iter().map(|((entry, stage), samples)| StageShare { entry, stage, samples }).collect();
    out.sort_by(|a, b| a.entry.cmp(&b.entry).then(b.samples.cmp(&a.samples)));
    out
}

/// The source lines the samples of `script` fell on (innermost frame in a JITed BPF program,
/// found in `lines`, sorted by address), hottest first: `MIRROR_BENCH_LINES=FILE` writes them.
pub fn hot_lines(script: &str, lines: &[mirror_bpf::programs::JitedLine]) -> String {
    let mut counts: BTreeMap<usize, u64> = BTreeMap::new();
    let mut first = true;
    let mut total = 0u64;
    for line in script.lines() {
        if line.trim().is_empty() {
            first = true;
            continue;
        }
        if !first {
            continue;
        }
        first = false;
        let mut words = line.split_whitespace();
        let (Some(ip), Some(sym)) = (words.next(), words.next()) else { continue };
        if bpf_name(sym.split('+').next().unwrap_or(sym)).is_none() {
            continue;
        }
        let Ok(ip) = u64::from_str_radix(ip, 16) else { continue };
        let at = lines.partition_point(|l| l.addr <= ip);
        if at > 0 {
            *counts.entry(at - 1).or_default() += 1;
            total += 1;
        }
    }
    let mut hot: Vec<(usize, u64)> = counts.into_iter().collect();
    hot.sort_by_key(|h| std::cmp::Reverse(h.1));
    let mut out = format!("{total} samples in JITed BPF lines\n");
    for (i, n) in hot.into_iter().take(60) {
        let l = &lines[i];
        out.push_str(&format!(
            "{n:6} {:5.1}%  {:16} {:24} {}\n",
            100.0 * n as f64 / total.max(1) as f64,
            l.prog,
            l.place,
            l.text
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "\
\tffffffffc0004c18 bpf_prog_d3d4a5bdcbc7a5a4_http_headers+0x1c8
\tffffffffc0003d0c bpf_prog_15080c13628bc933_http_message+0x5b6
\tffffffffc00010f4 bpf_prog_6ff401f5dbae1c2b_classify+0x55b
\tffffffffc0000648 bpf_prog_14693b2af936169c_tcx_ingress_mirror+0x15
\tffffffff81a00000 __netif_receive_skb_core+0x10

\tffffffff81b00000 lookup_nulls_elem_raw+0x20
\tffffffff81b00100 htab_map_lookup_elem+0x10
\tffffffffc00010f4 bpf_prog_6ff401f5dbae1c2b_classify+0x1aa
\tffffffffc0000648 bpf_prog_14693b2af936169c_tcx_ingress_mirror+0x15

\tffffffff81c00000 tcp_ack+0x30
\tffffffff81c00100 tcp_rcv_established+0x40

\tffffffffc00010f4 bpf_prog_6ff401f5dbae1c2b_classify+0x56
\tffffffffc0000700 bpf_prog_0dbc14080e2d6495_tcx_egress_mirror+0x15
";

    #[test]
    fn samples_go_to_the_innermost_bpf_function_under_their_entry() {
        let got = attribute(SCRIPT, &["tcx_ingress_mirror", "tcx_egress_mirror"]);
        let share = |e: &str, s: &str| got.iter().find(|x| x.entry == e && x.stage == s).map(|x| x.samples);
        assert_eq!(share("tcx_ingress_mirror", "http_headers"), Some(1));
        // A helper's sample counts with the stage that called it.
        assert_eq!(share("tcx_ingress_mirror", "classify"), Some(1));
        assert_eq!(share("tcx_egress_mirror", "classify"), Some(1));
        // Samples outside our programs are not counted, only in the total of every sample.
        assert_eq!(got.iter().filter(|x| x.entry != ALL_SAMPLES).map(|x| x.samples).sum::<u64>(), 3);
        assert_eq!(share(ALL_SAMPLES, ALL_SAMPLES), Some(4));
    }

    #[test]
    fn only_jited_bpf_symbols_are_bpf_functions() {
        assert_eq!(bpf_name("bpf_prog_6ff401f5dbae1c2b_classify"), Some("classify"));
        assert_eq!(bpf_name("bpf_prog_6ff401f5dbae1c2b_tcx_ingress_mirror"), Some("tcx_ingress_mirror"));
        assert_eq!(bpf_name("bpf_prog_run_generic"), None);
        assert_eq!(bpf_name("htab_map_lookup_elem"), None);
    }
}
