//! Rules as the agent takes them, from the configuration, the API and mirrorctl alike: the
//! syntax of [`mirror_bpf::Rule`], durations within bounds, and a set that fits the
//! classifier's rule maps.

use std::collections::HashMap;
use std::time::Duration;

use mirror_bpf::{Rule, RuleError};

use crate::capacity::RuleCapacity;

/// The longest mirror time per flow (`duration=`); `0` is no time limit.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The highest time a rule waits for (`latency>`, `noresponse>`).
pub const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// Parses a rule and holds it to the agent's bounds; errors point at the token.
pub fn parse(text: &str) -> Result<Rule, RuleError> {
    let rule: Rule = text.parse()?;
    if rule.limits.duration > MAX_DURATION {
        return Err(token_error(
            text,
            "duration=",
            "longer than 24h, the longest mirror time per flow (duration=0: until the packet or byte limit)",
        ));
    }
    if rule.threshold().is_some_and(|l| l > MAX_LATENCY) {
        let token =
            if rule.kind() == mirror_bpf::TriggerKind::NoResponse { "noresponse>" } else { "latency>" };
        return Err(token_error(text, token, "longer than 1h, the highest time a rule may wait for"));
    }
    Ok(rule)
}

/// An error at the last token starting with `prefix` (the one that counted).
fn token_error(text: &str, prefix: &str, reason: &str) -> RuleError {
    let (offset, token) = text
        .split_whitespace()
        .map(|t| (t.as_ptr() as usize - text.as_ptr() as usize, t))
        .rfind(|(_, t)| t.starts_with(prefix))
        .unwrap_or((0, text.trim()));
    RuleError { token: token.to_string(), offset, reason: reason.to_string() }
}

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
    fn durations_are_bounded() {
        assert_eq!(parse("status=500 duration=24h").unwrap().limits.duration, MAX_DURATION);
        assert_eq!(parse("status=500 duration=0").unwrap().limits.duration, Duration::ZERO);
        assert_eq!(parse("latency>1h").unwrap().threshold(), Some(MAX_LATENCY));
        let e = parse("status=500 duration=99999999999999h").unwrap_err();
        assert_eq!((e.token.as_str(), e.offset), ("duration=99999999999999h", 11), "{e}");
        assert!(e.reason.contains("longer than 24h"), "{e}");
        let e = parse("status=500 duration=90000s").unwrap_err();
        assert_eq!(e.token, "duration=90000s", "{e}");
        let e = parse("latency>2h status=5xx").unwrap_err();
        assert_eq!((e.token.as_str(), e.offset), ("latency>2h", 0), "{e}");
        assert!(e.reason.contains("longer than 1h"), "{e}");
        let e = parse("grpc-status=internal latency>2h").unwrap_err();
        assert_eq!((e.token.as_str(), e.offset), ("latency>2h", 21), "{e}");
        // The syntax is mirror_bpf's.
        assert!(parse("status=999").unwrap_err().reason.contains("outside"));
        assert!(parse("grpc-status=64").unwrap_err().reason.contains("outside 0-63"));
    }

    #[test]
    fn rule_maps_capacity() {
        let cap = RuleCapacity { rules: 3, port_keys: 150 };
        let r = |t: &str| parse(t).unwrap();
        let ok = [r("status=5xx"), r("port=80 status=5xx"), r("port=80 status=500-549")];
        assert_eq!(check_fits(&ok, cap), Ok(()));
        // Pairs are counted once however many rules cover them.
        let full = [r("port=80 status=5xx"), r("port=81 status=500-549"), r("port=80 status=500")];
        assert_eq!(check_fits(&full, cap), Ok(()));
        let over = [r("port=80 status=5xx"), r("port=81 status=500-550")];
        assert_eq!(check_fits(&over, cap), Err(Overflow::PortKeys { count: 151, max: 150 }));
        // A gRPC rule takes one pair per code, beside the statuses.
        let grpc = [r("port=80 status=5xx"), r("port=80 grpc-status=0,13,internal")];
        assert_eq!(check_fits(&grpc, RuleCapacity { rules: 3, port_keys: 102 }), Ok(()));
        let cap = RuleCapacity { rules: 3, port_keys: 101 };
        assert_eq!(check_fits(&grpc, cap), Err(Overflow::PortKeys { count: 102, max: 101 }));
        let cap = RuleCapacity { rules: 3, port_keys: 150 };
        let many = [r("status=500"), r("status=501"), r("status=502"), r("status=503")];
        assert_eq!(check_fits(&many, cap), Err(Overflow::Rules { count: 4, max: 3 }));
    }
}
