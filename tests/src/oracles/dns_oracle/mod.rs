//! What the mirror must carry of DNS, over UDP and over TCP, read from a capture at the client:
//! each query with its response (an exchange: one client socket or connection, one id, one
//! question; over TCP the message at the start of a segment, after its 2-byte length); the flows
//! (UDP sockets, TCP connections) a rule marks, each at the first response of it the rule covers;
//! and what the mirror then carries of each, exactly once: every datagram or segment of the flow
//! from that response on, and each query of the flow sent before the mark and answered at or
//! after it (the triggering one; on a socket of glibc's, asking A and AAAA at once, the other one
//! too when sent before the first answer) replayed as the client sent it, ahead of its answer,
//! the triggering one ahead of every copy of the flow that carries data. A query sent after the
//! mark is copied with its flow: replayed as well, it would be on the mirror twice. Another query
//! sent just before the mark may reach the classifier after it (the client's capture sees a
//! query before the node-side veth does, and a response after it): copied once with its flow
//! instead of replayed, it is right too. Nothing of the flows no rule marks.
//!
//! Copies are told apart by what NAT does not change: the client's address and port, the
//! direction and the DNS message itself (over TCP the segment's numbers, flags and payload). A
//! query is copied where the classifier first sees it (sent to the ClusterIP, on a path through
//! a Service) and a response where it sees it (from the resolver pod); the replay is the query
//! as the client sent it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use mirror_bpf::{TriggerEvent, TriggerKind};

use crate::capture::pcap::{self, Datagram, Packet, Trace};
use crate::workload::dns::{QType, Rcode, Transport};

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

    /// Reads the message at the start of a TCP segment's payload, after its 2-byte length (where
    /// the classifier reads one); `None` for anything else.
    pub fn in_segment(payload: &[u8]) -> Option<Message> {
        Message::parse(payload.get(2..)?)
    }
}

/// A client's flow, as its capture has it: a UDP socket or a TCP connection, to the server as
/// the client addressed it (a ClusterIP through a Service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    /// UDP or TCP.
    pub transport: Transport,
    /// The client's socket.
    pub client: SocketAddr,
    /// The server.
    pub server: SocketAddr,
}

impl Flow {
    /// Whether a datagram or segment of its transport from `src` to `dst` is of it.
    fn carries(&self, src: SocketAddr, dst: SocketAddr) -> bool {
        (src, dst) == (self.client, self.server) || (src, dst) == (self.server, self.client)
    }
}

/// A query and its response, as the client's capture has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The client's socket.
    pub client: SocketAddr,
    /// The server, as the client addressed it (a ClusterIP through a Service).
    pub server: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
    /// The query's id.
    pub id: u16,
    /// The question's name, lower case.
    pub qname: String,
    /// The question's type.
    pub qtype: QType,
    /// The query: its index in the trace's datagrams (UDP) or segments (TCP, `packets`).
    pub query: usize,
    /// Its response's index there, if one came.
    pub response: Option<usize>,
    /// The response's code.
    pub rcode: Option<Rcode>,
}

impl Exchange {
    /// From the query to its response, ns, as the capture saw them.
    pub fn took_ns(&self, trace: &Trace) -> Option<u64> {
        self.response.map(|r| ts_of(trace, self.transport, r) - ts_of(trace, self.transport, self.query))
    }

    /// Its flow.
    pub fn flow(&self) -> Flow {
        Flow { transport: self.transport, client: self.client, server: self.server }
    }
}

/// The time of the datagram (UDP) or segment (TCP) at `i` of `trace`.
fn ts_of(trace: &Trace, transport: Transport, i: usize) -> u64 {
    match transport {
        Transport::Udp => trace.datagrams[i].ts_ns,
        Transport::Tcp => trace.packets[i].ts_ns,
    }
}

