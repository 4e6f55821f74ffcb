//! What the mirror must carry when connections cross NAT in the node (a Service's ClusterIP or
//! NodePort): each packet is copied once, at the first attached hook on its path, in the form
//! it has there. A connection's client-to-server packets and its server-to-client packets may
//! therefore be copied at different places and under different tuples, e.g. `client:port ->
//! VIP:80` at the client veth's ingress and `pod:80 -> client:port` at the server veth's.
//!
//! The reference is captured exactly there: one capture point for each direction, a link of
//! the node namespace and the way packets cross it (received from the pod: the link's
//! ingress; sent to the pod: its egress), so that the expected packets are in the very form
//! the mirror carries them; they are compared by addresses, ports, sequence and acknowledgment
//! numbers, flags and length. A connection's two forms are joined by the client's initial
//! sequence number, which NAT does not change: the SYN seen at the client-to-server point and
//! the SYN-ACK seen at the server-to-client point carry it.
//!
//! "From the trigger on": the data path marks a connection when its status line crosses the
//! server-to-client point; from then on every packet of both directions is copied, a
//! client-to-server packet iff it crosses its own point after that instant. Both points are in
//! the node namespace and stamped by one clock (nanoseconds), so the captures merged in time
//! order give that order. A packet crossing its point while the status line crosses the other
//! would be ambiguous; request/response traffic has none: the client sends nothing between a
//! request and the arrival of its response (the response's ACK, immediate or piggybacked on
//! the next request, comes after it), so every client-to-server packet is at least a round
//! trip through the client away from the trigger. The recording reports that gap.
//!
//! The request a trigger answered ([`NatExpected::request_behind`]) is where the classifier
//! saw it: at the client-to-server point, under that point's tuple. Responses answer requests
//! in order, so it is the request whose rank among the connection's requests is the triggering
//! response's among its final responses.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

use mirror_bpf::FlowKey;

use crate::capture::pcap::{Packet, PacketId, Trace};
use crate::capture::tcpdump::{Capture, Direction, SETTLE};
use crate::oracles::http_stream;
use crate::oracles::oracle::Expected;
use crate::topology::netns::Netns;

/// Where the data path copies one direction of a connection: a link of the node namespace and
/// the way the packets cross it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// The link, in the node namespace.
    pub dev: String,
    /// [`Direction::In`]: received from its peer (the pod), its ingress hook;
    /// [`Direction::Out`]: sent to the peer, its egress hook.
    pub dir: Direction,
}

impl Point {
    /// Packets received by `dev` from its peer.
    pub fn ingress(dev: &str) -> Point {
        Point { dev: dev.to_string(), dir: Direction::In }
    }

    /// Packets `dev` sends to its peer.
    pub fn egress(dev: &str) -> Point {
        Point { dev: dev.to_string(), dir: Direction::Out }
    }
}

/// Where each direction of the connections is copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyPoints {
    /// Client-to-server packets.
    pub to_server: Point,
    /// Server-to-client packets.
    pub to_client: Point,
}

/// TCP captured at the copy points and everything on the mirror sink, during the same traffic.
pub struct NatRecording {
    /// The copy points.
    pub points: CopyPoints,
    /// At `points.to_server`.
    pub to_server: Trace,
    /// At `points.to_client` (the same trace when both points are one).
    pub to_client: Trace,
    /// On the mirror sink: the copies in `packets`, the requests replayed ahead of triggers
    /// apart, in `replayed`.
    pub mirror: Trace,
}

static TAKEN: AtomicU32 = AtomicU32::new(0);

/// Runs `traffic` while capturing TCP at `points` and everything on `sink`, all in `node`;
/// files go to `dir`.
pub fn record(
    node: &Netns,
    dir: &Path,
    points: &CopyPoints,
    sink: &str,
    traffic: impl FnOnce(),
) -> NatRecording {
    let n = TAKEN.fetch_add(1, Ordering::Relaxed);
    let start = |p: &Point, what: &str| {
        Capture::start_directed(node, &p.dev, p.dir, "tcp", &dir.join(format!("nat-{n}-{what}.pcap")))
    };
    let at_server_side = start(&points.to_server, "to-server");
    let at_client_side =
        (points.to_client != points.to_server).then(|| start(&points.to_client, "to-client"));
    let at_sink = Capture::start(node, sink, "", &dir.join(format!("nat-{n}-mirror.pcap")));
    traffic();
    thread::sleep(SETTLE);
    let to_server = at_server_side.stop();
    let to_client = at_client_side.map_or_else(|| to_server.clone(), Capture::stop);
    NatRecording { points: points.clone(), to_server, to_client, mirror: at_sink.stop() }
}

/// One connection in its two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// The client's initial sequence number.
    pub client_isn: u32,
    /// Its tuple where its client-to-server packets are copied.
    pub to_server: FlowKey,
    /// Its tuple where its server-to-client packets are copied.
    pub to_client: FlowKey,
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client ISN {}: {} to the server, {} to the client",
            self.client_isn, self.to_server, self.to_client
        )
    }
}

