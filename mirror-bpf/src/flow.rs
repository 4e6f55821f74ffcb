//! Flows as user space sees them: typed keys, per-direction traffic summed over CPUs, marks.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::{bytes_of, read_plain, types};

/// A direction-independent flow: `lo` is the endpoint that compares lower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// The lower endpoint.
    pub lo: SocketAddr,
    /// The higher endpoint.
    pub hi: SocketAddr,
    /// L4 protocol number (6 for TCP).
    pub proto: u8,
}

fn addr(words: &[u32; 4], family: u8) -> IpAddr {
    let mut bytes = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    if family == 4 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(bytes))
    }
}

fn words(ip: IpAddr) -> [u32; 4] {
    let bytes: [u8; 16] = match ip {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    };
    std::array::from_fn(|i| u32::from_ne_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()))
}

impl From<&types::flow_key> for FlowKey {
    fn from(k: &types::flow_key) -> Self {
        FlowKey {
            lo: SocketAddr::new(addr(&k.addr_lo, k.family), k.port_lo),
            hi: SocketAddr::new(addr(&k.addr_hi, k.family), k.port_hi),
            proto: k.proto,
        }
    }
}

impl FlowKey {
    /// The key of the flow between two endpoints, in canonical order (as the classifier builds it).
    pub fn new(a: SocketAddr, b: SocketAddr, proto: u8) -> Self {
        let ka = (words(a.ip()).map(u32::from_be), a.port());
        let kb = (words(b.ip()).map(u32::from_be), b.port());
        let (lo, hi) = if ka <= kb { (a, b) } else { (b, a) };
        FlowKey { lo, hi, proto }
    }

    /// The map key.
    pub fn to_raw(&self) -> types::flow_key {
        types::flow_key {
            addr_lo: words(self.lo.ip()),
            addr_hi: words(self.hi.ip()),
            port_lo: self.lo.port(),
            port_hi: self.hi.port(),
            proto: self.proto,
            family: if self.lo.is_ipv4() { 4 } else { 6 },
            _pad: [0; 2],
        }
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} <-> {}", self.lo, self.hi)?;
        // TCP is the rule; another protocol (DNS over UDP) says so.
        match self.proto {
            6 => Ok(()),
            17 => f.write_str(" udp"),
            p => write!(f, " proto {p}"),
        }
    }
}

/// Traffic of one direction of a flow, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Packets.
    pub packets: u64,
    /// Bytes (skb->len).
    pub bytes: u64,
    /// First packet, monotonic ns (0: none).
    pub first_seen_ns: u64,
    /// Last packet, monotonic ns.
    pub last_seen_ns: u64,
    /// OR of the TCP flags seen.
    pub tcp_flags: u8,
}

impl DirStats {
    fn add(&mut self, d: &types::flow_dir_stats) {
        self.packets += d.packets;
        self.bytes += d.bytes;
        if d.first_seen_ns != 0 && (self.first_seen_ns == 0 || d.first_seen_ns < self.first_seen_ns) {
            self.first_seen_ns = d.first_seen_ns;
        }
        self.last_seen_ns = self.last_seen_ns.max(d.last_seen_ns);
        self.tcp_flags |= d.tcp_flags;
    }

    fn merge(&mut self, d: &DirStats) {
        self.add(&types::flow_dir_stats {
            packets: d.packets,
            bytes: d.bytes,
            first_seen_ns: d.first_seen_ns,
            last_seen_ns: d.last_seen_ns,
            tcp_flags: d.tcp_flags,
            http_kind: 0,
            http_misses: 0,
            _pad: [0; 5],
        });
    }
}

