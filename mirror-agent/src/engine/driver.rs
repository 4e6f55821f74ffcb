//! The data-path driver: loads (or adopts) the data path and restores the rules, attaches and
//! detaches links, points copies at the sink, changes rules and measurement groups, and stops.
//! It holds the state file's one writer ([`StateStore`]) while the engine runs.

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio::sync::watch;

use mirror_bpf::rule::capacity::{fits, Capacity};
use mirror_bpf::{AttachMode, Datapath, MirrorDelivery, MirrorMethod, Reach, ReplayHook, Rule, TraceGroup};

use super::attached::{Attached, AttachedLinks};
use super::cluster_rules::{ClusterRules, Installed, WantedRule};
use super::cpu::CpuSampler;
use super::events::Events;
use super::{view, AddedRule, EngineConfig, EngineStatus, Stopped};
use crate::event_log::EventLog;
use crate::groups::Group;
use crate::state::{SavedRule, StateStore};
use crate::views::{GroupView, InterfaceView, RuleView};

pub(super) struct Driver {
    dp: Datapath<'static>,
    cfg: EngineConfig,
    attached: AttachedLinks,
    state: StateStore,
    tcx_available: Option<bool>,
    /// Attach latency, microseconds.
    latency: hdrhistogram::Histogram<u64>,
    events: Events,
    /// Why the tracing programs could not be loaded (none: the data path holds them).
    tracing_unavailable: Option<String>,
    cpu: CpuSampler,
    /// The replay program on the sink's egress (requests behind triggers), when attached.
    replay: Option<ReplayHook>,
    /// The rules of the cluster's rule resources.
    cluster: ClusterRules,
}

