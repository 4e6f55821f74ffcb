//! A rule resource's fields as the agent's rule: each field becomes the `mirrorctl rules add`
//! token it stands for, the text is parsed as every rule is ([`crate::rules::parse`]), and an
//! error names the field (`spec.status: '5xz' is not a status ...`). Also when a rule ends
//! (`expiresAt`, `ttl`).

use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mirror_bpf::Rule;

use super::crd::RuleFields;

/// A value that is a name or a number, as a token's text.
fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The rule of `f`, or why it is none, in words naming the field.
pub fn rule_of(f: &RuleFields) -> Result<Rule, String> {
    let mut tokens: Vec<(&str, String)> = Vec::new();
    let mut push = |field: &'static str, prefix: &str, value: &Option<String>| -> Result<(), String> {
        if let Some(v) = value {
            if v.trim().is_empty() {
                return Err(format!("spec.{field}: empty"));
            }
            if v.chars().any(char::is_whitespace) {
                return Err(format!("spec.{field}: '{v}' has a blank in it"));
            }
            tokens.push((field, format!("{prefix}{v}")));
        }
        Ok(())
    };
    push("port", "port=", &f.port.map(|p| p.to_string()))?;
    push("status", "status=", &f.status)?;
    push("grpcStatus", "grpc-status=", &f.grpc_status)?;
    if f.dns.as_ref().is_some_and(|codes| codes.is_empty()) {
        return Err("spec.dns: empty: give rcodes (NXDOMAIN, SERVFAIL, 0-15) or any".into());
    }
    let dns = f.dns.as_ref().map(|codes| codes.iter().map(int_or_string).collect::<Vec<_>>().join(","));
    push("dns", "dns=", &dns)?;
    push("reset", "", &f.reset.filter(|r| *r).map(|_| "reset".to_string()))?;
    if f.drop.as_ref().is_some_and(|reasons| reasons.is_empty()) {
        return Err(
            "spec.drop: empty: give the kernel's drop reasons (netfilter_drop, no_socket) or any".into()
        );
    }
    push("drop", "drop=", &f.drop.as_ref().map(|r| r.join(",")))?;
    push("noResponse", "noresponse>", &f.no_response)?;
    push("latency", "latency>", &f.latency)?;
    push("method", "method=", &f.method)?;
    push("path", "path=", &f.path)?;
    push("host", "host=", &f.host)?;
    push("qname", "qname=", &f.qname)?;
    push("qtype", "qtype=", &f.qtype.as_ref().map(int_or_string))?;
    push("packets", "packets=", &f.packets.map(|p| p.to_string()))?;
    push("bytes", "bytes=", &f.bytes.map(|p| p.to_string()))?;
    push("duration", "duration=", &f.duration)?;
    let triggers = ["status", "grpcStatus", "dns", "reset", "noResponse", "latency", "drop"];
    if !tokens.iter().any(|(field, _)| triggers.contains(field)) {
        return Err("no trigger: set one of spec.status, spec.grpcStatus, spec.dns, spec.reset, \
                    spec.noResponse, spec.latency, spec.drop"
            .into());
    }
    let text = tokens.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" ");
    crate::rules::parse(&text).map_err(|e| {
        // The field whose token the error is at.
        let mut at = 0;
        let field = tokens
            .iter()
            .find(|(_, t)| {
                let start = at;
                at += t.len() + 1;
                (start..at).contains(&e.offset)
            })
            .map_or("", |(f, _)| *f);
        if field.is_empty() {
            format!("{}: {}", e.token, e.reason)
        } else {
            format!("spec.{field}: '{}': {}", e.token, e.reason)
        }
    })
}

