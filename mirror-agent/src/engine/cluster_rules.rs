//! The rules that come from the cluster's rule resources, as the driver holds them: each
//! installed once under its resource's key (`MirrorRule shop/checkout-500s`), replaced when its
//! rule or reach changes, removed when its resource is gone; and for the selected ones, which
//! interfaces select them (each interface's set is handed to the data path, which keys the
//! rule maps by it). Rules added with mirrorctl are not here and never touched from here.

use std::collections::{BTreeMap, BTreeSet};

use mirror_bpf::{Datapath, Reach, Rule, RuleId};

/// A rule the cluster wants installed on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct WantedRule {
    /// Its resource (`MirrorRule NAMESPACE/NAME`, `ClusterMirrorRule NAME`).
    pub key: String,
    /// The rule.
    pub rule: Rule,
    /// Every interface, or the ones that select it.
    pub reach: Reach,
    /// For a selected rule: the interfaces of the pods it selects.
    pub ifaces: BTreeSet<u32>,
}

/// What installing a wanted rule gave: its id, or why it is not installed.
pub type Installed = Result<RuleId, String>;

#[derive(Debug, Clone)]
struct Meta {
    key: String,
    rule: Rule,
    reach: Reach,
    ifaces: BTreeSet<u32>,
}

/// The cluster's rules installed, and the interfaces' selections.
#[derive(Debug, Default)]
pub(super) struct ClusterRules {
    by_id: BTreeMap<RuleId, Meta>,
    /// The selected rules of each interface, as last handed to the data path.
    selected: BTreeMap<u32, BTreeSet<RuleId>>,
}

impl ClusterRules {
    /// The resource rule `id` comes from (none: a local rule).
    pub fn source(&self, id: RuleId) -> Option<&str> {
        self.by_id.get(&id).map(|m| m.key.as_str())
    }

    /// A selected rule's interfaces (none: local, or for every interface).
    pub fn selected_ifaces(&self, id: RuleId) -> Option<Vec<u32>> {
        self.by_id.get(&id).filter(|m| m.reach == Reach::Selected).map(|m| m.ifaces.iter().copied().collect())
    }

    /// Records a rule restored from the state file (installed already).
    pub fn restored(&mut self, id: RuleId, key: String, rule: Rule, reach: Reach, ifaces: BTreeSet<u32>) {
        self.by_id.insert(id, Meta { key, rule, reach, ifaces });
    }

    /// Installs what `want` lists and removes the cluster's other rules; `fits` says whether a
    /// set of rules (the new one last) fits the rule maps. Then hands each interface its
    /// selection. One result per wanted rule, in order.
    pub fn apply(
        &mut self,
        dp: &mut Datapath<'static>,
        want: &[WantedRule],
        fits: impl Fn(&[&Rule]) -> Result<(), String>,
    ) -> Vec<(String, Installed)> {
        let by_key: BTreeMap<&str, &WantedRule> = want.iter().map(|w| (w.key.as_str(), w)).collect();
        // Gone, or changed: out first, so that a changed rule's new form has room.
        let stale: Vec<RuleId> = self
            .by_id
            .iter()
            .filter(|(_, m)| {
                by_key.get(m.key.as_str()).is_none_or(|w| w.rule != m.rule || w.reach != m.reach)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            let m = self.by_id.remove(&id).expect("listed");
            match dp.remove_rule(id) {
                Ok(_) => tracing::info!(id, source = %m.key, rule = %m.rule, "cluster rule removed"),
                Err(e) => tracing::warn!(id, source = %m.key, error = %e, "removing a cluster rule"),
            }
        }
        let mut out = Vec::with_capacity(want.len());
        for w in want {
            if let Some((id, m)) = self.by_id.iter_mut().find(|(_, m)| m.key == w.key) {
                m.ifaces = w.ifaces.clone();
                out.push((w.key.clone(), Ok(*id)));
                continue;
            }
            let present = dp.rule_slots();
            let mut rules: Vec<&Rule> = present.iter().map(|(_, _, r)| r).collect();
            rules.push(&w.rule);
            let added = fits(&rules)
                .and_then(|()| dp.add_rule_with(w.rule.clone(), w.reach).map_err(|e| e.to_string()));
            match &added {
                Ok(id) => {
                    tracing::info!(id, source = %w.key, rule = %w.rule, reach = ?w.reach, "cluster rule added");
                    self.by_id.insert(
                        *id,
                        Meta {
                            key: w.key.clone(),
                            rule: w.rule.clone(),
                            reach: w.reach,
                            ifaces: w.ifaces.clone(),
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(source = %w.key, rule = %w.rule, error = %e, "cluster rule not installed")
                }
            }
            out.push((w.key.clone(), added));
        }
        self.reselect(dp);
        out
    }

    /// Hands each interface whose selection changed its selected rules.
    pub fn reselect(&mut self, dp: &mut Datapath<'static>) {
        let mut now: BTreeMap<u32, BTreeSet<RuleId>> = BTreeMap::new();
        for (id, m) in &self.by_id {
            if m.reach == Reach::Selected {
                for i in &m.ifaces {
                    now.entry(*i).or_default().insert(*id);
                }
            }
        }
        let ifaces: BTreeSet<u32> = now.keys().chain(self.selected.keys()).copied().collect();
        for i in ifaces {
            let want = now.get(&i).cloned().unwrap_or_default();
            if self.selected.get(&i).cloned().unwrap_or_default() == want {
                continue;
            }
            match dp.select(i, &want) {
                Ok(()) => {
                    tracing::debug!(ifindex = i, rules = ?want, "interface selection");
                    if want.is_empty() {
                        self.selected.remove(&i);
                    } else {
                        self.selected.insert(i, want);
                    }
                }
                Err(e) => tracing::warn!(ifindex = i, error = %e, "selecting the rules of an interface"),
            }
        }
    }

    /// An interface is gone: the data path forgets its selection.
    pub fn forget_iface(&mut self, dp: &mut Datapath<'static>, ifindex: u32) {
        for m in self.by_id.values_mut() {
            m.ifaces.remove(&ifindex);
        }
        if self.selected.remove(&ifindex).is_some() {
            if let Err(e) = dp.forget_iface(ifindex) {
                tracing::warn!(ifindex, error = %e, "forgetting the selection of an interface");
            }
        }
    }
}
