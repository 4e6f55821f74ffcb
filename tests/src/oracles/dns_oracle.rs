//! What the mirror must carry of DNS over UDP, read from a capture at the client: each query
//! with its response (an exchange: one client socket, one id, one question); the client sockets
//! (5-tuples) a rule marks, each at the first response of it the rule covers; and what the
//! mirror then carries of each, exactly once: the query of that response, replayed ahead of
//! every copy of its socket, then every datagram of the socket from that response on. Nothing
//! of the sockets no rule marks, and no TCP.
//!
//! Copies are told apart by what NAT does not change: the client's address and port, the
//! direction and the DNS message itself. A query is copied where the classifier first sees it
//! (sent to the ClusterIP, on a path through a Service) and a response where it sees it (from
//! the resolver pod); the replay is the query as the client sent it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use mirror_bpf::{TriggerEvent, TriggerKind};

use crate::capture::pcap::{self, Datagram, Trace};
use crate::workload::dns::{QType, Rcode};

/// The header and question of a DNS message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its id.
    pub id: u16,
    /// A response (else a query).
    pub response: bool,
    /// Its response code (0 in a query).
    pub rcode: Rcode,
    /// The question's name, lower case, without the final dot.
    pub qname: String,
    /// The question's type.
    pub qtype: QType,
}

impl Message {
    /// Reads a message with one question; `None` for anything else.
    pub fn parse(m: &[u8]) -> Option<Message> {
        if m.len() < 12 || u16::from_be_bytes([m[4], m[5]]) != 1 {
            return None;
        }
        let mut labels = Vec::new();
        let mut at = 12;
        loop {
            let n = usize::from(*m.get(at)?);
            if n == 0 {
                at += 1;
                break;
            }
            if n & 0xC0 != 0 {
                return None;
            }
            labels.push(String::from_utf8_lossy(m.get(at + 1..at + 1 + n)?).to_ascii_lowercase());
            at += 1 + n;
        }
        Some(Message {
            id: u16::from_be_bytes([m[0], m[1]]),
            response: m[2] & 0x80 != 0,
            rcode: Rcode(m[3] & 0x0f),
            qname: labels.join("."),
            qtype: QType(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?])),
        })
    }
}

/// A query and its response, as the client's capture has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The client's socket.
    pub client: SocketAddr,
    /// The server, as the client addressed it (a ClusterIP through a Service).
    pub server: SocketAddr,
    /// The query's id.
    pub id: u16,
    /// The question's name, lower case.
    pub qname: String,
    /// The question's type.
    pub qtype: QType,
    /// The query: its index in the trace's datagrams.
    pub query: usize,
    /// Its response's index, if one came.
    pub response: Option<usize>,
    /// The response's code.
    pub rcode: Option<Rcode>,
}

impl Exchange {
    /// From the query to its response, ns, as the capture saw them.
    pub fn took_ns(&self, trace: &Trace) -> Option<u64> {
        let d = &trace.datagrams;
        self.response.map(|r| d[r].ts_ns - d[self.query].ts_ns)
    }
}

/// The exchanges of `trace` with servers on `port`, in the order of their queries: each
/// response paired with the earliest unanswered query of its socket with the same id and
/// question.
pub fn exchanges(trace: &Trace, port: u16) -> Vec<Exchange> {
    let mut found: Vec<Exchange> = Vec::new();
    for (i, d) in trace.datagrams.iter().enumerate() {
        let Some(m) = Message::parse(&d.payload) else { continue };
        if !m.response && d.dst.port() == port {
            found.push(Exchange {
                client: d.src,
                server: d.dst,
                id: m.id,
                qname: m.qname,
                qtype: m.qtype,
                query: i,
                response: None,
                rcode: None,
            });
        } else if m.response && d.src.port() == port {
            let pending = found.iter_mut().find(|e| {
                e.response.is_none()
                    && (e.client, e.server, e.id, e.qtype) == (d.dst, d.src, m.id, m.qtype)
                    && e.qname == m.qname
            });
            if let Some(e) = pending {
                e.response = Some(i);
                e.rcode = Some(m.rcode);
            }
        }
    }
    found
}

