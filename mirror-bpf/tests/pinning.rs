//! Restart: a second instance adopts the pinned maps and links of the first. Needs root.

use std::path::PathBuf;

use mirror_bpf::attach::tcx_prog_ids;
use mirror_bpf::testing::{self, consts::*, fixtures, SkbContext};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{AttachMode, DatapathOptions, MirrorMethod};

/// A pin directory of this test on the bpffs, removed even if the test fails.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A pin directory named for `test` and this process, and the options that pin there.
fn pinned(test: &str) -> (PinDir, DatapathOptions) {
    let pins = PinDir(PathBuf::from(format!("/sys/fs/bpf/mirror-bpf-test-{test}-{}", std::process::id())));
    let opts = DatapathOptions { pin_path: Some(pins.0.clone()), ..Default::default() };
    (pins, opts)
}

#[test]
fn a_second_instance_adopts_maps_and_links() {
    if !testing::require_root() {
        return;
    }
    let (pins, opts) = pinned("adopt");
    testing::enter_private_netns();
    testing::sh("ip link add pa type veth peer name pb && ip link set pa up && ip link set pb up");
    let pa = testing::ifindex("pa");

    let mut first = testing::load(&opts);
    assert!(!first.adopted());
    let id = first.add_rule("status=500".parse().unwrap()).unwrap();
    let slot = first.rule_slot(id).unwrap();
    let att = first.attach(pa, AttachMode::Tcx, MirrorMethod::Clone).unwrap();
    let trigger = fixtures::v4_response(PORT_HTTP, 49000, RESP_500);
    testing::run(&first.skel().progs.tc_ingress_mirror, &trigger, SkbContext::default());
    first.release(att);
    drop(first);

    let mut second = testing::load(&opts);
    assert!(second.adopted());
    second.restore_rule(id, slot, "status=500".parse().unwrap()).unwrap();
    assert_eq!(second.rules().unwrap()[0].hits, 1, "hits survive");
    let key = mirror_bpf::FlowKey::new(
        std::net::SocketAddr::new(V4_SERVER.into(), PORT_HTTP),
        std::net::SocketAddr::new(V4_CLIENT.into(), 49000),
        6,
    );
    assert!(second.mark(&key).unwrap().is_some(), "marks survive");
    assert_eq!(second.counters().unwrap().get(S::STAT_TRIGGERS), 1, "counters survive");
    // The pinned links are adopted: no second program on the interface.
    let att = second.attach(pa, AttachMode::Tcx, MirrorMethod::Clone).unwrap();
    let progs = &second.skel().progs;
    assert_eq!(tcx_prog_ids(pa, false).unwrap(), [prog_id(&progs.tcx_ingress_mirror)]);
    assert_eq!(tcx_prog_ids(pa, true).unwrap(), [prog_id(&progs.tcx_egress_mirror)]);
    second.detach(att).unwrap();
    assert!(tcx_prog_ids(pa, false).unwrap().is_empty() && tcx_prog_ids(pa, true).unwrap().is_empty());
    second.unpin_all().unwrap();
    assert!(!pins.0.exists(), "no pin left");
}

fn prog_id(p: &libbpf_rs::ProgramMut<'_>) -> u32 {
    use std::os::fd::AsFd;
    libbpf_rs::Program::id_from_fd(p.as_fd()).unwrap()
}

/// A pinned map of another layout (an earlier version's counters, other sizes) is replaced by a
/// fresh one, not refused at load; the maps that match are adopted.
#[test]
fn a_pinned_map_of_another_layout_is_replaced() {
    if !testing::require_root() {
        return;
    }
    use libbpf_rs::{MapCore, MapHandle, MapType};
    let (pins, opts) = pinned("layout");
    let first = testing::load(&opts);
    drop(first);
    // The counters and settings of an earlier version: fewer of them.
    let stats = pins.0.join("stats");
    std::fs::remove_file(&stats).unwrap();
    let settings = pins.0.join("settings");
    std::fs::remove_file(&settings).unwrap();
    let create = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    let mut old = MapHandle::create(MapType::PercpuArray, Some("stats"), 4, 8 * 20, 1, &create).unwrap();
    old.pin(&stats).unwrap();
    let mut old = MapHandle::create(MapType::Array, Some("settings"), 4, 8, 1, &create).unwrap();
    old.pin(&settings).unwrap();

    let second = testing::load(&opts);
    assert!(second.adopted(), "the other maps are adopted");
    let now = MapHandle::from_pinned_path(&stats).unwrap();
    assert_eq!(now.value_size() as usize, std::mem::size_of::<mirror_bpf::types::counters>());
    assert_eq!(second.counters().unwrap().get(S::STAT_PACKETS), 0);
    // Fresh settings get the defaults: response times on.
    assert!(second.timing(mirror_bpf::TimingGroup::Http).unwrap());
}
