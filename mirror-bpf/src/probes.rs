//! The tracing programs, by group, switched at run time: kernel stack latency ("stack") and
//! network-stack CPU cost ("cpu"). They share the classifier's interface set and histograms.
//!
//! fexit is preferred where the kernel allows it (it lets clones inherit their parent's stamp);
//! where it is refused (lockdown, or no BTF trampolines) the same groups run on tp_btf and raw
//! tracepoints, and clones are not followed. The choice is made once, at load.
//!
//! The [`crate::datapath::Datapath`] owns them ([`crate::datapath::Datapath::load_tracing`]):
//! they are given the classifier's maps they share, and the Datapath switches the classifier's
//! stamps with the stack group.

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, ProgramMut};

use libbpf_rs::libbpf_sys;

use crate::error::{Context, Result};
use crate::shared::read_plain;
use crate::skel::classifier::ClassifierMaps;
use crate::skel::tracing::{OpenTracingSkel, TracingSkel, TracingSkelBuilder};

/// A group of tracing programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceGroup {
    /// Kernel stack latency per stage.
    Stack,
    /// Share of CPU time in the network stack.
    Cpu,
}

impl TraceGroup {
    /// Every group.
    pub const ALL: [TraceGroup; 2] = [TraceGroup::Stack, TraceGroup::Cpu];

    /// Its name: `stack`, `cpu`.
    pub fn name(self) -> &'static str {
        match self {
            TraceGroup::Stack => "stack",
            TraceGroup::Cpu => "cpu",
        }
    }

    /// The group of that name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// Network-stack CPU time of one CPU since load, nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCpuTime {
    /// In send/receive system calls (softirqs inside them excluded).
    pub syscall_ns: u64,
    /// In NET_RX softirqs.
    pub softirq_rx_ns: u64,
    /// In NET_TX softirqs.
    pub softirq_tx_ns: u64,
}

/// The loaded tracing programs and the links of the groups that are on.
pub struct Tracing {
    skel: TracingSkel<'static>,
    fexit: Result<(), String>,
    stack: Vec<Link>,
    cpu: Vec<Link>,
}

fn open(ours: &ClassifierMaps<'_>, with_fexit: bool) -> Result<OpenTracingSkel<'static>> {
    // One object per attempt, alive as long as the process (at most two per agent).
    let storage = Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit()));
    let mut open =
        TracingSkelBuilder::default().open(storage).context(|| "opening the tracing programs".into())?;
    let maps = &mut open.maps;
    for (map, shared, name) in [
        (&mut maps.attached_ifaces, ours.attached_ifaces.as_fd(), "attached_ifaces"),
        (&mut maps.latency_hists, ours.latency_hists.as_fd(), "latency_hists"),
        (&mut maps.hist_slots, ours.hist_slots.as_fd(), "hist_slots"),
        (&mut maps.hist_next, ours.hist_next.as_fd(), "hist_next"),
        (&mut maps.hist_cache, ours.hist_cache.as_fd(), "hist_cache"),
        (&mut maps.skb_stamps, ours.skb_stamps.as_fd(), "skb_stamps"),
    ] {
        map.reuse_fd(shared).context(|| format!("sharing {name} with the tracing programs"))?;
    }
    open.progs.stack_clone.set_autoload(with_fexit);
    let sock_tps = sock_length_tracepoints();
    open.progs.cpu_sock_send.set_autoload(sock_tps);
    open.progs.cpu_sock_recv.set_autoload(sock_tps);
    if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
        rodata.node_netns = current_netns()?;
        rodata.sock_length_tps = u32::from(sock_tps);
    }
    Ok(open)
}

/// Whether the kernel has the sock_send_length and sock_recv_length tracepoints (6.3+), which
/// tell read/write calls on IP sockets from file I/O.
fn sock_length_tracepoints() -> bool {
    ["sock_send_length", "sock_recv_length"].iter().all(|name| {
        let name = std::ffi::CString::new(*name).expect("no NUL");
        // SAFETY: a NUL-terminated name; libbpf only reads the kernel's BTF.
        unsafe { libbpf_sys::libbpf_find_vmlinux_btf_id(name.as_ptr(), libbpf_sys::BPF_TRACE_RAW_TP) > 0 }
    })
}

/// The inode of the calling thread's network namespace (the node's: where the classifier is).
pub(crate) fn current_netns() -> Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/proc/thread-self/ns/net")
        .context(|| "reading /proc/thread-self/ns/net".into())?;
    Ok(meta.ino() as u32)
}

impl Tracing {
    /// The stack group's sampling unless set, and `latency.stack_sample`'s default: 1 in 16
    /// packets (each stamp is a hash insert and delete).
    pub const STACK_SAMPLE: u32 = 16;

