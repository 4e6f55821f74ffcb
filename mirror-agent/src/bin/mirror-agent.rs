//! mirror-agent: attach the traffic-aware mirror to every container veth of this node.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use mirror_agent::config::{Config, LogFormat};

/// Traffic-aware eBPF monitor and selective packet mirror: one per node, in the node's
/// network namespace, as root.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Configuration file (YAML); see config/agent.yaml for every key. Given more than once,
    /// each later file is laid over the earlier ones key by key (the DaemonSet: an overlay's
    /// overrides.yaml over the ConfigMap's agent.yaml). Without it,
    /// /etc/mirror-agent/agent.yaml when it exists (`make install` puts it there), else the
    /// built-in defaults.
    #[arg(long, short)]
    config: Vec<PathBuf>,
    /// On SIGTERM, leave the data path attached and pinned for the next agent.
    #[arg(long)]
    keep_attached: bool,
    /// When another agent runs with the same API socket, ask it to hand its data path over
    /// (it stays attached throughout) and adopt it, instead of refusing to start.
    #[arg(long)]
    take_over: bool,
    /// Listen for /metrics on ADDR:PORT instead of metrics.listen ("" disables), e.g. the
    /// node's address from the DaemonSet's environment: `--metrics-listen=$(NODE_IP):9464`.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<String>,
    /// Check the configuration, print what the maps take and what this node has of the
    /// agent's requirements, and exit.
    #[arg(long)]
    check: bool,
    /// Exit 0 when the agent holding this configuration's API socket lock (the data path) runs
    /// in this process's cgroup, else 1 saying who holds it: the DaemonSet's startup probe,
    /// exec'd in the agent's container, which so waits for its own agent to hold the data path
    /// rather than the agent it takes over from.
    #[arg(long)]
    holds_data_path: bool,
    /// Print the CustomResourceDefinitions of the cluster's mirror rules (deploy/crds.yaml)
    /// and exit.
    #[arg(long)]
    crds: bool,
}

/// The configuration read when `--config` is not given, if it exists.
const DEFAULT_CONFIG: &str = "/etc/mirror-agent/agent.yaml";

fn main() -> ExitCode {
    let args = Args::parse();
    if args.crds {
        print!("{}", mirror_agent::cluster::crd::crds_yaml());
        return ExitCode::SUCCESS;
    }
    let mut paths = args.config.clone();
    if paths.is_empty() && std::path::Path::new(DEFAULT_CONFIG).exists() {
        paths.push(PathBuf::from(DEFAULT_CONFIG));
    }
    let cfg = match paths.as_slice() {
        [] => Ok(Config::default()),
        [p] => Config::load(p).map_err(|e| format!("config {}: {e}", p.display())),
        layers => Config::load_layers(layers).map_err(|e| format!("config: {e}")),
    };
    let cfg = cfg.and_then(|mut c| {
        if let Some(listen) = &args.metrics_listen {
            if !listen.is_empty() {
                listen.parse::<std::net::SocketAddr>().map_err(|e| {
                    format!("--metrics-listen '{listen}': {e} (an IPv6 address goes in brackets)")
                })?;
            }
            c.metrics.listen = listen.clone();
        }
        Ok(c)
    });
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mirror-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let source = if paths.is_empty() {
        "built-in defaults (no /etc/mirror-agent/agent.yaml)".to_string()
    } else {
        paths.iter().rev().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" over ")
    };
    if args.holds_data_path {
        return match mirror_agent::handover::held_here(&cfg.api.socket) {
            Ok(pid) => {
                println!("this container's agent (pid {pid}) holds the data path");
                ExitCode::SUCCESS
            }
            Err(why) => {
                println!("not yet: {why}");
                ExitCode::FAILURE
            }
        };
    }
    if args.check {
        println!("configuration is valid: {source}");
        match mirror_agent::capacity::Host::this() {
            Ok(host) => {
                let node = mirror_agent::memory::NodeMemory::new(&cfg, &host);
                print!("{}", mirror_agent::memory::render(&node.report(node.configured(host.cpus))))
            }
            Err(e) => eprintln!("mirror-agent: the maps' memory on this host: {e:#}"),
        }
        let node = mirror_agent::requirements::Facts::read(&cfg);
        print!("{}", mirror_agent::requirements::report(&mirror_agent::requirements::evaluate(&node)));
        return ExitCode::SUCCESS;
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match cfg.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    // One line at info once it is up (startup.rs); this one for whoever looks closer.
    tracing::debug!(config = %source, "mirror-agent {}", env!("CARGO_PKG_VERSION"));
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mirror-agent: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(mirror_agent::agent::run(
        cfg,
        mirror_agent::agent::RunOptions {
            keep_attached: args.keep_attached,
            take_over: args.take_over,
            config: source,
        },
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "mirror-agent failed");
            eprintln!("mirror-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
