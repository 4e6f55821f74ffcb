//! Rules selected per pod: which interfaces share which scope.
//!
//! A rule reaches every interface ([`Reach::Everywhere`]) or only those whose pod selects it
//! ([`Reach::Selected`]). A *scope* is a distinct set of selected rules that some interfaces
//! select: interfaces with the same set share one scope id, and an id no interface uses any more
//! is given back (the lowest free id is handed out first). Scope 0 is the interfaces that select
//! nothing: the rules that reach everywhere, alone.
//!
//! This module is the bookkeeping of interfaces and ids alone: it says which scope to create,
//! which interface entry to write and which scope to remove, in the order they are to be
//! written. [`super::set`] compiles each scope's rules, [`super::maps`] writes them.

use std::collections::{BTreeMap, BTreeSet};

use super::syntax::RuleId;

/// Where a rule applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Reach {
    /// On every interface, at whichever side of the flow the pod behind it stands.
    #[default]
    Everywhere,
    /// Only on the interfaces whose pod selects it ([`crate::datapath::Datapath::select`]), and there only
    /// on the flows whose server is that pod.
    Selected,
}

/// A scope id as the classifier holds it (`iface_scopes` values, `port_status_key.scope`).
pub(crate) type ScopeId = u32;

/// The scope of interfaces that select nothing: the rules that reach everywhere.
pub(crate) const GLOBAL: ScopeId = 0;

/// One scope: its selected rules and the interfaces that select exactly them.
#[derive(Debug, Clone, Default)]
struct Scope {
    rules: BTreeSet<RuleId>,
    ifaces: BTreeSet<u32>,
}

/// What selecting a set of rules for one interface changes, in the order it is to be written:
/// the entries of `to` when it is new (before the interface points to it), the interface's
/// entry, then the entries of `from` when no interface uses it any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move {
    pub ifindex: u32,
    pub from: ScopeId,
    pub to: ScopeId,
    /// `to` does not exist yet: its entries are written first.
    pub create: bool,
    /// `from` has no other interface: its entries are removed last.
    pub drop: bool,
}

impl Move {
    /// Whether the interface stays where it is (nothing to write).
    pub fn stays(&self) -> bool {
        self.from == self.to
    }
}

/// What removing a selected rule makes of one scope that held it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shrink {
    /// Its set without the rule is no other scope's: the same id, the rule's entries taken out.
    Rekey(ScopeId),
    /// Its set without the rule is the set of scope `into`: its interfaces move there, then its
    /// entries are removed.
    Merge { scope: ScopeId, into: ScopeId, ifaces: Vec<u32> },
    /// It selected that rule alone: its interfaces go back to scope 0, then its entries are
    /// removed.
    Empty { scope: ScopeId, ifaces: Vec<u32> },
}

/// The interfaces that select rules, and the scopes they share.
#[derive(Debug, Default)]
pub(crate) struct Scopes {
    of_iface: BTreeMap<u32, ScopeId>,
    scopes: BTreeMap<ScopeId, Scope>,
    by_rules: BTreeMap<BTreeSet<RuleId>, ScopeId>,
    /// Ids never handed out again: the entries of their scope could not all be removed.
    retired: BTreeSet<ScopeId>,
}

impl Scopes {
    /// The scope of `ifindex` (0 when it selects nothing).
    pub fn scope_of(&self, ifindex: u32) -> ScopeId {
        self.of_iface.get(&ifindex).copied().unwrap_or(GLOBAL)
    }

    /// The selected rules of scope `s` (empty for scope 0 and unknown ids).
    pub fn rules_of(&self, s: ScopeId) -> BTreeSet<RuleId> {
        self.scopes.get(&s).map(|sc| sc.rules.clone()).unwrap_or_default()
    }

    /// Scopes other than 0 in use.
    pub fn len(&self) -> usize {
        self.scopes.len()
    }

