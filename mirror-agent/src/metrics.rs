//! Prometheus metrics on `metrics.listen`: the classifier's counters, rule hits, DNS responses
//! by rcode, the attached interfaces and the latency histograms, read from the data path at
//! each scrape. Names
//! follow Prometheus's conventions: `mirror_` prefix, base units (`_seconds`, `_bytes`),
//! `_total` on counters, `_ratio` for shares of 0 to 1 (checked by a test with a real parser).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::metric_label;
use crate::engine::Engine;
use crate::pods::Pods;
use crate::server;
use crate::views::{HistogramView, PodView};

/// The node-wide budget's counters (`budget_state`, not slots of the classifier's `counters`),
/// exported after the classifier's: (counter, metric, help).
const BUDGET_COUNTERS: &[(&str, &str, &str)] = &[
    ("budget_refused_packets", "budget_refused_packets", "Copies not made: the node-wide budget was spent"),
    ("budget_refused_bytes", "budget_refused_bytes", "Bytes of the copies the node-wide budget refused"),
];

/// Counters exported as `mirror_<metric>_total`: (counter, metric, help). The classifier's
/// names, metrics and help texts are those of its counter table (`mirror_bpf::stats::COUNTERS`).
fn exported() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    mirror_bpf::stats::COUNTERS
        .iter()
        .filter_map(|c| Some((c.name, c.metric?, c.help)))
        .chain(BUDGET_COUNTERS.iter().copied())
}

/// What a scrape reads.
#[derive(Clone)]
struct Scrape {
    engine: Engine,
    pods: Pods,
    /// Whether rule hits carry the rule's text.
    rule_text: bool,
    /// The agent's HTTP servers (`api`, `metrics`) and their connections.
    servers: Arc<[ServerStats]>,
    /// The recorder's counts, when it is on.
    recorder: Option<Arc<crate::recorder::Stats>>,
}

