//! The agent: loads (or adopts) the data path, keeps the mirror sink, attaches to every
//! matching link as links come and go, serves the API and metrics, and on SIGTERM detaches
//! (or, with keep-attached, leaves everything for the next agent; or, asked by a newer agent,
//! hands everything over to it and stands by).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use mirror_bpf::{DatapathOptions, Rule};

use crate::api::{self, AgentInfo, ApiState};
use crate::config::Config;
use crate::engine::{Engine, EngineConfig};
use crate::event_log::{self, EventLog};
use crate::health::Readiness;
use crate::links::{self, LinkEvent};
use crate::metrics;
use crate::pods::Pods;
use crate::server;
use crate::sink::Sink;
use crate::startup::Start;
use crate::state::StateStore;

/// How the agent is started.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// On SIGTERM, leave the data path attached and pinned (`--keep-attached`).
    pub keep_attached: bool,
    /// When another agent holds the API socket, have it hand over (`--take-over`).
    pub take_over: bool,
    /// Where the configuration came from, for the line that says the agent is up.
    pub config: String,
}

/// Why the main loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM or SIGINT.
    Signal,
    /// A newer agent asked for the data path.
    HandOver,
    /// SIGTERM or SIGINT while a newer agent waited to take over (it had claimed the
    /// succession, its request not yet come): handed over all the same, then the agent ends.
    SignalHandOver,
}

/// What a stop signal means: a hand-over when a newer agent waits for the data path (its
/// claim held: one owner at a time, the stopping one never removes what the next adopts), else
/// the plain stop that removes everything.
fn on_signal(cfg: &Config) -> Stop {
    if crate::handover::successor_waiting(&cfg.api.socket) {
        tracing::info!("stopped while a newer agent waits to take over: handing over");
        Stop::SignalHandOver
    } else {
        Stop::Signal
    }
}