/// When the rule ends: the earlier of `expiresAt` and its creation plus `ttl` (none: never).
pub fn expiry(f: &RuleFields, created: Option<&Time>) -> Result<Option<SystemTime>, String> {
    let mut end: Option<SystemTime> = f.expires_at.as_ref().map(|t| SystemTime::from(t.0));
    if let Some(ttl) = &f.ttl {
        let d: Duration = mirror_bpf::rule::syntax::parse_duration(ttl)
            .map_err(|_| format!("spec.ttl: '{ttl}' is not a duration (e.g. 30m, 2h)"))?;
        // A rule the API server has not stamped yet is as new as now.
        let from = created.map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
        let by_ttl = from + d;
        end = Some(end.map_or(by_ttl, |e| e.min(by_ttl)));
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(yaml: &str) -> RuleFields {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn fields_become_the_rule_syntax() {
        let r =
            rule_of(&fields("status: 5xx\nport: 8080\nmethod: POST\npath: /api/\npackets: 50\n")).unwrap();
        assert_eq!(
            r.to_string(),
            "port=8080 status=5xx method=POST path=/api/ packets=50 bytes=0 duration=60s"
        );
        let r = rule_of(&fields("grpcStatus: internal,unavailable\nlatency: 1s\n")).unwrap();
        assert!(r.to_string().starts_with("grpc-status=INTERNAL,UNAVAILABLE latency>1s"), "{r}");
        assert_eq!(rule_of(&fields("reset: true\n")).unwrap().to_string().split(' ').next(), Some("reset"));
        assert!(rule_of(&fields("noResponse: 2s\n")).unwrap().to_string().starts_with("noresponse>2s"));
    }

    #[test]
    fn drop_fields_become_the_rule_syntax() {
        let r = rule_of(&fields("drop: [netfilter_drop]\nport: 8080\n")).unwrap();
        assert_eq!(r.to_string(), "port=8080 drop=netfilter_drop packets=10000 bytes=0 duration=60s");
        assert!(rule_of(&fields("drop: [any]\n")).unwrap().to_string().starts_with("drop packets="));
        assert!(rule_of(&fields("drop: []\n")).unwrap_err().starts_with("spec.drop: empty"));
        let e = rule_of(&fields("drop: [nosuch]\n")).unwrap_err();
        assert!(
            e.starts_with("spec.drop: 'drop=nosuch': 'nosuch' is not a drop reason of this kernel"),
            "{e}"
        );
    }

    #[test]
    fn dns_fields_become_the_rule_syntax() {
        let r = rule_of(&fields(
            "dns: [NXDOMAIN, servfail, 14]\nqname: .svc.cluster.local\nqtype: AAAA\nport: 53\n",
        ))
        .unwrap();
        assert_eq!(
            r.to_string(),
            "port=53 dns=SERVFAIL,NXDOMAIN,14 qname=.svc.cluster.local qtype=AAAA packets=10000 bytes=0 duration=60s"
        );
        let r = rule_of(&fields("dns: [3]\nqtype: 28\n")).unwrap();
        assert_eq!(r.to_string(), "dns=NXDOMAIN qtype=AAAA packets=10000 bytes=0 duration=60s");
        let r = rule_of(&fields("dns: [any]\nlatency: 500ms\n")).unwrap();
        assert!(r.to_string().starts_with("dns=any latency>500ms"), "{r}");
        let r = rule_of(&fields("noResponse: 1s\nqname: \"!.Cluster.Local\"\nqtype: A\n")).unwrap();
        assert_eq!(
            r.to_string(),
            "noresponse>1s qname=!.cluster.local qtype=A packets=10000 bytes=0 duration=60s"
        );
        let e = rule_of(&fields("dns: [bogus]\n")).unwrap_err();
        assert!(e.starts_with("spec.dns: 'dns=bogus': 'bogus' is not a DNS rcode"), "{e}");
        let e = rule_of(&fields("dns: []\n")).unwrap_err();
        assert!(e.starts_with("spec.dns: empty"), "{e}");
        let e = rule_of(&fields("dns: [\"3 4\"]\n")).unwrap_err();
        assert!(e.starts_with("spec.dns: '3 4' has a blank"), "{e}");
        let e = rule_of(&fields("dns: [3]\nqtype: 0\n")).unwrap_err();
        assert!(e.starts_with("spec.qtype: 'qtype=0': qtype 0 is outside 1-65535"), "{e}");
        let e = rule_of(&fields("status: \"500\"\nqname: example.com\n")).unwrap_err();
        assert!(e.starts_with("spec.qname: 'qname=example.com': qname= filters DNS questions"), "{e}");
        let e = rule_of(&fields("dns: [3]\nmethod: GET\n")).unwrap_err();
        assert!(e.starts_with("spec.method: 'method=GET': method= filters HTTP requests"), "{e}");
        let e = rule_of(&fields("qname: example.com\n")).unwrap_err();
        assert!(e.starts_with("no trigger") && e.contains("spec.dns"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = rule_of(&fields("status: 5xz\n")).unwrap_err();
        assert!(e.starts_with("spec.status: 'status=5xz': "), "{e}");
        let e = rule_of(&fields("status: \"500\"\nduration: 48h\n")).unwrap_err();
        assert!(e.starts_with("spec.duration: 'duration=48h': longer than 24h"), "{e}");
        let e = rule_of(&fields("grpcStatus: bogus\n")).unwrap_err();
        assert!(e.starts_with("spec.grpcStatus: "), "{e}");
        let e = rule_of(&fields("port: 80\n")).unwrap_err();
        assert!(e.starts_with("no trigger"), "{e}");
        let e = rule_of(&fields("status: \"500\"\npath: /a b\n")).unwrap_err();
        assert_eq!(e, "spec.path: '/a b' has a blank in it");
        let e = rule_of(&fields("reset: false\n")).unwrap_err();
        assert!(e.starts_with("no trigger"), "{e}");
    }

    #[test]
    fn the_earlier_end_wins() {
        let created = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let f = fields("status: \"500\"\nttl: 1h\n");
        let end = expiry(&f, Some(&created)).unwrap().unwrap();
        assert_eq!(end, SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_003_600));
        let f = fields("status: \"500\"\nttl: 1h\nexpiresAt: \"2027-01-15T08:00:30Z\"\n");
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(expiry(&f, Some(&created)).unwrap(), Some(at(1_800_000_030)));
        let f = fields("status: \"500\"\nexpiresAt: \"2027-01-15T08:00:00Z\"\n");
        assert_eq!(expiry(&f, None).unwrap(), Some(at(1_800_000_000)));
        assert!(expiry(&fields("status: \"500\"\nttl: soon\n"), None).unwrap_err().starts_with("spec.ttl"));
        assert_eq!(expiry(&fields("status: \"500\"\n"), None).unwrap(), None);
    }
}