/// A client socket a rule marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggered {
    /// The client's socket.
    pub client: SocketAddr,
    /// The server as the client addressed it.
    pub server: SocketAddr,
    /// The exchange (an index into the exchanges given) whose response marks it.
    pub exchange: usize,
}

/// A datagram as told apart across NAT: the client's socket, the direction, the message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Wire {
    client: SocketAddr,
    response: bool,
    message: Vec<u8>,
}

impl Wire {
    /// A datagram from or to a DNS server; `None` when it is not a DNS message.
    fn of(d: &Datagram) -> Option<Wire> {
        let m = Message::parse(&d.payload)?;
        Some(Wire {
            client: if m.response { d.dst } else { d.src },
            response: m.response,
            message: d.payload.clone(),
        })
    }
}

/// What the mirror must carry of the DNS exchanges of a capture.
#[derive(Debug, Clone)]
pub struct DnsExpected {
    /// The sockets marked, in the order of their triggers.
    pub triggered: Vec<Triggered>,
    /// The kind of trigger.
    kind: TriggerKind,
    /// The replays the data path makes: the query of each trigger, as the client sent it (its
    /// datagram); none for a mark without a packet.
    replays: Vec<Datagram>,
    /// The copies, with how often each.
    copies: BTreeMap<Wire, usize>,
}

impl DnsExpected {
    /// The sockets of `exchanges` (from `trace`) marked by `dns=` rules that cover the
    /// responses `covers` says, and what the mirror must carry of them.
    pub fn new(trace: &Trace, exchanges: &[Exchange], covers: impl Fn(&Exchange) -> bool) -> DnsExpected {
        let marks =
            exchanges.iter().enumerate().filter_map(|(i, e)| Some((e.response.filter(|_| covers(e))?, i)));
        let (triggered, copies) = Self::from_marks(trace, exchanges, marks);
        let replays =
            triggered.iter().map(|t| trace.datagrams[exchanges[t.exchange].query].clone()).collect();
        DnsExpected { triggered, kind: TriggerKind::Dns, replays, copies }
    }

    /// The sockets of `exchanges` (from `trace`) marked by a `noresponse>` rule of `wait`: at
    /// the first query not answered `wait` after it (the mark comes soon after: nothing of the
    /// socket may pass meanwhile), its datagrams from then on copied, no replay by the data
    /// path (the agent makes it, from the event).
    pub fn unanswered(trace: &Trace, exchanges: &[Exchange], wait: std::time::Duration) -> DnsExpected {
        let ts = |i: usize| trace.datagrams[i].ts_ns;
        let marks = exchanges.iter().enumerate().filter_map(|(i, e)| {
            let deadline = ts(e.query) + wait.as_nanos() as u64;
            if e.response.is_some_and(|r| ts(r) <= deadline) {
                return None;
            }
            let at = trace.datagrams.iter().position(|d| d.ts_ns > deadline).unwrap_or(trace.datagrams.len());
            Some((at, i))
        });
        let (triggered, copies) = Self::from_marks(trace, exchanges, marks);
        DnsExpected { triggered, kind: TriggerKind::NoResponse, replays: Vec::new(), copies }
    }

    /// The sockets marked by `marks` (the index of the first datagram copied, the exchange
    /// that marks), each at its earliest, in the order of their marks, and the datagrams of
    /// each socket from its mark on.
    fn from_marks(
        trace: &Trace,
        exchanges: &[Exchange],
        marks: impl Iterator<Item = (usize, usize)>,
    ) -> (Vec<Triggered>, BTreeMap<Wire, usize>) {
        let mut first: HashMap<(SocketAddr, SocketAddr), (usize, usize)> = HashMap::new();
        for (at, i) in marks {
            let e = &exchanges[i];
            let slot = first.entry((e.client, e.server)).or_insert((at, i));
            if at < slot.0 {
                *slot = (at, i);
            }
        }
        let mut marks: Vec<(usize, Triggered)> = first
            .into_iter()
            .map(|((client, server), (at, exchange))| (at, Triggered { client, server, exchange }))
            .collect();
        marks.sort_by_key(|(at, t)| (*at, t.exchange));
        let mut copies = BTreeMap::new();
        for (at, t) in &marks {
            for d in &trace.datagrams[*at..] {
                let of_socket =
                    (d.src, d.dst) == (t.client, t.server) || (d.src, d.dst) == (t.server, t.client);
                if let Some(w) = Wire::of(d).filter(|_| of_socket) {
                    *copies.entry(w).or_insert(0) += 1;
                }
            }
        }
        (marks.into_iter().map(|(_, t)| t).collect(), copies)
    }

