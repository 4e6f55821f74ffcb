//! Copies handed straight to the receive path of the sink's peer (`BPF_F_INGRESS`, the default
//! for a veth sink the agent creates) carry exactly what copies sent out of the sink carry: the
//! capture on the peer is checked against the client's, packet for packet, both directions.

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};
use mirror_e2e::client::{self, url};
use mirror_e2e::scenario::{keepalive_pod_to_pod_via, PODS};
use mirror_e2e::testbed::Testbed;

/// python's port.
const ALT: u16 = 8080;

#[test]
fn peer_ingress_ipv4_tcx_mirrors_the_same_packets() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod_via(AttachMode::Auto, MirrorMethod::Clone, false, MirrorDelivery::Ingress);
    let c = out.bed.counters();
    assert_eq!(c.get(stat_idx::STAT_MIRROR_ERRORS), 0);
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), out.rec.mirror.packets.len() as u64);
}

#[test]
fn peer_ingress_ipv6_tc_mirrors_the_same_packets() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod_via(AttachMode::Tc, MirrorMethod::Clone, true, MirrorDelivery::Ingress);
    assert_eq!(out.bed.counters().get(stat_idx::STAT_MIRROR_ERRORS), 0);
}

#[test]
fn peer_ingress_carries_gso_packets_whole() {
    if !require_root() {
        return;
    }
    const BODY: u32 = 1 << 20;
    let mut bed = Testbed::new(&PODS);
    bed.python("server", ALT);
    bed.mirror_to_sink_via(MirrorDelivery::Ingress);
    bed.add_rule("status=500");
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);

    let server = bed.pod("server").addr(false);
    let rec = bed.record("client", || {
        let urls = [url(server, ALT, "/ok"), url(server, ALT, &format!("/fail?bytes={BODY}"))];
        assert_eq!(client::get_keepalive(&bed.pod("client").ns, &urls), [200, 500]);
    });
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1);
    let mirrored: u32 = rec.mirror.packets.iter().map(|p| p.len).sum();
    assert!(mirrored > BODY, "{mirrored} bytes mirrored");
    // Larger than the sink's MTU: received whole, not refused.
    assert!(rec.mirror.packets.iter().any(|p| p.len > 1500), "no GSO packet among the copies");
    assert_eq!(bed.counters().get(stat_idx::STAT_MIRROR_ERRORS), 0);
}