/// A connection that must be mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triggered {
    /// Index in [`NatExpected::connections`].
    pub conn: usize,
    /// The status that triggered it.
    pub status: u16,
    /// Its packets from the trigger on, both directions.
    pub packets: u64,
    /// Time between the trigger and the nearest client-to-server packet of the connection, ns.
    pub nearest_to_server_ns: Option<u64>,
}

/// The expected mirror of a [`NatRecording`].
#[derive(Debug, Clone, Default)]
pub struct NatExpected {
    /// Every connection, in the order of their SYNs at the client-to-server point.
    pub connections: Vec<Connection>,
    /// Those that must be mirrored, in trigger order.
    pub triggered: Vec<Triggered>,
    /// The packets the mirror must carry, in time order.
    pub packets: Vec<PacketId>,
}

/// Which way a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    ToServer,
    ToClient,
}

type Tuple = (SocketAddr, SocketAddr);

impl NatExpected {
    /// Computes it; `trigger(status, server_port)` says whether a response triggers.
    #[track_caller]
    pub fn from_recording(rec: &NatRecording, trigger: impl Fn(u16, u16) -> bool) -> NatExpected {
        // The packets that complete a triggering status code, read as HTTP streams (the same
        // reading as the pod-to-pod oracle's).
        NatExpected::from_triggers(rec, |trace| {
            http_stream::conversations(trace)
                .iter()
                .flat_map(|c| {
                    c.responses
                        .iter()
                        .filter(|r| trigger(r.status, c.server.port()))
                        .map(|r| (r.packet, r.status))
                        .collect::<Vec<_>>()
                })
                .collect()
        })
    }

    /// Computes it when the caller reads the captures: `triggers(trace)` gives, in a capture at
    /// a copy point, the packets that trigger (index in the trace) and the status each
    /// reports; a connection is mirrored from the first of its server-to-client packets there.
    #[track_caller]
    pub fn from_triggers(rec: &NatRecording, triggers: impl Fn(&Trace) -> Vec<(usize, u16)>) -> NatExpected {
        let same_point = rec.points.to_server == rec.points.to_client;
        let traces: Vec<(&Trace, &[Way])> = if same_point {
            vec![(&rec.to_server, &[Way::ToServer, Way::ToClient])]
        } else {
            vec![(&rec.to_server, &[Way::ToServer]), (&rec.to_client, &[Way::ToClient])]
        };
        // Each directed tuple's way and client ISN, from the handshake.
        let mut learned: BTreeMap<(usize, Tuple), (Way, u32)> = BTreeMap::new();
        for (t, (trace, ways)) in traces.iter().enumerate() {
            for p in &trace.packets {
                let (syn, ack) = (p.flags & 0x02 != 0, p.flags & 0x10 != 0);
                let learnt = match (syn, ack) {
                    (true, false) if ways.contains(&Way::ToServer) => (Way::ToServer, p.seq),
                    (true, true) if ways.contains(&Way::ToClient) => (Way::ToClient, p.ack.wrapping_sub(1)),
                    _ => continue,
                };
                learned.insert((t, (p.src, p.dst)), learnt);
            }
        }
        // The connections, joined by the client's ISN.
        let mut by_isn: BTreeMap<u32, (Option<FlowKey>, Option<FlowKey>)> = BTreeMap::new();
        let mut order: Vec<u32> = Vec::new();
        for ((_, (src, dst)), (way, isn)) in &learned {
            let entry = by_isn.entry(*isn).or_default();
            let key = FlowKey::new(*src, *dst, 6);
            let slot = if *way == Way::ToServer { &mut entry.0 } else { &mut entry.1 };
            assert!(
                slot.is_none_or(|k| k == key),
                "two connections with client ISN {isn}: {slot:?} and {key}"
            );
            *slot = Some(key);
        }
        // Time order of everything selected: (time, trace, index in the trace).
        let mut timeline: Vec<(u64, usize, usize, Way, u32)> = Vec::new();
        let mut strays: Vec<String> = Vec::new();
        for (t, (trace, _)) in traces.iter().enumerate() {
            for (i, p) in trace.packets.iter().enumerate() {
                match learned.get(&(t, (p.src, p.dst))) {
                    Some((way, isn)) => {
                        timeline.push((p.ts_ns, t, i, *way, *isn));
                        if *way == Way::ToServer && p.flags & 0x12 == 0x02 {
                            order.push(*isn);
                        }
                    }
                    // In a trace of both ways, the other way's tuples are learned from the
                    // packets going that way: anything else began before the capture.
                    None if !learned.contains_key(&(t, (p.dst, p.src))) => {
                        strays.push(format!("  {}", p.id()));
                    }
                    None => {}
                }
            }
        }
        assert!(
            strays.is_empty(),
            "packets of connections that began before the capture:\n{}",
            strays.join("\n")
        );
        timeline.sort_by_key(|(ts, t, i, _, _)| (*ts, *t, *i));

        let mut e = NatExpected::default();
        let mut index_of: BTreeMap<u32, usize> = BTreeMap::new();
        order.dedup();
        for isn in order {
            let (to_server, to_client) = by_isn[&isn];
            let (Some(to_server), Some(to_client)) = (to_server, to_client) else {
                panic!("connection with client ISN {isn} seen at one copy point only: {to_server:?} {to_client:?}");
            };
            index_of.entry(isn).or_insert_with(|| {
                e.connections.push(Connection { client_isn: isn, to_server, to_client });
                e.connections.len() - 1
            });
        }
        let packet = |t: usize, i: usize| -> &Packet { &traces[t].0.packets[i] };
        // The packets that trigger: (trace, packet) -> status.
        let mut completes: BTreeMap<(usize, usize), u16> = BTreeMap::new();
        for (t, (trace, _)) in traces.iter().enumerate() {
            for (packet, status) in triggers(trace) {
                completes.entry((t, packet)).or_insert(status);
            }
        }
        let mut mirrored: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
        for &(ts, t, i, way, isn) in &timeline {
            let p = packet(t, i);
            let conn =
                *index_of.get(&isn).unwrap_or_else(|| panic!("{} has no SYN at the client's side", p.id()));
            let k = match mirrored.get(&conn) {
                Some(&(k, _)) => k,
                None => match completes.get(&(t, i)).filter(|_| way == Way::ToClient) {
                    Some(&status) => {
                        e.triggered.push(Triggered { conn, status, packets: 0, nearest_to_server_ns: None });
                        mirrored.insert(conn, (e.triggered.len() - 1, ts));
                        e.triggered.len() - 1
                    }
                    None => continue,
                },
            };
            e.triggered[k].packets += 1;
            e.packets.push(p.id());
        }
        // How close the nearest client-to-server packet came to each trigger, either side.
        for &(ts, _, _, way, isn) in &timeline {
            if let Some(&(k, at)) = index_of.get(&isn).and_then(|c| mirrored.get(c)) {
                if way == Way::ToServer {
                    let gap = ts.abs_diff(at);
                    let nearest = &mut e.triggered[k].nearest_to_server_ns;
                    *nearest = Some(nearest.map_or(gap, |n| n.min(gap)));
                }
            }
        }
        e
    }

