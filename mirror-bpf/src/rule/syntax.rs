//! Trigger rules. What marks a flow: a final response's status `status=500`, `status=5xx`,
//! `status=500-504`, with or without a slowness condition `latency>200ms` (request to status
//! line); a TCP reset of an established HTTP connection, `reset`; or a request left without the
//! start of a response for a time, `noresponse>2s`; or a gRPC call's `grpc-status` in its
//! trailers, `grpc-status=13`, `grpc-status=internal,unavailable` (with or without
//! `latency>`: request to trailers). Optionally `port=8080` (the server's), the request filters
//! `method=POST,PUT`, `path=/api/` (a prefix of the target, or of an HTTP/2 `:path`) and
//! `host=shop.example` (the Host header, or an HTTP/2 `:authority`), and the per-flow mirror
//! limits `packets=N`, `bytes=N`, `duration=30s`.
//!
//! A rule compiles to one map entry per (port, status) it covers, the other kinds under their
//! pseudo-status (a gRPC code `c` under `GRPC_STATUS_BASE + c`), so the classifier's cost does
//! not depend on how many rules exist.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::grpc::{parse_grpc_codes, GrpcCodes, GRPC_STATUS_BASE, GRPC_STATUS_CODES};
use crate::shared::types;

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

/// What marks a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A final response with one of these statuses, at least `latency` after its request when
    /// set.
    Status {
        /// Statuses that trigger.
        status: StatusMatch,
        /// Only responses that came at least this long after their request, when set.
        latency: Option<Duration>,
    },
    /// A TCP RST, from either side, of a connection that carried an HTTP request.
    Reset,
    /// A request whose response has not begun this long after it.
    NoResponse(Duration),
    /// A gRPC call whose trailers carry one of these `grpc-status` codes, at least `latency`
    /// after its request when set.
    Grpc {
        /// Codes that trigger.
        codes: GrpcCodes,
        /// Only calls whose trailers came at least this long after their request, when set.
        latency: Option<Duration>,
    },
}

/// The kinds of trigger, as events, metrics and `rules list` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TriggerKind {
    /// `status=` or `latency>`.
    Status,
    /// `reset`.
    Reset,
    /// `noresponse>`.
    NoResponse,
    /// `grpc-status=`.
    Grpc,
}

impl TriggerKind {
    /// Its name: `status`, `reset`, `noresponse`, `grpc-status`.
    pub fn name(self) -> &'static str {
        match self {
            TriggerKind::Status => "status",
            TriggerKind::Reset => "reset",
            TriggerKind::NoResponse => "noresponse",
            TriggerKind::Grpc => "grpc-status",
        }
    }

    /// From the data path's `enum trigger_kind`.
    pub fn from_raw(v: u32) -> Option<Self> {
        use types::trigger_kind as k;
        match v {
            x if x == k::TRIGGER_STATUS.0 => Some(TriggerKind::Status),
            x if x == k::TRIGGER_RESET.0 => Some(TriggerKind::Reset),
            x if x == k::TRIGGER_NORESPONSE.0 => Some(TriggerKind::NoResponse),
            x if x == k::TRIGGER_GRPC.0 => Some(TriggerKind::Grpc),
            _ => None,
        }
    }

    /// Its `enum trigger_kind` value; for `reset` and `noresponse` also their pseudo-status in
    /// the rule maps (statuses are 100-599, gRPC codes from [`GRPC_STATUS_BASE`]).
    pub fn raw(self) -> u16 {
        use types::trigger_kind as k;
        (match self {
            TriggerKind::Status => k::TRIGGER_STATUS.0,
            TriggerKind::Reset => k::TRIGGER_RESET.0,
            TriggerKind::NoResponse => k::TRIGGER_NORESPONSE.0,
            TriggerKind::Grpc => k::TRIGGER_GRPC.0,
        }) as u16
    }
}

