//! Rules from the cluster: every agent follows the `MirrorRule` and `ClusterMirrorRule`
//! resources of the Kubernetes API ([`crd`]), works out which of them apply to its node and to
//! which of its pods ([`plan`], from the rule's fields as [`spec`] reads them), installs them
//! beside the local ones (the engine keeps them apart: `mirrorctl rules list` shows each
//! rule's source), writes each rule's status for its node back ([`status`]), and makes each
//! trigger a Kubernetes Event on its pod ([`events`]).
//!
//! What it watches, each with a reflector (a watch that lists again after each disconnection,
//! with a backoff of 0.5 s up to 5 s): both rule kinds, the namespaces (their labels, for
//! namespace selectors), the pods of this node (their labels, for pod selectors), and this
//! node (its labels, for node selectors). Nothing is planned before every store has been
//! filled once; until then, and whenever the API server cannot be reached, the rules
//! installed last (restored from the state file after a restart) keep working. A store
//! swaps its content only when a new list is complete, so a resync leaves no gap and
//! installs nothing twice: a rule whose resource, rule and reach did not change is left
//! alone.

pub mod crd;
pub mod events;
pub mod plan;
pub mod spec;
pub mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use tokio::sync::Notify;

use crate::config::Cluster as ClusterCfg;
use crate::engine::{Engine, WantedRule};
use crate::event_log::EventLog;
use crate::pods::Pods;
use crd::{ClusterMirrorRule, MirrorRule};
use plan::{LocalPod, Planned, RuleObject, Verdict, World};

/// How often the plan is made again without a change from the API (pods come and go on the
/// node, rules expire, hits grow).
const TICK: Duration = Duration::from_secs(1);
/// Changes come in bursts: planned once after the burst.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// How long the first plan waits for the pods behind the attached interfaces to be named (a
/// runtime's pod is named at the agent's next recheck, 5 s at most: [`crate::pods`]).
const PODS_SETTLE: Duration = Duration::from_secs(6);

/// The API's stores this agent reads.
#[derive(Clone)]
pub struct Stores {
    /// Namespaced rules.
    pub rules: Store<MirrorRule>,
    /// Cluster-scoped rules.
    pub cluster_rules: Store<ClusterMirrorRule>,
    /// Every namespace.
    pub namespaces: Store<Namespace>,
    /// The pods of this node.
    pub pods: Store<Pod>,
    /// This node.
    pub nodes: Store<Node>,
}

/// A client for the API server: from `cfg.kubeconfig`, else inferred (the pod's service
/// account, else `$KUBECONFIG` or `~/.kube/config`).
pub async fn client(cfg: &ClusterCfg) -> anyhow::Result<Client> {
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cluster.kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("cluster.kubeconfig {}", path.display()))?
        }
        None => {
            kube::Config::infer().await.context("finding the Kubernetes API (in-cluster, $KUBECONFIG)")?
        }
    };
    Client::try_from(config).context("a client for the Kubernetes API")
}

/// Starts following the cluster's rules on node `node` (tasks that run as long as the agent).
pub fn start(cfg: ClusterCfg, client: Client, node: String, engine: Engine, pods: Pods, log: Arc<EventLog>) {
    let changed = Arc::new(Notify::new());
    let stores = Stores {
        rules: follow(Api::<MirrorRule>::all(client.clone()), watcher::Config::default(), &changed),
        cluster_rules: follow(
            Api::<ClusterMirrorRule>::all(client.clone()),
            watcher::Config::default(),
            &changed,
        ),
        namespaces: follow(Api::<Namespace>::all(client.clone()), watcher::Config::default(), &changed),
        pods: follow(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            &changed,
        ),
        nodes: follow(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node}")),
            &changed,
        ),
    };
    let status = status::StatusWriter::new(client.clone(), node.clone(), &cfg);
    let triggers = status.triggers();
    events::start(
        client.clone(),
        node.clone(),
        &cfg,
        log,
        pods.clone(),
        stores.pods.clone(),
        engine.clone(),
        triggers,
    );
    tokio::spawn(run(engine, pods, stores, changed, status, node));
}

/// A reflector of `api` (filtered by `wc`), run in a task of its own; `changed` is notified at
/// each event.
fn follow<K>(api: Api<K>, wc: watcher::Config, changed: &Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher::watcher(api, wc).backoff(Retry::default()).reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => {
                    if failing {
                        tracing::info!(%kind, "watching again");
                        failing = false;
                    }
                    changed.notify_one();
                }
                Err(e) if !failing => {
                    tracing::warn!(%kind, error = %e, "watch failed: the last known state is kept, retrying");
                    failing = true;
                }
                Err(e) => tracing::debug!(%kind, error = %e, "watch still failing"),
            }
        }
    });
    reader
}

/// The watches' backoff: 0.5 s, doubling up to 5 s, from 0.5 s again once a watch works. An
/// API server back after an outage is found within 5 s.
#[derive(Debug, Clone)]
struct Retry {
    next: Duration,
}

impl Retry {
    const MIN: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(5);
}

impl Default for Retry {
    fn default() -> Self {
        Self { next: Self::MIN }
    }
}

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(now)
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

