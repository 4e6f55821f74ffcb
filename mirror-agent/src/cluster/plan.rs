//! What this node makes of the cluster's rules: for each rule resource, whether its agent
//! installs it, and for which of the node's pods. Pure: the rules, the node's labels, the
//! namespaces' labels, the node's pods and the time in; one verdict per rule out.
//!
//! A `ClusterMirrorRule` without pod and namespace selectors covers every pod: it is installed
//! for every interface ([`Reach::Everywhere`], both sides of a flow, as a `mirrorctl` rule).
//! Every other rule covers the pods it selects, as the server of a flow
//! ([`Reach::Selected`]), each by the interface behind which it runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::core::{Selector, SelectorExt};
use mirror_bpf::{Reach, Rule};

use super::crd::RuleFields;
use super::spec;

/// Labels by key.
pub type Labels = BTreeMap<String, String>;

/// A rule resource as the plan reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleObject {
    /// `MirrorRule NAMESPACE/NAME` or `ClusterMirrorRule NAME`: the source `mirrorctl rules
    /// list` shows.
    pub key: String,
    /// The namespace of a `MirrorRule` (none: a `ClusterMirrorRule`).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its spec's generation.
    pub generation: i64,
    /// The rule.
    pub fields: RuleFields,
    /// A `ClusterMirrorRule`'s namespace selector.
    pub namespace_selector: Option<LabelSelector>,
    /// When the API server created it.
    pub created: Option<Time>,
}

/// A pod of this node, behind one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    /// The host-side interface.
    pub ifindex: u32,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: Labels,
}

/// What the plan is made against.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// This node's labels.
    pub node_labels: Labels,
    /// Namespaces' labels, by name (a namespace not listed has only its name label).
    pub namespaces: HashMap<String, Labels>,
    /// This node's pods.
    pub pods: Vec<LocalPod>,
}

/// What this node does with a rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Installed: the rule, its reach and (for a selected rule) the interfaces of the pods it
    /// selects.
    Install { rule: Rule, reach: Reach, ifaces: BTreeSet<u32> },
    /// Not a rule: why, in words.
    Invalid(String),
    /// Its time is over.
    Expired,
    /// Its node selector leaves this node out.
    OtherNodes,
}

/// The plan for one rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Its key ([`RuleObject::key`]).
    pub key: String,
    /// The generation planned.
    pub generation: i64,
    /// The rule's text when it is one (whatever this node does with it).
    pub text: Option<String>,
    /// What this node does.
    pub verdict: Verdict,
    /// When it ends, if it does.
    pub expires: Option<SystemTime>,
}

/// The plan for every rule.
pub fn plan(rules: &[RuleObject], world: &World, now: SystemTime) -> Vec<Planned> {
    rules.iter().map(|r| plan_one(r, world, now)).collect()
}

fn plan_one(r: &RuleObject, world: &World, now: SystemTime) -> Planned {
    let mut out = Planned {
        key: r.key.clone(),
        generation: r.generation,
        text: None,
        verdict: Verdict::Expired,
        expires: None,
    };
    let checked = (|| {
        let rule = spec::rule_of(&r.fields)?;
        out.text = Some(rule.to_string());
        let expires = spec::expiry(&r.fields, r.created.as_ref())?;
        let pods = selector("podSelector", r.fields.pod_selector.as_ref())?;
        let namespaces = selector("namespaceSelector", r.namespace_selector.as_ref())?;
        let nodes = selector("nodeSelector", r.fields.node_selector.as_ref())?;
        Ok::<_, String>((rule, expires, pods, namespaces, nodes))
    })();
    let (rule, expires, pods, namespaces, nodes) = match checked {
        Ok(v) => v,
        Err(why) => {
            out.verdict = Verdict::Invalid(why);
            return out;
        }
    };
    out.expires = expires;
    if expires.is_some_and(|e| e <= now) {
        out.verdict = Verdict::Expired;
        return out;
    }
    if nodes.as_ref().is_some_and(|s| !s.matches(&world.node_labels)) {
        out.verdict = Verdict::OtherNodes;
        return out;
    }
    if r.namespace.is_none() && pods.is_none() && namespaces.is_none() {
        out.verdict = Verdict::Install { rule, reach: Reach::Everywhere, ifaces: BTreeSet::new() };
        return out;
    }
    let ifaces = world
        .pods
        .iter()
        .filter(|p| match &r.namespace {
            Some(ns) => &p.namespace == ns,
            None => namespaces.as_ref().is_none_or(|s| s.matches(&namespace_labels(world, &p.namespace))),
        })
        .filter(|p| pods.as_ref().is_none_or(|s| s.matches(&p.labels)))
        .map(|p| p.ifindex)
        .collect();
    out.verdict = Verdict::Install { rule, reach: Reach::Selected, ifaces };
    out
}

/// A selector that selects everything (absent, or empty) is none.
fn selector(field: &str, s: Option<&LabelSelector>) -> Result<Option<Selector>, String> {
    let Some(s) = s else { return Ok(None) };
    let sel = Selector::try_from(s.clone()).map_err(|e| format!("spec.{field}: {e}"))?;
    Ok((!sel.selects_all()).then_some(sel))
}

