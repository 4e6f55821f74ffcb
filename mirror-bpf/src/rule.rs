//! Trigger rules: `status=500`, `status=5xx`, `status=500-504`, a slowness condition
//! `latency>200ms` (request to status line), optionally `port=8080`, with per-flow mirror
//! limits `packets=N`, `bytes=N`, `duration=30s`.
//!
//! A rule compiles to one map entry per (port, status) it covers, so the classifier's cost does
//! not depend on how many rules exist.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A rule's user-visible id.
pub type RuleId = u32;

/// Which statuses a rule matches: an inclusive range (`500` is `500..=500`, `5xx` is `500..=599`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusMatch {
    /// Lowest status matched.
    pub lo: u16,
    /// Highest status matched.
    pub hi: u16,
}

/// How much of a triggered flow is mirrored; 0 means no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Packets mirrored per flow.
    pub packets: u64,
    /// Bytes mirrored per flow.
    pub bytes: u64,
    /// Time from the trigger after which mirroring stops.
    pub duration: Duration,
}

impl Default for Limits {
    /// 10,000 packets or 60 s per flow, whichever comes first.
    fn default() -> Self {
        Self { packets: 10_000, bytes: 0, duration: Duration::from_secs(60) }
    }
}

/// A trigger rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Statuses that trigger.
    pub status: StatusMatch,
    /// Only responses sent from this server port, when set.
    pub port: Option<u16>,
    /// Only responses that came at least this long after their request, when set.
    pub latency: Option<Duration>,
    /// Mirror budget of each flow it marks.
    pub limits: Limits,
}

/// A rule that could not be parsed, with the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad rule at '{token}' (byte {offset}): {reason}")]
pub struct RuleError {
    /// The token that is wrong (the whole rule when a token is missing).
    pub token: String,
    /// Byte offset of the token in the rule text.
    pub offset: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// Lowest and highest status a rule may name.
const STATUS_MIN: u16 = 100;
const STATUS_MAX: u16 = 599;

impl Rule {
    /// Every status this rule covers.
    pub fn statuses(&self) -> impl Iterator<Item = u16> {
        self.status.lo..=self.status.hi
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let mut status = None;
        let mut port = None;
        let mut latency = None;
        let mut limits = Limits::default();

        for (offset, token) in tokens(text) {
            let err = |reason: String| RuleError { token: token.to_string(), offset, reason };
            if let Some(v) = token.strip_prefix("latency>") {
                let d = parse_duration(v).map_err(err)?;
                if d.is_zero() {
                    return Err(err("latency>0 matches everything: leave it out".into()));
                }
                if latency.replace(d).is_some() {
                    return Err(err("latency given twice".into()));
                }
                continue;
            }
            let (key, value) = token.split_once('=').ok_or_else(|| {
                err("expected key=value (status, port, packets, bytes, duration) or latency>DURATION".into())
            })?;
            if value.is_empty() {
                return Err(err(format!("{key} needs a value")));
            }
            let dup = || err(format!("{key} given twice"));
            match key {
                "status" => {
                    if status.replace(parse_status(value).map_err(err)?).is_some() {
                        return Err(dup());
                    }
                }
                "port" => {
                    let p: u16 = value
                        .parse()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| err("port must be 1-65535".into()))?;
                    if port.replace(p).is_some() {
                        return Err(dup());
                    }
                }
                "packets" => limits.packets = parse_count(value).map_err(err)?,
                "bytes" => limits.bytes = parse_count(value).map_err(err)?,
                "duration" => limits.duration = parse_duration(value).map_err(err)?,
                _ => {
                    return Err(err(format!("unknown key '{key}' (status, port, packets, bytes, duration)")))
                }
            }
        }
        let status = match (status, latency) {
            (Some(s), _) => s,
            // A slowness rule alone covers every status.
            (None, Some(_)) => StatusMatch { lo: STATUS_MIN, hi: STATUS_MAX },
            (None, None) => {
                return Err(RuleError {
                    token: text.trim().to_string(),
                    // Where the rule's text starts, after leading blanks.
                    offset: text.len() - text.trim_start().len(),
                    reason: "a rule needs status=N, status=Nxx, status=A-B or latency>DURATION".into(),
                });
            }
        };
        Ok(Rule { status, port, latency, limits })
    }
}

/// Whitespace-separated tokens with their byte offsets.
fn tokens(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split_whitespace().map(move |t| (t.as_ptr() as usize - text.as_ptr() as usize, t))
}

