//! The data path, owned by one thread: libbpf objects are not shared between threads, so
//! every operation is a command sent here and answered through a oneshot channel. The
//! thread also drains the trigger ring buffer between commands.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use tokio::sync::oneshot;

use mirror_bpf::flow::monotonic_ns;
use mirror_bpf::{
    AttachMode, Attachment, Datapath, DatapathOptions, MirrorDelivery, MirrorMethod, Rule, TraceGroup,
    Tracing, TriggerEvent,
};

use crate::api::types::{
    CpuShareView, DirView, FlowView, GroupView, HistogramView, InterfaceView, LatencyView, NatView, RuleView,
};
use crate::capacity::RuleCapacity;
use crate::groups::Group;
use crate::state::{SavedRule, SavedState};

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Map sizes and pin path.
    pub datapath: DatapathOptions,
    /// Attach mode.
    pub mode: AttachMode,
    /// Mirror method.
    pub method: MirrorMethod,
    /// The state file.
    pub state_path: PathBuf,
    /// Rules for a first start.
    pub initial_rules: Vec<Rule>,
    /// Measurement groups switched on or off at start (the others keep their defaults).
    pub groups: Vec<(Group, bool)>,
    /// The stack group stamps 1 in this many packets.
    pub stack_sample: u32,
    /// The node-wide budget of copies (0: no limit).
    pub budget: mirror_bpf::Budget,
}

/// What the engine reports about itself.
#[derive(Debug, Clone)]
pub struct EngineStatus {
    /// Attached interfaces.
    pub interfaces: Vec<InterfaceView>,
    /// Counters by name.
    pub counters: BTreeMap<String, u64>,
    /// Pinned state was adopted at start.
    pub adopted: bool,
    /// TCX worked (or was not tried yet: `None`).
    pub tcx_available: Option<bool>,
    /// Attach latency.
    pub attach_latency: LatencyView,
    /// The mirror ifindex in use (0: none).
    pub mirror_ifindex: u32,
    /// Share of each CPU spent in the network stack over the last second (cpu group on).
    pub net_cpu: Vec<CpuShareView>,
    /// How the tracing programs run: "fexit + tp_btf", "tp_btf (fexit refused: ...)", or why not.
    pub tracing: String,
}

type Reply<T> = oneshot::Sender<anyhow::Result<T>>;

enum Cmd {
    Attach { ifindex: u32, name: String, since: Instant, reply: Reply<InterfaceView> },
    Detach { ifindex: u32, reply: Reply<bool> },
    SetMirror { ifindex: u32, delivery: MirrorDelivery, reply: Reply<()> },
    AddRule { rule: Rule, reply: Reply<AddedRule> },
    DelRule { id: u32, reply: Reply<RuleView> },
    Rules { reply: Reply<Vec<RuleView>> },
    Flows { reply: Reply<Vec<FlowView>> },
    Latency { reply: Reply<Vec<HistogramView>> },
    Groups { set: Option<(Group, bool)>, reply: Reply<Vec<GroupView>> },
    Status { reply: Reply<EngineStatus> },
    DropStalePins { reply: Reply<usize> },
    SetCreatedSink { created: bool, reply: Reply<()> },
    Shutdown { keep_attached: bool, reply: Reply<()> },
}

/// What adding a rule did.
#[derive(Debug, Clone)]
pub struct AddedRule {
    /// The rule: the new one, or the same one installed before.
    pub view: RuleView,
    /// Whether it was added now (`false`: the same rule was there already, under `view.id`).
    pub created: bool,
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Cmd>,
}

/// How long the thread waits for a command before draining events again.
const EVENT_POLL: Duration = Duration::from_millis(20);

