//! What the mirror must carry, derived from a reference capture taken at an endpoint: for each
//! connection whose server sent a triggering response, the packet that completed its status
//! code and every later packet of the connection, both directions, each exactly once (for a
//! trigger that is not a response, a reset or a request left unanswered, from the packet the
//! caller names); nothing of any other connection. Responses are found by reading each
//! connection as HTTP/1.x with its framing ([`crate::oracles::http_stream`]): wherever one
//! begins in a segment, across segments, and never in a body.
//!
//! Ahead of a triggered flow's copies, the mirror carries the request the trigger answered
//! (a replay, [`check_replay`]): the segment that carried its first byte, in the form the
//! classifier saw it in.

use std::collections::{BTreeMap, BTreeSet};

use mirror_bpf::FlowKey;

use crate::capture::pcap::{Packet, PacketId, Replayed, Trace};
use crate::oracles::http_stream::{self, Conversation, ResponseSeen};

/// Precision: of the `triggered` flows, the share that were right (`correct`); 1 when none
/// triggered.
pub fn precision(correct: usize, triggered: usize) -> f64 {
    if triggered == 0 {
        1.0
    } else {
        correct as f64 / triggered as f64
    }
}

/// Recall: of the `relevant` flows (those the clients saw fail), the share that triggered
/// (`correct`); 1 when none failed.
pub fn recall(correct: usize, relevant: usize) -> f64 {
    if relevant == 0 {
        1.0
    } else {
        correct as f64 / relevant as f64
    }
}

/// One row of a table of the classifier's accuracy over a set of connections: how many there
/// were, how many should have triggered (`relevant`: the clients saw them fail), how many
/// triggered and how many of those rightly, and their packets on the mirror against what the
/// oracle expects. `counts` are the test's own columns, shown after `connections` with
/// `relevant` among them (see [`Row::line`]).
#[derive(Debug, Clone, Copy)]
pub struct Row<const N: usize> {
    pub connections: usize,
    pub counts: [usize; N],
    pub relevant: usize,
    pub triggered: usize,
    pub correct: usize,
    pub mirrored: usize,
    pub expected_mirrored: u64,
}

impl<const N: usize> Default for Row<N> {
    fn default() -> Self {
        Row {
            connections: 0,
            counts: [0; N],
            relevant: 0,
            triggered: 0,
            correct: 0,
            mirrored: 0,
            expected_mirrored: 0,
        }
    }
}

impl<const N: usize> Row<N> {
    pub fn precision(&self) -> f64 {
        precision(self.correct, self.triggered)
    }

    pub fn recall(&self) -> f64 {
        recall(self.correct, self.relevant)
    }

    /// Adds `o`'s counts to this row's (a total).
    pub fn add(&mut self, o: &Row<N>) {
        self.connections += o.connections;
        for (c, oc) in self.counts.iter_mut().zip(o.counts) {
            *c += oc;
        }
        self.relevant += o.relevant;
        self.triggered += o.triggered;
        self.correct += o.correct;
        self.mirrored += o.mirrored;
        self.expected_mirrored += o.expected_mirrored;
    }

    /// The row as a line of a Markdown table: `name`, connections, the counts with `relevant`
    /// shown before the count at `relevant_at` (after them all when it is `N`), triggered,
    /// precision, recall, mirrored / expected packets.
    pub fn line(&self, name: &str, relevant_at: usize) -> String {
        let mut cells = vec![name.to_string(), self.connections.to_string()];
        cells.extend(self.counts[..relevant_at].iter().map(usize::to_string));
        cells.push(self.relevant.to_string());
        cells.extend(self.counts[relevant_at..].iter().map(usize::to_string));
        cells.push(self.triggered.to_string());
        cells.push(format!("{:.3}", self.precision()));
        cells.push(format!("{:.3}", self.recall()));
        cells.push(format!("{} / {}", self.mirrored, self.expected_mirrored));
        format!("| {} |", cells.join(" | "))
    }
}

/// A connection that must be mirrored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggeredFlow {
    /// The connection.
    pub flow: FlowKey,
    /// The status that triggered it.
    pub status: u16,
    /// Its packets from the trigger on, but for those that may have crossed it.
    pub packets: u64,
    /// Its packets that may have crossed the trigger (see [`CROSSING_NS`]): on the mirror or
    /// not, each at most once, and counted by the mark when they are.
    pub crossing: u64,
    /// Method of the request the triggering response answers, when seen.
    pub method: Option<String>,
    /// Its target.
    pub target: Option<String>,
}