fn parse_status(v: &str) -> Result<StatusMatch, String> {
    let code = |s: &str| -> Result<u16, String> {
        let n: u16 = s.parse().map_err(|_| format!("'{s}' is not a status code"))?;
        if (STATUS_MIN..=STATUS_MAX).contains(&n) {
            Ok(n)
        } else {
            Err(format!("status {n} is outside {STATUS_MIN}-{STATUS_MAX}"))
        }
    };
    if let Some(class) = v.strip_suffix("xx").or_else(|| v.strip_suffix("XX")) {
        let d: u16 = match class.parse() {
            Ok(d) if (1..=5).contains(&d) && class.len() == 1 => d,
            _ => return Err(format!("status class '{v}' must be 1xx to 5xx")),
        };
        return Ok(StatusMatch { lo: d * 100, hi: d * 100 + 99 });
    }
    if let Some((a, b)) = v.split_once('-') {
        let (lo, hi) = (code(a)?, code(b)?);
        if lo > hi {
            return Err(format!("status range {lo}-{hi} is empty"));
        }
        return Ok(StatusMatch { lo, hi });
    }
    let n = code(v)?;
    Ok(StatusMatch { lo: n, hi: n })
}

/// A count with an optional k/m/g (powers of 1000) suffix; 0 means unlimited.
fn parse_count(v: &str) -> Result<u64, String> {
    let (digits, mult) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1_000),
        Some((i, 'm' | 'M')) => (&v[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&v[..i], 1_000_000_000),
        _ => (v, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{v}' is not a count (e.g. 1000, 10k, 0 for unlimited)"))
}

/// A duration such as `500ms`, `30s`, `5m`, `1h`; `0` means unlimited.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let bad = || format!("'{v}' is not a duration (e.g. 500ms, 30s, 5m, 0 for unlimited)");
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let n: u64 = v[..split].parse().map_err(|_| bad())?;
    let d = match &v[split..] {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok(d)
}

fn format_duration(d: Duration) -> String {
    match d.as_millis() {
        0 => "0".into(),
        ms if ms % 1000 != 0 => format!("{ms}ms"),
        ms => format!("{}s", ms / 1000),
    }
}

impl fmt::Display for StatusMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else if self.lo % 100 == 0 && self.hi == self.lo + 99 {
            write!(f, "{}xx", self.lo / 100)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// The canonical text of a rule; parsing it gives the same rule back.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.port {
            write!(f, "port={p} ")?;
        }
        let every_status = self.status == StatusMatch { lo: STATUS_MIN, hi: STATUS_MAX };
        match self.latency {
            Some(d) if every_status => write!(f, "latency>{}", format_duration(d))?,
            Some(d) => write!(f, "status={} latency>{}", self.status, format_duration(d))?,
            None => write!(f, "status={}", self.status)?,
        }
        let l = &self.limits;
        write!(f, " packets={} bytes={} duration={}", l.packets, l.bytes, format_duration(l.duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn status_forms() {
        assert_eq!(rule("status=500").status, StatusMatch { lo: 500, hi: 500 });
        assert_eq!(rule("status=5xx").status, StatusMatch { lo: 500, hi: 599 });
        assert_eq!(rule("status=500-504").status, StatusMatch { lo: 500, hi: 504 });
        assert_eq!(rule("status=404 port=8080").port, Some(8080));
    }

    #[test]
    fn latency_rules() {
        let r = rule("latency>200ms");
        assert_eq!(
            (r.status, r.latency),
            (StatusMatch { lo: 100, hi: 599 }, Some(Duration::from_millis(200)))
        );
        let r = rule("status=5xx latency>2s");
        assert_eq!((r.status.lo, r.latency), (500, Some(Duration::from_secs(2))));
    }

    #[test]
    fn limits_and_defaults() {
        assert_eq!(rule("status=500").limits, Limits::default());
        let r = rule("status=500 packets=1k bytes=2M duration=500ms");
        assert_eq!(
            r.limits,
            Limits { packets: 1000, bytes: 2_000_000, duration: Duration::from_millis(500) }
        );
        assert_eq!(rule("status=500 duration=2m").limits.duration, Duration::from_secs(120));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "status=500",
            "port=8080 status=5xx packets=0",
            "status=500-504 duration=250ms bytes=10k",
            "latency>200ms",
            "status=500 latency>1s port=80",
        ] {
            let r = rule(s);
            assert_eq!(rule(&r.to_string()), r, "{s} -> {r}");
        }
    }

    #[test]
    fn errors_name_the_bad_token() {
        let cases = [
            ("status=600", "status=600", "outside"),
            ("status=6xx", "status=6xx", "1xx to 5xx"),
            ("status=504-500", "status=504-500", "empty"),
            ("status=abc", "status=abc", "not a status"),
            ("status=500 port=0", "port=0", "1-65535"),
            ("status=500 port=70000", "port=70000", "1-65535"),
            ("status=500 colour=red", "colour=red", "unknown key"),
            ("status=500 packets", "packets", "key=value"),
            ("status=500 duration=5y", "duration=5y", "not a duration"),
            ("status=500 status=501", "status=501", "twice"),
            ("port=80", "port=80", "needs status"),
            ("", "", "needs status"),
            ("latency>fast", "latency>fast", "not a duration"),
            ("latency>0", "latency>0", "matches everything"),
        ];
        for (text, token, reason) in cases {
            let e = text.parse::<Rule>().expect_err(text);
            assert_eq!(e.token, token, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
        let e = "status=500 port=x".parse::<Rule>().unwrap_err();
        assert_eq!(e.offset, 11);
    }
}
