//! The data path, owned by one thread: libbpf objects are not shared between threads, so
//! every operation is a command sent here and answered through a oneshot channel. Between
//! commands the thread reads the trigger events as they come (replaying the request behind a
//! noresponse mark at once) and samples CPU time.
//!
//! One concern per module: this one is the thread (the [`Engine`] handle, its commands and
//! the loop that serves them); [`driver`] drives the data path (load, attach, rules, groups,
//! stop) and is the state file's writer while the engine runs; [`attached`] keeps the
//! attached links and publishes their list ([`Engine::attached`]); [`view`] builds what the
//! API shows; [`events`] reads the trigger events; [`cpu`] samples the network stack's CPU
//! time.

mod attached;
mod cluster_rules;
mod cpu;
mod driver;
mod events;
mod replay;
mod view;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use tokio::sync::{oneshot, watch};

use mirror_bpf::{AttachMode, DatapathOptions, MirrorDelivery, MirrorMethod, Rule};

use crate::event_log::EventLog;
use crate::groups::Group;
use crate::state::StateStore;
use crate::views::{CpuShareView, FlowView, GroupView, HistogramView, InterfaceView, LatencyView, RuleView};
pub use cluster_rules::{Installed, WantedRule};
use driver::Driver;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Map sizes and pin path.
    pub datapath: DatapathOptions,
    /// Attach mode.
    pub mode: AttachMode,
    /// Mirror method.
    pub method: MirrorMethod,
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
    /// Attach latency as a histogram: (upper bound in seconds, attachments up to it, not
    /// cumulative), and the sum in seconds.
    pub attach_buckets: (Vec<(f64, u64)>, f64),
    /// The mirror ifindex in use (0: none).
    pub mirror_ifindex: u32,
    /// Share of each CPU spent in the network stack over the last second (cpu group on).
    pub net_cpu: Vec<CpuShareView>,
    /// How the tracing programs run: "fexit + tp_btf", "tp_btf (this kernel refuses fexit: ...)", or why not.
    pub tracing: String,
    /// The protocols followed.
    pub protocols: String,
    /// The data path's programs.
    pub programs: Vec<crate::views::ProgramView>,
    /// DNS responses seen by rcode (entry `r`: rcode `r`).
    pub dns_rcodes: mirror_bpf::stats::DnsRcodeCounts,
    /// The pods' packets the kernel dropped, by reason (its name on this kernel), those seen.
    pub drops: BTreeMap<String, u64>,
    /// The same by pod: (the pod's veth ifindex, 0 when no pod was found; reason; count).
    pub pod_drops: Vec<(u32, String, u64)>,
    /// The entries of the maps the settings size, as loaded (adopted maps keep theirs).
    pub map_sizes: crate::memory::Sizes,
}

/// What adding a rule did.
#[derive(Debug, Clone)]
pub struct AddedRule {
    /// The rule: the new one, or the same one installed before.
    pub view: RuleView,
    /// Whether it was added now (`false`: the same rule was there already, under `view.id`).
    pub created: bool,
}

/// What a stopped engine hands back.
#[derive(Debug)]
pub struct Stopped {
    /// Whether everything was detached (or released) cleanly.
    pub result: anyhow::Result<()>,
    /// The state file, whose one writer is the caller from now on.
    pub state: StateStore,
}

type Reply<T> = oneshot::Sender<anyhow::Result<T>>;