/// How far from a trigger, as the capture on the client's side saw it, a packet of its flow
/// may have been handled by the classifier at the same time on another CPU. Such a packet passed
/// the classifier before the mark or after it, whatever its place in that capture:
/// - a packet of the client sent shortly before the trigger reached it crossed the trigger on
///   its way (an ACK, a pipelined request, an HTTP/2 frame): the data path rightly copies it
///   when it passed after the mark, and rightly not when before;
/// - a packet the server sent after the trigger may reach the client before it (TCP sends from
///   two CPUs at once: the writer's and an ACK's; each CPU's queue is drained on its own), and
///   one it sent before the trigger (its ACK of the request) may reach the client after it;
/// - a copy made on another CPU after the mark may reach a reader of the mirror ahead of the
///   replay, which waits in the trigger's CPU's queue.
///
/// The capture cannot tell which, so the tests accept either within this much time.
pub const CROSSING_NS: u64 = 10_000_000;

/// Whether packet `i` of `reference` may have crossed the trigger, packet `at` (see
/// [`CROSSING_NS`]): of the same flow, captured at most that long from it, and either captured
/// before it and the other side's or sent after the trigger (its sequence number past the
/// trigger's), or captured after it and sent before by the trigger's side (ending where the
/// trigger starts or before: a pure ACK sent ahead of the trigger carries its very sequence
/// number).
pub fn crossed(reference: &Trace, i: usize, at: usize) -> bool {
    let (p, trigger) = (&reference.packets[i], &reference.packets[at]);
    let past = |seq: u32| (seq.wrapping_sub(trigger.seq) as i32) > 0;
    let near = p.flow() == trigger.flow() && p.ts_ns.abs_diff(trigger.ts_ns) <= CROSSING_NS;
    let sent_after = p.src == trigger.src && past(p.seq);
    let sent_before = p.src == trigger.src && !past(p.seq.wrapping_add(p.len));
    near && ((i < at && (p.src == trigger.dst || sent_after)) || (i > at && sent_before))
}

/// The packets of `reference` that may have crossed the trigger, packet `at`.
pub fn crossing(reference: &Trace, at: usize) -> Vec<PacketId> {
    let all = 0..reference.packets.len();
    all.filter(|i| crossed(reference, *i, at)).map(|i| reference.packets[i].id()).collect()
}

/// The packets of the trigger's flow (the trigger, packet `at` of `reference`, left out) that
/// may reach a reader of the mirror ahead of its replay: those captured within [`CROSSING_NS`]
/// of it, before or after.
pub fn near(reference: &Trace, at: usize) -> Vec<PacketId> {
    let trigger = &reference.packets[at];
    let id = trigger.id();
    let close = |p: &&Packet| {
        p.flow() == trigger.flow() && p.ts_ns.abs_diff(trigger.ts_ns) <= CROSSING_NS && p.id() != id
    };
    reference.packets.iter().filter(close).map(|p| p.id()).collect()
}

impl TriggeredFlow {
    /// Whether a mark that charged `n` packets agrees: every packet from the trigger on, and
    /// any of those that crossed it.
    pub fn admits(&self, n: u64) -> bool {
        (self.packets..=self.packets + self.crossing).contains(&n)
    }
}

/// The expected mirror of a reference capture.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// Connections that must be mirrored, in trigger order.
    pub triggered: Vec<TriggeredFlow>,
    /// The packets the mirror must carry, in reference order.
    pub packets: Vec<PacketId>,
    /// The packets the mirror may carry, once each: those that crossed a trigger.
    pub crossing: Vec<PacketId>,
    /// Every connection of the reference capture.
    pub flows: BTreeSet<FlowKey>,
}

impl Expected {
    /// Computes it; `trigger(status, server_port)` says whether a response triggers.
    pub fn from_reference(reference: &Trace, trigger: impl Fn(u16, u16) -> bool) -> Expected {
        Expected::from_responses(reference, |c, r| trigger(r.status, c.server.port()))
    }

    /// Computes it when what triggers is a response and the request it answers:
    /// `trigger(conversation, response)` says whether it does (`c.request_of(r)` is the
    /// request; filters on it, latency from its packet's time).
    pub fn from_responses(
        reference: &Trace,
        trigger: impl Fn(&Conversation, &ResponseSeen) -> bool,
    ) -> Expected {
        // Per flow, the first triggering response: the index of the packet completing its code.
        let mut first: BTreeMap<FlowKey, (usize, TriggeredFlow)> = BTreeMap::new();
        for c in http_stream::conversations(reference) {
            for r in c.responses.iter().filter(|r| trigger(&c, r)) {
                if first.get(&c.flow).is_some_and(|(at, _)| *at <= r.packet) {
                    continue;
                }
                let request = c.request_of(r);
                let t = TriggeredFlow {
                    flow: c.flow,
                    status: r.status,
                    packets: 0,
                    crossing: 0,
                    method: request.map(|q| q.method.clone()),
                    target: request.map(|q| q.target.clone()),
                };
                first.insert(c.flow, (r.packet, t));
            }
        }
        Expected::from_first(reference, first)
    }

