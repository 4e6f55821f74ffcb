//! The cpu group's sampler: every second while the group is on, the share of each CPU spent
//! in the network stack over the last second, from the tracing programs' CPU-time counters.

use std::time::{Duration, Instant};

use mirror_bpf::{NetCpuTime, TraceGroup, Tracing};

use crate::views::CpuShareView;

/// The last sample and the shares computed from the one before.
#[derive(Default)]
pub(super) struct CpuSampler {
    last: Option<(Instant, Vec<NetCpuTime>)>,
    shares: Vec<CpuShareView>,
}

impl CpuSampler {
    /// Forgets everything (the group was switched).
    pub(super) fn reset(&mut self) {
        self.last = None;
        self.shares.clear();
    }

    /// The shares of the last second (empty: the group is off, or not two samples yet).
    pub(super) fn shares(&self) -> &[CpuShareView] {
        &self.shares
    }

    /// Takes a sample if the cpu group is on and a second has passed since the last one.
    pub(super) fn sample(&mut self, t: &Tracing) {
        if !t.is_on(TraceGroup::Cpu) {
            return;
        }
        if self.last.as_ref().is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let Ok(now) = t.cpu_times() else { return };
        let at = Instant::now();
        if let Some((then, before)) = &self.last {
            let wall = at.duration_since(*then).as_nanos().max(1) as f64;
            let share = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall;
            self.shares = now
                .iter()
                .zip(before)
                .enumerate()
                .map(|(cpu, (n, b))| CpuShareView {
                    cpu: cpu as u32,
                    syscall: share(n.syscall_ns, b.syscall_ns),
                    softirq_rx: share(n.softirq_rx_ns, b.softirq_rx_ns),
                    softirq_tx: share(n.softirq_tx_ns, b.softirq_tx_ns),
                    syscall_seconds_total: n.syscall_ns as f64 / 1e9,
                    softirq_rx_seconds_total: n.softirq_rx_ns as f64 / 1e9,
                    softirq_tx_seconds_total: n.softirq_tx_ns as f64 / 1e9,
                })
                .collect();
        }
        self.last = Some((at, now));
    }
}
