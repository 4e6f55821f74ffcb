//! The flows a rule marks and what the mirror must then carry of each, exactly once: its
//! datagrams or segments from the marking response on, the queries replayed ahead of their
//! answers; lookups through a search path.

use super::*;
use crate::oracles::oracle::CROSSING_NS;

/// A flow a rule marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggered {
    /// The client's socket.
    pub client: SocketAddr,
    /// The server as the client addressed it.
    pub server: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
    /// The exchange (an index into the exchanges given) whose response (or, unanswered,
    /// query) marks it.
    pub exchange: usize,
}

impl Triggered {
    /// Its flow.
    pub fn flow(&self) -> Flow {
        Flow { transport: self.transport, client: self.client, server: self.server }
    }
}

/// A datagram or segment as told apart across NAT.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Wire {
    /// A datagram: the client's socket, the direction, the message.
    Datagram { client: SocketAddr, response: bool, message: Vec<u8> },
    /// A segment: the client's socket, the direction, its numbers, flags and payload.
    Segment {
        client: SocketAddr,
        from_client: bool,
        seq: u32,
        ack: u32,
        flags: u8,
        len: u32,
        payload: Vec<u8>,
    },
}

impl Wire {
    /// A datagram from or to a DNS server; `None` when it is not a DNS message.
    fn of_datagram(d: &Datagram) -> Option<Wire> {
        let m = Message::parse(&d.payload)?;
        Some(Wire::Datagram {
            client: if m.response { d.dst } else { d.src },
            response: m.response,
            message: d.payload.clone(),
        })
    }

    /// A segment from or to a server's `port`; `None` when neither end has it.
    fn of_segment(p: &Packet, port: u16) -> Option<Wire> {
        let from_client = match (p.src.port() == port, p.dst.port() == port) {
            (false, true) => true,
            (true, false) => false,
            _ => return None,
        };
        Some(Wire::Segment {
            client: if from_client { p.src } else { p.dst },
            from_client,
            seq: p.seq,
            ack: p.ack,
            flags: p.flags,
            len: p.len,
            payload: p.payload.clone(),
        })
    }

    /// What `trace` holds at `i` of `transport`, as a wire.
    fn at(trace: &Trace, transport: Transport, i: usize, port: u16) -> Option<Wire> {
        match transport {
            Transport::Udp => Wire::of_datagram(&trace.datagrams[i]),
            Transport::Tcp => Wire::of_segment(&trace.packets[i], port),
        }
    }

    fn client(&self) -> SocketAddr {
        match self {
            Wire::Datagram { client, .. } | Wire::Segment { client, .. } => *client,
        }
    }

    /// Whether it carries data: a datagram, or a segment with a payload (not a bare ACK or FIN).
    fn carries_data(&self) -> bool {
        match self {
            Wire::Datagram { .. } => true,
            Wire::Segment { len, .. } => *len > 0,
        }
    }
}

/// A datagram or a segment, as a client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sent {
    Datagram(Datagram),
    Segment(Packet),
}

impl Sent {
    /// Whether `other` is the same datagram or segment: its ends, (numbers and flags) and
    /// payload; the time aside.
    fn same(&self, other: &Sent) -> bool {
        match (self, other) {
            (Sent::Datagram(a), Sent::Datagram(b)) => {
                (a.src, a.dst, &a.payload) == (b.src, b.dst, &b.payload)
            }
            (Sent::Segment(a), Sent::Segment(b)) => (a.id(), &a.payload) == (b.id(), &b.payload),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        let (src, dst, m) = match self {
            Sent::Datagram(d) => (d.src, d.dst, Message::parse(&d.payload)),
            Sent::Segment(p) => (p.src, p.dst, Message::in_segment(&p.payload)),
        };
        let what = m.map_or("no DNS message".to_string(), |m| format!("{} {} id {}", m.qname, m.qtype, m.id));
        format!("{src} > {dst} ({what})")
    }
}

/// A query the data path must replay: the query of an exchange of a marked flow, sent before its
/// mark and answered at or after it.
#[derive(Debug, Clone)]
struct Replay {
    /// The flow's trigger, an index into `triggered`.
    trigger: usize,
    /// The exchange, an index into the exchanges given.
    exchange: usize,
    /// The query as the client sent it.
    query: Sent,
    /// The query as copied, when it may have reached the classifier after the mark (another
    /// query than the marking one's, sent within [`CROSSING_NS`] of the mark): then copied
    /// once with its marked flow instead of replayed, it is on the mirror once all the same.
    late: Option<Wire>,
    /// Its answer, as copied.
    answer: Option<Wire>,
}

/// Where a flow is marked: the index of its first datagram or segment copied (in its transport's
/// list), when (ns, the capture's clock) and the exchange that marks it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: usize,
    ts_ns: u64,
    exchange: usize,
}

