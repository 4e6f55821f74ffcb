//! Triggers as the cluster sees them: each one is recorded as its rule's latest trigger (for
//! the rule's status) and, when `cluster.events` is on, becomes a Kubernetes Event on the pod
//! behind the interface it was seen at (`kubectl describe pod` says that its failure was
//! mirrored, by which rule, and where the copies are), for pods the API knows.
//!
//! Rate-limited twice: one Event per pod and rule per minute (the triggers in between are
//! counted in the next one), and at most `cluster.events_per_minute` from this agent, with
//! bursts of a tenth of that. Triggers over the limits are counted, not sent. The Events API's
//! own aggregation (a series for repeats) comes from the recorder.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::Client;

use super::crd::LastTrigger;
use super::status::Triggers;
use crate::config::Cluster as ClusterCfg;
use crate::engine::Engine;
use crate::event_log::EventLog;
use crate::pods::Pods;
use crate::views::EventView;

/// One Event per pod and rule at most this often.
const PER_POD_RULE: Duration = Duration::from_secs(60);

/// Records each trigger as its rule's latest and, with `cluster.events`, sends it as an Event
/// on its pod.
#[allow(clippy::too_many_arguments)]
pub fn start(
    client: Client,
    node: String,
    cfg: &ClusterCfg,
    log: Arc<EventLog>,
    pods: Pods,
    api_pods: Store<Pod>,
    engine: Engine,
    triggers: Triggers,
) {
    let recorder =
        Recorder::new(client, Reporter { controller: "mirror-agent".into(), instance: Some(node.clone()) });
    let mut limiter = Limiter::new(cfg.events_per_minute);
    let events = cfg.events;
    tokio::spawn(async move {
        let mut after = 0;
        let mut sources: HashMap<u32, String> = HashMap::new();
        loop {
            for ev in log.wait_after(after, 1024, Duration::from_secs(30)).await {
                after = after.max(ev.seq);
                record(&triggers, &ev);
                if !events {
                    continue;
                }
                let Some(pod) = pods.by_ifindex(ev.ifindex) else { continue };
                let Some(ns) = pod.namespace.clone() else { continue };
                let api = api_pods.state().into_iter().find(|a| {
                    a.metadata.namespace.as_deref() == Some(ns.as_str())
                        && a.metadata.name.as_deref() == Some(&pod.name)
                });
                let Some(api) = api else { continue };
                let Some(repeats) = limiter.admit((ns.clone(), pod.name.clone(), ev.rule_id), Instant::now())
                else {
                    continue;
                };
                if !sources.contains_key(&ev.rule_id) {
                    if let Ok(rules) = engine.rules().await {
                        sources = rules
                            .into_iter()
                            .map(|r| (r.id, r.source.unwrap_or_else(|| "local".into())))
                            .collect();
                    }
                }
                let source = sources.get(&ev.rule_id).cloned().unwrap_or_else(|| "local".into());
                let reference = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    namespace: Some(ns),
                    uid: api.metadata.uid.clone(),
                    ..Default::default()
                };
                let event = Event {
                    type_: EventType::Warning,
                    reason: "Mirrored".into(),
                    note: Some(note(&ev, &source, &node, repeats)),
                    action: "Mirror".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::warn!(pod = %pod.name, error = %e, "sending a Kubernetes Event");
                }
            }
        }
    });
}

fn record(triggers: &Triggers, ev: &EventView) {
    let t = LastTrigger {
        time: ev.time.clone(),
        pod: ev.pod.clone().unwrap_or_else(|| ev.interface.clone()),
        trigger: crate::api::text::trigger_text(Some(&ev.kind), ev.status, ev.by.as_deref()),
        request: crate::api::text::request_text(ev),
        flow: format!("{} -> {}", ev.client_side.client, ev.server_side.server),
        capture: ev.capture.clone(),
    };
    triggers.lock().expect("triggers").insert(ev.rule_id, t);
}