impl fmt::Display for TriggerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Request methods a filter names, with their bit in `enum http_method`.
const METHODS: [(&str, types::http_method); 9] = [
    ("GET", types::http_method::HTTP_METHOD_GET),
    ("HEAD", types::http_method::HTTP_METHOD_HEAD),
    ("POST", types::http_method::HTTP_METHOD_POST),
    ("PUT", types::http_method::HTTP_METHOD_PUT),
    ("DELETE", types::http_method::HTTP_METHOD_DELETE),
    ("PATCH", types::http_method::HTTP_METHOD_PATCH),
    ("OPTIONS", types::http_method::HTTP_METHOD_OPTIONS),
    ("CONNECT", types::http_method::HTTP_METHOD_CONNECT),
    ("TRACE", types::http_method::HTTP_METHOD_TRACE),
];

/// The longest `path=` prefix and `host=` name.
pub const FILTER_TEXT_MAX: usize = types::mirror_limits::RULE_FILTER_TEXT.0 as usize;

/// Which requests a rule applies to; an empty part matches any request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RequestFilter {
    /// Bits of `enum http_method` (0: any method).
    pub methods: u32,
    /// A prefix of the request target, query string included.
    pub path: Option<String>,
    /// The Host header's name (without a port), lower case.
    pub host: Option<String>,
}

impl RequestFilter {
    /// Whether it filters anything.
    pub fn is_empty(&self) -> bool {
        self.methods == 0 && self.path.is_none() && self.host.is_none()
    }

    /// The method names it lets through, in a fixed order.
    pub fn method_names(&self) -> Vec<&'static str> {
        METHODS.iter().filter(|(_, bit)| self.methods & bit.0 != 0).map(|(n, _)| *n).collect()
    }
}

/// A trigger rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// What marks a flow.
    pub trigger: Trigger,
    /// Only flows whose server port is this, when set.
    pub port: Option<u16>,
    /// Only triggers whose request passes this.
    pub filter: RequestFilter,
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
const _: () = assert!(GRPC_STATUS_BASE + GRPC_STATUS_CODES as u16 <= STATUS_MIN, "below the statuses");

impl Rule {
    /// The kind of its trigger.
    pub fn kind(&self) -> TriggerKind {
        match self.trigger {
            Trigger::Status { .. } => TriggerKind::Status,
            Trigger::Reset => TriggerKind::Reset,
            Trigger::NoResponse(_) => TriggerKind::NoResponse,
            Trigger::Grpc { .. } => TriggerKind::Grpc,
        }
    }

    /// Every status this rule covers; `grpc-status=`, `GRPC_STATUS_BASE` + each code; the
    /// other kinds, their pseudo-status.
    pub fn statuses(&self) -> impl Iterator<Item = u16> {
        let (range, codes) = match self.trigger {
            Trigger::Status { status, .. } => (status.lo..=status.hi, None),
            Trigger::Grpc { codes, .. } => {
                (GRPC_STATUS_BASE..=GRPC_STATUS_BASE + u16::from(GRPC_STATUS_CODES) - 1, Some(codes))
            }
            _ => (self.kind().raw()..=self.kind().raw(), None),
        };
        range.filter(move |s| codes.is_none_or(|c| c.contains((s - GRPC_STATUS_BASE) as u8)))
    }

    /// The time a trigger must come after its request: `latency>`, `noresponse>`.
    pub fn threshold(&self) -> Option<Duration> {
        match self.trigger {
            Trigger::Status { latency, .. } | Trigger::Grpc { latency, .. } => latency,
            Trigger::Reset => None,
            Trigger::NoResponse(d) => Some(d),
        }
    }
}

