//! What the mirror must carry, derived from a reference capture taken at an endpoint: for each
//! connection whose server sent a triggering status line, that packet and every later packet
//! of the connection, both directions, each exactly once; nothing of any other connection.

use std::collections::{BTreeMap, BTreeSet};

use mirror_bpf::FlowKey;

use crate::pcap::{PacketId, Trace};

/// A connection that must be mirrored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggeredFlow {
    /// The connection.
    pub flow: FlowKey,
    /// The status that triggered it.
    pub status: u16,
    /// Its packets from the trigger on.
    pub packets: u64,
}

/// The expected mirror of a reference capture.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// Connections that must be mirrored, in trigger order.
    pub triggered: Vec<TriggeredFlow>,
    /// The packets the mirror must carry, in reference order.
    pub packets: Vec<PacketId>,
    /// Every connection of the reference capture.
    pub flows: BTreeSet<FlowKey>,
}

impl Expected {
    /// Computes it; `trigger(status, server_port)` says whether a response triggers.
    pub fn from_reference(reference: &Trace, trigger: impl Fn(u16, u16) -> bool) -> Expected {
        let mut e = Expected::default();
        let mut mirrored: BTreeMap<FlowKey, usize> = BTreeMap::new();
        for p in &reference.packets {
            let flow = p.flow();
            e.flows.insert(flow);
            let index = match mirrored.get(&flow) {
                Some(&i) => i,
                None => match p.http_status().filter(|s| trigger(*s, p.src.port())) {
                    Some(status) => {
                        e.triggered.push(TriggeredFlow { flow, status, packets: 0 });
                        mirrored.insert(flow, e.triggered.len() - 1);
                        e.triggered.len() - 1
                    }
                    None => continue,
                },
            };
            e.triggered[index].packets += 1;
            e.packets.push(p.id());
        }
        e
    }

    /// Connections that must not be mirrored at all.
    pub fn untriggered(&self) -> impl Iterator<Item = &FlowKey> {
        self.flows.iter().filter(|f| !self.triggered.iter().any(|t| t.flow == **f))
    }

    /// Asserts that `mirror` holds exactly the expected packets, each as often as the reference.
    #[track_caller]
    pub fn assert_mirror(&self, mirror: &Trace) {
        if let Err(diff) = self.compare_mirror(mirror) {
            panic!("{diff}");
        }
    }

    /// What differs between `mirror` and the expected packets; `Ok` when it holds exactly them,
    /// each as often as the reference.
    pub fn compare_mirror(&self, mirror: &Trace) -> Result<(), String> {
        if mirror.other != 0 {
            return Err(format!("the mirror carried {} frames that are not TCP", mirror.other));
        }
        let count = |ids: &mut dyn Iterator<Item = PacketId>| {
            let mut m: BTreeMap<PacketId, i64> = BTreeMap::new();
            ids.for_each(|id| *m.entry(id).or_default() += 1);
            m
        };
        let want = count(&mut self.packets.iter().copied());
        let got = count(&mut mirror.packets.iter().map(|p| p.id()));
        let keys: BTreeSet<&PacketId> = want.keys().chain(got.keys()).collect();
        let diff: Vec<String> = keys
            .into_iter()
            .filter_map(|id| {
                let (w, g) = (want.get(id).copied().unwrap_or(0), got.get(id).copied().unwrap_or(0));
                (w != g).then(|| format!("  expected {w}, mirrored {g}: {id}"))
            })
            .collect();
        if diff.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the mirror differs from the reference ({} expected, {} mirrored):\n{}\nexpected:\n{}",
            self.packets.len(),
            mirror.packets.len(),
            diff.join("\n"),
            self.packets.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"),
        ))
    }
}
