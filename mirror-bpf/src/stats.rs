//! The classifier's per-CPU counters, summed.

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::types::{self, stat_idx, stat_idx as S};
use crate::shared::{read_plain, ZERO};

/// One of the classifier's counters, a slot of `enum stat_idx` (types.h): the one place where
/// its name, its metric and the metric's help text are written. The API, `mirrorctl` and the
/// metrics read them here; docs/operations.md lists the metrics (both checked by tests).
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    /// Its slot in `struct counters`.
    pub idx: stat_idx,
    /// Its name among the counters of the API and `mirrorctl status`.
    pub name: &'static str,
    /// Its metric, `mirror_<metric>_total` (`None`: not exported).
    pub metric: Option<&'static str>,
    /// What it counts: the metric's help text.
    pub help: &'static str,
}

/// Every counter, in the order of `enum stat_idx` (checked by a test against the enum).
pub const COUNTERS: &[Counter] = &[
    Counter {
        idx: S::STAT_PACKETS,
        name: "packets",
        metric: Some("packets"),
        help: "Packets seen by the classifier",
    },
    Counter {
        idx: S::STAT_BYTES,
        name: "bytes",
        metric: Some("bytes"),
        help: "Bytes seen by the classifier",
    },
    Counter {
        idx: S::STAT_NON_TCP,
        name: "non_tcp",
        metric: None,
        help: "Packets not IPv4/IPv6 TCP nor DNS followed over UDP, or non-first fragments (passed untouched)",
    },
    Counter {
        idx: S::STAT_MALFORMED,
        name: "malformed",
        metric: Some("malformed_packets"),
        help: "Packets with truncated or inconsistent headers (passed)",
    },
    Counter {
        idx: S::STAT_DUPLICATE,
        name: "duplicate",
        metric: Some("duplicate_packets"),
        help: "Packets skipped at egress: already seen at an attached ingress",
    },
    Counter {
        idx: S::STAT_HTTP_REQUESTS,
        name: "http_requests",
        metric: Some("http_requests"),
        help: "HTTP/1.x requests recognised",
    },
    Counter {
        idx: S::STAT_HTTP_RESPONSES,
        name: "http_responses",
        metric: Some("http_responses"),
        help: "HTTP/1.x status lines recognised",
    },
    Counter {
        idx: S::STAT_TRIGGERS,
        name: "triggers",
        metric: Some("triggers"),
        help: "Triggers of every kind that matched a rule and marked their flow",
    },
    Counter {
        idx: S::STAT_MIRRORED_PACKETS,
        name: "mirrored_packets",
        metric: Some("mirrored_packets"),
        help: "Packets copied to the mirror interface",
    },
    Counter {
        idx: S::STAT_MIRRORED_BYTES,
        name: "mirrored_bytes",
        metric: Some("mirrored_bytes"),
        help: "Bytes copied to the mirror interface",
    },
    Counter {
        idx: S::STAT_MIRROR_ERRORS,
        name: "mirror_errors",
        metric: Some("copy_errors"),
        help: "Copies that failed",
    },
    Counter {
        idx: S::STAT_MIRROR_NO_TARGET,
        name: "mirror_no_target",
        metric: Some("copy_no_target"),
        help: "Marked packets not copied: no mirror interface",
    },
    Counter {
        idx: S::STAT_MIRROR_ENDED,
        name: "mirror_ended",
        metric: Some("marks_ended"),
        help: "Marks that reached their limit",
    },
    Counter {
        idx: S::STAT_FLOWS_CREATED,
        name: "flows_created",
        metric: Some("flows_created"),
        help: "Flows inserted into the flow table",
    },
    Counter {
        idx: S::STAT_FLOW_INSERT_FAILED,
        name: "flow_insert_failed",
        metric: Some("flow_insert_failed"),
        help: "Flow table inserts that failed",
    },
    Counter {
        idx: S::STAT_MARK_INSERT_FAILED,
        name: "mark_insert_failed",
        metric: Some("mark_insert_failed"),
        help: "Mirror marks that could not be inserted",
    },
    Counter {
        idx: S::STAT_TIMING_INSERT_FAILED,
        name: "timing_insert_failed",
        metric: None,
        help: "Flow timing slots that could not be taken (a request or SYN not timed)",
    },
    Counter {
        idx: S::STAT_HIST_INSERT_FAILED,
        name: "hist_insert_failed",
        metric: None,
        help: "Latency histogram inserts that failed (a sample lost)",
    },
    Counter {
        idx: S::STAT_RINGBUF_DROPS,
        name: "ringbuf_drops",
        metric: Some("ringbuf_drops"),
        help: "Trigger events lost (ring buffer full)",
    },
    Counter {
        idx: S::STAT_HTTP_UNFRAMED,
        name: "http_unframed",
        metric: Some("http_unframed"),
        help: "HTTP streams whose framing was lost (looked at on segment starts until a message is found)",
    },
    Counter {
        idx: S::STAT_CT_LOOKUPS,
        name: "ct_lookups",
        metric: Some("conntrack_lookups"),
        help: "Conntrack lookups (new flows, responses or triggers across NAT)",
    },
    Counter {
        idx: S::STAT_NAT_FLOWS,
        name: "nat_flows",
        metric: Some("nat_flows"),
        help: "Connections found translated by conntrack: one flow, two tuples",
    },
    Counter {
        idx: S::STAT_REPLAY_KEPT,
        name: "replay_kept",
        metric: Some("requests_kept"),
        help: "Request segments kept for a replay ahead of a trigger",
    },
    Counter {
        idx: S::STAT_REPLAYED,
        name: "replayed",
        metric: Some("requests_replayed"),
        help: "Requests replayed to the mirror interface ahead of their trigger (a noresponse mark's by the agent)",
    },
    Counter {
        idx: S::STAT_REPLAY_MISSED,
        name: "replay_missed",
        metric: Some("requests_not_kept"),
        help: "Triggers whose request had not been kept (or its slot was reused)",
    },
    Counter {
        idx: S::STAT_REPLAY_FAILED,
        name: "replay_failed",
        metric: Some("replays_failed"),
        help: "Replays that could not be made",
    },
    Counter {
        idx: S::STAT_RESET_TRIGGERS,
        name: "reset_triggers",
        metric: Some("reset_triggers"),
        help: "TCP resets that matched a reset rule and marked their flow",
    },
    Counter {
        idx: S::STAT_NORESPONSE_TRIGGERS,
        name: "noresponse_triggers",
        metric: Some("noresponse_triggers"),
        help: "Requests unanswered for a noresponse rule's time that marked their flow",
    },
    Counter {
        idx: S::STAT_FILTERED_OUT,
        name: "filtered_out",
        metric: Some("filtered_out"),
        help: "Triggers a rule's request filter (method, path, host) turned down",
    },
    Counter {
        idx: S::STAT_NORESPONSE_TICKS,
        name: "noresponse_ticks",
        metric: Some("noresponse_ticks"),
        help: "Runs of the no-response tick (every 10 ms while noresponse rules exist)",
    },
    Counter {
        idx: S::STAT_NORESPONSE_FAILED,
        name: "noresponse_tick_failed",
        metric: Some("noresponse_tick_failed"),
        help: "Times the no-response tick could not be started",
    },
    Counter {
        idx: S::STAT_H2_CONNECTIONS,
        name: "h2_connections",
        metric: Some("h2_connections"),
        help: "Directions of connections found speaking HTTP/2 (from their start, or found again)",
    },
    Counter {
        idx: S::STAT_H2_REQUESTS,
        name: "h2_requests",
        metric: Some("h2_requests"),
        help: "HTTP/2 requests recognised (request header blocks)",
    },
    Counter {
        idx: S::STAT_H2_RESPONSES,
        name: "h2_responses",
        metric: Some("h2_responses"),
        help: "HTTP/2 responses recognised (header blocks with a :status)",
    },
    Counter {
        idx: S::STAT_H2_TRAILERS,
        name: "h2_trailers",
        metric: Some("h2_trailers"),
        help: "HTTP/2 trailers with a grpc-status recognised",
    },
    Counter {
        idx: S::STAT_H2_UNRESOLVED,
        name: "h2_unresolved",
        metric: Some("h2_unresolved"),
        help: "HTTP/2 header fields that named a header-table entry the classifier does not know",
    },
    Counter {
        idx: S::STAT_H2_LOST,
        name: "h2_lost",
        metric: Some("h2_lost"),
        help: "Times the HTTP/2 framing or header-table state of a direction was lost",
    },
    Counter {
        idx: S::STAT_H2_CONTINUATION,
        name: "h2_continuation",
        metric: Some("h2_continuation"),
        help: "HTTP/2 header blocks continued in CONTINUATION frames (their first frame is read)",
    },
    Counter {
        idx: S::STAT_H2_STREAM_MISSED,
        name: "h2_stream_missed",
        metric: Some("h2_stream_missed"),
        help: "HTTP/2 responses whose request was not found on their stream",
    },
    Counter {
        idx: S::STAT_GRPC_TRIGGERS,
        name: "grpc_triggers",
        metric: Some("grpc_triggers"),
        help: "gRPC trailers whose grpc-status matched a rule and marked their flow",
    },
    Counter {
        idx: S::STAT_REQUEST_NOT_KEPT,
        name: "request_not_kept",
        metric: Some("http_answers_request_not_kept"),
        help: "HTTP answers and resets whose request was pending but not kept (pushed out of the queue, or uncertain after a loss of framing): their events name no request",
    },
    Counter {
        idx: S::STAT_DNS_QUERIES,
        name: "dns_queries",
        metric: Some("dns_queries"),
        help: "DNS queries seen on the DNS ports (dns.ports)",
    },
    // Exported by rcode instead: mirror_dns_responses_total{rcode} (from dns_rcodes) sums to it.
    Counter {
        idx: S::STAT_DNS_RESPONSES,
        name: "dns_responses",
        metric: None,
        help: "DNS responses seen on the DNS ports",
    },
    Counter {
        idx: S::STAT_DNS_UNMATCHED,
        name: "dns_unmatched",
        metric: Some("dns_responses_unmatched"),
        help: "DNS responses whose query was not kept (not seen, or pushed out): no answer time, no query replayed",
    },
    Counter {
        idx: S::STAT_DNS_MALFORMED,
        name: "dns_malformed",
        metric: Some("dns_malformed"),
        help: "DNS messages on a DNS port that could not be read (not DNS, a question cut or compressed, more than one question)",
    },
    Counter {
        idx: S::STAT_DNS_TRIGGERS,
        name: "dns_triggers",
        metric: Some("dns_triggers"),
        help: "DNS responses that matched a dns= rule and marked their flow",
    },
    Counter {
        idx: S::STAT_DROPS,
        name: "drops",
        metric: None,
        help: "Packets of the pods' flows the kernel dropped for a real reason (by reason: mirror_drops_total)",
    },
    Counter {
        idx: S::STAT_DROP_TRIGGERS,
        name: "drop_triggers",
        metric: Some("drop_triggers"),
        help: "Drops that matched a drop rule and marked their flow",
    },
    Counter {
        idx: S::STAT_DROP_LIMITED,
        name: "drop_limited",
        metric: Some("drop_triggers_limited"),
        help: "Drop triggers refused by their rule's rate (100 a second per rule)",
    },
    Counter {
        idx: S::STAT_DROP_PODS_FULL,
        name: "drop_pods_full",
        metric: Some("drops_unattributed"),
        help: "Drops counted by reason but not by pod: the (pod, reason) pairs held were all taken (4,096)",
    },
];

