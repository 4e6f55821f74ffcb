//! The classifier's per-CPU counters, summed.

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::types::{self, stat_idx};
use crate::shared::{read_plain, ZERO};

/// Name of each counter, in the order of `enum stat_idx` (checked by a test against the enum).
pub const COUNTER_NAMES: &[(stat_idx, &str)] = &[
    (stat_idx::STAT_PACKETS, "packets"),
    (stat_idx::STAT_BYTES, "bytes"),
    (stat_idx::STAT_NON_TCP, "non_tcp"),
    (stat_idx::STAT_MALFORMED, "malformed"),
    (stat_idx::STAT_DUPLICATE, "duplicate"),
    (stat_idx::STAT_HTTP_REQUESTS, "http_requests"),
    (stat_idx::STAT_HTTP_RESPONSES, "http_responses"),
    (stat_idx::STAT_TRIGGERS, "triggers"),
    (stat_idx::STAT_MIRRORED_PACKETS, "mirrored_packets"),
    (stat_idx::STAT_MIRRORED_BYTES, "mirrored_bytes"),
    (stat_idx::STAT_MIRROR_ERRORS, "mirror_errors"),
    (stat_idx::STAT_MIRROR_NO_TARGET, "mirror_no_target"),
    (stat_idx::STAT_MIRROR_ENDED, "mirror_ended"),
    (stat_idx::STAT_FLOWS_CREATED, "flows_created"),
    (stat_idx::STAT_FLOW_INSERT_FAILED, "flow_insert_failed"),
    (stat_idx::STAT_MARK_INSERT_FAILED, "mark_insert_failed"),
    (stat_idx::STAT_TIMING_INSERT_FAILED, "timing_insert_failed"),
    (stat_idx::STAT_HIST_INSERT_FAILED, "hist_insert_failed"),
    (stat_idx::STAT_RINGBUF_DROPS, "ringbuf_drops"),
    (stat_idx::STAT_HTTP_UNFRAMED, "http_unframed"),
    (stat_idx::STAT_CT_LOOKUPS, "ct_lookups"),
    (stat_idx::STAT_NAT_FLOWS, "nat_flows"),
    (stat_idx::STAT_REPLAY_KEPT, "replay_kept"),
    (stat_idx::STAT_REPLAYED, "replayed"),
    (stat_idx::STAT_REPLAY_MISSED, "replay_missed"),
    (stat_idx::STAT_REPLAY_FAILED, "replay_failed"),
    (stat_idx::STAT_RESET_TRIGGERS, "reset_triggers"),
    (stat_idx::STAT_NORESPONSE_TRIGGERS, "noresponse_triggers"),
    (stat_idx::STAT_FILTERED_OUT, "filtered_out"),
    (stat_idx::STAT_NORESPONSE_TICKS, "noresponse_ticks"),
    (stat_idx::STAT_NORESPONSE_FAILED, "noresponse_tick_failed"),
    (stat_idx::STAT_H2_CONNECTIONS, "h2_connections"),
    (stat_idx::STAT_H2_REQUESTS, "h2_requests"),
    (stat_idx::STAT_H2_RESPONSES, "h2_responses"),
    (stat_idx::STAT_H2_TRAILERS, "h2_trailers"),
    (stat_idx::STAT_H2_UNRESOLVED, "h2_unresolved"),
    (stat_idx::STAT_H2_LOST, "h2_lost"),
    (stat_idx::STAT_H2_CONTINUATION, "h2_continuation"),
    (stat_idx::STAT_H2_STREAM_MISSED, "h2_stream_missed"),
    (stat_idx::STAT_GRPC_TRIGGERS, "grpc_triggers"),
    (stat_idx::STAT_REQUEST_NOT_KEPT, "request_not_kept"),
];

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
        COUNTER_NAMES.iter().map(|(idx, name)| (*name, self.get(*idx)))
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
        assert_eq!(COUNTER_NAMES.len(), stat_idx::STAT_MAX.0 as usize);
        for (i, (idx, _)) in COUNTER_NAMES.iter().enumerate() {
            assert_eq!(idx.0 as usize, i);
        }
    }
}
