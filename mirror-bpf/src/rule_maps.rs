//! The rules installed in the classifier: the rule set, the rule maps it is written to, and the
//! per-CPU hit counters.

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Error, Result};
use crate::rule::{Rule, RuleId};
use crate::ruleset::{AddError, KeyWrite, RuleSet, ANY_PORT, FILTERED_MAX, FILTERS_MAX};
use crate::shared::{bytes_of, read_plain, types};
use crate::skel::classifier::ClassifierMaps;

/// A rule as installed, with its trigger count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    /// Its id.
    pub id: RuleId,
    /// The rule.
    pub rule: Rule,
    /// Flows it triggered.
    pub hits: u64,
}

/// The rule set, kept in step with the classifier's rule maps.
#[derive(Debug)]
pub(crate) struct InstalledRules {
    set: RuleSet,
}

impl InstalledRules {
    /// No rules (the maps start empty, or keep adopted entries until rules are restored).
    pub(crate) fn new() -> Self {
        Self { set: RuleSet::new() }
    }

    /// The next free id.
    pub(crate) fn next_id(&self) -> RuleId {
        self.set.next_id()
    }

    /// Adds (or replaces) rule `id`, in hit-counter `slot` if given; `reset_hits` zeroes its
    /// counter first.
    pub(crate) fn add(
        &mut self,
        maps: &ClassifierMaps<'_>,
        id: RuleId,
        slot: Option<u32>,
        rule: Rule,
        reset_hits: bool,
    ) -> Result<()> {
        if self.set.get(id).is_some() {
            self.remove(maps, id)?;
        }
        let writes = self.set.add(id, slot, rule).map_err(|e| match e {
            AddError::NoSlot => Error::TooManyRules(types::mirror_limits::RULE_SLOTS.0 as usize - 1),
            AddError::FilteredPerKey { port, status } => Error::RuleDoesNotFit(format!(
                "at most {FILTERED_MAX} rules with method=, path= or host= may cover one {} and {}",
                key_name(status),
                if port == ANY_PORT { "any port".to_string() } else { format!("port {port}") }
            )),
            AddError::Filters => {
                Error::RuleDoesNotFit(format!("at most {FILTERS_MAX} rules may have method=, path= or host="))
            }
        })?;
        // Not installed in full: the rule is taken out again, so that the set says what the
        // maps hold.
        let installed = self.install(maps, id, &writes, reset_hits);
        if installed.is_err() {
            if let Some((_, undo)) = self.set.remove(id) {
                let _ = self.apply(maps, &undo);
            }
        }
        installed
    }

    /// Writes what adding rule `id` changed: its filter, its zeroed hit counter (`reset_hits`),
    /// the entries of the keys it covers.
    fn install(
        &self,
        maps: &ClassifierMaps<'_>,
        id: RuleId,
        writes: &[KeyWrite],
        reset_hits: bool,
    ) -> Result<()> {
        // Its filter first: the entries that list the rule come after.
        if let Some(e) = self.set.get(id) {
            if !e.rule.filter.is_empty() {
                let f = filter_value(self.set.action(id), &e.rule);
                maps.rule_filters
                    .update(&e.slot.to_ne_bytes(), bytes_of(&f), MapFlags::ANY)
                    .context(|| format!("writing the filter of rule {id}"))?;
            }
        }
        if reset_hits {
            // A reused slot starts from zero, before the rule can match.
            let slot = self.set.get(id).map_or(0, |e| e.slot);
            let ncpus = libbpf_rs::num_possible_cpus().context(|| "counting CPUs".into())?;
            let zeros = vec![0u64.to_ne_bytes().to_vec(); ncpus];
            maps.rule_hits
                .update_percpu(&slot.to_ne_bytes(), &zeros, MapFlags::ANY)
                .context(|| format!("resetting hits of rule {id}"))?;
        }
        self.apply(maps, writes)
    }

    /// Removes rule `id`.
    pub(crate) fn remove(&mut self, maps: &ClassifierMaps<'_>, id: RuleId) -> Result<Rule> {
        let (entry, writes) = self.set.remove(id).ok_or(Error::NoSuchRule(id))?;
        self.apply(maps, &writes)?;
        if !entry.rule.filter.is_empty() {
            // No entry lists it any more.
            maps.rule_filters
                .delete(&entry.slot.to_ne_bytes())
                .context(|| format!("removing the filter of rule {id}"))?;
        }
        Ok(entry.rule)
    }