/// A flow marked for mirroring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorMark {
    /// The rule that triggered.
    pub rule_id: u32,
    /// What triggered.
    pub kind: crate::rule::TriggerKind,
    /// The status that triggered (0 for the other kinds).
    pub status: u16,
    /// When it triggered, monotonic ns.
    pub trigger_ns: u64,
    /// Packets mirrored so far.
    pub packets: u64,
    /// Bytes mirrored so far.
    pub bytes: u64,
    /// A limit was reached; nothing more is mirrored.
    pub ended: bool,
    /// The mark of a translated connection's other tuple: its budget is the first mark's.
    pub linked: bool,
    /// When mirroring stops, monotonic ns (0: no time limit).
    pub deadline_ns: u64,
    /// The most packets mirrored (0: no limit).
    pub max_packets: u64,
    /// The most bytes mirrored (0: no limit).
    pub max_bytes: u64,
}

impl MirrorMark {
    /// Whether nothing more is mirrored at monotonic time `now_ns`: ended, or a limit reached
    /// (the data path says `ended` only at the next packet after the limit).
    pub fn over(&self, now_ns: u64) -> bool {
        self.ended
            || (self.deadline_ns != 0 && now_ns > self.deadline_ns)
            || (self.max_packets != 0 && self.packets >= self.max_packets)
            || (self.max_bytes != 0 && self.bytes >= self.max_bytes)
    }
}

impl From<&types::mirror_mark> for MirrorMark {
    fn from(m: &types::mirror_mark) -> Self {
        MirrorMark {
            rule_id: m.rule_id,
            kind: crate::rule::TriggerKind::from_raw(u32::from(m.kind))
                .unwrap_or(crate::rule::TriggerKind::Status),
            status: m.status,
            trigger_ns: m.trigger_ns,
            packets: m.packets,
            bytes: m.bytes,
            ended: m.ended != 0,
            linked: m.linked != 0,
            deadline_ns: m.deadline_ns,
            max_packets: m.max_packets,
            max_bytes: m.max_bytes,
        }
    }
}

/// A flow from the flow table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// Its endpoints: for a connection translated by the node's conntrack (a Service), the
    /// client's tuple (before DNAT), e.g. `client:port <-> VIP:80`.
    pub key: FlowKey,
    /// The server's tuple of a translated connection (after DNAT, and SNAT if any), e.g.
    /// `client:port <-> pod:80`; traffic, timing and mark of both tuples are merged here.
    pub nat: Option<FlowKey>,
    /// Traffic from `key.lo` to `key.hi`.
    pub forward: DirStats,
    /// Traffic from `key.hi` to `key.lo`.
    pub reverse: DirStats,
    /// Its mirror mark, when triggered.
    pub mark: Option<MirrorMark>,
    /// HTTP responses timed (request to status line).
    pub http_timed: u64,
    /// Their mean time.
    pub http_time_mean: Option<Duration>,
    /// Their longest time.
    pub http_time_max: Option<Duration>,
    /// SYN to the ACK completing the handshake, when seen.
    pub handshake: Option<Duration>,
}

impl Flow {
    pub(crate) fn from_percpu(
        key: FlowKey,
        per_cpu: &[types::flow_traffic],
        mark: Option<MirrorMark>,
    ) -> Self {
        let (mut forward, mut reverse) = (DirStats::default(), DirStats::default());
        let (mut timed, mut sum, mut max, mut handshake_us) = (0u64, 0u64, 0u64, 0u32);
        for v in per_cpu {
            forward.add(&v.dir[types::flow_dir::FLOW_DIR_FORWARD.0 as usize]);
            reverse.add(&v.dir[types::flow_dir::FLOW_DIR_REVERSE.0 as usize]);
            timed += u64::from(v.http_timed);
            sum += v.http_time_sum_ns;
            max = max.max(v.http_time_max_ns);
            handshake_us = handshake_us.max(v.handshake_us);
        }
        Flow {
            key,
            nat: None,
            forward,
            reverse,
            mark,
            http_timed: timed,
            http_time_mean: (timed > 0).then(|| Duration::from_nanos(sum / timed)),
            http_time_max: (timed > 0).then(|| Duration::from_nanos(max)),
            handshake: (handshake_us > 0).then(|| Duration::from_micros(handshake_us.into())),
        }
    }

