//! Faults under load: with HTTP requests on keep-alive connections (each one's outcome and
//! latency recorded) and iperf3 running between two pods, and one connection marked by a
//! `status=500` rule asking every 20 ms, faults are injected one after the other into a real
//! agent: the sink deleted, the sink set down, the flow table flooded past its size, the
//! trigger ring buffer filled while no one reads it, SIGKILL and restart, an upgrade (a
//! second agent with `--take-over`), and a second agent started with the same configuration.
//!
//! For each: no request fails or stalls (over [`STALL`]), every iperf3 interval carries
//! traffic, the marked connection is mirrored again within [`RESUME`] of the fault's end (as a
//! packet socket on the sink's peer sees its copies), and the rules (same ids) and the mark are
//! kept. The figures are printed (`--nocapture`). `MIRROR_FAULT_ROUNDS` (default 1; 5 in `make
//! reliability`) runs the sequence that many times on the same agent lineage.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{Agent, AgentConfig, AgentEnv};
use mirror_e2e::capture::footprint::{map_entries, map_size};
use mirror_e2e::capture::mirror_watch::MirrorWatch;
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::{join, Topology};
use mirror_e2e::workload::flood;
use mirror_e2e::workload::load::{self, HttpLoad, HttpSpec, Iperf, Request};
use mirror_e2e::workload::raw;
use mirror_e2e::workload::servers::Server;

use common::{bins, flows, rules, status, ATTACH, VETHS};

/// A request slower than this is a stall.
const STALL: Duration = Duration::from_secs(1);
/// Mirroring must resume this soon after a fault ends.
const RESUME: Duration = Duration::from_secs(1);
/// How often the marked connection asks.
const MARKED_EVERY: Duration = Duration::from_millis(20);
/// The flow table's size (`flows.max`), small so that a short flood overfills it.
const FLOWS_MAX: usize = 1024;
/// Flows of the flood that overfills it.
const FLOOD: u32 = 20_000;
/// Where the flood of round `r` goes (the node drops it): other flows each round.
fn flood_dst(round: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, 1 + round as u8)
}

/// What one fault did to the load and the mirror.
struct Figure {
    fault: &'static str,
    start: Instant,
    /// From the fault's end to the marked connection's next copy.
    resumed: Duration,
    /// The longest time without a copy of the marked connection, from the fault's start until
    /// mirroring resumed.
    gap: Duration,
    /// What else was seen.
    note: String,
}

/// The agent's environment, the topology and what watches the mirror.
struct Run<'a> {
    env: &'a AgentEnv,
    topo: &'a Topology,
    watch: MirrorWatch,
    /// The marked connection's local port.
    port: u16,
    rules: Vec<(u32, String)>,
    figures: Vec<Figure>,
    /// Copies the classifier could not make so far (`mirror_errors`, `mirror_no_target`).
    lost: u64,
}

/// Copies the classifier could not make.
fn copies_lost(env: &AgentEnv) -> u64 {
    let c = status(env).counters;
    c["mirror_errors"] + c["mirror_no_target"]
}

fn rule_ids(env: &AgentEnv) -> Vec<(u32, String)> {
    rules(env).into_iter().map(|r| (r.id, r.rule)).collect()
}

impl Run<'_> {
    /// After a fault that started at `start` and ended at `end`: waits for the marked
    /// connection's next copy, checks that the rules and the mark are kept, records figures.
    #[track_caller]
    fn after(&mut self, fault: &'static str, start: Instant, end: Instant, note: String) {
        let next = self.watch.next_copy(self.port, end, Duration::from_secs(5));
        let next =
            next.unwrap_or_else(|| panic!("{fault}: the marked connection not mirrored 5 s after the fault"));
        let mut times: Vec<Instant> =
            self.watch.copies_of(self.port).into_iter().filter(|t| *t > start && *t <= next).collect();
        times.insert(0, start);
        let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        assert_eq!(rule_ids(self.env), self.rules, "{fault}: rules changed");
        let port = format!(":{}", self.port);
        let all = flows(self.env);
        let marked = all.iter().find(|f| f.lo.ends_with(&port) || f.hi.ends_with(&port));
        let marked =
            marked.unwrap_or_else(|| panic!("{fault}: the marked connection is not listed: {all:?}"));
        assert_eq!(
            (marked.rule_id, marked.status),
            (Some(self.rules[0].0), Some(500)),
            "{fault}: {marked:?}"
        );
        let lost = copies_lost(self.env);
        let note =
            format!("{} copies not made{}{note}", lost - self.lost, if note.is_empty() { "" } else { "; " });
        self.lost = lost;
        self.figures.push(Figure { fault, start, resumed: next - end, gap, note });
    }
}