/// Runs the agent until SIGTERM or SIGINT (after a hand-over, until then too, holding
/// nothing). The start, in this order:
///
/// 1. the signal handlers (a signal during the start then undoes it, not kills it halfway),
///    the single-instance lock tried ([`crate::handover::begin`]; with `--take-over`, the
///    succession claimed where another agent holds it), and the node's requirements
///    ([`crate::requirements::check`]);
/// 2. the single-instance lock held ([`crate::handover::acquire`]; with `--take-over`, after
///    the running agent handed over): nothing is touched before it is held;
/// 3. the configured rules and the state file are read and checked (nothing loaded yet);
/// 4. the engine loads or adopts the data path and takes the state file's one writer;
/// 5. the sink, the API, the metrics, and the link events (see [`serve`]).
pub async fn run(cfg: Config, opts: RunOptions) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // Before anything is created: a signal during start-up then waits for the main loop,
    // which undoes the start-up, instead of killing the agent halfway.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // First of all: one agent per API socket. A second one refuses before it touches anything
    // (pins, groups, the socket of the running one), or with --take-over claims the succession
    // at once, so that the running one, should it be stopped before it is asked, hands over
    // instead of removing what this one adopts (see crate::handover).
    let begun = crate::handover::begin(&cfg.api.socket, opts.take_over)?;
    // What the node must have: a hard requirement missing stops the start here, naming what to
    // do, before anything is touched or asked of a running agent.
    crate::requirements::check(&cfg)?;
    let instance = crate::handover::acquire(&cfg.api.socket, begun).await?;
    let initial_rules: Vec<Rule> =
        cfg.rules.iter().map(|r| crate::rules::parse(r)).collect::<Result<_, _>>()?;
    // Read before anything is loaded: a state file that cannot be used stops the start here.
    // Its one writer goes to the engine and comes back when the engine stops.
    let state = StateStore::open(&cfg.state.path)?;
    let created_sink = state.created_sink();
    let start = Start {
        at: started,
        config: opts.config.clone(),
        restored_from: (!state.first_start()).then(|| cfg.state.path.clone()),
        cluster: false,
    };
    crate::bpffs::ensure(&cfg.bpf.pin_path)?;
    // An agent killed while it had expedited RCU on (around a TCX link change) left it on.
    let rcu_marker = std::path::PathBuf::from(format!("{}.rcu-expedited", cfg.api.socket.display()));
    match mirror_bpf::rcu::recover(&rcu_marker) {
        Ok(true) => {
            tracing::info!("put {} back to 0, left on by a killed agent", mirror_bpf::rcu::RCU_EXPEDITED)
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "putting {} back", mirror_bpf::rcu::RCU_EXPEDITED),
    }
    let (flows_max, marks_max) = table_sizes(&cfg)?;
    let events = Arc::new(EventLog::new(cfg.events.recent, event_log::Output::open(&cfg.events)?));
    let engine = Engine::start(
        EngineConfig {
            datapath: DatapathOptions {
                flows_max,
                marks_max,
                pin_path: Some(cfg.bpf.pin_path.clone()),
                only: Some((cfg.attach.mode.into(), cfg.mirror.method.into())),
                expedite_rcu: cfg.attach.expedite_rcu.then_some(rcu_marker),
                replay_requests: cfg.mirror.replay_requests,
                protocols: cfg.protocol_set()?,
                dns_ports: cfg.dns.port_list(),
                ..Default::default()
            },
            mode: cfg.attach.mode.into(),
            method: cfg.mirror.method.into(),
            initial_rules,
            groups: cfg.latency.groups(),
            stack_sample: cfg.latency.stack_sample,
            budget: mirror_bpf::Budget {
                packets_per_second: cfg.mirror.budget.packets_per_second,
                bytes_per_second: cfg.mirror.budget.bytes_per_second,
            },
        },
        state,
        events.clone(),
    )
    .await?;

    // A start that fails from here on is undone like a stop, except that state adopted from
    // an earlier agent is left as it was found.
    let adopted = engine.status().await?.adopted;
    let mut sink = Sink::new(cfg.mirror.clone(), created_sink)?;
    let served = serve(&cfg, start, &engine, &events, &mut sink, &mut term, &mut int).await;
    if let Err(e) = &served {
        tracing::error!(error = format!("{e:#}"), "stopping on an error");
    }
    let handed_over = matches!(served, Ok(Stop::HandOver | Stop::SignalHandOver));
    let keep = opts.keep_attached || cfg.keep_attached || handed_over || (served.is_err() && adopted);
    tracing::info!(keep_attached = keep, handed_over, "stopping");
    let stopped = engine.shutdown(keep).await;
    if !keep {
        sink.remove().await?;
    }
    let res = match stopped {
        Ok(stopped) => {
            if !keep {
                // The engine has stopped and handed the state file back: ours to write now.
                let mut state = stopped.state;
                state.set_created_sink(false)?;
            }
            stopped.result
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&cfg.api.socket);
    if matches!(served, Ok(Stop::SignalHandOver)) && res.is_ok() {
        // Stopped while a successor waited: everything is its own, and the stop is done.
        drop(instance);
        tracing::info!("stopped while a newer agent waited: handed over to it, nothing undone");
        return Ok(());
    }
    if handed_over && res.is_ok() {
        // Everything is the next agent's now: let it take the lock, and stay until stopped
        // (a pod that exited would be restarted and ask for the data path back).
        drop(instance);
        tracing::info!("handed over to the next agent: standing by, holding nothing, until stopped");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stopped after a hand-over: nothing to undo");
        return Ok(());
    }
    served.map(drop).and(res)
}

/// The flow tables' and the marks' sizes: `flows.max` (`auto` resolved for this host) and
/// `flows.marks_max`, or the size of tables an earlier agent pinned, which are adopted as they
/// are (with their flows and marks), with a warning when the configuration says otherwise.
fn table_sizes(cfg: &Config) -> anyhow::Result<(u32, u32)> {
    // Flow values are per possible CPU: `auto` keeps the table's memory bounded on big nodes.
    let cpus = mirror_bpf::possible_cpus()?;
    let adopted = |map: &str, key: &str, want: u32| {
        let pinned = crate::capacity::pinned_entries(&cfg.bpf.pin_path, map).filter(|p| *p != want);
        if let Some(pinned) = pinned {
            tracing::warn!(
                map,
                pinned,
                configured = want,
                "{key}: the pinned {map} of an earlier agent is adopted with its size (and its entries); \
                 stop the agent without --keep-attached to size it anew"
            );
        }
        pinned.unwrap_or(want)
    };
    let flows_max = adopted("flow_table", "flows.max", crate::memory::flows_on(cfg.flows.max, cpus));
    let marks_max = adopted("mirror_marks", "flows.marks_max", cfg.flows.marks_max);
    // The kernel's own count, as `--check` prints it: buckets, elements and per-CPU values.
    let maps = crate::capacity::map_memory(flows_max, marks_max, cfg.mirror.replay_requests, cpus);
    let of = |name: &str| maps.iter().find(|m| m.name == name).map_or(0, |m| m.bytes);
    tracing::debug!(
        flows = flows_max,
        cpus,
        flow_table = crate::capacity::human(of("flow_table")),
        all_maps = crate::capacity::human(maps.iter().map(|m| m.bytes).sum()),
        auto = cfg.flows.max == crate::config::FlowsMax::Auto,
        "flow table size (mirror-agent --check lists each map's memory)"
    );
    Ok((flows_max, marks_max))
}