enum Cmd {
    Attach { ifindex: u32, name: String, since: Instant, reply: Reply<InterfaceView> },
    Detach { ifindex: u32, reply: Reply<bool> },
    SetMirror { ifindex: u32, delivery: MirrorDelivery, sink: u32, reply: Reply<()> },
    AddRule { rule: Rule, reply: Reply<AddedRule> },
    DelRule { id: u32, reply: Reply<RuleView> },
    SetClusterRules { want: Vec<WantedRule>, reply: Reply<Vec<(String, Installed)>> },
    Rules { reply: Reply<Vec<RuleView>> },
    Flows { reply: Reply<Vec<FlowView>> },
    Marks { keys: Vec<mirror_bpf::FlowKey>, reply: Reply<Vec<Option<mirror_bpf::flow::MirrorMark>>> },
    Latency { reply: Reply<Vec<HistogramView>> },
    Groups { set: Option<(Group, bool)>, reply: Reply<Vec<GroupView>> },
    Status { reply: Reply<EngineStatus> },
    DropStalePins { reply: Reply<usize> },
    SetCreatedSink { created: bool, reply: Reply<()> },
    Shutdown { keep_attached: bool, reply: oneshot::Sender<Stopped> },
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Cmd>,
    /// Written after each command sent: the thread waits on it and on the ring buffer at once.
    wake: Arc<Wake>,
    attached: watch::Receiver<Vec<InterfaceView>>,
}

/// How long the thread waits for a command or an event before its periodic work (the CPU
/// sample) and a look at the ring buffer.
const EVENT_POLL: Duration = Duration::from_millis(20);

/// An eventfd that wakes the engine thread when a command was sent.
struct Wake(OwnedFd);