#[test]
fn faults_under_load_lose_no_request_and_mirroring_resumes() {
    if !require_root() {
        return;
    }
    let rounds: usize = std::env::var("MIRROR_FAULT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let topo = Topology::without_sink(&PODS);
    let cfg = AgentConfig {
        rules: vec!["status=500 packets=0 duration=0".into()],
        extra: format!("flows:\n  max: {FLOWS_MAX}\n"),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx_long_lived(topo.pod("server"), HTTP, env.dir());
    let mut agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let server = SocketAddr::new(topo.pod("server").addr(false), HTTP);
    let client = &topo.pod("client").ns;

    let watch = MirrorWatch::start(&topo.node, &env.sink_peer());
    let every = |pause| HttpSpec { connections: 1, first: Some(("/bar", 500)), path: "/foo", pause };
    let marked = HttpLoad::start(client, server, &every(MARKED_EVERY));
    let load = HttpLoad::start(
        client,
        server,
        &HttpSpec { connections: 4, first: None, path: "/foo", ..every(Duration::from_millis(2)) },
    );
    let iperf = Iperf::start(&topo.pod("server").ns, server.ip(), client, Duration::from_secs(2), "500M");
    assert!(wait_until(Duration::from_secs(5), || !marked.ports().is_empty()), "the marked connection");
    let port = marked.ports()[0];
    assert!(
        watch.next_copy(port, Instant::now(), Duration::from_secs(5)).is_some(),
        "no copy of the marked connection"
    );
    let mut run = Run {
        env: &env,
        topo: &topo,
        watch,
        port,
        rules: rule_ids(&env),
        figures: Vec::new(),
        lost: copies_lost(&env),
    };
    assert_eq!(run.rules.len(), 1);
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(500));

    for round in 0..rounds {
        if rounds > 1 {
            println!("round {}", round + 1);
        }
        sink_deleted(&mut run);
        sink_down(&mut run);
        flow_table_full(&mut run, flood_dst(round));
        ring_buffer_full(&mut run, &agent);
        agent = sigkill_and_restart(&mut run, &env, agent);
        agent = upgrade(&mut run, &env, agent);
        second_agent(&mut run, &agent);
    }

    std::thread::sleep(Duration::from_millis(300));
    let (marked_ports, marked, load, iperf) =
        (marked.ports(), marked.finish(), load.finish(), iperf.finish());
    let ended = Instant::now();
    report(&run.figures, &marked, &load, &iperf, began, ended);
    assert_eq!(marked_ports, [port], "the marked connection was reopened");
    let log = agent.terminate();
    assert!(log.contains("detached everywhere"), "{log}");
}

/// SIGKILL: the pinned data path goes on without an agent; the next one adopts it.
fn sigkill_and_restart<'a>(run: &mut Run<'_>, env: &'a AgentEnv, agent: Agent<'a>) -> Agent<'a> {
    let start = Instant::now();
    agent.kill();
    std::thread::sleep(Duration::from_millis(300));
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    assert!(status(env).adopted, "the restarted agent did not adopt: {}", agent.output());
    let note = format!("restarted and adopted in {} ms", start.elapsed().as_millis());
    run.after("SIGKILL and restart", start, Instant::now(), note);
    agent
}

