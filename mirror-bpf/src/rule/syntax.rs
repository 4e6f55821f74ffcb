//! Trigger rules. What marks a flow: a final response's status `status=500`, `status=5xx`,
//! `status=500-504`, with or without a slowness condition `latency>200ms` (request to status
//! line); a TCP reset of an established HTTP connection, `reset`; or a request left without the
//! start of a response for a time, `noresponse>2s`; or a gRPC call's `grpc-status` in its
//! trailers, `grpc-status=13`, `grpc-status=internal,unavailable` (with or without
//! `latency>`: request to trailers); or a DNS response's rcode, `dns=nxdomain,servfail`,
//! `dns=any` (with or without `latency>`: query to response). Optionally `port=8080` (the
//! server's), the request filters `method=POST,PUT`, `path=/api/` (a prefix of the target, or
//! of an HTTP/2 `:path`) and `host=shop.example` (the Host header, or an HTTP/2 `:authority`)
//! or, for `dns=`, the question filters `qname=example.com` (a domain suffix) and `qtype=AAAA`
//! ([`super::filter`], [`super::dns`]), and the per-flow mirror limits `packets=N`, `bytes=N`,
//! `duration=30s`.
//!
//! This module says what a rule is and writes its canonical text; [`super::parse`] reads it.
//!
//! A rule compiles to one map entry per (port, status) it covers, the other kinds under their
//! pseudo-status (a gRPC code `c` under `GRPC_STATUS_BASE + c`, a DNS rcode `r` under
//! `DNS_RCODE_BASE + r`), so the classifier's cost does not depend on how many rules exist.

use std::fmt;
use std::time::Duration;

use super::dns::{qtype_text, DnsRcodes, DNS_RCODES, DNS_RCODE_BASE};
use super::drop::{DropReasons, DROP_REASON_BASE};
use super::filter::RequestFilter;
use super::grpc::{GrpcCodes, GRPC_STATUS_BASE, GRPC_STATUS_CODES};
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
    /// A DNS response whose rcode is one of these, at least `latency` after its query when
    /// set.
    Dns {
        /// Rcodes that trigger.
        rcodes: DnsRcodes,
        /// Only responses that came at least this long after their query, when set.
        latency: Option<Duration>,
    },
    /// The kernel dropped a packet of a pod's flow for one of these reasons.
    Drop(DropReasons),
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
    /// `dns=`.
    Dns,
    /// `drop`, `drop=`.
    Drop,
}

impl TriggerKind {
    /// Its name: `status`, `reset`, `noresponse`, `grpc-status`, `dns`.
    pub fn name(self) -> &'static str {
        match self {
            TriggerKind::Status => "status",
            TriggerKind::Reset => "reset",
            TriggerKind::NoResponse => "noresponse",
            TriggerKind::Grpc => "grpc-status",
            TriggerKind::Dns => "dns",
            TriggerKind::Drop => "drop",
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
            x if x == k::TRIGGER_DNS.0 => Some(TriggerKind::Dns),
            x if x == k::TRIGGER_DROP.0 => Some(TriggerKind::Drop),
            _ => None,
        }
    }

    /// Its `enum trigger_kind` value; for `reset` and `noresponse` also their pseudo-status in
    /// the rule maps (statuses are 100-599, gRPC codes from [`GRPC_STATUS_BASE`], DNS rcodes
    /// from [`DNS_RCODE_BASE`]).
    pub fn raw(self) -> u16 {
        use types::trigger_kind as k;
        (match self {
            TriggerKind::Status => k::TRIGGER_STATUS.0,
            TriggerKind::Reset => k::TRIGGER_RESET.0,
            TriggerKind::NoResponse => k::TRIGGER_NORESPONSE.0,
            TriggerKind::Grpc => k::TRIGGER_GRPC.0,
            TriggerKind::Dns => k::TRIGGER_DNS.0,
            TriggerKind::Drop => k::TRIGGER_DROP.0,
        }) as u16
    }
}

