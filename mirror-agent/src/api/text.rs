//! The views as text, the same in mirrorctl's tables and the agent's Kubernetes Events.

use mirror_bpf::rule::dns::{qtype_text, rcode_name};

use crate::views::EventView;

/// What triggered, as the tables show it: the status (`500`), `grpc 13 INTERNAL` (a gRPC
/// code, its name when gRPC names it), `dns NXDOMAIN` (a DNS rcode, by name when DNS names
/// it), `reset` (`reset by server` when `by` is known), `noresponse`, `drop netfilter_drop` (the
/// kernel's reason, its name on this kernel). `kind` is a
/// [`mirror_bpf::TriggerKind`] name (`None`: `status`).
pub fn trigger_text(kind: Option<&str>, status: u16, by: Option<&str>) -> String {
    match (kind.unwrap_or("status"), by) {
        ("status", _) => status.to_string(),
        ("grpc-status", _) => match mirror_bpf::rule::grpc::grpc_status_name(status) {
            Some(name) => format!("grpc {status} {name}"),
            None => format!("grpc {status}"),
        },
        ("dns", _) => format!("dns {}", rcode_text(status)),
        ("drop", _) => format!("drop {}", mirror_bpf::rule::drop::reason_text(status)),
        ("reset", Some(by)) => format!("reset by {by}"),
        (kind, _) => kind.to_string(),
    }
}

/// A DNS rcode by its name (`NXDOMAIN`), or its number where DNS names none (12-15).
pub fn rcode_text(rcode: u16) -> String {
    rcode_name(rcode).map_or_else(|| rcode.to_string(), str::to_string)
}

/// The rcodes seen at least once, by [`rcode_text`], with their counts, lowest rcode first.
pub fn rcode_counts(counts: &[u64]) -> impl Iterator<Item = (String, u64)> + '_ {
    counts.iter().enumerate().filter(|(_, n)| **n > 0).map(|(r, n)| (rcode_text(r as u16), *n))
}

/// The request behind an event, when it is named: `GET /path` (HTTP/2: `:method` and
/// `:path`), or a DNS question as `AAAA web.shop.svc.cluster.local` (its type, then its name).
pub fn request_text(e: &EventView) -> Option<String> {
    match (&e.method, &e.target, &e.qname) {
        (Some(m), Some(t), _) => Some(format!("{m} {t}")),
        (_, _, Some(name)) => Some(match e.qtype {
            Some(t) => format!("{} {name}", qtype_text(t)),
            None => name.clone(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_are_named() {
        assert_eq!(trigger_text(None, 500, None), "500");
        assert_eq!(trigger_text(Some("status"), 503, Some("server")), "503");
        assert_eq!(trigger_text(Some("grpc-status"), 13, Some("server")), "grpc 13 INTERNAL");
        assert_eq!(trigger_text(Some("grpc-status"), 0, None), "grpc 0 OK");
        assert_eq!(trigger_text(Some("grpc-status"), 42, None), "grpc 42");
        assert_eq!(trigger_text(Some("dns"), 3, Some("server")), "dns NXDOMAIN");
        assert_eq!(trigger_text(Some("dns"), 2, None), "dns SERVFAIL");
        assert_eq!(trigger_text(Some("dns"), 14, None), "dns 14");
        assert_eq!(trigger_text(Some("reset"), 0, Some("client")), "reset by client");
        assert_eq!(trigger_text(Some("reset"), 0, None), "reset");
        assert_eq!(trigger_text(Some("noresponse"), 0, None), "noresponse");
        let nf = mirror_bpf::rule::drop::reasons().iter().find(|(_, n)| n == "netfilter_drop").unwrap().0;
        assert_eq!(trigger_text(Some("drop"), nf, Some("client")), "drop netfilter_drop");
    }

    #[test]
    fn rcodes_seen_are_named() {
        let mut counts = [0u64; 16];
        (counts[0], counts[3], counts[13]) = (120, 4, 1);
        let named: Vec<(String, u64)> = rcode_counts(&counts).collect();
        assert_eq!(named, [("NOERROR".into(), 120), ("NXDOMAIN".into(), 4), ("13".into(), 1)]);
    }
}
