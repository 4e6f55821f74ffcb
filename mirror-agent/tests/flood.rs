//! A flood of new flows under a running agent: `MIRROR_FLOOD_FLOWS` TCP SYNs (default 100,000;
//! 300,000 in `make reliability`), each of a flow of its own, through the client pod's veth,
//! while a keep-alive connection marked by a `status=500` rule before the flood goes on asking
//! every 20 ms. The flow table evicts its least recently used flows; the marked connection is
//! mirrored throughout and after; the agent's descriptors and memory, the node's links, the
//! filters on the veths and the pins are as before, and every map within its size. The
//! figures before and after are printed (`--nocapture`).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::capture::footprint::{map_size, Footprint};
use mirror_e2e::capture::mirror_watch::MirrorWatch;
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::flood;
use mirror_e2e::workload::load::{HttpLoad, HttpSpec};
use mirror_e2e::workload::servers::Server;

use common::{bins, status, ATTACH, VETHS};

/// Where the flood goes (the node drops it).
const FLOOD_DST: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
/// Where the warm-up flood goes (other flows than the flood's).
const WARM_UP_DST: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
/// The maps whose entries are compared.
const MAPS: [&str; 5] = ["flow_table", "flow_timing_index", "flow_nat", "mirror_marks", "attached_ifaces"];

#[test]
fn a_flood_of_new_flows_keeps_a_marked_flow_mirrored_and_leaks_nothing() {
    if !require_root() {
        return;
    }
    let flows: u32 = std::env::var("MIRROR_FLOOD_FLOWS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let topo = Topology::without_sink(&PODS);
    let cfg = AgentConfig { rules: vec!["status=500 packets=0 duration=0".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx_long_lived(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let server = SocketAddr::new(topo.pod("server").addr(false), HTTP);
    let client = topo.pod("client");
    flood::blackhole(&topo.node, FLOOD_DST);
    flood::blackhole(&topo.node, WARM_UP_DST);

    let watch = MirrorWatch::start(&topo.node, &env.sink_peer());
    let spec = HttpSpec {
        connections: 1,
        first: Some(("/bar", 500)),
        path: "/foo",
        pause: Duration::from_millis(20),
    };
    let marked = HttpLoad::start(&client.ns, server, &spec);
    assert!(wait_until(Duration::from_secs(5), || !marked.ports().is_empty()), "the marked connection");
    let port = marked.ports()[0];
    assert!(
        watch.next_copy(port, Instant::now(), Duration::from_secs(5)).is_some(),
        "the marked connection is not mirrored"
    );
    // A small flood first: the baseline is taken with the table's memory in use.
    flood::syn_flood(&client.ns, client.v4, WARM_UP_DST, 1000);
    let take = || Footprint::take(agent.pid(), &env, &topo.node, &VETHS, &MAPS);
    let counter = |name: &str| status(&env).counters[name];
    let created = || counter("flows_created");
    let failed_before = counter("flow_insert_failed");
    let (before, created_before) = (take(), created());

    let start = Instant::now();
    let took = flood::syn_flood(&client.ns, client.v4, FLOOD_DST, flows);
    let end = Instant::now();
    let next = watch.next_copy(port, end, Duration::from_secs(1));
    let during = watch.copies_of(port).into_iter().filter(|t| *t > start && *t <= end).count();
    std::thread::sleep(Duration::from_millis(200));
    let (after, created_after) = (take(), created());
    let new = created_after - created_before;
    let size = map_size(&env, "flow_table");
    let live = after.entries("flow_table");
    let evicted = (before.entries("flow_table") as u64 + new).saturating_sub(live as u64);
    let insert_failed = counter("flow_insert_failed") - failed_before;
    println!(
        "{flows} flows flooded in {} ms ({:.0} k/s); flow_table of {size}: {new} flows created, {live} live, \
         {evicted} evicted, {insert_failed} inserts failed; the marked connection: {during} copies during the \
         flood, the next {:?} after it",
        took.as_millis(),
        f64::from(flows) / took.as_secs_f64() / 1e3,
        next.map(|t| t - end),
    );
    println!("before: {before}");
    println!("after:  {after}");

    assert!(next.is_some(), "the marked connection was not mirrored within 1 s of the flood's end");
    assert!(new >= u64::from(flows), "{new} flows created by a flood of {flows}");
    for m in MAPS {
        let (n, max) = (after.entries(m), map_size(&env, m));
        assert!(n <= max, "{m}: {n} entries in a map of {max}");
    }
    assert!(after.entries("mirror_marks") >= 1, "the mark was lost");
    if before.entries("flow_table") + flows as usize > size {
        // Least recently used flows make room: the table stays full, new flows are counted.
        assert!(evicted > 0 && live > size / 2, "{live} of {size} live, {evicted} evicted");
    }
    assert_eq!(
        (after.links, after.filters, after.pins, after.entries("attached_ifaces")),
        (before.links, before.filters, before.pins, before.entries("attached_ifaces")),
        "links, filters, pins or attached interfaces changed"
    );
    assert!(after.fds <= before.fds, "the agent's descriptors grew: {} -> {}", before.fds, after.fds);
    let growth = after.rss_kib.saturating_sub(before.rss_kib);
    assert!(growth < 4096, "RSS grew by {growth} KiB over a flood of {flows} flows");
    assert_eq!(marked.ports(), [port], "the marked connection was reopened");
    let requests = marked.finish();
    let failed: Vec<_> = requests.iter().filter_map(|r| r.error.as_ref()).collect();
    assert!(failed.is_empty(), "the marked connection failed: {failed:?}");
    let longest = requests.iter().map(|r| r.took).max().unwrap_or_default();
    assert!(longest < Duration::from_secs(1), "a request of the marked connection stalled: {longest:?}");
    agent.terminate();
}
