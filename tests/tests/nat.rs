//! Services behind kube-proxy's NAT in the node: a client reaches nginx in the server pod
//! through a ClusterIP (from a pod, from the node, from the server pod itself) or a NodePort
//! (from outside the node), with iptables or nftables rules, IPv4 and IPv6.
//!
//! Rule `status=500`; one keep-alive connection `/foo /bar /foo /foo` (200, 500, 200, 200) and
//! another with only 200s. The connection of the 500 is one flow whatever NAT did to it: every
//! packet of both directions from the 500 on is mirrored exactly once, in the form it has where
//! it is copied, nothing before it and nothing of the other connection; one trigger event
//! with the request (GET /bar) and its response time; the flow table lists the connection once
//! with both of its tuples; the response-time histogram counted the 500. The request behind the
//! trigger, GET /bar, is replayed to the mirror once, ahead of every copy, in the form the
//! classifier saw it in (the tuple of the client-to-server copy point), and the event carries
//! the same segment.
//!
//! The same along a bridge CNI: containerd's pods on the node's bridge (their veths its ports),
//! the ClusterIP's iptables rules passed by bridged packets (br_netfilter,
//! `bridge-nf-call-iptables`).
//!
//! Where each direction is copied (the first attached hook on its path; the outside
//! namespace's link to the node is not attached):
//!
//! | path | client to server | server to client |
//! |---|---|---|
//! | pod -> ClusterIP | client veth ingress, `client:port -> VIP:80` | server veth ingress, `pod:80 -> client:port` |
//! | node -> ClusterIP | server veth egress, `node:natport -> pod:80` | server veth ingress |
//! | outside -> NodePort | server veth egress, `node:natport -> pod:80` | server veth ingress |
//! | server pod -> its own ClusterIP | server veth ingress, `pod:port -> VIP:80` | server veth ingress, `pod:80 -> node:natport` |
//! | bridged pod -> ClusterIP | client veth ingress, `client:port -> VIP:80` | server veth ingress, `pod:80 -> client:port` |
//!
//! In the first and the last two, the data path sees the connection under two tuples; in the
//! middle two only the server's veth is on the path and it sees one.

use std::fmt;
use std::net::SocketAddr;

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{FlowKey, HistKind};
use mirror_e2e::cluster::containerd::{self, CriNode, SandboxSpec};
use mirror_e2e::oracles::nat_oracle::{self, Connection, CopyPoints, NatExpected, Point};
use mirror_e2e::oracles::oracle::{self, WantedReplay};
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, Translation, SERVICE_PORT};
use mirror_e2e::topology::netns::MIRROR_SINK;
use mirror_e2e::topology::testbed::{Testbed, TestbedBuilder};
use mirror_e2e::workload::client::{self, url};

/// Who reaches the Service, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The client pod, at the ClusterIP.
    PodToClusterIp,
    /// The node itself, at the ClusterIP (masqueraded: the node's address is not a pod's).
    NodeToClusterIp,
    /// The outside namespace, at the node's NodePort (DNAT and masquerade).
    NodePortFromOutside,
    /// The server pod, at its own Service's ClusterIP (DNAT and masquerade, back out its veth).
    Hairpin,
    /// The client pod, at the ClusterIP, both pods on the CNI bridge: the request is routed
    /// (to the bridge's address, the pods' gateway), the reply bridged.
    Bridged,
}

impl Path {
    /// Whether the client's packets cross an attached veth before NAT, so that the data path
    /// sees the connection under both of its tuples.
    fn two_tuples(self) -> bool {
        matches!(self, Path::PodToClusterIp | Path::Hairpin | Path::Bridged)
    }
}

/// A connection's two tuples, from conntrack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tuples {
    /// As the client sent it (the original direction).
    original: FlowKey,
    /// As the server sees it (the reply direction).
    reply: FlowKey,
}

impl fmt::Display for Tuples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} | {}]", self.original, self.reply)
    }
}

impl Tuples {
    fn both(&self) -> [FlowKey; 2] {
        [self.original, self.reply]
    }
}

/// The tuples of `conn`, from conntrack, checked against where the oracle saw it.
#[track_caller]
fn tuples(conn: &Connection, conntrack: &[Translation], path: Path) -> Tuples {
    let t = conntrack
        .iter()
        .find(|t| t.reply_key() == conn.to_client)
        .unwrap_or_else(|| panic!("{conn:?} is not in conntrack: {conntrack:?}"));
    assert!(t.translated(), "{path:?}: conntrack did not translate {t:?}");
    let tuples = Tuples { original: t.original_key(), reply: t.reply_key() };
    // Where the client's packets are copied they are in their original form on a two-tuple
    // path, in their reply form (after NAT) otherwise.
    let copied = if path.two_tuples() { tuples.original } else { tuples.reply };
    assert_eq!(
        conn.to_server, copied,
        "{path:?}: client-to-server packets copied as {conn:?}, conntrack {t:?}"
    );
    tuples
}

