//! `mirror.tunnel` and `mirror.budget`: a sink that carries the copies off the node to a
//! collector (VXLAN, Geneve, GRE or ERSPAN), and the node-wide ceiling on what is copied.

use std::net::IpAddr;

use serde::Deserialize;

use super::{err, ConfigError, SinkCreate};

/// `mirror.tunnel:` the far end of a tunnel sink (`create: vxlan | geneve | gretap | erspan`).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Tunnel {
    /// The collector's address (required with a tunnel sink).
    pub remote: Option<IpAddr>,
    /// The source address of the encapsulated packets (default: as routed).
    pub local: Option<IpAddr>,
    /// VNI (vxlan, geneve: 0-16777215), GRE key (gretap), session id (erspan: 0-1023).
    pub id: u32,
    /// Destination UDP port (vxlan, geneve); 0: the IANA port (4789, 6081).
    pub port: u16,
}

impl SinkCreate {
    /// Whether the sink is a tunnel to a collector.
    pub fn is_tunnel(self) -> bool {
        matches!(self, SinkCreate::Vxlan | SinkCreate::Geneve | SinkCreate::Gretap | SinkCreate::Erspan)
    }

    /// The link kind the kernel knows it by.
    pub fn link_kind(self) -> &'static str {
        match self {
            SinkCreate::Auto | SinkCreate::Dummy => "dummy",
            SinkCreate::Veth => "veth",
            SinkCreate::Vxlan => "vxlan",
            SinkCreate::Geneve => "geneve",
            SinkCreate::Gretap => "gretap",
            SinkCreate::Erspan => "erspan",
            SinkCreate::None => "none",
        }
    }
}

impl Tunnel {
    /// The UDP port (vxlan, geneve), the IANA one unless set.
    pub fn udp_port(&self, kind: SinkCreate) -> u16 {
        match (self.port, kind) {
            (0, SinkCreate::Geneve) => 6081,
            (0, _) => 4789,
            (p, _) => p,
        }
    }

    /// Bytes the encapsulation adds in front of the copy (outer IP, UDP or GRE, tunnel header,
    /// inner Ethernet).
    pub fn overhead(&self, kind: SinkCreate) -> u32 {
        let ip = if self.remote.is_some_and(|r| r.is_ipv6()) { 40 } else { 20 };
        ip + match kind {
            // UDP 8 + VXLAN 8 + Ethernet 14; Geneve's base header is as long.
            SinkCreate::Vxlan | SinkCreate::Geneve => 30,
            // GRE with key 8 + Ethernet 14.
            SinkCreate::Gretap => 22,
            // GRE with sequence 8 + ERSPAN type II 8 + Ethernet 14.
            SinkCreate::Erspan => 30,
            _ => 0,
        }
    }

    /// The MTU of the tunnel sink: as large as the configured one, within what the
    /// encapsulated packet can have (65535 bytes of outer IP).
    pub fn mtu(&self, kind: SinkCreate, configured: u32) -> u32 {
        configured.min(65535 - self.overhead(kind))
    }

    /// Checks the section against the sink kind.
    pub(super) fn validate(&self, create: SinkCreate) -> Result<(), ConfigError> {
        let kind = create.link_kind();
        if !create.is_tunnel() {
            if *self != Tunnel::default() {
                return Err(err(
                    "mirror.tunnel",
                    "only used with create: vxlan, geneve, gretap or erspan (a sink that carries the \
                     copies to a collector)",
                ));
            }
            return Ok(());
        }
        let Some(remote) = self.remote else {
            return Err(err("mirror.tunnel.remote", format!("create: {kind} needs the collector's address")));
        };
        if remote.is_unspecified() || remote.is_multicast() {
            return Err(err("mirror.tunnel.remote", format!("{remote}: a unicast address of the collector")));
        }
        if let Some(local) = self.local {
            if local.is_ipv6() != remote.is_ipv6() {
                return Err(err(
                    "mirror.tunnel.local",
                    format!("{local} is not of the family of remote {remote}"),
                ));
            }
        }
        if remote.is_ipv6() && matches!(create, SinkCreate::Gretap | SinkCreate::Erspan) {
            return Err(err(
                "mirror.tunnel.remote",
                format!("{remote}: create: {kind} carries IPv4 only here (use vxlan or geneve over IPv6)"),
            ));
        }
        let max_id = match create {
            SinkCreate::Vxlan | SinkCreate::Geneve => 0xff_ffff,
            SinkCreate::Erspan => 1023,
            _ => u32::MAX,
        };
        if self.id > max_id {
            return Err(err(
                "mirror.tunnel.id",
                format!("{} is above {max_id}, the largest {kind} id", self.id),
            ));
        }
        if self.port != 0 && !matches!(create, SinkCreate::Vxlan | SinkCreate::Geneve) {
            return Err(err("mirror.tunnel.port", format!("create: {kind} has no UDP port")));
        }
        Ok(())
    }
}

/// `mirror.budget:` what the node copies at most, over all flows and interfaces, so that an
/// error storm cannot flood the collector's link. Split evenly over the CPUs (each keeps a
/// token bucket of its own, no shared writes); copies beyond it are counted, not made.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Copies per second (0: no limit).
    pub packets_per_second: u64,
    /// Bytes of copies per second (0: no limit).
    pub bytes_per_second: u64,
}

impl Budget {
    /// Checks the section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        // The data path counts in nano-packets and nano-bytes: 64-bit within these.
        for (key, v, max) in [
            ("packets_per_second", self.packets_per_second, 1_000_000_000),
            ("bytes_per_second", self.bytes_per_second, 10_000_000_000),
        ] {
            if v > max {
                return Err(err(format!("mirror.budget.{key}"), format!("{v}: at most {max} (0: no limit)")));
            }
        }
        Ok(())
    }
}
