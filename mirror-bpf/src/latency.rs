//! Latency histograms aggregated in the kernel, read and summed over CPUs here.

use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::read_plain;
use crate::shared::types::{self, hist_kind, mirror_limits};

/// What a histogram measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HistKind {
    /// First segment of a request to the status line of its response.
    HttpResponse,
    /// SYN to the ACK that completes the handshake.
    TcpHandshake,
    /// Kernel stack: netif_receive_skb to our tc ingress.
    StackRxTc,
    /// Kernel stack: tc ingress to leaving the node (net_dev_start_xmit).
    StackTcXmit,
    /// Kernel stack: tc ingress to a local socket read.
    StackTcRead,
    /// Kernel stack: netif_receive_skb to leaving the node.
    StackXmit,
    /// Kernel stack: netif_receive_skb to a local socket read.
    StackRead,
    /// A DNS query to its response (on the DNS ports).
    DnsResponse,
}

impl HistKind {
    const ALL: [(HistKind, hist_kind, &'static str); 8] = [
        (Self::HttpResponse, hist_kind::HIST_HTTP_RESPONSE, "http_response"),
        (Self::TcpHandshake, hist_kind::HIST_TCP_HANDSHAKE, "tcp_handshake"),
        (Self::StackRxTc, hist_kind::HIST_STACK_RX_TC, "stack_rx_to_tc"),
        (Self::StackTcXmit, hist_kind::HIST_STACK_TC_XMIT, "stack_tc_to_xmit"),
        (Self::StackTcRead, hist_kind::HIST_STACK_TC_READ, "stack_tc_to_read"),
        (Self::StackXmit, hist_kind::HIST_STACK_XMIT, "stack_rx_to_xmit"),
        (Self::StackRead, hist_kind::HIST_STACK_READ, "stack_rx_to_read"),
        (Self::DnsResponse, hist_kind::HIST_DNS_RESPONSE, "dns_response"),
    ];

    fn from_raw(k: u8) -> Option<Self> {
        Self::ALL.iter().find(|(_, raw, _)| raw.0 == u32::from(k)).map(|(kind, _, _)| *kind)
    }

    /// A short name: `http_response`, `tcp_handshake`, `dns_response`, `stack_rx_to_tc`, ...
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(kind, _, _)| *kind == self).map_or("", |(_, _, n)| n)
    }
}

/// One histogram: counts per bucket of nanoseconds (see [`bucket_bounds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// Interface where the end of each interval was seen.
    pub ifindex: u32,
    /// What it measures.
    pub kind: HistKind,
    /// HTTP status class (1-5) of the responses, 0 for other kinds.
    pub class: u8,
    /// Intervals counted.
    pub count: u64,
    /// Their sum.
    pub sum_ns: u64,
    /// Counts per bucket.
    pub buckets: Vec<u64>,
}

const SUB: u32 = 1 << mirror_limits::HIST_SUB_BITS.0;

/// The nanoseconds bucket `b` holds: `[lo, hi)`. Exact below 8, then 8 buckets per power of two
/// (the same arithmetic as `hist_bucket` in hist.h).
pub fn bucket_bounds(b: usize) -> (u64, u64) {
    let b = b as u32;
    if b < SUB {
        return (u64::from(b), u64::from(b) + 1);
    }
    let msb = b / SUB + mirror_limits::HIST_SUB_BITS.0 - 1;
    let sub = u64::from(b % SUB);
    let shift = msb - mirror_limits::HIST_SUB_BITS.0;
    ((u64::from(SUB) + sub) << shift, (u64::from(SUB) + sub + 1) << shift)
}

impl Histogram {
    /// The value below which a fraction `q` of the intervals fall, interpolated in its bucket.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let total: u64 = self.buckets.iter().sum();
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (b, n) in self.buckets.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let (lo, hi) = bucket_bounds(b);
                let within = (rank - seen as f64) / *n as f64;
                return Some(Duration::from_nanos(lo + ((hi - lo) as f64 * within) as u64));
            }
            seen += n;
        }
        None
    }

    /// The mean interval.
    pub fn mean(&self) -> Option<Duration> {
        (self.count > 0).then(|| Duration::from_nanos(self.sum_ns / self.count))
    }

    /// Adds another histogram's counts (same buckets).
    pub fn merge(&mut self, other: &Histogram) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }
}

