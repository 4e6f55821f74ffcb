//! The rule set in user space and its compilation into the classifier's rule maps.
//!
//! Each (port, status) key the rules cover (the kinds other than a status under their
//! pseudo-status) holds the rules with request filters, lowest id first and at most
//! RULE_FILTERED_MAX of them, then two candidates without: the unconditional rule with the lowest
//! id, and the rule with a time (`latency>`, `noresponse>`) with the lowest threshold (then id).
//! The classifier tries the filtered ones first, then the unconditional one, then the timed one
//! if the trigger came late enough. Port-scoped keys are looked up first.
//!
//! Keys are compiled per scope ([`super::scopes`]): scope 0 holds the rules that reach
//! everywhere, alone; each other scope the union of those and its selected rules, compiled
//! the same way, so that a lookup in a scope is complete by itself. A rule keeps one hit-counter
//! slot whatever the scopes it is in. This module is pure logic: it says which map entries
//! change, [`super::maps`] writes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::scopes::{Reach, ScopeId, GLOBAL};
use super::syntax::{Rule, RuleId};
use crate::shared::types;

/// Port 0 stands for "any port" (the global status_rules array in scope 0).
pub(crate) const ANY_PORT: u16 = 0;

/// A rule, where it reaches, and the slot of its hit counter.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub rule: Rule,
    pub slot: u32,
    pub reach: Reach,
}

/// A rule-map key: (scope, port, status).
pub(crate) type Key = (ScopeId, u16, u16);

/// A change to one rule-map entry: `None` clears it.
pub(crate) type KeyWrite = (Key, Option<types::rule_entry>);

/// Rules with request filters one key may have (`rule_entry.filtered`).
pub(crate) const FILTERED_MAX: usize = types::mirror_limits::RULE_FILTERED_MAX.0 as usize;
/// Rules with request filters the classifier holds at once (`rule_filters`).
pub(crate) const FILTERS_MAX: usize = types::mirror_limits::RULE_FILTERS_MAX.0 as usize;

/// Why a rule could not be added, or a scope compiled.
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

/// The candidates of a key: its filtered rules, its unconditional rule, its timed rule.
type Winners = (Vec<RuleId>, Option<RuleId>, Option<(u64, RuleId)>);

