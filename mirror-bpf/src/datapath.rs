//! The loaded classifier: loading (map sizes, pins, which programs) and one facade over what
//! drives it. Each concern lives in its own module and is reached from here: settings and
//! timing groups ([`crate::settings`]), attaching ([`crate::attach`]), rules
//! ([`crate::rule`]), flows ([`crate::flow`]), counters ([`crate::stats`]), latency
//! histograms ([`crate::latency`]), trigger events ([`crate::event`]) and the tracing programs,
//! which it owns ([`crate::probes`]).

use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{MapCore, MapFlags, OpenObject, RingBuffer};

use crate::attach::{AttachMode, Attacher, Attachment, MirrorMethod, LINKS_DIR};
use crate::budget::{Budget, Refused};
use crate::error::{Context, Error, Result};
use crate::event::{self, TriggerEvent};
use crate::flow::{self, Flow, FlowKey, MirrorMark};
use crate::latency::{self, Histogram};
use crate::probes::{TraceGroup, Tracing};
use crate::programs::ProgramStats;
use crate::protocols::{Protocol, Protocols};
use crate::rule::maps::{clear_scopes, InstalledRules};
use crate::rule::{Reach, Rule, RuleId, RuleInfo};
use crate::settings::MirrorDelivery;
use crate::settings::{self, TimingGroup};
use crate::shared::{possible_cpus, types};
use crate::skel::classifier::{ClassifierSkel, ClassifierSkelBuilder};
use crate::stats::Counters;

/// What is set at load: map sizes, pins, which programs. Each option that is a setting of the
/// agent keeps its configuration key's name down to the classifier (`include/config.h`), and
/// has its default here, which the agent's configuration takes too.
#[derive(Debug, Clone)]
pub struct DatapathOptions {
    /// Flows in the per-CPU flow table (LRU: the oldest go first), and in the tables beside it
    /// (`flows.max`; [`DatapathOptions::FLOWS_MAX`] unless set).
    pub flows_max: u32,
    /// Flows that can be marked for mirroring at once (`flows.marks_max`;
    /// [`DatapathOptions::MARKS_MAX`] unless set).
    pub marks_max: u32,
    /// Ring buffer for trigger events, bytes (a power of two, multiple of the page size;
    /// [`DatapathOptions::RINGBUF_BYTES`] unless set).
    pub ringbuf_bytes: u32,
    /// Directory on a bpffs where maps (and TCX links) are pinned. Maps already pinned there
    /// are reused, so flows, marks, rules and counters survive a restart.
    pub pin_path: Option<PathBuf>,
    /// Load only the programs this attach mode and mirror method use (each costs the verifier
    /// about half a second); `None` loads them all (tests, benchmarks switching modes).
    pub only: Option<(AttachMode, MirrorMethod)>,
    /// Expedited RCU grace periods around each TCX link created or removed (see
    /// [`crate::rcu`]), recorded in this marker file while on; `None`: normal grace periods.
    pub expedite_rcu: Option<PathBuf>,
    /// Flows whose latest request is kept, to replay it to the mirror ahead of their trigger
    /// (`mirror.replay_requests`: 0, none kept, or a power of two within
    /// [`DatapathOptions::REPLAY_REQUESTS_MIN`]..=[`DatapathOptions::REPLAY_REQUESTS_MAX`];
    /// [`DatapathOptions::REPLAY_REQUESTS`] unless set). One slot of
    /// [`crate::replay::SLOT_BYTES`] each: a flow keeps its slot until as many flows started
    /// requests after it.
    pub replay_requests: u32,
    /// The protocol programs loaded (`protocols`; all of them unless set): a protocol left out
    /// costs nothing to verify nor per packet.
    pub protocols: Protocols,
    /// The server ports DNS is followed on (`dns.ports`; [`settings::DNS_PORTS`] unless set; 1
    /// to [`settings::DNS_PORTS_MAX`] of them), written to the settings at each load.
    pub dns_ports: Vec<u16>,
}

impl DatapathOptions {
    /// Flows in the flow table unless set (`flows.max: auto` never sizes it larger).
    pub const FLOWS_MAX: u32 = 65_536;
    /// Marks unless set, and `flows.marks_max`'s default.
    pub const MARKS_MAX: u32 = 16_384;
    /// Bytes of the event ring unless set (triggers are rare: this holds about 1,300).
    pub const RINGBUF_BYTES: u32 = 256 * 1024;
    /// Requests kept unless set, and `mirror.replay_requests`'s default.
    pub const REPLAY_REQUESTS: u32 = 4096;
    /// The fewest requests kept, when any are.
    pub const REPLAY_REQUESTS_MIN: u32 = 64;
    /// The most requests kept (44 MiB of slots).
    pub const REPLAY_REQUESTS_MAX: u32 = 65_536;

