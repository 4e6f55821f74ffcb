//! Restarts: after SIGTERM with --keep-attached and after SIGKILL, the classifier stays on the
//! links and keeps mirroring while no agent runs; the next agent adopts it with the rules
//! (same ids), the flows and their marks. One keep-alive connection, marked before the first
//! stop, is used throughout: every packet of it from the 500 on is mirrored exactly once.
//! Tables pinned with other sizes than the configuration's are adopted as they are, with a
//! warning, and the status's memory report (the figures of `--check`) counts them so. A stop
//! that reaches an agent while a newer one waits to take over hands over instead of removing
//! what the newer one adopts.

mod common;

use std::process::Command;

use mirror_agent::views::MemoryView;
use mirror_bpf::testing::{ifindex, require_root};
use mirror_e2e::agent::{Agent, AgentConfig, AgentEnv};
use mirror_e2e::capture::tcpdump::{Recorder, Recording};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url, Session};
use mirror_e2e::workload::servers::Server;

use common::{add_rule, bins, flows, link_exists, rules, status, tcx_programs, ATTACH, METRICS, VETHS};

/// Rules and ids as listed (hits aside).
fn rule_ids(env: &AgentEnv) -> Vec<(u32, String)> {
    rules(env).into_iter().map(|r| (r.id, r.rule)).collect()
}

/// Asserts that the classifier, and only one instance of it, is on both hooks of every veth.
#[track_caller]
fn attached_once() {
    for v in VETHS {
        assert_eq!(tcx_programs(ifindex(v)), [1, 1], "{v}");
    }
}

/// Starts an agent and checks that it adopted what the last one left, rules included.
#[track_caller]
fn adopting<'a>(env: &'a AgentEnv, rules_before: &[(u32, String)]) -> Agent<'a> {
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let st = status(env);
    assert!(st.adopted, "did not adopt: {st:?}\n{}", agent.output());
    assert_eq!(rule_ids(env), rules_before);
    attached_once();
    agent
}

/// Records the client pod and the sink while `body` runs on one keep-alive connection from the
/// client to the server whose first request, `/bar`, was answered 500 (marked under a
/// `status=500` rule): `body` gets a check that the next request on that connection is answered
/// as wanted. Returns the recording and what `body` returned.
fn on_a_marked_connection<'a>(
    topo: &Topology,
    env: &'a AgentEnv,
    body: impl FnOnce(&mut dyn FnMut(&str, u16)) -> Agent<'a>,
) -> (Recording, Agent<'a>) {
    let client = &topo.pod("client").ns;
    let server = topo.pod("server").addr(false);
    let sink = env.sink_peer();
    let mut out = None;
    let rec = Recorder::new(env.dir()).record(client, Some((&topo.node, sink.as_str())), || {
        let mut session = Session::open(client, server, HTTP);
        let (code, port) = session.get("/bar");
        assert_eq!(code, 500);
        let mut same_connection =
            |path: &str, want: u16| assert_eq!(session.get(path), (want, port), "{path}");
        out = Some(body(&mut same_connection));
    });
    (rec, out.expect("the traffic ran"))
}

#[test]
fn restarts_keep_the_data_path_rules_and_marks() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    // TCX queries and link lookups act in the calling thread's namespace.
    let _inside = topo.node.enter();
    let env = AgentEnv::new(&bins(), &topo.node, &AgentConfig::default());
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&["--keep-attached"]);
    agent.wait_attached(&VETHS, ATTACH);
    // Ids with a gap, to see them kept rather than renumbered.
    let id = add_rule(&env, "status=500");
    let gone = add_rule(&env, "status=404");
    add_rule(&env, "status=503");
    env.ctl_ok(&["rules", "del", &gone.to_string()]);
    let rules_before = rule_ids(&env);
    assert!(!status(&env).adopted);

    let (client, server) = (&topo.pod("client").ns, topo.pod("server").addr(false));
    let (rec, last) = on_a_marked_connection(&topo, &env, |same_connection| {
        // SIGTERM with --keep-attached: everything stays, and mirrors.
        let log = agent.terminate();
        assert!(log.contains("leaving the data path attached"), "{log}");
        attached_once();
        assert!(link_exists(env.sink()) && env.pin_path().join("links").exists());
        same_connection("/foo", 200);
        assert_eq!(client::get_each(client, &[url(server, HTTP, "/bar")]), [500]);

        let agent = adopting(&env, &rules_before);
        same_connection("/foo", 200);

        // SIGKILL: nothing is cleaned up, and the next agent adopts it all the same.
        agent.kill();
        same_connection("/foo", 200);
        let agent = adopting(&env, &rules_before);
        same_connection("/foo", 200);
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
        same_connection("/bar", 500);
        agent
    });

    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 3, "{:?}", expected.triggered);
    // The session's mark, set by the first agent, counted every packet since, through both
    // restarts and while no agent ran.
    let t = &expected.triggered[0];
    let all = flows(&env);
    let f = all
        .iter()
        .find(|f| f.lo == t.flow.lo.to_string() && f.hi == t.flow.hi.to_string())
        .unwrap_or_else(|| panic!("{t:?} not in {all:?}"));
    assert_eq!((f.rule_id, f.status, f.mirrored_packets), (Some(id), Some(500), t.packets), "{f:?}");
    let hits = rules(&env).into_iter().find(|r| r.id == id).map(|r| r.hits);
    assert_eq!(hits, Some(3), "hits of rule {id} survive restarts");
    assert_eq!(status(&env).counters["triggers"], 3);

    last.terminate();
    assert!(!link_exists(env.sink()), "the sink outlived a clean stop");
    assert!(!env.pin_path().exists(), "pins outlived a clean stop");
}