/// What the tokens of a rule said, before they are checked together.
#[derive(Default)]
struct Parts {
    status: Option<(StatusMatch, usize, String)>,
    latency: Option<Duration>,
    reset: Option<(usize, String)>,
    noresponse: Option<(Duration, usize, String)>,
    grpc: Option<(GrpcCodes, usize, String)>,
    port: Option<u16>,
    filter: RequestFilter,
    limits: Limits,
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let mut p = Parts { limits: Limits::default(), ..Parts::default() };
        for (offset, token) in tokens(text) {
            let err = |reason: String| RuleError { token: token.to_string(), offset, reason };
            if token == "reset" {
                if p.reset.replace((offset, token.to_string())).is_some() {
                    return Err(err("reset given twice".into()));
                }
                continue;
            }
            if let Some(v) = token.strip_prefix("noresponse>") {
                let d = parse_wait(v).map_err(err)?;
                if d.is_zero() {
                    return Err(err("noresponse>0 would mark every request: give a time (e.g. 2s)".into()));
                }
                if p.noresponse.replace((d, offset, token.to_string())).is_some() {
                    return Err(err("noresponse given twice".into()));
                }
                continue;
            }
            if let Some(v) = token.strip_prefix("latency>") {
                let d = parse_wait(v).map_err(err)?;
                if d.is_zero() {
                    return Err(err("latency>0 matches everything: leave it out".into()));
                }
                if p.latency.replace(d).is_some() {
                    return Err(err("latency given twice".into()));
                }
                continue;
            }
            let (key, value) =
                token.split_once('=').ok_or_else(|| err(format!("expected one of: {SYNTAX}")))?;
            if value.is_empty() {
                return Err(err(format!("{key} needs a value")));
            }
            let dup = || err(format!("{key} given twice"));
            match key {
                "status" => {
                    let m = parse_status(value).map_err(err)?;
                    if p.status.replace((m, offset, token.to_string())).is_some() {
                        return Err(dup());
                    }
                }
                "grpc-status" => {
                    let codes = parse_grpc_codes(value).map_err(err)?;
                    if p.grpc.replace((codes, offset, token.to_string())).is_some() {
                        return Err(dup());
                    }
                }
                "port" => {
                    let port: u16 = value
                        .parse()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| err("port must be 1-65535".into()))?;
                    if p.port.replace(port).is_some() {
                        return Err(dup());
                    }
                }
                "method" => {
                    if p.filter.methods != 0 {
                        return Err(dup());
                    }
                    p.filter.methods = parse_methods(value).map_err(err)?;
                }
                "path" => {
                    if p.filter.path.replace(parse_path(value).map_err(err)?).is_some() {
                        return Err(dup());
                    }
                }
                "host" => {
                    if p.filter.host.replace(parse_host(value).map_err(err)?).is_some() {
                        return Err(dup());
                    }
                }
                "packets" => p.limits.packets = parse_count(value).map_err(err)?,
                "bytes" => p.limits.bytes = parse_count(value).map_err(err)?,
                "duration" => p.limits.duration = parse_duration(value).map_err(err)?,
                "latency" | "noresponse" => {
                    return Err(err(format!(
                        "{key} is written with '>': '{key}>{value}' (quote it in a shell)"
                    )))
                }
                _ => return Err(err(format!("unknown key '{key}'; the syntax: {SYNTAX}"))),
            }
        }
        let trigger = p.trigger(text)?;
        Ok(Rule { trigger, port: p.port, filter: p.filter, limits: p.limits })
    }
}

