//! Each rule's status, written back by every agent for its own node: the rule's text and its
//! `Valid` and `Expired` conditions (the same from every agent: they depend on the spec only,
//! so the API server finds all but the first write unchanged and tells no watcher), and this
//! node's entry of `status.nodes` (state, why in words, rule id, pods selected, hits, latest
//! trigger) where the node has something to say: pods selected, hits, or a rule it could not
//! install. Written with server-side apply under a field manager per node, so that each agent
//! owns its entry (and removes it by leaving it out) and never overwrites another's.
//!
//! How often: a change of state (installed, rejected, its id or pods) at once; a change of hits
//! or latest trigger only after the rule's interval since this agent's last write of it, with a
//! tenth of jitter: the largest of `cluster.status_interval`, (nodes in the rule's status) /
//! `cluster.status_writes_per_second` (so a hot rule's writes over the whole cluster stay near
//! that rate however many nodes it triggers on), and what keeps the watch traffic of those
//! writes under [`WATCH_BYTES_PER_SECOND`]: every agent watches the rules, so each write of a
//! rule listing n nodes is sent n times, about n x [`ENTRY_BYTES`] each. A failed write (the API
//! server away) is tried again after 1 s, doubling up to 5 s.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::crd::{LastTrigger, NodeStatus, RuleCondition};
use super::plan::{Planned, Verdict, World};
use super::Stores;
use crate::config::Cluster as ClusterCfg;
use mirror_bpf::Reach;

/// The latest trigger of each rule id, as the event follower records them.
pub type Triggers = Arc<Mutex<HashMap<u32, LastTrigger>>>;

/// About what one node's entry adds to a rule (JSON, with its managed-fields record).
pub const ENTRY_BYTES: f64 = 400.0;
/// The watch traffic a rule's hit updates may cause over the cluster, bytes per second.
pub const WATCH_BYTES_PER_SECOND: f64 = 4_000_000.0;

/// Retry after a failed write: from this, doubling.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq)]
struct Essential {
    generation: i64,
    text: Option<String>,
    state: String,
    message: Option<String>,
    rule_id: Option<u32>,
    pods: u32,
}

struct Written {
    essential: Essential,
    counts: (u64, Option<LastTrigger>),
    /// When this agent last wrote it, or tried to.
    at: Instant,
    /// A failed try waits this long before the next.
    retry: Option<Duration>,
    interval: Duration,
}

/// The status writer of one agent.
pub struct StatusWriter {
    client: Client,
    node: String,
    manager: String,
    min_interval: Duration,
    writes_per_second: f64,
    triggers: Triggers,
    written: HashMap<String, Written>,
}

impl StatusWriter {
    /// A writer for node `node`.
    pub fn new(client: Client, node: String, cfg: &ClusterCfg) -> Self {
        let mut manager = format!("mirror-agent/{node}");
        manager.truncate(128);
        Self {
            client,
            node,
            manager,
            min_interval: cfg.status_interval,
            writes_per_second: cfg.status_writes_per_second,
            triggers: Triggers::default(),
            written: HashMap::new(),
        }
    }

    /// Where the latest triggers are recorded.
    pub fn triggers(&self) -> Triggers {
        self.triggers.clone()
    }

