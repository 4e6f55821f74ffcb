//! Attach modes and mirror methods: each mirrors exactly the same packets; detach removes
//! what attach added and nothing else.

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorMethod};
use mirror_e2e::scenario::{keepalive_pod_to_pod, HTTP, PODS};
use mirror_e2e::topology::tc::{self, Hook, FOREIGN_PRIO};
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::client::{self, url};

/// Every way to attach.
const WAYS: [(AttachMode, MirrorMethod); 3] = [
    (AttachMode::Tc, MirrorMethod::Clone),
    (AttachMode::Tcx, MirrorMethod::Clone),
    (AttachMode::Tc, MirrorMethod::Mirred),
];

/// Whether a tc filter of ours is on both hooks of every pod's veth.
fn ours_everywhere(bed: &Testbed) -> bool {
    bed.topo.pods.iter().all(|p| Hook::BOTH.iter().all(|h| tc::has_ours(bed.node(), &p.veth, *h)))
}

#[test]
fn tc_mode_mirrors_exactly() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod(AttachMode::Tc, MirrorMethod::Clone, false);
    assert!(ours_everywhere(&out.bed), "not attached as tc filters");
}

#[test]
fn tcx_mode_mirrors_exactly() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod(AttachMode::Tcx, MirrorMethod::Clone, false);
    let bed = &out.bed;
    assert!(bed.topo.pods.iter().all(|p| !tc::has_clsact(bed.node(), &p.veth)), "TCX needs no clsact");
}

#[test]
fn mirred_method_mirrors_exactly() {
    if !require_root() {
        return;
    }
    let out = keepalive_pod_to_pod(AttachMode::Tc, MirrorMethod::Mirred, false);
    assert!(ours_everywhere(&out.bed), "not attached as tc filters");
    let veth = &out.bed.pod("server").veth;
    assert!(tc::filters(out.bed.node(), veth, Hook::Ingress).contains("mirred"), "no mirred action");
}

/// One request that triggers, from the client pod.
fn trigger_once(bed: &Testbed) {
    let server = bed.pod("server").addr(false);
    assert_eq!(client::get_each(&bed.pod("client").ns, &[url(server, HTTP, "/bar")]), [500]);
}

#[test]
fn detach_leaves_no_qdisc_filter_or_program() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::builder(&PODS).nginx("server", HTTP).rule("status=500").detached().build();
    for (mode, method) in WAYS {
        bed.attach(mode, method);
        assert_eq!(ours_everywhere(&bed), mode == AttachMode::Tc, "{mode:?}");
        trigger_once(&bed);
        bed.detach();
        for p in &bed.topo.pods {
            assert!(!tc::has_clsact(bed.node(), &p.veth), "{mode:?} {method:?} left clsact on {}", p.veth);
            for h in Hook::BOTH {
                assert!(
                    tc::prios(bed.node(), &p.veth, h).is_empty(),
                    "{mode:?} {method:?} left a filter on {}",
                    p.veth
                );
            }
        }
        // Nothing runs any more: traffic is not even counted.
        let before = bed.counters().get(stat_idx::STAT_PACKETS);
        trigger_once(&bed);
        assert_eq!(bed.counters().get(stat_idx::STAT_PACKETS), before, "{mode:?} {method:?} still runs");
    }
    assert_eq!(bed.counters().get(stat_idx::STAT_TRIGGERS), WAYS.len() as u64);
}

#[test]
fn foreign_filters_survive_attach_detach_cycles() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::builder(&PODS).nginx("server", HTTP).rule("status=500").detached().build();
    let veth = bed.pod("server").veth.clone();
    tc::add_foreign_filters(bed.node(), &veth);
    let counts = |bed: &Testbed| Hook::BOTH.map(|h| tc::foreign_packets(bed.node(), &veth, h));

    for (cycle, (mode, method)) in WAYS.into_iter().chain(WAYS).enumerate() {
        let before = counts(&bed);
        bed.attach(mode, method);
        trigger_once(&bed);
        let during = counts(&bed);
        bed.detach();
        trigger_once(&bed);
        let after = counts(&bed);
        for i in 0..2 {
            assert!(
                before[i] < during[i] && during[i] < after[i],
                "{mode:?} {method:?}: {before:?} {during:?} {after:?}"
            );
        }
        for h in Hook::BOTH {
            assert_eq!(tc::prios(bed.node(), &veth, h), [FOREIGN_PRIO].into(), "{mode:?} {method:?} {h:?}");
        }
        assert!(tc::has_clsact(bed.node(), &veth), "the foreign clsact is gone");
        // Our part worked alongside: one new connection mirrored per cycle.
        assert_eq!(bed.counters().get(stat_idx::STAT_TRIGGERS), cycle as u64 + 1, "{mode:?} {method:?}");
    }
    assert!(bed.counters().get(stat_idx::STAT_MIRRORED_PACKETS) > 0);
}

/// Attaches to every veth, then again in `mode`: the second attach is accepted or refused
/// (`accepted`), and either way each packet is still mirrored exactly once.
fn attach_twice(mode: AttachMode, accepted: bool) {
    let mut bed = Testbed::builder(&PODS)
        .nginx("server", HTTP)
        .rule("status=500")
        .attach(mode, MirrorMethod::Clone)
        .build();
    for role in PODS {
        let again = bed.try_attach(role, mode, MirrorMethod::Clone);
        assert_eq!(again.is_ok(), accepted, "{mode:?} again on {role}: {again:?}");
    }
    let rec = bed.record("client", || trigger_once(&bed));
    assert_eq!(bed.check(&rec, |status, _| status == 500).triggered.len(), 1);
}

#[test]
fn attaching_twice_in_tc_mode_replaces_our_filter() {
    if !require_root() {
        return;
    }
    attach_twice(AttachMode::Tc, true);
}

#[test]
fn attaching_twice_in_tcx_mode_is_refused_and_harmless() {
    if !require_root() {
        return;
    }
    attach_twice(AttachMode::Tcx, false);
}