/// DNS responses by rcode (the `dns_rcodes` map), summed over CPUs: entry `r` is rcode `r`.
pub type DnsRcodeCounts = [u64; types::mirror_limits::DNS_RCODES.0 as usize];

/// The `dns_rcodes` map, summed over CPUs (all zero when never written).
pub(crate) fn read_dns_rcodes(map: &MapMut<'_>) -> Result<DnsRcodeCounts> {
    let per_cpu = map.lookup_percpu(&ZERO, MapFlags::ANY).context(|| "reading dns_rcodes".into())?;
    Ok(sum_rcodes(per_cpu.unwrap_or_default().iter().map(|b| read_plain::<types::dns_rcode_counts>(b))))
}

/// Each rcode's count, summed over the CPUs' entries.
fn sum_rcodes(per_cpu: impl Iterator<Item = types::dns_rcode_counts>) -> DnsRcodeCounts {
    let mut sum = DnsRcodeCounts::default();
    for c in per_cpu {
        for (s, v) in sum.iter_mut().zip(c.v.iter()) {
            *s += v;
        }
    }
    sum
}

/// The counter of a slot.
pub fn counter(idx: stat_idx) -> &'static Counter {
    &COUNTERS[idx.0 as usize]
}

/// Counters summed over every CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    values: Vec<u64>,
}