    /// Writes what changed of each planned rule, as its interval allows.
    pub async fn update(
        &mut self,
        stores: &Stores,
        planned: &[Planned],
        installed: &BTreeMap<String, Result<u32, String>>,
        hits: &BTreeMap<u32, u64>,
        world: &World,
    ) {
        self.written.retain(|k, _| planned.iter().any(|p| &p.key == k));
        for p in planned {
            let essential = essential(p, installed, world);
            let last =
                essential.rule_id.and_then(|id| self.triggers.lock().expect("triggers").get(&id).cloned());
            let counts = (essential.rule_id.and_then(|id| hits.get(&id).copied()).unwrap_or(0), last);
            let now = Instant::now();
            let due = match self.written.get(&p.key) {
                None => true,
                Some(w) if w.retry.is_some_and(|r| now < w.at + r) => false,
                Some(w) if w.retry.is_some() => true,
                Some(w) if w.essential != essential => true,
                Some(w) => w.counts != counts && now >= w.at + w.interval,
            };
            if !due {
                continue;
            }
            let nodes = nodes_in_status(stores, &p.key).max(1);
            let interval = self.interval(nodes);
            let result = self.write(p, &essential, &counts).await;
            let retry = match (&result, self.written.get(&p.key).and_then(|w| w.retry)) {
                (Ok(()), _) => None,
                (Err(_), None) => Some(RETRY_MIN),
                (Err(_), Some(r)) => Some((r * 2).min(RETRY_MAX)),
            };
            match &result {
                Ok(()) => {}
                Err(e) if retry == Some(RETRY_MIN) => {
                    tracing::warn!(rule = %p.key, error = %e, "writing the rule's status: trying again")
                }
                Err(e) => tracing::debug!(rule = %p.key, error = %e, "writing the rule's status"),
            }
            self.written.insert(p.key.clone(), Written { essential, counts, at: now, retry, interval });
        }
    }

    /// The least time between two writes of a rule whose status lists `nodes` nodes.
    fn interval(&self, nodes: usize) -> Duration {
        // A tenth of jitter, so that agents started together spread their writes.
        spacing(self.min_interval, self.writes_per_second, nodes).mul_f64(0.9 + rand_unit() * 0.2)
    }

    async fn write(
        &self,
        p: &Planned,
        e: &Essential,
        counts: &(u64, Option<LastTrigger>),
    ) -> kube::Result<()> {
        let entry = NodeStatus {
            node: self.node.clone(),
            state: e.state.clone(),
            message: e.message.clone(),
            rule_id: e.rule_id,
            pods: e.pods,
            hits: counts.0,
            last_trigger: counts.1.clone(),
            observed_generation: p.generation,
        };
        let condition = match &p.verdict {
            Verdict::Invalid(why) => RuleCondition {
                type_: "Valid".into(),
                status: "False".into(),
                reason: "InvalidRule".into(),
                message: why.clone(),
                observed_generation: Some(p.generation),
            },
            _ => RuleCondition {
                type_: "Valid".into(),
                status: "True".into(),
                reason: "Parsed".into(),
                message: format!("the rule {}", p.text.as_deref().unwrap_or_default()),
                observed_generation: Some(p.generation),
            },
        };
        let expired = RuleCondition {
            type_: "Expired".into(),
            status: if p.verdict == Verdict::Expired { "True" } else { "False" }.into(),
            reason: if p.verdict == Verdict::Expired { "TimeIsOver" } else { "Running" }.into(),
            message: match p.expires {
                Some(t) => format!(
                    "ends at {}",
                    chrono::DateTime::<chrono::Utc>::from(t)
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                None => "no end set (ttl, expiresAt)".into(),
            },
            observed_generation: Some(p.generation),
        };
        let mut status = json!({ "conditions": [condition, expired], "nodes": [entry] });
        if let Some(t) = &p.text {
            status["rule"] = json!(t);
        }
        let pp = PatchParams::apply(&self.manager).force();
        if !entry_worth_writing(e, counts.0) {
            // Nothing to say from this node: our entry, if any, goes.
            status["nodes"] = json!([]);
        }
        let (kind, namespace, name) = split_key(&p.key);
        let mut body = json!({
            "apiVersion": format!("{}/{}", super::crd::GROUP, super::crd::VERSION),
            "kind": kind,
            "metadata": { "name": name },
            "status": status,
        });
        match namespace {
            Some(ns) => {
                body["metadata"]["namespace"] = json!(ns);
                let api: Api<super::crd::MirrorRule> = Api::namespaced(self.client.clone(), ns);
                api.patch_status(name, &pp, &Patch::Apply(&body)).await.map(drop)
            }
            None => {
                let api: Api<super::crd::ClusterMirrorRule> = Api::all(self.client.clone());
                api.patch_status(name, &pp, &Patch::Apply(&body)).await.map(drop)
            }
        }
    }
}

fn essential(p: &Planned, installed: &BTreeMap<String, Result<u32, String>>, world: &World) -> Essential {
    let (state, message, rule_id, pods) = match &p.verdict {
        Verdict::Install { reach, ifaces, .. } => {
            let pods = match reach {
                Reach::Everywhere => world.pods.len(),
                Reach::Selected => ifaces.len(),
            } as u32;
            match installed.get(&p.key) {
                Some(Ok(id)) => ("Active", None, Some(*id), pods),
                Some(Err(why)) => ("Rejected", Some(why.clone()), None, pods),
                None => ("Pending", None, None, pods),
            }
        }
        Verdict::Invalid(why) => ("Invalid", Some(why.clone()), None, 0),
        Verdict::Expired => ("Expired", Some("its time is over (expiresAt, ttl)".into()), None, 0),
        Verdict::OtherNodes => ("OtherNodes", Some("its nodeSelector leaves this node out".into()), None, 0),
    };
    Essential { generation: p.generation, text: p.text.clone(), state: state.into(), message, rule_id, pods }
}

/// `MirrorRule NS/NAME` or `ClusterMirrorRule NAME`: (kind, namespace, name).
pub fn split_key(key: &str) -> (&str, Option<&str>, &str) {
    let (kind, rest) = key.split_once(' ').unwrap_or(("", key));
    match rest.split_once('/') {
        Some((ns, name)) if kind == "MirrorRule" => (kind, Some(ns), name),
        _ => (kind, None, rest),
    }
}

fn nodes_in_status(stores: &Stores, key: &str) -> usize {
    let (_, ns, name) = split_key(key);
    let status = match ns {
        Some(ns) => stores
            .rules
            .state()
            .iter()
            .find(|r| r.metadata.namespace.as_deref() == Some(ns) && r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.status.clone()),
        None => stores
            .cluster_rules
            .state()
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.status.clone()),
    };
    status.map_or(0, |s| s.nodes.len())
}

