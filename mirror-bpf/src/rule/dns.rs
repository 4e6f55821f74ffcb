//! DNS: response codes and question types by name, the set of rcodes a `dns=` rule names and
//! where they sit among the rule maps' pseudo-statuses (rcode `r` is `DNS_RCODE_BASE + r`,
//! below the gRPC codes), and the question filters `qname=` and `qtype=`, as the classifier
//! matches them from a DNS response.

use std::fmt;

use super::filter::FILTER_TEXT_MAX;
use super::grpc::GRPC_STATUS_BASE;
use crate::shared::types;

/// The first pseudo-status of DNS rcodes in the rule maps: rcode `r` is `DNS_RCODE_BASE + r`.
pub const DNS_RCODE_BASE: u16 = types::mirror_limits::DNS_RCODE_BASE.0 as u16;
/// DNS rcodes a rule may name: 0 to `DNS_RCODES - 1` (the header's four bits).
pub const DNS_RCODES: u8 = types::mirror_limits::DNS_RCODES.0 as u8;
const _: () = assert!(DNS_RCODES as u32 <= u16::BITS, "DnsRcodes holds one bit per rcode");
const _: () = assert!(DNS_RCODE_BASE + DNS_RCODES as u16 <= GRPC_STATUS_BASE, "below the gRPC codes");
const _: () = assert!(
    types::trigger_kind::TRIGGER_DNS.0 < DNS_RCODE_BASE as u32,
    "above the kinds' own pseudo-statuses"
);

/// The names of the rcodes 0 to 11, by rcode (RFC 1035, 2136, 8490).
pub const RCODE_NAMES: [&str; 12] = [
    "NOERROR",
    "FORMERR",
    "SERVFAIL",
    "NXDOMAIN",
    "NOTIMP",
    "REFUSED",
    "YXDOMAIN",
    "YXRRSET",
    "NXRRSET",
    "NOTAUTH",
    "NOTZONE",
    "DSOTYPENI",
];

/// The name of rcode `code` (`3`: `NXDOMAIN`), for the rcodes 0 to 11.
pub fn rcode_name(code: u16) -> Option<&'static str> {
    RCODE_NAMES.get(usize::from(code)).copied()
}

/// Question types a `qtype=` filter names, with their number.
pub const QTYPES: [(&str, u16); 12] = [
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("PTR", 12),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("SVCB", 64),
    ("HTTPS", 65),
    ("ANY", 255),
];

/// The name of question type `qtype` (`28`: `AAAA`), for the types of [`QTYPES`].
pub fn qtype_name(qtype: u16) -> Option<&'static str> {
    QTYPES.iter().find(|(_, t)| *t == qtype).map(|(n, _)| *n)
}

/// A question type as rules and events write it: its name, else its number.
pub fn qtype_text(qtype: u16) -> String {
    qtype_name(qtype).map_or_else(|| qtype.to_string(), str::to_string)
}

/// DNS rcodes a rule matches, one bit per rcode (bit `r`: rcode `r`, 0 to 15).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DnsRcodes(pub u16);

impl DnsRcodes {
    /// Every rcode (`dns=any`).
    pub const ALL: DnsRcodes = DnsRcodes(((1u32 << DNS_RCODES) - 1) as u16);

    /// Whether it holds `code`.
    pub fn contains(self, code: u8) -> bool {
        code < DNS_RCODES && self.0 & 1 << code != 0
    }

    /// The rcodes it holds, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0..DNS_RCODES).filter(move |c| self.contains(*c))
    }

    /// Whether it holds no rcode.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<u8> for DnsRcodes {
    /// The set of these rcodes (those of 16 and above are left out).
    fn from_iter<I: IntoIterator<Item = u8>>(codes: I) -> Self {
        DnsRcodes(codes.into_iter().filter(|c| *c < DNS_RCODES).fold(0, |acc, c| acc | 1 << c))
    }
}

/// `any` for every rcode, else its rcodes, lowest first, by name where DNS names them:
/// `SERVFAIL,NXDOMAIN,14`.
impl fmt::Display for DnsRcodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == DnsRcodes::ALL {
            return f.write_str("any");
        }
        for (i, c) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match rcode_name(c.into()) {
                Some(name) => f.write_str(name)?,
                None => write!(f, "{c}")?,
            }
        }
        Ok(())
    }
}

