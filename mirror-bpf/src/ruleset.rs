//! The rule set in user space and its compilation into the classifier's rule maps.
//!
//! Each (port, status) key the rules cover (the kinds other than a status under their
//! pseudo-status) holds the rules with request filters, lowest id first and at most
//! RULE_FILTERED_MAX of them, then two candidates without: the unconditional rule with the lowest
//! id, and the rule with a time (`latency>`, `noresponse>`) with the lowest threshold (then id).
//! The classifier tries the filtered ones first, then the unconditional one, then the timed one
//! if the trigger came late enough. Port-scoped keys are looked up first. This module is pure
//! logic: it says which map entries change, [`crate::rule_maps`] writes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::rule::{Rule, RuleId};
use crate::shared::types;

/// Port 0 stands for "any port" (the global status_rules array).
pub(crate) const ANY_PORT: u16 = 0;

/// A rule and the slot of its hit counter.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub rule: Rule,
    pub slot: u32,
}

/// A change to one rule-map entry: `None` clears it.
pub(crate) type KeyWrite = ((u16, u16), Option<types::rule_entry>);

/// Rules with request filters one key may have (`rule_entry.filtered`).
pub(crate) const FILTERED_MAX: usize = types::mirror_limits::RULE_FILTERED_MAX.0 as usize;
/// Rules with request filters the classifier holds at once (`rule_filters`).
pub(crate) const FILTERS_MAX: usize = types::mirror_limits::RULE_FILTERS_MAX.0 as usize;

/// Why a rule could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AddError {
    /// Every hit-counter slot is taken.
    NoSlot,
    /// A key would have more filtered rules than its entry lists.
    FilteredPerKey { port: u16, status: u16 },
    /// The filtered rules fill rule_filters.
    Filters,
}

/// The rules covering one key, in the order that picks the winner.
#[derive(Debug, Default)]
struct Covering {
    filtered: BTreeSet<RuleId>,
    any: BTreeSet<RuleId>,
    slow: BTreeSet<(u64, RuleId)>,
}

impl Covering {
    fn winners(&self) -> (Vec<RuleId>, Option<RuleId>, Option<(u64, RuleId)>) {
        (self.filtered.iter().copied().collect(), self.any.first().copied(), self.slow.first().copied())
    }

    fn is_empty(&self) -> bool {
        self.filtered.is_empty() && self.any.is_empty() && self.slow.is_empty()
    }
}

/// Where a rule sits among the candidates of each key it covers.
#[derive(Debug, Clone, Copy)]
enum Place {
    Filtered,
    Any,
    Slow(u64),
}

fn place(rule: &Rule) -> Place {
    if !rule.filter.is_empty() {
        Place::Filtered
    } else {
        latency_ns(rule).map_or(Place::Any, Place::Slow)
    }
}

#[derive(Debug)]
pub(crate) struct RuleSet {
    rules: BTreeMap<RuleId, Entry>,
    covering: HashMap<(u16, u16), Covering>,
    /// Rules per scoped port.
    port_rules: HashMap<u16, usize>,
    free_slots: Vec<u32>,
    next_id: RuleId,
}

fn latency_ns(rule: &Rule) -> Option<u64> {
    rule.threshold().map(|d| d.as_nanos().min(u64::MAX as u128) as u64)
}

impl RuleSet {
    pub fn new() -> Self {
        let slots = types::mirror_limits::RULE_SLOTS.0;
        // Slot 0 is never used; pop() hands out the lowest first.
        Self {
            rules: BTreeMap::new(),
            covering: HashMap::new(),
            port_rules: HashMap::new(),
            free_slots: (1..slots).rev().collect(),
            next_id: 1,
        }
    }

