//! What the API shows of the data path: flows, latency histograms and status, built from the
//! data path's tables and the driver's bookkeeping.

use std::time::Duration;

use mirror_bpf::flow::monotonic_ns;
use mirror_bpf::{Datapath, Tracing};

use super::attached::AttachedLinks;
use super::EngineStatus;
use crate::views::{CpuShareView, DirView, FlowView, HistogramView, LatencyView, NatView};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The flow table.
pub(super) fn flows(dp: &Datapath<'_>) -> anyhow::Result<Vec<FlowView>> {
    let now = monotonic_ns();
    let dir = |d: &mirror_bpf::DirStats| DirView { packets: d.packets, bytes: d.bytes };
    Ok(dp
        .flows()?
        .into_iter()
        .map(|f| FlowView {
            lo: f.key.lo.to_string(),
            hi: f.key.hi.to_string(),
            nat: f.nat.map(|k| NatView { lo: k.lo.to_string(), hi: k.hi.to_string() }),
            forward: dir(&f.forward),
            reverse: dir(&f.reverse),
            rule_id: f.mark.map(|m| m.rule_id),
            status: f.mark.map(|m| m.status),
            trigger: f.mark.map(|m| m.kind.name().to_string()),
            mirrored_packets: f.mark.map_or(0, |m| m.packets),
            mirror_ended: f.mark.is_some_and(|m| m.ended),
            idle_ms: f.idle(now).as_millis() as u64,
            http_timed: f.http_timed,
            http_time_mean_ms: f.http_time_mean.map(ms),
            http_time_max_ms: f.http_time_max.map(ms),
            handshake_ms: f.handshake.map(ms),
            pods: Vec::new(),
        })
        .collect())
}

/// The latency histograms, named by the attached interfaces.
pub(super) fn latency(dp: &Datapath<'_>, attached: &AttachedLinks) -> anyhow::Result<Vec<HistogramView>> {
    let q = |h: &mirror_bpf::Histogram, p| h.quantile(p).map_or(0.0, ms);
    Ok(dp
        .histograms()?
        .into_iter()
        .map(|h| HistogramView {
            interface: attached.get(h.ifindex).map(|a| a.name.clone()).unwrap_or_default(),
            ifindex: h.ifindex,
            kind: h.kind.name().into(),
            class: (h.kind == mirror_bpf::HistKind::HttpResponse).then_some(h.class),
            count: h.count,
            sum_seconds: h.sum_ns as f64 / 1e9,
            p50_ms: q(&h, 0.5),
            p90_ms: q(&h, 0.9),
            p99_ms: q(&h, 0.99),
            buckets: h
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(b, n)| {
                    let (lo, hi) = mirror_bpf::latency::bucket_bounds(b);
                    [lo, hi, *n]
                })
                .collect(),
        })
        .collect())
}

/// How the tracing programs run, for `mirrorctl status`.
pub(super) fn tracing(tracing: Result<&Tracing, &str>) -> String {
    match tracing {
        Ok(t) => {
            let how = match t.fexit() {
                Ok(()) => "fexit + tp_btf".into(),
                Err(why) => format!("tp_btf (this kernel refuses fexit: {why}; expected, works without it)"),
            };
            format!("{how}; stack group samples 1 in {} packets", t.stack_sample())
        }
        Err(why) => format!("unavailable: {why}"),
    }
}

/// What the driver knows besides the data path, for the status.
pub(super) struct StatusParts<'a> {
    pub attached: &'a AttachedLinks,
    pub tcx_available: Option<bool>,
    /// Attach latency, microseconds.
    pub attach_latency: &'a hdrhistogram::Histogram<u64>,
    pub net_cpu: &'a [CpuShareView],
    /// The data path's tracing programs, or why they could not be loaded.
    pub tracing: Result<&'a Tracing, &'a str>,
    /// The requests behind noresponse marks the agent replayed.
    pub replays: super::replay::ReplayCounts,
}

/// The attach latencies (microseconds) in buckets of powers of two from 64 µs to 16 s, plus
/// the rest (`+Inf`), and their sum in seconds.
fn attach_buckets(h: &hdrhistogram::Histogram<u64>) -> (Vec<(f64, u64)>, f64) {
    let bounds: Vec<u64> = (6..=24).map(|p| 1u64 << p).collect();
    let mut counts = vec![0u64; bounds.len() + 1];
    let mut sum_us = 0f64;
    for v in h.iter_recorded() {
        let us = h.highest_equivalent(v.value_iterated_to());
        let i = bounds.iter().position(|b| us <= *b).unwrap_or(bounds.len());
        counts[i] += v.count_at_value();
        sum_us += us as f64 * v.count_at_value() as f64;
    }
    let mut buckets: Vec<(f64, u64)> =
        bounds.iter().map(|b| *b as f64 / 1e6).zip(counts.iter().copied()).collect();
    buckets.push((f64::INFINITY, counts[bounds.len()]));
    (buckets, sum_us / 1e6)
}

/// Interfaces, counters and the like.
pub(super) fn status(dp: &Datapath<'_>, p: StatusParts<'_>) -> anyhow::Result<EngineStatus> {
    let mut counters: std::collections::BTreeMap<String, u64> =
        dp.counters()?.iter().map(|(k, v)| (k.to_string(), v)).collect();
    let refused = dp.budget_refused()?;
    counters.insert("budget_refused_packets".into(), refused.packets);
    counters.insert("budget_refused_bytes".into(), refused.bytes);
    // The classifier's replays and the agent's (noresponse marks), one figure each.
    *counters.entry("replayed".into()).or_default() += p.replays.replayed;
    *counters.entry("replay_failed".into()).or_default() += p.replays.failed;
    let h = p.attach_latency;
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(EngineStatus {
        interfaces: p.attached.views(),
        counters,
        adopted: dp.adopted(),
        tcx_available: p.tcx_available,
        attach_latency: LatencyView {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        },
        attach_buckets: attach_buckets(h),
        mirror_ifindex: dp.settings()?.mirror_ifindex,
        net_cpu: p.net_cpu.to_vec(),
        tracing: tracing(p.tracing),
        protocols: dp.protocols().to_string(),
        dns_rcodes: dp.dns_rcodes()?,
        drops: dp.drop_counts()?.into_iter().map(|(r, n)| (drop_reason(r), n)).collect(),
        pod_drops: dp.pod_drop_counts()?.into_iter().map(|(i, r, n)| (i, drop_reason(r), n)).collect(),
        programs: dp
            .programs()
            .iter()
            .map(|p| crate::views::ProgramView {
                name: p.name.clone(),
                verified_insns: p.verified_insns,
                verify_ms: p.verify_time.map(|t| t.as_secs_f64() * 1e3),
            })
            .collect(),
        map_sizes: map_sizes(dp),
    })
}

/// A drop reason as status and metrics write it; `subsystem` for a subsystem's (counted as 0).
fn drop_reason(r: u16) -> String {
    if r == 0 {
        "subsystem".to_string()
    } else {
        mirror_bpf::rule::drop::reason_text(r)
    }
}

/// The entries of the maps the settings size, as the kernel has them: a map adopted from its
/// pin keeps its own, whatever the object asked for.
fn map_sizes(dp: &Datapath<'_>) -> crate::memory::Sizes {
    use libbpf_rs::MapCore;
    let entries = |m: &dyn MapCore| m.info().map_or(m.max_entries(), |i| i.info.max_entries);
    let maps = &dp.skel().maps;
    crate::memory::Sizes {
        flows: entries(&maps.flow_table),
        marks: entries(&maps.mirror_marks),
        replay: entries(&maps.request_replay),
    }
}