/// Creates the sink, serves the API and metrics, and follows link events until a signal; says
/// once that the agent is up, when the links present at start are attached.
async fn serve(
    cfg: &Config,
    start: Start,
    engine: &Engine,
    events: &Arc<EventLog>,
    sink: &mut Sink,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<Stop> {
    let mirror = sink.start(engine).await?;
    let memory = match crate::capacity::Host::this() {
        Ok(host) => Some(crate::memory::NodeMemory::new(cfg, &host)),
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), "reading this host's CPUs and memory: no memory report");
            None
        }
    };
    let info = Arc::new(Mutex::new(AgentInfo {
        attach_mode: format!("{:?}", cfg.attach.mode).to_lowercase(),
        mirror,
        memory,
    }));
    let ready = Readiness::default();
    let pods = Pods::new(cfg.pods.clone());
    pods.start(engine.attached());
    events.name_pods(pods.clone());
    // Before the cluster's follower: each event names its capture from the first.
    let recorder = cfg
        .recorder
        .enabled
        .then(|| {
            crate::recorder::Recorder::start(
                cfg.recorder.clone(),
                cfg.recorder.dir(&cfg.state.path),
                cfg.cluster.node_name(),
                engine.clone(),
                info.clone(),
                pods.clone(),
                events,
            )
        })
        .transpose()
        .context("recorder.upload: the object storage client")?;
    let mut up = Some(Start { cluster: start_cluster(cfg, engine, &pods, events).await?, ..start });
    let listener = api::bind(&cfg.api.socket).await?;
    let handover = Arc::new(tokio::sync::Notify::new());
    let app = api::router(ApiState {
        engine: engine.clone(),
        info: info.clone(),
        events: events.clone(),
        pods: pods.clone(),
        handover: handover.clone(),
        recorder: recorder.clone(),
    });
    let limits = server::Limits {
        max_connections: cfg.api.max_connections,
        header_timeout: cfg.api.header_timeout,
        request_timeout: cfg.api.request_timeout,
        idle_timeout: cfg.api.idle_timeout,
    };
    // Aborted when the loop ends: a hand-over frees the socket and the metrics port at once.
    let api_stats = Arc::new(server::Stats::default());
    let mut servers = vec![tokio::spawn(server::serve(listener, app, limits, "api", api_stats.clone()))];
    tracing::debug!(
        socket = %cfg.api.socket.display(),
        max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout,
        request_timeout = ?limits.request_timeout,
        idle_timeout = ?limits.idle_timeout,
        "API listening"
    );
    if !cfg.metrics.listen.is_empty() {
        let tcp = tokio::net::TcpListener::bind(&cfg.metrics.listen)
            .await
            .with_context(|| format!("binding metrics.listen {}", cfg.metrics.listen))?;
        let metrics_stats = Arc::new(server::Stats::default());
        let servers_stats = vec![("api", api_stats), ("metrics", metrics_stats.clone())];
        let recorded = recorder.as_ref().map(|r| r.stats());
        let app =
            metrics::router(engine.clone(), pods.clone(), cfg.metrics.rule_text, servers_stats, recorded)
                .merge(crate::health::router(engine.clone(), ready.clone(), cfg.api.socket.clone()));
        // A scrape is one quick request: the API's timeouts, fewer connections.
        let limits = server::Limits { max_connections: crate::config::METRICS_CONNECTIONS, ..limits };
        servers.push(tokio::spawn(server::serve(tcp, app, limits, "metrics", metrics_stats)));
        tracing::debug!(listen = %cfg.metrics.listen, rule_text = cfg.metrics.rule_text, "metrics listening");
    }

    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        if let Err(e) = links::watch(tx).await {
            tracing::error!(error = %e, "link watcher stopped");
        }
    });

    // Names of the links we know, to notice renames.
    let mut known: BTreeMap<u32, String> = BTreeMap::new();
    let stop = loop {
        tokio::select! {
            _ = term.recv() => break on_signal(cfg),
            _ = int.recv() => break on_signal(cfg),
            _ = handover.notified() => {
                tracing::info!("a newer agent asked for the data path: handing over");
                break Stop::HandOver;
            }
            ev = rx.recv() => {
                let Some(ev) = ev else { anyhow::bail!("link events stopped") };
                let synced = matches!(ev, LinkEvent::Synced);
                on_link_event(cfg, engine, sink, &info, &ready, &mut known, ev).await;
                if let Some(start) = up.take_if(|_| synced) {
                    crate::startup::say(start, cfg, engine, &info).await?;
                }
                // A veth came or went, or a pod's side changed: who is behind each may differ.
                pods.refresh();
            }
        }
    };
    for s in servers {
        s.abort();
        let _ = s.await;
    }
    if let Some(r) = recorder {
        r.stop().await;
    }
    Ok(stop)
}

