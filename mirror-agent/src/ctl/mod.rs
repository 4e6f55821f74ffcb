//! mirrorctl: the operator's CLI, one subcommand per API resource, each in its own module; here
//! the command line and the dispatch. It talks to the agent with [`crate::api::client`].

pub mod capture;
pub mod captures;
pub mod events;
pub mod flows;
pub mod hist;
pub mod latency;
pub mod pods;
pub mod rules;
pub mod status;
pub mod table;
pub mod top;
pub mod top_dns;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::api::client::Client;
use crate::config::DEFAULT_SOCKET;
use latency::LatencyCommand;
use rules::RulesCommand;

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
    /// The captures kept on this node, one per trigger: id, time, pod, rule, trigger, request,
    /// packets, bytes, complete or cut; `captures get ID -w FILE`, `captures rm ID`.
    Captures {
        #[command(subcommand)]
        command: Option<captures::CapturesCommand>,
    },
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

/// Runs one mirrorctl command.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let c = Client::new(&args.socket);
    let json = args.output == Output::Json;
    match args.command {
        Command::Rules { command } => rules::run(&c, json, command).await,
        Command::Status => status::run(&c, json).await,
        Command::Pods => pods::run(&c, json).await,
        Command::Flows { limit } => flows::run(&c, json, limit).await,
        Command::Events { follow, limit } => events::run(&c, json, follow, limit).await,
        Command::Capture(a) => capture::run(&c, a).await,
        Command::Captures { command } => captures::run(&c, json, command).await,
        Command::Top => top::run(&c).await,
        Command::Latency { command, by_interface } => latency::run(&c, json, command, by_interface).await,
    }
}

/// `-o json`: the API's reply, pretty-printed.
fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