async fn run(
    engine: Engine,
    pods: Pods,
    stores: Stores,
    changed: Arc<Notify>,
    mut status: status::StatusWriter,
    node: String,
) {
    // Nothing is planned from half a picture: the rules installed last keep working until
    // every store was filled once.
    let ready = async {
        stores.rules.wait_until_ready().await?;
        stores.cluster_rules.wait_until_ready().await?;
        stores.namespaces.wait_until_ready().await?;
        stores.pods.wait_until_ready().await?;
        stores.nodes.wait_until_ready().await
    };
    if ready.await.is_err() {
        return;
    }
    // Nor from pods not yet named: a rule selects pods by their labels, and a plan made before
    // the pods behind the attached interfaces are named would take the rules an earlier agent
    // left (adopted with the data path) off those pods until they are. Waited for at most
    // PODS_SETTLE (an interface no pod is behind is never named).
    let settle = std::time::Instant::now();
    while settle.elapsed() < PODS_SETTLE && !pods_named(&engine, &pods) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::debug!(%node, "following the cluster's mirror rules");
    let mut installed: Option<Vec<WantedRule>> = None;
    let mut results: BTreeMap<String, Result<u32, String>> = BTreeMap::new();
    loop {
        let objects = rule_objects(&stores);
        let world = world(&stores, &pods, &node);
        let now = SystemTime::now();
        let planned = plan::plan(&objects, &world, now);
        let want = wanted(&planned);
        if installed.as_ref() != Some(&want) {
            match engine.set_cluster_rules(want.clone()).await {
                Ok(out) => {
                    results = out.into_iter().collect();
                    installed = Some(want);
                }
                Err(e) => tracing::warn!(error = format!("{e:#}"), "installing the cluster's rules"),
            }
        }
        let hits: BTreeMap<u32, u64> =
            engine.rules().await.map(|r| r.into_iter().map(|r| (r.id, r.hits)).collect()).unwrap_or_default();
        status.update(&stores, &planned, &results, &hits, &world).await;
        // Until the next change, the next expiry, or the tick.
        let wait = plan::next_expiry(&planned, now)
            .and_then(|e| e.duration_since(now).ok())
            .map_or(TICK, |d| d.min(TICK));
        let _ = tokio::time::timeout(wait, changed.notified()).await;
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// Whether interfaces are attached and the pod behind each is named (its namespace known).
fn pods_named(engine: &Engine, pods: &Pods) -> bool {
    let attached = engine.attached().borrow().clone();
    !attached.is_empty()
        && attached.iter().all(|i| pods.by_ifindex(i.ifindex).is_some_and(|p| p.namespace.is_some()))
}

/// The rule resources as the plan reads them.
fn rule_objects(stores: &Stores) -> Vec<RuleObject> {
    let mut out: Vec<RuleObject> = stores
        .rules
        .state()
        .iter()
        .map(|r| RuleObject {
            key: format!(
                "MirrorRule {}/{}",
                r.metadata.namespace.as_deref().unwrap_or_default(),
                name_of(&r.metadata)
            ),
            namespace: Some(r.metadata.namespace.clone().unwrap_or_default()),
            name: name_of(&r.metadata),
            generation: r.metadata.generation.unwrap_or_default(),
            fields: r.spec.rule.clone(),
            namespace_selector: None,
            created: r.metadata.creation_timestamp.clone(),
        })
        .collect();
    out.extend(stores.cluster_rules.state().iter().map(|r| RuleObject {
        key: format!("ClusterMirrorRule {}", name_of(&r.metadata)),
        namespace: None,
        name: name_of(&r.metadata),
        generation: r.metadata.generation.unwrap_or_default(),
        fields: r.spec.rule.clone(),
        namespace_selector: r.spec.namespace_selector.clone(),
        created: r.metadata.creation_timestamp.clone(),
    }));
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

fn name_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

/// The node's labels, the namespaces' labels, and the node's pods behind the attached
/// interfaces: named by the agent (runtime or `/proc`), labelled by the API (else by the
/// runtime's labels).
fn world(stores: &Stores, pods: &Pods, node: &str) -> World {
    let node_labels = stores
        .nodes
        .state()
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    let namespaces = stores
        .namespaces
        .state()
        .iter()
        .map(|n| (name_of(&n.metadata), n.metadata.labels.clone().unwrap_or_default()))
        .collect();
    let api_pods = stores.pods.state();
    let pods = pods
        .list()
        .into_iter()
        .filter_map(|p| {
            let ns = p.namespace.clone()?;
            let api = api_pods.iter().find(|a| {
                (a.metadata.namespace.as_deref() == Some(ns.as_str())
                    && a.metadata.name.as_deref() == Some(&p.name))
                    || (p.uid.is_some() && a.metadata.uid == p.uid)
            });
            let labels = api.and_then(|a| a.metadata.labels.clone()).unwrap_or(p.labels);
            Some(LocalPod { ifindex: p.ifindex, namespace: ns, name: p.name, labels })
        })
        .collect();
    World { node_labels, namespaces, pods }
}

/// The rules to install, from the plan.
fn wanted(planned: &[Planned]) -> Vec<WantedRule> {
    planned
        .iter()
        .filter_map(|p| match &p.verdict {
            Verdict::Install { rule, reach, ifaces } => Some(WantedRule {
                key: p.key.clone(),
                rule: rule.clone(),
                reach: *reach,
                ifaces: ifaces.clone(),
            }),
            _ => None,
        })
        .collect()
}
