//! A rule's text to its [`Rule`]: each token read by itself (its value checked, its key given
//! once), then the tokens checked together (one trigger; filters that concern that trigger).
//! An error names the token, and its offset in the text.

use std::str::FromStr;
use std::time::Duration;

use super::dns::{parse_qname, parse_qtype, parse_rcodes, DnsRcodes};
use super::drop::{parse_reasons, DropReasons};
use super::filter::{parse_host, parse_methods, parse_path, RequestFilter};
use super::grpc::{parse_grpc_codes, GrpcCodes};
use super::syntax::{
    parse_duration, Limits, Rule, RuleError, StatusMatch, Trigger, STATUS_MAX, STATUS_MIN, SYNTAX,
};

/// What the tokens of a rule said, before they are checked together.
#[derive(Default)]
struct Parts {
    status: Option<(StatusMatch, usize, String)>,
    latency: Option<Duration>,
    reset: Option<(usize, String)>,
    noresponse: Option<(Duration, usize, String)>,
    grpc: Option<(GrpcCodes, usize, String)>,
    dns: Option<(DnsRcodes, usize, String)>,
    drop: Option<(DropReasons, usize, String)>,
    port: Option<u16>,
    filter: RequestFilter,
    /// The first token of an HTTP request filter (`method=`, `path=`, `host=`), and of a DNS
    /// question filter (`qname=`, `qtype=`): (offset, token, key).
    http_filter: Option<(usize, String, String)>,
    dns_filter: Option<(usize, String, String)>,
    limits: Limits,
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let mut p = Parts { limits: Limits::default(), ..Parts::default() };
        for (offset, token) in tokens(text) {
            let err = |reason: String| RuleError { token: token.to_string(), offset, reason };
            if token == "drop" {
                let all = DropReasons::all();
                if all.is_empty() {
                    return Err(err(parse_reasons("any").unwrap_err()));
                }
                if p.drop.replace((all, offset, token.to_string())).is_some() {
                    return Err(err("drop given twice".into()));
                }
                continue;
            }
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
                "dns" => {
                    let rcodes = parse_rcodes(value).map_err(err)?;
                    if p.dns.replace((rcodes, offset, token.to_string())).is_some() {
                        return Err(dup());
                    }
                }
                "drop" => {
                    let reasons = parse_reasons(value).map_err(err)?;
                    if p.drop.replace((reasons, offset, token.to_string())).is_some() {
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
                "qname" => {
                    // `qname=!SUFFIX`: the names not under it.
                    let (not, suffix) = match value.strip_prefix('!') {
                        Some(rest) => (true, rest),
                        None => (false, value),
                    };
                    if suffix.is_empty() {
                        return Err(err("qname=! needs a suffix after the ! (qname=!.cluster.local)".into()));
                    }
                    if p.filter.qname.replace(parse_qname(suffix).map_err(err)?).is_some() {
                        return Err(dup());
                    }
                    p.filter.qname_not = not;
                }
                "qtype" => {
                    if p.filter.qtype != 0 {
                        return Err(dup());
                    }
                    p.filter.qtype = parse_qtype(value).map_err(err)?;
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
            let first = |at: &mut Option<(usize, String, String)>| {
                at.get_or_insert_with(|| (offset, token.to_string(), key.to_string()));
            };
            match key {
                "method" | "path" | "host" => first(&mut p.http_filter),
                "qname" | "qtype" => first(&mut p.dns_filter),
                _ => {}
            }
        }
        let trigger = p.trigger(text)?;
        p.check_filters(&trigger)?;
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
            self.dns.as_ref().map(|(_, o, t)| (*o, t.as_str(), "dns=")),
            self.drop.as_ref().map(|(_, o, t)| (*o, t.as_str(), "drop")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let Some(&(offset, token, first)) = alone.first() else {
            return self.status_trigger(text);
        };
        let status = self.status.as_ref().map(|_| "status=");
        // A gRPC call's latency> is the time to its trailers, a DNS query's to its response.
        let latency = self.latency.filter(|_| !matches!(first, "grpc-status=" | "dns=")).map(|_| "latency>");
        if let Some(what) = alone.get(1).map(|a| a.2).or(status).or(latency) {
            return Err(RuleError {
                token: token.to_string(),
                offset,
                reason: format!("a rule has one trigger: {what} cannot go with it"),
            });
        }
        if let Some((reasons, _, _)) = &self.drop {
            return Ok(Trigger::Drop(*reasons));
        }
        Ok(match (&self.grpc, &self.dns, self.noresponse.as_ref()) {
            (Some((codes, _, _)), _, _) => Trigger::Grpc { codes: *codes, latency: self.latency },
            (None, Some((rcodes, _, _)), _) => Trigger::Dns { rcodes: *rcodes, latency: self.latency },
            (None, None, Some((d, _, _))) => Trigger::NoResponse(*d),
            (None, None, None) => Trigger::Reset,
        })
    }

    /// Refuses filters on what `trigger` does not concern: an HTTP request's with `dns=`, a DNS
    /// question's with any other trigger. The error is at the filter's first token.
    fn check_filters(&self, trigger: &Trigger) -> Result<(), RuleError> {
        let wrong = match (trigger, &self.http_filter, &self.dns_filter) {
            // A dropped packet has no request nor question behind it.
            (Trigger::Drop(_), Some((offset, token, key)), _)
            | (Trigger::Drop(_), None, Some((offset, token, key))) => Some((
                offset,
                token,
                format!("{key}= filters requests or questions: a drop rule takes port= and limits"),
            )),
            (Trigger::Dns { .. }, Some((offset, token, key)), _) => Some((
                offset,
                token,
                format!("{key}= filters HTTP requests: a dns= rule takes qname= and qtype="),
            )),
            // A request left unanswered is an HTTP request or a DNS query: one kind of filter.
            (Trigger::NoResponse(_), Some((_, _, http)), Some((offset, token, key))) => Some((
                offset,
                token,
                format!(
                    "{key}= filters DNS questions and {http}= HTTP requests: a noresponse> rule takes \
                     the filters of one (none: both)"
                ),
            )),
            (Trigger::Dns { .. } | Trigger::NoResponse(_), _, _) => None,
            (_, _, Some((offset, token, key))) => Some((
                offset,
                token,
                format!("{key}= filters DNS questions: it goes with dns= or noresponse> only"),
            )),
            _ => None,
        };
        match wrong {
            Some((offset, token, reason)) => Err(RuleError { token: token.clone(), offset: *offset, reason }),
            None => Ok(()),
        }
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
                             noresponse>DURATION, grpc-status=CODE, dns=RCODE or drop"
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

/// A wait of a trigger (`noresponse>`, `latency>`): a duration with its unit, never unlimited.
fn parse_wait(v: &str) -> Result<Duration, String> {
    parse_duration(v).map_err(|_| format!("'{v}' is not a duration (e.g. 500ms, 2s, 1m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
