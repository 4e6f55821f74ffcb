//! Links in bursts under a running agent: every veth of a burst is attached (its attach
//! latency reported, the bar itself is the churn benchmark's), and once the veths are deleted
//! nothing of them is left: no pinned link, no `attached_ifaces` entry, no interface in the
//! status, no qdisc recorded in the state file, no descriptor or memory growing with the
//! veths churned, and the kernel's expedited-RCU switch as it was found.
//!
//! Sizes: `MIRROR_BURST_VETHS` (default 50) veths in the burst test, `MIRROR_CHURN_VETHS`
//! (default 100; `make reliability` runs 500) created and deleted in bursts of 50 in the churn
//! test.

mod common;

use std::path::Path;
use std::time::Duration;

use mirror_bpf::rcu::RCU_EXPEDITED;
use mirror_bpf::testing::{ifindex, require_root};
use mirror_e2e::agent::{Agent, AgentConfig, AgentEnv};
use mirror_e2e::capture::footprint::{links, map_entries, pins, process};
use mirror_e2e::proc::wait_until;
use mirror_e2e::topology::netns::Netns;

use common::{bins, status, tcx_programs};

/// How long a burst may take to be attached, or forgotten after deletion.
const SETTLE: Duration = Duration::from_secs(60);

fn size(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Creates veths `vethbFIRST..` (`count` of them, host side up, peers `pbI`) at once.
fn create(node: &Netns, dir: &Path, first: usize, count: usize) {
    let text: String = (first..first + count)
        .map(|i| format!("link add vethb{i} type veth peer name pb{i}\nlink set vethb{i} up\n"))
        .collect();
    batch(node, dir, &text);
}

fn delete(node: &Netns, dir: &Path, first: usize, count: usize) {
    batch(node, dir, &(first..first + count).map(|i| format!("link del vethb{i}\n")).collect::<String>());
}

fn batch(node: &Netns, dir: &Path, text: &str) {
    let file = dir.join("links.batch");
    std::fs::write(&file, text).expect("writing the batch");
    let out = node.command("ip").arg("-batch").arg(&file).output().expect("running ip -batch");
    assert!(out.status.success(), "ip -batch: {}", String::from_utf8_lossy(&out.stderr));
}

/// The agent's open descriptors and resident memory (KiB).
fn footprint(agent: &Agent<'_>) -> (usize, u64) {
    process(agent.pid())
}

fn expedited() -> String {
    std::fs::read_to_string(RCU_EXPEDITED).map(|s| s.trim().to_string()).unwrap_or_default()
}

fn wait_count(env: &AgentEnv, agent: &Agent<'_>, want: usize) {
    let mut n = usize::MAX;
    let done = wait_until(SETTLE, || {
        n = status(env).interfaces.len();
        n == want
    });
    assert!(done, "{n} interfaces attached, not {want}, after {SETTLE:?}: {}", agent.output());
}

fn agent_env(node: &Netns, mode: &str) -> AgentEnv {
    AgentEnv::new(
        &bins(),
        node,
        &AgentConfig { include: vec!["vethb*".into()], attach_mode: mode.into(), ..AgentConfig::default() },
    )
}

#[test]
fn burst_of_veths_all_attached_and_nothing_left_after_deletion() {
    if !require_root() {
        return;
    }
    let veths = size("MIRROR_BURST_VETHS", 50);
    let switch_before = expedited();
    let node = Netns::new("burst");
    let env = agent_env(&node, "auto");
    let agent = env.start(&[]);
    let links_before = links(&node);
    create(&node, env.dir(), 0, veths);
    wait_count(&env, &agent, veths);
    let s = status(&env);
    assert_eq!(s.attach_latency.count, veths as u64);
    println!(
        "burst of {veths} veths: attach p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} mode)",
        s.attach_latency.p50_ms, s.attach_latency.p99_ms, s.attach_latency.max_ms, s.interfaces[0].mode
    );
    {
        let _inside = node.enter();
        for i in 0..veths {
            let idx = ifindex(&format!("vethb{i}"));
            if s.interfaces[0].mode == "tcx" {
                assert_eq!(tcx_programs(idx), [1, 1], "vethb{i}");
            }
        }
    }
    assert_eq!(map_entries(&env, "attached_ifaces"), veths);
    if s.interfaces[0].mode == "tcx" {
        let links_dir = env.pin_path().join(mirror_bpf::attach::LINKS_DIR);
        assert_eq!(interface_link_pins(&links_dir), 2 * veths);
    }

    delete(&node, env.dir(), 0, veths);
    wait_count(&env, &agent, 0);
    assert_eq!(map_entries(&env, "attached_ifaces"), 0, "attached_ifaces keeps deleted veths");
    let links_dir = env.pin_path().join(mirror_bpf::attach::LINKS_DIR);
    assert_eq!(interface_link_pins(&links_dir), 0, "pinned links of deleted veths are left");
    assert_eq!(links(&node), links_before);
    assert_eq!(expedited(), switch_before, "{RCU_EXPEDITED} not put back");
    agent.terminate();
}

/// Pinned TCX links of interfaces (`<ifindex>-<hook>`; the sink's replay program is pinned too).
fn interface_link_pins(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with("replay-")).count()
    })
}

