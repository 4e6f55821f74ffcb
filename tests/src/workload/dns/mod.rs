//! DNS in the pods: real resolvers (dnsmasq, and CoreDNS: [`ResolverKind`]) with a zone that
//! answers, names that do not exist and a forward to an upstream that fails; a scripted responder (an upstream that
//! answers SERVFAIL or REFUSED, or a server that delays chosen names); and real clients: dig,
//! many lookups per process, and glibc's getaddrinfo (python's `socket.getaddrinfo`) reading a
//! resolv.conf of the test's.
//!
//! The resolver's names ([`Resolver`]):
//!
//! | name | answer |
//! |---|---|
//! | [`GOOD_ZONE`] and the names under it | NOERROR: A [`GOOD_A`], AAAA [`GOOD_AAAA`] |
//! | under [`FAIL_ZONE`] | SERVFAIL, the upstream's |
//! | under [`REFUSED_ZONE`] | REFUSED, the upstream's |
//! | any other under `test`, `cluster.local` or `example` | NXDOMAIN |
//! | [`CLUSTER_GOOD`] | NOERROR, as [`GOOD_ZONE`] |
//!
//! Neither resolver keeps a cache: every query is answered from its configuration or forwarded.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use mirror_bpf::testing::in_ci;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{Netns, Pod};

/// The names that resolve.
pub const GOOD_ZONE: &str = "good.test";
/// The names whose lookups the upstream answers SERVFAIL.
pub const FAIL_ZONE: &str = "fail.test";
/// The names whose lookups the upstream answers REFUSED.
pub const REFUSED_ZONE: &str = "refused.test";
/// A name of the cluster's domain that resolves (the search path finds it as `kube-dns` from
/// the namespace `kube-system`).
pub const CLUSTER_GOOD: &str = "kube-dns.kube-system.svc.cluster.local";
/// The address [`GOOD_ZONE`]'s names have.
pub const GOOD_A: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 10);
/// Their IPv6 address.
pub const GOOD_AAAA: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 250, 0, 0, 0, 0x10);

/// Where the resolver's upstream listens, in the resolver's namespace.
const UPSTREAM_PORT: u16 = 5353;
/// How long a process may take to start answering.
const STARTUP: Duration = Duration::from_secs(10);

/// A DNS response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rcode(pub u8);

impl Rcode {
    /// No error.
    pub const NOERROR: Rcode = Rcode(0);
    /// The server failed.
    pub const SERVFAIL: Rcode = Rcode(2);
    /// The name does not exist.
    pub const NXDOMAIN: Rcode = Rcode(3);
    /// The server refused.
    pub const REFUSED: Rcode = Rcode(5);

    const NAMES: [&'static str; 11] = [
        "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET", "NXRRSET",
        "NOTAUTH", "NOTZONE",
    ];

    /// From its name as dig prints it (`NXDOMAIN`).
    pub fn from_name(name: &str) -> Option<Rcode> {
        Self::NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)).map(|i| Rcode(i as u8))
    }
}

impl fmt::Display for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Self::NAMES.get(usize::from(self.0)) {
            Some(n) => f.write_str(n),
            None => write!(f, "RCODE{}", self.0),
        }
    }
}

/// A question's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QType(pub u16);

impl QType {
    /// An IPv4 address.
    pub const A: QType = QType(1);
    /// An IPv6 address.
    pub const AAAA: QType = QType(28);

    /// Its name (`A`, `AAAA`, or `TYPE<n>`).
    pub fn name(self) -> String {
        match self {
            QType::A => "A".into(),
            QType::AAAA => "AAAA".into(),
            QType(n) => format!("TYPE{n}"),
        }
    }

    /// From its name as dig prints it.
    pub fn from_name(name: &str) -> Option<QType> {
        match name {
            "A" => Some(QType::A),
            "AAAA" => Some(QType::AAAA),
            _ => name.strip_prefix("TYPE")?.parse().ok().map(QType),
        }
    }
}

