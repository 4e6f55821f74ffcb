//! The drop path (`mirror-bench drops`): the lateness of the copy of a dropped packet, and what
//! a flood of drops costs. A running agent with the rule `drop=netfilter_drop`, and the node's
//! firewall dropping TCP to a few ports of the server pod in the forward path (a policy).
//!
//! Lateness: SYNs each of a flow of its own, paced below the rule's rate (100 triggers a second),
//! so that each is dropped, triggers and is copied; tcpdump sees each on the client pod's
//! host-side veth as it enters the node and, as the agent's copy, on the sink's peer, both in the
//! node's namespace (one clock, nanosecond stamps): the lateness is the time between, per SYN.
//! It holds the way from the veth to the firewall's drop (a few microseconds), the ring buffer,
//! the agent's wake-up and its write to the sink.
//!
//! Cost: a flood of SYNs dropped by the same rule, as fast as one raw socket sends: the agent's
//! CPU time (user and system, from `/proc`, 10 ms ticks) per 100,000 drops, and the drop
//! program's own time per run as the kernel counts it (`BPF_ENABLE_STATS`), with the triggers
//! the rule's rate let through and those it refused.

use std::fmt::Write;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::footprint;
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::flood;

use crate::host::Host;
use crate::report;

/// The paced SYNs' port (the flood's are 1 and 2: `flood::syn_flood`).
const PACED_PORT: u16 = 3;
/// Paced SYNs a second: half the rule's rate, so that none is refused by it.
const PACED_PER_SEC: u64 = 50;

/// What was measured.
pub struct Results {
    /// Lateness of each copy, microseconds, sorted.
    pub lateness_us: Vec<f64>,
    /// Paced SYNs sent (seen on the veth), and copies of them on the sink.
    pub paced: usize,
    pub copies: usize,
    /// The flood: SYNs, how long sending them took.
    pub flood: u32,
    pub took: Duration,
    /// The agent's CPU time over the flood.
    pub agent_cpu: Duration,
    /// The drop program over the flood: runs, ns in all.
    pub runs: u64,
    pub run_ns: u64,
    /// Triggers the rule made and refused over the flood.
    pub triggers: u64,
    pub limited: u64,
}

impl Results {
    /// The `q` quantile of the lateness, microseconds.
    fn lateness(&self, q: f64) -> f64 {
        let n = self.lateness_us.len();
        self.lateness_us[((n as f64 * q).ceil() as usize).clamp(1, n) - 1]
    }
}

