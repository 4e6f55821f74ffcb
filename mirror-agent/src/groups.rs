//! Measurement groups that can be switched at run time: the classifier's timings (on by
//! default) and the tracing programs (off by default).

use mirror_bpf::{TimingGroup, TraceGroup};

/// A measurement group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A classifier timing: HTTP response time, TCP handshake time, or DNS answers.
    Timing(TimingGroup),
    /// Tracing programs: kernel stack latency or network-stack CPU cost.
    Trace(TraceGroup),
}

impl Group {
    /// Every group, in the order they are listed.
    pub fn all() -> impl Iterator<Item = Group> {
        TimingGroup::ALL.into_iter().map(Group::Timing).chain(TraceGroup::ALL.into_iter().map(Group::Trace))
    }

    /// Its name: http, handshake, dns, stack, cpu.
    pub fn name(self) -> &'static str {
        match self {
            Group::Timing(g) => g.name(),
            Group::Trace(g) => g.name(),
        }
    }

    /// The group of that name.
    pub fn from_name(name: &str) -> Option<Group> {
        Group::all().find(|g| g.name() == name)
    }

    /// Every name, for messages.
    pub fn names() -> String {
        Group::all().map(Group::name).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(Group::names(), "http, handshake, dns, stack, cpu");
        for g in Group::all() {
            assert_eq!(Group::from_name(g.name()), Some(g));
        }
        assert_eq!(Group::from_name("disk"), None);
    }
}