impl Engine {
    /// Starts the engine thread: loads (or adopts) the data path and restores the rules.
    pub async fn start(cfg: EngineConfig) -> anyhow::Result<Engine> {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("datapath".into())
            .spawn(move || match Worker::new(cfg) {
                Ok(mut w) => {
                    let _ = ready_tx.send(Ok(()));
                    w.run(rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .context("starting the data-path thread")?;
        ready_rx.await.map_err(|_| anyhow!("the data-path thread died"))??;
        Ok(Engine { tx })
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> anyhow::Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| anyhow!("the data-path thread has stopped"))?;
        rx.await.map_err(|_| anyhow!("the data-path thread has stopped"))?
    }

    /// Attaches (or adopts) the classifier on a link. `since`: when its event arrived.
    pub async fn attach(&self, ifindex: u32, name: String, since: Instant) -> anyhow::Result<InterfaceView> {
        self.call(|reply| Cmd::Attach { ifindex, name, since, reply }).await
    }

    /// Detaches from a link (gone or no longer matching). Returns whether it was attached.
    pub async fn detach(&self, ifindex: u32) -> anyhow::Result<bool> {
        self.call(|reply| Cmd::Detach { ifindex, reply }).await
    }

    /// Sets the interface copies are handed to (0: none) and whether it transmits or receives
    /// them.
    pub async fn set_mirror(&self, ifindex: u32, delivery: MirrorDelivery) -> anyhow::Result<()> {
        self.call(|reply| Cmd::SetMirror { ifindex, delivery, reply }).await
    }

    /// Adds a rule; it is saved at once. The same rule given again is not added twice: its
    /// existing id is returned. A rule that would not fit the rule maps is refused with a
    /// [`crate::rules::Overflow`], and nothing changes.
    pub async fn add_rule(&self, rule: Rule) -> anyhow::Result<AddedRule> {
        self.call(|reply| Cmd::AddRule { rule, reply }).await
    }

    /// Deletes a rule; flows it marked stay mirrored until their limits.
    pub async fn del_rule(&self, id: u32) -> anyhow::Result<RuleView> {
        self.call(|reply| Cmd::DelRule { id, reply }).await
    }

    /// The rules.
    pub async fn rules(&self) -> anyhow::Result<Vec<RuleView>> {
        self.call(|reply| Cmd::Rules { reply }).await
    }

    /// The flows.
    pub async fn flows(&self) -> anyhow::Result<Vec<FlowView>> {
        self.call(|reply| Cmd::Flows { reply }).await
    }

    /// The latency histograms.
    pub async fn latency(&self) -> anyhow::Result<Vec<HistogramView>> {
        self.call(|reply| Cmd::Latency { reply }).await
    }

    /// The timing groups, after switching one if `set`.
    pub async fn groups(&self, set: Option<(Group, bool)>) -> anyhow::Result<Vec<GroupView>> {
        self.call(|reply| Cmd::Groups { set, reply }).await
    }

    /// Interfaces, counters and the like.
    pub async fn status(&self) -> anyhow::Result<EngineStatus> {
        self.call(|reply| Cmd::Status { reply }).await
    }

    /// Removes pinned TCX links of interfaces that are not attached (gone while we were away).
    pub async fn drop_stale_pins(&self) -> anyhow::Result<usize> {
        self.call(|reply| Cmd::DropStalePins { reply }).await
    }

    /// Records in the state file whether the agent created the mirror sink (and so removes
    /// it at exit, even after a restart). The engine writes that file: a second writer would
    /// overwrite its rules, or have this overwritten by the next rule change.
    pub async fn set_created_sink(&self, created: bool) -> anyhow::Result<()> {
        self.call(|reply| Cmd::SetCreatedSink { created, reply }).await
    }

    /// Detaches everything and removes pins, or with `keep_attached` leaves it all for the
    /// next agent. The thread ends.
    pub async fn shutdown(&self, keep_attached: bool) -> anyhow::Result<()> {
        self.call(|reply| Cmd::Shutdown { keep_attached, reply }).await
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Attached {
    name: String,
    att: Attachment,
}

struct Worker {
    dp: Datapath<'static>,
    cfg: EngineConfig,
    attached: BTreeMap<u32, Attached>,
    state: SavedState,
    tcx_available: Option<bool>,
    latency: hdrhistogram::Histogram<u64>,
    events: mirror_bpf::EventRing<'static>,
    event_rx: mpsc::Receiver<TriggerEvent>,
    /// The tracing programs, or why they could not be loaded.
    tracing: Result<Tracing, String>,
    /// Last CPU-time sample and the shares computed from the one before.
    cpu_sample: Option<(Instant, Vec<mirror_bpf::NetCpuTime>)>,
    net_cpu: Vec<CpuShareView>,
}

impl Worker {
    fn new(cfg: EngineConfig) -> anyhow::Result<Self> {
        // The object lives as long as the process: one per agent.
        let storage = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut dp = Datapath::load(storage, &cfg.datapath)?;
        let saved = SavedState::load(&cfg.state_path)?;
        let first_start = saved.is_none();
        let state = saved.unwrap_or_default();
        for r in &state.rules {
            let rule: Rule =
                r.rule.parse().with_context(|| format!("saved rule {} in the state file", r.id))?;
            if dp.adopted() {
                dp.restore_rule(r.id, r.slot, rule)?;
            } else {
                dp.insert_rule(r.id, rule)?;
            }
        }
        let path =
            dp.loaded_programs().map_or("all", |(m, _)| if m == AttachMode::Tcx { "tcx" } else { "tc" });
        tracing::info!(
            rules = state.rules.len(),
            adopted = dp.adopted(),
            attach = path,
            tcx_in_kernel = mirror_bpf::tcx_supported(),
            "data path loaded"
        );
        dp.set_budget(cfg.budget)?;
        if cfg.budget != mirror_bpf::Budget::default() {
            tracing::info!(
                packets_per_second = cfg.budget.packets_per_second,
                bytes_per_second = cfg.budget.bytes_per_second,
                "node-wide budget of copies (0: no limit), split evenly over the CPUs"
            );
        }
        let (event_tx, event_rx) = mpsc::channel();
        let events = dp.events(move |e| {
            let _ = event_tx.send(e);
        })?;
        let mut tracing = Tracing::load(&dp).map_err(|e| e.to_string());
        match &mut tracing {
            Ok(t) => {
                t.set_stack_sampling(cfg.stack_sample);
                match t.fexit() {
                    Ok(()) => {
                        tracing::info!("tracing programs: fexit available (clones inherit stamps) + tp_btf")
                    }
                    Err(why) => tracing::info!(
                        fexit = %why,
                        "tracing programs: fexit refused; tp_btf and raw tracepoints only"
                    ),
                }
                if !t.socket_io_counted() {
                    tracing::info!(
                        "cpu group: no sock_send_length/sock_recv_length tracepoints (kernel before 6.3): \
                         read/write/sendfile on sockets are not counted, send and recv calls are"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "tracing programs unavailable: the stack and cpu groups cannot be switched on")
            }
        }
        let mut w = Worker {
            dp,
            cfg,
            attached: BTreeMap::new(),
            state,
            tcx_available: None,
            latency: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            events,
            event_rx,
            tracing,
            cpu_sample: None,
            net_cpu: Vec::new(),
        };
        for (g, on) in w.cfg.groups.clone() {
            w.set_group(g, on)?;
        }
        if first_start {
            // Saved once below, not after each rule: thousands of initial rules stay quick.
            for rule in w.cfg.initial_rules.clone() {
                let id = w.dp.add_rule(rule.clone())?;
                tracing::debug!(id, %rule, "initial rule added");
            }
            tracing::info!(rules = w.cfg.initial_rules.len(), "initial rules added");
        }
        w.save()?;
        Ok(w)
    }

    fn run(&mut self, rx: mpsc::Receiver<Cmd>) {
        loop {
            match rx.recv_timeout(EVENT_POLL) {
                Ok(Cmd::Shutdown { keep_attached, reply }) => {
                    let _ = reply.send(self.shutdown(keep_attached));
                    return;
                }
                Ok(cmd) => self.handle(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            self.drain_events();
            self.sample_cpu();
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Attach { ifindex, name, since, reply } => {
                let _ = reply.send(self.attach(ifindex, name, since));
            }
            Cmd::Detach { ifindex, reply } => {
                let _ = reply.send(self.detach(ifindex));
            }
            Cmd::SetMirror { ifindex, delivery, reply } => {
                let _ = reply.send(self.set_mirror(ifindex, delivery));
            }
            Cmd::AddRule { rule, reply } => {
                let _ = reply.send(self.add_rule(rule));
            }
            Cmd::DelRule { id, reply } => {
                let _ = reply.send(self.del_rule(id));
            }
            Cmd::Rules { reply } => {
                let _ = reply.send(self.rules());
            }
            Cmd::Flows { reply } => {
                let _ = reply.send(self.flows());
            }
            Cmd::Latency { reply } => {
                let _ = reply.send(self.latency());
            }
            Cmd::Groups { set, reply } => {
                let _ = reply.send(self.groups(set));
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::DropStalePins { reply } => {
                let _ = reply.send(self.drop_stale_pins());
            }
            Cmd::SetCreatedSink { created, reply } => {
                let _ = reply.send(self.set_created_sink(created));
            }
            Cmd::Shutdown { .. } => unreachable!("handled in run"),
        }
    }

    fn drain_events(&mut self) {
        if let Err(e) = self.events.consume() {
            tracing::warn!(error = %e, "reading trigger events");
        }
        while let Ok(e) = self.event_rx.try_recv() {
            let (server, client) = if e.reverse { (e.key.hi, e.key.lo) } else { (e.key.lo, e.key.hi) };
            tracing::info!(
                rule = e.rule_id,
                status = e.status,
                %server,
                %client,
                method = e.method.as_deref().unwrap_or("-"),
                target = e.target.as_deref().unwrap_or("-"),
                response_ms = e.request_to_response.map(|d| d.as_secs_f64() * 1e3),
                ifindex = e.ifindex,
                nat = e.nat.map(|k| k.to_string()),
                "trigger: flow mirrored"
            );
        }
    }

    fn interface_view(&self, ifindex: u32) -> Option<InterfaceView> {
        let a = self.attached.get(&ifindex)?;
        Some(InterfaceView {
            name: a.name.clone(),
            ifindex,
            mode: if a.att.mode == AttachMode::Tcx { "tcx" } else { "tc" }.into(),
            method: if a.att.method == MirrorMethod::Mirred { "mirred" } else { "clone" }.into(),
            directions: vec!["ingress".into(), "egress".into()],
        })
    }

    fn attach(&mut self, ifindex: u32, name: String, since: Instant) -> anyhow::Result<InterfaceView> {
        if let Some(a) = self.attached.get_mut(&ifindex) {
            a.name = name;
            return Ok(self.interface_view(ifindex).expect("just found"));
        }
        let mut att = self
            .dp
            .attach(ifindex, self.cfg.mode, self.cfg.method)
            .with_context(|| format!("attaching to {name} (ifindex {ifindex})"))?;
        if self.cfg.mode == AttachMode::Auto {
            self.tcx_available.get_or_insert(att.mode == AttachMode::Tcx);
        }
        // Created by an earlier agent: still ours to remove.
        if att.created_qdisc {
            if !self.state.created_qdiscs.contains(&ifindex) {
                self.state.created_qdiscs.push(ifindex);
                self.save()?;
            }
        } else if self.state.created_qdiscs.contains(&ifindex) {
            att.created_qdisc = true;
        }
        let ms = since.elapsed().as_secs_f64() * 1e3;
        let _ = self.latency.record((ms * 1000.0) as u64); // microseconds
        tracing::info!(%name, ifindex, mode = ?att.mode, attach_ms = format!("{ms:.2}"), "attached");
        self.attached.insert(ifindex, Attached { name, att });
        Ok(self.interface_view(ifindex).expect("just inserted"))
    }

    fn detach(&mut self, ifindex: u32) -> anyhow::Result<bool> {
        let Some(a) = self.attached.remove(&ifindex) else { return Ok(false) };
        let res = self.dp.detach(a.att);
        if self.state.created_qdiscs.contains(&ifindex) {
            self.state.created_qdiscs.retain(|i| *i != ifindex);
            self.save()?;
        }
        match res {
            Ok(()) => tracing::info!(name = %a.name, ifindex, "detached"),
            // The link went away with everything on it.
            Err(e) => tracing::debug!(name = %a.name, ifindex, error = %e, "detach of a vanished link"),
        }
        Ok(true)
    }

    fn set_mirror(&mut self, ifindex: u32, delivery: MirrorDelivery) -> anyhow::Result<()> {
        self.dp.set_mirror_target(ifindex, delivery)?;
        // act_mirred carries the ifindex itself: point every filter at the new sink.
        if self.cfg.method == MirrorMethod::Mirred && ifindex != 0 {
            let links: Vec<_> = self.attached.iter().map(|(i, a)| (*i, a.name.clone())).collect();
            for (i, name) in links {
                let a = self.attached.remove(&i).expect("listed");
                let created = a.att.created_qdisc;
                drop(a); // keep the filter: attach() replaces it in place
                match self.dp.attach(i, self.cfg.mode, self.cfg.method) {
                    Ok(mut att) => {
                        att.created_qdisc |= created;
                        self.attached.insert(i, Attached { name, att });
                    }
                    Err(e) => tracing::warn!(%name, error = %e, "re-pointing act_mirred"),
                }
            }
        }
        Ok(())
    }

    fn set_created_sink(&mut self, created: bool) -> anyhow::Result<()> {
        if self.state.created_sink != created {
            self.state.created_sink = created;
            self.save()?;
        }
        Ok(())
    }

    fn save(&mut self) -> anyhow::Result<()> {
        self.state.rules = self
            .dp
            .rule_slots()
            .into_iter()
            .map(|(id, slot, rule)| SavedRule { id, slot, rule: rule.to_string() })
            .collect();
        self.state.save(&self.cfg.state_path)
    }

    fn add_rule(&mut self, rule: Rule) -> anyhow::Result<AddedRule> {
        let present = self.dp.rule_slots();
        if let Some((id, _, _)) = present.iter().find(|(_, _, r)| *r == rule) {
            let hits = self.dp.rules()?.into_iter().find(|r| r.id == *id).map_or(0, |r| r.hits);
            return Ok(AddedRule {
                view: RuleView { id: *id, rule: rule.to_string(), hits },
                created: false,
            });
        }
        // Checked before anything is written: a map that fills halfway would leave the rule
        // partly installed.
        crate::rules::check_fits(
            present.iter().map(|(_, _, r)| r).chain([&rule]),
            RuleCapacity::classifier(),
        )?;
        let id = self.dp.add_rule(rule.clone())?;
        self.save()?;
        Ok(AddedRule { view: RuleView { id, rule: rule.to_string(), hits: 0 }, created: true })
    }

    fn del_rule(&mut self, id: u32) -> anyhow::Result<RuleView> {
        let hits = self.dp.rules()?.into_iter().find(|r| r.id == id).map_or(0, |r| r.hits);
        let rule = self.dp.remove_rule(id)?;
        self.save()?;
        Ok(RuleView { id, rule: rule.to_string(), hits })
    }

    fn rules(&self) -> anyhow::Result<Vec<RuleView>> {
        Ok(self
            .dp
            .rules()?
            .into_iter()
            .map(|r| RuleView { id: r.id, rule: r.rule.to_string(), hits: r.hits })
            .collect())
    }

    fn flows(&self) -> anyhow::Result<Vec<FlowView>> {
        let now = monotonic_ns();
        let dir = |d: &mirror_bpf::DirStats| DirView { packets: d.packets, bytes: d.bytes };
        Ok(self
            .dp
            .flows()?
            .into_iter()
            .map(|f| FlowView {
                lo: f.key.lo.to_string(),
                hi: f.key.hi.to_string(),
                nat: f.nat.map(|k| NatView { lo: k.lo.to_string(), hi: k.hi.to_string() }),
                forward: dir(&f.forward),
                reverse: dir(&f.reverse),
                rule_id: f.mark.map(|m| m.rule_id),
                status: f.mark.map(|m| m.status),
                mirrored_packets: f.mark.map_or(0, |m| m.packets),
                mirror_ended: f.mark.is_some_and(|m| m.ended),
                idle_ms: f.idle(now).as_millis() as u64,
                http_timed: f.http_timed,
                http_time_mean_ms: f.http_time_mean.map(ms),
                http_time_max_ms: f.http_time_max.map(ms),
                handshake_ms: f.handshake.map(ms),
            })
            .collect())
    }

    fn set_group(&mut self, group: Group, on: bool) -> anyhow::Result<()> {
        match group {
            Group::Timing(g) => self.dp.set_timing(g, on)?,
            Group::Trace(g) => match &mut self.tracing {
                Ok(t) => t.set(&mut self.dp, g, on)?,
                Err(why) if on => anyhow::bail!("the {} group needs the tracing programs: {why}", g.name()),
                Err(_) => {}
            },
        }
        if group == Group::Trace(TraceGroup::Cpu) {
            self.cpu_sample = None;
            self.net_cpu.clear();
        }
        tracing::info!(group = group.name(), enabled = on, "measurement group switched");
        Ok(())
    }

    fn group_on(&self, group: Group) -> anyhow::Result<bool> {
        Ok(match group {
            Group::Timing(g) => self.dp.timing(g)?,
            Group::Trace(g) => self.tracing.as_ref().is_ok_and(|t| t.is_on(g)),
        })
    }

    fn groups(&mut self, set: Option<(Group, bool)>) -> anyhow::Result<Vec<GroupView>> {
        if let Some((group, on)) = set {
            self.set_group(group, on)?;
        }
        Group::all().map(|g| Ok(GroupView { group: g.name().into(), enabled: self.group_on(g)? })).collect()
    }

    /// Every second while the cpu group is on: the share of each CPU in the network stack.
    fn sample_cpu(&mut self) {
        let Ok(t) = &self.tracing else { return };
        if !t.is_on(TraceGroup::Cpu) {
            return;
        }
        if self.cpu_sample.as_ref().is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let Ok(now) = t.cpu_times() else { return };
        let at = Instant::now();
        if let Some((then, before)) = &self.cpu_sample {
            let wall = at.duration_since(*then).as_nanos().max(1) as f64;
            let share = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall;
            self.net_cpu = now
                .iter()
                .zip(before)
                .enumerate()
                .map(|(cpu, (n, b))| CpuShareView {
                    cpu: cpu as u32,
                    syscall: share(n.syscall_ns, b.syscall_ns),
                    softirq_rx: share(n.softirq_rx_ns, b.softirq_rx_ns),
                    softirq_tx: share(n.softirq_tx_ns, b.softirq_tx_ns),
                    syscall_seconds_total: n.syscall_ns as f64 / 1e9,
                    softirq_rx_seconds_total: n.softirq_rx_ns as f64 / 1e9,
                    softirq_tx_seconds_total: n.softirq_tx_ns as f64 / 1e9,
                })
                .collect();
        }
        self.cpu_sample = Some((at, now));
    }

    fn latency(&self) -> anyhow::Result<Vec<HistogramView>> {
        let q = |h: &mirror_bpf::Histogram, p| h.quantile(p).map_or(0.0, ms);
        Ok(self
            .dp
            .histograms()?
            .into_iter()
            .map(|h| HistogramView {
                interface: self.attached.get(&h.ifindex).map(|a| a.name.clone()).unwrap_or_default(),
                ifindex: h.ifindex,
                kind: h.kind.name().into(),
                class: (h.kind == mirror_bpf::HistKind::HttpResponse).then_some(h.class),
                count: h.count,
                sum_seconds: h.sum_ns as f64 / 1e9,
                p50_ms: q(&h, 0.5),
                p90_ms: q(&h, 0.9),
                p99_ms: q(&h, 0.99),
                buckets: h
                    .buckets
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(b, n)| {
                        let (lo, hi) = mirror_bpf::latency::bucket_bounds(b);
                        [lo, hi, *n]
                    })
                    .collect(),
            })
            .collect())
    }

    fn status(&self) -> anyhow::Result<EngineStatus> {
        let mut counters: BTreeMap<String, u64> =
            self.dp.counters()?.iter().map(|(k, v)| (k.to_string(), v)).collect();
        let refused = self.dp.budget_refused()?;
        counters.insert("budget_refused_packets".into(), refused.packets);
        counters.insert("budget_refused_bytes".into(), refused.bytes);
        let h = &self.latency;
        let ms = |us: u64| us as f64 / 1000.0;
        Ok(EngineStatus {
            interfaces: self.attached.keys().filter_map(|i| self.interface_view(*i)).collect(),
            counters,
            adopted: self.dp.adopted(),
            tcx_available: self.tcx_available,
            attach_latency: LatencyView {
                count: h.len(),
                p50_ms: ms(h.value_at_quantile(0.5)),
                p99_ms: ms(h.value_at_quantile(0.99)),
                max_ms: ms(h.max()),
            },
            mirror_ifindex: self.dp.settings()?.mirror_ifindex,
            net_cpu: self.net_cpu.clone(),
            tracing: match &self.tracing {
                Ok(t) => {
                    let how = match t.fexit() {
                        Ok(()) => "fexit + tp_btf".into(),
                        Err(why) => format!("tp_btf (fexit refused: {why})"),
                    };
                    format!("{how}; stack group samples 1 in {} packets", t.stack_sampling())
                }
                Err(why) => format!("unavailable: {why}"),
            },
        })
    }

    fn drop_stale_pins(&mut self) -> anyhow::Result<usize> {
        Ok(self.dp.drop_stale_links(|i| self.attached.contains_key(&i))?)
    }

    fn shutdown(&mut self, keep_attached: bool) -> anyhow::Result<()> {
        self.drain_events();
        let attached = std::mem::take(&mut self.attached);
        let n = attached.len();
        if keep_attached {
            for (_, a) in attached {
                self.dp.release(a.att);
            }
            self.save()?;
            tracing::info!(interfaces = n, "leaving the data path attached and pinned for the next agent");
            return Ok(());
        }
        let mut first_err = None;
        for (ifindex, a) in attached {
            if let Err(e) = self.dp.detach(a.att) {
                tracing::warn!(name = %a.name, ifindex, error = %e, "detaching");
                first_err.get_or_insert(e);
            }
        }
        self.state.created_qdiscs.clear();
        self.save()?;
        self.dp.unpin_all()?;
        tracing::info!(interfaces = n, "detached everywhere, pins removed");
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }
}
