//! Fail-open: whatever happens to the mirror interface, production traffic flows, and the
//! packets that could not be copied are counted.

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorMethod};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::MIRROR_DEV;
use mirror_e2e::topology::testbed::{Recording, Testbed};
use mirror_e2e::workload::client::{self, url};

/// What became of the mirror interface.
enum Mirror {
    /// Never set.
    Unset,
    /// Set, then deleted after attach (its peer, the sink, goes with it).
    Deleted,
}

/// Attaches with rule `status=500`, then runs `/foo /bar /foo` on one connection from the
/// client pod (which must succeed) and returns what the mirror should have carried.
fn run(method: MirrorMethod, mirror: Mirror) -> (Testbed, Recording, Expected) {
    let mut setup =
        Testbed::builder(&PODS).nginx("server", HTTP).rule("status=500").attach(AttachMode::Auto, method);
    if let Mirror::Unset = mirror {
        setup = setup.no_mirror();
    }
    // Deleted: set, before attach (the mirred action needs it), then deleted.
    let bed = setup.build();
    if let Mirror::Deleted = mirror {
        bed.node().sh(&format!("ip link del {MIRROR_DEV}"));
    }
    let server = bed.pod("server").addr(false);
    let rec = bed.record_without_sink("client", || {
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(&bed.pod("client").ns, &urls), [200, 500, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1);
    bed.assert_marks(&expected);
    (bed, rec, expected)
}

#[test]
fn without_mirror_interface_traffic_flows_and_is_counted() {
    if !require_root() {
        return;
    }
    let (bed, _, expected) = run(MirrorMethod::Clone, Mirror::Unset);
    let c = bed.counters();
    assert_eq!(c.get(stat_idx::STAT_TRIGGERS), 1, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRROR_NO_TARGET), expected.packets.len() as u64, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), 0, "{c:?}");
}

#[test]
fn deleted_mirror_interface_clone_fails_open_and_counts_errors() {
    if !require_root() {
        return;
    }
    let (bed, _, expected) = run(MirrorMethod::Clone, Mirror::Deleted);
    let c = bed.counters();
    assert_eq!(c.get(stat_idx::STAT_TRIGGERS), 1, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRROR_ERRORS), expected.packets.len() as u64, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), 0, "{c:?}");
}

#[test]
fn deleted_mirror_interface_mirred_fails_open() {
    if !require_root() {
        return;
    }
    // act_mirred makes the copy: the classifier only knows it asked for one per packet.
    let (bed, _, expected) = run(MirrorMethod::Mirred, Mirror::Deleted);
    let c = bed.counters();
    assert_eq!(c.get(stat_idx::STAT_TRIGGERS), 1, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), expected.packets.len() as u64, "{c:?}");
}