impl Parts {
    /// The one trigger the tokens give.
    fn trigger(&self, text: &str) -> Result<Trigger, RuleError> {
        // The triggers that go without status=; an error names the first of them.
        let alone: Vec<(usize, &str, &str)> = [
            self.reset.as_ref().map(|(o, t)| (*o, t.as_str(), "reset")),
            self.noresponse.as_ref().map(|(_, o, t)| (*o, t.as_str(), "noresponse>")),
            self.grpc.as_ref().map(|(_, o, t)| (*o, t.as_str(), "grpc-status=")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let Some(&(offset, token, first)) = alone.first() else {
            return self.status_trigger(text);
        };
        let status = self.status.as_ref().map(|_| "status=");
        // A gRPC call's latency> is the time to its trailers.
        let latency = self.latency.filter(|_| first != "grpc-status=").map(|_| "latency>");
        if let Some(what) = alone.get(1).map(|a| a.2).or(status).or(latency) {
            return Err(RuleError {
                token: token.to_string(),
                offset,
                reason: format!("a rule has one trigger: {what} cannot go with it"),
            });
        }
        Ok(match (&self.grpc, self.noresponse.as_ref()) {
            (Some((codes, _, _)), _) => Trigger::Grpc { codes: *codes, latency: self.latency },
            (None, Some((d, _, _))) => Trigger::NoResponse(*d),
            (None, None) => Trigger::Reset,
        })
    }

    /// The trigger of `status=` and `latency>`, alone or together.
    fn status_trigger(&self, text: &str) -> Result<Trigger, RuleError> {
        let status = match (&self.status, self.latency) {
            (Some((s, _, _)), _) => *s,
            // A slowness rule alone covers every status.
            (None, Some(_)) => StatusMatch { lo: STATUS_MIN, hi: STATUS_MAX },
            (None, None) => {
                return Err(RuleError {
                    token: text.trim().to_string(),
                    // Where the rule's text starts, after leading blanks.
                    offset: text.len() - text.trim_start().len(),
                    reason: "a rule needs status=N, status=Nxx, status=A-B, latency>DURATION, reset, \
                             noresponse>DURATION or grpc-status=CODE"
                        .into(),
                });
            }
        };
        Ok(Trigger::Status { status, latency: self.latency })
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

/// `POST`, `GET,PUT`: known methods, upper or lower case.
fn parse_methods(v: &str) -> Result<u32, String> {
    let mut bits = 0;
    for name in v.split(',') {
        let upper = name.to_ascii_uppercase();
        let bit = METHODS.iter().find(|(n, _)| *n == upper).map(|(_, b)| b.0).ok_or_else(|| {
            let known: Vec<&str> = METHODS.iter().map(|(n, _)| *n).collect();
            format!("'{name}' is not a method ({})", known.join(", "))
        })?;
        bits |= bit;
    }
    Ok(bits)
}

/// A prefix of request targets: from `/`, at most FILTER_TEXT_MAX bytes of visible ASCII.
fn parse_path(v: &str) -> Result<String, String> {
    if !v.starts_with('/') {
        return Err(format!("path '{v}' must start with /"));
    }
    if v.len() > FILTER_TEXT_MAX {
        return Err(format!("path is {} bytes, more than the {FILTER_TEXT_MAX} a filter holds", v.len()));
    }
    if let Some(c) = v.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("path has {c:?}, not a character of a request target"));
    }
    Ok(v.to_string())
}

/// A host name or address as the Host header gives it (without a port), lower case.
fn parse_host(v: &str) -> Result<String, String> {
    if v.len() > FILTER_TEXT_MAX {
        return Err(format!("host is {} bytes, more than the {FILTER_TEXT_MAX} a filter holds", v.len()));
    }
    if let Some(c) =
        v.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']')))
    {
        let hint = if c == ':' { " (give the name without its port)" } else { "" };
        return Err(format!("host has {c:?}, not a character of a host name{hint}"));
    }
    Ok(v.to_ascii_lowercase())
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

/// Every token of the rule syntax, as errors and `mirrorctl rules add --help` list them.
pub const SYNTAX: &str = "triggers: status=CODES (500, 5xx, 500-504, a list), grpc-status=CODES, reset, \
noresponse>DURATION, latency>DURATION; filters: port=P, method=M[,M], path=PREFIX, host=NAME; \
limits per flow: packets=N, bytes=N, duration=DURATION (0: unlimited)";

