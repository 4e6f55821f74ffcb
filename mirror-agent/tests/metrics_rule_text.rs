//! `metrics.rule_text: false` keeps the rules' text out of /metrics, which any local user can
//! read: rule hits are labelled with the rule's id only.

mod common;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::topology::netns::Topology;

use common::{bins, rules};

#[test]
fn rule_hits_without_the_rules_text() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let metrics = "127.0.0.1:9464";
    let scrape = || topo.node.sh(&format!("curl -sS --max-time 5 http://{metrics}/metrics"));
    for rule_text in [false, true] {
        let cfg = AgentConfig {
            metrics: metrics.into(),
            metrics_rule_text: rule_text,
            rules: vec!["port=8080 status=503".into()],
            ..AgentConfig::default()
        };
        let env = AgentEnv::new(&bins(), &topo.node, &cfg);
        let agent = env.start(&[]);
        let id = rules(&env)[0].id;
        let text = scrape();
        let hits: Vec<&str> = text.lines().filter(|l| l.starts_with("mirror_rule_hits_total")).collect();
        if rule_text {
            let want = format!(
                "mirror_rule_hits_total{{rule_id=\"{id}\",kind=\"status\",rule=\"port=8080 status=503 "
            );
            assert!(hits.len() == 1 && hits[0].starts_with(&want), "{hits:?}");
        } else {
            assert_eq!(
                hits,
                [format!("mirror_rule_hits_total{{rule_id=\"{id}\",kind=\"status\"}} 0")],
                "{text}"
            );
            assert!(!text.contains("status=503"), "{text}");
        }
        agent.terminate();
    }
}