/// `nxdomain`, `SERVFAIL,3`, `any`: rcodes (0-15) or their names in any case, or `any` alone
/// for all 16; an rcode given twice counts once.
pub(crate) fn parse_rcodes(v: &str) -> Result<DnsRcodes, String> {
    if v.eq_ignore_ascii_case("any") {
        return Ok(DnsRcodes::ALL);
    }
    v.split(',').map(parse_rcode).collect()
}

fn parse_rcode(s: &str) -> Result<u8, String> {
    let max = DNS_RCODES - 1;
    if s.is_empty() {
        return Err("an empty rcode in the list".into());
    }
    if s.eq_ignore_ascii_case("any") {
        return Err("any covers every rcode: give it alone (dns=any)".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u8>()
            .ok()
            .filter(|c| *c <= max)
            .ok_or_else(|| format!("rcode {s} is outside 0-{max}"));
    }
    let upper = s.to_ascii_uppercase();
    RCODE_NAMES.iter().position(|n| *n == upper).map(|c| c as u8).ok_or_else(|| {
        format!("'{s}' is not a DNS rcode: a code 0-{max}, a name ({}), or any", RCODE_NAMES.join(", "))
    })
}

/// `AAAA`, `mx`, `65`: a question type's name in any case, or its number (1-65535).
pub(crate) fn parse_qtype(v: &str) -> Result<u16, String> {
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return v
            .parse::<u16>()
            .ok()
            .filter(|t| *t != 0)
            .ok_or_else(|| format!("qtype {v} is outside 1-65535"));
    }
    let upper = v.to_ascii_uppercase();
    QTYPES.iter().find(|(n, _)| *n == upper).map(|(_, t)| *t).ok_or_else(|| {
        let names: Vec<&str> = QTYPES.iter().map(|(n, _)| *n).collect();
        format!("'{v}' is not a question type: a number 1-65535 or a name ({})", names.join(", "))
    })
}