    /// How many copies the mirror must carry.
    pub fn copies(&self) -> usize {
        self.copies.values().sum()
    }

    /// How many replays it must carry.
    pub fn replays(&self) -> usize {
        self.replays.len()
    }

    /// What differs between `mirror` and what it must carry, every difference; `Ok` when it
    /// holds exactly that: each copy as often as the client saw it, each `dns=` trigger's query
    /// replayed once, as the client sent it, ahead of every copy of its socket, and nothing
    /// else (no other replay, no TCP, no other frame).
    pub fn compare_mirror(&self, mirror: &Trace) -> Result<(), String> {
        let mut failures = Vec::new();
        if !mirror.packets.is_empty() || mirror.other != 0 {
            failures.push(format!(
                "the mirror carried {} TCP segments and {} other frames",
                mirror.packets.len(),
                mirror.other
            ));
        }
        let mut got: BTreeMap<Wire, usize> = BTreeMap::new();
        for d in &mirror.datagrams {
            match Wire::of(d) {
                Some(w) => *got.entry(w).or_insert(0) += 1,
                None => failures.push(format!("a datagram that is not DNS: {} > {}", d.src, d.dst)),
            }
        }
        for (w, n) in &self.copies {
            let seen = got.get(w).copied().unwrap_or(0);
            if seen != *n {
                failures.push(format!("{} copied {seen} times, {n} expected", describe(w)));
            }
        }
        for (w, n) in got.iter().filter(|(w, _)| !self.copies.contains_key(w)) {
            failures.push(format!("{} copied {n} times, never expected", describe(w)));
        }
        for (t, want) in self.triggered.iter().zip(&self.replays) {
            let of_socket: Vec<_> =
                mirror.replayed_datagrams.iter().filter(|r| r.datagram.src == t.client).collect();
            let [r] = of_socket.as_slice() else {
                failures.push(format!("{}: {} replays, one expected", t.client, of_socket.len()));
                continue;
            };
            let d = &r.datagram;
            if (d.src, d.dst, &d.payload) != (want.src, want.dst, &want.payload) {
                failures.push(format!(
                    "{}: the replay {} > {} is not the query {} > {} as the client sent it",
                    t.client, d.src, d.dst, want.src, want.dst
                ));
            }
            let first_copy =
                mirror.datagrams.iter().position(|c| Wire::of(c).is_some_and(|w| w.client == t.client));
            if first_copy.is_some_and(|c| c < r.after_copies) {
                failures.push(format!("{}: a copy came ahead of the replay", t.client));
            }
        }
        let strays = mirror
            .replayed_datagrams
            .iter()
            .filter(|r| !self.replays.iter().any(|q| q.src == r.datagram.src));
        for r in strays {
            failures.push(format!("a replay of {} > {}, none expected", r.datagram.src, r.datagram.dst));
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n"))
        }
    }