impl Covering {
    fn winners(&self) -> Winners {
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

impl Place {
    fn of(rule: &Rule) -> Place {
        if !rule.filter.is_empty() {
            Place::Filtered
        } else {
            latency_ns(rule).map_or(Place::Any, Place::Slow)
        }
    }

    fn join(self, c: &mut Covering, id: RuleId) {
        match self {
            Place::Filtered => c.filtered.insert(id),
            Place::Slow(t) => c.slow.insert((t, id)),
            Place::Any => c.any.insert(id),
        };
    }

    fn leave(self, c: &mut Covering, id: RuleId) {
        match self {
            Place::Filtered => c.filtered.remove(&id),
            Place::Slow(t) => c.slow.remove(&(t, id)),
            Place::Any => c.any.remove(&id),
        };
    }
}

#[derive(Debug)]
pub(crate) struct RuleSet {
    rules: BTreeMap<RuleId, Entry>,
    covering: BTreeMap<Key, Covering>,
    /// The selected rules of each scope other than 0 compiled into the maps.
    scopes: BTreeMap<ScopeId, BTreeSet<RuleId>>,
    /// Keys with rules per scoped port, over every scope (the port bitmap).
    port_keys: HashMap<u16, usize>,
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
            covering: BTreeMap::new(),
            scopes: BTreeMap::new(),
            port_keys: HashMap::new(),
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

    /// Whether any key of any scope is scoped to `port`.
    pub fn port_has_rules(&self, port: u16) -> bool {
        self.port_keys.get(&port).is_some_and(|n| *n > 0)
    }

    /// The id the next [`RuleSet::add_with`] without an id will get.
    pub fn next_id(&self) -> RuleId {
        self.next_id
    }

    /// Scope 0 and every scope compiled, lowest first.
    fn all_scopes(&self) -> Vec<ScopeId> {
        std::iter::once(GLOBAL).chain(self.scopes.keys().copied()).collect()
    }

    /// Adds `rule` as `id`, reaching `reach`, in `slot` if given (and free) or the lowest free
    /// one. A rule that reaches everywhere joins scope 0 and every scope; a selected one joins
    /// none until a scope is compiled with it. Returns the map writes.
    pub fn add_with(
        &mut self,
        id: RuleId,
        slot: Option<u32>,
        rule: Rule,
        reach: Reach,
    ) -> Result<Vec<KeyWrite>, AddError> {
        let scopes = match reach {
            Reach::Everywhere => self.all_scopes(),
            Reach::Selected => Vec::new(),
        };
        let keys: Vec<Key> =
            scopes.iter().flat_map(|s| keys_of(&rule).map(move |(p, st)| (*s, p, st))).collect();
        let place = Place::of(&rule);
        if let Place::Filtered = place {
            if self.filtered_count() >= FILTERS_MAX {
                return Err(AddError::Filters);
            }
            if let Some((_, port, status)) =
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
        self.rules.insert(id, Entry { rule, slot, reach });
        Ok(self.update(keys, |c| place.join(c, id)))
    }

    /// [`RuleSet::add_with`] a rule that reaches everywhere.
    #[cfg(test)]
    pub fn add(&mut self, id: RuleId, slot: Option<u32>, rule: Rule) -> Result<Vec<KeyWrite>, AddError> {
        self.add_with(id, slot, rule, Reach::Everywhere)
    }

    /// How many rules have request filters.
    fn filtered_count(&self) -> usize {
        self.rules.values().filter(|e| !e.rule.filter.is_empty()).count()
    }

    /// The bits (`1 << enum trigger_kind`) of the kinds the rules have (`settings.kinds`).
    pub fn kinds(&self) -> u32 {
        self.rules.values().fold(0, |acc, e| acc | 1 << e.rule.kind().raw())
    }

    /// Removes rule `id` from the set and from every scope it is compiled into. Returns it,
    /// its slot and the map writes.
    pub fn remove(&mut self, id: RuleId) -> Option<(Entry, Vec<KeyWrite>)> {
        let entry = self.rules.remove(&id)?;
        self.free_slots.push(entry.slot);
        let scopes: Vec<ScopeId> = match entry.reach {
            Reach::Everywhere => self.all_scopes(),
            Reach::Selected => self.scopes.iter().filter(|(_, r)| r.contains(&id)).map(|(s, _)| *s).collect(),
        };
        for s in &scopes {
            if let Some(r) = self.scopes.get_mut(s) {
                r.remove(&id);
            }
        }
        let place = Place::of(&entry.rule);
        let keys = scopes.iter().flat_map(|s| keys_of(&entry.rule).map(move |(p, st)| (*s, p, st))).collect();
        let writes = self.update(keys, |c| place.leave(c, id));
        Some((entry, writes))
    }

    /// The selected rules scope `s` is compiled with (`None`: not compiled).
    #[cfg(test)]
    pub fn scope(&self, s: ScopeId) -> Option<&BTreeSet<RuleId>> {
        self.scopes.get(&s)
    }

    /// Compiles scope `s` (not 0, not compiled yet) from the rules that reach everywhere and
    /// the selected rules `selected`: every entry of the scope, to be written before any
    /// interface points to it. Fails, changing nothing, when a key would list more filtered
    /// rules than its entry holds.
    pub fn scope_create(
        &mut self,
        s: ScopeId,
        selected: &BTreeSet<RuleId>,
    ) -> Result<Vec<KeyWrite>, AddError> {
        assert!(s != GLOBAL && !self.scopes.contains_key(&s), "scope {s} is new");
        let members: Vec<RuleId> = self
            .rules
            .iter()
            .filter(|(id, e)| e.reach == Reach::Everywhere || selected.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let mut compiled: BTreeMap<Key, Covering> = BTreeMap::new();
        for id in &members {
            let rule = &self.rules[id].rule;
            let place = Place::of(rule);
            for (p, st) in keys_of(rule) {
                let c = compiled.entry((s, p, st)).or_default();
                place.join(c, *id);
                if c.filtered.len() > FILTERED_MAX {
                    return Err(AddError::FilteredPerKey { port: p, status: st });
                }
            }
        }
        self.scopes.insert(s, selected.iter().copied().filter(|id| self.rules.contains_key(id)).collect());
        let mut writes = Vec::with_capacity(compiled.len());
        for (key, c) in compiled {
            writes.push((key, Some(self.entry_of(&c.winners()))));
            if key.1 != ANY_PORT {
                *self.port_keys.entry(key.1).or_default() += 1;
            }
            self.covering.insert(key, c);
        }
        Ok(writes)
    }

    /// Forgets scope `s` (no interface points to it any more): every entry of it, cleared.
    pub fn scope_drop(&mut self, s: ScopeId) -> Vec<KeyWrite> {
        if s == GLOBAL || self.scopes.remove(&s).is_none() {
            return Vec::new();
        }
        let keys: Vec<Key> =
            self.covering.range((s, 0, 0)..=(s, u16::MAX, u16::MAX)).map(|(k, _)| *k).collect();
        for key in &keys {
            self.covering.remove(key);
            self.port_key_gone(key.1);
        }
        keys.into_iter().map(|k| (k, None)).collect()
    }

    /// Takes selected rule `id` out of scope `s` alone (its set shrank, the scope keeps its id).
    pub fn scope_unselect(&mut self, s: ScopeId, id: RuleId) -> Vec<KeyWrite> {
        let Some(entry) = self.rules.get(&id) else { return Vec::new() };
        if entry.reach != Reach::Selected || !self.scopes.get_mut(&s).is_some_and(|r| r.remove(&id)) {
            return Vec::new();
        }
        let place = Place::of(&entry.rule);
        let keys = keys_of(&entry.rule).map(|(p, st)| (s, p, st)).collect();
        self.update(keys, |c| place.leave(c, id))
    }

    fn port_key_gone(&mut self, port: u16) {
        if port != ANY_PORT {
            if let Some(n) = self.port_keys.get_mut(&port) {
                *n -= 1;
            }
        }
    }

    /// Applies `change` to the rules covering each key; returns the entries whose winner changed.
    fn update(&mut self, keys: Vec<Key>, change: impl Fn(&mut Covering)) -> Vec<KeyWrite> {
        let mut writes = Vec::new();
        for key in keys {
            let c = self.covering.entry(key).or_default();
            let before = c.winners();
            let was_empty = c.is_empty();
            change(c);
            let after = c.winners();
            if before == after {
                continue;
            }
            if c.is_empty() {
                self.covering.remove(&key);
                self.port_key_gone(key.1);
                writes.push((key, None));
            } else {
                if was_empty && key.1 != ANY_PORT {
                    *self.port_keys.entry(key.1).or_default() += 1;
                }
                writes.push((key, Some(self.entry_of(&after))));
            }
        }
        writes
    }

    /// The map entry of a key whose candidates are `w`.
    fn entry_of(&self, w: &Winners) -> types::rule_entry {
        let mut filtered = [0u16; FILTERED_MAX];
        for (to, id) in filtered.iter_mut().zip(&w.0) {
            *to = self.rules[id].slot as u16;
        }
        types::rule_entry {
            filtered,
            any: w.1.map(|id| self.action(id)).unwrap_or_default(),
            slow: w.2.map(|(_, id)| self.action(id)).unwrap_or_default(),
        }
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
        assert!(w.iter().all(|((_, _, s), a)| *s >= 502 && a.unwrap().any.rule_id == 2));
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
        let e500 = w.iter().find(|((_, _, s), _)| *s == 500).unwrap().1.unwrap();
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
        assert_eq!(w[0].0, (GLOBAL, ANY_PORT, types::trigger_kind::TRIGGER_RESET.0 as u16));
        assert_eq!(w[0].1.unwrap().any.rule_id, 1);
        let w = set.add(2, None, r("noresponse>2s port=80")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!(w[0].0, (GLOBAL, 80, types::trigger_kind::TRIGGER_NORESPONSE.0 as u16));
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
        assert_eq!(keys, [(GLOBAL, ANY_PORT, base + 13), (GLOBAL, ANY_PORT, base + 14)]);
        assert!(w.iter().all(|(_, e)| e.unwrap().any.rule_id == 1));
        let w = set.add(2, None, r("grpc-status=13 latency>1s port=50051")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!(
            (w[0].0, e.slow.rule_id, e.slow.min_latency_ns),
            ((GLOBAL, 50051, base + 13), 2, 1_000_000_000)
        );
        assert_eq!(set.kinds(), 1 << types::trigger_kind::TRIGGER_GRPC.0);
        // status= covers HTTP statuses only.
        let w = set.add(3, None, r("status=5xx")).unwrap();
        assert!(w.iter().all(|((_, _, s), _)| (500..=599).contains(s)));
        let (_, w) = set.remove(1).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|(_, e)| e.is_none()));
    }

    #[test]
    fn dns_rcodes_sit_under_their_pseudo_statuses() {
        let mut set = RuleSet::new();
        let base = types::mirror_limits::DNS_RCODE_BASE.0 as u16;
        let w = set.add(1, None, r("dns=nxdomain,servfail")).unwrap();
        let keys: Vec<_> = w.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [(GLOBAL, ANY_PORT, base + 2), (GLOBAL, ANY_PORT, base + 3)]);
        assert!(w.iter().all(|(_, e)| e.unwrap().any.rule_id == 1));
        assert_eq!(set.kinds(), 1 << types::trigger_kind::TRIGGER_DNS.0);
        // A filtered rule is listed before the unconditional one; a slow one beside it.
        let w = set.add(2, None, r("dns=3 qname=.svc.cluster.local")).unwrap();
        let e = w[0].1.unwrap();
        assert_eq!((w.len(), e.filtered[0], e.any.rule_id), (1, set.get(2).unwrap().slot as u16, 1));
        let w = set.add(3, None, r("dns=any latency>500ms port=53")).unwrap();
        assert_eq!(w.len(), 16, "every rcode at port 53");
        let e = w[0].1.unwrap();
        assert_eq!((w[0].0, e.slow.rule_id, e.slow.min_latency_ns), ((GLOBAL, 53, base), 3, 500_000_000));
        assert!(set.port_has_rules(53));
        // The gRPC codes and the statuses are other keys.
        let w = set.add(4, None, r("grpc-status=2")).unwrap();
        assert_eq!(w[0].0, (GLOBAL, ANY_PORT, types::mirror_limits::GRPC_STATUS_BASE.0 as u16 + 2));
        let (_, w) = set.remove(1).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].1.is_none(), "rcode 2 has no rule left: {w:?}");
        assert_eq!(w[1].1.unwrap().any.rule_id, 0, "rcode 3 keeps rule 2, filtered, alone");
    }

    fn any_of(w: &[KeyWrite], key: Key) -> Option<RuleId> {
        w.iter().find(|(k, _)| *k == key).map(|(_, e)| e.map_or(0, |e| e.any.rule_id))
    }

    #[test]
    fn a_scope_holds_the_rules_everywhere_and_its_selected_ones_lowest_id_first() {
        let mut set = RuleSet::new();
        set.add(1, None, r("status=404")).unwrap();
        let w = set.add_with(2, None, r("status=500"), Reach::Selected).unwrap();
        assert!(w.is_empty(), "a selected rule is in no scope yet: {w:?}");
        set.add(3, None, r("status=500")).unwrap();
        let w = set.scope_create(1, &[2].into()).unwrap();
        let keys: Vec<Key> = w.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [(1, ANY_PORT, 404), (1, ANY_PORT, 500)], "every key of the scope, any port's too");
        assert_eq!(
            (any_of(&w, (1, 0, 404)), any_of(&w, (1, 0, 500))),
            (Some(1), Some(2)),
            "rule 2 wins over 3"
        );
        assert_eq!(set.scope(1), Some(&[2].into()));
        // A rule everywhere joins scope 0 and every scope.
        let w = set.add(4, None, r("status=502")).unwrap();
        assert_eq!(w.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [(0, 0, 502), (1, 0, 502)]);
        // A rule everywhere with a lower id wins in the scope too.
        let w = set.add_with(0, None, r("status=500 packets=5"), Reach::Everywhere).unwrap();
        assert_eq!((any_of(&w, (0, 0, 500)), any_of(&w, (1, 0, 500))), (Some(0), Some(0)));
        set.remove(0).unwrap();
        // The selected rule leaving its scope hands the key to rule 3; scope 0 never had it.
        let w = set.scope_unselect(1, 2);
        assert_eq!(w.len(), 1);
        assert_eq!(any_of(&w, (1, 0, 500)), Some(3));
        assert!(set.scope_unselect(1, 2).is_empty(), "not in the scope any more");
        // Dropping the scope clears every entry it has.
        let w = set.scope_drop(1);
        assert_eq!(w.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [(1, 0, 404), (1, 0, 500), (1, 0, 502)]);
        assert!(w.iter().all(|(_, e)| e.is_none()));
        assert!(set.scope(1).is_none() && set.scope_drop(1).is_empty());
        // Hit slots are the rules' own, whatever the scopes.
        let slot2 = set.get(2).unwrap().slot;
        let w = set.scope_create(3, &[2].into()).unwrap();
        let e = w.iter().find(|(k, _)| *k == (3, 0, 500)).unwrap().1.unwrap();
        assert_eq!((e.any.rule_id, e.any.slot), (2, slot2));
    }