/// The least time between two writes of one rule by one agent, without jitter, when the
/// rule's status lists `nodes` nodes: each agent takes its share of `per_second`, and of
/// [`WATCH_BYTES_PER_SECOND`] (n writers x n watchers x an object of n entries).
pub fn spacing(min: Duration, per_second: f64, nodes: usize) -> Duration {
    let n = nodes as f64;
    let by_rate = n / per_second;
    let by_watch = n * n * n * ENTRY_BYTES / WATCH_BYTES_PER_SECOND;
    min.max(Duration::from_secs_f64(by_rate.max(by_watch)))
}

/// Whether this node has something to say of a rule: pods it selects here, hits, or a rule it
/// could not install.
fn entry_worth_writing(e: &Essential, hits: u64) -> bool {
    e.state == "Rejected" || (e.state == "Active" && (e.pods > 0 || hits > 0))
}

/// A number in [0, 1) from the clock: jitter needs no better.
fn rand_unit() -> f64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    f64::from(nanos % 1_000_000) / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_rule_costs_the_same_on_any_number_of_nodes() {
        let min = Duration::from_secs(10);
        assert_eq!(spacing(min, 2.0, 2), min);
        assert_eq!(spacing(min, 2.0, 40), Duration::from_secs(20));
        assert_eq!(spacing(min, 2.0, 100), Duration::from_secs(100));
        assert_eq!(spacing(min, 2.0, 1000), Duration::from_secs(100_000));
        // Over the cluster: nodes / spacing writes per second, each sent to every node.
        for nodes in [1usize, 20, 100, 1000, 5000] {
            let rate = nodes as f64 / spacing(min, 2.0, nodes).as_secs_f64();
            assert!(rate <= 2.0 + 1e-9, "{nodes} nodes: {rate} writes/s");
            let watched = rate * nodes as f64 * nodes as f64 * ENTRY_BYTES;
            assert!(watched <= WATCH_BYTES_PER_SECOND * 1.0001, "{nodes} nodes: {watched} B/s");
        }
    }

    #[test]
    fn keys_split() {
        assert_eq!(split_key("MirrorRule shop/checkout"), ("MirrorRule", Some("shop"), "checkout"));
        assert_eq!(split_key("ClusterMirrorRule all-500s"), ("ClusterMirrorRule", None, "all-500s"));
    }
}