    /// One flow of a translated connection from the entries of its two tuples (either may be
    /// missing), oriented as the client's tuple.
    pub(crate) fn merge_nat(pair: &NatPair, orig: Option<Flow>, reply: Option<Flow>) -> Flow {
        let mut f = orig.unwrap_or_else(|| Flow::from_percpu(pair.orig, &[], None));
        f.key = pair.orig;
        f.nat = Some(pair.reply);
        let Some(r) = reply else { return f };
        let (r_up, r_down) =
            if pair.reply_client_is_lo { (r.forward, r.reverse) } else { (r.reverse, r.forward) };
        let (up, down) = if pair.orig_client_is_lo {
            (&mut f.forward, &mut f.reverse)
        } else {
            (&mut f.reverse, &mut f.forward)
        };
        up.merge(&r_up);
        down.merge(&r_down);
        let sum = |fl: &Flow| fl.http_time_mean.map_or(0, |m| m.as_nanos() as u64 * fl.http_timed);
        let timed = f.http_timed + r.http_timed;
        let total = sum(&f) + sum(&r);
        f.http_time_mean = (timed > 0).then(|| Duration::from_nanos(total / timed));
        f.http_time_max = f.http_time_max.max(r.http_time_max);
        f.http_timed = timed;
        f.handshake = f.handshake.max(r.handshake);
        // The first mark holds the budget; a linked one only points to it.
        f.mark = match (f.mark, r.mark) {
            (Some(a), Some(b)) => Some(if a.linked { b } else { a }),
            (a, b) => a.or(b),
        };
        f
    }

    /// Time since the last packet, against a monotonic `now_ns`.
    pub fn idle(&self, now_ns: u64) -> Duration {
        Duration::from_nanos(now_ns.saturating_sub(self.forward.last_seen_ns.max(self.reverse.last_seen_ns)))
    }
}

/// The two tuples of a connection translated by conntrack, as the classifier recorded them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NatPair {
    /// The client's tuple (before DNAT).
    pub orig: FlowKey,
    /// The server's tuple (after DNAT, and SNAT if any).
    pub reply: FlowKey,
    /// Client to server is `lo` to `hi` in `orig`.
    orig_client_is_lo: bool,
    /// Client to server is `lo` to `hi` in `reply`.
    reply_client_is_lo: bool,
}

impl NatPair {
    /// From a flow_nat value of a key of `family` (4 or 6) and protocol `proto`.
    pub(crate) fn from_raw(v: &types::flow_nat, family: u8, proto: u8) -> Self {
        let ep = |a: &[u32; 4], port: u16| SocketAddr::new(addr(a, family), port);
        let (client, service) = (ep(&v.orig.src, v.orig.sport), ep(&v.orig.dst, v.orig.dport));
        let (server, client_as_seen) = (ep(&v.reply.src, v.reply.sport), ep(&v.reply.dst, v.reply.dport));
        let orig = FlowKey::new(client, service, proto);
        let reply = FlowKey::new(server, client_as_seen, proto);
        NatPair {
            orig,
            reply,
            orig_client_is_lo: orig.lo == client,
            reply_client_is_lo: reply.lo == client_as_seen,
        }
    }
}

/// The mark of one flow, from the `mirror_marks` map.
pub(crate) fn read_mark(marks: &MapMut<'_>, key: &FlowKey) -> Result<Option<MirrorMark>> {
    let raw = key.to_raw();
    let v = marks.lookup(bytes_of(&raw), MapFlags::ANY).context(|| "reading mirror_marks".into())?;
    Ok(v.map(|b| MirrorMark::from(&read_plain::<types::mirror_mark>(&b))))
}