impl fmt::Display for QType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// What the scripted responder answers for a name and the names under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// The name (lower case, no final dot).
    pub suffix: String,
    /// The response code.
    pub rcode: Rcode,
    /// How long it waits before answering; `None`: it never answers.
    pub delay: Option<Duration>,
    /// With NOERROR: A records.
    pub a: Vec<Ipv4Addr>,
    /// With NOERROR: AAAA records.
    pub aaaa: Vec<Ipv6Addr>,
}

impl Zone {
    /// Names answered at once with `rcode` (and, with NOERROR, [`GOOD_A`] and [`GOOD_AAAA`]).
    pub fn new(suffix: &str, rcode: Rcode) -> Zone {
        let noerror = rcode == Rcode::NOERROR;
        Zone {
            suffix: suffix.to_ascii_lowercase(),
            rcode,
            delay: Some(Duration::ZERO),
            a: if noerror { vec![GOOD_A] } else { Vec::new() },
            aaaa: if noerror { vec![GOOD_AAAA] } else { Vec::new() },
        }
    }

    /// The same, answered `delay` late.
    pub fn delayed(mut self, delay: Duration) -> Zone {
        self.delay = Some(delay);
        self
    }

    /// The same, never answered.
    pub fn silent(mut self) -> Zone {
        self.delay = None;
        self
    }

    fn json(&self) -> String {
        let list = |v: Vec<String>| v.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(",");
        format!(
            r#"{{"suffix":"{}","rcode":{},"delay_ms":{},"a":[{}],"aaaa":[{}]}}"#,
            self.suffix,
            self.rcode.0,
            self.delay.map_or("null".to_string(), |d| d.as_millis().to_string()),
            list(self.a.iter().map(ToString::to_string).collect()),
            list(self.aaaa.iter().map(ToString::to_string).collect()),
        )
    }
}

/// The transport of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    /// One datagram each way.
    Udp,
    /// A TCP connection (dig's `+tcp`).
    Tcp,
}

impl Transport {
    /// Its IP protocol number, as flow keys carry it.
    pub fn proto(self) -> u8 {
        match self {
            Transport::Udp => 17,
            Transport::Tcp => 6,
        }
    }
}

mod dig;
mod glibc;
mod servers;

pub use dig::*;
pub use glibc::*;
pub use servers::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resolver_s_answers() {
        let answers = ["www.Good.test.", "a.fail.test", "b.refused.test", "missing.test", "x.cluster.local"]
            .map(Resolver::rcode_of);
        assert_eq!(
            answers,
            [Rcode::NOERROR, Rcode::SERVFAIL, Rcode::REFUSED, Rcode::NXDOMAIN, Rcode::NXDOMAIN]
        );
        assert_eq!(Resolver::rcode_of(CLUSTER_GOOD), Rcode::NOERROR);
    }

    #[test]
    fn names_of_codes_and_types() {
        assert_eq!(Rcode::from_name("SERVFAIL"), Some(Rcode::SERVFAIL));
        assert_eq!(
            (Rcode::NXDOMAIN.to_string(), Rcode(12).to_string()),
            ("NXDOMAIN".into(), "RCODE12".into())
        );
        assert_eq!(
            (QType::from_name("AAAA"), QType::from_name("TYPE65")),
            (Some(QType::AAAA), Some(QType(65)))
        );
    }

    #[test]
    fn kubelet_resolv_conf() {
        let conf = ResolvConf::kubelet("shop", "198.19.0.53".parse().unwrap());
        assert_eq!(conf.candidates("api.partner.example")[0], "api.partner.example.shop.svc.cluster.local");
        assert_eq!(conf.candidates("api.partner.example").last().unwrap(), "api.partner.example");
        assert_eq!(conf.candidates("a.b.c.d.e.f").len(), 4);
        assert_eq!(conf.candidates("a.b.c.d.e.f")[0], "a.b.c.d.e.f");
        assert_eq!(conf.candidates("Abs.Example."), ["abs.example"]);
        assert_eq!(
            conf.text(),
            "nameserver 198.19.0.53\nsearch shop.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5 timeout:2 attempts:1\n"
        );
    }
}