/// A server's name (label `server`) and its counts.
pub type ServerStats = (&'static str, Arc<server::Stats>);

async fn scrape(State(s): State<Scrape>) -> impl IntoResponse {
    match render(&s.engine, &s.pods, s.rule_text, &s.servers).await {
        Ok(mut body) => {
            if let Some(r) = &s.recorder {
                body = crate::recorder::metrics::append(body, r);
            }
            // prometheus-client writes the OpenMetrics text format (counter families named
            // without `_total`, `# EOF`): said so, or a scraper reads it as the older format.
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                body,
            )
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

/// The labels a histogram kind adds beside `interface` (`None`: not of this family).
type ExtraLabels = fn(&str) -> Option<Vec<(String, String)>>;

/// Histograms of one name, one per label set.
#[derive(Debug)]
struct LabeledHistograms(Vec<(Vec<(String, String)>, KernelHistogram)>);

impl prometheus_client::encoding::EncodeMetric for LabeledHistograms {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, h) in &self.0 {
            h.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
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

/// At most this many distinct `pod` labels per scrape; the interfaces beyond (by name) get
/// [`OTHER_POD`]. The label follows the interface one for one, so this only bounds what pod churn
/// on a node with very many veths could add.
pub const POD_LABELS_MAX: usize = 512;
/// The `pod` label beyond [`POD_LABELS_MAX`], and of an interface with no pod known.
pub const OTHER_POD: &str = "";

/// The `pod` label of each histogram's interface (`namespace/name`), bounded, and the
/// `label_<key>` labels of its pod's labels among `pods.labels` (`""` where it has none): one
/// value each per interface, so they add no series.
fn pod_labels(pods: &Pods, hists: &[HistogramView]) -> impl Fn(u32) -> Vec<(String, String)> {
    let mut ifindexes: Vec<(String, u32)> = hists.iter().map(|h| (h.interface.clone(), h.ifindex)).collect();
    ifindexes.sort();
    ifindexes.dedup();
    let keys: Vec<String> = pods.label_keys().to_vec();
    let labels: std::collections::HashMap<u32, PodView> = ifindexes
        .into_iter()
        .filter_map(|(_, i)| Some((i, pods.by_ifindex(i)?)))
        .take(POD_LABELS_MAX)
        .collect();
    move |i| {
        let pod = labels.get(&i);
        let mut out = vec![("pod".to_string(), pod.map_or_else(|| OTHER_POD.to_string(), PodView::label))];
        out.extend(keys.iter().map(|k| {
            let v = pod.and_then(|p| p.labels.get(k)).cloned().unwrap_or_default();
            (metric_label(k), v)
        }));
        out
    }
}

/// The pods' drops by `reason` and `pod` (`namespace/name`): at most [`POD_LABELS_MAX`] pods,
/// the first by name, the others' drops under [`OTHER_POD`] with those of no pod.
fn drops_by_pod(pods: &Pods, counts: &[(u32, String, u64)]) -> Family<Vec<(String, String)>, Counter> {
    let named = pods.name_drops(counts);
    let kept: std::collections::BTreeSet<&str> =
        named.iter().map(|d| d.pod.as_str()).filter(|p| !p.is_empty()).collect();
    let kept: std::collections::BTreeSet<&str> = kept.into_iter().take(POD_LABELS_MAX).collect();
    let family = Family::<Vec<(String, String)>, Counter>::default();
    for d in &named {
        let pod = if kept.contains(d.pod.as_str()) { d.pod.as_str() } else { OTHER_POD };
        family
            .get_or_create(&vec![
                ("reason".to_string(), d.reason.clone()),
                ("pod".to_string(), pod.to_string()),
            ])
            .inc_by(d.packets);
    }
    family
}

async fn render(
    engine: &Engine,
    pods: &Pods,
    rule_text: bool,
    servers: &[ServerStats],
) -> anyhow::Result<String> {
    let status = engine.status().await?;
    let rules = engine.rules().await?;
    let hists = engine.latency().await?;
    let mut reg = Registry::with_prefix("mirror");
    for (key, metric, help) in exported() {
        let v = status.counters.get(key).copied().unwrap_or(0);
        reg.register(metric, help, ConstCounter::new(v));
    }
    let hits = Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
    for r in &rules {
        let mut labels = vec![("rule_id".into(), r.id.to_string()), ("kind".into(), r.kind.clone())];
        if rule_text {
            labels.push(("rule".into(), r.rule.clone()));
        }
        hits.get_or_create(&labels).inc_by(r.hits);
    }
    reg.register("rule_hits", "Flows triggered, per rule", hits);
    reg.register(
        "dns_responses",
        "DNS responses seen on the DNS ports, by rcode (the named ones always, 12-15 once seen)",
        dns_responses(&status.dns_rcodes),
    );
    reg.register(
        "drops",
        "Packets of the pods' flows the kernel dropped, by reason and pod (the one it was going to, else the one it came from; \"\" when none was found), a rule or not",
        drops_by_pod(pods, &status.pod_drops),
    );
    let attached = Gauge::<i64>::default();
    attached.set(status.interfaces.len() as i64);
    reg.register("attached_interfaces", "Interfaces the classifier is attached to", attached);
    // One family per name, its label sets under one HELP/TYPE (a registry per label set would
    // repeat them, which OpenMetrics and Prometheus's parser refuse).
    let label = |k: &str, v: String| (k.to_string(), v);
    let pod_of = pod_labels(pods, &hists);
    let family = |kind: ExtraLabels| {
        LabeledHistograms(
            hists
                .iter()
                .filter_map(|h| kind(&h.kind).map(|extra| (h, extra)))
                .map(|(h, extra)| {
                    let mut labels = vec![label("interface", h.interface.clone())];
                    labels.extend(pod_of(h.ifindex));
                    labels.extend(extra);
                    if h.kind == "http_response" {
                        labels.push(label("class", format!("{}xx", h.class.unwrap_or(0))));
                    }
                    (labels, fold(h))
                })
                .collect(),
        )
    };
    reg.register(
        "http_response_seconds",
        "Request (first segment) to response status line, seen on the host-side veth",
        family(|k| (k == "http_response").then(Vec::new)),
    );
    reg.register(
        "tcp_handshake_seconds",
        "SYN to the ACK that completes the handshake, seen on the host-side veth",
        family(|k| (k == "tcp_handshake").then(Vec::new)),
    );
    reg.register(
        "dns_response_seconds",
        "DNS query to its response, seen on the host-side veth (latency.dns, or a dns= rule)",
        family(|k| (k == "dns_response").then(Vec::new)),
    );
    reg.register(
        "stack_latency_seconds",
        "Kernel stack latency of sampled packets entering through an attached veth, per stage (stack group on)",
        family(|k| k.strip_prefix("stack_").map(|stage| vec![("stage".to_string(), stage.to_string())])),
    );
    let insns = Family::<Vec<(String, String)>, Gauge<i64>>::default();
    let verify = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    for p in &status.programs {
        let labels = vec![label("program", p.name.clone())];
        insns.get_or_create(&labels).set(i64::from(p.verified_insns));
        if let Some(ms) = p.verify_ms {
            verify.get_or_create(&labels).set(ms / 1e3);
        }
    }
    reg.register(
        "program_verified_instructions",
        "Instructions the kernel's verifier processed for each program of the data path at load (limit 1,000,000)",
        insns,
    );
    reg.register(
        "program_verify_seconds",
        "The verifier's time on each program of the data path at load",
        verify,
    );
    let (buckets, sum) = status.attach_buckets.clone();
    let count = buckets.iter().map(|(_, n)| n).sum();
    reg.register(
        "attach_duration_seconds",
        "From a link's event to the classifier attached on it",
        KernelHistogram { sum, count, buckets },
    );
    let cpu_seconds = Family::<Vec<(String, String)>, Counter<f64, AtomicU64>>::default();
    let cpu_ratio = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    for c in &status.net_cpu {
        for (kind, share, total) in [
            ("syscall", c.syscall, c.syscall_seconds_total),
            ("softirq_rx", c.softirq_rx, c.softirq_rx_seconds_total),
            ("softirq_tx", c.softirq_tx, c.softirq_tx_seconds_total),
        ] {
            let labels = vec![label("cpu", c.cpu.to_string()), label("kind", kind.to_string())];
            cpu_seconds.get_or_create(&labels).inc_by(total);
            cpu_ratio.get_or_create(&labels).set(share);
        }
    }
    if !status.net_cpu.is_empty() {
        reg.register("net_cpu_seconds", "CPU time in the network stack (cpu group on)", cpu_seconds);
        reg.register(
            "net_cpu_ratio",
            "Share of the last second in the network stack, 0 to 1 (cpu group on)",
            cpu_ratio,
        );
    }
    register_servers(&mut reg, servers);
    let mut out = String::new();
    encode(&mut out, &reg)?;
    Ok(out)
}

/// DNS responses by rcode, labelled `rcode` by name (`NXDOMAIN`): every rcode DNS names, so
/// that their series exist from the start, and 12-15 (by number) once seen.
fn dns_responses(counts: &[u64]) -> Family<Vec<(String, String)>, Counter> {
    let family = Family::<Vec<(String, String)>, Counter>::default();
    let named = mirror_bpf::rule::dns::RCODE_NAMES.len();
    for (rcode, n) in counts.iter().enumerate().filter(|(r, n)| *r < named || **n > 0) {
        let label = crate::api::text::rcode_text(rcode as u16);
        family.get_or_create(&vec![("rcode".to_string(), label)]).inc_by(*n);
    }
    family
}

/// The connections of the agent's HTTP servers, labelled `server`.
fn register_servers(reg: &mut Registry, servers: &[ServerStats]) {
    let open = Family::<Vec<(String, String)>, Gauge<i64>>::default();
    let evicted = Family::<Vec<(String, String)>, Counter>::default();
    for (name, stats) in servers {
        let labels = vec![("server".to_string(), name.to_string())];
        open.get_or_create(&labels).set(i64::try_from(stats.open()).unwrap_or(i64::MAX));
        evicted.get_or_create(&labels).inc_by(stats.evicted());
    }
    reg.register("server_connections", "Connections the agent's HTTP server holds (api, metrics)", open);
    reg.register(
        "server_connections_evicted",
        "Idle connections the agent's HTTP server closed to make room for a new one (its connection limit reached)",
        evicted,
    );
}

/// The metrics routes; `rule_text`: rule hits carry each rule's text (label `rule`);
/// `servers`: the agent's HTTP servers, whose connections are exported.
/// `recorder`: the recorder's counts, exported when it is on.
pub fn router(
    engine: Engine,
    pods: Pods,
    rule_text: bool,
    servers: Vec<ServerStats>,
    recorder: Option<Arc<crate::recorder::Stats>>,
) -> Router {
    Router::new().route("/metrics", get(scrape)).with_state(Scrape {
        engine,
        pods,
        rule_text,
        servers: servers.into(),
        recorder,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_counters_exist_once_each() {
        let mut metrics: Vec<&str> = exported().map(|(_, m, _)| m).collect();
        let all = metrics.len();
        metrics.sort_unstable();
        metrics.dedup();
        assert_eq!(metrics.len(), all, "a metric name twice");
        assert!(!metrics.contains(&"dns_responses"), "the family by rcode has that name");
        for want in
            ["h2_requests", "h2_responses", "h2_trailers", "h2_lost", "grpc_triggers", "reset_triggers"]
        {
            assert!(metrics.contains(&want), "{want} not exported");
        }
    }

    #[test]
    fn operations_doc_lists_every_counter_metric() {
        let doc = include_str!("../../docs/operations.md");
        let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `mirror_")).collect();
        assert!(rows.len() > 10, "no metrics table in docs/operations.md");
        for (_, metric, _) in exported() {
            let name = format!("`mirror_{metric}_total`");
            assert!(
                rows.iter().any(|r| r.contains(&name)),
                "docs/operations.md's metrics table lacks {name}"
            );
        }
    }

    #[test]
    fn dns_responses_are_counted_by_rcode() {
        let mut counts = [0u64; 16];
        (counts[0], counts[3], counts[14]) = (120, 4, 2);
        let mut reg = Registry::with_prefix("mirror");
        reg.register("dns_responses", "DNS responses", dns_responses(&counts));
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        for want in [
            "# TYPE mirror_dns_responses counter\n",
            "mirror_dns_responses_total{rcode=\"NOERROR\"} 120\n",
            "mirror_dns_responses_total{rcode=\"NXDOMAIN\"} 4\n",
            "mirror_dns_responses_total{rcode=\"SERVFAIL\"} 0\n",
            "mirror_dns_responses_total{rcode=\"DSOTYPENI\"} 0\n",
            "mirror_dns_responses_total{rcode=\"14\"} 2\n",
        ] {
            assert!(out.contains(want), "no {want:?} in {out}");
        }
        assert!(!out.contains("rcode=\"12\""), "an unnamed rcode never seen has no series: {out}");
        assert_eq!(out.matches("mirror_dns_responses_total{").count(), 13);
    }

    #[test]
    fn server_connections_are_exported_per_server() {
        let mut reg = Registry::with_prefix("mirror");
        let servers: Vec<ServerStats> = vec![
            ("api", Arc::new(server::Stats::default())),
            ("metrics", Arc::new(server::Stats::default())),
        ];
        register_servers(&mut reg, &servers);
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        for want in [
            "mirror_server_connections{server=\"api\"} 0\n",
            "mirror_server_connections{server=\"metrics\"} 0\n",
            "mirror_server_connections_evicted_total{server=\"api\"} 0\n",
            "# TYPE mirror_server_connections_evicted counter\n",
        ] {
            assert!(out.contains(want), "no {want:?} in {out}");
        }
    }
}