/// Follows the cluster's rules when `cluster:` says so, and says whether it does. With
/// `mode: auto`, a client that cannot be made (a pod without its service account token) is
/// said in the log and the agent goes on with its local rules; with `mode: on` it stops the
/// start.
async fn start_cluster(
    cfg: &Config,
    engine: &Engine,
    pods: &Pods,
    events: &Arc<EventLog>,
) -> anyhow::Result<bool> {
    if !cfg.cluster.enabled() {
        tracing::debug!(mode = ?cfg.cluster.mode, "cluster rules off: local rules only");
        return Ok(false);
    }
    let client = match crate::cluster::client(&cfg.cluster).await {
        Ok(c) => c,
        Err(e) if cfg.cluster.mode == crate::config::ClusterMode::Auto => {
            tracing::warn!(
                error = format!("{e:#}"),
                "cluster rules off: no usable Kubernetes API configuration"
            );
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let node = cfg.cluster.node_name();
    crate::cluster::start(cfg.cluster.clone(), client, node, engine.clone(), pods.clone(), events.clone());
    Ok(true)
}

async fn on_link_event(
    cfg: &Config,
    engine: &Engine,
    sink: &mut Sink,
    info: &Arc<Mutex<AgentInfo>>,
    ready: &Readiness,
    known: &mut BTreeMap<u32, String>,
    ev: LinkEvent,
) {
    // Every link is known by name, the sink's too.
    let renamed = match &ev {
        LinkEvent::Present { ifindex, name, .. } => {
            known.insert(*ifindex, name.clone()).is_some_and(|old| old != *name)
        }
        LinkEvent::Gone { ifindex, .. } => {
            known.remove(ifindex);
            ready.settled(*ifindex);
            false
        }
        LinkEvent::Synced => false,
    };
    if sink.follow(engine, info, &ev).await {
        return;
    }
    match ev {
        LinkEvent::Present { ifindex, name, at, .. } => {
            if cfg.interfaces.matches(&name) {
                match engine.attach(ifindex, name.clone(), at.into_std()).await {
                    Ok(_) => ready.settled(ifindex),
                    Err(e) => {
                        tracing::warn!(%name, ifindex, error = format!("{e:#}"), "attach failed");
                        ready.pending(ifindex, &name, "attach failed");
                    }
                }
            } else {
                ready.settled(ifindex);
                if renamed {
                    // Renamed out of the include set.
                    let _ = engine.detach(ifindex).await;
                }
            }
        }
        LinkEvent::Gone { ifindex, name } => {
            if let Err(e) = engine.detach(ifindex).await {
                tracing::warn!(%name, ifindex, error = format!("{e:#}"), "forgetting a vanished link");
            }
        }
        LinkEvent::Synced => {
            ready.set_synced();
            match engine.drop_stale_pins().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(links = n, "removed pinned links of interfaces gone meanwhile"),
                Err(e) => tracing::warn!(error = format!("{e:#}"), "removing stale pins"),
            }
        }
    }
}