    pub fn get(&self, id: RuleId) -> Option<&Entry> {
        self.rules.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (RuleId, &Entry)> {
        self.rules.iter().map(|(id, e)| (*id, e))
    }

    /// Whether any rule is scoped to `port`.
    pub fn port_has_rules(&self, port: u16) -> bool {
        self.port_rules.get(&port).is_some_and(|n| *n > 0)
    }

    /// The id the next [`RuleSet::add`] without an id will get.
    pub fn next_id(&self) -> RuleId {
        self.next_id
    }

    /// Adds `rule` as `id`, in `slot` if given (and free) or the lowest free one. Returns the
    /// map writes.
    pub fn add(&mut self, id: RuleId, slot: Option<u32>, rule: Rule) -> Result<Vec<KeyWrite>, AddError> {
        let keys: Vec<_> = keys_of(&rule).collect();
        let place = place(&rule);
        if let Place::Filtered = place {
            if self.filtered_count() >= FILTERS_MAX {
                return Err(AddError::Filters);
            }
            if let Some((port, status)) =
                keys.iter().find(|k| self.covering.get(k).is_some_and(|c| c.filtered.len() >= FILTERED_MAX))
            {
                return Err(AddError::FilteredPerKey { port: *port, status: *status });
            }
        }
        let slot = match slot.and_then(|s| self.free_slots.iter().position(|f| *f == s)) {
            Some(i) => self.free_slots.remove(i),
            None => self.free_slots.pop().ok_or(AddError::NoSlot)?,
        };
        self.next_id = self.next_id.max(id + 1);
        if let Some(p) = rule.port {
            *self.port_rules.entry(p).or_default() += 1;
        }
        self.rules.insert(id, Entry { rule, slot });
        Ok(self.update(keys, |c| match place {
            Place::Filtered => {
                c.filtered.insert(id);
            }
            Place::Slow(t) => {
                c.slow.insert((t, id));
            }
            Place::Any => {
                c.any.insert(id);
            }
        }))
    }

    /// How many rules have request filters.
    fn filtered_count(&self) -> usize {
        self.rules.values().filter(|e| !e.rule.filter.is_empty()).count()
    }

    /// The bits (`1 << enum trigger_kind`) of the kinds the rules have (`settings.kinds`).
    pub fn kinds(&self) -> u32 {
        self.rules.values().fold(0, |acc, e| acc | 1 << e.rule.kind().raw())
    }

    /// Removes rule `id`. Returns it, its slot and the map writes.
    pub fn remove(&mut self, id: RuleId) -> Option<(Entry, Vec<KeyWrite>)> {
        let entry = self.rules.remove(&id)?;
        self.free_slots.push(entry.slot);
        if let Some(n) = entry.rule.port.and_then(|p| self.port_rules.get_mut(&p)) {
            *n -= 1;
        }
        let place = place(&entry.rule);
        let writes = self.update(keys_of(&entry.rule).collect(), |c| match place {
            Place::Filtered => {
                c.filtered.remove(&id);
            }
            Place::Slow(t) => {
                c.slow.remove(&(t, id));
            }
            Place::Any => {
                c.any.remove(&id);
            }
        });
        Some((entry, writes))
    }

    /// Applies `change` to the rules covering each key; returns the entries whose winner changed.
    fn update(&mut self, keys: Vec<(u16, u16)>, change: impl Fn(&mut Covering)) -> Vec<KeyWrite> {
        let mut writes = Vec::new();
        for key in keys {
            let c = self.covering.entry(key).or_default();
            let before = c.winners();
            change(c);
            let after = c.winners();
            if before == after {
                continue;
            }
            if c.is_empty() {
                self.covering.remove(&key);
                writes.push((key, None));
            } else {
                let mut filtered = [0u16; FILTERED_MAX];
                for (to, id) in filtered.iter_mut().zip(&after.0) {
                    *to = self.rules[id].slot as u16;
                }
                let entry = types::rule_entry {
                    filtered,
                    any: after.1.map(|id| self.action(id)).unwrap_or_default(),
                    slow: after.2.map(|(_, id)| self.action(id)).unwrap_or_default(),
                };
                writes.push((key, Some(entry)));
            }
        }
        writes
    }

    /// What the classifier does for rule `id`, and where a filtered rule's filter is kept.
    pub fn action(&self, id: RuleId) -> types::rule_action {
        let e = &self.rules[&id];
        let l = &e.rule.limits;
        types::rule_action {
            rule_id: id,
            slot: e.slot,
            max_packets: l.packets,
            max_bytes: l.bytes,
            max_duration_ns: l.duration.as_nanos().min(u64::MAX as u128) as u64,
            min_latency_ns: latency_ns(&e.rule).unwrap_or(0),
        }
    }
}

/// The (port, status) keys a rule covers.
fn keys_of(rule: &Rule) -> impl Iterator<Item = (u16, u16)> + '_ {
    let port = rule.port.unwrap_or(ANY_PORT);
    rule.statuses().map(move |s| (port, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Rule {
        s.parse().unwrap()
    }

    #[test]
    fn lowest_id_wins_and_next_takes_over() {
        let mut set = RuleSet::new();
        let w = set.add(1, None, r("status=500-501")).unwrap();
        assert_eq!(w.len(), 2);
        // Rule 2 covers 500..599 but only the uncovered keys change.
        let w = set.add(2, None, r("status=5xx")).unwrap();
        assert_eq!(w.len(), 98);
        assert!(w.iter().all(|((_, s), a)| *s >= 502 && a.unwrap().any.rule_id == 2));
        // Removing rule 1 hands 500 and 501 to rule 2.
        let (_, w) = set.remove(1).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|(_, a)| a.unwrap().any.rule_id == 2));
        let (_, w) = set.remove(2).unwrap();
        assert_eq!(w.len(), 100);
        assert!(w.iter().all(|(_, a)| a.is_none()));
        assert!(set.remove(2).is_none());
    }

