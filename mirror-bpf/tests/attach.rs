//! Loading only the programs of one attach mode and mirror method: what the agent does to
//! halve its start-up. Needs root (fails without it in CI).

use mirror_bpf::testing;
use mirror_bpf::{tcx_supported, AttachMode, DatapathOptions, MirrorMethod};

fn only(mode: AttachMode, method: MirrorMethod) -> DatapathOptions {
    DatapathOptions { only: Some((mode, method)), ..DatapathOptions::default() }
}

#[test]
fn only_the_programs_of_the_resolved_mode_are_loaded_and_attach() {
    if !testing::require_root() {
        return;
    }
    testing::enter_private_netns();
    testing::sh("ip link add oa type veth peer name ob && ip link set oa up && ip link set ob up");
    let (oa, ob) = (testing::ifindex("oa"), testing::ifindex("ob"));
    let native = if tcx_supported() { AttachMode::Tcx } else { AttachMode::Tc };

    // Auto is resolved at load; attaching in auto (or in that mode) uses what was loaded.
    let dp = testing::load(&only(AttachMode::Auto, MirrorMethod::Clone));
    assert_eq!(dp.loaded_programs(), Some((native, MirrorMethod::Clone)));
    let att = dp.attach(oa, AttachMode::Auto, MirrorMethod::Clone).unwrap();
    assert_eq!(att.mode, native);

    // Another mode or method has no programs: a clear error, nothing attached.
    let other = if native == AttachMode::Tcx { AttachMode::Tc } else { AttachMode::Tcx };
    for (mode, method) in [(other, MirrorMethod::Clone), (AttachMode::Tc, MirrorMethod::Mirred)] {
        let err = dp.attach(ob, mode, method).unwrap_err().to_string();
        assert!(err.contains("only the programs for"), "{mode:?}/{method:?}: {err}");
    }
    assert!(!testing::sh("tc filter show dev ob ingress").contains("bpf"));
    if tcx_supported() {
        assert_eq!(mirror_bpf::attach::tcx_prog_ids(ob, false).unwrap(), Vec::<u32>::new());
    }
    dp.detach(att).unwrap();

    // The mirred method always means tc mode (its action needs the mirror interface).
    let dp = testing::load(&only(AttachMode::Auto, MirrorMethod::Mirred));
    assert_eq!(dp.loaded_programs(), Some((AttachMode::Tc, MirrorMethod::Mirred)));
    dp.set_mirror_ifindex(oa).unwrap();
    let att = dp.attach(ob, AttachMode::Auto, MirrorMethod::Mirred).unwrap();
    assert_eq!((att.mode, att.method), (AttachMode::Tc, MirrorMethod::Mirred));
    dp.detach(att).unwrap();
}