/// Creates and deletes `MIRROR_CHURN_VETHS` veths in bursts of 50 in `mode`, and compares the
/// agent and the kernel before and after.
fn churn(mode: &str) {
    let total = size("MIRROR_CHURN_VETHS", 100);
    let burst = 50.min(total);
    let node = Netns::new("churn");
    let env = agent_env(&node, mode);
    let agent = env.start(&[]);
    // A first burst warms the agent up (allocator pools, histogram buckets) before the baseline.
    create(&node, env.dir(), 0, burst);
    wait_count(&env, &agent, burst);
    delete(&node, env.dir(), 0, burst);
    wait_count(&env, &agent, 0);
    let before = (footprint(&agent), links(&node), pins(&env), map_entries(&env, "attached_ifaces"));
    let state_before = std::fs::read_to_string(env.state_path()).expect("the state file");
    let mut done = 0;
    while done < total {
        let n = burst.min(total - done);
        create(&node, env.dir(), burst + done, n);
        wait_count(&env, &agent, n);
        delete(&node, env.dir(), burst + done, n);
        wait_count(&env, &agent, 0);
        done += n;
    }
    // The pod resolver runs after the last link event and opens a netlink socket and /proc
    // files while it does: a leak stays, that one goes within a moment.
    let _ = wait_until(Duration::from_secs(3), || footprint(&agent).0 <= before.0 .0);
    let after = (footprint(&agent), links(&node), pins(&env), map_entries(&env, "attached_ifaces"));
    let state_after = std::fs::read_to_string(env.state_path()).expect("the state file");
    println!(
        "{mode}: {total} veths churned: fds {} -> {}, RSS {} -> {} KiB, links {} -> {}, pins {} -> {}, \
         attached_ifaces {} -> {}",
        before.0 .0,
        after.0 .0,
        before.0 .1,
        after.0 .1,
        before.1,
        after.1,
        before.2,
        after.2,
        before.3,
        after.3
    );
    // Fewer is fine: one open at the first reading (a transient connection) may be gone.
    assert!(after.0 .0 <= before.0 .0, "the agent's descriptors grew: {} -> {}", before.0 .0, after.0 .0);
    assert_eq!(
        (after.1, after.2, after.3),
        (before.1, before.2, before.3),
        "links, pins or map entries left"
    );
    assert_eq!(state_after, state_before, "the state file keeps deleted veths");
    // Memory: bounded, not growing with the veths (an interface's record is ~1 KiB).
    let growth = after.0 .1.saturating_sub(before.0 .1);
    assert!(growth < 4096, "RSS grew by {growth} KiB over {total} veths");
    agent.terminate();
}

#[test]
fn churning_veths_in_tcx_mode_leaks_nothing() {
    if !require_root() {
        return;
    }
    churn("auto");
}

#[test]
fn churning_veths_in_tc_mode_leaks_nothing() {
    if !require_root() {
        return;
    }
    churn("tc");
}
