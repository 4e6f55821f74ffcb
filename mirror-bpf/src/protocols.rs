//! The protocol programs behind the classifier's dispatcher (`include/dispatch.h`), chosen at
//! load (the `protocols:` setting): a protocol left out is neither verified nor run, and its
//! connections cost what a connection that is not followed costs.

use std::fmt;

use crate::rule::syntax::{Rule, Trigger};
use crate::shared::types::proto_prog;

/// A protocol the classifier follows, each in a program of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// HTTP/1.x: messages, framing, requests kept; also where HTTP/2 starts (prior knowledge or
    /// an h2c upgrade), so HTTP/2 needs it.
    Http1,
    /// HTTP/2 in cleartext: frames, HPACK, gRPC status.
    Http2,
    /// DNS over UDP and TCP on the DNS ports (`dns.ports`): queries kept until their responses,
    /// response codes, answer times.
    Dns,
}

impl Protocol {
    /// Every protocol, in the order of their programs.
    pub const ALL: [Protocol; 3] = [Protocol::Http1, Protocol::Http2, Protocol::Dns];

    /// Its name in the configuration and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
            Protocol::Dns => "dns",
        }
    }

    /// Its program's index in `proto_progs` (`enum proto_prog`).
    pub fn index(self) -> u32 {
        match self {
            Protocol::Http1 => proto_prog::PROG_HTTP1.0,
            Protocol::Http2 => proto_prog::PROG_HTTP2.0,
            Protocol::Dns => proto_prog::PROG_DNS.0,
        }
    }

    /// Its program's name in the classifier.
    pub fn program(self) -> &'static str {
        match self {
            Protocol::Http1 => "proto_http1",
            Protocol::Http2 => "proto_http2",
            Protocol::Dns => "proto_dns",
        }
    }

    /// The protocol named `s` (as [`Protocol::name`] gives it); the error lists the names.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|p| p.name()).collect();
            format!("unknown protocol '{s}' (one of: {})", names.join(", "))
        })
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of protocols: which programs are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocols(u32);

impl Default for Protocols {
    /// All of them.
    fn default() -> Self {
        Self::from_iter(Protocol::ALL)
    }
}

impl FromIterator<Protocol> for Protocols {
    fn from_iter<I: IntoIterator<Item = Protocol>>(iter: I) -> Self {
        Self(iter.into_iter().fold(0, |bits, p| bits | 1 << p.index()))
    }
}

impl Protocols {
    /// None: every connection is accounted and, when marked, copied; nothing is followed.
    pub const NONE: Protocols = Protocols(0);

    /// Whether `p` is in the set.
    pub fn contains(self, p: Protocol) -> bool {
        self.0 & (1 << p.index()) != 0
    }

    /// The protocols of the set, in order.
    pub fn iter(self) -> impl Iterator<Item = Protocol> {
        Protocol::ALL.into_iter().filter(move |p| self.contains(*p))
    }

    /// The bits of `protocols_enabled` (`include/config.h`).
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Checks that the set can work; the error says why not.
    pub fn check(self) -> Result<(), String> {
        if self.contains(Protocol::Http2) && !self.contains(Protocol::Http1) {
            return Err("http2 needs http1: the HTTP/1 program finds where HTTP/2 starts".into());
        }
        Ok(())
    }
}