    /// Checks a number of requests kept ([`DatapathOptions::replay_requests`]); the error says
    /// why not.
    pub fn check_replay_requests(n: u32) -> std::result::Result<(), String> {
        let (min, max) = (Self::REPLAY_REQUESTS_MIN, Self::REPLAY_REQUESTS_MAX);
        if n != 0 && (!n.is_power_of_two() || !(min..=max).contains(&n)) {
            return Err(format!("{n}: 0 (off) or a power of two from {min} to {max}"));
        }
        Ok(())
    }
}

impl Default for DatapathOptions {
    fn default() -> Self {
        Self {
            flows_max: Self::FLOWS_MAX,
            marks_max: Self::MARKS_MAX,
            ringbuf_bytes: Self::RINGBUF_BYTES,
            pin_path: None,
            only: None,
            expedite_rcu: None,
            replay_requests: Self::REPLAY_REQUESTS,
            protocols: Protocols::default(),
            dns_ports: settings::DNS_PORTS.to_vec(),
        }
    }
}

/// The loaded classifier.
pub struct Datapath<'obj> {
    /// The tracing programs, once loaded ([`Datapath::load_tracing`]); dropped (their groups
    /// detached) before the classifier whose maps they share.
    tracing: Option<Tracing>,
    /// The drop program's link while attached ([`Datapath::attach_drops`]); detached before
    /// the classifier goes.
    drops: Option<libbpf_rs::Link>,
    skel: ClassifierSkel<'obj>,
    rules: InstalledRules,
    pin_path: Option<PathBuf>,
    /// Whether the maps came from an earlier instance's pins.
    adopted: bool,
    /// The mode (resolved) and method whose programs alone were loaded; `None`: all.
    only: Option<(AttachMode, MirrorMethod)>,
    /// Marker of expedited grace periods around TCX link changes, if asked for.
    expedite_rcu: Option<PathBuf>,
    /// Whether flows keep their latest request for a replay (slots exist and it is wanted).
    replay: bool,
    /// Whether request_replay has slots to keep requests in (`replay_requests` is not 0):
    /// whether [`Datapath::set_replay`] can switch replays on.
    replay_possible: bool,
    /// The protocol programs loaded.
    protocols: Protocols,
    /// What loading cost each program, and how long the whole load took.
    programs: Vec<ProgramStats>,
    load_time: Duration,
}

/// The classifier's `.data` (its knobs, `include/config.h`), which libbpf maps for us.
fn mapped(data: Option<&mut types::data>) -> Result<&mut types::data> {
    data.ok_or_else(|| Error::Unsupported("the classifier's .data is not mapped".into()))
}

/// Whether the classifier stamps packets at tc ingress for the kernel stack latency (the stack
/// group of the tracing programs); a plain flag in the program's data, read per packet.
fn set_stack_stamps(skel: &mut ClassifierSkel<'_>, on: bool) {
    if let Some(data) = skel.maps.data_data.as_deref_mut() {
        data.stack_stamps = u32::from(on);
    }
}

/// libbpf's own messages go to `tracing` (target "libbpf") at debug level instead of stderr:
/// its warnings include expected cases (such as a clsact qdisc that already exists), and
/// every real failure reaches the caller as an error anyway.
fn route_libbpf_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        fn log(_level: libbpf_rs::PrintLevel, msg: String) {
            crate::programs::note_log(&msg);
            tracing::debug!(target: "libbpf", "{}", msg.trim_end());
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, log)));
    });
}

/// Maps never pinned nor adopted: the no-response tick's timer and bitmap (include/noresponse.h),
/// and the program array of this load's protocol programs (include/dispatch.h), pinned under a
/// name of its own instead ([`PROTO_PROGS_PIN`]).
const THIS_LOAD_ONLY: [&str; 3] = ["noresponse_timer", "pending_flows", "proto_progs"];

/// The pin of a load's program array of protocol programs: `<this>-<map id>` (bpffs refuses dots). Pinned, it keeps
/// its programs while links pinned by this load outlive the agent (until the next one adopts
/// them and removes it: [`Datapath::drop_stale_links`]).
const PROTO_PROGS_PIN: &str = "proto_progs";

