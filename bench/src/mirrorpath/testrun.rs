//! ns per copied packet under BPF_PROG_TEST_RUN: one marked flow, its ACK run through
//! `tc_ingress_mirror` with the copy going each way in turn, beside the same packet with no
//! mirror interface (the classifier's own work) and the empty program, interleaved run after
//! run. Under test_run the whole copy happens in the measured call: clone, transmit, and the
//! sink's receive path (the softirq runs when the transmit path re-enables bottom halves).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use mirror_bpf::testing::consts::{PORT_HTTP, REQ_GET_BAR, RESP_500, V4_CLIENT, V4_SERVER};
use mirror_bpf::testing::packet::{tcp_flags, PacketBuilder};
use mirror_bpf::testing::{self, run_repeat, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{Datapath, DatapathOptions, FlowKey};

use super::perf::{self, Breakdown};
use super::sinks::{self, SinkKind, Variant};
use crate::stats::median;

/// A client port of its own: nothing else in this namespace uses the flow.
const CLIENT_PORT: u16 = 47000;
const RULE: &str = "status=500 packets=0 bytes=0 duration=0";

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub repeat: u32,
    pub runs: usize,
    /// Seconds of sampling per variant with perf (0: no profile).
    pub perf_secs: u32,
}

/// One variant's result.
#[derive(Debug, Clone)]
pub struct Row {
    pub variant: Variant,
    /// Median ns per packet over runs.
    pub ns: f64,
    pub min: f64,
    pub max: f64,
    /// Median of the per-run differences with the no-copy case: ns per copy.
    pub copy_ns: f64,
    /// Median ns of the empty program.
    pub empty_ns: f64,
    /// Where the copies ended up: link counters' changes over the runs.
    pub delivered: String,
    /// perf's breakdown, if profiled: ns per packet under each function.
    pub profile: Option<Breakdown>,
}

/// The result: variants measured, and sink kinds this kernel lacks (with why).
pub struct Results {
    pub rows: Vec<Row>,
    pub missing: Vec<(SinkKind, String)>,
    pub plan: Plan,
    pub cpu: usize,
}