/// A wait of a trigger (`noresponse>`, `latency>`): a duration with its unit, never unlimited.
fn parse_wait(v: &str) -> Result<Duration, String> {
    parse_duration(v).map_err(|_| format!("'{v}' is not a duration (e.g. 500ms, 2s, 1m)"))
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
        match self.trigger {
            Trigger::Status { status, latency } => {
                let every_status = status == StatusMatch { lo: STATUS_MIN, hi: STATUS_MAX };
                match latency {
                    Some(d) if every_status => write!(f, "latency>{}", format_duration(d))?,
                    Some(d) => write!(f, "status={status} latency>{}", format_duration(d))?,
                    None => write!(f, "status={status}")?,
                }
            }
            Trigger::Reset => f.write_str("reset")?,
            Trigger::NoResponse(d) => write!(f, "noresponse>{}", format_duration(d))?,
            Trigger::Grpc { codes, latency } => {
                write!(f, "grpc-status={codes}")?;
                if let Some(d) = latency {
                    write!(f, " latency>{}", format_duration(d))?;
                }
            }
        }
        if self.filter.methods != 0 {
            write!(f, " method={}", self.filter.method_names().join(","))?;
        }
        if let Some(p) = &self.filter.path {
            write!(f, " path={p}")?;
        }
        if let Some(h) = &self.filter.host {
            write!(f, " host={h}")?;
        }
        let l = &self.limits;
        write!(f, " packets={} bytes={} duration={}", l.packets, l.bytes, format_duration(l.duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::grpc::grpc_status_name;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn status_forms() {
        let status = |s: &str| match rule(s).trigger {
            Trigger::Status { status, .. } => status,
            t => panic!("{s}: {t:?}"),
        };
        assert_eq!(status("status=500"), StatusMatch { lo: 500, hi: 500 });
        assert_eq!(status("status=5xx"), StatusMatch { lo: 500, hi: 599 });
        assert_eq!(status("status=500-504"), StatusMatch { lo: 500, hi: 504 });
        assert_eq!(rule("status=404 port=8080").port, Some(8080));
    }

    #[test]
    fn latency_rules() {
        let r = rule("latency>200ms");
        assert_eq!(
            r.trigger,
            Trigger::Status {
                status: StatusMatch { lo: 100, hi: 599 },
                latency: Some(Duration::from_millis(200))
            }
        );
        let r = rule("status=5xx latency>2s");
        assert_eq!(r.threshold(), Some(Duration::from_secs(2)));
        assert_eq!(r.statuses().next(), Some(500));
    }

    #[test]
    fn reset_and_noresponse_rules() {
        let r = rule("reset port=8080");
        assert_eq!((r.trigger, r.kind(), r.port), (Trigger::Reset, TriggerKind::Reset, Some(8080)));
        assert_eq!(r.statuses().collect::<Vec<_>>(), [TriggerKind::Reset.raw()]);
        let r = rule("noresponse>2s packets=100");
        assert_eq!(r.trigger, Trigger::NoResponse(Duration::from_secs(2)));
        assert_eq!((r.kind(), r.threshold()), (TriggerKind::NoResponse, Some(Duration::from_secs(2))));
        for k in [TriggerKind::Status, TriggerKind::Reset, TriggerKind::NoResponse, TriggerKind::Grpc] {
            assert_eq!(TriggerKind::from_raw(u32::from(k.raw())), Some(k));
        }
    }

    #[test]
    fn grpc_status_rules() {
        let codes = |s: &str| match rule(s).trigger {
            Trigger::Grpc { codes, .. } => codes.iter().collect::<Vec<_>>(),
            t => panic!("{s}: {t:?}"),
        };
        assert_eq!(codes("grpc-status=13"), [13]);
        assert_eq!(codes("grpc-status=internal,unavailable"), [13, 14]);
        assert_eq!(codes("grpc-status=INTERNAL"), [13]);
        assert_eq!(codes("grpc-status=Deadline_Exceeded,63,0"), [0, 4, 63]);
        assert_eq!(codes("grpc-status=13,13,internal"), [13], "the same code counts once");
        let r = rule(
            "grpc-status=internal port=50051 latency>1s method=POST path=/helloworld.Greeter/ host=g.example",
        );
        assert_eq!((r.kind(), r.port), (TriggerKind::Grpc, Some(50051)));
        assert_eq!(r.threshold(), Some(Duration::from_secs(1)));
        assert_eq!(r.filter.path.as_deref(), Some("/helloworld.Greeter/"));
        assert_eq!(r.statuses().collect::<Vec<_>>(), [GRPC_STATUS_BASE + 13]);
        let r = rule("grpc-status=ok,unavailable,63");
        assert_eq!(r.statuses().collect::<Vec<_>>(), [32, 46, 95]);
        assert_eq!((r.kind().name(), r.threshold()), ("grpc-status", None));
        assert_eq!(
            rule("grpc-status=14,internal,40").to_string(),
            "grpc-status=INTERNAL,UNAVAILABLE,40 packets=10000 bytes=0 duration=60s"
        );
        assert_eq!((grpc_status_name(13), grpc_status_name(16)), (Some("INTERNAL"), Some("UNAUTHENTICATED")));
        assert_eq!(grpc_status_name(17), None);
        assert_eq!([13, 14].into_iter().collect::<GrpcCodes>(), GrpcCodes(1 << 13 | 1 << 14));
    }

    #[test]
    fn request_filters() {
        let r = rule("status=5xx method=post,PUT path=/api/checkout host=Shop.Example");
        assert_eq!(r.filter.method_names(), ["POST", "PUT"]);
        assert_eq!(r.filter.path.as_deref(), Some("/api/checkout"));
        assert_eq!(r.filter.host.as_deref(), Some("shop.example"));
        assert!(rule("status=500").filter.is_empty());
        assert_eq!(rule("reset method=GET").filter.method_names(), ["GET"]);
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
            "reset",
            "port=80 noresponse>1500ms method=GET,POST path=/api/ host=shop.example",
            "status=5xx path=/web/?q=1",
            "grpc-status=13",
            "grpc-status=ok,Cancelled,63 latency>250ms port=50051 method=POST path=/pkg.Svc/ host=g.example",
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
            ("status=500 packets", "packets", "expected one of: triggers: status=CODES"),
            ("status=500 colour=red", "colour=red", "noresponse>DURATION, latency>DURATION"),
            ("status=500 colour=red", "colour=red", "reset"),
            ("latency=200ms", "latency=200ms", "'latency>200ms'"),
            ("noresponse=2s", "noresponse=2s", "'noresponse>2s'"),
            ("noresponse>1", "noresponse>1", "(e.g. 500ms, 2s, 1m)"),
            ("status=500 duration=5y", "duration=5y", "not a duration"),
            ("status=500 status=501", "status=501", "twice"),
            ("port=80", "port=80", "needs status"),
            ("", "", "needs status"),
            ("latency>fast", "latency>fast", "not a duration"),
            ("latency>0", "latency>0", "matches everything"),
            ("status=500 method=FOO", "method=FOO", "not a method"),
            ("status=500 method=GET,FOO", "method=GET,FOO", "'FOO' is not a method"),
            ("status=500 path=api", "path=api", "must start with /"),
            ("status=500 host=a:80", "host=a:80", "without its port"),
            ("noresponse>0s", "noresponse>0s", "every request"),
            ("noresponse>soon", "noresponse>soon", "not a duration"),
            ("reset status=500", "reset", "one trigger"),
            ("noresponse>1s latency>2s", "noresponse>1s", "one trigger"),
            ("reset noresponse>1s", "reset", "one trigger"),
            ("method=GET", "method=GET", "needs status"),
            ("status=500 path=/a path=/b", "path=/b", "twice"),
            ("grpc-status=", "grpc-status=", "needs a value"),
            ("grpc-status=64", "grpc-status=64", "outside 0-63"),
            ("grpc-status=99999999999", "grpc-status=99999999999", "outside 0-63"),
            ("grpc-status=bogus", "grpc-status=bogus", "'bogus' is not a gRPC status"),
            ("grpc-status=bogus", "grpc-status=bogus", "OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT"),
            ("grpc-status=-1", "grpc-status=-1", "not a gRPC status"),
            ("grpc-status=13,", "grpc-status=13,", "empty code"),
            ("grpc-status=13 status=500", "grpc-status=13", "one trigger: status="),
            ("status=500 grpc-status=13", "grpc-status=13", "one trigger: status="),
            ("reset grpc-status=13", "reset", "one trigger: grpc-status="),
            ("grpc-status=13 noresponse>1s", "noresponse>1s", "one trigger: grpc-status="),
            ("grpc-status=1 grpc-status=2", "grpc-status=2", "twice"),
            ("grpc-status=1 colour=red", "colour=red", "grpc-status"),
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