/// The two tuples of `key`'s connection, from the `flow_nat` map, when conntrack translated it.
pub(crate) fn read_nat_pair(nat: &MapMut<'_>, key: &FlowKey) -> Result<Option<NatPair>> {
    let raw = key.to_raw();
    let v = nat.lookup(bytes_of(&raw), MapFlags::ANY).context(|| "reading flow_nat".into())?;
    Ok(v.map(|b| NatPair::from_raw(&read_plain(&b), raw.family, raw.proto)))
}

/// The two tuples of a connection translated by the node's conntrack, each as its side sees
/// the connection: (client, server) endpoints of the client-to-server direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatTuples {
    /// As the client sent it (before DNAT): (client, service), e.g. `client:port`, `VIP:80`.
    pub client_side: (SocketAddr, SocketAddr),
    /// As the server received it (after DNAT, and SNAT if any): e.g. `client:port`, `pod:80`.
    pub server_side: (SocketAddr, SocketAddr),
}

/// The client's and the server's tuples of `key`'s connection, from the `flow_nat` map, when
/// conntrack translated it.
pub(crate) fn read_nat_tuples(nat: &MapMut<'_>, key: &FlowKey) -> Result<Option<NatTuples>> {
    let raw = key.to_raw();
    let v = nat.lookup(bytes_of(&raw), MapFlags::ANY).context(|| "reading flow_nat".into())?;
    Ok(v.map(|b| {
        let v: types::flow_nat = read_plain(&b);
        let ep = |a: &[u32; 4], port: u16| SocketAddr::new(addr(a, raw.family), port);
        NatTuples {
            client_side: (ep(&v.orig.src, v.orig.sport), ep(&v.orig.dst, v.orig.dport)),
            server_side: (ep(&v.reply.dst, v.reply.dport), ep(&v.reply.src, v.reply.sport)),
        }
    }))
}

/// Adds what a CPU's flow cache slot counted since its last write-back to that CPU's
/// `flow_table` value of the flow (the classifier's write-back does the same: flow.h).
fn fold_cached(v: &mut types::flow_traffic, c: &types::flow_cache_slot) {
    for (d, (cd, packets)) in v.dir.iter_mut().zip(c.dir.iter().zip(c.packets)) {
        d.packets += u64::from(packets);
        d.bytes += cd.bytes;
        // The slot's first packet is the first since it was filled: the table's is older.
        if d.first_seen_ns == 0 {
            d.first_seen_ns = cd.first_seen_ns;
        }
        d.last_seen_ns = d.last_seen_ns.max(cd.last_seen_ns);
    }
    for (d, flags) in v.dir.iter_mut().zip(c.tcp_flags) {
        d.tcp_flags |= flags;
    }
    v.http_timed += u32::from(c.http_timed);
    v.http_time_sum_ns += c.http_time_sum_ns;
    v.http_time_max_ns = v.http_time_max_ns.max(c.http_time_max_ns);
}

/// Flows held in `flow_cache`, by key bytes: the (CPU, slot) of each copy.
type CacheHeld = HashMap<Vec<u8>, Vec<(usize, types::flow_cache_slot)>>;

/// The flows each CPU's slots of the `flow_cache` map hold, by key bytes: (CPU, slot).
fn read_cache(cache: &MapMut<'_>) -> Result<CacheHeld> {
    let per_cpu = types::mirror_limits::FLOW_CACHE_SLOTS.0 as usize;
    let mut held = CacheHeld::new();
    let batch = cache
        .lookup_batch(per_cpu as u32, MapFlags::ANY, MapFlags::ANY)
        .context(|| "reading flow_cache".into())?;
    for (k, v) in batch {
        let slot: types::flow_cache_slot = read_plain(&v);
        if slot.key.family == 0 {
            continue;
        }
        let index = u32::from_ne_bytes(k[..4].try_into().unwrap_or_default()) as usize;
        held.entry(bytes_of(&slot.key).to_vec()).or_default().push((index / per_cpu, slot));
    }
    Ok(held)
}

