//! mirrorctl: the operator's CLI, one subcommand per API resource.

pub mod capture;
pub mod events;
pub mod hist;
pub mod table;
pub mod top;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use hyper::Method;
use serde::Serialize;

use crate::api::client::Client;
use crate::api::text::trigger_text;
use crate::config::DEFAULT_SOCKET;
use crate::views::{FlowView, GroupView, HistogramView, NewRule, PodView, RuleView, SetGroup, StatusView};

/// Drive the mirror agent of this node.
#[derive(Parser)]
#[command(name = "mirrorctl", version)]
pub struct Args {
    /// The agent's API socket.
    #[arg(long, env = "MIRRORCTL_SOCKET", default_value = DEFAULT_SOCKET, global = true)]
    pub socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    #[command(subcommand)]
    command: Command,
}

/// Output formats.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// An aligned table.
    Table,
    /// JSON, as the API returns it.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Trigger rules.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Attached interfaces, the mirror interface, counters.
    Status,
    /// The pods behind the attached veths: name, namespace, addresses, how they were found.
    Pods,
    /// Top flows: endpoints, their pods, traffic each way, mirrored or not and by which rule.
    Flows {
        /// Show at most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Trigger events: time, interface, both tuples across NAT with their Community IDs,
    /// rule, method, target, status (or gRPC code), response time, HTTP/2 stream and authority.
    Events {
        /// Keep printing events as they come (JSON lines with -o json).
        #[arg(short, long)]
        follow: bool,
        /// Show at most this many of the recent ones.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Write the mirrored packets as pcapng: one interface per pod veth, direction and rule per
    /// packet (run in the agent's network namespace, as root).
    Capture(capture::CaptureArgs),
    /// A live view, refreshed each second: mirror rate and drops, triggers per rule, the
    /// mirrored and the busiest flows by pod (`q` quits).
    Top,
    /// Latency histograms (HTTP response time, TCP handshake), and their groups.
    Latency {
        #[command(subcommand)]
        command: Option<LatencyCommand>,
        /// One histogram per interface instead of one per kind and status class.
        #[arg(long)]
        by_interface: bool,
    },
}

#[derive(Subcommand)]
enum LatencyCommand {
    /// Switch a timing group on (http, handshake).
    Enable {
        /// The group.
        group: String,
    },
    /// Switch a timing group off.
    Disable {
        /// The group.
        group: String,
    },
    /// The timing groups and whether they are on.
    Groups,
}

/// The rule syntax with examples, after `mirrorctl rules add --help`.
const RULE_HELP: &str = "\
Syntax: one trigger, then filters and limits, in any order.
  triggers  status=CODES (500, 5xx, 500-504, 502,503), grpc-status=CODES (names or 0-63), reset,
            'noresponse>DURATION', 'latency>DURATION'
  filters   port=P, method=GET[,POST], path=/PREFIX, host=NAME
  limits    packets=N, bytes=N, duration=DURATION per flow (0: unlimited; default 10000 packets or 60s)
Examples:
  mirrorctl rules add status=5xx
  mirrorctl rules add status=500 method=POST path=/api/checkout packets=1000 duration=30s
  mirrorctl rules add 'noresponse>2s' port=8080
  mirrorctl rules add grpc-status=internal,unavailable
  mirrorctl rules add reset host=shop.example";

#[derive(Subcommand)]
enum RulesCommand {
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

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn print_latency(hists: &[HistogramView], by_interface: bool) {
    if hists.is_empty() {
        println!("no latency measured yet");
        return;
    }
    let mut groups: std::collections::BTreeMap<(String, Option<u8>, String), Vec<&HistogramView>> =
        Default::default();
    for h in hists {
        let iface = if by_interface { format!("{} ", h.interface) } else { String::new() };
        groups.entry((h.kind.clone(), h.class, iface)).or_default().push(h);
    }
    for ((kind, class, iface), hs) in groups {
        let Some(h) = hist::merge(&hs) else { continue };
        let what = match class {
            Some(c) => format!("{kind} {c}xx"),
            None => kind,
        };
        println!(
            "{iface}{what}: {} measured, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
            h.count,
            hist::quantile(&h, 0.5),
            hist::quantile(&h, 0.9),
            hist::quantile(&h, 0.99)
        );
        print!("{}", hist::render(&h));
        println!();
    }
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

/// Runs one mirrorctl command.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let c = Client::new(&args.socket);
    let json = args.output == Output::Json;
    match args.command {
        Command::Latency { command: None, by_interface } => {
            let hists: Vec<HistogramView> = c.call(Method::GET, "/v1/latency", None).await?;
            if json {
                return print_json(&hists);
            }
            print_latency(&hists, by_interface);
        }
        Command::Latency { command: Some(cmd), .. } => {
            let enabled = matches!(cmd, LatencyCommand::Enable { .. });
            let groups: Vec<GroupView> = match cmd {
                LatencyCommand::Groups => c.call(Method::GET, "/v1/latency/groups", None).await?,
                LatencyCommand::Enable { group } | LatencyCommand::Disable { group } => {
                    let body = serde_json::to_string(&SetGroup { enabled })?;
                    c.call(Method::PUT, &format!("/v1/latency/groups/{group}"), Some(body)).await?
                }
            };
            if json {
                return print_json(&groups);
            }
            let rows: Vec<Vec<String>> = groups
                .iter()
                .map(|g| vec![g.group.clone(), if g.enabled { "on" } else { "off" }.into()])
                .collect();
            print!("{}", table::render(&["GROUP", "STATE"], &rows));
        }
        Command::Rules { command: RulesCommand::Add { tokens } } => {
            let rule = tokens.join(" ");
            // Refuse a bad rule here, pointing at the token, before bothering the agent.
            crate::rules::parse(&rule)?;
            let body = serde_json::to_string(&NewRule { rule })?;
            let (status, r): (_, RuleView) =
                c.call_with_status(Method::POST, "/v1/rules", Some(body)).await?;
            if status != hyper::StatusCode::CREATED {
                eprintln!("mirrorctl: the same rule exists already as rule {}: nothing added", r.id);
            }
            if json {
                print_json(&r)?;
            } else {
                println!("{}", r.id);
            }
        }
        Command::Rules { command: RulesCommand::List } => {
            let rules: Vec<RuleView> = c.call(Method::GET, "/v1/rules", None).await?;
            if json {
                print_json(&rules)?;
            } else {
                print!("{}", table::render(&RULE_COLUMNS, &rule_rows(&rules)));
            }
        }
        Command::Rules { command: RulesCommand::Del { id } } => {
            let r: RuleView = c.call(Method::DELETE, &format!("/v1/rules/{id}"), None).await?;
            if json {
                print_json(&r)?;
            } else {
                println!("deleted rule {}: {}", r.id, r.rule);
            }
        }
        Command::Status => {
            let s: StatusView = c.call(Method::GET, "/v1/status", None).await?;
            if json {
                return print_json(&s);
            }
            println!(
                "mirror-agent {}  attach mode {} (TCX available: {})",
                s.version, s.attach_mode, s.tcx_available
            );
            let m = &s.mirror;
            let state = m.ifindex.map_or("absent".to_string(), |i| format!("ifindex {i}"));
            let how = match (m.copies_to.as_deref(), m.delivery.as_deref()) {
                (Some(to), Some("ingress")) => format!("; copies received by {to}"),
                (Some(to), Some(_)) => format!("; copies sent out of {to}"),
                _ => String::new(),
            };
            let kind = m.kind.as_deref().map_or(String::new(), |k| format!("{k}, "));
            println!(
                "mirror interface {} ({kind}{state}{}{how})",
                m.interface,
                if m.created { ", created by the agent" } else { "" }
            );
            let l = &s.attach_latency;
            println!(
                "attach latency: {} attachments, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                l.count, l.p50_ms, l.p99_ms, l.max_ms
            );
            println!("tracing programs: {}", s.tracing);
            let programs: Vec<String> = s
                .programs
                .iter()
                .map(|p| match p.verify_ms {
                    Some(ms) => format!("{} {} ({ms:.0} ms)", p.name, p.verified_insns),
                    None => format!("{} {}", p.name, p.verified_insns),
                })
                .collect();
            println!("protocols: {}", if s.protocols.is_empty() { "-" } else { &s.protocols });
            println!("programs, instructions verified (of 1,000,000): {}\n", programs.join(", "));
            let pod_of = |ifindex: u32| {
                s.pods.iter().find(|p| p.ifindex == ifindex).map_or("-".to_string(), PodView::label)
            };
            let rows: Vec<Vec<String>> = s
                .interfaces
                .iter()
                .map(|i| {
                    vec![
                        i.name.clone(),
                        i.ifindex.to_string(),
                        pod_of(i.ifindex),
                        i.mode.clone(),
                        i.method.clone(),
                        i.directions.join(","),
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(&["INTERFACE", "IFINDEX", "POD", "MODE", "METHOD", "DIRECTIONS"], &rows)
            );
            println!();
            let rows: Vec<Vec<String>> =
                s.counters.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
            print!("{}", table::render(&["COUNTER", "VALUE"], &rows));
            println!(
                "(duplicate: packets seen a second time, on the other pod's veth, and skipped there so \
                 that each is mirrored once; non_tcp: ARP, ICMP, UDP and the like, passed on untouched)"
            );
            if !s.net_cpu.is_empty() {
                let pct = |v: f64| format!("{:.1}%", v * 100.0);
                let rows: Vec<Vec<String>> = s
                    .net_cpu
                    .iter()
                    .map(|c| vec![c.cpu.to_string(), pct(c.syscall), pct(c.softirq_rx), pct(c.softirq_tx)])
                    .collect();
                println!();
                print!("{}", table::render(&["CPU", "SEND/RECV CALLS", "NET_RX", "NET_TX"], &rows));
            }
        }
        Command::Events { follow, limit } => events::run(&c, json, follow, limit).await?,
        Command::Capture(a) => capture::run(&c, a).await?,
        Command::Top => top::run(&c).await?,
        Command::Pods => {
            let pods: Vec<PodView> = c.call(Method::GET, "/v1/pods", None).await?;
            if json {
                return print_json(&pods);
            }
            let rows: Vec<Vec<String>> = pods
                .iter()
                .map(|p| {
                    vec![
                        p.interface.clone(),
                        p.name.clone(),
                        p.namespace.clone().unwrap_or_else(|| "-".into()),
                        p.addresses.join(","),
                        p.source.clone(),
                        p.netns.clone().unwrap_or_else(|| "-".into()),
                        p.pid.map_or("-".into(), |p| p.to_string()),
                        labels_text(&p.labels),
                    ]
                })
                .collect();
            let header = ["INTERFACE", "POD", "NAMESPACE", "ADDRESSES", "FROM", "NETNS", "PID", "LABELS"];
            print!("{}", table::render(&header, &rows));
        }
        Command::Flows { limit } => {
            let flows: Vec<FlowView> = c.call(Method::GET, &format!("/v1/flows?limit={limit}"), None).await?;
            if json {
                return print_json(&flows);
            }
            let rows: Vec<Vec<String>> = flows
                .iter()
                .map(|f| {
                    let mirrored = match (f.rule_id, f.status) {
                        (Some(r), Some(s)) => {
                            let on = trigger_text(f.trigger.as_deref(), s, None);
                            format!("rule {r} ({on}){}", if f.mirror_ended { ", ended" } else { "" })
                        }
                        _ => "-".into(),
                    };
                    let pods: Vec<&str> = f.pods.iter().map(|p| p.pod.as_str()).collect();
                    vec![
                        f.lo.clone(),
                        f.hi.clone(),
                        if pods.is_empty() { "-".into() } else { pods.join(",") },
                        format!("{}/{}", f.forward.packets, f.forward.bytes),
                        format!("{}/{}", f.reverse.packets, f.reverse.bytes),
                        f.nat.as_ref().map_or("-".into(), |n| format!("{} {}", n.lo, n.hi)),
                        mirrored,
                        f.mirrored_packets.to_string(),
                        format!("{:.1}s", f.idle_ms as f64 / 1000.0),
                    ]
                })
                .collect();
            let header = [
                "ENDPOINT A",
                "ENDPOINT B",
                "PODS",
                "A->B PKTS/BYTES",
                "B->A PKTS/BYTES",
                "SERVER SIDE (NAT)",
                "MIRRORED",
                "COPIED",
                "IDLE",
            ];
            print!("{}", table::render(&header, &rows));
        }
    }
    Ok(())
}

/// `k=v,k=v`, or `-`.
pub fn labels_text(labels: &std::collections::BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
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