    /// Loads the tracing programs (nothing is attached yet), sharing the classifier's maps
    /// `shared`. Call it from the network namespace of the interfaces the classifier is on.
    pub(crate) fn load(shared: &ClassifierMaps<'_>) -> Result<Tracing> {
        let (skel, fexit) = match open(shared, true)?.load() {
            Ok(skel) => (skel, Ok(())),
            Err(e) => {
                let why = e.to_string();
                let skel = open(shared, false)?.load().context(|| "loading the tracing programs".into())?;
                (skel, Err(why))
            }
        };
        let mut tracing = Tracing { skel, fexit, stack: Vec::new(), cpu: Vec::new() };
        tracing.set_stack_sample(Self::STACK_SAMPLE);
        Ok(tracing)
    }

    /// Stamps 1 in `every` packets received in the node for the stack group (0 or 1: every
    /// packet): the per-stage histograms then count that share of the packets
    /// (`latency.stack_sample`; [`Tracing::STACK_SAMPLE`] from load).
    pub fn set_stack_sample(&mut self, every: u32) {
        if let Some(data) = self.skel.maps.data_data.as_deref_mut() {
            data.stack_sample = every.max(1);
        }
    }

    /// The stack group's sampling: 1 in how many packets.
    pub fn stack_sample(&self) -> u32 {
        self.skel.maps.data_data.as_deref().map_or(1, |d| d.stack_sample.max(1))
    }

    /// Whether read/write/sendfile on IP sockets count in the cpu group (the kernel has the
    /// sock_send_length and sock_recv_length tracepoints); send and recv calls always do.
    pub fn socket_io_counted(&self) -> bool {
        self.skel.maps.rodata_data.is_some_and(|r| r.sock_length_tps != 0)
    }

    /// Whether fexit could be used; else why not.
    pub fn fexit(&self) -> &Result<(), String> {
        &self.fexit
    }

    /// The loaded programs and their maps.
    pub fn skel(&self) -> &TracingSkel<'static> {
        &self.skel
    }

    /// Whether a group is on.
    pub fn is_on(&self, group: TraceGroup) -> bool {
        match group {
            TraceGroup::Stack => !self.stack.is_empty(),
            TraceGroup::Cpu => !self.cpu.is_empty(),
        }
    }

    /// Attaches or detaches the programs of a group (the classifier's stamps for the stack
    /// group are the caller's: [`crate::datapath::Datapath::set_trace_group`]).
    pub(crate) fn set(&mut self, group: TraceGroup, on: bool) -> Result<()> {
        if self.is_on(group) == on {
            return Ok(());
        }
        if !on {
            match group {
                TraceGroup::Stack => self.stack.clear(),
                TraceGroup::Cpu => self.cpu.clear(),
            }
            return Ok(());
        }
        let p = &self.skel.progs;
        let progs: Vec<&ProgramMut<'_>> = match group {
            TraceGroup::Stack => {
                let mut v = vec![&p.stack_rx, &p.stack_xmit, &p.stack_read, &p.stack_consume, &p.stack_free];
                if self.fexit.is_ok() {
                    v.push(&p.stack_clone);
                }
                v
            }
            TraceGroup::Cpu => {
                let mut v = vec![
                    &p.cpu_sys_enter,
                    &p.cpu_sys_exit,
                    &p.cpu_softirq_entry,
                    &p.cpu_softirq_exit,
                    &p.cpu_sched_switch,
                ];
                if self.socket_io_counted() {
                    v.extend([&p.cpu_sock_send, &p.cpu_sock_recv]);
                }
                v
            }
        };
        let links = progs
            .into_iter()
            .map(|prog| prog.attach().context(|| format!("attaching {}", prog.name().to_string_lossy())))
            .collect::<Result<Vec<_>>>()?;
        match group {
            TraceGroup::Stack => self.stack = links,
            TraceGroup::Cpu => self.cpu = links,
        }
        Ok(())
    }

    /// Network-stack CPU time per CPU since load (index = CPU).
    pub fn cpu_times(&self) -> Result<Vec<NetCpuTime>> {
        let per_cpu = self
            .skel
            .maps
            .net_cpu_time
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .context(|| "reading net_cpu_time".into())?
            .unwrap_or_default();
        Ok(per_cpu
            .iter()
            .map(|b| {
                let v: crate::skel::tracing::types::net_cpu_time = read_plain(b);
                NetCpuTime {
                    syscall_ns: v.syscall_ns,
                    softirq_rx_ns: v.softirq_rx_ns,
                    softirq_tx_ns: v.softirq_tx_ns,
                }
            })
            .collect())
    }
}
