//! A flood of dropped packets with the real agent: 100,000 SYNs, each a flow of its own, that
//! the node's rule drops, all counted (by reason and at the pod they were going to), the drop
//! rule's triggers rate-limited, nothing lost from the ring, the agent's memory unmoved and
//! another connection untouched; the cost (the agent's CPU, the drop program's time per run)
//! printed. Its figures, measured apart from the tests: `mirror-bench drops`.

mod drop_common;

use std::net::SocketAddr;
use std::time::Duration;

use drop_common::{connect, drop_config, drop_metrics, events, pod_label, start_attached};
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentEnv, Binaries};
use mirror_e2e::capture::footprint;
use mirror_e2e::capture::tcpdump::SETTLE;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::servers::Server;

/// A port left alone.
const OPEN: u16 = 8081;

/// A flood of 100,000 SYNs, each a flow of its own, that the node's rule drops: every one is
/// counted by its reason; the rule triggers at most its rate (100 a second), the rest counted as
/// limited, none lost from the ring; the agent's memory stays put; a connection to another port
/// meanwhile is untouched.
#[test]
fn a_flood_of_drops_is_counted_and_its_triggers_rate_limited() {
    if !require_root() {
        return;
    }
    const FLOOD: u32 = 100_000;
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let _open = Server::asyncio(&topo.pod("server").ns, OPEN, dir.path());
    let cfg = drop_config(&["drop=netfilter_drop"], true);
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = start_attached(&env);
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    // The flood goes to ports 1 and 2 of the server pod: dropped in the forward path.
    topo.node.sh(&format!("iptables -I FORWARD -d {} -p tcp --dport 1:2 -j DROP", server.v4));
    let pid = agent.pid();
    let (_, rss_before) = footprint::process(pid);
    let cpu_before = footprint::cpu_time(pid);
    let stats = footprint::RunTimeStats::on().expect("BPF_ENABLE_STATS");
    let runs_before = footprint::program_runs(pid, "drop_trace").expect("the agent's drop program");
    let took = mirror_e2e::workload::flood::syn_flood(&client.ns, client.v4, server.v4, FLOOD);
    assert!(
        connect(&client.ns, SocketAddr::new(server.addr(false), OPEN), Duration::from_secs(2)),
        "open port"
    );
    std::thread::sleep(SETTLE);
    let runs_after = footprint::program_runs(pid, "drop_trace").expect("the agent's drop program");
    drop(stats);
    let cpu = footprint::cpu_time(pid) - cpu_before;
    let (_, rss_after) = footprint::process(pid);

    let st = env.status();
    let c = &st["counters"];
    let count = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no counter {k}: {c}"));
    assert_eq!(st["drops"]["netfilter_drop"], FLOOD, "every dropped SYN counted: {}", st["drops"]);
    // All at the pod they were going to.
    let by_pod = vec![("netfilter_drop".to_string(), pod_label(&env, "vethserver"), u64::from(FLOOD))];
    assert_eq!(drop_metrics(&topo.node), by_pod, "mirror_drops_total by reason and pod");
    let (triggers, limited) = (count("drop_triggers"), count("drop_limited"));
    assert_eq!(triggers + limited, u64::from(FLOOD), "each drop triggered or was limited: {c}");
    // The rate: 100 a second, per one-second window; the flood spans a window or a few more.
    let windows = took.as_secs() + 2;
    assert!(triggers >= 100 && triggers <= 100 * windows, "{triggers} triggers in {took:?}");
    assert_eq!(count("ringbuf_drops"), 0, "no event lost: {c}");
    let evs = events(&env);
    let drops = evs.iter().filter(|e| e["kind"] == "drop").count();
    assert_eq!(drops as u64, triggers.min(evs.len() as u64), "an event per trigger (as the log keeps)");
    let growth = rss_after.saturating_sub(rss_before);
    assert!(growth < 4096, "the agent's RSS grew by {growth} KiB over the flood");
    let (n, ns) = (runs_after.0 - runs_before.0, runs_after.1 - runs_before.1);
    assert!(n >= u64::from(FLOOD), "the drop program ran {n} times");
    eprintln!(
        "{FLOOD} SYNs dropped in {} ms: {triggers} triggers, {limited} limited; agent CPU {} ms, RSS +{growth} KiB; \
         drop program: {n} runs, {:.0} ns per run",
        took.as_millis(),
        cpu.as_millis(),
        ns as f64 / n as f64
    );
    drop(agent);
}