/// Upgrade: the next agent takes over while the old one runs, which then stands by and, once
/// stopped, changes nothing.
fn upgrade<'a>(run: &mut Run<'_>, env: &'a AgentEnv, old: Agent<'a>) -> Agent<'a> {
    let start = Instant::now();
    let agent = env.start(&["--take-over"]);
    let lock = format!("{}.lock", env.socket().display());
    let mine = agent.pid().to_string();
    let took = wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&lock).is_ok_and(|p| p.trim() == mine)
            && env.ctl(&["status"]).status.success()
    });
    assert!(took, "no hand-over:\n--- old\n{}\n--- new\n{}", old.output(), agent.output());
    agent.wait_attached(&VETHS, ATTACH);
    assert!(status(env).adopted);
    let note = format!("handed over in {} ms", start.elapsed().as_millis());
    let log = old.terminate();
    assert!(log.contains("nothing to undo"), "{log}");
    run.after("keep-attached upgrade (--take-over)", start, Instant::now(), note);
    agent
}

/// Deleted: the agent makes it anew.
fn sink_deleted(run: &mut Run<'_>) {
    let start = Instant::now();
    run.topo.node.sh(&format!("ip link del {}", run.env.sink()));
    let end = Instant::now();
    let back = wait_until(RESUME, || status(run.env).mirror.ifindex.is_some());
    assert!(back, "the sink was not recreated");
    run.after("sink deleted", start, end, String::new());
}

/// Set down: the agent brings it up again.
fn sink_down(run: &mut Run<'_>) {
    let start = Instant::now();
    let (sink, peer) = (run.env.sink(), run.env.sink_peer());
    run.topo.node.sh(&format!("ip link set {sink} down && ip link set {peer} down"));
    let end = Instant::now();
    run.after("sink set down", start, end, String::new());
}

/// A flood of new flows, many times the table's size, through the client's veth.
fn flow_table_full(run: &mut Run<'_>, dst: Ipv4Addr) {
    let created = |run: &Run<'_>| status(run.env).counters["flows_created"];
    let before = created(run);
    let pod = run.topo.pod("client");
    flood::blackhole(&run.topo.node, dst);
    let start = Instant::now();
    let took = flood::syn_flood(&pod.ns, pod.v4, dst, FLOOD);
    let end = Instant::now();
    let new = created(run) - before;
    let (live, size) = (map_entries(run.env, "flow_table"), map_size(run.env, "flow_table"));
    assert_eq!(size, FLOWS_MAX);
    assert!(new >= u64::from(FLOOD), "{new} flows created by a flood of {FLOOD}");
    assert!(live <= size, "{live} flows in a table of {size}");
    let note = format!("{FLOOD} flows in {} ms: {new} created, {live}/{size} live", took.as_millis());
    run.after("flow table full", start, end, note);
}

/// The agent stopped (SIGSTOP) while more triggers than its ring buffer holds happen; then
/// let go (SIGCONT): the lost events are counted, the next one is read.
fn ring_buffer_full(run: &mut Run<'_>, agent: &Agent<'_>) {
    let slot = std::mem::size_of::<mirror_bpf::types::trigger_event>() + 8;
    let triggers = 256 * 1024 / slot + 200;
    let server = SocketAddr::new(run.topo.pod("server").addr(false), HTTP);
    let bar = raw::get("/bar");
    let path = run.topo.pod("client").ns.path();
    let before = status(run.env).counters["ringbuf_drops"];
    let start = Instant::now();
    signal(agent, libc::SIGSTOP);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                join(&path);
                for _ in 0..triggers.div_ceil(4) {
                    assert_eq!(raw::exchange_here(server, std::slice::from_ref(&bar)).finals(), [500]);
                }
            });
        }
    });
    signal(agent, libc::SIGCONT);
    let end = Instant::now();
    let dropped = status(run.env).counters["ringbuf_drops"] - before;
    assert!(dropped > 0, "{triggers} triggers did not fill the ring buffer");
    // The next trigger's event is read.
    let fresh = raw::exchange(&run.topo.pod("client").ns, server, &[bar]).local.port();
    let seen = |run: &Run<'_>| {
        let text = run.env.ctl_ok(&["-o", "json", "events", "--limit", "5"]);
        text.contains(&format!(":{fresh}\""))
    };
    let asked = Instant::now();
    assert!(wait_until(RESUME, || seen(run)), "the event of a trigger after SIGCONT was not read");
    let note = format!(
        "{triggers} triggers, {dropped} events lost; the next read in {} ms",
        asked.elapsed().as_millis()
    );
    run.after("ring buffer full, no reader", start, end, note);
}

