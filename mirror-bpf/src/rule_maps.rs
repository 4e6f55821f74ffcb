//! The rules installed in the classifier: the rule set, the rule maps it is written to, and the
//! per-CPU hit counters.

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Error, Result};
use crate::rule::{Rule, RuleId};
use crate::ruleset::{KeyWrite, RuleSet, ANY_PORT};
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
        let writes = self
            .set
            .add(id, slot, rule)
            .ok_or(Error::TooManyRules(types::mirror_limits::RULE_SLOTS.0 as usize - 1))?;
        if reset_hits {
            // A reused slot starts from zero, before the rule can match.
            let slot = self.set.get(id).map_or(0, |e| e.slot);
            let ncpus = libbpf_rs::num_possible_cpus().context(|| "counting CPUs".into())?;
            let zeros = vec![0u64.to_ne_bytes().to_vec(); ncpus];
            maps.rule_hits
                .update_percpu(&slot.to_ne_bytes(), &zeros, MapFlags::ANY)
                .context(|| format!("resetting hits of rule {id}"))?;
        }
        self.apply(maps, &writes)
    }

    /// Removes rule `id`.
    pub(crate) fn remove(&mut self, maps: &ClassifierMaps<'_>, id: RuleId) -> Result<Rule> {
        let (entry, writes) = self.set.remove(id).ok_or(Error::NoSuchRule(id))?;
        self.apply(maps, &writes)?;
        Ok(entry.rule)
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
            let action = action.unwrap_or_default();
            if *port == ANY_PORT {
                let key = u32::from(*status).to_ne_bytes();
                maps.status_rules.update(&key, bytes_of(&action), MapFlags::ANY)
            } else {
                let key = types::port_status_key { port: *port, status: *status };
                if action.any.rule_id == 0 && action.slow.rule_id == 0 {
                    maps.port_rules.delete(bytes_of(&key))
                } else {
                    maps.port_rules.update(bytes_of(&key), bytes_of(&action), MapFlags::ANY)
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

fn sum_percpu_u64(map: &MapMut<'_>, idx: u32) -> Result<u64> {
    let per_cpu = map
        .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
        .context(|| format!("reading {}", map.name().to_string_lossy()))?;
    Ok(per_cpu.unwrap_or_default().iter().map(|b| read_plain::<u64>(b)).sum())
}