impl Counters {
    /// The counters of the `stats` map, summed over CPUs.
    pub(crate) fn read(stats: &MapMut<'_>) -> Result<Self> {
        let per_cpu = stats.lookup_percpu(&ZERO, MapFlags::ANY).context(|| "reading stats".into())?;
        let mut values = vec![0u64; stat_idx::STAT_MAX.0 as usize];
        for b in per_cpu.unwrap_or_default() {
            let c: types::counters = read_plain(&b);
            for (s, v) in values.iter_mut().zip(c.v.iter()) {
                *s += v;
            }
        }
        Ok(Self { values })
    }

    /// One counter.
    pub fn get(&self, idx: stat_idx) -> u64 {
        self.values.get(idx.0 as usize).copied().unwrap_or(0)
    }

    /// Every counter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        COUNTERS.iter().map(|c| (c.name, self.get(c.idx)))
    }

    /// The change since `earlier` (counters only grow).
    pub fn since(&self, earlier: &Counters) -> Counters {
        let values = self
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| v.saturating_sub(earlier.values.get(i).copied().unwrap_or(0)))
            .collect();
        Counters { values }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cover_the_enum_in_order() {
        assert_eq!(COUNTERS.len(), stat_idx::STAT_MAX.0 as usize);
        for (i, c) in COUNTERS.iter().enumerate() {
            assert_eq!(c.idx.0 as usize, i, "{}", c.name);
            assert_eq!(counter(c.idx).name, c.name);
        }
        let mut names: Vec<&str> = COUNTERS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COUNTERS.len(), "a name twice");
    }

    #[test]
    fn rcodes_are_summed_over_cpus() {
        let mut a = types::dns_rcode_counts::default();
        let mut b = types::dns_rcode_counts::default();
        (a.v[0], a.v[3], b.v[3], b.v[15]) = (10, 2, 5, 1);
        let sum = sum_rcodes([a, b].into_iter());
        assert_eq!((sum[0], sum[2], sum[3], sum[15]), (10, 0, 7, 1));
        assert_eq!(sum_rcodes(std::iter::empty()), [0; 16]);
    }
}
