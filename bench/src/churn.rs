//! Attach latency under churn: a burst of new veths (50 by default, created with one
//! `ip -batch` as pods appear) under a running agent, per way of attaching: TCX with
//! expedited RCU grace periods (the default), TCX with normal ones, and tc. Then where the
//! time of one attach goes, by phase, with the data path attached from this process to the
//! same kind of burst: TCX link creation (one RCU grace period per hook, under RTNL), pinning,
//! map updates.

use std::fmt::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use mirror_bpf::{AttachMode, AttachTimings, Datapath, DatapathOptions, MirrorMethod};
use mirror_e2e::agent::Binaries;
use mirror_e2e::topology::netns::Netns;

use crate::host::Host;
use crate::report::{self, Check};
use crate::traffic::attach::{self, AttachRun};
use crate::traffic::Method;

/// The bar: from link event to classifier attached, in a burst of 50, with TCX.
pub const P99_BAR_MS: f64 = 100.0;

/// One way of attaching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub label: &'static str,
    pub method: Method,
    pub expedite_rcu: bool,
}

/// The ways measured: the default first.
pub const VARIANTS: [Variant; 3] = [
    Variant { label: "TCX, expedited RCU (default)", method: Method::Clone, expedite_rcu: true },
    Variant { label: "TCX, normal RCU", method: Method::Clone, expedite_rcu: false },
    Variant { label: "tc (clsact + cls_bpf)", method: Method::CloneTc, expedite_rcu: true },
];

/// The attach phases of one veth, in this process (no agent).
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseRun {
    pub expedite_rcu: bool,
    /// Medians and maxima over the veths, ms: (hooks, pin, maps, total).
    pub median_ms: [f64; 4],
    pub max_ms: [f64; 4],
    /// The whole burst, s.
    pub all_s: f64,
    /// Detaching them all again, s.
    pub detach_s: f64,
}

/// Results of the benchmark.
pub struct Results {
    pub veths: usize,
    pub agent: Vec<(Variant, AttachRun)>,
    pub phases: Vec<PhaseRun>,
}

/// Runs every variant `reps` times with a burst of `veths`.
pub fn run(bins: &Binaries, veths: usize, reps: usize) -> Result<Results> {
    let mut agent = Vec::new();
    for rep in 0..reps {
        for v in VARIANTS {
            let run = attach::measure_with(bins, veths, v.method, v.expedite_rcu)
                .with_context(|| format!("{} (rep {})", v.label, rep + 1))?;
            eprintln!(
                "  {veths} veths, {} (rep {}): attach p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; all attached in {:.3} s",
                v.label,
                rep + 1,
                run.p50_ms,
                run.p99_ms,
                run.max_ms,
                run.all_attached_s
            );
            agent.push((v, run));
        }
    }
    let mut phases = Vec::new();
    for expedite_rcu in [true, false] {
        let p = phases_of(veths, expedite_rcu)?;
        eprintln!(
            "  phases, expedited RCU {expedite_rcu}: hooks {:.2} ms, pin {:.3} ms, maps {:.3} ms (medians)",
            p.median_ms[0], p.median_ms[1], p.median_ms[2]
        );
        phases.push(p);
    }
    Ok(Results { veths, agent, phases })
}

/// Attaches the data path from this process to `veths` new veths in a namespace of its own,
/// one after the other, and returns where the time went.
pub fn phases_of(veths: usize, expedite_rcu: bool) -> Result<PhaseRun> {
    let node = Netns::new("churnph");
    let pins = tempfile::Builder::new().prefix("mirror-churn-").tempdir_in("/sys/fs/bpf")?;
    let marker = tempfile::NamedTempFile::new()?.into_temp_path();
    let batch = node_batch(veths);
    let file = std::env::temp_dir().join(format!("mirror-churn-{}-{expedite_rcu}.batch", std::process::id()));
    std::fs::write(&file, batch)?;
    let out = node.command("ip").arg("-batch").arg(&file).output()?;
    let _ = std::fs::remove_file(&file);
    anyhow::ensure!(out.status.success(), "ip -batch: {}", String::from_utf8_lossy(&out.stderr));
    let _entered = node.enter();
    let dp: Datapath<'static> = mirror_bpf::testing::load(&DatapathOptions {
        pin_path: Some(pins.path().join("dp")),
        only: Some((AttachMode::Tcx, MirrorMethod::Clone)),
        expedite_rcu: expedite_rcu.then(|| marker.to_path_buf()),
        ..DatapathOptions::default()
    });
    let start = std::time::Instant::now();
    let mut atts = Vec::new();
    let mut rows: Vec<[f64; 4]> = Vec::new();
    for i in 0..veths {
        let ifindex = mirror_bpf::testing::ifindex(&format!("vethb{i}"));
        let t = std::time::Instant::now();
        let att = dp.attach(ifindex, AttachMode::Tcx, MirrorMethod::Clone)?;
        let total = t.elapsed();
        let AttachTimings { hooks, pin, maps, .. } = att.timings;
        rows.push([ms(hooks), ms(pin), ms(maps), ms(total)]);
        atts.push(att);
    }
    let all_s = start.elapsed().as_secs_f64();
    let start = std::time::Instant::now();
    for att in atts {
        dp.detach(att)?;
    }
    let detach_s = start.elapsed().as_secs_f64();
    let mut run = PhaseRun { expedite_rcu, all_s, detach_s, ..PhaseRun::default() };
    for k in 0..4 {
        let mut col: Vec<f64> = rows.iter().map(|r| r[k]).collect();
        col.sort_by(f64::total_cmp);
        run.median_ms[k] = col[col.len() / 2];
        run.max_ms[k] = col[col.len() - 1];
    }
    Ok(run)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `ip -batch` lines creating `n` veth pairs `vethbI`/`pbI`, the host side up.