/// What the mirror must carry of the DNS exchanges of a capture.
#[derive(Debug, Clone)]
pub struct DnsExpected {
    /// The flows marked, in the order of their marks.
    pub triggered: Vec<Triggered>,
    /// The kind of trigger.
    kind: TriggerKind,
    /// The servers' port.
    port: u16,
    /// The replays the data path makes, in the order of their answers per flow.
    replays: Vec<Replay>,
    /// The copies, with how often each.
    copies: BTreeMap<Wire, usize>,
}

impl DnsExpected {
    /// The flows of `exchanges` (from `trace`, servers on `port`) marked by `dns=` rules that
    /// cover the responses `covers` says, each at the first such response, and what the mirror
    /// must carry of them: each query of the flow sent before that response and answered at or
    /// after it replayed (the triggering one, and another answered later on the same socket).
    pub fn new(
        trace: &Trace,
        exchanges: &[Exchange],
        port: u16,
        covers: impl Fn(&Exchange) -> bool,
    ) -> DnsExpected {
        let marks = exchanges.iter().enumerate().filter_map(|(i, e)| {
            let at = e.response.filter(|_| covers(e))?;
            Some(Mark { at, ts_ns: ts_of(trace, e.transport, at), exchange: i })
        });
        Self::from_marks(trace, exchanges, port, TriggerKind::Dns, marks, |_| true)
    }

    /// The flows of `exchanges` (from `trace`, servers on `port`) marked by a `noresponse>` rule
    /// of `wait`: at the first query not answered `wait` after it (the mark comes soon after:
    /// nothing of the flow may pass meanwhile), its datagrams from then on copied. That query is
    /// not replayed by the data path (the agent replays it, from the event), nor is any other
    /// that waited `wait` (the tick marks it too); another query sent before the mark and
    /// answered after it, in time, is.
    pub fn unanswered(
        trace: &Trace,
        exchanges: &[Exchange],
        port: u16,
        wait: std::time::Duration,
    ) -> DnsExpected {
        let wait = wait.as_nanos() as u64;
        let deadline = |e: &Exchange| ts_of(trace, e.transport, e.query) + wait;
        let in_time = |e: &Exchange| e.response.is_some_and(|r| ts_of(trace, e.transport, r) <= deadline(e));
        let marks = exchanges.iter().enumerate().filter(|(_, e)| !in_time(e)).map(|(i, e)| {
            let ts_ns = deadline(e);
            let n = count_of(trace, e.transport);
            let at = (0..n).find(|&j| ts_of(trace, e.transport, j) > ts_ns).unwrap_or(n);
            Mark { at, ts_ns, exchange: i }
        });
        Self::from_marks(trace, exchanges, port, TriggerKind::NoResponse, marks, in_time)
    }