/// Pushes `msg` when `ok` is false.
fn check(failures: &mut Vec<String>, ok: bool, msg: impl FnOnce() -> String) {
    if !ok {
        failures.push(msg());
    }
}

/// The scenario of this file (see the top) along `path`, with `flavour` rules, in one family.
fn run(path: Path, flavour: Flavour, v6: bool) {
    run_on(Testbed::builder(&PODS), path, flavour, v6);
}

/// The scenario over a testbed with a "client" and a "server" pod, from `builder`: every check
/// runs and the test fails with all that differ.
fn run_on(builder: TestbedBuilder, path: Path, flavour: Flavour, v6: bool) {
    // Both pods' veths attached; the uplink to the outside namespace is not a pod's and stays bare.
    let mut bed = builder.nginx("server", HTTP).rule("status=500").build();
    bed.replay_to_sink();
    let rule = bed.rule_ids()[0];
    let kp = KubeProxy::install(bed.node(), flavour, v6, bed.pod("server").addr(v6));
    let events = bed.events();

    let (client_veth, server_veth) = (bed.pod("client").veth.as_str(), bed.pod("server").veth.as_str());
    let vip = SocketAddr::new(kp.vip(), SERVICE_PORT);
    let (client_ns, target, points) = match path {
        Path::PodToClusterIp | Path::Bridged => (
            &bed.pod("client").ns,
            vip,
            CopyPoints { to_server: Point::ingress(client_veth), to_client: Point::ingress(server_veth) },
        ),
        Path::NodeToClusterIp => (
            bed.node(),
            vip,
            CopyPoints { to_server: Point::egress(server_veth), to_client: Point::ingress(server_veth) },
        ),
        Path::NodePortFromOutside => (
            &kp.outside.ns,
            kp.node_port(),
            CopyPoints { to_server: Point::egress(server_veth), to_client: Point::ingress(server_veth) },
        ),
        Path::Hairpin => (
            &bed.pod("server").ns,
            vip,
            CopyPoints { to_server: Point::ingress(server_veth), to_client: Point::ingress(server_veth) },
        ),
    };
    let rec = nat_oracle::record(bed.node(), bed.dir.path(), &points, MIRROR_SINK, || {
        let urls = ["/foo", "/bar", "/foo", "/foo"].map(|p| url(target.ip(), target.port(), p));
        assert_eq!(client::get_keepalive(client_ns, &urls), [200, 500, 200, 200], "through {target}");
        let urls = ["/foo", "/foo"].map(|p| url(target.ip(), target.port(), p));
        assert_eq!(client::get_keepalive(client_ns, &urls), [200, 200], "through {target}");
    });

    // What the mirror must carry, and each connection's tuples (the harness's own checks).
    let expected = NatExpected::from_recording(&rec, |status, _| status == 500);
    assert_eq!(expected.connections.len(), 2, "{:?}", expected.connections);
    assert_eq!(expected.triggered.len(), 1, "{:?}", expected.triggered);
    let t = expected.triggered[0];
    // The 500, /foo and its 200, /foo and its 200, the close: at least that many.
    assert!(t.packets >= 6, "{t:?}");
    let conntrack = kp.conntrack(bed.node());
    let conns: Vec<Tuples> = expected.connections.iter().map(|c| tuples(c, &conntrack, path)).collect();

    let mut failures = Vec::new();
    // (i) The mirror: both directions from the 500 on, once each, in their copied form.
    if let Err(diff) = expected.compare_mirror(&rec.mirror) {
        failures.push(format!("mirror: {diff}"));
    }
    let c = bed.counters();
    check(&mut failures, c.get(stat_idx::STAT_TRIGGERS) == 1, || format!("triggers: {c:?}"));
    check(&mut failures, c.get(stat_idx::STAT_MIRRORED_PACKETS) == rec.mirror.packets.len() as u64, || {
        format!(
            "mirrored packets counted {}, on the sink {}",
            c.get(stat_idx::STAT_MIRRORED_PACKETS),
            rec.mirror.packets.len()
        )
    });
    check(
        &mut failures,
        c.get(stat_idx::STAT_MIRROR_ERRORS) == 0 && c.get(stat_idx::STAT_MIRROR_NO_TARGET) == 0,
        || format!("copy errors: {c:?}"),
    );
    let hits: u64 = bed.dp.rules().expect("reading rules").iter().map(|r| r.hits).sum();
    check(&mut failures, hits == 1, || format!("rule hits {hits}"));

    // (ii) The request behind the trigger, replayed once ahead of every copy, as it was where
    // the classifier saw it (the client-to-server copy point).
    let (segment, line) = expected.request_behind(&rec, &t).unwrap_or_else(|e| panic!("the oracle: {e}"));
    assert_eq!(line, "GET /bar ", "the oracle's request behind the 500");
    let conn = expected.connections[t.conn];
    // (The NAT oracle reads no packets near the trigger: only a client's ACK may come first.)
    let want =
        WantedReplay { keys: &[conn.to_server, conn.to_client], segment: &segment, line: &line, near: &[] };
    let replay = oracle::check_replay(&rec.mirror, &want).map_err(|e| failures.push(e)).ok();
    check(&mut failures, rec.mirror.replayed.len() == 1, || {
        let all: Vec<String> = rec.mirror.replayed.iter().map(|r| format!("\n  {}", r.packet.id())).collect();
        format!("{} replays on the sink, one expected:{}", all.len(), all.concat())
    });
    check(&mut failures, rec.mirror.replayed.iter().all(|r| r.after_copies == 0), || {
        let after: Vec<usize> = rec.mirror.replayed.iter().map(|r| r.after_copies).collect();
        format!("a replay came after copies: {after:?} copies before each")
    });
    let replays = (
        c.get(stat_idx::STAT_REPLAYED),
        c.get(stat_idx::STAT_REPLAY_MISSED),
        c.get(stat_idx::STAT_REPLAY_FAILED),
    );
    check(&mut failures, replays == (1, 0, 0), || {
        format!("replayed, missed, failed counted {replays:?}, (1, 0, 0) expected")
    });

    // (iii) One trigger event, with the request seen under the other tuple, its response time
    // and the segment replayed.
    let ev = events.take();
    match ev.as_slice() {
        [e] => {
            let carried = e.request.as_ref().and_then(|r| r.payload());
            let replayed = replay.map(|r| &r.packet.payload[..]);
            check(&mut failures, carried.is_some() && carried == replayed, || {
                let show = |p: Option<&[u8]>| p.map(|p| String::from_utf8_lossy(p).into_owned());
                format!("the event carries {:?}, the sink got {:?}", show(carried), show(replayed))
            });
            check(&mut failures, (e.rule_id, e.status) == (rule, 500), || format!("event: {e:?}"));
            check(
                &mut failures,
                (e.method.as_deref(), e.target.as_deref()) == (Some("GET"), Some("/bar")),
                || format!("event without the request: method {:?} target {:?}", e.method, e.target),
            );
            check(&mut failures, e.request_to_response.is_some(), || {
                format!("event without a response time: {e:?}")
            });
            failures.extend(nat_api::check_event(e, &conns[t.conn], path.two_tuples()));
        }
        _ => failures.push(format!("{} trigger events, one expected: {ev:?}", ev.len())),
    }

    // (iv) The flow table: the connection once, with both tuples, marked.
    let flows = bed.dp.flows().expect("reading flows");
    failures.extend(nat_api::check_flows(&flows, &conns, t.conn, t.packets, path.two_tuples()));

    // (v) The 500's response time was measured.
    let counted = bed.histogram(HistKind::HttpResponse, Some(5)).map_or(0, |h| h.count);
    check(&mut failures, counted == 1, || format!("5xx response times counted: {counted}, 1 expected"));

    let family = if v6 { "IPv6" } else { "IPv4" };
    assert!(
        failures.is_empty(),
        "{path:?} through {target} ({flavour:?}, {family}): {} failure(s); connections [original | reply]: \
         {}; nearest client-to-server packet {:?} ns from the trigger\n\n{}",
        failures.len(),
        conns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        t.nearest_to_server_ns,
        failures.join("\n\n")
    );
}

