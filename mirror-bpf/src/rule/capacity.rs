//! What the classifier's rule maps hold, and whether a set of rules fits them at once: the one
//! check a caller makes before it writes rules, so that a map that fills halfway never leaves a
//! rule partly installed. The rule set refuses, as each rule is added, what depends on the
//! rules beside it in one key (the rules with request filters a key lists); its slots are the
//! [`Capacity::rules`] counted here.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::OpenObject;

use super::syntax::Rule;
use crate::shared::types;
use crate::skel::classifier::ClassifierSkelBuilder;

/// Rules the classifier holds at once: one hit-counter slot each, slot 0 never used.
pub(crate) const RULES_MAX: usize = types::mirror_limits::RULE_SLOTS.0 as usize - 1;

/// What the classifier's rule maps hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Rules at once: one hit-counter slot each (slot 0 is never used).
    pub rules: usize,
    /// Distinct (port, status) pairs of the port-scoped rules: entries of `port_rules`.
    pub port_keys: usize,
}

impl Capacity {
    /// The classifier's: its rule slots, and the entries its object declares for `port_rules`
    /// (read once from the embedded object, opened, not loaded: no privilege needed).
    pub fn classifier() -> Capacity {
        static PORT_KEYS: OnceLock<usize> = OnceLock::new();
        let port_keys = *PORT_KEYS.get_or_init(|| {
            let mut storage = MaybeUninit::<OpenObject>::uninit();
            let open = ClassifierSkelBuilder::default()
                .open(&mut storage)
                .expect("the classifier's embedded object opens");
            open.maps.port_rules.max_entries() as usize
        });
        Capacity { rules: RULES_MAX, port_keys }
    }
}

/// Why a set of rules does not fit the classifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    /// More rules than hit-counter slots.
    #[error("{count} rules, more than the {max} the classifier holds at once")]
    Rules {
        /// Rules in the set.
        count: usize,
        /// The most it may have.
        max: usize,
    },
    /// The port-scoped rules cover more (port, status) pairs than `port_rules` holds.
    #[error(
        "the rules scoped to a port cover {count} distinct (port, status) pairs, more than the \
         {max} entries of the classifier's port_rules map (a rule with port= takes one per status it covers)"
    )]
    PortKeys {
        /// Pairs covered.
        count: usize,
        /// Entries of the map.
        max: usize,
    },
}

/// Checks that `rules` fit the classifier's rule maps at once (`cap`: usually
/// [`Capacity::classifier`]).
pub fn fits<'a>(rules: impl IntoIterator<Item = &'a Rule>, cap: Capacity) -> Result<(), CapacityError> {
    let mut count = 0;
    // Statuses (0..RULE_STATUS_SLOTS: the drop reasons' too) covered per scoped port, one bit each.
    const WORDS: usize = (types::mirror_limits::RULE_STATUS_SLOTS.0 as usize).div_ceil(64);
    let mut ports: HashMap<u16, [u64; WORDS]> = HashMap::new();
    for rule in rules {
        count += 1;
        if let Some(port) = rule.port {
            let bits = ports.entry(port).or_default();
            for s in rule.statuses() {
                bits[usize::from(s / 64)] |= 1 << (s % 64);
            }
        }
    }
    if count > cap.rules {
        return Err(CapacityError::Rules { count, max: cap.rules });
    }
    let keys: usize = ports.values().flatten().map(|w| w.count_ones() as usize).sum();
    if keys > cap.port_keys {
        return Err(CapacityError::PortKeys { count: keys, max: cap.port_keys });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_maps_capacity() {
        let cap = Capacity { rules: 3, port_keys: 150 };
        let r = |t: &str| t.parse::<Rule>().unwrap();
        let ok = [r("status=5xx"), r("port=80 status=5xx"), r("port=80 status=500-549")];
        assert_eq!(fits(&ok, cap), Ok(()));
        // Pairs are counted once however many rules cover them.
        let full = [r("port=80 status=5xx"), r("port=81 status=500-549"), r("port=80 status=500")];
        assert_eq!(fits(&full, cap), Ok(()));
        let over = [r("port=80 status=5xx"), r("port=81 status=500-550")];
        assert_eq!(fits(&over, cap), Err(CapacityError::PortKeys { count: 151, max: 150 }));
        // A gRPC rule takes one pair per code, beside the statuses.
        let grpc = [r("port=80 status=5xx"), r("port=80 grpc-status=0,13,internal")];
        assert_eq!(fits(&grpc, Capacity { rules: 3, port_keys: 102 }), Ok(()));
        let cap = Capacity { rules: 3, port_keys: 101 };
        assert_eq!(fits(&grpc, cap), Err(CapacityError::PortKeys { count: 102, max: 101 }));
        // A DNS rule takes one pair per rcode, beside both.
        let dns = [r("port=80 grpc-status=13"), r("port=80 dns=any"), r("port=80 dns=nxdomain qtype=A")];
        assert_eq!(fits(&dns, Capacity { rules: 3, port_keys: 17 }), Ok(()));
        let cap = Capacity { rules: 3, port_keys: 16 };
        assert_eq!(fits(&dns, cap), Err(CapacityError::PortKeys { count: 17, max: 16 }));
        let cap = Capacity { rules: 3, port_keys: 150 };
        let many = [r("status=500"), r("status=501"), r("status=502"), r("status=503")];
        assert_eq!(fits(&many, cap), Err(CapacityError::Rules { count: 4, max: 3 }));
    }

    #[test]
    fn rule_capacity_comes_from_the_object() {
        let c = Capacity::classifier();
        assert_eq!(c.rules, 16_383);
        assert_eq!(c.port_keys, 65_536);
    }
}