/// How many datagrams (UDP) or segments (TCP) `trace` holds.
fn count_of(trace: &Trace, transport: Transport) -> usize {
    match transport {
        Transport::Udp => trace.datagrams.len(),
        Transport::Tcp => trace.packets.len(),
    }
}

/// The exchanges of `trace` with servers on `port`, over UDP and TCP, in the order of their
/// queries: each response paired with the earliest unanswered query of its flow with the same
/// id and question.
pub fn exchanges(trace: &Trace, port: u16) -> Vec<Exchange> {
    let datagrams =
        trace.datagrams.iter().enumerate().filter_map(|(i, d)| {
            Some((d.ts_ns, Transport::Udp, i, d.src, d.dst, Message::parse(&d.payload)?))
        });
    let segments = trace.packets.iter().enumerate().filter_map(|(i, p)| {
        Some((p.ts_ns, Transport::Tcp, i, p.src, p.dst, Message::in_segment(&p.payload)?))
    });
    let mut messages: Vec<_> = datagrams.chain(segments).collect();
    messages.sort_by_key(|m| m.0);
    let mut found: Vec<Exchange> = Vec::new();
    for (_, transport, i, src, dst, m) in messages {
        if !m.response && dst.port() == port {
            found.push(Exchange {
                client: src,
                server: dst,
                transport,
                id: m.id,
                qname: m.qname,
                qtype: m.qtype,
                query: i,
                response: None,
                rcode: None,
            });
        } else if m.response && src.port() == port {
            let pending = found.iter_mut().find(|e| {
                e.response.is_none()
                    && (e.transport, e.client, e.server, e.id, e.qtype)
                        == (transport, dst, src, m.id, m.qtype)
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

mod expected;

pub use expected::*;

/// The responses on `mirror` whose query it carries neither copied nor replayed (by transport,
/// client socket, id and question). The data path replays the query of every answer of a marked
/// flow that was sent before the mark, so only a query marked by `noresponse>` (the agent
/// replays it) leaves its answer alone.
pub fn answers_without_query(mirror: &Trace) -> usize {
    type Seen = (Transport, SocketAddr, SocketAddr, Message);
    let datagram = |d: &Datagram| Some((Transport::Udp, d.src, d.dst, Message::parse(&d.payload)?));
    let segment = |p: &Packet| Some((Transport::Tcp, p.src, p.dst, Message::in_segment(&p.payload)?));
    let copies: Vec<Seen> = mirror
        .datagrams
        .iter()
        .filter_map(datagram)
        .chain(mirror.packets.iter().filter_map(segment))
        .collect();
    let replays = mirror
        .replayed_datagrams
        .iter()
        .filter_map(|r| datagram(&r.datagram))
        .chain(mirror.replayed.iter().filter_map(|r| segment(&r.packet)));
    let queries: BTreeSet<(Transport, SocketAddr, Question)> = copies
        .iter()
        .cloned()
        .chain(replays)
        .filter(|(_, _, _, m)| !m.response)
        .map(|(t, src, _, m)| (t, src, (m.id, m.qname, m.qtype)))
        .collect();
    copies
        .into_iter()
        .filter(|(_, _, _, m)| m.response)
        .filter(|(t, _, dst, m)| !queries.contains(&(*t, *dst, (m.id, m.qname.clone(), m.qtype))))
        .count()
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

/// The question of the query a DNS trigger event carries (the datagram, or over TCP the segment,
/// kept for its replay).
pub fn kept_question(ev: &TriggerEvent) -> Option<Question> {
    let frame = &ev.request.as_ref()?.frame;
    let m = match pcap::datagram_of(frame) {
        Some(d) => Message::parse(&d.payload),
        None => Message::in_segment(&pcap::segment_of(frame)?.payload),
    };
    let m = m.filter(|m| !m.response)?;
    Some((m.id, m.qname, m.qtype))
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
        let expected = DnsExpected::new(&trace, &ex, 53, |e| e.rcode == Some(Rcode::NXDOMAIN));
        assert_eq!(
            expected.triggered,
            [Triggered {
                client: c.parse().unwrap(),
                server: vip.parse().unwrap(),
                transport: Transport::Udp,
                exchange: 1
            }]
        );
        assert_eq!(expected.replays(), 1, "b.test's query: a.test's was answered before the mark");
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
        let expected = DnsExpected::unanswered(&trace, &ex, 53, std::time::Duration::from_secs(1));
        assert_eq!(expected.triggered.iter().map(|t| t.exchange).collect::<Vec<_>>(), [0]);
        assert_eq!(expected.copies(), 1, "the late answer");
        let mirror = Trace { datagrams: vec![trace.datagrams[3].clone()], ..Trace::default() };
        expected.compare_mirror(&mirror).unwrap();
        let replayed = pcap::ReplayedDatagram { after_copies: 0, datagram: trace.datagrams[0].clone() };
        let with_replay = Trace { replayed_datagrams: vec![replayed], ..mirror };
        assert!(expected.compare_mirror(&with_replay).unwrap_err().contains("none expected"));
    }

    #[test]
    fn the_other_query_of_a_marked_socket_is_replayed_ahead_of_its_answer() {
        // glibc's A and AAAA on one socket, both NXDOMAIN: the first answer marks it.
        let (c, vip, pod) = ("198.18.1.2:40001", "198.19.0.53:53", "198.18.2.2:53");
        let trace = Trace {
            datagrams: vec![
                datagram(1, c, vip, message(1, false, 0, "x.example")),
                datagram(2, c, vip, message(2, false, 0, "x.example")),
                datagram(3, vip, c, message(1, true, 3, "x.example")),
                datagram(4, vip, c, message(2, true, 3, "x.example")),
            ],
            ..Trace::default()
        };
        let ex = exchanges(&trace, 53);
        let expected = DnsExpected::new(&trace, &ex, 53, |e| e.rcode == Some(Rcode::NXDOMAIN));
        assert_eq!((expected.triggered.len(), expected.replays(), expected.second_replays()), (1, 2, 1));
        assert_eq!(expected.copies(), 2, "the two answers");
        let replay = |after: usize, i: usize| pcap::ReplayedDatagram {
            after_copies: after,
            datagram: trace.datagrams[i].clone(),
        };
        let mut mirror = Trace {
            datagrams: vec![
                datagram(13, pod, c, message(1, true, 3, "x.example")),
                datagram(14, pod, c, message(2, true, 3, "x.example")),
            ],
            replayed_datagrams: vec![replay(0, 0), replay(1, 1)],
            ..Trace::default()
        };
        expected.compare_mirror(&mirror).unwrap();
        assert_eq!(answers_without_query(&mirror), 0);
        mirror.replayed_datagrams[1].after_copies = 2;
        let diff = expected.compare_mirror(&mirror).unwrap_err();
        assert!(diff.contains("came ahead of the query's replay"), "{diff}");
        mirror.replayed_datagrams.pop();
        assert!(expected.compare_mirror(&mirror).unwrap_err().contains("no replay of the query"));
        assert_eq!(answers_without_query(&mirror), 1, "the AAAA answer alone");
        // The AAAA query, sent just before the first answer, reached the classifier after the
        // mark: copied with its flow, once, instead of replayed.
        mirror.datagrams.insert(1, datagram(12, c, pod, message(2, false, 0, "x.example")));
        assert_eq!(expected.compare_mirror(&mirror), Ok(1));
        mirror.datagrams.insert(1, datagram(12, c, pod, message(2, false, 0, "x.example")));
        assert!(expected.compare_mirror(&mirror).unwrap_err().contains("copied 2 times, never expected"));
        // Sent long before the mark, it must be replayed: a copy does not stand for it.
        let mut early = trace.clone();
        for d in &mut early.datagrams[2..] {
            d.ts_ns += 50_000_000;
        }
        let expected =
            DnsExpected::new(&early, &exchanges(&early, 53), 53, |e| e.rcode == Some(Rcode::NXDOMAIN));
        mirror.datagrams.remove(1);
        assert!(expected.compare_mirror(&mirror).unwrap_err().contains("no replay of the query"));
    }

    fn segment(ts: u64, src: &str, dst: &str, seq: u32, ack: u32, flags: u8, payload: Vec<u8>) -> Packet {
        Packet {
            ts_ns: ts,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            seq,
            ack,
            flags,
            len: payload.len() as u32,
            payload,
        }
    }

    /// A message as TCP carries it: its 2-byte length first.
    fn framed(m: Vec<u8>) -> Vec<u8> {
        let mut f = (m.len() as u16).to_be_bytes().to_vec();
        f.extend(m);
        f
    }

    #[test]
    fn a_failure_over_tcp_marks_its_connection_from_the_response_on() {
        let (c, vip, pod) = ("198.18.1.2:20001", "198.19.0.53:53", "198.18.2.2:53");
        let (query, response) =
            (framed(message(9, false, 0, "m.test")), framed(message(9, true, 3, "m.test")));
        let (ql, rl) = (query.len() as u32, response.len() as u32);
        let trace = Trace {
            packets: vec![
                segment(1, c, vip, 100, 0, 0x02, vec![]),
                segment(2, vip, c, 500, 101, 0x12, vec![]),
                segment(3, c, vip, 101, 501, 0x10, vec![]),
                segment(4, c, vip, 101, 501, 0x18, query.clone()),
                segment(5, vip, c, 501, 101 + ql, 0x10, vec![]),
                segment(6, vip, c, 501, 101 + ql, 0x18, response.clone()),
                segment(7, c, vip, 101 + ql, 501 + rl, 0x10, vec![]),
                segment(8, c, vip, 101 + ql, 501 + rl, 0x11, vec![]),
                segment(9, vip, c, 501 + rl, 102 + ql, 0x11, vec![]),
                segment(10, c, vip, 102 + ql, 502 + rl, 0x10, vec![]),
            ],
            ..Trace::default()
        };
        let ex = exchanges(&trace, 53);
        assert_eq!(ex.len(), 1);
        assert_eq!(
            (ex[0].transport, ex[0].query, ex[0].response, ex[0].took_ns(&trace)),
            (Transport::Tcp, 3, Some(5), Some(2))
        );
        let expected = DnsExpected::new(&trace, &ex, 53, |e| e.rcode == Some(Rcode::NXDOMAIN));
        assert_eq!(expected.triggered[0].transport, Transport::Tcp);
        assert_eq!(
            (expected.copies(), expected.replays()),
            (5, 1),
            "the response and every segment after it"
        );
        // On the mirror the server's segments come from the pod behind the VIP; the client's ACK
        // of the response, carrying no data, may overtake the replay.
        let copies: Vec<Packet> = trace.packets[5..]
            .iter()
            .map(|p| Packet {
                src: if p.src.port() == 53 { pod.parse().unwrap() } else { p.src },
                ..p.clone()
            })
            .collect();
        let mut mirror = Trace {
            packets: vec![
                copies[1].clone(),
                copies[0].clone(),
                copies[2].clone(),
                copies[3].clone(),
                copies[4].clone(),
            ],
            replayed: vec![pcap::Replayed { after_copies: 1, packet: trace.packets[3].clone() }],
            ..Trace::default()
        };
        expected.compare_mirror(&mirror).unwrap();
        assert_eq!(answers_without_query(&mirror), 0);
        mirror.replayed[0].after_copies = 2;
        let diff = expected.compare_mirror(&mirror).unwrap_err();
        assert!(diff.contains("copies carrying data came ahead"), "{diff}");
        mirror.replayed[0].after_copies = 0;
        mirror.packets.remove(3);
        let diff = expected.compare_mirror(&mirror).unwrap_err();
        assert!(diff.contains("copied 0 times, 1 expected"), "{diff}");
    }
}
