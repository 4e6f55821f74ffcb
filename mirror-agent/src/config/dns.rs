//! `dns:` which server ports the data path follows DNS on (the `dns` protocol program): the
//! `dns=` rules and, with `latency.dns`, the answer times and response codes.

use serde::Deserialize;

use mirror_bpf::settings::{DNS_PORTS, DNS_PORTS_MAX};

use super::{err, ConfigError};

/// `dns:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Dns {
    /// The server ports DNS is followed on, over UDP and TCP: 1 to 8 of them, each 1-65535
    /// (read wide, so that a port out of range is refused by name, not by type).
    pub ports: Vec<i64>,
}

impl Default for Dns {
    fn default() -> Self {
        Self { ports: DNS_PORTS.iter().map(|p| i64::from(*p)).collect() }
    }
}

impl Dns {
    /// The ports, checked by [`Dns::validate`].
    pub fn port_list(&self) -> Vec<u16> {
        self.ports.iter().filter_map(|p| u16::try_from(*p).ok()).collect()
    }

    /// Every port within 1-65535, once each, 1 to 8 of them.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.ports.is_empty() {
            return Err(err(
                "dns.ports",
                format!("empty: give 1 to {DNS_PORTS_MAX} ports (leave the dns protocol out to follow none)"),
            ));
        }
        if self.ports.len() > DNS_PORTS_MAX {
            return Err(err(
                "dns.ports",
                format!("{} ports, more than the {DNS_PORTS_MAX} the data path follows", self.ports.len()),
            ));
        }
        for (i, p) in self.ports.iter().enumerate() {
            if !(1..=65535).contains(p) {
                return Err(err(format!("dns.ports[{i}]"), format!("{p} is outside 1-65535")));
            }
            if self.ports[..i].contains(p) {
                return Err(err(format!("dns.ports[{i}]"), format!("{p} is given twice")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_refused;
    use super::super::Config;

    #[test]
    fn ports_default_to_53_and_are_checked() {
        assert_eq!(Config::default().dns.port_list(), [53]);
        let cfg = Config::parse("dns:\n  ports: [53, 5353]\n").unwrap();
        assert_eq!(cfg.dns.port_list(), [53, 5353]);
        assert_refused(&[
            ("dns:\n  ports: []\n", "dns.ports", "empty: give 1 to 8 ports"),
            ("dns:\n  ports: [1, 2, 3, 4, 5, 6, 7, 8, 9]\n", "dns.ports", "9 ports, more than the 8"),
            ("dns:\n  ports: [53, 0]\n", "dns.ports[1]", "0 is outside 1-65535"),
            ("dns:\n  ports: [70000]\n", "dns.ports[0]", "70000 is outside 1-65535"),
            ("dns:\n  ports: [-53]\n", "dns.ports[0]", "-53 is outside 1-65535"),
            ("dns:\n  ports: [53, 5353, 53]\n", "dns.ports[2]", "53 is given twice"),
            ("dns:\n  ports: 53\n", "dns.ports", "invalid type"),
            ("dns:\n  port: [53]\n", "dns.port", "unknown field `port`"),
        ]);
    }

    #[test]
    fn the_dns_group_is_on_by_default_and_switched_by_its_key() {
        use crate::groups::Group;
        use mirror_bpf::TimingGroup;
        let dns = |cfg: &Config| {
            cfg.latency.groups().into_iter().find(|(g, _)| *g == Group::Timing(TimingGroup::Dns))
        };
        assert_eq!(dns(&Config::default()), Some((Group::Timing(TimingGroup::Dns), true)));
        let off = Config::parse("latency:\n  dns: false\n").unwrap();
        assert_eq!(dns(&off), Some((Group::Timing(TimingGroup::Dns), false)));
    }
}
