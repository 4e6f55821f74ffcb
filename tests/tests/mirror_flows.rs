//! Which flows are mirrored, and from where: keep-alive and fresh connections, pod and node
//! clients and servers, nginx and python, IPv4 and IPv6, exact, class, range and port rules,
//! triggers seen at egress, large responses, the per-flow budget.

use std::net::IpAddr;

use mirror_bpf::testing::{ifindex, require_root};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{keepalive_pod_to_pod, large_500_response, ALT, HTTP, PODS};
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::client::{self, url};

#[test]
fn keepalive_pod_to_pod_ipv4_is_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod(AttachMode::Auto, MirrorMethod::Clone, false);
    // Every packet crossed two attached veths: the second sighting was skipped, not mirrored.
    assert!(out.bed.counters().get(stat_idx::STAT_DUPLICATE) > 0);
}

#[test]
fn keepalive_pod_to_pod_ipv6_is_mirrored_from_the_500_on() {
    if !require_root() {
        return;
    }
    keepalive_pod_to_pod(AttachMode::Auto, MirrorMethod::Clone, true);
}

#[test]
fn node_to_pod_separate_connections_only_the_500_one_is_mirrored() {
    if !require_root() {
        return;
    }
    let bed = Testbed::builder(&PODS).python("server", ALT).rule("status=500").build();

    let server = bed.pod("server").addr(false);
    let rec = bed.record("server", || {
        let urls = ["/ok", "/fail", "/ok"].map(|p| url(server, ALT, p));
        assert_eq!(client::get_each(bed.node(), &urls), [200, 500, 200]);
    });

    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (1, 2));
    // Not the handshake nor the request: the mirror starts with the status line.
    assert_eq!(rec.mirror.packets[0].http_status(), Some(500));
}

/// From the client pod to python, one connection per status; returns the statuses whose
/// connections were mirrored under `rule`, which must match `matches`.
fn mirrored_statuses(rule: &str, statuses: &[u16], matches: impl Fn(u16) -> bool) -> Vec<u16> {
    let bed = Testbed::builder(&PODS).python("server", ALT).rule(rule).build();

    let server = bed.pod("server").addr(false);
    let rec = bed.record("client", || {
        let urls: Vec<String> = statuses.iter().map(|s| url(server, ALT, &format!("/status/{s}"))).collect();
        assert_eq!(client::get_each(&bed.pod("client").ns, &urls), statuses);
    });
    let expected = bed.check(&rec, |status, _| matches(status));
    assert_eq!(expected.flows.len(), statuses.len(), "one connection per request");
    expected.triggered.iter().map(|t| t.status).collect()
}

#[test]
fn status_class_rule_mirrors_every_5xx() {
    if !require_root() {
        return;
    }
    let mirrored = mirrored_statuses("status=5xx", &[503, 404, 200, 500, 599], |s| (500..=599).contains(&s));
    assert_eq!(mirrored, [503, 500, 599]);
}

#[test]
fn status_range_rule_mirrors_only_its_range() {
    if !require_root() {
        return;
    }
    let mirrored = mirrored_statuses("status=501-503", &[500, 502, 504, 503], |s| (501..=503).contains(&s));
    assert_eq!(mirrored, [502, 503]);
}

#[test]
fn port_scoped_rule_ignores_the_same_status_on_another_port() {
    if !require_root() {
        return;
    }
    let bed = Testbed::builder(&PODS)
        .nginx("server", HTTP)
        .python("server", ALT)
        .rule(&format!("status=500 port={ALT}"))
        .build();

    let server = bed.pod("server").addr(false);
    let rec = bed.record("client", || {
        let urls = [url(server, HTTP, "/bar"), url(server, ALT, "/fail"), url(server, HTTP, "/bar")];
        assert_eq!(client::get_each(&bed.pod("client").ns, &urls), [500, 500, 500]);
    });

    let expected = bed.check(&rec, |status, port| status == 500 && port == ALT);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (1, 2));
    let flow = expected.triggered[0].flow;
    assert!(flow.lo.port() == ALT || flow.hi.port() == ALT, "{flow}");
}

