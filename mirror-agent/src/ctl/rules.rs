//! `mirrorctl rules add|list|del`: the trigger rules (`/v1/rules`).

use clap::Subcommand;
use hyper::Method;

use super::{print_json, table};
use crate::api::client::Client;
use crate::views::{NewRule, RuleView};

/// The rule syntax with examples, after `mirrorctl rules add --help`.
const RULE_HELP: &str = "\
Syntax: one trigger, then filters and limits, in any order.
  triggers  status=CODES (500, 5xx, 500-504, 502,503), grpc-status=CODES (names or 0-63),
            dns=RCODES (nxdomain, servfail, ..., 0-15, any), reset, 'noresponse>DURATION',
            'latency>DURATION'
  filters   port=P; HTTP: method=GET[,POST], path=/PREFIX, host=NAME;
            DNS (dns=, noresponse>): qname=SUFFIX, qname=!SUFFIX (names not under it), qtype=TYPE
  limits    packets=N, bytes=N, duration=DURATION per flow (0: unlimited; default 10000 packets or 60s)
Examples:
  mirrorctl rules add status=5xx
  mirrorctl rules add status=500 method=POST path=/api/checkout packets=1000 duration=30s
  mirrorctl rules add 'noresponse>2s' port=8080
  mirrorctl rules add grpc-status=internal,unavailable
  mirrorctl rules add dns=nxdomain,servfail qname=.svc.cluster.local qtype=AAAA
  mirrorctl rules add reset host=shop.example";

#[derive(Subcommand)]
pub enum RulesCommand {
    /// Add a rule, e.g. `status=500`, `status=5xx`, `port=8080 status=500-504 packets=1000 duration=30s`,
    /// `grpc-status=internal,unavailable`, `'latency>200ms'` (quote a rule with `>`: the shell
    /// reads it as a redirection).
    #[command(after_help = RULE_HELP)]
    Add {
        /// The rule's key=value tokens.
        #[arg(required = true, num_args = 1..)]
        tokens: Vec<String>,
    },
    /// List the rules with their hit counts.
    List,
    /// Delete a rule by id.
    Del {
        /// The rule's id.
        id: u32,
    },
}

/// `mirrorctl rules list`: the source is `local` (this node's configuration or mirrorctl) or
/// the cluster resource the rule comes from.
const RULE_COLUMNS: [&str; 5] = ["ID", "KIND", "HITS", "SOURCE", "RULE"];

fn rule_rows(rules: &[RuleView]) -> Vec<Vec<String>> {
    rules
        .iter()
        .map(|r| {
            let source = r.source.clone().unwrap_or_else(|| "local".into());
            vec![r.id.to_string(), r.kind.clone(), r.hits.to_string(), source, r.rule.clone()]
        })
        .collect()
}

/// Runs `rules add`, `rules list` or `rules del`.
pub async fn run(c: &Client<'_>, json: bool, command: RulesCommand) -> anyhow::Result<()> {
    match command {
        RulesCommand::Add { tokens } => add(c, json, tokens).await,
        RulesCommand::List => {
            let rules: Vec<RuleView> = c.call(Method::GET, "/v1/rules", None).await?;
            if json {
                print_json(&rules)
            } else {
                print!("{}", table::render(&RULE_COLUMNS, &rule_rows(&rules)));
                Ok(())
            }
        }
        RulesCommand::Del { id } => {
            let r: RuleView = c.call(Method::DELETE, &format!("/v1/rules/{id}"), None).await?;
            if json {
                print_json(&r)
            } else {
                println!("deleted rule {}: {}", r.id, r.rule);
                Ok(())
            }
        }
    }
}

/// `rules add`: prints the new rule's id, or the id of the same rule already there.
async fn add(c: &Client<'_>, json: bool, tokens: Vec<String>) -> anyhow::Result<()> {
    let rule = tokens.join(" ");
    // Refuse a bad rule here, pointing at the token, before bothering the agent.
    crate::rules::parse(&rule)?;
    let body = serde_json::to_string(&NewRule { rule })?;
    let (status, r): (_, RuleView) = c.call_with_status(Method::POST, "/v1/rules", Some(body)).await?;
    if status != hyper::StatusCode::CREATED {
        eprintln!("mirrorctl: the same rule exists already as rule {}: nothing added", r.id);
    }
    if json {
        print_json(&r)
    } else {
        println!("{}", r.id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_list_names_the_kind() {
        let rule: mirror_bpf::Rule = "grpc-status=internal".parse().unwrap();
        let view = RuleView {
            id: 4,
            rule: rule.to_string(),
            kind: rule.kind().name().into(),
            hits: 2,
            source: None,
        };
        let cluster = RuleView { id: 5, source: Some("MirrorRule shop/checkout".into()), ..view.clone() };
        let text = table::render(&RULE_COLUMNS, &rule_rows(&[view, cluster]));
        assert!(
            text.contains("4   grpc-status  2     local                     grpc-status=INTERNAL packets=10000 bytes=0 duration=60s\n"),
            "{text}"
        );
        assert!(
            text.contains("5   grpc-status  2     MirrorRule shop/checkout  grpc-status=INTERNAL"),
            "{text}"
        );
    }
}
