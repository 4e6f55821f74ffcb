//! kube-proxy's Service NAT in the node namespace: one Service, reachable at a ClusterIP and,
//! for the ports that have one, at a NodePort, whose one endpoint is a pod; in the iptables
//! flavour (chains `KUBE-SERVICES`, `KUBE-SVC-*`, `KUBE-SEP-*`, `KUBE-MARK-MASQ`,
//! `KUBE-POSTROUTING`, as kube-proxy's iptables mode writes them) or the nftables one (a
//! `kube-proxy` table in the manner of its nftables mode), for IPv4 or IPv6. The Service is
//! [`Service::web`] (`VIP:80` and `node:30080` over TCP, to the pod's port 80) unless another
//! is given, such as [`Service::kube_dns`] (UDP and TCP port 53, as the cluster's DNS Service).
//!
//! The node also gets an uplink, `ext0`, to an "outside" namespace: the node's address on it is
//! its node IP (the NodePort's address and the source of its own connections to ClusterIPs),
//! and the Service range is routed to it, as a node's default route would take it. The uplink
//! is not a pod's veth and is never attached.
//!
//! Masquerading follows kube-proxy: a NodePort connection is always masqueraded (to the node's
//! address towards the pod), a ClusterIP connection when its source is outside the cluster
//! range (the node's own connections) or is the endpoint itself (hairpin). A pod reaching
//! itself through its Service needs nothing else on a routed veth: the packet goes back out
//! the link it came from, with the node's address as its source (without masquerade it would
//! carry the pod's own address and the pod would drop it as a martian). ICMP redirects the node
//! would send about such a packet are turned off (IPv4; IPv6 has no such switch, and the pod
//! ignores a redirect to itself).
//!
//! Works with iptables-nft and iptables-legacy alike; only the node namespace is touched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use mirror_bpf::FlowKey;

use crate::topology::netns::Netns;

/// The web Service's port on its ClusterIP, and the endpoint's port.
pub const SERVICE_PORT: u16 = 80;
/// The web Service's NodePort.
pub const NODE_PORT: u16 = 30080;
/// The web Service's ClusterIP (IPv4), in the Service range 198.19.0.0/16.
pub const VIP4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
/// The web Service's ClusterIP (IPv6), in the Service range 2001:2:0:ff::/64.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0xff, 0, 0, 0, 0x10);
/// The DNS Service's port, over UDP and TCP.
pub const DNS_PORT: u16 = 53;
/// The DNS Service's ClusterIP (IPv4).
pub const DNS_VIP4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 53);
/// The DNS Service's ClusterIP (IPv6).
pub const DNS_VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0xff, 0, 0, 0, 0x53);
/// The node's uplink, to the outside namespace.
pub const UPLINK: &str = "ext0";

const SERVICE_RANGE4: &str = "198.19.0.0/16";
const SERVICE_RANGE6: &str = "2001:2:0:ff::/64";
/// Pods are 198.18.i.2 and 2001:2:0:i::2 with small i; the uplink (i = 200) is outside.
const CLUSTER_RANGE4: &str = "198.18.0.0/17";
const CLUSTER_RANGE6: &str = "2001:2::/57";
/// The uplink's subnet number.
const UPLINK_NET: u8 = 200;
/// kube-proxy's masquerade mark.
const MASQ_MARK: &str = "0x4000";

/// Which kube-proxy mode writes the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `iptables -t nat` / `ip6tables -t nat` chains.
    Iptables,
    /// An `nft` table of family `ip` / `ip6`.
    Nftables,
}

/// A transport protocol of a Service's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl L4 {
    /// Its name in iptables, nft and conntrack: `tcp`, `udp`.
    pub fn name(self) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
        }
    }

    /// Its IP protocol number, as flow keys carry it.
    pub fn number(self) -> u8 {
        match self {
            L4::Tcp => 6,
            L4::Udp => 17,
        }
    }
}

/// One port of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePort {
    /// Its protocol.
    pub l4: L4,
    /// The port on the ClusterIP.
    pub port: u16,
    /// The endpoint's port.
    pub target: u16,
    /// The node's port that reaches it from outside, if any.
    pub node_port: Option<u16>,
}

/// A Service: its name (in its chains' names), ClusterIPs and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Upper case letters and digits, short: chain names carry it.
    pub name: &'static str,
    /// Its ClusterIP, IPv4.
    pub vip4: Ipv4Addr,
    /// Its ClusterIP, IPv6.
    pub vip6: Ipv6Addr,
    /// Its ports.
    pub ports: Vec<ServicePort>,
}