    /// The trigger events scored against the triggers: an event is right when it is of the
    /// triggers' kind, names the triggering exchange's client socket (under either tuple), its
    /// response code (0 for a query unanswered), id, name and type, and carries that query
    /// (kept for its replay); a second event of a socket is wrong. Returns how many triggers
    /// have their right event (precision: of the events; recall: of the triggers) and a line
    /// for each event that is wrong and each trigger without an event.
    pub fn score(&self, exchanges: &[Exchange], events: &[TriggerEvent]) -> (usize, Vec<String>) {
        let mut hit = vec![false; self.triggered.len()];
        let mut problems = Vec::new();
        for ev in events {
            let Some(i) = self.triggered.iter().position(|t| names(ev, t.client)) else {
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
                "no event of {} ({} {} id {}, {:?})",
                t.client, e.qname, e.qtype, e.id, e.rcode
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
    pub fn events(&self, events: &[TriggerEvent]) -> usize {
        events.iter().filter(|ev| self.sockets.iter().any(|s| names(ev, *s))).count()
    }
}

/// The responses on `mirror` whose query it carries neither copied nor replayed (by client
/// socket, id and question): a second query of a socket, sent before the first response marked
/// it, is neither, while its answer is copied as the socket's.
pub fn answers_without_query(mirror: &Trace) -> usize {
    let queries: BTreeSet<(SocketAddr, u16, String, QType)> = mirror
        .datagrams
        .iter()
        .chain(mirror.replayed_datagrams.iter().map(|r| &r.datagram))
        .filter_map(|d| {
            Message::parse(&d.payload).filter(|m| !m.response).map(|m| (d.src, m.id, m.qname, m.qtype))
        })
        .collect();
    let answers = mirror.datagrams.iter().filter_map(|d| {
        Message::parse(&d.payload).filter(|m| m.response).map(|m| (d.dst, m.id, m.qname, m.qtype))
    });
    answers.filter(|a| !queries.contains(a)).count()
}

/// Whether `ev` is of the socket `client`, under either of its tuples.
pub fn names(ev: &TriggerEvent, client: SocketAddr) -> bool {
    [Some(ev.key), ev.nat].into_iter().flatten().any(|k| k.lo == client || k.hi == client)
}

/// The question an exchange or an event names: id, name, type.
pub type Question = (u16, String, QType);

fn question(e: &Exchange) -> Question {
    (e.id, e.qname.clone(), e.qtype)
}

/// The question a DNS trigger event names.
pub fn event_question(ev: &TriggerEvent) -> Option<Question> {
    let q = ev.dns.as_ref()?;
    Some((q.id, q.qname.clone(), QType(q.qtype)))
}

/// The question of the query a DNS trigger event carries (the datagram kept for its replay).
pub fn kept_question(ev: &TriggerEvent) -> Option<Question> {
    let d = pcap::datagram_of(&ev.request.as_ref()?.frame)?;
    let m = Message::parse(&d.payload).filter(|m| !m.response)?;
    Some((m.id, m.qname, m.qtype))
}

fn describe(w: &Wire) -> String {
    let what = if w.response { "response to" } else { "query of" };
    match Message::parse(&w.message) {
        Some(m) => format!("the {what} {} ({} {} id {}, {})", w.client, m.qname, m.qtype, m.id, m.rcode),
        None => format!("a datagram of {}", w.client),
    }
}

fn describe_event(ev: &TriggerEvent) -> String {
    let nat = ev.nat.map(|k| format!(" nat {k}")).unwrap_or_default();
    format!(
        "{:?} status {} key {}{nat} question {:?} query kept {:?}",
        ev.kind,
        ev.status,
        ev.key,
        event_question(ev),
        kept_question(ev)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query or response of `name` A with `id`, as dig sends it (one question, an OPT record
    /// left out).
    fn message(id: u16, response: bool, rcode: u8, name: &str) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend([if response { 0x81 } else { 0x01 }, if response { 0x80 | rcode } else { 0 }]);
        m.extend([0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.split('.') {
            m.push(label.len() as u8);
            m.extend(label.as_bytes());
        }
        m.extend([0, 0, 1, 0, 1]);
        m
    }

    fn datagram(ts: u64, src: &str, dst: &str, payload: Vec<u8>) -> Datagram {
        Datagram {
            ts_ns: ts,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            len: payload.len() as u32,
            payload,
        }
    }

    #[test]
    fn messages_are_read() {
        let m = Message::parse(&message(7, true, 3, "Missing.Test")).unwrap();
        assert_eq!(
            m,
            Message {
                id: 7,
                response: true,
                rcode: Rcode::NXDOMAIN,
                qname: "missing.test".into(),
                qtype: QType::A
            }
        );
        assert_eq!(Message::parse(&message(7, true, 3, "x")[..14]), None, "cut");
    }

    #[test]
    fn the_first_covered_response_marks_its_socket() {
        let (c, vip, other) = ("198.18.1.2:20001", "198.19.0.53:53", "198.18.1.2:20002");
        let trace = Trace {
            datagrams: vec![
                datagram(1, c, vip, message(1, false, 0, "a.test")),
                datagram(2, c, vip, message(2, false, 0, "b.test")),
                datagram(3, vip, c, message(1, true, 0, "a.test")),
                datagram(4, vip, c, message(2, true, 3, "b.test")),
                datagram(5, other, vip, message(3, false, 0, "good.test")),
                datagram(6, vip, other, message(3, true, 0, "good.test")),
                datagram(7, c, vip, message(4, false, 0, "c.test")),
                datagram(8, vip, c, message(4, true, 3, "c.test")),
            ],
            ..Trace::default()
        };
        let ex = exchanges(&trace, 53);
        assert_eq!(ex.len(), 4);
        assert_eq!(
            (ex[1].response, ex[1].rcode, ex[1].took_ns(&trace)),
            (Some(3), Some(Rcode::NXDOMAIN), Some(2))
        );
        let expected = DnsExpected::new(&trace, &ex, |e| e.rcode == Some(Rcode::NXDOMAIN));
        assert_eq!(
            expected.triggered,
            [Triggered { client: c.parse().unwrap(), server: vip.parse().unwrap(), exchange: 1 }]
        );
        // The NXDOMAIN and what follows on its socket: c.test's query and response.
        assert_eq!(expected.copies(), 3);
        // The mirror: the query replayed, then the copies, the response from the pod behind the VIP.
        let pod = "198.18.2.2:53";
        let mut mirror = Trace {
            datagrams: vec![
                datagram(14, pod, c, message(2, true, 3, "b.test")),
                datagram(17, c, vip, message(4, false, 0, "c.test")),
                datagram(18, pod, c, message(4, true, 3, "c.test")),
            ],
            replayed_datagrams: vec![pcap::ReplayedDatagram {
                after_copies: 0,
                datagram: trace.datagrams[1].clone(),
            }],
            ..Trace::default()
        };
        expected.compare_mirror(&mirror).unwrap();
        assert_eq!(answers_without_query(&mirror), 0, "b.test's query replayed, c.test's copied");
        mirror.datagrams.remove(1);
        assert_eq!(answers_without_query(&mirror), 1, "c.test's answer alone");
        mirror.datagrams.insert(1, datagram(17, c, vip, message(4, false, 0, "c.test")));
        mirror.replayed_datagrams[0].after_copies = 1;
        mirror.datagrams.push(datagram(19, other, vip, message(3, false, 0, "good.test")));
        let diff = expected.compare_mirror(&mirror).unwrap_err();
        assert!(diff.contains("ahead of the replay") && diff.contains("never expected"), "{diff}");
    }

    #[test]
    fn a_query_unanswered_marks_its_socket_when_its_time_passes() {
        let (late, quick, vip) = ("198.18.1.2:20001", "198.18.1.2:20002", "198.18.2.2:53");
        let s = 1_000_000_000;
        let trace = Trace {
            datagrams: vec![
                datagram(0, late, vip, message(1, false, 0, "a.late.test")),
                datagram(s / 10, quick, vip, message(2, false, 0, "b.half.test")),
                datagram(s * 6 / 10, vip, quick, message(2, true, 0, "b.half.test")),
                datagram(s * 18 / 10, vip, late, message(1, true, 0, "a.late.test")),
            ],
            ..Trace::default()
        };
        let ex = exchanges(&trace, 53);
        let expected = DnsExpected::unanswered(&trace, &ex, std::time::Duration::from_secs(1));
        assert_eq!(expected.triggered.iter().map(|t| t.exchange).collect::<Vec<_>>(), [0]);
        assert_eq!(expected.copies(), 1, "the late answer");
        let mirror = Trace { datagrams: vec![trace.datagrams[3].clone()], ..Trace::default() };
        expected.compare_mirror(&mirror).unwrap();
        let replayed = pcap::ReplayedDatagram { after_copies: 0, datagram: trace.datagrams[0].clone() };
        let with_replay = Trace { replayed_datagrams: vec![replayed], ..mirror };
        assert!(expected.compare_mirror(&with_replay).unwrap_err().contains("none expected"));
    }
}