    /// The ids of the scopes other than 0, lowest first.
    #[cfg(test)]
    pub fn ids(&self) -> impl Iterator<Item = ScopeId> + '_ {
        self.scopes.keys().copied()
    }

    /// What selecting `rules` for `ifindex` would change (nothing is changed here: see
    /// [`Scopes::commit`]).
    pub fn plan(&self, ifindex: u32, rules: &BTreeSet<RuleId>) -> Move {
        let from = self.scope_of(ifindex);
        let (to, create) = if rules.is_empty() {
            (GLOBAL, false)
        } else if let Some(s) = self.by_rules.get(rules) {
            (*s, false)
        } else {
            (self.free_id(), true)
        };
        let drop = from != GLOBAL && from != to && self.scopes[&from].ifaces.len() == 1;
        Move { ifindex, from, to, create, drop }
    }

    /// Records `mv`, planned for `rules` by [`Scopes::plan`], once its entries are written.
    pub fn commit(&mut self, mv: &Move, rules: &BTreeSet<RuleId>) {
        if mv.stays() {
            return;
        }
        if let Some(sc) = self.scopes.get_mut(&mv.from) {
            sc.ifaces.remove(&mv.ifindex);
            if sc.ifaces.is_empty() {
                self.remove(mv.from);
            }
        }
        if mv.to == GLOBAL {
            self.of_iface.remove(&mv.ifindex);
            return;
        }
        let sc =
            self.scopes.entry(mv.to).or_insert_with(|| Scope { rules: rules.clone(), ..Default::default() });
        sc.ifaces.insert(mv.ifindex);
        self.by_rules.insert(rules.clone(), mv.to);
        self.of_iface.insert(mv.ifindex, mv.to);
    }

    /// Takes selected rule `id` out of every scope that holds it; returns what became of each,
    /// lowest id first (recorded here already: the caller writes it).
    pub fn without(&mut self, id: RuleId) -> Vec<Shrink> {
        let holding: Vec<ScopeId> =
            self.scopes.iter().filter(|(_, sc)| sc.rules.contains(&id)).map(|(s, _)| *s).collect();
        let mut out = Vec::new();
        for s in holding {
            let mut rules = self.scopes[&s].rules.clone();
            rules.remove(&id);
            // Two scopes that held the rule differ without it too: a scope found here did not
            // hold it, and none of this loop's changes touched it.
            let into = self.by_rules.get(&rules).copied();
            if rules.is_empty() || into.is_some() {
                let sc = self.remove(s);
                let ifaces: Vec<u32> = sc.ifaces.into_iter().collect();
                match into {
                    Some(into) => {
                        for i in &ifaces {
                            self.of_iface.insert(*i, into);
                        }
                        if let Some(t) = self.scopes.get_mut(&into) {
                            t.ifaces.extend(ifaces.iter().copied());
                        }
                        out.push(Shrink::Merge { scope: s, into, ifaces });
                    }
                    None => {
                        for i in &ifaces {
                            self.of_iface.remove(i);
                        }
                        out.push(Shrink::Empty { scope: s, ifaces });
                    }
                }
            } else {
                let sc = self.scopes.get_mut(&s).expect("listed above");
                self.by_rules.remove(&sc.rules);
                sc.rules = rules.clone();
                self.by_rules.insert(rules, s);
                out.push(Shrink::Rekey(s));
            }
        }
        out
    }

    /// Never hands `s` out again (the entries of the scope it was could not all be removed).
    pub fn retire(&mut self, s: ScopeId) {
        self.retired.insert(s);
    }

    fn remove(&mut self, s: ScopeId) -> Scope {
        let sc = self.scopes.remove(&s).unwrap_or_default();
        self.by_rules.remove(&sc.rules);
        sc
    }

    /// The lowest id neither in use nor retired.
    fn free_id(&self) -> ScopeId {
        (1..).find(|s| !self.scopes.contains_key(s) && !self.retired.contains(s)).expect("a free scope id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[RuleId]) -> BTreeSet<RuleId> {
        ids.iter().copied().collect()
    }

    fn select(s: &mut Scopes, ifindex: u32, ids: &[RuleId]) -> Move {
        let rules = set(ids);
        let mv = s.plan(ifindex, &rules);
        s.commit(&mv, &rules);
        mv
    }

    #[test]
    fn interfaces_with_the_same_set_share_a_scope_and_ids_are_reused() {
        let mut s = Scopes::default();
        let a = select(&mut s, 10, &[1, 2]);
        assert_eq!(a, Move { ifindex: 10, from: 0, to: 1, create: true, drop: false });
        let b = select(&mut s, 11, &[2, 1]);
        assert_eq!(b, Move { ifindex: 11, from: 0, to: 1, create: false, drop: false });
        let c = select(&mut s, 12, &[3]);
        assert_eq!((c.to, c.create), (2, true));
        assert_eq!((s.len(), s.scope_of(11), s.scope_of(99)), (2, 1, 0));
        // The same set again: nothing to write.
        assert!(s.plan(10, &set(&[1, 2])).stays());
        // 10 leaves scope 1, which 11 still uses.
        let d = select(&mut s, 10, &[]);
        assert_eq!(d, Move { ifindex: 10, from: 1, to: 0, create: false, drop: false });
        // 11 leaves it for a new set: scope 1 is removed after, and its id is free again.
        let e = select(&mut s, 11, &[1]);
        assert_eq!(e, Move { ifindex: 11, from: 1, to: 3, create: true, drop: true });
        assert_eq!(s.ids().collect::<Vec<_>>(), [2, 3]);
        let f = select(&mut s, 13, &[4]);
        assert_eq!((f.to, f.create), (1, true), "the lowest free id");
        // A retired id is skipped.
        s.retire(4);
        assert_eq!(select(&mut s, 14, &[5]).to, 5);
    }

    #[test]
    fn moving_the_only_interface_between_existing_scopes_drops_the_old_one() {
        let mut s = Scopes::default();
        select(&mut s, 1, &[7]);
        select(&mut s, 2, &[8]);
        let mv = select(&mut s, 1, &[8]);
        assert_eq!(mv, Move { ifindex: 1, from: 1, to: 2, create: false, drop: true });
        assert_eq!((s.len(), s.rules_of(2)), (1, set(&[8])));
        assert!(s.rules_of(1).is_empty());
    }

    #[test]
    fn a_removed_rule_shrinks_merges_or_empties_the_scopes_that_held_it() {
        let mut s = Scopes::default();
        select(&mut s, 1, &[1, 2]); // scope 1
        select(&mut s, 2, &[1]); // scope 2
        select(&mut s, 3, &[2]); // scope 3
        select(&mut s, 4, &[2, 3]); // scope 4
        select(&mut s, 5, &[1, 3]); // scope 5
        let got = s.without(2);
        assert_eq!(
            got,
            [
                Shrink::Merge { scope: 1, into: 2, ifaces: vec![1] },
                Shrink::Empty { scope: 3, ifaces: vec![3] },
                Shrink::Rekey(4),
            ]
        );
        assert_eq!((s.scope_of(1), s.scope_of(2), s.scope_of(3), s.scope_of(4)), (2, 2, 0, 4));
        assert_eq!(s.rules_of(4), set(&[3]));
        assert_eq!(s.ids().collect::<Vec<_>>(), [2, 4, 5]);
        // The merged scope is found by its set, the rekeyed one by its new set.
        assert_eq!(s.plan(9, &set(&[1])).to, 2);
        assert_eq!(s.plan(9, &set(&[3])).to, 4);
        assert!(s.plan(9, &set(&[2, 3])).create);
        // Interfaces that moved leave their new scope as any other.
        let mv = select(&mut s, 1, &[]);
        assert_eq!((mv.from, mv.drop), (2, false));
        let mv = select(&mut s, 2, &[]);
        assert_eq!((mv.from, mv.drop), (2, true));
        assert!(s.without(2).is_empty());
    }
}