impl fmt::Display for TriggerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
pub(crate) const STATUS_MIN: u16 = 100;
pub(crate) const STATUS_MAX: u16 = 599;
const _: () = assert!(GRPC_STATUS_BASE + GRPC_STATUS_CODES as u16 <= STATUS_MIN, "below the statuses");

impl Rule {
    /// The kind of its trigger.
    pub fn kind(&self) -> TriggerKind {
        match self.trigger {
            Trigger::Status { .. } => TriggerKind::Status,
            Trigger::Reset => TriggerKind::Reset,
            Trigger::NoResponse(_) => TriggerKind::NoResponse,
            Trigger::Grpc { .. } => TriggerKind::Grpc,
            Trigger::Dns { .. } => TriggerKind::Dns,
            Trigger::Drop(_) => TriggerKind::Drop,
        }
    }

    /// Every status this rule covers; `grpc-status=`, `GRPC_STATUS_BASE` + each code;
    /// `dns=`, `DNS_RCODE_BASE` + each rcode; `drop`, `DROP_REASON_BASE` + each reason; the
    /// other kinds, their pseudo-status.
    pub fn statuses(&self) -> Box<dyn Iterator<Item = u16>> {
        if let Trigger::Drop(reasons) = self.trigger {
            return Box::new(reasons.iter().map(|r| DROP_REASON_BASE + r));
        }
        // The range of pseudo-statuses, and the codes of it covered (from its start).
        let (range, codes): (_, Option<u64>) = match self.trigger {
            Trigger::Status { status, .. } => (status.lo..=status.hi, None),
            Trigger::Grpc { codes, .. } => {
                (GRPC_STATUS_BASE..=GRPC_STATUS_BASE + u16::from(GRPC_STATUS_CODES) - 1, Some(codes.0))
            }
            Trigger::Dns { rcodes, .. } => {
                (DNS_RCODE_BASE..=DNS_RCODE_BASE + u16::from(DNS_RCODES) - 1, Some(rcodes.0.into()))
            }
            _ => (self.kind().raw()..=self.kind().raw(), None),
        };
        let base = *range.start();
        Box::new(range.filter(move |s| codes.is_none_or(|c| c & 1 << (s - base) != 0)))
    }

    /// The time a trigger must come after its request: `latency>`, `noresponse>`.
    pub fn threshold(&self) -> Option<Duration> {
        match self.trigger {
            Trigger::Status { latency, .. }
            | Trigger::Grpc { latency, .. }
            | Trigger::Dns { latency, .. } => latency,
            Trigger::Reset | Trigger::Drop(_) => None,
            Trigger::NoResponse(d) => Some(d),
        }
    }
}

/// Every token of the rule syntax, as errors and `mirrorctl rules add --help` list them.
pub const SYNTAX: &str = "triggers: status=CODES (500, 5xx, 500-504, a list), grpc-status=CODES, \
dns=RCODES (nxdomain, servfail, 0-15, a list, any), reset, noresponse>DURATION, latency>DURATION, \
drop or drop=REASONS (the kernel's: netfilter_drop, no_socket, a list); \
filters: port=P, method=M[,M], path=PREFIX, host=NAME; for dns= and noresponse>: qname=[!]SUFFIX, \
qtype=TYPE; limits per flow: packets=N, bytes=N, duration=DURATION (0: unlimited)";

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
        } else if self.lo.is_multiple_of(100) && self.hi == self.lo + 99 {
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
            Trigger::Drop(reasons) => write!(f, "{reasons}")?,
            Trigger::Dns { rcodes, latency } => {
                write!(f, "dns={rcodes}")?;
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
        if let Some(q) = &self.filter.qname {
            write!(f, " qname={}{q}", if self.filter.qname_not { "!" } else { "" })?;
        }
        if self.filter.qtype != 0 {
            write!(f, " qtype={}", qtype_text(self.filter.qtype))?;
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
        for k in [
            TriggerKind::Status,
            TriggerKind::Reset,
            TriggerKind::NoResponse,
            TriggerKind::Grpc,
            TriggerKind::Dns,
        ] {
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
}