/// Runs in a thread of its own, pinned to `cpu`, in a private network namespace.
pub fn run(plan: Plan, cpu: usize) -> Result<Results> {
    std::thread::spawn(move || {
        testing::enter_private_netns();
        mirror_bpf::testing::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
        measure(plan, cpu)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn frames() -> (Vec<Vec<u8>>, Vec<u8>, FlowKey) {
    let client = SocketAddr::new(IpAddr::V4(V4_CLIENT), CLIENT_PORT);
    let server = SocketAddr::new(IpAddr::V4(V4_SERVER), PORT_HTTP);
    let get = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .tcp(CLIENT_PORT, PORT_HTTP, tcp_flags::ACK | tcp_flags::PSH)
        .seq(1000)
        .payload(REQ_GET_BAR)
        .build();
    let resp = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .tcp(PORT_HTTP, CLIENT_PORT, tcp_flags::ACK | tcp_flags::PSH)
        .seq(5000)
        .payload(RESP_500)
        .build();
    let ack = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .tcp(CLIENT_PORT, PORT_HTTP, tcp_flags::ACK)
        .seq(1000 + REQ_GET_BAR.len() as u32)
        .build();
    (vec![get, resp], ack, FlowKey::new(client, server, 6))
}

fn link_counters(dev: &str) -> [u64; 4] {
    // rx packets, rx dropped, tx packets, tx dropped
    let out = testing::sh(&format!("ip -s -s -j link show dev {dev}"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let s = &v[0]["stats64"];
    let n = |a: &str, b: &str| s[a][b].as_u64().unwrap_or(0);
    [n("rx", "packets"), n("rx", "dropped"), n("tx", "packets"), n("tx", "dropped")]
}

/// Changes of the link counters of the interfaces a variant involves, and the copies made.
#[derive(Debug, Clone, Default)]
struct Moved {
    links: Vec<[u64; 4]>,
    copies: u64,
    errors: u64,
}

/// What the link counters say happened to the copies.
fn describe(devs: &[&str], moved: &Moved) -> String {
    let copies = moved.copies;
    let mut parts = Vec::new();
    for (dev, d) in devs.iter().zip(&moved.links) {
        let names = ["rx", "rx dropped", "tx", "tx dropped"];
        let what: Vec<String> = d
            .iter()
            .zip(names)
            .filter(|(n, _)| **n > 0)
            .map(|(n, name)| format!("{name} {:.2}", *n as f64 / copies.max(1) as f64))
            .collect();
        if !what.is_empty() {
            parts.push(format!("{dev}: {}", what.join(", ")));
        }
    }
    let mut text = if parts.is_empty() { "no link counter moved".into() } else { parts.join("; ") };
    if moved.errors > 0 {
        text.push_str(&format!(
            "; bpf_clone_redirect returned an error for {:.0}% of copies",
            100.0 * moved.errors as f64 / copies.max(1) as f64
        ));
    }
    text
}

fn measure(plan: Plan, cpu: usize) -> Result<Results> {
    let (made, missing) = sinks::create_all(|cmd| {
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(cmd);
        sinks::try_sh(c)
    });
    let mut dp = testing::load(&DatapathOptions::default());
    dp.add_rule(RULE.parse()?)?;
    let empty = testing::empty_program()?;
    let ctx = SkbContext::default();
    let (prime, ack, _key) = frames();
    for f in &prime {
        let (verdict, _, _) = run_repeat(&dp.skel().progs.tc_ingress_mirror, f, ctx, 1);
        ensure!(verdict == VERDICT_CONTINUE, "priming: verdict {verdict}");
    }
    ensure!(dp.counters()?.get(stat_idx::STAT_TRIGGERS) == 1, "priming did not mark the flow");

    let variants: Vec<Variant> = sinks::selected()
        .into_iter()
        .filter(|v| v.test_run() && v.sink().is_none_or(|k| made.contains(&k)))
        .collect();
    // Warm-up: caches, JIT images, the sinks' first packets.
    for v in &variants {
        one_run(&mut dp, &empty.progs.tc_empty, v, &ack, ctx, (plan.repeat / 10).max(1))?;
    }
    let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); variants.len()];
    let devs_of = |v: &Variant| -> Vec<&'static str> {
        v.sink().map(|k| std::iter::once(k.dev()).chain(k.peer()).collect()).unwrap_or_default()
    };
    let mut moved: Vec<Moved> = variants
        .iter()
        .map(|v| Moved { links: vec![[0; 4]; devs_of(v).len()], ..Moved::default() })
        .collect();
    for run in 0..plan.runs {
        eprintln!("test_run: run {}/{}", run + 1, plan.runs);
        for (i, v) in variants.iter().enumerate() {
            let devs = devs_of(v);
            let links0: Vec<[u64; 4]> = devs.iter().map(|d| link_counters(d)).collect();
            let before = dp.counters()?;
            let s = one_run(&mut dp, &empty.progs.tc_empty, v, &ack, ctx, plan.repeat)?;
            let d = dp.counters()?.since(&before);
            let links1: Vec<[u64; 4]> = devs.iter().map(|d| link_counters(d)).collect();
            for (k, (a, b)) in links1.iter().zip(&links0).enumerate() {
                for f in 0..4 {
                    moved[i].links[k][f] += a[f] - b[f];
                }
            }
            moved[i].errors += check(v, &d)?;
            moved[i].copies += d.get(stat_idx::STAT_MIRRORED_PACKETS) + d.get(stat_idx::STAT_MIRROR_ERRORS);
            samples[i].push(s);
        }
    }
    let base: Vec<f64> = samples[0].iter().map(|s| s.0).collect();
    let mut rows = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let ns: Vec<f64> = samples[i].iter().map(|s| s.0).collect();
        let copy: Vec<f64> = ns.iter().zip(&base).map(|(a, b)| a - b).collect();
        let empty: Vec<f64> = samples[i].iter().map(|s| s.1).collect();
        rows.push(Row {
            variant: *v,
            ns: median(&ns),
            min: ns.iter().copied().fold(f64::INFINITY, f64::min),
            max: ns.iter().copied().fold(0.0, f64::max),
            copy_ns: median(&copy),
            empty_ns: median(&empty),
            delivered: if v.sink().is_some() { describe(&devs_of(v), &moved[i]) } else { String::new() },
            profile: None,
        });
    }
    if plan.perf_secs > 0 {
        for row in &mut rows {
            row.profile = Some(profile(&mut dp, &row.variant, &ack, ctx, cpu, plan.perf_secs)?);
        }
    }
    Ok(Results { rows, missing, plan, cpu })
}

fn set_target(dp: &mut Datapath<'static>, v: &Variant) -> Result<()> {
    let ifindex = v.dev().map_or(0, testing::ifindex);
    dp.set_mirror_target(ifindex, v.delivery)?;
    Ok(())
}

fn one_run(
    dp: &mut Datapath<'static>,
    empty: &libbpf_rs::ProgramMut<'static>,
    v: &Variant,
    frame: &[u8],
    ctx: SkbContext,
    repeat: u32,
) -> Result<(f64, f64)> {
    set_target(dp, v)?;
    let (_, _, empty_ns) = run_repeat(empty, frame, ctx, repeat);
    let (verdict, _, ns) = run_repeat(&dp.skel().progs.tc_ingress_mirror, frame, ctx, repeat);
    ensure!(verdict == VERDICT_CONTINUE, "{}: verdict {verdict}", v.key);
    Ok((ns, empty_ns))
}

/// The copy path the variant stands for was taken, and nothing failed.
fn check(v: &Variant, d: &mirror_bpf::Counters) -> Result<u64> {
    let (grows, stays) = if v.dev().is_none() {
        (stat_idx::STAT_MIRROR_NO_TARGET, stat_idx::STAT_MIRRORED_PACKETS)
    } else {
        (stat_idx::STAT_MIRRORED_PACKETS, stat_idx::STAT_MIRROR_NO_TARGET)
    };
    // A copy the sink refuses (bpf_clone_redirect returns the transmit's error) is counted as
    // a copy error: the path was taken all the same, and the report says so.
    let errors = d.get(stat_idx::STAT_MIRROR_ERRORS);
    ensure!(d.get(grows) + errors > 0, "{}: the copy path was not taken", v.key);
    ensure!(d.get(stays) == 0, "{}: not the path meant", v.key);
    Ok(errors)
}

/// Samples the CPU while the variant runs back to back for `secs`: ns per packet of each stage
/// of the copy, the samples under `bpf_test_run` standing for the ns per packet test_run
/// reports (others may run on the CPU).
fn profile(
    dp: &mut Datapath<'static>,
    v: &Variant,
    frame: &[u8],
    ctx: SkbContext,
    cpu: usize,
    secs: u32,
) -> Result<Breakdown> {
    set_target(dp, v)?;
    let rec = perf::Recording::start(Some(cpu), secs, "")?;
    let start = Instant::now();
    let mut packets = 0u64;
    let mut ns_total = 0.0;
    // Until perf has stopped: every sample falls on the variant.
    while !rec.finished() && start.elapsed() < Duration::from_secs(u64::from(secs) + 10) {
        let (_, _, ns) = run_repeat(&dp.skel().progs.tc_ingress_mirror, frame, ctx, 20_000);
        packets += 20_000;
        ns_total += ns * 20_000.0;
    }
    // Nothing is received here but the copies: the receive softirq is the copy's.
    let st = rec.stages(&format!("test-run-{}", v.key), "bpf_test_run", true)?;
    Ok(st.scaled(ns_total / packets.max(1) as f64))
}