impl<'obj> Datapath<'obj> {
    /// Opens and loads the classifier with the given map sizes. `storage` holds libbpf's object.
    pub fn load(storage: &'obj mut MaybeUninit<OpenObject>, opts: &DatapathOptions) -> Result<Self> {
        route_libbpf_logs();
        let started = std::time::Instant::now();
        opts.protocols.check().map_err(|why| Error::Unsupported(format!("protocols: {why}")))?;
        settings::check_dns_ports(&opts.dns_ports)
            .map_err(|why| Error::Unsupported(format!("dns_ports: {why}")))?;
        let mut open =
            ClassifierSkelBuilder::default().open(storage).context(|| "opening the classifier".into())?;
        let only = opts.only.map(|(mode, method)| (mode.resolve(method), method));
        if let Some((mode, method)) = only {
            let p = &mut open.progs;
            let tcx = mode == AttachMode::Tcx;
            let (clone, mirred) = (method == MirrorMethod::Clone, method == MirrorMethod::Mirred);
            p.tcx_ingress_mirror.set_autoload(tcx);
            p.tcx_egress_mirror.set_autoload(tcx);
            p.tc_ingress_mirror.set_autoload(!tcx && clone);
            p.tc_egress_mirror.set_autoload(!tcx && clone);
            p.tc_ingress_mirred.set_autoload(!tcx && mirred);
            p.tc_egress_mirred.set_autoload(!tcx && mirred);
            p.tcx_replay.set_autoload(tcx);
            p.tc_replay.set_autoload(!tcx);
        }
        for mut prog in open.open_object_mut().progs_mut() {
            // A protocol's program is loaded when the protocol is followed.
            if let Some(p) = Protocol::ALL.into_iter().find(|p| prog.name() == p.program()) {
                prog.set_autoload(opts.protocols.contains(p));
            }
            crate::programs::ask_stats(&mut prog);
        }
        // The drop program where the kernel has its tracepoint (else it would fail the load).
        open.progs.drop_trace.set_autoload(crate::drops::supported().is_ok());
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| Error::Unsupported("the classifier's .rodata is not mapped".into()))?;
        rodata.protocols_enabled = opts.protocols.bits();
        rodata.node_netns = crate::probes::current_netns()?;
        DatapathOptions::check_replay_requests(opts.replay_requests)
            .map_err(|why| Error::Unsupported(format!("replay_requests: {why}")))?;
        let maps = &mut open.maps;
        maps.flow_table.set_max_entries(opts.flows_max).context(|| "sizing flow_table".into())?;
        crate::flow::size_cache(&mut maps.flow_cache)?;
        maps.flow_timing.set_max_entries(opts.flows_max).context(|| "sizing flow_timing".into())?;
        maps.flow_timing_index
            .set_max_entries(opts.flows_max)
            .context(|| "sizing flow_timing_index".into())?;
        maps.flow_nat.set_max_entries(opts.flows_max).context(|| "sizing flow_nat".into())?;
        maps.pending_flows
            .set_max_entries(opts.flows_max.div_ceil(64).max(1))
            .context(|| "sizing pending_flows".into())?;
        maps.mirror_marks.set_max_entries(opts.marks_max).context(|| "sizing mirror_marks".into())?;
        maps.events.set_max_entries(opts.ringbuf_bytes).context(|| "sizing events".into())?;
        maps.request_replay
            .set_max_entries(opts.replay_requests.max(1))
            .context(|| "sizing request_replay".into())?;
        let data = mapped(open.maps.data_data.as_deref_mut())?;
        // Every knob of the .data (include/config.h), each load: none keeps a value of its own.
        data.flows_max = opts.flows_max;
        data.replay_requests = opts.replay_requests;
        data.mirror_deliver = MirrorDelivery::default().flags();
        data.stack_stamps = 0;
        // A fresh epoch: flow entries adopted from an earlier instance look their mark up again;
        // and a fresh replay count: their slot numbers are not taken for recent ones.
        data.mark_epoch = (flow::monotonic_ns() as u32) | 1;
        data.replay_next = (flow::monotonic_ns() >> 10) as u32;
        let mut adopted = false;
        let mut fresh_settings = true;
        if let Some(dir) = &opts.pin_path {
            std::fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
            for mut map in open.open_object_mut().maps_mut() {
                let path = dir.join(map.name());
                if !path.exists() {
                    continue;
                }
                // Left by an earlier version with another layout (or by other sizes): the
                // kernel would refuse it. A fresh map replaces it; the earlier programs keep
                // theirs until the links move to ours.
                let want =
                    (map.map_type(), map.key_size(), map.value_size(), map.max_entries(), map.map_flags());
                let pinned = libbpf_rs::MapHandle::from_pinned_path(&path).and_then(|m| {
                    let flags = m.info()?.info.map_flags;
                    Ok((m.map_type(), m.key_size(), m.value_size(), m.max_entries(), flags))
                });
                match pinned {
                    Ok(had) if had == want => {
                        map.reuse_pinned_map(&path).context(|| format!("reusing {}", path.display()))?;
                        adopted = true;
                        fresh_settings &= map.name() != "settings";
                    }
                    had => {
                        tracing::warn!(
                            map = %path.display(),
                            pinned = ?had.as_ref().map(|h| (h.1, h.2, h.3)),
                            ours = ?(want.1, want.2, want.3),
                            "a pinned map differs from ours (key, value bytes, entries): replaced, its contents \
                             start afresh"
                        );
                        std::fs::remove_file(&path).context(|| format!("unpinning {}", path.display()))?;
                    }
                }
            }
        }
        let mut skel = open.load().context(|| "loading the classifier (is this root, with BTF?)".into())?;
        if let Some(dir) = &opts.pin_path {
            for mut map in skel.object_mut().maps_mut() {
                let path = dir.join(map.name());
                // Internal maps (.bss and the like, named "<obj>.<section>") are not shared state,
                // nor is the no-response tick (its timer calls back into the programs of this
                // load) with its bitmap.
                let name = map.name().to_string_lossy();
                if !path.exists() && !name.contains('.') && !THIS_LOAD_ONLY.contains(&name.as_ref()) {
                    map.pin(&path).context(|| format!("pinning {}", path.display()))?;
                }
            }
        }
        // The protocols loaded, and the rare stages (always loaded).
        let stages = opts.protocols.iter().map(|p| (p.index(), p.program()));
        let stages = stages.chain([(types::proto_prog::PROG_RESET.0, "stage_reset")]);
        for (index, name) in stages {
            let prog = skel
                .object()
                .progs()
                .find(|p| p.name() == name)
                .ok_or_else(|| Error::Unsupported(format!("no program {name}")))?;
            skel.maps
                .proto_progs
                .update(&index.to_ne_bytes(), &prog.as_fd().as_raw_fd().to_ne_bytes(), MapFlags::ANY)
                .context(|| format!("adding {name} to proto_progs"))?;
        }
        if let Some(dir) = &opts.pin_path {
            let id =
                skel.maps.proto_progs.info().map(|i| i.info.id).context(|| "reading proto_progs".into())?;
            let path = dir.join(format!("{PROTO_PROGS_PIN}-{id}"));
            skel.maps.proto_progs.pin(&path).context(|| format!("pinning {}", path.display()))?;
        }
        let programs = crate::programs::stats(skel.object());
        let dp = Self {
            drops: None,
            tracing: None,
            protocols: opts.protocols,
            programs,
            load_time: started.elapsed(),
            skel,
            rules: InstalledRules::new(),
            pin_path: opts.pin_path.clone(),
            adopted,
            only,
            expedite_rcu: opts.expedite_rcu.clone(),
            replay: opts.replay_requests != 0,
            replay_possible: opts.replay_requests != 0,
        };
        if adopted {
            // The earlier instance's scope ids mean nothing to this one's rule set: its
            // interfaces' scopes go, and the interfaces select their rules again.
            clear_scopes(&dp.skel.maps)?;
        }
        dp.sync_rules()?;
        if fresh_settings {
            // The timing groups on by default; adopted settings are kept.
            settings::update(&dp.skel.maps.settings, |s| s.timing = TimingGroup::default_bits())?;
        }
        // The DNS ports are this load's (the configuration's), adopted settings or not.
        dp.set_dns_ports(&opts.dns_ports)?;
        Ok(dp)
    }

    /// The attach mode (never `Auto`) and method whose programs alone were loaded, if not all.
    pub fn loaded_programs(&self) -> Option<(AttachMode, MirrorMethod)> {
        self.only
    }

    /// The protocol programs loaded.
    pub fn protocols(&self) -> Protocols {
        self.protocols
    }

    /// Every program loaded, with what the verifier made of it.
    pub fn programs(&self) -> &[ProgramStats] {
        &self.programs
    }

    /// How long the load took (every program verified, maps created or adopted).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The pins of program arrays left by earlier loads ([`PROTO_PROGS_PIN`]), this load's
    /// aside.
    fn stale_proto_progs(&self) -> Vec<PathBuf> {
        let Some(dir) = &self.pin_path else { return Vec::new() };
        let ours = self.skel.maps.proto_progs.info().map(|i| format!("{PROTO_PROGS_PIN}-{}", i.info.id)).ok();
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{PROTO_PROGS_PIN}-")) && Some(n) != ours.as_ref())
            .map(|n| dir.join(n))
            .collect()
    }

    /// Whether the maps were adopted from pins left by an earlier instance.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The pin directory, if any.
    pub fn pin_path(&self) -> Option<&Path> {
        self.pin_path.as_deref()
    }

    /// Removes every pin of ours (maps and links). What is attached and not pinned stays until
    /// this instance exits.
    pub fn unpin_all(&mut self) -> Result<()> {
        let Some(dir) = self.pin_path.clone() else { return Ok(()) };
        for map in self.skel.object().maps() {
            // Adopted maps are ours too, though libbpf does not mark them as pinned.
            let path = dir.join(map.name());
            if path.exists() {
                std::fs::remove_file(&path).context(|| format!("unpinning {}", path.display()))?;
            }
        }
        // Every program array left: this one's, and those of earlier loads whose links went
        // with the detach (a stop that hands over keeps its pins and never comes here).
        for path in self.stale_proto_progs() {
            let _ = std::fs::remove_file(path);
        }
        if let Ok(id) = self.skel.maps.proto_progs.info().map(|i| i.info.id) {
            let _ = std::fs::remove_file(dir.join(format!("{PROTO_PROGS_PIN}-{id}")));
        }
        let links = dir.join(LINKS_DIR);
        if links.exists() {
            std::fs::remove_dir_all(&links).context(|| format!("removing {}", links.display()))?;
        }
        // Only removed when empty: never anything that is not ours.
        let _ = std::fs::remove_dir(&dir);
        Ok(())
    }

    /// The skeleton, for programs, maps and tests.
    pub fn skel(&self) -> &ClassifierSkel<'obj> {
        &self.skel
    }

    // Settings.

    /// The runtime settings.
    pub fn settings(&self) -> Result<types::settings> {
        settings::read(&self.skel.maps.settings)
    }

    /// Sets the interface that mirrored packets are copied to (0: none, packets are only counted).
    pub fn set_mirror_ifindex(&self, ifindex: u32) -> Result<()> {
        settings::update(&self.skel.maps.settings, |s| s.mirror_ifindex = ifindex)
    }

    /// Sets where mirrored packets go: `ifindex` (0: none, packets are only counted), and
    /// whether it transmits them or receives them. The way is set before the interface, so
    /// that a packet copied meanwhile goes the new way, if to the old interface. With the
    /// mirred method, act_mirred carries both: attach again to apply them.
    pub fn set_mirror_target(&mut self, ifindex: u32, delivery: MirrorDelivery) -> Result<()> {
        let data = mapped(self.skel.maps.data_data.as_deref_mut())?;
        data.mirror_deliver = delivery.flags();
        self.set_mirror_ifindex(ifindex)
    }

    /// How copies reach the mirror interface.
    pub fn mirror_delivery(&self) -> MirrorDelivery {
        settings::mirror_deliver(&self.skel)
    }

    /// Sets the node-wide budget of copies, split evenly over the possible CPUs.
    pub fn set_budget(&self, budget: Budget) -> Result<()> {
        let cpus = possible_cpus()
            .map_err(|cause| Error::Io { what: "counting the possible CPUs".into(), cause })?;
        crate::budget::set(&self.skel.maps.budget_config, budget, cpus)
    }

    /// Copies the node-wide budget refused so far.
    pub fn budget_refused(&self) -> Result<Refused> {
        crate::budget::refused(&self.skel.maps.budget_state)
    }

    /// Switches a timing group on or off at run time.
    pub fn set_timing(&self, group: TimingGroup, on: bool) -> Result<()> {
        settings::set_timing(&self.skel.maps.settings, group, on)
    }

    /// Whether a timing group is on.
    pub fn timing(&self, group: TimingGroup) -> Result<bool> {
        settings::timing(&self.skel.maps.settings, group)
    }

    /// Sets the server ports DNS is followed on (1 to [`settings::DNS_PORTS_MAX`], each
    /// 1-65535); the error says why not, and nothing changes.
    pub fn set_dns_ports(&self, ports: &[u16]) -> Result<()> {
        settings::check_dns_ports(ports).map_err(|why| Error::Unsupported(format!("dns_ports: {why}")))?;
        settings::update(&self.skel.maps.settings, |s| settings::set_dns_ports(s, ports))
    }

    /// The server ports DNS is followed on.
    pub fn dns_ports(&self) -> Result<Vec<u16>> {
        Ok(self.settings()?.dns_ports.into_iter().filter(|p| *p != 0).collect())
    }

    // The tracing programs (see crate::probes).

    /// Loads the tracing programs, sharing this classifier's maps; nothing is attached until a
    /// group is switched on ([`Datapath::set_trace_group`]). Call it from the network namespace
    /// of the interfaces the classifier is attached to. Once loaded, they are kept: a later call
    /// gives the same programs.
    pub fn load_tracing(&mut self) -> Result<&mut Tracing> {
        let tracing = match self.tracing.take() {
            Some(t) => t,
            None => Tracing::load(&self.skel.maps)?,
        };
        Ok(self.tracing.insert(tracing))
    }

    /// The tracing programs, when loaded.
    pub fn tracing(&self) -> Option<&Tracing> {
        self.tracing.as_ref()
    }

    /// The tracing programs, when loaded, for their settings (the stack group's sampling).
    pub fn tracing_mut(&mut self) -> Option<&mut Tracing> {
        self.tracing.as_mut()
    }

    /// Switches a group of the tracing programs on or off. The stack group also makes the
    /// classifier stamp packets: from once its programs are attached, until before they are
    /// detached. Switching a group on needs the programs loaded ([`Datapath::load_tracing`]).
    pub fn set_trace_group(&mut self, group: TraceGroup, on: bool) -> Result<()> {
        let Some(tracing) = &mut self.tracing else {
            if on {
                return Err(Error::Unsupported(format!(
                    "the {} group needs the tracing programs, which are not loaded",
                    group.name()
                )));
            }
            return Ok(());
        };
        if tracing.is_on(group) == on {
            return Ok(());
        }
        let stamps = group == TraceGroup::Stack;
        if stamps && !on {
            set_stack_stamps(&mut self.skel, false);
        }
        tracing.set(group, on)?;
        if stamps && on {
            set_stack_stamps(&mut self.skel, true);
        }
        Ok(())
    }

    // The kernel's drops (see crate::drops).

    /// Attaches the drop program (`include/drop.h`) to the kfree_skb tracepoint: the pods'
    /// packets the kernel drops are counted by reason, and trigger the drop rules. Fails where
    /// the kernel lacks the tracepoint ([`crate::drops::supported`] says why). Again: nothing.
    pub fn attach_drops(&mut self) -> Result<()> {
        if self.drops.is_some() {
            return Ok(());
        }
        crate::drops::supported().map_err(|why| Error::Unsupported(format!("drops: {why}")))?;
        let link = self.skel.progs.drop_trace.attach().context(|| "attaching drop_trace".into())?;
        self.drops = Some(link);
        Ok(())
    }

    /// Whether the drop program is attached.
    pub fn drops_attached(&self) -> bool {
        self.drops.is_some()
    }

    /// The pods' packets the kernel dropped, by reason (see [`crate::drops::DropCounts`]).
    pub fn drop_counts(&self) -> Result<crate::drops::DropCounts> {
        crate::drops::read_counts(&self.skel.maps.drop_counts)
    }

    /// The pods' packets the kernel dropped, by pod and reason (see
    /// [`crate::drops::PodDropCounts`]).
    pub fn pod_drop_counts(&self) -> Result<crate::drops::PodDropCounts> {
        crate::drops::read_pod_counts(&self.skel.maps.drop_pods)
    }

    // Attaching.

    fn attacher(&self) -> Attacher<'_, 'obj> {
        Attacher {
            skel: &self.skel,
            pin_path: self.pin_path.as_deref(),
            loaded: self.only,
            expedite_rcu: self.expedite_rcu.as_deref(),
        }
    }

    /// Attaches the classifier to `ifindex`, ingress and egress.
    pub fn attach(&self, ifindex: u32, mode: AttachMode, method: MirrorMethod) -> Result<Attachment> {
        self.attacher().attach(ifindex, mode, method)
    }

    /// Leaves the classifier attached after this instance exits (TCX links stay through their
    /// pins, filters stay on their qdisc); the next instance adopts them on attach.
    pub fn release(&self, att: Attachment) {
        drop(att);
    }

    /// Detaches from the interface: our filters or links, and our clsact if nobody else uses it.
    pub fn detach(&self, att: Attachment) -> Result<()> {
        self.attacher().detach(att)
    }

    /// Detaches and unpins the TCX links pinned for interfaces `keep` rejects (left by an
    /// earlier instance for interfaces that vanished or no longer match). Returns how many.
    /// The program arrays pinned by earlier loads go too: every link left is ours now.
    pub fn drop_stale_links(&self, keep: impl Fn(u32) -> bool) -> Result<usize> {
        let dropped = self.attacher().drop_stale_links(keep)?;
        for path in self.stale_proto_progs() {
            std::fs::remove_file(&path).context(|| format!("unpinning {}", path.display()))?;
        }
        Ok(dropped)
    }

    // Rules.

    /// Adds a rule that reaches every interface, with the next free id.
    pub fn add_rule(&mut self, rule: Rule) -> Result<RuleId> {
        self.add_rule_with(rule, Reach::Everywhere)
    }

    /// Adds a rule that reaches `reach`, with the next free id. A rule whose trigger or
    /// filters need a protocol program this data path did not load is refused
    /// ([`Protocols::admits`]).
    pub fn add_rule_with(&mut self, rule: Rule, reach: Reach) -> Result<RuleId> {
        self.protocols
            .admits(&rule)
            .map_err(|why| Error::ProtocolNotLoaded(format!("rule '{rule}' {why}")))?;
        let id = self.rules.next_id();
        self.insert_rule_with(id, rule, reach)?;
        Ok(id)
    }

    /// Adds a rule that reaches every interface, with a given id (to restore saved rules).
    pub fn insert_rule(&mut self, id: RuleId, rule: Rule) -> Result<()> {
        self.insert_rule_with(id, rule, Reach::Everywhere)
    }

    /// Adds a rule that reaches `reach`, with a given id (to restore saved rules). A rule
    /// already there with that id is replaced, and leaves the interfaces that selected it.
    pub fn insert_rule_with(&mut self, id: RuleId, rule: Rule, reach: Reach) -> Result<()> {
        self.rules.add(&self.skel.maps, id, None, rule, reach, true)?;
        self.sync_rules()
    }

    /// Adds a saved rule that reaches every interface, with its id and hit-counter slot,
    /// keeping its hit count.
    pub fn restore_rule(&mut self, id: RuleId, slot: u32, rule: Rule) -> Result<()> {
        self.restore_rule_with(id, slot, rule, Reach::Everywhere)
    }

    /// Adds a saved rule that reaches `reach`, with its id and hit-counter slot, keeping its hit
    /// count. The interfaces select their rules again ([`Datapath::select`]): an adopted
    /// instance's scopes were cleared at load.
    pub fn restore_rule_with(&mut self, id: RuleId, slot: u32, rule: Rule, reach: Reach) -> Result<()> {
        self.rules.add(&self.skel.maps, id, Some(slot), rule, reach, false)?;
        self.sync_rules()
    }

    /// The hit-counter slot of a rule (saved with it, for [`Datapath::restore_rule`]).
    pub fn rule_slot(&self, id: RuleId) -> Option<u32> {
        self.rules.slot(id)
    }

    /// Where a rule reaches (saved with it, for [`Datapath::restore_rule_with`]).
    pub fn rule_reach(&self, id: RuleId) -> Option<Reach> {
        self.rules.reach(id)
    }

    /// Every rule with its id and slot, without reading the hit counters (what a saved state
    /// needs to restore them, with [`Datapath::rule_reach`]).
    pub fn rule_slots(&self) -> Vec<(RuleId, u32, Rule)> {
        self.rules.slots()
    }

    /// Removes a rule. Flows it already marked stay mirrored until their limits. A selected
    /// rule leaves every interface that selected it.
    pub fn remove_rule(&mut self, id: RuleId) -> Result<Rule> {
        let rule = self.rules.remove(&self.skel.maps, id)?;
        self.sync_rules()?;
        Ok(rule)
    }

    /// Makes `rules` the selected rules ([`Reach::Selected`]) that apply on `ifindex`, the
    /// host-side veth of a pod: there, and on flows whose server is that pod, they trigger
    /// besides the rules that reach everywhere (the lowest id winning among both, as among
    /// any rules). Empty: only the rules that reach everywhere. Fails for an unknown id or a
    /// rule that reaches everywhere, and when the scope does not fit the rule maps, leaving
    /// the interface's rules as they were. The same set again writes nothing.
    pub fn select(&mut self, ifindex: u32, rules: &BTreeSet<RuleId>) -> Result<()> {
        if self.rules.select(&self.skel.maps, ifindex, rules)? {
            self.sync_rules()?;
        }
        Ok(())
    }

    /// No selected rule applies on `ifindex` any more (the interface is detached, or gone).
    pub fn forget_iface(&mut self, ifindex: u32) -> Result<()> {
        self.select(ifindex, &BTreeSet::new())
    }

    /// The selected rules that apply on `ifindex` (as selected, less the rules removed since).
    pub fn selected(&self, ifindex: u32) -> BTreeSet<RuleId> {
        self.rules.selected(ifindex)
    }

    /// Scopes in use: distinct sets of selected rules that some interface selects.
    pub fn scopes(&self) -> usize {
        self.rules.scopes()
    }

    // The request behind a trigger (see crate::replay).

    /// Whether flows a rule could trigger on keep their latest request, for events and
    /// replays (on by default when the map has slots).
    pub fn set_replay(&mut self, on: bool) -> Result<()> {
        if on && !self.replay_possible {
            return Err(Error::Unsupported("loaded with replay_requests 0: no request is kept".into()));
        }
        self.replay = on;
        self.sync_rules()
    }

    /// Tells the classifier, after a change of rules, which flows keep their requests (for
    /// replays, and for host= filters, which read the kept request even with replays off),
    /// which kinds of trigger to look for, and whether any interface selects rules.
    fn sync_rules(&self) -> Result<()> {
        let rules = self.rules.slots();
        let hosts = self.replay_possible && rules.iter().any(|(_, _, r)| r.filter.host.is_some());
        let mode = crate::replay::keep_mode(self.replay || hosts, rules.iter().map(|(_, _, r)| r));
        let kinds = self.rules.kinds();
        let scoped = u32::from(self.rules.scopes() > 0);
        settings::update(&self.skel.maps.settings, |s| {
            s.replay_keep = mode;
            s.kinds = kinds;
            s.scoped = scoped;
        })?;
        if kinds & (1 << types::trigger_kind::TRIGGER_NORESPONSE.0) != 0 {
            // The tick, unless it runs (it stops by itself once no such rule is left).
            self.skel
                .progs
                .noresponse_tick_start
                .test_run(libbpf_rs::ProgramInput::default())
                .context(|| "starting the no-response tick".into())?;
        }
        Ok(())
    }

    /// Attaches the replay program to the egress of the mirror interface `ifindex` (TCX where
    /// the kernel has it) and sends replays through it: the request behind each trigger reaches
    /// the mirror interface ahead of the response, marked by [`crate::replay::REPLAY_MAC`].
    pub fn attach_replay(&self, ifindex: u32) -> Result<crate::replay::ReplayHook> {
        let tcx = match self.only {
            Some((mode, _)) => mode == AttachMode::Tcx,
            None => crate::attach::tcx_supported(),
        };
        let hook = crate::replay::attach(&self.skel, self.pin_path.as_deref(), ifindex, tcx)?;
        settings::update(&self.skel.maps.settings, |s| s.replay_ifindex = ifindex)?;
        Ok(hook)
    }

    /// Stops replays and detaches the replay program.
    pub fn detach_replay(&self, hook: crate::replay::ReplayHook) -> Result<()> {
        settings::update(&self.skel.maps.settings, |s| s.replay_ifindex = 0)?;
        crate::replay::detach(&self.skel, hook)
    }

    /// The rules, by id, with their hit counts.
    pub fn rules(&self) -> Result<Vec<RuleInfo>> {
        self.rules.list(&self.skel.maps)
    }

    // What the classifier saw.

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        Counters::read(&self.skel.maps.stats)
    }

    /// DNS responses seen by rcode (entry `r`: rcode `r`), summed over CPUs.
    pub fn dns_rcodes(&self) -> Result<crate::stats::DnsRcodeCounts> {
        crate::stats::read_dns_rcodes(&self.skel.maps.dns_rcodes)
    }

    /// The mark of one flow.
    pub fn mark(&self, key: &FlowKey) -> Result<Option<MirrorMark>> {
        flow::read_mark(&self.skel.maps.mirror_marks, key)
    }

    /// Every flow of the flow table, with traffic summed over CPUs and its mark; the two tuples
    /// of a connection translated by conntrack are one flow (see [`Flow::nat`]).
    pub fn flows(&self) -> Result<Vec<Flow>> {
        let maps = &self.skel.maps;
        flow::read_flows(&maps.flow_table, &maps.flow_cache, &maps.mirror_marks, &maps.flow_nat)
    }

    /// The client's and the server's tuples of `key`'s connection when the node's conntrack
    /// translated it (a Service); `None` otherwise.
    pub fn nat_tuples(&self, key: &FlowKey) -> Result<Option<flow::NatTuples>> {
        flow::read_nat_tuples(&self.skel.maps.flow_nat, key)
    }

    /// Every latency histogram, summed over CPUs.
    pub fn histograms(&self) -> Result<Vec<Histogram>> {
        latency::read_histograms(&self.skel.maps.hist_slots, &self.skel.maps.latency_hists)
    }

    /// A ring buffer that calls `f` for each trigger event; poll it to receive them.
    pub fn events<F>(&self, f: F) -> Result<RingBuffer<'static>>
    where
        F: FnMut(TriggerEvent) + 'static,
    {
        event::ring(&[&self.skel.maps.events, &self.skel.maps.drop_events], f)
    }

    /// Polls `rb` once for at most `timeout`.
    pub fn poll_events(rb: &RingBuffer<'_>, timeout: Duration) -> Result<()> {
        event::poll(rb, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::DatapathOptions;

    #[test]
    fn replay_requests_are_none_or_a_power_of_two_within_bounds() {
        let check = DatapathOptions::check_replay_requests;
        for ok in [0, 64, DatapathOptions::REPLAY_REQUESTS, 65_536] {
            check(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [1, 32, 1000, 4097, 131_072] {
            let e = check(bad).unwrap_err();
            assert_eq!(e, format!("{bad}: 0 (off) or a power of two from 64 to 65536"));
        }
    }
}