impl Wake {
    fn new() -> std::io::Result<Wake> {
        // SAFETY: plain eventfd creation; the descriptor is checked and owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just created and own.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn notify(&self) {
        let one = 1u64;
        // SAFETY: an eventfd is written 8 bytes at a time, from `one`. It cannot fail short of
        // 2^64 - 2 writes unread.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl AsRawFd for Wake {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Engine {
    /// Starts the engine thread: loads (or adopts) the data path and restores the rules of
    /// `state`, which the engine writes from now on (until [`Engine::shutdown`] returns it).
    /// Trigger events go to `events`.
    pub async fn start(
        cfg: EngineConfig,
        state: StateStore,
        events: Arc<EventLog>,
    ) -> anyhow::Result<Engine> {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(Wake::new().context("creating the engine's eventfd")?);
        let (ready_tx, ready_rx) = oneshot::channel();
        let (attached_tx, attached) = watch::channel(Vec::new());
        let woken = wake.clone();
        std::thread::Builder::new()
            .name("datapath".into())
            .spawn(move || match Driver::new(cfg, state, events, attached_tx) {
                Ok(d) => {
                    let _ = ready_tx.send(Ok(()));
                    run(d, rx, &woken);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .context("starting the data-path thread")?;
        ready_rx.await.map_err(|_| anyhow!("the data-path thread died"))??;
        Ok(Engine { tx, wake, attached })
    }

    /// The attached interfaces, sent again each time they change (a link attached, renamed,
    /// detached or lost). The channel closes when the engine stops.
    pub fn attached(&self) -> watch::Receiver<Vec<InterfaceView>> {
        self.attached.clone()
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> anyhow::Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| anyhow!("the data-path thread has stopped"))?;
        self.wake.notify();
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
    /// them, and the sink itself (`sink`, 0: none), whose egress replays requests.
    pub async fn set_mirror(&self, ifindex: u32, delivery: MirrorDelivery, sink: u32) -> anyhow::Result<()> {
        self.call(|reply| Cmd::SetMirror { ifindex, delivery, sink, reply }).await
    }

    /// Adds a rule; it is saved at once. The same rule given again is not added twice: its
    /// existing id is returned. A rule that would not fit the rule maps is refused with a
    /// [`mirror_bpf::rule::capacity::CapacityError`], and nothing changes.
    pub async fn add_rule(&self, rule: Rule) -> anyhow::Result<AddedRule> {
        self.call(|reply| Cmd::AddRule { rule, reply }).await
    }

    /// Deletes a rule; flows it marked stay mirrored until their limits.
    pub async fn del_rule(&self, id: u32) -> anyhow::Result<RuleView> {
        self.call(|reply| Cmd::DelRule { id, reply }).await
    }

    /// Installs the cluster's rules for this node, each under its resource's key, and removes
    /// the cluster rules it does not list (never a local one); hands each interface its
    /// selected rules. One result per wanted rule.
    pub async fn set_cluster_rules(&self, want: Vec<WantedRule>) -> anyhow::Result<Vec<(String, Installed)>> {
        self.call(|reply| Cmd::SetClusterRules { want, reply }).await
    }

    /// The rules.
    pub async fn rules(&self) -> anyhow::Result<Vec<RuleView>> {
        self.call(|reply| Cmd::Rules { reply }).await
    }

    /// The flows.
    pub async fn flows(&self) -> anyhow::Result<Vec<FlowView>> {
        self.call(|reply| Cmd::Flows { reply }).await
    }

    /// The marks of these flows (`None`: not marked, or gone), one lookup each.
    pub async fn marks(
        &self,
        keys: Vec<mirror_bpf::FlowKey>,
    ) -> anyhow::Result<Vec<Option<mirror_bpf::flow::MirrorMark>>> {
        self.call(|reply| Cmd::Marks { keys, reply }).await
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
    /// it at exit, even after a restart). The engine holds the file's one writer while it runs.
    pub async fn set_created_sink(&self, created: bool) -> anyhow::Result<()> {
        self.call(|reply| Cmd::SetCreatedSink { created, reply }).await
    }

    /// Detaches everything and removes pins, or with `keep_attached` leaves it all for the
    /// next agent. The thread ends and hands the state file back.
    pub async fn shutdown(&self, keep_attached: bool) -> anyhow::Result<Stopped> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Shutdown { keep_attached, reply })
            .map_err(|_| anyhow!("the data-path thread has stopped"))?;
        self.wake.notify();
        rx.await.map_err(|_| anyhow!("the data-path thread has stopped"))
    }
}

/// The thread's loop: each command, then the events and the CPU sample; with no command
/// waiting, a wait for one, for a trigger event or [`EVENT_POLL`], whichever comes first (so
/// the request behind a noresponse mark is replayed as soon as its event is in the ring).
fn run(mut d: Driver, rx: mpsc::Receiver<Cmd>, wake: &Wake) {
    loop {
        match rx.try_recv() {
            Ok(Cmd::Shutdown { keep_attached, reply }) => {
                let _ = reply.send(d.shutdown(keep_attached));
                return;
            }
            Ok(cmd) => handle(&mut d, cmd),
            Err(mpsc::TryRecvError::Empty) => d.wait(wake, EVENT_POLL),
            Err(mpsc::TryRecvError::Disconnected) => return,
        }
        d.tick();
    }
}

fn handle(d: &mut Driver, cmd: Cmd) {
    match cmd {
        Cmd::Attach { ifindex, name, since, reply } => {
            let _ = reply.send(d.attach(ifindex, name, since));
        }
        Cmd::Detach { ifindex, reply } => {
            let _ = reply.send(d.detach(ifindex));
        }
        Cmd::SetMirror { ifindex, delivery, sink, reply } => {
            let _ = reply.send(d.set_mirror(ifindex, delivery, sink));
        }
        Cmd::AddRule { rule, reply } => {
            let _ = reply.send(d.add_rule(rule));
        }
        Cmd::DelRule { id, reply } => {
            let _ = reply.send(d.del_rule(id));
        }
        Cmd::SetClusterRules { want, reply } => {
            let _ = reply.send(d.set_cluster_rules(want));
        }
        Cmd::Rules { reply } => {
            let _ = reply.send(d.rules());
        }
        Cmd::Flows { reply } => {
            let _ = reply.send(view::flows(d.datapath()));
        }
        Cmd::Marks { keys, reply } => {
            let _ = reply.send(keys.iter().map(|k| Ok(d.datapath().mark(k)?)).collect());
        }
        Cmd::Latency { reply } => {
            let _ = reply.send(view::latency(d.datapath(), d.attached()));
        }
        Cmd::Groups { set, reply } => {
            let _ = reply.send(d.groups(set));
        }
        Cmd::Status { reply } => {
            let _ = reply.send(d.status());
        }
        Cmd::DropStalePins { reply } => {
            let _ = reply.send(d.drop_stale_pins());
        }
        Cmd::SetCreatedSink { created, reply } => {
            let _ = reply.send(d.set_created_sink(created));
        }
        Cmd::Shutdown { .. } => unreachable!("handled in run"),
    }
}