/// A domain suffix, stored lower case without a final dot: `example.com` (that name and every
/// name under it), `.example.com` (the names under it only). At most FILTER_TEXT_MAX bytes.
pub(crate) fn parse_qname(v: &str) -> Result<String, String> {
    let full = v.strip_suffix('.').unwrap_or(v);
    let name = full.strip_prefix('.').unwrap_or(full);
    if name.is_empty() {
        return Err(format!("qname={v} names every domain: leave qname= out"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))) {
        let hint = if c == '*' { " (a suffix already covers every name under it)" } else { "" };
        return Err(format!("qname has {c:?}, not a character of a domain name{hint}"));
    }
    if let Some(label) = name.split('.').find(|l| l.is_empty() || l.len() > 63) {
        return Err(if label.is_empty() {
            format!("qname '{v}' has an empty label")
        } else {
            format!("qname has a label of {} bytes, more than the 63 DNS allows", label.len())
        });
    }
    if full.len() > FILTER_TEXT_MAX {
        return Err(format!("qname is {} bytes, more than the {FILTER_TEXT_MAX} a filter holds", full.len()));
    }
    Ok(full.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rule::{Rule, Trigger, TriggerKind};

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn rcodes(s: &str) -> Vec<u8> {
        match rule(s).trigger {
            Trigger::Dns { rcodes, .. } => rcodes.iter().collect(),
            t => panic!("{s}: {t:?}"),
        }
    }

    #[test]
    fn rcodes_by_name_number_list_or_any() {
        assert_eq!(rcodes("dns=NXDOMAIN"), [3]);
        assert_eq!(rcodes("dns=nxdomain,ServFail"), [2, 3]);
        assert_eq!(rcodes("dns=3,refused,15"), [3, 5, 15]);
        assert_eq!(rcodes("dns=3,3,nxdomain"), [3], "the same rcode counts once");
        assert_eq!(rcodes("dns=dsotypeni,0"), [0, 11]);
        assert_eq!(rcodes("dns=any"), (0..16).collect::<Vec<_>>());
        assert_eq!(rcodes("dns=ANY"), (0..16).collect::<Vec<_>>());
        assert_eq!(
            (rcode_name(3), rcode_name(11), rcode_name(12)),
            (Some("NXDOMAIN"), Some("DSOTYPENI"), None)
        );
        assert_eq!([2, 3].into_iter().collect::<DnsRcodes>(), DnsRcodes(0b1100));
    }

    #[test]
    fn dns_rules_sit_under_their_pseudo_statuses() {
        let r = rule("dns=servfail,nxdomain");
        assert_eq!((r.kind(), r.kind().name(), r.threshold()), (TriggerKind::Dns, "dns", None));
        assert_eq!(r.statuses().collect::<Vec<_>>(), [DNS_RCODE_BASE + 2, DNS_RCODE_BASE + 3]);
        assert_eq!(TriggerKind::from_raw(types::trigger_kind::TRIGGER_DNS.0), Some(TriggerKind::Dns));
        assert_eq!(u32::from(TriggerKind::Dns.raw()), types::trigger_kind::TRIGGER_DNS.0);
        let r = rule("dns=any latency>100ms port=5353");
        assert_eq!((r.port, r.threshold()), (Some(5353), Some(Duration::from_millis(100))));
        assert_eq!(r.statuses().collect::<Vec<_>>(), (8..24).collect::<Vec<_>>());
    }

    #[test]
    fn question_filters() {
        let r = rule("dns=nxdomain qname=Svc.Cluster.Local. qtype=aaaa");
        assert_eq!((r.filter.qname.as_deref(), r.filter.qtype), (Some("svc.cluster.local"), 28));
        assert!(r.filter.is_dns() && !r.filter.is_http() && !r.filter.is_empty());
        assert_eq!(rule("dns=3 qname=.example.com").filter.qname.as_deref(), Some(".example.com"));
        assert_eq!(rule("dns=3 qtype=65535").filter.qtype, 65535);
        assert_eq!(rule("dns=3 qtype=HTTPS").filter.qtype, 65);
        let longest = format!("{}.c", "a".repeat(62));
        assert_eq!(rule(&format!("dns=3 qname={longest}")).filter.qname.as_deref(), Some(longest.as_str()));
        assert_eq!((qtype_text(28), qtype_text(99)), ("AAAA".to_string(), "99".to_string()));
    }

    #[test]
    fn names_not_under_a_suffix_and_queries_left_unanswered() {
        let r = rule("dns=nxdomain qname=!.Cluster.Local.");
        assert_eq!((r.filter.qname.as_deref(), r.filter.qname_not), (Some(".cluster.local"), true));
        assert_eq!(r.to_string(), "dns=NXDOMAIN qname=!.cluster.local packets=10000 bytes=0 duration=60s");
        assert_eq!(rule(&r.to_string()), r);
        assert!(!rule("dns=3 qname=.cluster.local").filter.qname_not);
        // noresponse> takes a DNS question's filters (then for queries only) or a request's.
        let r = rule("noresponse>300ms qname=.example qtype=aaaa");
        assert_eq!(
            (r.kind(), r.filter.qname.as_deref(), r.filter.qtype),
            (TriggerKind::NoResponse, Some(".example"), 28)
        );
        assert_eq!(
            r.to_string(),
            "noresponse>300ms qname=.example qtype=AAAA packets=10000 bytes=0 duration=60s"
        );
        assert!(rule("noresponse>1s method=GET").filter.is_http());
    }

    #[test]
    fn canonical_text_names_rcodes_and_types() {
        assert_eq!(
            rule("qtype=28 dns=3,servfail qname=.SVC.cluster.local").to_string(),
            "dns=SERVFAIL,NXDOMAIN qname=.svc.cluster.local qtype=AAAA packets=10000 bytes=0 duration=60s"
        );
        assert_eq!(
            rule("dns=any latency>200ms").to_string(),
            "dns=any latency>200ms packets=10000 bytes=0 duration=60s"
        );
        assert_eq!(
            rule("dns=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15").to_string(),
            "dns=any packets=10000 bytes=0 duration=60s",
            "every rcode is any"
        );
        assert_eq!(
            rule("port=5353 dns=14,refused qtype=99").to_string(),
            "port=5353 dns=REFUSED,14 qtype=99 packets=10000 bytes=0 duration=60s"
        );
        for s in [
            "dns=nxdomain",
            "dns=any latency>1s qname=example.com",
            "dns=servfail,refused,13 qtype=mx port=53 packets=5",
            "dns=3 qname=.svc.cluster.local qtype=AAAA",
        ] {
            let r = rule(s);
            assert_eq!(rule(&r.to_string()), r, "{s} -> {r}");
        }
    }

    #[test]
    fn errors_name_the_bad_token() {
        let cases = [
            ("dns=", "dns=", "needs a value"),
            ("dns=16", "dns=16", "rcode 16 is outside 0-15"),
            ("dns=99999", "dns=99999", "outside 0-15"),
            ("dns=bogus", "dns=bogus", "'bogus' is not a DNS rcode"),
            ("dns=bogus", "dns=bogus", "NOERROR, FORMERR, SERVFAIL, NXDOMAIN"),
            ("dns=3,", "dns=3,", "empty rcode"),
            ("dns=any,3", "dns=any,3", "give it alone"),
            ("dns=3 dns=2", "dns=2", "twice"),
            ("dns=3 status=500", "dns=3", "one trigger: status="),
            ("status=500 dns=3", "dns=3", "one trigger: status="),
            ("dns=3 grpc-status=13", "grpc-status=13", "one trigger: dns="),
            ("reset dns=3", "reset", "one trigger: dns="),
            ("dns=3 noresponse>1s", "noresponse>1s", "one trigger: dns="),
            ("dns=3 method=GET", "method=GET", "method= filters HTTP requests"),
            ("dns=3 path=/a", "path=/a", "qname= and qtype="),
            ("dns=3 host=a.example", "host=a.example", "HTTP requests"),
            ("status=500 qname=example.com", "qname=example.com", "qname= filters DNS questions"),
            ("grpc-status=13 qtype=A", "qtype=A", "goes with dns= or noresponse> only"),
            ("reset qtype=A", "qtype=A", "dns= or noresponse> only"),
            ("latency>1s qname=!a.b", "qname=!a.b", "goes with dns= or noresponse> only"),
            ("noresponse>1s path=/a qname=a.b", "qname=a.b", "qname= filters DNS questions and path= HTTP"),
            ("noresponse>1s qtype=A host=h", "qtype=A", "a noresponse> rule takes the filters of one"),
            ("dns=3 qname=!", "qname=!", "needs a suffix after the !"),
            ("dns=3 qname=!!a.b", "qname=!!a.b", "not a character of a domain name"),
            ("dns=3 qname=!.", "qname=!.", "names every domain"),
            ("dns=3 qname=!a qname=b", "qname=b", "twice"),
            ("qname=example.com", "qname=example.com", "needs status"),
            ("dns=3 qname=", "qname=", "needs a value"),
            ("dns=3 qname=.", "qname=.", "names every domain"),
            ("dns=3 qname=..com", "qname=..com", "empty label"),
            ("dns=3 qname=a.b..", "qname=a.b..", "empty label"),
            ("dns=3 qname=a..b", "qname=a..b", "empty label"),
            ("dns=3 qname=*.example.com", "qname=*.example.com", "covers every name under it"),
            ("dns=3 qname=a/b", "qname=a/b", "not a character of a domain name"),
            ("dns=3 qname=a.b qname=c", "qname=c", "twice"),
            ("dns=3 qtype=0", "qtype=0", "outside 1-65535"),
            ("dns=3 qtype=65536", "qtype=65536", "outside 1-65535"),
            ("dns=3 qtype=BOGUS", "qtype=BOGUS", "not a question type"),
            ("dns=3 qtype=BOGUS", "qtype=BOGUS", "A, NS, CNAME"),
            ("dns=3 qtype=A qtype=MX", "qtype=MX", "twice"),
            ("dns=3 colour=red", "colour=red", "dns=RCODES"),
            ("dns=3 colour=red", "colour=red", "qname=[!]SUFFIX"),
        ];
        for (text, token, reason) in cases {
            let e = text.parse::<Rule>().expect_err(text);
            assert_eq!(e.token, token, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
        let long = format!("dns=3 qname={}", "a".repeat(64));
        assert!(long.parse::<Rule>().unwrap_err().reason.contains("more than the 63 DNS allows"));
        let long = format!("dns=3 qname={}.{}", "a".repeat(40), "b".repeat(30));
        assert!(long.parse::<Rule>().unwrap_err().reason.contains("71 bytes, more than the 64"));
        let e = "dns=3 qtype=A method=GET".parse::<Rule>().unwrap_err();
        assert_eq!((e.token.as_str(), e.offset), ("method=GET", 14), "{e}");
    }
}