impl Service {
    /// The web Service: [`VIP4`]/[`VIP6`] port [`SERVICE_PORT`] over TCP to the endpoint's port
    /// 80, and [`NODE_PORT`].
    pub fn web() -> Service {
        Service {
            name: "WEB",
            vip4: VIP4,
            vip6: VIP6,
            ports: vec![ServicePort {
                l4: L4::Tcp,
                port: SERVICE_PORT,
                target: SERVICE_PORT,
                node_port: Some(NODE_PORT),
            }],
        }
    }

    /// The cluster's DNS Service, as kube-dns is: [`DNS_VIP4`]/[`DNS_VIP6`] port [`DNS_PORT`]
    /// over UDP and over TCP, to the endpoint's port 53; no NodePort.
    pub fn kube_dns() -> Service {
        let port = |l4| ServicePort { l4, port: DNS_PORT, target: DNS_PORT, node_port: None };
        Service { name: "DNS", vip4: DNS_VIP4, vip6: DNS_VIP6, ports: vec![port(L4::Udp), port(L4::Tcp)] }
    }
}

/// A namespace outside the node, joined to it by the uplink.
pub struct Outside {
    /// Its namespace.
    pub ns: Netns,
    /// Its address on the uplink.
    pub v4: Ipv4Addr,
    /// Its IPv6 address on the uplink.
    pub v6: Ipv6Addr,
    /// The node's address on the uplink: its node IP.
    pub node4: Ipv4Addr,
    /// The node's IPv6 address on the uplink.
    pub node6: Ipv6Addr,
}

impl Outside {
    fn new(node: &Netns) -> Outside {
        let n = UPLINK_NET;
        let out = Outside {
            ns: Netns::new("outside"),
            v4: Ipv4Addr::new(198, 18, n, 2),
            v6: Ipv6Addr::new(0x2001, 2, 0, u16::from(n), 0, 0, 0, 2),
            node4: Ipv4Addr::new(198, 18, n, 1),
            node6: Ipv6Addr::new(0x2001, 2, 0, u16::from(n), 0, 0, 0, 1),
        };
        let Outside { v4, v6, node4, node6, .. } = &out;
        node.sh(&format!(
            "ip link add {UPLINK} type veth peer name eth0 netns {ns} \
             && ip addr add {node4}/24 dev {UPLINK} && ip addr add {node6}/64 dev {UPLINK} nodad \
             && ip link set {UPLINK} up \
             && ip route add {SERVICE_RANGE4} via {v4} && ip -6 route add {SERVICE_RANGE6} via {v6}",
            ns = out.ns.name()
        ));
        out.ns.sh(&format!(
            "ip addr add {v4}/24 dev eth0 && ip addr add {v6}/64 dev eth0 nodad && ip link set eth0 up \
             && ip route add default via {node4} && ip -6 route add default via {node6}"
        ));
        out
    }

    /// Its address in the family asked for.
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.v6)
        } else {
            IpAddr::V4(self.v4)
        }
    }

    /// The node's address on the uplink in the family asked for.
    pub fn node_addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.node6)
        } else {
            IpAddr::V4(self.node4)
        }
    }
}

/// One connection (or UDP exchange) as conntrack translated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// Its IP protocol number.
    pub proto: u8,
    /// The original direction as the client sent it: (source, destination).
    pub original: (SocketAddr, SocketAddr),
    /// The reply direction as the server sends it: (source, destination).
    pub reply: (SocketAddr, SocketAddr),
}

impl Translation {
    /// The tuple the client side sees.
    pub fn original_key(&self) -> FlowKey {
        FlowKey::new(self.original.0, self.original.1, self.proto)
    }

    /// The tuple the server side sees.
    pub fn reply_key(&self) -> FlowKey {
        FlowKey::new(self.reply.0, self.reply.1, self.proto)
    }

    /// Whether NAT changed anything.
    pub fn translated(&self) -> bool {
        self.original != (self.reply.1, self.reply.0)
    }
}

/// kube-proxy's rules for one Service, installed in a node namespace.
pub struct KubeProxy {
    /// The uplink's other end.
    pub outside: Outside,
    /// Which rules.
    pub flavour: Flavour,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// The Service's endpoint (at each port's `target`).
    pub endpoint: IpAddr,
    /// The Service.
    pub service: Service,
}

impl KubeProxy {
    /// Adds the uplink and the outside namespace to `node`, and the web Service
    /// ([`Service::web`]) with one `endpoint` (a pod's address, of the family `v6` says) in
    /// `flavour`.
    pub fn install(node: &Netns, flavour: Flavour, v6: bool, endpoint: IpAddr) -> KubeProxy {
        KubeProxy::install_service(node, flavour, v6, endpoint, Service::web())
    }