/// What the NAT-aware flow table and trigger events must show. `Flow::nat` and
/// `TriggerEvent::nat` name a connection's other tuple when conntrack translated it; `Flow::key`
/// is then its original (client-side) tuple and `nat` the reply (server-side) one. Every
/// assertion on those fields is here.
mod nat_api {
    use mirror_bpf::{Flow, FlowKey, TriggerEvent};

    use super::Tuples;

    /// On a two-tuple path: the event names both tuples. Otherwise: the tuple the server's
    /// veth saw alone, or both if the data path looked conntrack up.
    pub fn check_event(e: &TriggerEvent, conn: &Tuples, two_tuples: bool) -> Option<String> {
        let named = (e.key, e.nat);
        let both = named == (conn.original, Some(conn.reply)) || named == (conn.reply, Some(conn.original));
        let ok = both || (!two_tuples && named == (conn.reply, None));
        (!ok).then(|| format!("event names key {} nat {}, connection {conn}", e.key, show(e.nat)))
    }

    /// Each connection is listed once (no other flow has either of its tuples), keyed by its
    /// original tuple with the reply one in `nat`; on a one-tuple path, keying by the reply
    /// tuple alone is accepted too. `triggered` is marked by status 500 with `packets`
    /// mirrored; the others are not marked.
    pub fn check_flows(
        flows: &[Flow],
        conns: &[Tuples],
        triggered: usize,
        packets: u64,
        two_tuples: bool,
    ) -> Vec<String> {
        let mut failures = Vec::new();
        let names = |f: &Flow, k: FlowKey| f.key == k || f.nat == Some(k);
        for (i, c) in conns.iter().enumerate() {
            let listed: Vec<&Flow> = flows.iter().filter(|f| c.both().iter().any(|k| names(f, *k))).collect();
            let [f] = listed.as_slice() else {
                let listed: Vec<String> = listed.iter().map(|f| format!("\n  {}", describe(f))).collect();
                failures.push(format!("connection {c} is listed {} times:{}", listed.len(), listed.concat()));
                continue;
            };
            let keyed = (f.key, f.nat) == (c.original, Some(c.reply))
                || (!two_tuples && (f.key, f.nat) == (c.reply, None));
            if !keyed {
                failures.push(format!("connection {c} listed as {}", describe(f)));
            }
            let mark = f.mark.map(|m| (m.status, m.packets, m.ended));
            if i == triggered && mark != Some((500, packets, false)) {
                failures.push(format!(
                    "connection {c:?}: mark {:?}, expected status 500, {packets} packets",
                    f.mark
                ));
            }
            if i != triggered && f.mark.is_some() {
                failures.push(format!("connection {c} never triggered but is marked: {:?}", f.mark));
            }
        }
        failures
    }