    /// The request `t`'s trigger answered: the segment that carried its first byte at the
    /// client-to-server point, and the start of its line (`GET /bar `).
    pub fn request_behind(&self, rec: &NatRecording, t: &Triggered) -> Result<(Packet, String), String> {
        let conn = &self.connections[t.conn];
        let one = |trace: &Trace, key: FlowKey| {
            let mut found = http_stream::conversations(trace).into_iter().filter(|c| c.flow == key);
            match (found.next(), found.next()) {
                (Some(c), None) => Ok(c),
                (None, _) => Err(format!("{key} is not in the capture at its copy point")),
                (Some(_), Some(_)) => Err(format!("{key} carried two connections")),
            }
        };
        let (to_server, to_client) =
            (one(&rec.to_server, conn.to_server)?, one(&rec.to_client, conn.to_client)?);
        let finals: Vec<u16> = to_client.responses.iter().map(|r| r.status).filter(|s| *s >= 200).collect();
        let rank = finals
            .iter()
            .position(|s| *s == t.status)
            .ok_or_else(|| format!("{conn}: no {} among its responses {finals:?}", t.status))?;
        let q = to_server.requests.get(rank).ok_or_else(|| {
            format!(
                "{conn}: the {} is response {rank} of {finals:?}, {} requests seen",
                t.status,
                to_server.requests.len()
            )
        })?;
        Ok((rec.to_server.packets[q.packet].clone(), format!("{} {} ", q.method, q.target)))
    }

    /// Connections that must not be mirrored at all.
    pub fn untriggered(&self) -> impl Iterator<Item = &Connection> {
        self.connections
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.triggered.iter().any(|t| t.conn == *i))
            .map(|(_, c)| c)
    }

    /// The differences between `mirror` and the expected packets, each of which must be there
    /// exactly once (as often as at its copy point); `Ok` when none.
    pub fn compare_mirror(&self, mirror: &Trace) -> Result<(), String> {
        let flows: BTreeSet<FlowKey> =
            self.connections.iter().flat_map(|c| [c.to_server, c.to_client]).collect();
        let expected =
            Expected { triggered: Vec::new(), packets: self.packets.clone(), crossing: Vec::new(), flows };
        expected.compare_mirror(mirror).map_err(|diff| {
            let conns: Vec<String> = self.connections.iter().map(|c| format!("  {c}")).collect();
            format!("{diff}\nconnections:\n{}\ntriggered: {:?}", conns.join("\n"), self.triggered)
        })
    }
}