    /// Like [`KubeProxy::install`] with another Service.
    pub fn install_service(
        node: &Netns,
        flavour: Flavour,
        v6: bool,
        endpoint: IpAddr,
        service: Service,
    ) -> KubeProxy {
        assert_eq!(endpoint.is_ipv6(), v6, "the endpoint {endpoint} is not of the Service's family");
        assert!(!service.ports.is_empty(), "the Service {} has no port", service.name);
        let outside = Outside::new(node);
        // Redirects about hairpin packets: not needed, only noise on the pod's link.
        node.sh("for f in /proc/sys/net/ipv4/conf/*/send_redirects; do echo 0 > $f; done");
        let kp = KubeProxy { outside, flavour, v6, endpoint, service };
        let rules = match flavour {
            Flavour::Iptables => kp.iptables(),
            Flavour::Nftables => kp.nftables(),
        };
        node.sh(&rules);
        kp
    }

    /// The ClusterIP.
    pub fn vip(&self) -> IpAddr {
        if self.v6 {
            IpAddr::V6(self.service.vip6)
        } else {
            IpAddr::V4(self.service.vip4)
        }
    }

    /// The address and port of the (first) NodePort (the node's address on the uplink).
    #[track_caller]
    pub fn node_port(&self) -> SocketAddr {
        let port = self.service.ports.iter().find_map(|p| p.node_port);
        let port = port.unwrap_or_else(|| panic!("the Service {} has no NodePort", self.service.name));
        SocketAddr::new(self.outside.node_addr(self.v6), port)
    }

    fn cluster_range(&self) -> &'static str {
        if self.v6 {
            CLUSTER_RANGE6
        } else {
            CLUSTER_RANGE4
        }
    }

    /// The commands of kube-proxy's iptables mode (`-j DNAT --to-destination`, `MASQUERADE`):
    /// per port of the Service a `KUBE-SVC-<name>-<PROTO><port>` chain and its endpoint's
    /// `KUBE-SEP-...`, and a `KUBE-EXT-...` for its NodePort.
    fn iptables(&self) -> String {
        let ipt = if self.v6 { "ip6tables -w -t nat" } else { "iptables -w -t nat" };
        let (vip, ep, cluster) = (self.vip(), self.endpoint, self.cluster_range());
        let mut chains: Vec<String> =
            ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"]
                .map(String::from)
                .into();
        let mut rules = vec![
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING"
                .to_string(),
            format!("-A KUBE-MARK-MASQ -j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}"),
            format!("-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-A KUBE-POSTROUTING -j MARK --set-xmark {MASQ_MARK}/0x0"),
            "-A KUBE-POSTROUTING -j MASQUERADE --random-fully".to_string(),
        ];
        for p in &self.service.ports {
            let (l4, port) = (p.l4.name(), p.port);
            let id = format!("{}-{}{port}", self.service.name, l4.to_uppercase());
            let (svc, ext, sep) =
                (format!("KUBE-SVC-{id}"), format!("KUBE-EXT-{id}"), format!("KUBE-SEP-{id}"));
            let to = SocketAddr::new(ep, p.target);
            rules.extend([
                format!("-A KUBE-SERVICES -d {vip} -p {l4} -m {l4} --dport {port} -j {svc}"),
                format!("-A {svc} ! -s {cluster} -d {vip} -p {l4} -m {l4} --dport {port} -j KUBE-MARK-MASQ"),
                format!("-A {svc} -j {sep}"),
                format!("-A {sep} -s {ep} -j KUBE-MARK-MASQ"),
                format!("-A {sep} -p {l4} -m {l4} -j DNAT --to-destination {to}"),
            ]);
            if let Some(node_port) = p.node_port {
                rules.extend([
                    format!("-A KUBE-NODEPORTS -p {l4} -m {l4} --dport {node_port} -j {ext}"),
                    format!("-A {ext} -j KUBE-MARK-MASQ"),
                    format!("-A {ext} -j {svc}"),
                ]);
                chains.push(ext);
            }
            chains.extend([svc, sep]);
        }
        rules.push("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS".to_string());
        let mut cmds: Vec<String> = chains.iter().map(|c| format!("{ipt} -N {c}")).collect();
        cmds.extend(rules.iter().map(|r| format!("{ipt} {r}")));
        cmds.join(" && ")
    }

    /// A ruleset in the manner of kube-proxy's nftables mode, loaded with `nft -f -`: per port
    /// of the Service a `service-<name>-<proto><port>` chain and its endpoint's
    /// `endpoint-...`, and an `external-...` for its NodePort.
    fn nftables(&self) -> String {
        let (family, ip) = if self.v6 { ("ip6", "ip6") } else { ("ip", "ip") };
        let (vip, ep, cluster) = (self.vip(), self.endpoint, self.cluster_range());
        let (mut services, mut chains) = (Vec::new(), Vec::new());
        for p in &self.service.ports {
            let (l4, port) = (p.l4.name(), p.port);
            let id = format!("{}-{l4}{port}", self.service.name.to_lowercase());
            let to = SocketAddr::new(ep, p.target);
            services.push(format!("        {ip} daddr {vip} {l4} dport {port} goto service-{id}"));
            chains.push(format!(
                r#"    chain service-{id} {{
        {ip} daddr {vip} {l4} dport {port} {ip} saddr != {cluster} jump mark-for-masquerade
        goto endpoint-{id}
    }}
    chain endpoint-{id} {{
        {ip} saddr {ep} jump mark-for-masquerade
        meta l4proto {l4} dnat to {to}
    }}"#
            ));
            if let Some(node_port) = p.node_port {
                services
                    .push(format!("        fib daddr type local {l4} dport {node_port} goto external-{id}"));
                chains.push(format!(
                    r#"    chain external-{id} {{
        jump mark-for-masquerade
        goto service-{id}
    }}"#
                ));
            }
        }
        let (services, chains) = (services.join("\n"), chains.join("\n"));
        format!(
            r#"nft -f - <<'EOF'
table {family} kube-proxy {{
    chain mark-for-masquerade {{
        meta mark set meta mark or {MASQ_MARK}
    }}
    chain masquerading {{
        meta mark & {MASQ_MARK} == 0 return
        meta mark set meta mark xor {MASQ_MARK}
        masquerade fully-random
    }}
    chain nat-prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        jump services
    }}
    chain nat-output {{
        type nat hook output priority -100; policy accept;
        jump services
    }}
    chain nat-postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        jump masquerading
    }}
    chain services {{
{services}
    }}
{chains}
}}
EOF"#
        )
    }

    /// The node's TCP connections as conntrack holds them (closed ones linger in TIME_WAIT).
    pub fn conntrack(&self, node: &Netns) -> Vec<Translation> {
        self.conntrack_of(node, L4::Tcp)
    }

    /// The node's connections of protocol `l4` as conntrack holds them (UDP ones until they
    /// time out).
    pub fn conntrack_of(&self, node: &Netns, l4: L4) -> Vec<Translation> {
        let family = if self.v6 { "ipv6" } else { "ipv4" };
        node.sh(&format!("conntrack -L -f {family} -p {} 2>/dev/null", l4.name()))
            .lines()
            .filter_map(parse_conntrack)
            .collect()
    }
}

