//! Prometheus metrics on `metrics.listen`: the classifier's counters, rule hits and the
//! attached interfaces, read from the data path at each scrape.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::types::HistogramView;
use crate::engine::Engine;

/// Counters exported as `mirror_<metric>_total`: (counter, metric, help).
const EXPORTED: &[(&str, &str, &str)] = &[
    ("packets", "packets", "Packets seen by the classifier"),
    ("bytes", "bytes", "Bytes seen by the classifier"),
    ("http_requests", "http_requests", "HTTP/1.x requests recognised"),
    ("http_responses", "http_responses", "HTTP/1.x status lines recognised"),
    ("triggers", "triggers", "Responses that matched a rule and marked their flow"),
    ("mirrored_packets", "mirrored_packets", "Packets copied to the mirror interface"),
    ("mirrored_bytes", "mirrored_bytes", "Bytes copied to the mirror interface"),
    ("mirror_errors", "copy_errors", "Copies that failed"),
    ("mirror_no_target", "copy_no_target", "Marked packets not copied: no mirror interface"),
    ("budget_refused_packets", "budget_refused_packets", "Copies not made: the node-wide budget was spent"),
    ("budget_refused_bytes", "budget_refused_bytes", "Bytes of the copies the node-wide budget refused"),
    ("mirror_ended", "marks_ended", "Marks that reached their limit"),
    ("flows_created", "flows_created", "Flows inserted into the flow table"),
    ("flow_insert_failed", "flow_insert_failed", "Flow table inserts that failed"),
    ("mark_insert_failed", "mark_insert_failed", "Mirror marks that could not be inserted"),
    ("ringbuf_drops", "ringbuf_drops", "Trigger events lost (ring buffer full)"),
    ("duplicate", "duplicate_packets", "Packets skipped at egress: already seen at an attached ingress"),
    ("malformed", "malformed_packets", "Packets with truncated or inconsistent headers (passed)"),
    (
        "http_unframed",
        "http_unframed",
        "HTTP streams whose framing was lost (looked at on segment starts until a message is found)",
    ),
    ("ct_lookups", "conntrack_lookups", "Conntrack lookups (new flows, responses or triggers across NAT)"),
    ("nat_flows", "nat_flows", "Connections found translated by conntrack: one flow, two tuples"),
];

/// What a scrape reads.
#[derive(Clone)]
struct Scrape {
    engine: Engine,
    /// Whether rule hits carry the rule's text.
    rule_text: bool,
}

async fn scrape(State(s): State<Scrape>) -> impl IntoResponse {
    match render(&s.engine, s.rule_text).await {
        Ok(body) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
        }
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], format!("{e:#}"))
        }
    }
}

/// A histogram aggregated in the kernel, exported as is: (upper bound in seconds, count).
#[derive(Debug)]
struct KernelHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl prometheus_client::encoding::EncodeMetric for KernelHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.sum,
            self.count,
            &self.buckets,
            None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

/// The kernel's fine buckets folded into powers of two of nanoseconds (1 µs to 16 s), plus +Inf.
fn fold(h: &HistogramView) -> KernelHistogram {
    let bounds: Vec<u64> = (10..=34).map(|p| 1u64 << p).collect();
    let mut counts = vec![0u64; bounds.len() + 1];
    for [_, hi, n] in &h.buckets {
        let i = bounds.iter().position(|b| hi <= b).unwrap_or(bounds.len());
        counts[i] += n;
    }
    let mut buckets: Vec<(f64, u64)> =
        bounds.iter().map(|b| *b as f64 / 1e9).zip(counts.iter().copied()).collect();
    buckets.push((f64::INFINITY, counts[bounds.len()]));
    KernelHistogram { sum: h.sum_seconds, count: h.count, buckets }
}

async fn render(engine: &Engine, rule_text: bool) -> anyhow::Result<String> {
    let status = engine.status().await?;
    let rules = engine.rules().await?;
    let hists = engine.latency().await?;
    let mut reg = Registry::with_prefix("mirror");
    for (key, metric, help) in EXPORTED {
        let v = status.counters.get(*key).copied().unwrap_or(0);
        reg.register(*metric, *help, ConstCounter::new(v));
    }
    let hits = Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
    for r in &rules {
        let mut labels = vec![("rule_id".into(), r.id.to_string())];
        if rule_text {
            labels.push(("rule".into(), r.rule.clone()));
        }
        hits.get_or_create(&labels).inc_by(r.hits);
    }
    reg.register("rule_hits", "Flows triggered, per rule", hits);
    let attached = Gauge::<i64>::default();
    attached.set(status.interfaces.len() as i64);
    reg.register("attached_interfaces", "Interfaces the classifier is attached to", attached);
    let http = reg.sub_registry_with_prefix("http_response");
    for h in hists.iter().filter(|h| h.kind == "http_response") {
        let labels = [
            (std::borrow::Cow::from("interface"), std::borrow::Cow::from(h.interface.clone())),
            ("class".into(), format!("{}xx", h.class.unwrap_or(0)).into()),
        ];
        http.sub_registry_with_labels(labels.into_iter()).register(
            "seconds",
            "Request (first segment) to response status line, seen on the host-side veth",
            fold(h),
        );
    }
    let hs = reg.sub_registry_with_prefix("tcp_handshake");
    for h in hists.iter().filter(|h| h.kind == "tcp_handshake") {
        let labels = [(std::borrow::Cow::from("interface"), std::borrow::Cow::from(h.interface.clone()))];
        hs.sub_registry_with_labels(labels.into_iter()).register(
            "seconds",
            "SYN to the ACK that completes the handshake, seen on the host-side veth",
            fold(h),
        );
    }
    let cpu = reg.sub_registry_with_prefix("net_cpu");
    for c in &status.net_cpu {
        for (kind, share, total) in [
            ("syscall", c.syscall, c.syscall_seconds_total),
            ("softirq_rx", c.softirq_rx, c.softirq_rx_seconds_total),
            ("softirq_tx", c.softirq_tx, c.softirq_tx_seconds_total),
        ] {
            let labels = [
                (std::borrow::Cow::from("cpu"), std::borrow::Cow::from(c.cpu.to_string())),
                ("kind".into(), kind.into()),
            ];
            let sub = cpu.sub_registry_with_labels(labels.into_iter());
            sub.register("seconds", "CPU time in the network stack (cpu group on)", ConstCounter::new(total));
            let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
            g.set(share);
            sub.register("share", "Share of the last second in the network stack (cpu group on)", g);
        }
    }
    let mut out = String::new();
    encode(&mut out, &reg)?;
    let _ = writeln!(out);
    Ok(out)
}

/// The metrics routes; `rule_text`: rule hits carry each rule's text (label `rule`).
pub fn router(engine: Engine, rule_text: bool) -> Router {
    Router::new().route("/metrics", get(scrape)).with_state(Scrape { engine, rule_text })
}