    #[test]
    fn slowness_rules_sit_beside_unconditional_ones() {
        let mut set = RuleSet::new();
        set.add(1, None, r("latency>1s")).unwrap();
        let w = set.add(2, None, r("latency>200ms status=500")).unwrap();
        assert_eq!(w.len(), 1, "the lower threshold takes status 500");
        let e = w[0].1.unwrap();
        assert_eq!((e.any.rule_id, e.slow.rule_id, e.slow.min_latency_ns), (0, 2, 200_000_000));
        let w = set.add(3, None, r("status=500")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!((e.any.rule_id, e.slow.rule_id), (3, 2));
        let (_, w) = set.remove(2).unwrap();
        assert_eq!(w[0].1.unwrap().slow.rule_id, 1);
    }

    #[test]
    fn port_rules_are_counted_and_slots_reused() {
        let mut set = RuleSet::new();
        set.add(1, None, r("port=8080 status=503")).unwrap();
        set.add(2, None, r("status=503")).unwrap();
        assert!(set.port_has_rules(8080) && !set.port_has_rules(80));
        let slot = set.get(1).unwrap().slot;
        set.remove(1).unwrap();
        assert!(!set.port_has_rules(8080));
        set.add(3, None, r("status=404")).unwrap();
        assert_eq!(set.get(3).unwrap().slot, slot);
        assert_eq!(set.next_id(), 4);
        // A restored rule gets the slot it asks for.
        set.add(9, Some(77), r("status=404")).unwrap();
        assert_eq!(set.get(9).unwrap().slot, 77);
    }

    #[test]
    fn slots_run_out() {
        let mut set = RuleSet::new();
        let n = types::mirror_limits::RULE_SLOTS.0 - 1;
        for id in 1..=n {
            set.add(id, None, r("port=1 status=500")).unwrap();
        }
        assert!(matches!(set.add(n + 1, None, r("status=500")), Err(AddError::NoSlot)));
    }

    #[test]
    fn filtered_rules_are_listed_per_key_and_bounded() {
        let mut set = RuleSet::new();
        set.add(1, None, r("status=500")).unwrap();
        let w = set.add(2, None, r("status=500 path=/api/")).unwrap();
        let e = w[0].1.unwrap();
        let slot2 = set.get(2).unwrap().slot as u16;
        assert_eq!((e.filtered[0], e.filtered[1], e.any.rule_id), (slot2, 0, 1));
        let w = set.add(3, None, r("status=5xx method=POST")).unwrap();
        assert_eq!(w.len(), 100);
        let e500 = w.iter().find(|((_, s), _)| *s == 500).unwrap().1.unwrap();
        assert_eq!(e500.filtered[1], set.get(3).unwrap().slot as u16, "lowest id first");
        for id in 4..=(FILTERED_MAX as u32) + 1 {
            set.add(id, None, r("status=500 host=a.example")).unwrap();
        }
        let over = set.add(100, None, r("status=500 host=b.example"));
        assert!(matches!(over, Err(AddError::FilteredPerKey { port: ANY_PORT, status: 500 })));
        // Elsewhere there is room, and a removal makes some.
        set.add(101, None, r("status=501 host=b.example")).unwrap();
        set.remove(2).unwrap();
        set.add(102, None, r("status=500 host=b.example")).unwrap();
    }

    #[test]
    fn other_kinds_sit_under_their_pseudo_status() {
        let mut set = RuleSet::new();
        let w = set.add(1, None, r("reset")).unwrap();
        assert_eq!(w[0].0, (ANY_PORT, types::trigger_kind::TRIGGER_RESET.0 as u16));
        assert_eq!(w[0].1.unwrap().any.rule_id, 1);
        let w = set.add(2, None, r("noresponse>2s port=80")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!(w[0].0, (80, types::trigger_kind::TRIGGER_NORESPONSE.0 as u16));
        assert_eq!((e.slow.rule_id, e.slow.min_latency_ns), (2, 2_000_000_000));
        assert_eq!(set.kinds(), 0b110);
        set.add(3, None, r("status=500")).unwrap();
        assert_eq!(set.kinds(), 0b111);
    }

    #[test]
    fn grpc_codes_sit_under_their_pseudo_statuses() {
        let mut set = RuleSet::new();
        let base = types::mirror_limits::GRPC_STATUS_BASE.0 as u16;
        let w = set.add(1, None, r("grpc-status=internal,unavailable")).unwrap();
        let keys: Vec<_> = w.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [(ANY_PORT, base + 13), (ANY_PORT, base + 14)]);
        assert!(w.iter().all(|(_, e)| e.unwrap().any.rule_id == 1));
        let w = set.add(2, None, r("grpc-status=13 latency>1s port=50051")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!((w[0].0, e.slow.rule_id, e.slow.min_latency_ns), ((50051, base + 13), 2, 1_000_000_000));
        assert_eq!(set.kinds(), 1 << types::trigger_kind::TRIGGER_GRPC.0);
        // status= covers HTTP statuses only.
        let w = set.add(3, None, r("status=5xx")).unwrap();
        assert!(w.iter().all(|((_, s), _)| (500..=599).contains(s)));
        let (_, w) = set.remove(1).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|(_, e)| e.is_none()));
    }
}