fn namespace_labels(world: &World, ns: &str) -> Labels {
    let mut labels = world.namespaces.get(ns).cloned().unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), ns.into());
    labels
}

/// The earliest end of a rule still running after `now`.
pub fn next_expiry(planned: &[Planned], now: SystemTime) -> Option<SystemTime> {
    planned.iter().filter_map(|p| p.expires).filter(|e| *e > now).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn obj(key: &str, ns: Option<&str>, yaml: &str) -> RuleObject {
        RuleObject {
            key: key.into(),
            namespace: ns.map(Into::into),
            name: key.into(),
            generation: 1,
            fields: serde_yaml_ng::from_str(yaml).unwrap(),
            namespace_selector: None,
            created: None,
        }
    }

    fn pod(ifindex: u32, ns: &str, app: &str) -> LocalPod {
        LocalPod {
            ifindex,
            namespace: ns.into(),
            name: format!("{app}-{ifindex}"),
            labels: [("app".to_string(), app.to_string())].into(),
        }
    }

    fn world() -> World {
        World {
            node_labels: [("zone".to_string(), "a".to_string())].into(),
            namespaces: [("shop".to_string(), [("team".to_string(), "web".to_string())].into())].into(),
            pods: vec![pod(10, "shop", "checkout"), pod(11, "shop", "cart"), pod(12, "bank", "checkout")],
        }
    }

    fn ifaces(p: &Planned) -> Vec<u32> {
        match &p.verdict {
            Verdict::Install { ifaces, .. } => ifaces.iter().copied().collect(),
            v => panic!("{} not installed: {v:?}", p.key),
        }
    }

    #[test]
    fn a_namespaced_rule_selects_only_its_namespace() {
        let now = SystemTime::now();
        let rules = [
            obj("a", Some("shop"), "status: \"500\"\npodSelector: {matchLabels: {app: checkout}}\n"),
            obj("b", Some("shop"), "status: \"500\"\n"),
            obj("c", Some("bank"), "status: \"500\"\npodSelector: {matchLabels: {app: cart}}\n"),
        ];
        let p = plan(&rules, &world(), now);
        assert_eq!(ifaces(&p[0]), [10]);
        assert_eq!(ifaces(&p[1]), [10, 11]);
        assert_eq!(ifaces(&p[2]), Vec::<u32>::new());
        assert!(matches!(p[1].verdict, Verdict::Install { reach: Reach::Selected, .. }));
    }

    #[test]
    fn cluster_rules_select_namespaces_by_label_or_cover_everything() {
        let now = SystemTime::now();
        let mut by_team = obj("t", None, "status: \"500\"\n");
        by_team.namespace_selector = Some(serde_yaml_ng::from_str("matchLabels: {team: web}").unwrap());
        let mut by_name = obj("n", None, "status: \"500\"\npodSelector: {matchExpressions: [{key: app, operator: In, values: [checkout]}]}\n");
        by_name.namespace_selector =
            Some(serde_yaml_ng::from_str("matchLabels: {kubernetes.io/metadata.name: bank}").unwrap());
        let all = obj("all", None, "status: \"500\"\npodSelector: {}\n");
        let p = plan(&[by_team, by_name, all], &world(), now);
        assert_eq!(ifaces(&p[0]), [10, 11]);
        assert_eq!(ifaces(&p[1]), [12]);
        assert!(matches!(p[2].verdict, Verdict::Install { reach: Reach::Everywhere, .. }), "{:?}", p[2]);
    }

    #[test]
    fn nodes_expiry_and_bad_specs() {
        let now = SystemTime::now();
        let rules = [
            obj("z", None, "status: \"500\"\nnodeSelector: {matchLabels: {zone: b}}\n"),
            obj("old", None, "status: \"500\"\nexpiresAt: \"2020-01-01T00:00:00Z\"\n"),
            obj("bad", None, "status: \"5xz\"\n"),
            obj(
                "op",
                None,
                "status: \"500\"\npodSelector: {matchExpressions: [{key: app, operator: Near}]}\n",
            ),
            obj("soon", None, "status: \"500\"\nttl: 1h\n"),
        ];
        let p = plan(&rules, &world(), now);
        assert_eq!(p[0].verdict, Verdict::OtherNodes);
        assert_eq!(p[1].verdict, Verdict::Expired);
        assert!(matches!(&p[2].verdict, Verdict::Invalid(w) if w.starts_with("spec.status")), "{:?}", p[2]);
        assert!(
            matches!(&p[3].verdict, Verdict::Invalid(w) if w.starts_with("spec.podSelector")),
            "{:?}",
            p[3]
        );
        let next = next_expiry(&p, now).unwrap();
        assert!(next > now + Duration::from_secs(3500) && next <= now + Duration::from_secs(3601));
        assert_eq!(p[0].text.as_deref(), Some("status=500 packets=10000 bytes=0 duration=60s"));
    }
}