    fn show(k: Option<FlowKey>) -> String {
        k.map_or("none".to_string(), |k| k.to_string())
    }

    fn describe(f: &Flow) -> String {
        let (fw, rv) = (&f.forward, &f.reverse);
        format!(
            "key {} nat {}: {}+{} packets, mark {:?}, {} responses timed",
            f.key,
            show(f.nat),
            fw.packets,
            rv.packets,
            f.mark.map(|m| (m.status, m.packets)),
            f.http_timed
        )
    }
}

#[test]
fn pod_to_cluster_ip_iptables_ipv4_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::PodToClusterIp, Flavour::Iptables, false);
}

#[test]
fn pod_to_cluster_ip_nftables_ipv4_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::PodToClusterIp, Flavour::Nftables, false);
}

#[test]
fn pod_to_cluster_ip_iptables_ipv6_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::PodToClusterIp, Flavour::Iptables, true);
}

#[test]
fn pod_to_cluster_ip_nftables_ipv6_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::PodToClusterIp, Flavour::Nftables, true);
}

#[test]
fn node_to_cluster_ip_iptables_ipv4_is_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::NodeToClusterIp, Flavour::Iptables, false);
}

#[test]
fn node_port_from_outside_iptables_ipv4_is_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::NodePortFromOutside, Flavour::Iptables, false);
}

#[test]
fn node_port_from_outside_nftables_ipv6_is_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::NodePortFromOutside, Flavour::Nftables, true);
}

#[test]
fn hairpin_iptables_ipv4_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::Hairpin, Flavour::Iptables, false);
}

#[test]
fn hairpin_nftables_ipv4_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    run(Path::Hairpin, Flavour::Nftables, false);
}

/// Pods of containerd on the CNI bridge (`mirror_e2e::cluster::containerd`), a ClusterIP's
/// iptables rules in front of the server pod, bridged packets through them: one flow, its 500's
/// request replayed first and once.
#[test]
fn bridged_pod_to_cluster_ip_iptables_ipv4_is_one_flow_mirrored_from_the_500_on() {
    if !require_root() || !containerd::available() {
        return;
    }
    let node = CriNode::start();
    let server = node.run_pod(&SandboxSpec::new("web-0", "shop", 1, &[("app", "web")]));
    let client = node.run_pod(&SandboxSpec::new("curl-0", "tools", 2, &[("app", "curl")]));
    let bridged = node.node.sh(&format!("ip -o link show master {}", containerd::BRIDGE));
    for p in [&server, &client] {
        assert!(
            bridged.contains(&format!(" {}@", p.pod.veth)),
            "{} is not a port of the bridge: {bridged}",
            p.pod.veth
        );
    }
    assert_eq!(
        node.node.sh("sysctl -n net.bridge.bridge-nf-call-iptables").trim(),
        "1",
        "bridged packets skip iptables"
    );
    let topo = node.topology(&[("client", &client), ("server", &server)]);
    run_on(Testbed::builder_on(topo), Path::Bridged, Flavour::Iptables, false);
}
