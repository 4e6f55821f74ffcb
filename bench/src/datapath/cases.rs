//! The packets measured, each on its own TCP flow so that no case changes another's state,
//! with the frames that bring its flow to the state the case needs, and the counters that
//! prove the classifier took the intended path.

use std::net::{IpAddr, SocketAddr};

use mirror_bpf::testing::consts::{
    PORT_CLIENT, PORT_HTTP, REQ_GET_BAR, RESP_200, RESP_500, V4_CLIENT, V4_SERVER,
};
use mirror_bpf::testing::packet::{tcp_flags, PacketBuilder};
use mirror_bpf::types::stat_idx;
use mirror_bpf::FlowKey;

/// Rule counts measured for the response cases; the other cases run with the first.
pub const RULE_COUNTS: [u32; 3] = [1, 100, 10_000];

/// How a case is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// One test_run repeating the packet: every iteration takes the same path.
    Repeated,
    /// A packet whose effect a repetition would undo: an HTTP message (repeated, a
    /// retransmission of what the classifier already read), a trigger (the flow is marked after
    /// the first), a flow's first packet. Each sample is one test_run of one packet, with the
    /// flow's state reset from user space around it.
    Shots { key: FlowKey, reset: Reset },
}

/// What is reset around each shot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// The flow's HTTP stream state, before the shot.
    Stream,
    /// The stream state before the shot, the mark after it.
    StreamAndMark,
    /// The whole flow (flow table, shared timing and NAT entries), before the shot.
    Flow,
}

/// Counters that must grow, and counters that must not, while the case runs.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub grows: &'static [stat_idx],
    pub stays: &'static [stat_idx],
}

/// One measured case.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    /// Rules installed (index into [`RULE_COUNTS`] picks the classifier instance).
    pub rules: u32,
    /// The packet does not trigger: the "at most 2.5x the empty program" bar applies.
    pub quiet: bool,
    /// Frames run once before measuring, to create the flow state.
    pub prime: Vec<Vec<u8>>,
    pub frame: Vec<u8>,
    pub timing: Timing,
    pub expect: Expect,
}

/// Failures that no case may cause: checked beside each case's own [`Expect::stays`].
pub const NO_FAILURES: [stat_idx; 5] = [
    stat_idx::STAT_MALFORMED,
    stat_idx::STAT_FLOW_INSERT_FAILED,
    stat_idx::STAT_MIRROR_ERRORS,
    stat_idx::STAT_MIRROR_NO_TARGET,
    stat_idx::STAT_RINGBUF_DROPS,
];

/// A client-to-server TCP flow; `n` makes its client port unique.
struct Flow(u16);

impl Flow {
    fn client(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(V4_CLIENT), PORT_CLIENT + self.0)
    }

    fn to_server(&self, flags: u8, payload: &[u8]) -> Vec<u8> {
        PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
            .tcp(self.client().port(), PORT_HTTP, flags)
            .payload(payload)
            .build()
    }

    fn to_client(&self, payload: &[u8]) -> Vec<u8> {
        PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
            .tcp(PORT_HTTP, self.client().port(), tcp_flags::ACK | tcp_flags::PSH)
            .payload(payload)
            .build()
    }

    fn ack(&self) -> Vec<u8> {
        self.to_server(tcp_flags::ACK, &[])
    }

    fn syn(&self) -> Vec<u8> {
        self.to_server(tcp_flags::SYN, &[])
    }

    fn syn_ack(&self) -> Vec<u8> {
        PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
            .tcp(PORT_HTTP, self.client().port(), tcp_flags::SYN | tcp_flags::ACK)
            .build()
    }

    fn get(&self) -> Vec<u8> {
        self.to_server(tcp_flags::ACK | tcp_flags::PSH, REQ_GET_BAR)
    }

    fn key(&self) -> FlowKey {
        FlowKey::new(self.client(), SocketAddr::new(IpAddr::V4(V4_SERVER), PORT_HTTP), 6)
    }
}

