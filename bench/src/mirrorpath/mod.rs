//! The mirror path: what one copied packet costs, per sink kind and way of copying
//! (`bpf_clone_redirect` to a sink's egress or ingress, act_mirred), measured with
//! BPF_PROG_TEST_RUN and on real HTTP traffic, where the time goes (perf), and what a capture
//! on the sink sees.

pub mod perf;
pub mod report;
pub mod sinks;
pub mod testrun;
pub mod traffic;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub test_run: testrun::Plan,
    pub traffic: traffic::Plan,
}

impl Plan {
    pub const FULL: Plan = Plan {
        test_run: testrun::Plan { repeat: 1_000_000, runs: 7, perf_secs: 4 },
        traffic: traffic::Plan { rounds: 7, secs: 5, perf_secs: 5, capture_secs: 2 },
    };
    pub const QUICK: Plan = Plan {
        test_run: testrun::Plan { repeat: 100_000, runs: 3, perf_secs: 1 },
        traffic: traffic::Plan { rounds: 1, secs: 1, perf_secs: 1, capture_secs: 1 },
    };
}
