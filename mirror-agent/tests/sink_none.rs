//! With `mirror.create: none` the sink is the operator's: when it vanishes the agent says it
//! waits for it (not that it recreates it), creates nothing, and takes it again when it
//! reappears.

mod common;

use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::proc::wait_until;
use mirror_e2e::topology::netns::Topology;

use common::{bins, status};

#[test]
fn a_sink_the_agent_does_not_create_is_waited_for() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let cfg = AgentConfig { sink: "mirrorop".into(), sink_create: "none".into(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    // A veth pair (not every kernel has the dummy link type); captures would read mirrorcap.
    topo.node.sh("ip link add mirrorop type veth peer name mirrorcap");
    let agent = env.start(&[]);
    let first = status(&env).mirror;
    assert!(first.ifindex.is_some() && !first.created, "{first:?}");
    // Not the agent's veth: a capture may read either end, so copies go out of the sink.
    assert_eq!((first.copies_to.as_deref(), first.delivery.as_deref()), (Some("mirrorop"), Some("egress")));

    topo.node.sh("ip link del mirrorop");
    let gone = wait_until(Duration::from_secs(5), || status(&env).mirror.ifindex.is_none());
    assert!(gone, "the agent still reports the sink: {}", agent.output());
    let log = agent.output();
    assert!(log.contains("mirror sink vanished: waiting for it to appear again"), "{log}");
    assert!(!log.contains("recreating"), "{log}");
    // Nothing was created in its place.
    std::thread::sleep(Duration::from_millis(300));
    let links = topo.node.sh("ip -o link show");
    assert!(!links.contains("mirrorop"), "{links}");

    topo.node.sh("ip link add mirrorop type veth peer name mirrorcap");
    let back = wait_until(Duration::from_secs(5), || {
        status(&env).mirror.ifindex.is_some_and(|i| Some(i) != first.ifindex)
    });
    assert!(back, "the reappeared sink was not taken: {:?}: {}", status(&env).mirror, agent.output());
    agent.terminate();
    // Not ours: left in place.
    assert!(topo.node.sh("ip -o link show").contains("mirrorop"));
}