/// `tcp 6 119 TIME_WAIT src=A dst=B sport=P dport=Q src=C dst=D sport=R dport=S [ASSURED] ...`
/// (`udp 17 29 src=...` for UDP: no state).
fn parse_conntrack(line: &str) -> Option<Translation> {
    let proto = line.split_whitespace().nth(1)?.parse().ok()?;
    let fields: Vec<(&str, &str)> = line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
    let value = |key: &str, nth: usize| fields.iter().filter(|(k, _)| *k == key).nth(nth).map(|(_, v)| *v);
    let end = |addr: &str, port: &str, nth: usize| -> Option<SocketAddr> {
        Some(SocketAddr::new(value(addr, nth)?.parse().ok()?, value(port, nth)?.parse().ok()?))
    };
    Some(Translation {
        proto,
        original: (end("src", "sport", 0)?, end("dst", "dport", 0)?),
        reply: (end("src", "sport", 1)?, end("dst", "dport", 1)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_lines_are_parsed() {
        let t = parse_conntrack(
            "tcp      6 119 TIME_WAIT src=198.18.2.2 dst=198.19.0.10 sport=43930 dport=80 \
             src=198.18.2.2 dst=198.18.2.1 sport=80 dport=35639 [ASSURED] mark=0 use=1",
        )
        .unwrap();
        assert_eq!(t.original, ("198.18.2.2:43930".parse().unwrap(), "198.19.0.10:80".parse().unwrap()));
        assert_eq!(t.reply, ("198.18.2.2:80".parse().unwrap(), "198.18.2.1:35639".parse().unwrap()));
        assert!(t.translated());
        assert_eq!(t.proto, 6);
        let t6 = parse_conntrack(
            "tcp 6 119 TIME_WAIT src=2001:2:0:1::2 dst=2001:2:0:2::2 sport=1 dport=80 \
             src=2001:2:0:2::2 dst=2001:2:0:1::2 sport=80 dport=1 [ASSURED] mark=0 use=1",
        )
        .unwrap();
        assert!(!t6.translated());
        assert_eq!(parse_conntrack("conntrack v1.4.7: 0 flow entries have been shown."), None);
        let udp = parse_conntrack(
            "udp      17 28 src=198.18.1.2 dst=198.19.0.53 sport=40001 dport=53 \
             src=198.18.2.2 dst=198.18.1.2 sport=53 dport=40001 mark=0 use=1",
        )
        .unwrap();
        assert_eq!(udp.proto, 17);
        assert_eq!(udp.original_key(), FlowKey::new(udp.original.0, udp.original.1, 17));
        assert!(udp.translated());
    }
}
