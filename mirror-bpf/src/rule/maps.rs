//! The rules installed in the classifier: the rule set, the rule maps it is written to, the
//! scopes interfaces select (`iface_scopes`), and the per-CPU hit counters.

use std::collections::BTreeSet;

use libbpf_rs::{MapCore, MapFlags, MapMut};

use super::capacity::RULES_MAX;
use super::scopes::{Reach, ScopeId, Scopes, Shrink, GLOBAL};
use super::set::{AddError, KeyWrite, RuleSet, ANY_PORT, FILTERED_MAX, FILTERS_MAX};
use super::syntax::{Rule, RuleId, TriggerKind};
use crate::error::{Context, Error, Result};
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

/// The rule set and the interfaces' scopes, kept in step with the classifier's rule maps and
/// `iface_scopes`.
#[derive(Debug)]
pub(crate) struct InstalledRules {
    set: RuleSet,
    scopes: Scopes,
}

impl InstalledRules {
    /// No rules (the maps start empty, or keep adopted entries until rules are restored).
    pub(crate) fn new() -> Self {
        Self { set: RuleSet::new(), scopes: Scopes::default() }
    }

    /// The next free id.
    pub(crate) fn next_id(&self) -> RuleId {
        self.set.next_id()
    }

    /// Adds (or replaces) rule `id`, reaching `reach`, in hit-counter `slot` if given;
    /// `reset_hits` zeroes its counter first. A replaced rule leaves the scopes that selected
    /// it, as a removed one does.
    pub(crate) fn add(
        &mut self,
        maps: &ClassifierMaps<'_>,
        id: RuleId,
        slot: Option<u32>,
        rule: Rule,
        reach: Reach,
        reset_hits: bool,
    ) -> Result<()> {
        if self.set.get(id).is_some() {
            self.remove(maps, id)?;
        }
        let writes = self.set.add_with(id, slot, rule, reach).map_err(fit_error)?;
        // Not installed in full: the rule is taken out again, so that the set says what the
        // maps hold.
        let installed = self.install(maps, id, &writes, reset_hits);
        if installed.is_err() {
            if let Some((_, undo)) = self.set.remove(id) {
                self.undo(maps, &undo);
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

    /// Removes rule `id`; a selected rule first leaves every scope that holds it (see
    /// [`Shrink`]: each scope's interfaces are moved before its entries go).
    pub(crate) fn remove(&mut self, maps: &ClassifierMaps<'_>, id: RuleId) -> Result<Rule> {
        if self.set.get(id).is_none() {
            return Err(Error::NoSuchRule(id));
        }
        for shrink in self.scopes.without(id) {
            match shrink {
                Shrink::Rekey(s) => {
                    let writes = self.set.scope_unselect(s, id);
                    self.apply(maps, &writes)?;
                }
                Shrink::Merge { scope, into, ifaces } => {
                    for i in ifaces {
                        write_iface(maps, i, into)?;
                    }
                    self.drop_scope(maps, scope)?;
                }
                Shrink::Empty { scope, ifaces } => {
                    for i in ifaces {
                        write_iface(maps, i, GLOBAL)?;
                    }
                    self.drop_scope(maps, scope)?;
                }
            }
        }
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

    /// Makes `rules` (selected rules, by id) the rules selected on `ifindex`: the interface
    /// takes the scope of exactly that set, created when no interface has it yet (its entries
    /// written before the interface points to it); the scope it leaves is removed when no
    /// other interface uses it. The same set again writes nothing. On a failure the maps say
    /// what they said before. Returns whether anything changed.
    pub(crate) fn select(
        &mut self,
        maps: &ClassifierMaps<'_>,
        ifindex: u32,
        rules: &BTreeSet<RuleId>,
    ) -> Result<bool> {
        for id in rules {
            match self.set.get(*id) {
                None => return Err(Error::NoSuchRule(*id)),
                Some(e) if e.reach != Reach::Selected => return Err(Error::NotSelected(*id)),
                Some(_) => {}
            }
        }
        let mv = self.scopes.plan(ifindex, rules);
        if mv.stays() {
            return Ok(false);
        }
        if mv.create {
            let writes = self.set.scope_create(mv.to, rules).map_err(fit_error)?;
            if let Err(e) = self.apply(maps, &writes) {
                let undo = self.set.scope_drop(mv.to);
                self.undo(maps, &undo);
                return Err(e);
            }
        }
        if let Err(e) = write_iface(maps, ifindex, mv.to) {
            if mv.create {
                let undo = self.set.scope_drop(mv.to);
                self.undo(maps, &undo);
            }
            return Err(e);
        }
        self.scopes.commit(&mv, rules);
        if mv.drop {
            // The interface has moved: a failure here leaves entries no interface looks up.
            if let Err(e) = self.drop_scope(maps, mv.from) {
                tracing::warn!(scope = mv.from, error = %e, "removing the entries of an unused scope");
            }
        }
        Ok(true)
    }

    /// Clears the entries of scope `s`, which no interface points to any more. An id whose
    /// entries could not all be cleared is never handed out again.
    fn drop_scope(&mut self, maps: &ClassifierMaps<'_>, s: ScopeId) -> Result<()> {
        let writes = self.set.scope_drop(s);
        let done = self.apply(maps, &writes);
        if done.is_err() {
            self.scopes.retire(s);
        }
        done
    }

    /// Scopes other than 0 in use.
    pub(crate) fn scopes(&self) -> usize {
        self.scopes.len()
    }

    /// The selected rules of the scope of `ifindex` (empty: scope 0).
    pub(crate) fn selected(&self, ifindex: u32) -> BTreeSet<RuleId> {
        self.scopes.rules_of(self.scopes.scope_of(ifindex))
    }

    /// The bits (`1 << enum trigger_kind`) of the kinds the rules have.
    pub(crate) fn kinds(&self) -> u32 {
        self.set.kinds()
    }

    /// The hit-counter slot of a rule.
    pub(crate) fn slot(&self, id: RuleId) -> Option<u32> {
        self.set.get(id).map(|e| e.slot)
    }

    /// Where a rule reaches.
    pub(crate) fn reach(&self, id: RuleId) -> Option<Reach> {
        self.set.get(id).map(|e| e.reach)
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

    /// Writes `writes` in order, stopping at the first failure, then the port bitmap.
    fn apply(&self, maps: &ClassifierMaps<'_>, writes: &[KeyWrite]) -> Result<()> {
        let done = writes.iter().try_for_each(|w| write_key(maps, w));
        let bits = self.write_port_bits(maps, writes);
        done.and(bits)
    }

    /// Writes `writes` back after a failure: every one is tried (an entry the failed writes
    /// never made is absent already), so that the maps say what the set says.
    fn undo(&self, maps: &ClassifierMaps<'_>, writes: &[KeyWrite]) {
        for w in writes {
            if let Err(e) = write_key(maps, w) {
                tracing::debug!(error = %e, "undoing a rule entry");
            }
        }
        let _ = self.write_port_bits(maps, writes);
    }

    /// The bitmap word of every port `writes` touch, recomputed from the rule set: whether a
    /// port's keys are worth a lookup.
    fn write_port_bits(&self, maps: &ClassifierMaps<'_>, writes: &[KeyWrite]) -> Result<()> {
        let mut words: Vec<u16> = writes.iter().map(|((_, p, _), _)| *p / 64).collect();
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

/// Writes one rule-map entry: scope 0's any-port keys in the status_rules array (`None`: a
/// zeroed entry), every other key in port_rules (`None`: deleted).
fn write_key(maps: &ClassifierMaps<'_>, ((scope, port, status), action): &KeyWrite) -> Result<()> {
    if *scope == GLOBAL && *port == ANY_PORT {
        let key = u32::from(*status).to_ne_bytes();
        maps.status_rules.update(&key, bytes_of(&action.unwrap_or_default()), MapFlags::ANY)
    } else {
        let key = types::port_status_key { port: *port, status: *status, scope: *scope };
        match action {
            None => maps.port_rules.delete(bytes_of(&key)),
            Some(a) => maps.port_rules.update(bytes_of(&key), bytes_of(a), MapFlags::ANY),
        }
    }
    .context(|| format!("writing the rule entry for port {port} status {status} in scope {scope}"))
}

/// Points `ifindex` to scope `s` in iface_scopes (0: its entry deleted, absent already is fine).
fn write_iface(maps: &ClassifierMaps<'_>, ifindex: u32, s: ScopeId) -> Result<()> {
    let key = ifindex.to_ne_bytes();
    if s == GLOBAL {
        match maps.iface_scopes.delete(&key) {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    } else {
        maps.iface_scopes.update(&key, &s.to_ne_bytes(), MapFlags::ANY)
    }
    .context(|| format!("pointing interface {ifindex} to rule scope {s}"))
}

/// Clears what an earlier instance left of its scopes (adopted maps): every interface's entry
/// and every entry of a scope other than 0. Scope ids are this instance's own: they start
/// afresh, and the interfaces select their rules again.
pub(crate) fn clear_scopes(maps: &ClassifierMaps<'_>) -> Result<()> {
    let ifaces: Vec<Vec<u8>> = maps.iface_scopes.keys().collect();
    for k in ifaces {
        let _ = maps.iface_scopes.delete(&k);
    }
    let size = std::mem::size_of::<types::port_status_key>();
    let keys: Vec<Vec<u8>> = maps.port_rules.keys().filter(|k| k.len() == size).collect();
    for k in keys {
        let key: types::port_status_key = read_plain(&k);
        if key.scope != GLOBAL {
            maps.port_rules.delete(&k).context(|| "clearing an earlier instance's rule scopes".into())?;
        }
    }
    Ok(())
}

/// The error of a rule (or a scope) that does not fit the rule maps.
fn fit_error(e: AddError) -> Error {
    match e {
        AddError::NoSlot => Error::TooManyRules(RULES_MAX),
        AddError::FilteredPerKey { port, status } => Error::RuleDoesNotFit(format!(
            "at most {FILTERED_MAX} rules with filters (method=, path=, host=, qname=, qtype=) may cover one {} and {}",
            key_name(status),
            if port == ANY_PORT { "any port".to_string() } else { format!("port {port}") }
        )),
        AddError::Filters => {
            Error::RuleDoesNotFit(format!(
                "at most {FILTERS_MAX} rules may have filters (method=, path=, host=, qname=, qtype=)"
            ))
        }
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
    if let Some(q) = &rule.filter.qname {
        f.qname_len = q.len() as u8;
        f.qname[..q.len()].copy_from_slice(q.as_bytes());
        f.qname_not = u8::from(rule.filter.qname_not);
    }
    f.qtype = rule.filter.qtype;
    f
}

/// "status 500", or the name of another kind's pseudo-status.
fn key_name(status: u16) -> String {
    use super::dns::{rcode_name, DNS_RCODES, DNS_RCODE_BASE};
    use super::grpc::{grpc_status_name, GRPC_STATUS_BASE};
    let named = |what: &str, code: u16, name: Option<&str>| {
        format!("{what} {code}{}", name.map(|n| format!(" ({n})")).unwrap_or_default())
    };
    if (GRPC_STATUS_BASE..100).contains(&status) {
        let code = status - GRPC_STATUS_BASE;
        return named("grpc-status", code, grpc_status_name(code));
    }
    if (DNS_RCODE_BASE..DNS_RCODE_BASE + u16::from(DNS_RCODES)).contains(&status) {
        let rcode = status - DNS_RCODE_BASE;
        return named("dns rcode", rcode, rcode_name(rcode));
    }
    match TriggerKind::from_raw(u32::from(status)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap()
    }

    #[test]
    fn filters_are_written_as_the_classifier_reads_them() {
        let action = types::rule_action { rule_id: 4, slot: 9, ..Default::default() };
        let f = filter_value(action, &rule("dns=nxdomain qname=.SVC.cluster.local. qtype=aaaa"));
        assert_eq!((f.action.rule_id, f.action.slot, f.qtype, f.qname_len), (4, 9, 28, 18));
        assert_eq!(&f.qname[..18], b".svc.cluster.local");
        assert!(f.qname[18..].iter().all(|b| *b == 0));
        assert_eq!((f.methods, f.path_len, f.host_len, f.qname_not), (0, 0, 0, 0));
        let f = filter_value(action, &rule("dns=nxdomain qname=!.cluster.local"));
        assert_eq!((f.qname_not, f.qname_len, &f.qname[..14]), (1, 14, &b".cluster.local"[..]));
        let f = filter_value(action, &rule("dns=3 qtype=65535"));
        assert_eq!((f.qtype, f.qname_len), (65535, 0));
        let f = filter_value(action, &rule("status=500 method=GET host=Shop.Example"));
        assert_eq!((f.qtype, f.qname_len, f.host_len), (0, 0, 12));
        assert_eq!(&f.host[..12], b"shop.example");
    }

    #[test]
    fn keys_are_named_by_their_kind() {
        let dns = types::mirror_limits::DNS_RCODE_BASE.0 as u16;
        let grpc = types::mirror_limits::GRPC_STATUS_BASE.0 as u16;
        assert_eq!(key_name(500), "status 500");
        assert_eq!(key_name(grpc + 13), "grpc-status 13 (INTERNAL)");
        assert_eq!(key_name(dns + 3), "dns rcode 3 (NXDOMAIN)");
        assert_eq!(key_name(dns + 15), "dns rcode 15");
        assert_eq!(key_name(types::trigger_kind::TRIGGER_RESET.0 as u16), "reset rule");
    }

    #[test]
    fn a_key_with_too_many_filtered_dns_rules_says_which() {
        let e = fit_error(AddError::FilteredPerKey { port: 53, status: 8 + 3 });
        let text = e.to_string();
        assert!(text.contains("qname=") && text.contains("dns rcode 3 (NXDOMAIN) and port 53"), "{text}");
    }
}
