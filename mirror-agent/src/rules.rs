//! Rules as the agent takes them, from the configuration, the API and mirrorctl alike: the
//! syntax of [`mirror_bpf::Rule`] and durations within bounds. Whether a set fits the
//! classifier's rule maps is the data path's own check, [`mirror_bpf::rule::capacity::fits`].

use std::time::Duration;

use mirror_bpf::{Rule, RuleError};

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
}