    #[test]
    fn removing_rules_reaches_every_scope_that_holds_them() {
        let mut set = RuleSet::new();
        set.add(1, None, r("reset")).unwrap();
        set.add_with(2, None, r("port=8080 status=503"), Reach::Selected).unwrap();
        assert!(!set.port_has_rules(8080), "a selected rule in no scope is looked up nowhere");
        set.scope_create(1, &[2].into()).unwrap();
        set.scope_create(2, &BTreeSet::new()).unwrap();
        assert!(set.port_has_rules(8080));
        let reset = types::trigger_kind::TRIGGER_RESET.0 as u16;
        let (_, w) = set.remove(1).unwrap();
        assert_eq!(
            w.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [(0, 0, reset), (1, 0, reset), (2, 0, reset)]
        );
        assert!(w.iter().all(|(_, e)| e.is_none()));
        let (_, w) = set.remove(2).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].0 == (1, 8080, 503) && w[0].1.is_none(), "{w:?}");
        assert!(!set.port_has_rules(8080));
        assert_eq!(set.scope(1), Some(&BTreeSet::new()));
    }

    #[test]
    fn a_scope_whose_keys_would_list_too_many_filtered_rules_is_not_made() {
        let mut set = RuleSet::new();
        for id in 1..=FILTERED_MAX as u32 {
            set.add(id, None, r("status=500 path=/a")).unwrap();
        }
        set.add_with(100, None, r("status=500 path=/b"), Reach::Selected).unwrap();
        let e = set.scope_create(1, &[100].into());
        assert!(matches!(e, Err(AddError::FilteredPerKey { port: ANY_PORT, status: 500 })), "{e:?}");
        assert!(set.scope(1).is_none());
        // Within bounds elsewhere, and scope 0 never listed it.
        set.add_with(101, None, r("status=501 path=/b"), Reach::Selected).unwrap();
        assert_eq!(set.scope_create(1, &[101].into()).unwrap().len(), 2);
        // A rule everywhere that would overflow a key of a scope is refused too.
        set.remove(1).unwrap();
        set.scope_drop(1);
        let w = set.scope_create(1, &[100].into()).unwrap();
        assert_eq!(w.len(), 1);
        let e = set.add(200, None, r("status=500 path=/c"));
        assert!(matches!(e, Err(AddError::FilteredPerKey { port: ANY_PORT, status: 500 })), "{e:?}");
    }
}