    /// The flows marked by `marks`, each at its earliest, in the order of their marks; the
    /// datagrams or segments of each from its mark on; the queries of each sent before its mark
    /// and answered at or after it, those `replayed` says.
    fn from_marks(
        trace: &Trace,
        exchanges: &[Exchange],
        port: u16,
        kind: TriggerKind,
        marks: impl Iterator<Item = Mark>,
        replayed: impl Fn(&Exchange) -> bool,
    ) -> DnsExpected {
        let mut first: HashMap<Flow, Mark> = HashMap::new();
        for m in marks {
            let slot = first.entry(exchanges[m.exchange].flow()).or_insert(m);
            if m.at < slot.at {
                *slot = m;
            }
        }
        let mut marks: Vec<(Flow, Mark)> = first.into_iter().collect();
        marks.sort_by_key(|(_, m)| (m.ts_ns, m.exchange));
        let mut copies = BTreeMap::new();
        let mut replays = Vec::new();
        for (k, (flow, mark)) in marks.iter().enumerate() {
            for j in mark.at..count_of(trace, flow.transport) {
                let (src, dst) = match flow.transport {
                    Transport::Udp => (trace.datagrams[j].src, trace.datagrams[j].dst),
                    Transport::Tcp => (trace.packets[j].src, trace.packets[j].dst),
                };
                if let Some(w) = Wire::at(trace, flow.transport, j, port).filter(|_| flow.carries(src, dst)) {
                    *copies.entry(w).or_insert(0) += 1;
                }
            }
            let mut of_flow: Vec<(usize, usize)> = exchanges
                .iter()
                .enumerate()
                .filter(|(_, e)| e.flow() == *flow && e.query < mark.at && replayed(e))
                .filter_map(|(i, e)| Some((e.response.filter(|r| *r >= mark.at)?, i)))
                .collect();
            of_flow.sort_unstable();
            for (answer, i) in of_flow {
                let e = &exchanges[i];
                let query = match e.transport {
                    Transport::Udp => Sent::Datagram(trace.datagrams[e.query].clone()),
                    Transport::Tcp => Sent::Segment(trace.packets[e.query].clone()),
                };
                let sent = ts_of(trace, e.transport, e.query);
                let late = (i != mark.exchange && sent + CROSSING_NS >= mark.ts_ns)
                    .then(|| Wire::at(trace, e.transport, e.query, port))
                    .flatten();
                let answer = Wire::at(trace, e.transport, answer, port);
                replays.push(Replay { trigger: k, exchange: i, query, late, answer });
            }
        }
        let triggered = marks
            .into_iter()
            .map(|(f, m)| Triggered {
                client: f.client,
                server: f.server,
                transport: f.transport,
                exchange: m.exchange,
            })
            .collect();
        DnsExpected { triggered, kind, port, replays, copies }
    }

    /// How many copies the mirror must carry.
    pub fn copies(&self) -> usize {
        self.copies.values().sum()
    }

    /// How many replays it must carry.
    pub fn replays(&self) -> usize {
        self.replays.len()
    }

    /// Of the replays, how many are of the flows' second queries (not the one that marked).
    pub fn second_replays(&self) -> usize {
        self.replays.iter().filter(|r| r.exchange != self.triggered[r.trigger].exchange).count()
    }

