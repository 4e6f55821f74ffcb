//! Rules added and deleted with mirrorctl act on live traffic at once; mirrorctl's flows,
//! rules and status, and the metrics, say what happened.

mod common;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::capture::tcpdump::Recorder;
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

use common::{add_rule, bins, flows, json, rules, status, ATTACH, VETHS};

/// Where the metrics listen, inside the test's own node namespace.
const METRICS: &str = "127.0.0.1:9464";

/// The value of a sample in the Prometheus text.
fn sample(metrics: &str, name: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn rules_from_mirrorctl_act_on_live_traffic() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let cfg = AgentConfig { metrics: METRICS.into(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);

    let recorder = Recorder::new(env.dir());
    let client = &topo.pod("client").ns;
    let server = topo.pod("server").addr(false);
    let sink = env.sink_peer();
    let record = |traffic: &dyn Fn()| recorder.record(client, Some((&topo.node, sink.as_str())), traffic);

    // No rule yet: a 500 is not mirrored.
    let rec = record(&|| assert_eq!(client::get_each(client, &[url(server, HTTP, "/bar")]), [500]));
    assert_eq!(rec.mirror.packets.len(), 0, "mirrored without a rule");
    assert!(rules(&env).is_empty());

    let id = add_rule(&env, "status=500");
    let listed = rules(&env);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].id, listed[0].hits), (id, 0));
    assert!(listed[0].rule.starts_with("status=500"), "{listed:?}");

    // /foo /bar /foo on one connection (mirrored from the 500 on), /foo /foo on another.
    let rec = record(&|| {
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
        let urls = ["/foo", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 200]);
    });
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    expected.assert_mirror(&rec.mirror);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (1, 1));
    let t = &expected.triggered[0];

    // The flows: the triggered one with its rule and exactly its packets, the other unmarked.
    let all = flows(&env);
    let find = |lo: String, hi: String| all.iter().find(|f| f.lo == lo && f.hi == hi);
    let f =
        find(t.flow.lo.to_string(), t.flow.hi.to_string()).unwrap_or_else(|| panic!("{t:?} not in {all:?}"));
    assert_eq!(
        (f.rule_id, f.status, f.mirrored_packets, f.mirror_ended),
        (Some(id), Some(500), t.packets, false)
    );
    for u in expected.untriggered() {
        let f = find(u.lo.to_string(), u.hi.to_string()).unwrap_or_else(|| panic!("{u} not in {all:?}"));
        assert_eq!((f.rule_id, f.mirrored_packets), (None, 0), "{f:?}");
    }
    // Mirrored flows come first in the table.
    assert_eq!(all[0].rule_id, Some(id), "{all:?}");
    let table = env.ctl_ok(&["flows"]);
    assert!(table.starts_with("ENDPOINT A"), "{table}");
    assert!(table.contains(&format!("rule {id} (500)")), "{table}");
    assert_eq!(rules(&env)[0].hits, 1);

    let st = status(&env);
    assert_eq!(st.counters["triggers"], 1, "{st:?}");
    assert_eq!(st.counters["mirrored_packets"], rec.mirror.packets.len() as u64, "{st:?}");
    assert_eq!((st.counters["mirror_errors"], st.counters["mirror_no_target"]), (0, 0), "{st:?}");
    // The veth sink the agent created: copies go straight into its peer's receive path.
    let m = &st.mirror;
    assert_eq!(
        (m.copies_to.as_deref(), m.delivery.as_deref()),
        (Some(sink.as_str()), Some("ingress")),
        "{m:?}"
    );
    let table = env.ctl_ok(&["status"]);
    assert!(VETHS.iter().all(|v| table.contains(v)), "{table}");
    assert!(table.contains(&format!("mirror interface {}", env.sink())), "{table}");
    assert!(table.contains(&format!("copies received by {sink}")), "{table}");

    let metrics = topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    assert_eq!(sample(&metrics, "mirror_triggers_total"), Some(1), "{metrics}");
    assert_eq!(sample(&metrics, "mirror_attached_interfaces"), Some(2), "{metrics}");
    let hits = format!("mirror_rule_hits_total{{rule_id=\"{id}\",");
    assert!(metrics.lines().any(|l| l.starts_with(&hits) && l.ends_with(" 1")), "{metrics}");

    // JSON output of add, and of del.
    let second: mirror_agent::views::RuleView =
        json(&env.ctl_ok(&["-o", "json", "rules", "add", "status=5xx", "port=8080"]));
    assert!(second.id != id && second.rule.starts_with("port=8080 status=5xx"), "{second:?}");
    let deleted: mirror_agent::views::RuleView =
        json(&env.ctl_ok(&["rules", "del", &second.id.to_string(), "-o", "json"]));
    assert_eq!(deleted.id, second.id);

    // Deleted: the next 500 is not mirrored.
    let out = env.ctl_ok(&["rules", "del", &id.to_string()]);
    assert!(out.starts_with(&format!("deleted rule {id}: status=500")), "{out}");
    assert!(rules(&env).is_empty());
    let rec = record(&|| assert_eq!(client::get_each(client, &[url(server, HTTP, "/bar")]), [500]));
    assert_eq!(rec.mirror.packets.len(), 0, "mirrored after the rule was deleted");
    assert_eq!(status(&env).counters["triggers"], 1);
    agent.terminate();
}
