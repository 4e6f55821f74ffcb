//! Links that appear, vanish and are renamed while the agent runs: matching ones are attached
//! within the latency target, excluded ones never, vanished ones forgotten, and ones renamed
//! out of the include set detached.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use mirror_bpf::testing::{ifindex, require_root, sh};
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::proc::wait_until;
use mirror_e2e::topology::netns::Topology;

use common::{bins, status, tcx_programs};

/// Links created one by one after the agent started.
const LINKS: usize = 20;
/// The bound each attachment must meet here (the product target is 100 ms: see the printout).
const BOUND: Duration = Duration::from_secs(1);

/// Waits until the agent's classifier is on both hooks of `ifindex`; returns how long that took
/// from `since`. Panics after [`BOUND`].
#[track_caller]
fn attached_after(ifindex: u32, since: Instant) -> Duration {
    loop {
        if tcx_programs(ifindex) == [1, 1] {
            return since.elapsed();
        }
        assert!(since.elapsed() < BOUND, "ifindex {ifindex} not attached after {BOUND:?}");
        thread::sleep(Duration::from_micros(100));
    }
}

/// Whether the agent's status lists `name`.
fn listed(env: &AgentEnv, name: &str) -> bool {
    status(env).interfaces.iter().any(|i| i.name == name)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[test]
fn links_are_attached_forgotten_and_detached_as_they_come_and_go() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    // This thread creates the links and watches their hooks in the node namespace.
    let _inside = topo.node.enter();
    let cfg = AgentConfig { exclude: vec!["vethx*".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);

    let mut latencies = Vec::new();
    for i in 0..LINKS {
        // The peers do not match the include glob.
        sh(&format!("ip link add vethlat{i} type veth peer name peerlat{i}"));
        let created = Instant::now();
        latencies.push(attached_after(ifindex(&format!("vethlat{i}")), created));
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "attach latency over {LINKS} links (link added -> classifier on both hooks): \
         p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        ms(percentile(&latencies, 50)),
        ms(percentile(&latencies, 90)),
        ms(latencies[LINKS - 1]),
    );
    let st = status(&env);
    let l = &st.attach_latency;
    println!(
        "agent's own view (event received -> attached): {} attachments, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        l.count, l.p50_ms, l.p99_ms, l.max_ms
    );
    assert_eq!(l.count, LINKS as u64, "{st:?}");
    for i in 0..LINKS {
        let name = format!("vethlat{i}");
        let view = st.interfaces.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("{name}: {st:?}"));
        assert_eq!((view.ifindex, view.mode.as_str()), (ifindex(&name), "tcx"));
    }
    assert_eq!(st.interfaces.len(), LINKS, "only the matching links: {:?}", st.interfaces);

    // Events are handled in order: once the next link is attached, the excluded one was seen.
    sh("ip link add vethx0 type veth peer name peerx0 && ip link add vethnext type veth peer name peernext");
    attached_after(ifindex("vethnext"), Instant::now());
    assert_eq!(tcx_programs(ifindex("vethx0")), [0, 0], "an excluded link was attached");
    assert!(!listed(&env, "vethx0"));

    // Deleted: forgotten, and its pinned links with it.
    let gone: Vec<u32> = (0..5).map(|i| ifindex(&format!("vethlat{i}"))).collect();
    for i in 0..5 {
        sh(&format!("ip link del vethlat{i}"));
    }
    let forgotten = wait_until(BOUND, || {
        (0..5).all(|i| !status(&env).interfaces.iter().any(|v| v.name == format!("vethlat{i}")))
    });
    assert!(forgotten, "deleted links still listed: {:?}", status(&env).interfaces);
    for i in gone {
        for hook in ["ingress", "egress"] {
            let pin = env.pin_path().join("links").join(format!("{i}-{hook}"));
            assert!(!pin.exists(), "{} left behind", pin.display());
        }
    }

    // Renamed out of the include set: detached. Back in: attached again.
    let i5 = ifindex("vethlat5");
    sh("ip link set vethlat5 name other5");
    assert!(wait_until(BOUND, || tcx_programs(i5) == [0, 0]), "still attached after leaving the include set");
    assert!(wait_until(BOUND, || !listed(&env, "vethlat5") && !listed(&env, "other5")));
    sh("ip link set other5 name vethagain5");
    attached_after(i5, Instant::now());
    assert!(wait_until(BOUND, || listed(&env, "vethagain5")));

    // Renamed within the include set: still attached, under its new name.
    let i6 = ifindex("vethlat6");
    sh("ip link set vethlat6 name vethren6");
    assert!(wait_until(BOUND, || listed(&env, "vethren6") && !listed(&env, "vethlat6")));
    assert_eq!(tcx_programs(i6), [1, 1]);

    agent.terminate();
}