/// What `kubectl describe pod` shows.
fn note(ev: &EventView, source: &str, node: &str, repeats: u64) -> String {
    let request = crate::api::text::request_text(ev).map(|r| format!(" to {r}")).unwrap_or_default();
    let mut s = format!(
        "{} {}{request} on {} -> {}: rule {} ({source}) mirrors the flow from here on, both directions, \
         to node {node}'s mirror interface (the request first); Community ID {}",
        match ev.kind.as_str() {
            "status" => "status",
            "grpc-status" => "gRPC status",
            "dns" => "response",
            _ => "trigger",
        },
        crate::api::text::trigger_text(Some(&ev.kind), ev.status, ev.by.as_deref()),
        ev.client_side.client,
        ev.server_side.server,
        ev.rule_id,
        ev.client_side.community_id,
    );
    if repeats > 0 {
        s.push_str(&format!("; and {repeats} more trigger(s) of this rule on this pod since the last Event"));
    }
    s.truncate(1000);
    s
}

/// The two limits: per (namespace, pod, rule), and a token bucket for the agent.
struct Limiter {
    last: HashMap<(String, String, u32), (Instant, u64)>,
    tokens: f64,
    burst: f64,
    per_second: f64,
    at: Instant,
}

impl Limiter {
    fn new(per_minute: u32) -> Self {
        let burst = (f64::from(per_minute) / 10.0).max(1.0);
        Self {
            last: HashMap::new(),
            tokens: burst,
            burst,
            per_second: f64::from(per_minute) / 60.0,
            at: Instant::now(),
        }
    }

    /// Whether an Event for `key` may go now: the triggers held back since its last one.
    fn admit(&mut self, key: (String, String, u32), now: Instant) -> Option<u64> {
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.per_second).min(self.burst);
        self.at = now;
        let entry = self.last.entry(key).or_insert((now - PER_POD_RULE * 2, 0));
        if now.duration_since(entry.0) < PER_POD_RULE || self.tokens < 1.0 {
            entry.1 += 1;
            return None;
        }
        self.tokens -= 1.0;
        let held = entry.1;
        *entry = (now, 0);
        if self.last.len() > 10_000 {
            self.last.retain(|_, (t, _)| now.duration_since(*t) < PER_POD_RULE);
        }
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_pod_and_rule_per_minute_and_a_bucket() {
        let mut l = Limiter::new(60);
        let t0 = Instant::now() + Duration::from_secs(3600);
        let k = |p: &str| ("shop".to_string(), p.to_string(), 1);
        assert_eq!(l.admit(k("a"), t0), Some(0));
        assert_eq!(l.admit(k("a"), t0 + Duration::from_secs(1)), None);
        assert_eq!(l.admit(k("a"), t0 + Duration::from_secs(2)), None);
        assert_eq!(l.admit(k("a"), t0 + Duration::from_secs(61)), Some(2));
        // The bucket: 6 at once (a tenth of 60), then one a second.
        let mut l = Limiter::new(60);
        let sent = (0..20).filter(|i| l.admit(k(&format!("p{i}")), t0).is_some()).count();
        assert_eq!(sent, 6);
        assert!(l.admit(k("late"), t0 + Duration::from_secs(1)).is_some());
    }

    #[test]
    fn a_dns_trigger_names_its_question() {
        let side = crate::views::TupleView {
            client: "198.18.0.2:40000".into(),
            server: "198.18.0.10:53".into(),
            community_id: "1:x".into(),
        };
        let ev = EventView {
            kind: "dns".into(),
            status: 3,
            rule_id: 4,
            client_side: side.clone(),
            server_side: side,
            qname: Some("web.shop.svc.cluster.local".into()),
            qtype: Some(28),
            ..EventView::default()
        };
        let n = note(&ev, "MirrorRule shop/dns", "node-1", 0);
        assert!(
            n.starts_with("response dns NXDOMAIN to AAAA web.shop.svc.cluster.local on 198.18.0.2:40000 -> 198.18.0.10:53: rule 4"),
            "{n}"
        );
    }
}