/// Runs `paced` paced SYNs, then a flood of `flood` SYNs.
pub fn run(bins: &Binaries, paced: u16, flood: u32) -> Result<Results> {
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir()?;
    let cfg = AgentConfig { rules: vec!["drop=netfilter_drop".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(bins, &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    topo.node.sh(&format!("iptables -I FORWARD -d {} -p tcp --dport 1:{PACED_PORT} -j DROP", server.v4));

    let (veth_file, sink_file) = (dir.path().join("veth.pcap"), dir.path().join("sink.pcap"));
    let filter = format!("tcp dst port {PACED_PORT}");
    let veth_cap = Capture::start(&topo.node, &client.veth, &filter, &veth_file);
    let sink_cap = Capture::start(&topo.node, &env.sink_peer(), &filter, &sink_file);
    for i in 0..paced {
        flood::segment(&client.ns, (client.v4, 20_000 + i), (server.v4, PACED_PORT), 0x02);
        std::thread::sleep(Duration::from_micros(1_000_000 / PACED_PER_SEC));
    }
    std::thread::sleep(SETTLE);
    let (veth, sink) = (veth_cap.stop(), sink_cap.stop());
    let mut lateness_us: Vec<f64> = veth
        .packets
        .iter()
        .filter_map(|p| {
            let copy = sink.dropped.iter().find(|d| d.packet.src == p.src && d.packet.seq == p.seq)?;
            Some(copy.packet.ts_ns.saturating_sub(p.ts_ns) as f64 / 1e3)
        })
        .collect();
    lateness_us.sort_by(f64::total_cmp);
    ensure!(!lateness_us.is_empty(), "no copy of a paced SYN reached the sink: {}", agent.output());

    let pid = agent.pid();
    let counter = |k: &str| env.status()["counters"][k].as_u64().unwrap_or(0);
    let (triggers0, limited0) = (counter("drop_triggers"), counter("drop_limited"));
    let cpu0 = footprint::cpu_time(pid);
    let stats = footprint::RunTimeStats::on().context("BPF_ENABLE_STATS")?;
    let runs0 = footprint::program_runs(pid, "drop_trace").context("the agent's drop program")?;
    let took = flood::syn_flood(&client.ns, client.v4, server.v4, flood);
    std::thread::sleep(SETTLE);
    let runs1 = footprint::program_runs(pid, "drop_trace").context("the agent's drop program")?;
    drop(stats);
    let agent_cpu = footprint::cpu_time(pid) - cpu0;
    let r = Results {
        paced: veth.packets.len(),
        copies: sink.dropped.len(),
        lateness_us,
        flood,
        took,
        agent_cpu,
        runs: runs1.0 - runs0.0,
        run_ns: runs1.1 - runs0.1,
        triggers: counter("drop_triggers") - triggers0,
        limited: counter("drop_limited") - limited0,
    };
    drop(agent);
    Ok(r)
}

/// The markdown report.
pub fn render(host: &Host, settings: &[(&str, String)], r: &Results) -> String {
    let mut s = String::new();
    report::write_head(&mut s, "The drop path: lateness of the copy, cost of a flood", host, settings);
    let _ = writeln!(
        s,
        "\nA running agent with the rule `drop=netfilter_drop`; the node's iptables drops TCP to \
         ports 1-{PACED_PORT} of the server pod in its forward path. The kernel's drops reach the \
         agent's drop program (`kfree_skb` tracepoint), which counts them, marks the flow and \
         hands the packet to the agent, which writes it to the sink.\n"
    );
    let _ = writeln!(
        s,
        "### Lateness of the copy\n\n{} SYNs, each a flow of its own, {PACED_PER_SEC} a second (below \
         the rule's 100 triggers a second): the time from each SYN entering the node on the client \
         pod's veth to the agent's copy of it on the sink (tcpdump on both, one clock).\n",
        r.paced
    );
    let _ = writeln!(s, "| SYNs | copies | median µs | p90 µs | p99 µs | max µs |");
    let _ = writeln!(s, "|--:|--:|--:|--:|--:|--:|");
    let _ = writeln!(
        s,
        "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
        r.paced,
        r.copies,
        r.lateness(0.5),
        r.lateness(0.9),
        r.lateness(0.99),
        r.lateness(1.0)
    );
    let per = |v: f64| v * 100_000.0 / f64::from(r.flood);
    let _ = writeln!(
        s,
        "\n### A flood of drops\n\n{} SYNs, each a flow of its own, sent by one raw socket in {:.2} s \
         ({:.0} a second), all dropped by the same rule.\n",
        r.flood,
        r.took.as_secs_f64(),
        f64::from(r.flood) / r.took.as_secs_f64().max(1e-9)
    );
    let _ = writeln!(
        s,
        "| drop program runs | ns per run | its CPU per 100,000 drops, ms | agent CPU per 100,000 drops, ms | triggers | refused by the rate |"
    );
    let _ = writeln!(s, "|--:|--:|--:|--:|--:|--:|");
    let _ = writeln!(
        s,
        "| {} | {:.0} | {:.1} | {:.0} | {} | {} |",
        r.runs,
        r.run_ns as f64 / r.runs.max(1) as f64,
        per(r.run_ns as f64 / 1e6),
        per(r.agent_cpu.as_secs_f64() * 1e3),
        r.triggers,
        r.limited
    );
    let _ = writeln!(
        s,
        "\nThe agent's CPU is read in 10 ms ticks; the drop program's time is the kernel's count \
         for it alone (it runs in the softirq that drops the packet). The program also runs for \
         the kernel's other frees with a drop reason on the node, which it leaves after a few \
         reads."
    );
    s
}