    /// The bits (`1 << enum trigger_kind`) of the kinds the rules have.
    pub(crate) fn kinds(&self) -> u32 {
        self.set.kinds()
    }

    /// The hit-counter slot of a rule.
    pub(crate) fn slot(&self, id: RuleId) -> Option<u32> {
        self.set.get(id).map(|e| e.slot)
    }

    /// Every rule with its id and slot.
    pub(crate) fn slots(&self) -> Vec<(RuleId, u32, Rule)> {
        self.set.iter().map(|(id, e)| (id, e.slot, e.rule.clone())).collect()
    }

    /// The rules, by id, with their hit counts.
    pub(crate) fn list(&self, maps: &ClassifierMaps<'_>) -> Result<Vec<RuleInfo>> {
        self.set
            .iter()
            .map(|(id, e)| {
                let hits = sum_percpu_u64(&maps.rule_hits, e.slot)?;
                Ok(RuleInfo { id, rule: e.rule.clone(), hits })
            })
            .collect()
    }

    fn apply(&self, maps: &ClassifierMaps<'_>, writes: &[KeyWrite]) -> Result<()> {
        for ((port, status), action) in writes {
            // `None`: no rule covers the key any more (the set says so, whatever kind they were).
            if *port == ANY_PORT {
                let key = u32::from(*status).to_ne_bytes();
                maps.status_rules.update(&key, bytes_of(&action.unwrap_or_default()), MapFlags::ANY)
            } else {
                let key = types::port_status_key { port: *port, status: *status };
                match action {
                    None => maps.port_rules.delete(bytes_of(&key)),
                    Some(a) => maps.port_rules.update(bytes_of(&key), bytes_of(a), MapFlags::ANY),
                }
            }
            .context(|| format!("writing the rule entry for port {port} status {status}"))?;
        }
        // The bitmap word of every port touched, recomputed from the rule set.
        let mut words: Vec<u16> = writes.iter().map(|((p, _), _)| *p / 64).collect();
        words.sort_unstable();
        words.dedup();
        for w in words {
            let bits =
                (0..64u16).filter(|b| self.set.port_has_rules(w * 64 + b)).fold(0u64, |acc, b| acc | 1 << b);
            maps.port_rule_bits
                .update(&u32::from(w).to_ne_bytes(), &bits.to_ne_bytes(), MapFlags::ANY)
                .context(|| format!("writing the port bitmap word {w}"))?;
        }
        Ok(())
    }
}

/// A rule's filter as the classifier holds it (`struct rule_filter`).
fn filter_value(action: types::rule_action, rule: &Rule) -> types::rule_filter {
    let mut f = types::rule_filter { action, methods: rule.filter.methods, ..Default::default() };
    if let Some(p) = &rule.filter.path {
        f.path_len = p.len() as u8;
        f.path[..p.len()].copy_from_slice(p.as_bytes());
    }
    if let Some(h) = &rule.filter.host {
        f.host_len = h.len() as u8;
        f.host[..h.len()].copy_from_slice(h.as_bytes());
    }
    f
}

/// "status 500", or the name of another kind's pseudo-status.
fn key_name(status: u16) -> String {
    use crate::grpc::{grpc_status_name, GRPC_STATUS_BASE};
    if (GRPC_STATUS_BASE..100).contains(&status) {
        let code = status - GRPC_STATUS_BASE;
        return format!(
            "grpc-status {code}{}",
            grpc_status_name(code).map(|n| format!(" ({n})")).unwrap_or_default()
        );
    }
    match crate::rule::TriggerKind::from_raw(u32::from(status)) {
        Some(k) if status < 100 => format!("{k} rule"),
        _ => format!("status {status}"),
    }
}

fn sum_percpu_u64(map: &MapMut<'_>, idx: u32) -> Result<u64> {
    let per_cpu = map
        .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
        .context(|| format!("reading {}", map.name().to_string_lossy()))?;
    Ok(per_cpu.unwrap_or_default().iter().map(|b| read_plain::<u64>(b)).sum())
}