/// `/ok /fail /ok` on one connection and `/ok` on another, from the client pod to `server`;
/// checks that exactly the `/fail` connection is mirrored and that its trigger was seen at the
/// egress of the client's veth.
fn expect_trigger_at_client_egress(bed: &Testbed, server: IpAddr) {
    let events = bed.events();
    let client = &bed.pod("client").ns;
    let rec = bed.record("client", || {
        let urls = ["/ok", "/fail", "/ok"].map(|p| url(server, ALT, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
        assert_eq!(client::get_each(client, &[url(server, ALT, "/ok")]), [200]);
    });
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (1, 1));
    let ev = events.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].ifindex, ev[0].egress), (ifindex(&bed.pod("client").veth), true), "{ev:?}");
}

#[test]
fn host_network_server_triggers_at_the_client_veth_egress() {
    if !require_root() {
        return;
    }
    let bed = Testbed::builder(&PODS).python_in_node(ALT).rule("status=500").build();
    let server = bed.pod("client").gateway(false);
    expect_trigger_at_client_egress(&bed, server);
}

#[test]
fn server_veth_not_attached_triggers_at_the_client_veth_egress() {
    if !require_root() {
        return;
    }
    let bed =
        Testbed::builder(&PODS).python("server", ALT).rule("status=500").attach_only(&["client"]).build();
    let server = bed.pod("server").addr(false);
    expect_trigger_at_client_egress(&bed, server);
}

#[test]
fn large_500_response_is_mirrored_whole() {
    if !require_root() {
        return;
    }
    large_500_response(MirrorDelivery::Egress, true);
}

#[test]
fn packet_budget_ends_the_mirror() {
    if !require_root() {
        return;
    }
    const BUDGET: usize = 3;
    let bed =
        Testbed::builder(&PODS).python("server", ALT).rule(&format!("status=500 packets={BUDGET}")).build();

    let server = bed.pod("server").addr(false);
    let rec = bed.record("client", || {
        let urls = ["/ok", "/fail", "/ok", "/fail", "/ok"].map(|p| url(server, ALT, p));
        assert_eq!(client::get_keepalive(&bed.pod("client").ns, &urls), [200, 500, 200, 500, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    assert!(expected.packets.len() > BUDGET, "{expected:?}");
    // The first packets from the trigger on, and no more.
    assert_eq!(rec.mirror.packets.len(), BUDGET);
    assert_eq!(rec.mirror.packets[0].http_status(), Some(500));
    assert!(
        rec.mirror.packets.iter().all(|p| expected.packets.contains(&p.id())),
        "{:?}",
        rec.mirror.packets
    );
    let c = bed.counters();
    assert_eq!((c.get(stat_idx::STAT_TRIGGERS), c.get(stat_idx::STAT_MIRROR_ENDED)), (1, 1), "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), BUDGET as u64, "{c:?}");
    let flow = expected.triggered[0].flow;
    let mark = bed.dp.mark(&flow).expect("reading the mark").expect("the flow is marked");
    assert_eq!((mark.packets, mark.ended), (BUDGET as u64, true));
}

#[test]
fn concurrent_connections_are_each_mirrored_once() {
    if !require_root() {
        return;
    }
    const PAIRS: usize = 20;
    let bed = Testbed::builder(&PODS).nginx("server", HTTP).rule("status=500").build();

    let server = bed.pod("server").addr(false);
    let rec = bed.record("client", || {
        let [bar, foo] = ["/bar", "/foo"].map(|p| url(server, HTTP, p));
        let runs: Vec<Vec<String>> = (0..PAIRS)
            .flat_map(|_| [vec![bar.clone(), foo.clone()], vec![foo.clone(), foo.clone()]])
            .collect();
        let statuses = client::get_concurrently(&bed.pod("client").ns, &runs);
        assert!(statuses.chunks(2).all(|pair| pair == [vec![500, 200], vec![200, 200]]), "{statuses:?}");
    });
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (PAIRS, PAIRS));
}

#[test]
fn removed_rule_triggers_no_more() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::builder(&PODS).nginx("server", HTTP).rule("status=500").build();
    let rule = bed.rule_ids()[0];
    let bar = |bed: &Testbed| {
        let server = bed.pod("server").addr(false);
        bed.record("client", || {
            assert_eq!(client::get_each(&bed.pod("client").ns, &[url(server, HTTP, "/bar")]), [500]);
        })
    };

    let rec = bar(&bed);
    assert_eq!(bed.check(&rec, |status, _| status == 500).triggered.len(), 1);
    bed.dp.remove_rule(rule).expect("removing the rule");
    let rec = bar(&bed);
    assert_eq!(rec.mirror.packets.len(), 0);
    assert_eq!(bed.counters().get(stat_idx::STAT_TRIGGERS), 1);
}