impl Driver {
    /// Loads (or adopts) the data path and restores the rules of `state`. Trigger events go
    /// to `log`; the attached links' list, each time it changes, to `attached`.
    pub(super) fn new(
        cfg: EngineConfig,
        state: StateStore,
        log: Arc<EventLog>,
        attached: watch::Sender<Vec<InterfaceView>>,
    ) -> anyhow::Result<Self> {
        // The object lives as long as the process: one per agent.
        let storage = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut dp = Datapath::load(storage, &cfg.datapath)?;
        let mut cluster = ClusterRules::default();
        for r in state.rules() {
            let rule: Rule =
                r.rule.parse().with_context(|| format!("saved rule {} in the state file", r.id))?;
            let reach = if r.selected.is_some() { Reach::Selected } else { Reach::Everywhere };
            // Saved under other `protocols:`: kept (it is the user's), but it cannot trigger.
            if let Err(why) = dp.protocols().admits(&rule) {
                tracing::warn!(id = r.id, rule = %rule, "saved rule restored, but it will not trigger: it {why}");
            }
            if dp.adopted() {
                dp.restore_rule_with(r.id, r.slot, rule.clone(), reach)?;
            } else {
                dp.insert_rule_with(r.id, rule.clone(), reach)?;
            }
            // A cluster rule keeps working, as it was, until the API says otherwise.
            if let Some(key) = &r.source {
                let ifaces = r.selected.iter().flatten().copied().collect();
                cluster.restored(r.id, key.clone(), rule, reach, ifaces);
            }
        }
        cluster.reselect(&mut dp);
        if !state.first_start() {
            // The configuration's `rules` seed the first start only: say where these came from
            // (and the line that says the agent is up).
            tracing::debug!(
                rules = state.rules().len(),
                state = %state.path().display(),
                "rules restored from the state file (the configuration's rules apply at the first start only)"
            );
        }
        let path =
            dp.loaded_programs().map_or("all", |(m, _)| if m == AttachMode::Tcx { "tcx" } else { "tc" });
        tracing::debug!(
            rules = state.rules().len(),
            adopted = dp.adopted(),
            attach = path,
            tcx_in_kernel = mirror_bpf::tcx_supported(),
            protocols = %dp.protocols(),
            load_ms = dp.load_time().as_millis() as u64,
            largest_program_insns = dp.programs().iter().map(|p| p.verified_insns).max().unwrap_or(0),
            "data path loaded"
        );
        dp.set_budget(cfg.budget)?;
        if cfg.budget != mirror_bpf::Budget::default() {
            tracing::debug!(
                packets_per_second = cfg.budget.packets_per_second,
                bytes_per_second = cfg.budget.bytes_per_second,
                "node-wide budget of copies (0: no limit), split evenly over the CPUs"
            );
        }
        let events = Events::open(&dp, log, cfg.budget != mirror_bpf::Budget::default())?;
        // The kernel's drops: counted always (the program runs only when a packet is dropped),
        // triggers while a drop rule exists.
        if let Err(e) = dp.attach_drops() {
            tracing::warn!(error = %e, "kernel drops are not followed: drop rules never trigger, mirror_drops_total stays empty");
        }
        let tracing_unavailable = match dp.load_tracing() {
            Ok(t) => {
                t.set_stack_sample(cfg.stack_sample);
                match t.fexit() {
                    Ok(()) => tracing::debug!(
                        "latency tracing uses fexit and tp_btf: clones of a packet keep its stack-latency stamp"
                    ),
                    // An expected fallback, not an error: said as such, at debug with the rest of
                    // the start (mirrorctl status says it too).
                    Err(why) => tracing::debug!(
                        kernel_said = %why,
                        "expected: latency tracing uses tp_btf tracepoints, as this kernel does not allow \
                         fexit programs (lockdown, usual on distribution kernels); only clones of a packet are \
                         not followed by the stack group"
                    ),
                }
                if !t.socket_io_counted() {
                    tracing::debug!(
                        "cpu group: no sock_send_length/sock_recv_length tracepoints (kernel before 6.3): \
                         read/write/sendfile on sockets are not counted, send and recv calls are"
                    );
                }
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "tracing programs unavailable: the stack and cpu groups cannot be switched on");
                Some(e.to_string())
            }
        };
        let first_start = state.first_start();
        let mut d = Driver {
            dp,
            cfg,
            attached: AttachedLinks::new(attached),
            state,
            tcx_available: None,
            latency: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            events,
            tracing_unavailable,
            cpu: CpuSampler::default(),
            replay: None,
            cluster,
        };
        for (g, on) in d.cfg.groups.clone() {
            d.set_group(g, on)?;
        }
        // One line for all of them at start; a switch later is logged by itself.
        let on: Vec<&str> = d.cfg.groups.iter().filter(|(_, on)| *on).map(|(g, _)| g.name()).collect();
        tracing::debug!(on = %on.join(", "), "measurement groups");
        if first_start {
            // Saved once below, not after each rule: thousands of initial rules stay quick.
            for rule in d.cfg.initial_rules.clone() {
                let id = d.dp.add_rule(rule.clone())?;
                tracing::debug!(id, %rule, "initial rule added");
            }
            if !d.cfg.initial_rules.is_empty() {
                tracing::debug!(rules = d.cfg.initial_rules.len(), "initial rules added");
            }
        }
        d.save_rules()?;
        Ok(d)
    }

    /// The data path, for the views.
    pub(super) fn datapath(&self) -> &Datapath<'static> {
        &self.dp
    }

    /// The attached links.
    pub(super) fn attached(&self) -> &AttachedLinks {
        &self.attached
    }

    /// Waits at most `timeout` for a trigger event or for `wake` (the eventfd a command's
    /// sender writes).
    pub(super) fn wait(&self, wake: &impl std::os::fd::AsRawFd, timeout: std::time::Duration) {
        self.events.wait(wake, timeout);
    }

    /// What runs between commands: the trigger events and the CPU sample.
    pub(super) fn tick(&mut self) {
        self.events.drain(&self.dp, &self.attached);
        if let Some(t) = self.dp.tracing() {
            self.cpu.sample(t);
        }
    }

    pub(super) fn attach(
        &mut self,
        ifindex: u32,
        name: String,
        since: Instant,
    ) -> anyhow::Result<InterfaceView> {
        if let Some(view) = self.attached.rename(ifindex, &name) {
            return Ok(view);
        }
        let queued = since.elapsed();
        let mut att = self
            .dp
            .attach(ifindex, self.cfg.mode, self.cfg.method)
            .with_context(|| format!("attaching to {name} (ifindex {ifindex})"))?;
        if self.cfg.mode == AttachMode::Auto {
            self.tcx_available.get_or_insert(att.mode == AttachMode::Tcx);
        }
        // Created by an earlier agent: still ours to remove.
        if att.created_qdisc {
            self.state.set_created_qdisc(ifindex, true)?;
        } else if self.state.created_qdisc(ifindex) {
            att.created_qdisc = true;
        }
        let took = since.elapsed();
        let _ = self.latency.record(took.as_micros() as u64);
        let (t, round) = (att.timings, crate::duration::round);
        tracing::debug!(
            %name, ifindex, mode = ?att.mode, queued = %round(queued), hooks = %round(t.hooks),
            pin = %round(t.pin), maps = %round(t.maps), expedited = t.expedited,
            "attached in {}", round(took)
        );
        let a = Attached { name, att };
        let view = a.view(ifindex);
        self.attached.insert(ifindex, a);
        Ok(view)
    }

    pub(super) fn detach(&mut self, ifindex: u32) -> anyhow::Result<bool> {
        let Some(a) = self.attached.remove(ifindex) else { return Ok(false) };
        let res = self.dp.detach(a.att);
        self.cluster.forget_iface(&mut self.dp, ifindex);
        self.state.set_created_qdisc(ifindex, false)?;
        match res {
            Ok(()) => tracing::debug!(name = %a.name, ifindex, "detached"),
            // The link went away with everything on it.
            Err(e) => tracing::debug!(name = %a.name, ifindex, error = %e, "detach of a vanished link"),
        }
        Ok(true)
    }

    pub(super) fn set_mirror(
        &mut self,
        ifindex: u32,
        delivery: MirrorDelivery,
        sink: u32,
    ) -> anyhow::Result<()> {
        self.dp.set_mirror_target(ifindex, delivery)?;
        self.set_replay_sink(sink);
        // act_mirred carries the ifindex itself: point every filter at the new sink.
        if self.cfg.method == MirrorMethod::Mirred && ifindex != 0 {
            let (dp, cfg) = (&mut self.dp, &self.cfg);
            self.attached.reattach(|i, Attached { name, att }| {
                let created = att.created_qdisc;
                drop(att); // keep the filter: attach() replaces it in place
                match dp.attach(i, cfg.mode, cfg.method) {
                    Ok(mut att) => {
                        att.created_qdisc |= created;
                        Some(Attached { name, att })
                    }
                    Err(e) => {
                        tracing::warn!(%name, error = %e, "re-pointing act_mirred");
                        None
                    }
                }
            });
        }
        Ok(())
    }

    /// Moves the replay program to the sink `sink` (0: none). Without it, events still carry
    /// the request behind each trigger; only the sink does not receive it.
    fn set_replay_sink(&mut self, sink: u32) {
        if sink != 0 && self.replay.as_ref().is_some_and(|h| h.ifindex == sink) {
            return;
        }
        self.events.set_replay_sink(0);
        if let Some(old) = self.replay.take() {
            // Gone with a deleted sink, most often.
            if let Err(e) = self.dp.detach_replay(old) {
                tracing::debug!(error = %e, "detaching the replay program");
            }
        }
        if sink == 0 || self.cfg.datapath.replay_requests == 0 {
            return;
        }
        match self.dp.attach_replay(sink) {
            Ok(hook) => {
                tracing::debug!(
                    ifindex = sink,
                    tcx = hook.tcx(),
                    "the request behind each trigger goes to the sink ahead of its response"
                );
                self.events.set_replay_sink(sink);
                self.replay = Some(hook);
            }
            Err(e) => tracing::warn!(
                ifindex = sink,
                error = %e,
                "the sink cannot replay requests (events still carry them)"
            ),
        }
    }

    pub(super) fn set_created_sink(&mut self, created: bool) -> anyhow::Result<()> {
        self.state.set_created_sink(created)
    }

    /// Records the installed rules in the state file.
    fn save_rules(&mut self) -> anyhow::Result<()> {
        let rules = self
            .dp
            .rule_slots()
            .into_iter()
            .map(|(id, slot, rule)| SavedRule {
                id,
                slot,
                rule: rule.to_string(),
                source: self.cluster.source(id).map(Into::into),
                selected: self.cluster.selected_ifaces(id),
            })
            .collect();
        self.state.save_rules(rules)
    }

    pub(super) fn add_rule(&mut self, rule: Rule) -> anyhow::Result<AddedRule> {
        let present = self.dp.rule_slots();
        // The same local rule: a cluster rule of the same text is another rule (it goes with
        // its resource).
        if let Some((id, _, _)) =
            present.iter().find(|(id, _, r)| *r == rule && self.cluster.source(*id).is_none())
        {
            let hits = self.dp.rules()?.into_iter().find(|r| r.id == *id).map_or(0, |r| r.hits);
            return Ok(AddedRule { view: rule_view(*id, &rule, hits, None), created: false });
        }
        // Checked before anything is written: a map that fills halfway would leave the rule
        // partly installed.
        fits(present.iter().map(|(_, _, r)| r).chain([&rule]), Capacity::classifier())?;
        let id = self.dp.add_rule(rule.clone())?;
        self.save_rules()?;
        Ok(AddedRule { view: rule_view(id, &rule, 0, None), created: true })
    }

    pub(super) fn del_rule(&mut self, id: u32) -> anyhow::Result<RuleView> {
        if let Some(source) = self.cluster.source(id) {
            anyhow::bail!(
                "rule {id} comes from the cluster's {source}: delete or change that resource (kubectl), \
                 and every node follows"
            );
        }
        let hits = self.dp.rules()?.into_iter().find(|r| r.id == id).map_or(0, |r| r.hits);
        let rule = self.dp.remove_rule(id)?;
        self.save_rules()?;
        Ok(rule_view(id, &rule, hits, None))
    }

    pub(super) fn rules(&self) -> anyhow::Result<Vec<RuleView>> {
        Ok(self
            .dp
            .rules()?
            .into_iter()
            .map(|r| rule_view(r.id, &r.rule, r.hits, self.cluster.source(r.id)))
            .collect())
    }

    /// Installs the cluster's rules for this node (and removes those it no longer lists).
    pub(super) fn set_cluster_rules(
        &mut self,
        want: Vec<WantedRule>,
    ) -> anyhow::Result<Vec<(String, Installed)>> {
        let check =
            |rules: &[&Rule]| fits(rules.iter().copied(), Capacity::classifier()).map_err(|e| e.to_string());
        let out = self.cluster.apply(&mut self.dp, &want, check);
        self.save_rules()?;
        Ok(out)
    }

    fn set_group(&mut self, group: Group, on: bool) -> anyhow::Result<()> {
        match group {
            Group::Timing(g) => self.dp.set_timing(g, on)?,
            Group::Trace(g) => match &self.tracing_unavailable {
                None => self.dp.set_trace_group(g, on)?,
                Some(why) if on => anyhow::bail!("the {} group needs the tracing programs: {why}", g.name()),
                Some(_) => {}
            },
        }
        if group == Group::Trace(TraceGroup::Cpu) {
            self.cpu.reset();
        }
        tracing::debug!(group = group.name(), enabled = on, "measurement group set");
        Ok(())
    }

    fn group_on(&self, group: Group) -> anyhow::Result<bool> {
        Ok(match group {
            Group::Timing(g) => self.dp.timing(g)?,
            Group::Trace(g) => self.dp.tracing().is_some_and(|t| t.is_on(g)),
        })
    }

    pub(super) fn groups(&mut self, set: Option<(Group, bool)>) -> anyhow::Result<Vec<GroupView>> {
        if let Some((group, on)) = set {
            self.set_group(group, on)?;
            tracing::info!(group = group.name(), enabled = on, "measurement group switched");
        }
        Group::all().map(|g| Ok(GroupView { group: g.name().into(), enabled: self.group_on(g)? })).collect()
    }

    pub(super) fn status(&self) -> anyhow::Result<EngineStatus> {
        view::status(
            &self.dp,
            view::StatusParts {
                replays: self.events.replays(),
                attached: &self.attached,
                tcx_available: self.tcx_available,
                attach_latency: &self.latency,
                net_cpu: self.cpu.shares(),
                tracing: self.dp.tracing().ok_or(self.tracing_unavailable.as_deref().unwrap_or("not loaded")),
            },
        )
    }

    pub(super) fn drop_stale_pins(&mut self) -> anyhow::Result<usize> {
        Ok(self.dp.drop_stale_links(|i| self.attached.get(i).is_some())?)
    }

    /// Detaches (or with `keep_attached` releases) everything, and hands the state file back.
    pub(super) fn shutdown(mut self, keep_attached: bool) -> Stopped {
        let result = self.stop(keep_attached);
        Stopped { result, state: self.state }
    }

    fn stop(&mut self, keep_attached: bool) -> anyhow::Result<()> {
        self.events.drain(&self.dp, &self.attached);
        let attached = self.attached.take_all();
        let n = attached.len();
        if keep_attached {
            for (_, a) in attached {
                self.dp.release(a.att);
            }
            // Pinned (TCX) or on its qdisc: it stays for the next agent.
            drop(self.replay.take());
            self.save_rules()?;
            tracing::info!(interfaces = n, "leaving the data path attached and pinned for the next agent");
            return Ok(());
        }
        let mut first_err = None;
        if let Some(hook) = self.replay.take() {
            if let Err(e) = self.dp.detach_replay(hook) {
                tracing::debug!(error = %e, "detaching the replay program");
            }
        }
        for (ifindex, a) in attached {
            if let Err(e) = self.dp.detach(a.att) {
                tracing::warn!(name = %a.name, ifindex, error = %e, "detaching");
                first_err.get_or_insert(e);
            }
        }
        self.state.clear_created_qdiscs();
        self.save_rules()?;
        self.dp.unpin_all()?;
        tracing::info!(interfaces = n, "detached everywhere, pins removed");
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }
}

/// A rule as the API shows it.
fn rule_view(id: u32, rule: &mirror_bpf::Rule, hits: u64, source: Option<&str>) -> RuleView {
    RuleView {
        id,
        rule: rule.to_string(),
        kind: rule.kind().name().into(),
        hits,
        source: source.map(Into::into),
    }
}