impl Protocols {
    /// Whether `rule` can trigger with these programs loaded: a DNS trigger (`dns=`) or a DNS
    /// filter (`qname=`, `qtype=`) needs dns; `grpc-status=` needs http2; `status=`,
    /// `latency>`, `reset` and the HTTP filters (`method=`, `path=`, `host=`) need http1;
    /// `noresponse>` alone needs http1 or dns; `drop` alone needs none (the kernel's drops are
    /// seen by a program of their own). The error says what it needs and names the
    /// `protocols:` setting (the caller names the rule).
    pub fn admits(self, rule: &Rule) -> Result<(), String> {
        if matches!(rule.trigger, Trigger::Drop(_)) && !rule.filter.is_http() && !rule.filter.is_dns() {
            return Ok(());
        }
        let dns = matches!(rule.trigger, Trigger::Dns { .. }) || rule.filter.is_dns();
        let needs: &[Protocol] = if dns {
            &[Protocol::Dns]
        } else {
            match rule.trigger {
                Trigger::Grpc { .. } => &[Protocol::Http2],
                Trigger::NoResponse(_) if !rule.filter.is_http() => &[Protocol::Http1, Protocol::Dns],
                _ => &[Protocol::Http1],
            }
        };
        if needs.iter().any(|p| self.contains(*p)) {
            return Ok(());
        }
        let names: Vec<&str> = needs.iter().map(|p| p.name()).collect();
        Err(format!(
            "needs the {} protocol, which the setting protocols: [{}] leaves out: add {} to protocols",
            names.join(" or "),
            self.iter().map(Protocol::name).collect::<Vec<_>>().join(", "),
            names[0]
        ))
    }
}

impl fmt::Display for Protocols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = self.iter().map(Protocol::name).collect();
        f.write_str(if names.is_empty() { "none" } else { "" })?;
        f.write_str(&names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_listed() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.name()), Ok(p));
        }
        let err = Protocol::parse("http3").unwrap_err();
        assert!(err.contains("'http3'") && err.contains("http1, http2, dns"), "{err}");
        assert_eq!((Protocol::Dns.index(), Protocol::Dns.program()), (2, "proto_dns"));
        let indexes: Vec<u32> = Protocol::ALL.iter().map(|p| p.index()).collect();
        assert!(indexes.iter().all(|i| *i < proto_prog::PROGS_MAX.0 && *i != proto_prog::PROG_RESET.0));
    }

    #[test]
    fn rules_need_their_protocol() {
        let rule = |s: &str| s.parse::<Rule>().unwrap();
        let http = Protocols::from_iter([Protocol::Http1, Protocol::Http2]);
        let dns = Protocols::from_iter([Protocol::Dns]);
        for r in [
            "dns=nxdomain",
            "noresponse>1s qname=.cluster.local",
            "noresponse>1s qtype=AAAA",
            "dns=any latency>1s",
        ] {
            let err = http.admits(&rule(r)).unwrap_err();
            assert!(err.starts_with("needs the dns protocol"), "{err}");
            assert!(err.contains("protocols: [http1, http2]") && err.contains("add dns"), "{err}");
            assert!(dns.admits(&rule(r)).is_ok() && Protocols::default().admits(&rule(r)).is_ok(), "{r}");
        }
        for r in ["status=500", "latency>1s", "reset", "noresponse>1s path=/api", "grpc-status=14"] {
            let err = dns.admits(&rule(r)).unwrap_err();
            assert!(err.contains("needs the http"), "{err}");
        }
        assert!(dns.admits(&rule("noresponse>1s")).is_ok() && http.admits(&rule("noresponse>1s")).is_ok());
        let err = Protocols::NONE.admits(&rule("noresponse>1s")).unwrap_err();
        assert!(err.contains("needs the http1 or dns protocol") && err.contains("protocols: []"), "{err}");
        assert!(Protocols::NONE.admits(&rule("drop=netfilter_drop port=80")).is_ok());
        let h1 = Protocols::from_iter([Protocol::Http1]);
        assert!(h1.admits(&rule("grpc-status=14")).unwrap_err().contains("add http2"));
    }

    #[test]
    fn http2_alone_is_refused_with_the_reason() {
        assert!(Protocols::default().check().is_ok());
        assert!(Protocols::from_iter([Protocol::Http1]).check().is_ok());
        assert!(Protocols::NONE.check().is_ok());
        let err = Protocols::from_iter([Protocol::Http2]).check().unwrap_err();
        assert!(err.contains("http2 needs http1"), "{err}");
        assert_eq!(Protocols::default().to_string(), "http1, http2, dns");
        assert_eq!(Protocols::NONE.to_string(), "none");
        let dns = Protocols::from_iter([Protocol::Dns]);
        assert!(dns.check().is_ok(), "DNS needs neither HTTP program");
        assert_eq!((dns.bits(), dns.to_string()), (1 << 2, "dns".into()));
    }
}