/// Every flow of the `flow_table` map, with traffic summed over CPUs (what each CPU's
/// `flow_cache` holds since its last write-back added) and its mark; the two tuples of a
/// connection translated by conntrack (`flow_nat`) are one flow.
pub(crate) fn read_flows(
    table: &MapMut<'_>,
    cache: &MapMut<'_>,
    marks: &MapMut<'_>,
    nat: &MapMut<'_>,
) -> Result<Vec<Flow>> {
    let mut cached = read_cache(cache)?;
    let cpus = crate::shared::possible_cpus()
        .map_err(|e| crate::error::Error::Unsupported(format!("counting CPUs: {e}")))?;
    let mut by_key: HashMap<FlowKey, Flow> = HashMap::new();
    let add = |k: &[u8],
               mut values: Vec<types::flow_traffic>,
               slots: Vec<(usize, types::flow_cache_slot)>,
               by_key: &mut HashMap<FlowKey, Flow>| {
        for (cpu, slot) in slots {
            if let Some(v) = values.get_mut(cpu) {
                fold_cached(v, &slot);
            }
        }
        let key = FlowKey::from(&read_plain::<types::flow_key>(k));
        read_mark(marks, &key).map(|mark| by_key.insert(key, Flow::from_percpu(key, &values, mark)))
    };
    for k in table.keys() {
        // A flow evicted between keys() and the lookup is simply skipped.
        let Some(per_cpu) = table.lookup_percpu(&k, MapFlags::ANY).context(|| "reading flow_table".into())?
        else {
            continue;
        };
        let slots = cached.remove(&k).unwrap_or_default();
        add(&k, per_cpu.iter().map(|b| read_plain(b)).collect(), slots, &mut by_key)?;
    }
    // Flows the table evicted while a cache holds them: what the cache counted since.
    for (k, slots) in cached {
        add(&k, vec![types::flow_traffic::default(); cpus as usize], slots, &mut by_key)?;
    }
    let keys: Vec<FlowKey> = by_key.keys().copied().collect();
    let mut flows = Vec::new();
    for key in keys {
        if !by_key.contains_key(&key) {
            continue; // merged already, with its other tuple
        }
        match read_nat_pair(nat, &key)? {
            Some(pair) => {
                let (orig, reply) = (by_key.remove(&pair.orig), by_key.remove(&pair.reply));
                flows.push(Flow::merge_nat(&pair, orig, reply));
            }
            None => flows.extend(by_key.remove(&key)),
        }
    }
    Ok(flows)
}

/// Sizes the `flow_cache` map of an object before its load: every possible CPU's slots.
pub fn size_cache(cache: &mut libbpf_rs::OpenMapMut<'_>) -> Result<()> {
    let cpus = crate::shared::possible_cpus()
        .map_err(|e| crate::error::Error::Unsupported(format!("counting CPUs: {e}")))?;
    cache
        .set_max_entries(cpus * types::mirror_limits::FLOW_CACHE_SLOTS.0)
        .context(|| "sizing flow_cache".into())
}

/// The monotonic clock the classifier stamps with (`bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trips_and_is_canonical() {
        let a: SocketAddr = "198.18.0.2:40000".parse().unwrap();
        let b: SocketAddr = "198.18.1.2:80".parse().unwrap();
        let k = FlowKey::new(a, b, 6);
        assert_eq!(k, FlowKey::new(b, a, 6));
        assert_eq!(k.lo, a);
        assert_eq!(FlowKey::from(&k.to_raw()), k);
        let a6: SocketAddr = "[2001:2::2]:40000".parse().unwrap();
        let b6: SocketAddr = "[2001:2::1]:80".parse().unwrap();
        let k6 = FlowKey::new(a6, b6, 6);
        assert_eq!(k6.lo, b6);
        assert_eq!(FlowKey::from(&k6.to_raw()), k6);
    }
}
