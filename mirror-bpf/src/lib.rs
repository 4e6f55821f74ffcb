//! The data path of the mirror: a tc classifier that finds HTTP status triggers, keeps a flow
//! table and mirrors exactly the triggered flows, and the Rust API that loads, attaches and
//! drives it.
//!
//! Every struct shared with the BPF programs is defined once, in `src/bpf/include/types.h`,
//! and reaches Rust through the skeleton ([`types`]).

#![warn(missing_docs)]

pub mod attach;
pub mod budget;
pub mod datapath;
pub mod drops;
pub mod error;
pub mod event;
pub mod flow;
pub mod latency;
mod netlink;
pub mod probes;
pub mod programs;
pub mod protocols;
pub mod rcu;
pub mod replay;
pub mod rule;
pub mod settings;
mod shared;
pub mod skel;
pub mod stats;
mod tcx_link;
#[cfg(feature = "testing")]
pub mod testing;

pub use attach::{tcx_supported, AttachMode, AttachTimings, Attachment, MirrorMethod};
pub use budget::{Budget, Refused};
pub use datapath::{Datapath, DatapathOptions};
pub use error::{Error, Result};
pub use event::{DnsQuestion, HttpProto, RequestState, Side, TriggerEvent};
pub use flow::{DirStats, Flow, FlowKey, MirrorMark, NatTuples};
pub use latency::{HistKind, Histogram};
/// The ring buffer of trigger events returned by [`Datapath::events`].
pub use libbpf_rs::RingBuffer as EventRing;
pub use probes::{NetCpuTime, TraceGroup, Tracing};
pub use programs::ProgramStats;
pub use protocols::{Protocol, Protocols};
pub use replay::{ReplayHook, ReplayedRequest};
pub use rule::{
    DnsRcodes, DropReasons, GrpcCodes, Limits, Reach, RequestFilter, Rule, RuleError, RuleId, RuleInfo,
    StatusMatch, Trigger, TriggerKind,
};
pub use settings::MirrorDelivery;
pub use settings::TimingGroup;
pub use shared::{possible_cpus, types};
pub use stats::Counters;