/// A rolling update's race: the new agent (`--take-over`) has claimed the succession, and the
/// old one is stopped (its pod deleted) before the new one's request reaches it. A stop then
/// hands over: the old agent, started without `--keep-attached`, leaves the classifier
/// attached, its pins and the very same sink (never removed under a capture), and the next
/// agent adopts them; a 500 answered while no agent runs is mirrored, and one keep-alive
/// connection marked before is mirrored exactly once throughout. While the successor waits,
/// the old agent's `/readyz` is not ready (the new pod's probes reach it until the hand-over).
#[test]
fn a_stop_while_a_successor_waits_hands_over() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let _inside = topo.node.enter();
    let cfg = AgentConfig { metrics: METRICS.into(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let id = add_rule(&env, "status=500");
    let rules_before = rule_ids(&env);
    let sink_index = status(&env).mirror.ifindex.expect("the sink");
    let readyz =
        || topo.node.sh(&format!("curl -s --max-time 5 -w ' %{{http_code}}' http://{METRICS}/readyz"));
    assert!(readyz().trim().ends_with(" 200"), "{}", readyz());

    let (client, server) = (&topo.pod("client").ns, topo.pod("server").addr(false));
    let (rec, last) = on_a_marked_connection(&topo, &env, |same_connection| {
        // The successor's claim, as `--take-over` takes it before anything else.
        let claim = mirror_agent::handover::begin(&env.socket(), true).expect("claiming the succession");
        assert!(matches!(claim, mirror_agent::handover::Begin::Successor { .. }));
        let said = readyz();
        assert!(said.contains("handing over to a newer agent") && said.ends_with(" 503"), "{said}");

        let log = agent.terminate();
        assert!(log.contains("stopped while a newer agent waits to take over: handing over"), "{log}");
        assert!(!log.contains("detached everywhere") && !log.contains("mirror sink removed"), "{log}");
        attached_once();
        assert!(link_exists(env.sink()) && env.pin_path().join("links").exists());
        assert_eq!(ifindex(env.sink()), sink_index, "the sink was made anew");
        same_connection("/foo", 200);
        assert_eq!(client::get_each(client, &[url(server, HTTP, "/bar")]), [500]);

        // The successor goes on: the lock is free, everything is adopted as left.
        drop(claim);
        let next = env.start(&["--take-over"]);
        next.wait_attached(&VETHS, ATTACH);
        let st = status(&env);
        assert!(st.adopted, "did not adopt: {st:?}\n{}", next.output());
        assert_eq!(st.mirror.ifindex, Some(sink_index), "{st:?}");
        assert!(st.mirror.created, "the adopted sink is the agent's to remove: {st:?}");
        assert_eq!(rule_ids(&env), rules_before);
        attached_once();
        same_connection("/foo", 200);
        assert_eq!(client::get_each(client, &[url(server, HTTP, "/bar")]), [500]);
        same_connection("/foo", 200);
        next
    });

    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!(expected.triggered.len(), 3, "{:?}", expected.triggered);
    let hits = rules(&env).into_iter().find(|r| r.id == id).map(|r| r.hits);
    assert_eq!(hits, Some(3), "a trigger missed through the hand-over");

    // The successor owns it all now: its stop removes everything.
    last.terminate();
    assert!(!link_exists(env.sink()), "the sink outlived a clean stop");
    assert!(!env.pin_path().exists(), "pins outlived a clean stop");
}

/// The entries of map `name` in a status's memory report.
#[track_caller]
fn entries(memory: &MemoryView, name: &str) -> u32 {
    memory.maps.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no {name}: {memory:?}")).entries
}

#[test]
fn a_table_pinned_with_another_size_is_adopted_with_a_warning() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let env = AgentEnv::new(&bins(), &topo.node, &AgentConfig::default());
    let agent = env.start(&["--keep-attached"]);
    // The maps' memory in `mirrorctl status` is what `--check` says of the same configuration.
    let check =
        Command::new(bins().agent).arg("--config").arg(env.config_path()).arg("--check").output().unwrap();
    let check = String::from_utf8_lossy(&check.stdout).into_owned();
    // After the first line, before the node's requirements.
    let report = check.split_once('\n').map(|(_, rest)| rest).unwrap_or_default();
    let report = report.split("node requirements").next().unwrap_or_default();
    assert!(report.starts_with("kernel memory of the data path's maps on "), "{check}");
    let text = env.ctl_ok(&["status"]);
    assert!(text.contains(report), "--check said:\n{check}\nstatus said:\n{text}");
    let first = status(&env).memory.expect("the maps' memory in the status");
    assert_eq!(first.total_bytes, first.maps.iter().map(|m| m.bytes).sum::<u64>());
    agent.terminate();
    // The next agent is configured with other sizes than the pinned tables have.
    let config = env.config_path();
    let yaml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{yaml}flows:\n  max: 4096\n  marks_max: 1024\n")).unwrap();
    let agent = env.start(&[]);
    let st = status(&env);
    assert!(st.adopted);
    // The report counts the maps as loaded, the pinned sizes; other CPU counts, the configured.
    let memory = st.memory.expect("the maps' memory in the status");
    assert_eq!(entries(&memory, "flow_table"), entries(&first, "flow_table"));
    assert_eq!((entries(&memory, "mirror_marks"), memory.total_bytes), (16_384, first.total_bytes));
    assert_eq!(memory.flows_max, "4096");
    assert!(memory.other_cpus.iter().all(|c| c.flows == 4096), "{memory:?}");
    let log = agent.terminate();
    for key in ["flows.max: the pinned flow_table", "flows.marks_max: the pinned mirror_marks"] {
        assert!(log.contains(key), "no warning on {key}: {log}");
    }
    // Adopted, not replaced by tables of the configured size.
    assert!(!log.contains("a pinned map differs from ours"), "{log}");
}