    /// What differs between `mirror` and what it must carry, every difference; `Ok` when it
    /// holds exactly that: each copy as often as the client saw it; each query to replay
    /// replayed once, as the client sent it, ahead of its answer, the triggering one ahead of
    /// every copy of its flow that carries data; nothing else (no other replay, no other frame).
    /// A query that may have reached the classifier after its flow's mark (`Replay::late`) is
    /// right copied once instead of replayed: `Ok` holds how many were.
    pub fn compare_mirror(&self, mirror: &Trace) -> Result<usize, String> {
        let mut failures = Vec::new();
        if mirror.other != 0 {
            failures.push(format!("the mirror carried {} frames neither UDP nor TCP", mirror.other));
        }
        let datagrams: Vec<Option<Wire>> = mirror.datagrams.iter().map(Wire::of_datagram).collect();
        let segments: Vec<Option<Wire>> =
            mirror.packets.iter().map(|p| Wire::of_segment(p, self.port)).collect();
        let mut got: BTreeMap<Wire, usize> = BTreeMap::new();
        for (w, d) in datagrams.iter().zip(&mirror.datagrams) {
            match w {
                Some(w) => *got.entry(w.clone()).or_insert(0) += 1,
                None => failures.push(format!("a datagram that is not DNS: {} > {}", d.src, d.dst)),
            }
        }
        for (w, p) in segments.iter().zip(&mirror.packets) {
            match w {
                Some(w) => *got.entry(w.clone()).or_insert(0) += 1,
                None => failures.push(format!("a segment of no DNS server: {}", p.id())),
            }
        }
        for (w, n) in &self.copies {
            let seen = got.get(w).copied().unwrap_or(0);
            if seen != *n {
                failures.push(format!("{} copied {seen} times, {n} expected", describe(w)));
            }
        }
        let replayed: Vec<(Sent, usize, Transport)> = mirror
            .replayed_datagrams
            .iter()
            .map(|r| (Sent::Datagram(r.datagram.clone()), r.after_copies, Transport::Udp))
            .chain(
                mirror
                    .replayed
                    .iter()
                    .map(|r| (Sent::Segment(r.packet.clone()), r.after_copies, Transport::Tcp)),
            )
            .collect();
        let mut used = vec![false; replayed.len()];
        let mut late: BTreeSet<&Wire> = BTreeSet::new();
        for want in &self.replays {
            let t = &self.triggered[want.trigger];
            let Some(k) = (0..replayed.len()).find(|&k| !used[k] && replayed[k].0.same(&want.query)) else {
                let copied =
                    want.late.as_ref().filter(|w| !self.copies.contains_key(*w) && got.get(*w) == Some(&1));
                match copied {
                    Some(w) => {
                        late.insert(w);
                    }
                    None => failures.push(format!(
                        "{}: no replay of the query {}",
                        t.client,
                        want.query.describe()
                    )),
                }
                continue;
            };
            used[k] = true;
            let (_, after, transport) = &replayed[k];
            let copies = if *transport == Transport::Udp { &datagrams } else { &segments };
            let answer = copies.iter().position(|c| c.is_some() && *c == want.answer);
            if answer.is_some_and(|a| a < *after) {
                failures.push(format!(
                    "{}: the answer to {} came ahead of the query's replay",
                    t.client,
                    want.query.describe()
                ));
            }
            if want.exchange == t.exchange {
                let ahead = copies[..(*after).min(copies.len())]
                    .iter()
                    .flatten()
                    .filter(|c| c.client() == t.client && c.carries_data())
                    .count();
                if ahead > 0 {
                    failures.push(format!(
                        "{}: {ahead} copies carrying data came ahead of the replay of the query that marked it",
                        t.client
                    ));
                }
            }
        }
        for (s, _, _) in replayed.iter().zip(&used).filter(|(_, u)| !**u).map(|(r, _)| r) {
            failures.push(format!("a replay of {}, none expected", s.describe()));
        }
        for (w, n) in got.iter().filter(|(w, _)| !self.copies.contains_key(w) && !late.contains(w)) {
            failures.push(format!("{} copied {n} times, never expected", describe(w)));
        }
        if failures.is_empty() {
            Ok(late.len())
        } else {
            Err(failures.join("\n"))
        }
    }

