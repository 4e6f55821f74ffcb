//! Rules as the agent takes them, from the configuration and the API alike: a set that fits
//! the classifier's rule maps.

use std::collections::HashMap;

use mirror_bpf::Rule;

use crate::capacity::RuleCapacity;

/// Why a set of rules does not fit the classifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Overflow {
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

/// Checks that `rules` fit the classifier's rule maps at once.
pub fn check_fits<'a>(rules: impl IntoIterator<Item = &'a Rule>, cap: RuleCapacity) -> Result<(), Overflow> {
    let mut count = 0;
    // Statuses (0..640) covered per scoped port, one bit each.
    let mut ports: HashMap<u16, [u64; 10]> = HashMap::new();
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
        return Err(Overflow::Rules { count, max: cap.rules });
    }
    let keys: usize = ports.values().flatten().map(|w| w.count_ones() as usize).sum();
    if keys > cap.port_keys {
        return Err(Overflow::PortKeys { count: keys, max: cap.port_keys });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_maps_capacity() {
        let cap = RuleCapacity { rules: 3, port_keys: 150 };
        let r = |t: &str| t.parse::<Rule>().unwrap();
        let ok = [r("status=5xx"), r("port=80 status=5xx"), r("port=80 status=500-549")];
        assert_eq!(check_fits(&ok, cap), Ok(()));
        // Pairs are counted once however many rules cover them.
        let full = [r("port=80 status=5xx"), r("port=81 status=500-549"), r("port=80 status=500")];
        assert_eq!(check_fits(&full, cap), Ok(()));
        let over = [r("port=80 status=5xx"), r("port=81 status=500-550")];
        assert_eq!(check_fits(&over, cap), Err(Overflow::PortKeys { count: 151, max: 150 }));
        let many = [r("status=500"), r("status=501"), r("status=502"), r("status=503")];
        assert_eq!(check_fits(&many, cap), Err(Overflow::Rules { count: 4, max: 3 }));
    }
}