/// A second agent with the same configuration refuses; the first goes on.
fn second_agent(run: &mut Run<'_>, agent: &Agent<'_>) {
    let start = Instant::now();
    let mut cmd = std::process::Command::new("timeout");
    cmd.arg("20").arg("nsenter").arg(format!("--net={}", run.topo.node.path())).arg("--");
    cmd.arg(&bins().agent).arg("--config").arg(run.env.config_path());
    let out = cmd.output().expect("running a second agent");
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("another mirror-agent"), "{said}");
    let end = Instant::now();
    assert!(said.contains(&format!("pid {}", agent.pid())), "{said}");
    run.after("second agent started", start, end, "refused".into());
}

fn signal(agent: &Agent<'_>, sig: i32) {
    // SAFETY: a signal to the agent we started, which has not been reaped.
    assert_eq!(unsafe { libc::kill(agent.pid() as i32, sig) }, 0);
}

/// Prints the figures of each fault (requests sent from its start until the next fault's) and
/// asserts that no request failed or stalled and that iperf3 never stopped.
fn report(
    figures: &[Figure],
    marked: &[Request],
    load: &[Request],
    iperf: &[load::IperfRun],
    began: Instant,
    ended: Instant,
) {
    let all: Vec<Request> = marked.iter().chain(load).cloned().collect();
    println!(
        "{:<38} {:>8} {:>6} {:>9} {:>10} {:>8}  note",
        "fault", "requests", "failed", "max ms", "resume ms", "gap ms"
    );
    for (i, f) in figures.iter().enumerate() {
        let to = figures.get(i + 1).map_or(ended, |n| n.start);
        let (n, failed, max) = load::summary(&all, f.start, to);
        println!(
            "{:<38} {n:>8} {failed:>6} {:>9.1} {:>10.1} {:>8.1}  {}",
            f.fault,
            max.as_secs_f64() * 1e3,
            f.resumed.as_secs_f64() * 1e3,
            f.gap.as_secs_f64() * 1e3,
            f.note
        );
    }
    let (n, failed, max) = load::summary(&all, began, ended);
    let intervals: Vec<f64> = iperf.iter().flat_map(|r| r.intervals.iter().copied()).collect();
    let min = intervals.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = intervals.iter().sum::<f64>() / intervals.len().max(1) as f64;
    println!(
        "all faults: {n} requests, {failed} failed, max {:.1} ms; iperf3: {} runs, {} intervals of 0.25 s, \
         min {:.0} Mbit/s, mean {:.0} Mbit/s, {} retransmissions",
        max.as_secs_f64() * 1e3,
        iperf.len(),
        intervals.len(),
        min / 1e6,
        mean / 1e6,
        iperf.iter().map(|r| r.retransmits).sum::<u64>()
    );
    let failures: Vec<&String> = all.iter().filter_map(|r| r.error.as_ref()).collect();
    assert!(
        failures.is_empty(),
        "{} requests failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(max < STALL, "a request stalled for {max:?}");
    for f in figures {
        assert!(f.resumed < RESUME, "{}: mirroring resumed after {:?}", f.fault, f.resumed);
    }
    let broken: Vec<&String> = iperf.iter().filter(|r| !r.ok).map(|r| &r.output).collect();
    assert!(broken.is_empty(), "iperf3 runs failed: {broken:?}");
    assert!(min > 0.0, "an iperf3 interval carried nothing");
}
