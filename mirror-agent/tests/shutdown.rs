//! A clean stop (SIGTERM) removes everything the agent added, and only that: its TCX links or
//! tc filters, the clsact qdisc it created, its mirror sink, its pins and socket. A foreign
//! clsact with foreign filters, there before the agent, stays and keeps counting packets.

mod common;

use mirror_agent::state::SavedState;
use mirror_bpf::testing::{ifindex, require_root};
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::capture::tcpdump::Recorder;
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::topology::tc::{self, Hook, FOREIGN_PRIO};
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

use common::{bins, link_exists, tcx_programs, ATTACH, VETHS};

/// The pod veth with foreign filters; the other one has no qdisc before the agent.
const FOREIGN: &str = "vethserver";
const BARE: &str = "vethclient";

fn clean_stop_leaves_only_foreign_state(mode: &str) {
    let topo = Topology::without_sink(&PODS);
    let _inside = topo.node.enter();
    let node = &topo.node;
    tc::add_foreign_filters(node, FOREIGN);
    let foreign = || Hook::BOTH.map(|h| tc::foreign_packets(node, FOREIGN, h));
    let cfg =
        AgentConfig { attach_mode: mode.into(), rules: vec!["status=500".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    for v in VETHS {
        let tcx = if mode == "tcx" { [1, 1] } else { [0, 0] };
        assert_eq!(tcx_programs(ifindex(v)), tcx, "{mode}: {v}");
        assert!(Hook::BOTH.iter().all(|h| tc::has_ours(node, v, *h) == (mode == "tc")), "{mode}: {v}");
    }
    assert_eq!(tc::has_clsact(node, BARE), mode == "tc", "{mode}: clsact on {BARE}");

    // Both work side by side: the mirror is exact, the foreign filters count.
    let before = foreign();
    let client = &topo.pod("client").ns;
    let server = topo.pod("server").addr(false);
    let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
    let recorder = Recorder::new(env.dir());
    let rec = recorder.record(client, Some((node, env.sink_peer().as_str())), || {
        assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 1);
    let during = foreign();
    assert!(before[0] < during[0] && before[1] < during[1], "{before:?} {during:?}");

    agent.terminate();
    for v in VETHS {
        assert_eq!(tcx_programs(ifindex(v)), [0, 0], "{mode}: TCX left on {v}");
        for h in Hook::BOTH {
            assert!(!tc::has_ours(node, v, h), "{mode}: our filter left on {v} {h:?}");
        }
    }
    assert!(!tc::has_clsact(node, BARE), "{mode}: the clsact we created is left on {BARE}");
    assert!(tc::has_clsact(node, FOREIGN), "{mode}: the foreign clsact is gone");
    for h in Hook::BOTH {
        assert_eq!(tc::prios(node, FOREIGN, h), [FOREIGN_PRIO].into(), "{mode}: {h:?}");
    }
    assert!(!link_exists(env.sink()) && !link_exists(&env.sink_peer()), "{mode}: the sink is left");
    assert!(!env.pin_path().exists(), "{mode}: {} is left", env.pin_path().display());
    assert!(!env.socket().exists(), "{mode}: the API socket is left");
    let state = SavedState::load(&env.state_path()).expect("reading the state").expect("a state file");
    assert!(!state.created_sink && state.created_qdiscs.is_empty(), "{mode}: {state:?}");
    assert_eq!(state.rules.len(), 1, "{mode}: rules are kept for the next start");

    // The foreign filters still count, alone now.
    assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
    let after = foreign();
    assert!(during[0] < after[0] && during[1] < after[1], "{during:?} {after:?}");
}

#[test]
fn clean_stop_in_tcx_mode_leaves_only_foreign_state() {
    if !require_root() {
        return;
    }
    clean_stop_leaves_only_foreign_state("tcx");
}

#[test]
fn clean_stop_in_tc_mode_leaves_only_foreign_state() {
    if !require_root() {
        return;
    }
    clean_stop_leaves_only_foreign_state("tc");
}