/// Every case, in report order.
pub fn all() -> Vec<Case> {
    let one = RULE_COUNTS[0];
    let mut cases = vec![
        Case {
            name: "UDP (non-TCP)",
            rules: one,
            quiet: true,
            prime: vec![],
            frame: PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(PORT_CLIENT, 53).payload(&[0; 32]).build(),
            timing: Timing::Repeated,
            expect: Expect { grows: &[stat_idx::STAT_NON_TCP], stays: &[stat_idx::STAT_FLOWS_CREATED] },
        },
        Case {
            name: "TCP ACK, no payload",
            rules: one,
            quiet: true,
            prime: vec![Flow(1).ack()],
            frame: Flow(1).ack(),
            timing: Timing::Repeated,
            expect: Expect {
                grows: &[stat_idx::STAT_PACKETS],
                stays: &[
                    stat_idx::STAT_FLOWS_CREATED,
                    stat_idx::STAT_HTTP_REQUESTS,
                    stat_idx::STAT_HTTP_RESPONSES,
                ],
            },
        },
        Case {
            name: "HTTP GET request",
            rules: one,
            quiet: true,
            prime: vec![Flow(2).get()],
            frame: Flow(2).get(),
            timing: Timing::Shots { key: Flow(2).key(), reset: Reset::Stream },
            expect: Expect {
                grows: &[stat_idx::STAT_HTTP_REQUESTS],
                stays: &[stat_idx::STAT_FLOWS_CREATED, stat_idx::STAT_TIMING_INSERT_FAILED],
            },
        },
    ];
    for (i, &rules) in RULE_COUNTS.iter().enumerate() {
        let flow = Flow(10 + i as u16);
        cases.push(Case {
            name: "HTTP 200 response, no rule",
            rules,
            quiet: true,
            prime: vec![flow.get()],
            frame: flow.to_client(RESP_200),
            timing: Timing::Shots { key: flow.key(), reset: Reset::Stream },
            expect: Expect {
                grows: &[stat_idx::STAT_HTTP_RESPONSES],
                stays: &[stat_idx::STAT_FLOWS_CREATED, stat_idx::STAT_TRIGGERS],
            },
        });
    }
    for (i, &rules) in RULE_COUNTS.iter().enumerate() {
        let flow = Flow(20 + i as u16);
        cases.push(Case {
            name: "HTTP 500 response, trigger",
            rules,
            quiet: false,
            prime: vec![flow.get()],
            frame: flow.to_client(RESP_500),
            timing: Timing::Shots { key: flow.key(), reset: Reset::StreamAndMark },
            expect: Expect {
                grows: &[stat_idx::STAT_TRIGGERS, stat_idx::STAT_MIRRORED_PACKETS],
                stays: &[stat_idx::STAT_FLOWS_CREATED, stat_idx::STAT_MARK_INSERT_FAILED],
            },
        });
    }
    // A new flow: on a SYN nobody asks conntrack (it knows nothing yet); a flow first seen on
    // any other packet (a SYN/ACK on the server's side of a Service) asks it. Here the lookup
    // misses (no conntrack entry in the benchmark's namespace), as it does for untranslated
    // connections.
    cases.push(Case {
        name: "TCP SYN, new flow",
        rules: one,
        quiet: true,
        prime: vec![],
        frame: Flow(4).syn(),
        timing: Timing::Shots { key: Flow(4).key(), reset: Reset::Flow },
        expect: Expect { grows: &[stat_idx::STAT_FLOWS_CREATED], stays: &[stat_idx::STAT_CT_LOOKUPS] },
    });
    cases.push(Case {
        name: "TCP SYN/ACK, new flow (conntrack asked)",
        rules: one,
        quiet: true,
        prime: vec![],
        frame: Flow(5).syn_ack(),
        timing: Timing::Shots { key: Flow(5).key(), reset: Reset::Flow },
        expect: Expect { grows: &[stat_idx::STAT_FLOWS_CREATED, stat_idx::STAT_CT_LOOKUPS], stays: &[] },
    });
    let marked = Flow(3);
    cases.push(Case {
        name: "TCP ACK, mirrored flow (clone to veth)",
        rules: one,
        quiet: false,
        prime: vec![marked.get(), marked.to_client(RESP_500)],
        frame: marked.ack(),
        timing: Timing::Repeated,
        expect: Expect {
            grows: &[stat_idx::STAT_MIRRORED_PACKETS],
            stays: &[stat_idx::STAT_FLOWS_CREATED, stat_idx::STAT_TRIGGERS, stat_idx::STAT_MIRROR_ENDED],
        },
    });
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_are_distinct_and_response_cases_cover_every_rule_count() {
        let cases = all();
        let mut frames: Vec<_> = cases.iter().map(|c| &c.frame).collect();
        frames.sort();
        frames.dedup();
        assert_eq!(frames.len(), cases.len());
        for name in ["HTTP 200 response, no rule", "HTTP 500 response, trigger"] {
            let rules: Vec<u32> = cases.iter().filter(|c| c.name == name).map(|c| c.rules).collect();
            assert_eq!(rules, RULE_COUNTS);
        }
    }
}