    /// Computes it when what triggers is not a response (a reset, a request left unanswered):
    /// `first(conversation, packets)`, given the indices in the trace of the connection's
    /// packets, gives the index of the first one the mirror must carry (`None`: the
    /// connection must not be mirrored). Its status is 0, its request the one `first` names
    /// (an index in `c.requests`), if any.
    pub fn from_packets(
        reference: &Trace,
        first: impl Fn(&Conversation, &[usize]) -> Option<(usize, Option<usize>)>,
    ) -> Expected {
        let mut packets: BTreeMap<FlowKey, Vec<usize>> = BTreeMap::new();
        for (i, p) in reference.packets.iter().enumerate() {
            packets.entry(p.flow()).or_default().push(i);
        }
        let mut at = BTreeMap::new();
        for c in http_stream::conversations(reference) {
            let Some((i, request)) = first(&c, &packets[&c.flow]) else { continue };
            let request = request.map(|q| &c.requests[q]);
            let t = TriggeredFlow {
                flow: c.flow,
                status: 0,
                packets: 0,
                crossing: 0,
                method: request.map(|q| q.method.clone()),
                target: request.map(|q| q.target.clone()),
            };
            at.insert(c.flow, (i, t));
        }
        Expected::from_first(reference, at)
    }

    /// The expected mirror given, per triggered flow, the index of its first packet to mirror
    /// (what the flow's trigger says in `packets`, which this counts), and the packets that may
    /// have crossed it (`crossing`, see [`crossed`]).
    pub fn from_first(reference: &Trace, first: BTreeMap<FlowKey, (usize, TriggeredFlow)>) -> Expected {
        let mut e = Expected::default();
        let mut order: Vec<(usize, TriggeredFlow)> = first.into_values().collect();
        order.sort_by_key(|(at, _)| *at);
        let index: BTreeMap<FlowKey, (usize, usize)> =
            order.iter().enumerate().map(|(i, (at, t))| (t.flow, (*at, i))).collect();
        e.triggered = order.into_iter().map(|(_, t)| t).collect();
        for (i, p) in reference.packets.iter().enumerate() {
            let flow = p.flow();
            e.flows.insert(flow);
            if let Some(&(at, t)) = index.get(&flow) {
                if crossed(reference, i, at) {
                    e.triggered[t].crossing += 1;
                    e.crossing.push(p.id());
                } else if i >= at {
                    e.triggered[t].packets += 1;
                    e.packets.push(p.id());
                }
            }
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
    /// each as often as the reference, and of the packets that crossed a trigger, any.
    pub fn compare_mirror(&self, mirror: &Trace) -> Result<(), String> {
        let not_tcp = mirror.other + mirror.datagrams.len() + mirror.replayed_datagrams.len();
        if not_tcp != 0 {
            return Err(format!("the mirror carried {not_tcp} frames that are not TCP"));
        }
        let count = |ids: &mut dyn Iterator<Item = PacketId>| {
            let mut m: BTreeMap<PacketId, i64> = BTreeMap::new();
            ids.for_each(|id| *m.entry(id).or_default() += 1);
            m
        };
        let want = count(&mut self.packets.iter().copied());
        let may = count(&mut self.crossing.iter().copied());
        let got = count(&mut mirror.packets.iter().map(|p| p.id()));
        let keys: BTreeSet<&PacketId> = want.keys().chain(got.keys()).collect();
        let diff: Vec<String> = keys
            .into_iter()
            .filter_map(|id| {
                let of = |m: &BTreeMap<PacketId, i64>| m.get(id).copied().unwrap_or(0);
                let (w, m, g) = (of(&want), of(&may), of(&got));
                let shown = if m > 0 {
                    format!("{w} (or up to {} as it crossed the trigger)", w + m)
                } else {
                    w.to_string()
                };
                (g < w || g > w + m).then(|| format!("  expected {shown}, mirrored {g}: {id}"))
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

/// The request a flow's trigger answered, as the mirror must replay it ahead of the flow's
/// copies.
#[derive(Debug, Clone, Copy)]
pub struct WantedReplay<'a> {
    /// The flow's tuples on the mirror (both sides of a translated connection).
    pub keys: &'a [FlowKey],
    /// The segment that carried the request's first byte, captured where the classifier saw it.
    pub segment: &'a Packet,
    /// The start of the request's line: method and target, e.g. `GET /bar `.
    pub line: &'a str,
    /// The packets that may reach a reader ahead of the replay ([`near`]; others' are left
    /// out); else only a client's ACK may.
    pub near: &'a [PacketId],
}

/// The replay of `want` on `mirror`: the flow's only one, the request's segment (its addresses,
/// ports, sequence and acknowledgment numbers and flags; its payload the segment's, up to what
/// was kept, holding the request's line; its IP length what it carries), ahead of every copy
/// of the flow that carries data, but those near the trigger. Why not, otherwise.
pub fn check_replay<'m>(mirror: &'m Trace, want: &WantedReplay) -> Result<&'m Replayed, String> {
    let of_flow = |p: &Packet| want.keys.contains(&p.flow());
    let replays: Vec<&Replayed> = mirror.replayed.iter().filter(|r| of_flow(&r.packet)).collect();
    let [r] = replays.as_slice() else {
        let ids: Vec<String> = replays.iter().map(|r| format!("  {}", r.packet.id())).collect();
        return Err(format!(
            "{} replays of {:?}, one expected:\n{}",
            replays.len(),
            want.keys,
            ids.join("\n")
        ));
    };
    let (p, s) = (&r.packet, want.segment);
    let mut wrong = Vec::new();
    if (p.src, p.dst, p.seq, p.ack, p.flags) != (s.src, s.dst, s.seq, s.ack, s.flags) {
        wrong.push(format!("it is {}, the request's segment {}", p.id(), s.id()));
    }
    if !s.payload.starts_with(&p.payload) {
        wrong.push("its payload is not the start of the segment's".to_string());
    }
    if !p.payload.windows(want.line.len()).any(|w| w == want.line.as_bytes()) {
        wrong.push(format!("it does not hold {:?}", want.line));
    }
    if p.len as usize != p.payload.len() {
        wrong.push(format!("its IP header says {} bytes, it carries {}", p.len, p.payload.len()));
    }
    // A packet handled on another CPU as the trigger was, after the mark, may reach a reader
    // through its own CPU's queue first: a client's ACK, or a packet near the trigger (see
    // CROSSING_NS). No other may, nor the trigger's own copy.
    let before: Vec<String> = mirror.packets[..r.after_copies]
        .iter()
        .filter(|c| of_flow(c) && c.len > 0 && !want.near.contains(&c.id()))
        .map(|c| c.id().to_string())
        .collect();
    if !before.is_empty() {
        wrong.push(format!("copies of the flow carrying data came before it: {}", before.join(", ")));
    }
    if wrong.is_empty() {
        return Ok(r);
    }
    Err(format!(
        "replay of {:?} ({:?}): {}; it carried {:?}",
        want.keys,
        want.line,
        wrong.join("; "),
        String::from_utf8_lossy(&p.payload)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    const MS: u64 = 1_000_000;

    /// A packet of the client (port 40000) or the server (port 80), at `ms` ms.
    fn packet(from_server: bool, seq: u32, len: u32, ms: u64) -> Packet {
        let (c, s): (SocketAddr, SocketAddr) =
            ("198.18.1.3:40000".parse().unwrap(), "198.18.1.2:80".parse().unwrap());
        let (src, dst) = if from_server { (s, c) } else { (c, s) };
        Packet { ts_ns: ms * MS, src, dst, seq, ack: 0, flags: 0x18, len, payload: vec![b'x'; len as usize] }
    }

    fn mirror(of: &[&Packet]) -> Trace {
        Trace { packets: of.iter().map(|p| (*p).clone()).collect(), ..Trace::default() }
    }

    /// The expected mirror of `reference` when its packet `at` is a 500 that triggers.
    fn expected(reference: &Trace, at: usize) -> Expected {
        let flow = reference.packets[at].flow();
        let t = TriggeredFlow { flow, status: 500, packets: 0, crossing: 0, method: None, target: None };
        Expected::from_first(reference, BTreeMap::from([(flow, (at, t))]))
    }

    #[test]
    fn only_packets_that_crossed_the_trigger_may_be_copied_or_not() {
        let early = packet(false, 1, 10, 0); // the request
        let answer = packet(true, 1, 20, 1); // the server's, long before
        let before = packet(false, 11, 5, 80); // the client's, 20 ms before
        let crossed = packet(false, 16, 5, 95); // the client's, 5 ms before
        let trigger = packet(true, 21, 30, 100);
        let after = packet(false, 21, 0, 101);
        let reference = mirror(&[&early, &answer, &before, &crossed, &trigger, &after]);
        let e = expected(&reference, 4);
        assert_eq!(e.packets, vec![trigger.id(), after.id()]);
        assert_eq!(e.crossing, vec![crossed.id()]);
        let t = &e.triggered[0];
        assert_eq!((t.packets, t.crossing), (2, 1));
        assert!(t.admits(2) && t.admits(3) && !t.admits(1) && !t.admits(4));
        // The crossed packet, copied or not, once at most; nothing earlier; nothing missing.
        assert!(e.compare_mirror(&mirror(&[&trigger, &after])).is_ok());
        assert!(e.compare_mirror(&mirror(&[&crossed, &trigger, &after])).is_ok());
        assert!(e.compare_mirror(&mirror(&[&crossed, &crossed, &trigger, &after])).is_err());
        assert!(e.compare_mirror(&mirror(&[&before, &trigger, &after])).is_err());
        assert!(e.compare_mirror(&mirror(&[&answer, &trigger, &after])).is_err());
        assert!(e.compare_mirror(&mirror(&[&crossed, &trigger])).is_err());
        assert_eq!(crossing(&reference, 4), e.crossing);
    }

    #[test]
    fn a_packet_sent_after_the_trigger_that_came_first_may_have_crossed_it() {
        let trigger = packet(true, 100, 40, 100);
        let overtook = packet(true, 140, 40, 99); // sent after it, came 1 ms before
        let earlier = packet(true, 60, 40, 99); // sent before it
        let reference = mirror(&[&earlier, &overtook, &trigger]);
        assert_eq!(crossing(&reference, 2), vec![overtook.id()]);
    }

    #[test]
    fn a_packet_sent_before_the_trigger_that_came_after_may_have_crossed_it() {
        let trigger = packet(true, 100, 40, 100);
        let ack = packet(true, 100, 0, 101); // the server's ACK sent before it, came 1 ms after
        let earlier = packet(true, 60, 40, 101); // a segment sent before it, came after
        let next = packet(true, 140, 40, 101); // sent after it
        let client = packet(false, 1, 0, 101); // the client's ACK of the trigger
        let reference = mirror(&[&trigger, &ack, &earlier, &next, &client]);
        assert_eq!(crossing(&reference, 0), vec![ack.id(), earlier.id()]);
        let e = expected(&reference, 0);
        assert_eq!(e.packets, vec![trigger.id(), next.id(), client.id()]);
        assert!(e.compare_mirror(&mirror(&[&trigger, &next, &client])).is_ok());
        assert!(e.compare_mirror(&mirror(&[&trigger, &ack, &earlier, &next, &client])).is_ok());
        assert!(e.compare_mirror(&mirror(&[&trigger, &ack, &ack, &next, &client])).is_err());
        assert!(e.compare_mirror(&mirror(&[&trigger, &ack, &client])).is_err());
        // 50 ms after, the same ACK would have to be copied.
        let late = Packet { ts_ns: 150 * MS, ..ack.clone() };
        assert!(crossing(&mirror(&[&trigger, &late]), 0).is_empty());
    }

    #[test]
    fn only_copies_near_the_trigger_may_reach_a_reader_ahead_of_the_replay() {
        let request = packet(false, 1, 30, 0);
        let before = packet(false, 31, 30, 50); // another request, 50 ms before
        let crossed = packet(false, 61, 30, 99); // another, 1 ms before
        let trigger = packet(true, 1, 40, 100);
        let soon = packet(true, 41, 40, 102); // the next answer, 2 ms after
        let late = packet(true, 81, 40, 150); // one 50 ms after
        let reference = mirror(&[&request, &before, &crossed, &trigger, &soon, &late]);
        let ahead = |copy: &Packet| Trace {
            packets: vec![copy.clone(), trigger.clone()],
            replayed: vec![Replayed { after_copies: 1, packet: request.clone() }],
            ..Trace::default()
        };
        let near = near(&reference, 3);
        assert_eq!(near, vec![crossed.id(), soon.id()]);
        let want = WantedReplay { keys: &[trigger.flow()], segment: &request, line: "xxx", near: &near };
        assert!(check_replay(&ahead(&crossed), &want).is_ok());
        assert!(check_replay(&ahead(&soon), &want).is_ok());
        assert!(check_replay(&ahead(&before), &want).is_err());
        assert!(check_replay(&ahead(&late), &want).is_err());
        assert!(check_replay(&ahead(&trigger), &want).is_err());
    }
}
