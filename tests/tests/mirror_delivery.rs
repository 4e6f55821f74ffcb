//! Copies handed straight to the receive path of the sink's peer (`BPF_F_INGRESS`, the default
//! for a veth sink the agent creates) carry exactly what copies sent out of the sink carry: the
//! capture on the peer is checked against the client's, packet for packet, both directions.

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};
use mirror_e2e::scenario::{keepalive_pod_to_pod_via, large_500_response};

/// The keep-alive scenario with the copies handed into the peer's receive path, attached in
/// `mode`, over IPv6 when `v6`: no copy failed, and the counters say as many as the peer
/// received.
fn peer_ingress_mirrors_the_same_packets(mode: AttachMode, v6: bool) {
    let out = keepalive_pod_to_pod_via(mode, MirrorMethod::Clone, v6, MirrorDelivery::Ingress);
    let c = out.bed.counters();
    assert_eq!(c.get(stat_idx::STAT_MIRROR_ERRORS), 0);
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), out.rec.mirror.packets.len() as u64);
}

#[test]
fn peer_ingress_ipv4_tcx_mirrors_the_same_packets() {
    if !require_root() {
        return;
    }
    peer_ingress_mirrors_the_same_packets(AttachMode::Auto, false);
}

#[test]
fn peer_ingress_ipv6_tc_mirrors_the_same_packets() {
    if !require_root() {
        return;
    }
    peer_ingress_mirrors_the_same_packets(AttachMode::Tc, true);
}

#[test]
fn peer_ingress_carries_gso_packets_whole() {
    if !require_root() {
        return;
    }
    let out = large_500_response(MirrorDelivery::Ingress, false);
    // Larger than the sink's MTU: received whole, not refused.
    assert!(out.rec.mirror.packets.iter().any(|p| p.len > 1500), "no GSO packet among the copies");
    assert_eq!(out.bed.counters().get(stat_idx::STAT_MIRROR_ERRORS), 0);
}