/// Every histogram (`hist_slots` gives each one's slot of `latency_hists`), summed over CPUs.
pub(crate) fn read_histograms(slots: &MapMut<'_>, hists: &MapMut<'_>) -> Result<Vec<Histogram>> {
    let mut out = Vec::new();
    for k in slots.keys() {
        let Some(slot) = slots.lookup(&k, MapFlags::ANY).context(|| "reading hist_slots".into())? else {
            continue;
        };
        let Some(per_cpu) =
            hists.lookup_percpu(&slot, MapFlags::ANY).context(|| "reading latency_hists".into())?
        else {
            continue;
        };
        let key: types::hist_key = read_plain(&k);
        let Some(kind) = HistKind::from_raw(key.kind) else { continue };
        let mut h = Histogram {
            ifindex: key.ifindex,
            kind,
            class: key.class,
            count: 0,
            sum_ns: 0,
            buckets: vec![0; mirror_limits::HIST_BUCKETS.0 as usize],
        };
        for b in &per_cpu {
            let v: types::latency_hist = read_plain(b);
            h.count += v.count;
            h.sum_ns += v.sum_ns;
            for (a, n) in h.buckets.iter_mut().zip(v.buckets.iter()) {
                *a += n;
            }
        }
        out.push(h);
    }
    out.sort_by_key(|h| (h.kind, h.ifindex, h.class));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket_of(ns: u64) -> usize {
        (0..mirror_limits::HIST_BUCKETS.0 as usize)
            .find(|b| {
                let (lo, hi) = bucket_bounds(*b);
                (lo..hi).contains(&ns)
            })
            .unwrap_or(mirror_limits::HIST_BUCKETS.0 as usize - 1)
    }

    #[test]
    fn buckets_tile_the_range() {
        let mut next = 0;
        for b in 0..mirror_limits::HIST_BUCKETS.0 as usize {
            let (lo, hi) = bucket_bounds(b);
            assert_eq!(lo, next, "bucket {b}");
            assert!(hi > lo);
            // Every bucket is at most 1/8 of its lower bound wide: quantiles within ~6%.
            assert!(lo < 8 || (hi - lo) * 8 <= lo, "bucket {b}: {lo}..{hi}");
            next = hi;
        }
        assert!(next > 16_000_000_000, "the last bucket reaches past 16 s");
    }

    #[test]
    fn kinds_are_named_from_the_data_paths_values() {
        assert_eq!(HistKind::from_raw(hist_kind::HIST_DNS_RESPONSE.0 as u8), Some(HistKind::DnsResponse));
        assert_eq!(HistKind::DnsResponse.name(), "dns_response");
        assert_eq!(HistKind::from_raw(hist_kind::HIST_HTTP_RESPONSE.0 as u8), Some(HistKind::HttpResponse));
        assert_eq!(HistKind::from_raw(200), None);
        let mut names: Vec<&str> = HistKind::ALL.iter().map(|(k, _, _)| k.name()).collect();
        names.dedup();
        assert_eq!(names.len(), HistKind::ALL.len());
    }

    #[test]
    fn quantiles_interpolate() {
        let mut h = Histogram {
            ifindex: 1,
            kind: HistKind::HttpResponse,
            class: 2,
            count: 100,
            sum_ns: 0,
            buckets: vec![0; mirror_limits::HIST_BUCKETS.0 as usize],
        };
        h.buckets[bucket_of(50_000_000)] = 100;
        let p50 = h.quantile(0.5).unwrap().as_secs_f64();
        assert!((p50 - 0.050).abs() / 0.050 < 0.07, "{p50}");
        assert_eq!(h.quantile(0.0), h.quantile(0.001));
    }
}