    /// The trigger events scored against the triggers: an event is right when it is of the
    /// triggers' kind, names the triggering exchange's flow (its client socket under either
    /// tuple, its transport), its response code (0 for a query unanswered), id, name and type,
    /// and carries that query (kept for its replay); a second event of a flow is wrong. Returns
    /// how many triggers have their right event (precision: of the events; recall: of the
    /// triggers) and a line for each event that is wrong and each trigger without an event.
    pub fn score(&self, exchanges: &[Exchange], events: &[TriggerEvent]) -> (usize, Vec<String>) {
        let mut hit = vec![false; self.triggered.len()];
        let mut problems = Vec::new();
        for ev in events {
            let of = |t: &Triggered| names(ev, t.client) && ev.key.proto == t.transport.proto();
            let Some(i) = self.triggered.iter().position(of) else {
                problems.push(format!("an event of no trigger: {}", describe_event(ev)));
                continue;
            };
            let e = &exchanges[self.triggered[i].exchange];
            let status =
                if self.kind == TriggerKind::Dns { e.rcode.map(|r| u16::from(r.0)) } else { Some(0) };
            let want = (self.kind, status, Some(question(e)), Some(question(e)));
            let got = (ev.kind, Some(ev.status), event_question(ev), kept_question(ev));
            if got != want || hit[i] {
                let again = if hit[i] { "a second event" } else { "an event" };
                problems.push(format!("{again} of {}: {}, expected {want:?}", e.client, describe_event(ev)));
                continue;
            }
            hit[i] = true;
        }
        for (t, _) in self.triggered.iter().zip(&hit).filter(|(_, h)| !**h) {
            let e = &exchanges[t.exchange];
            problems.push(format!(
                "no event of {} {:?} ({} {} id {}, {:?})",
                t.client, t.transport, e.qname, e.qtype, e.id, e.rcode
            ));
        }
        (hit.iter().filter(|h| **h).count(), problems)
    }
}

/// One lookup through a search list (getaddrinfo with a resolv.conf's `search` and `ndots`),
/// as the client's capture has it: the exchanges of its candidates (the names it may ask,
/// `ResolvConf::candidates`), the candidates asked in order, and the sockets that asked them.
#[derive(Debug, Clone)]
pub struct SearchLookup<'a> {
    /// Its exchanges, in the order of their queries.
    pub exchanges: Vec<&'a Exchange>,
    /// The candidates asked, in the order first asked.
    pub tried: Vec<String>,
    /// The client sockets that asked them.
    pub sockets: BTreeSet<SocketAddr>,
}

impl<'a> SearchLookup<'a> {
    /// The lookup whose names are `candidates`, among `exchanges`.
    pub fn new(exchanges: &'a [Exchange], candidates: &[String]) -> SearchLookup<'a> {
        let exchanges: Vec<&Exchange> = exchanges.iter().filter(|e| candidates.contains(&e.qname)).collect();
        let mut tried: Vec<String> = Vec::new();
        for e in &exchanges {
            if !tried.contains(&e.qname) {
                tried.push(e.qname.clone());
            }
        }
        let sockets = exchanges.iter().map(|e| e.client).collect();
        SearchLookup { exchanges, tried, sockets }
    }

    /// Its responses with `rcode`.
    pub fn answered(&self, rcode: Rcode) -> usize {
        self.exchanges.iter().filter(|e| e.rcode == Some(rcode)).count()
    }

    /// Of `events`, those of its sockets.
    pub fn events<'e>(&self, events: &'e [TriggerEvent]) -> Vec<&'e TriggerEvent> {
        events.iter().filter(|ev| self.sockets.iter().any(|s| names(ev, *s))).collect()
    }
}

fn describe(w: &Wire) -> String {
    match w {
        Wire::Datagram { client, response, message } => {
            let what = if *response { "response to" } else { "query of" };
            match Message::parse(message) {
                Some(m) => format!("the {what} {client} ({} {} id {}, {})", m.qname, m.qtype, m.id, m.rcode),
                None => format!("a datagram of {client}"),
            }
        }
        Wire::Segment { client, from_client, seq, ack, flags, len, payload } => {
            let way = if *from_client { "from" } else { "to" };
            let m = Message::in_segment(payload)
                .map(|m| format!(" ({} {} id {}, {})", m.qname, m.qtype, m.id, m.rcode))
                .unwrap_or_default();
            format!("the segment {way} {client} flags {flags:#04x} seq {seq} ack {ack} len {len}{m}")
        }
    }
}