fn node_batch(n: usize) -> String {
    (0..n).map(|i| format!("link add vethb{i} type veth peer name pb{i}\nlink set vethb{i} up\n")).collect()
}

/// The bar, checked on every run of the default variant.
pub fn checks(r: &Results) -> Vec<Check> {
    r.agent
        .iter()
        .filter(|(v, _)| *v == VARIANTS[0])
        .map(|(v, run)| Check {
            what: format!(
                "{}: attach p99 {:.1} ms ≤ {P99_BAR_MS} ms in a burst of {} veths ({} mode)",
                v.label, run.p99_ms, r.veths, run.mode
            ),
            pass: run.p99_ms <= P99_BAR_MS,
        })
        .collect()
}

/// The markdown report.
pub fn render(host: &Host, settings: &[(&str, String)], r: &Results) -> String {
    let mut s = String::new();
    report::write_head(&mut s, "Attach latency under churn", host, settings);
    let _ = writeln!(
        s,
        "\nA running agent (rules: one that nothing matches), then {} veth pairs created at once \
         with one `ip -batch` in its node namespace (host side up, as a CNI does). Latency is the \
         agent's own, from the link event received to the classifier attached at ingress and \
         egress (`mirrorctl status`, `attach_latency`); \"created\" is how long `ip -batch` took \
         while the agent attached (it waits for the RTNL lock too).\n",
        r.veths
    );
    let _ =
        writeln!(s, "| attach | mode | p50 ms | p99 ms | max ms | created s | all attached s | all gone s |");
    let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|");
    for (v, run) in &r.agent {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} |",
            v.label,
            run.mode,
            run.p50_ms,
            run.p99_ms,
            run.max_ms,
            run.create_s,
            run.all_attached_s,
            run.all_gone_s
        );
    }
    let _ = writeln!(
        s,
        "\n### Where the time goes\n\nThe data path attached with TCX from the benchmark's process \
         to {} new veths one after the other (no agent, no link events, nothing else creating \
         links): per veth, the two `bpf_link_create` calls (each waits for an RCU grace period \
         holding RTNL, `tcx_entry_sync`), pinning both links, and recording the interface \
         (`attached_ifaces`, attach epoch).\n",
        r.veths
    );
    let _ =
        writeln!(s, "| RCU grace periods | link create ms | pin ms | maps ms | per veth ms (max) | all s | detach all s |");
    let _ = writeln!(s, "|---|--:|--:|--:|--:|--:|--:|");
    for p in &r.phases {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} ({:.3}) | {:.3} | {:.3} |",
            if p.expedite_rcu { "expedited" } else { "normal" },
            p.median_ms[0],
            p.median_ms[1],
            p.median_ms[2],
            p.median_ms[3],
            p.max_ms[3],
            p.all_s,
            p.detach_s
        );
    }
    let _ = writeln!(
        s,
        "\nWith normal grace periods the floor is the kernel's: two grace periods per veth, \
         serialised by RTNL (parallel attaches would only queue on the lock), so the n-th veth \
         of a burst waits about 2·n grace periods. Expedited grace periods (`attach.expedite_rcu`, \
         on by default: `/sys/kernel/rcu_expedited` held around each of our TCX link changes) \
         take that wait down to microseconds; pinning and map updates were never the cost."
    );
    report::write_bars(&mut s, &checks(r));
    s
}
