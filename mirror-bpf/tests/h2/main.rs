//! HTTP/2 cleartext and gRPC in the classifier, with BPF_PROG_TEST_RUN: a direction found
//! speaking HTTP/2 (prior knowledge, Upgrade: h2c, or by its frames where the connection began
//! before it was followed), frames followed by sequence number across segments, header blocks
//! read with HPACK (static and dynamic tables, raw and Huffman strings), :status and
//! grpc-status matched against the rules, the request filters on :method, :path and
//! :authority, and what a flow that is not HTTP/2 costs. Needs root (fails without it in CI).

use std::time::Duration;

use libbpf_rs::MapCore;
use mirror_bpf::event::HttpProto;
use mirror_bpf::testing::h2::{self, static_index as st, Block, Conn, Headers, Indexing, Name, Text};
use mirror_bpf::testing::{self, consts::PORT_HTTP, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{Counters, Datapath, DatapathOptions, EventRing, RuleId, TriggerEvent, TriggerKind};

type Dp = Datapath<'static>;

/// The classifier with some rules, and its events as they come.
struct Bed {
    dp: Dp,
    ring: EventRing<'static>,
    events: std::sync::Arc<std::sync::Mutex<Vec<TriggerEvent>>>,
    rules: Vec<RuleId>,
}

impl Bed {
    fn new(rules: &[&str]) -> Option<Bed> {
        if !testing::require_root() {
            return None;
        }
        // What the classifier learns of a direction per CPU stays in one CPU's slot.
        testing::pin_thread(0).expect("pinning the test to CPU 0");
        let mut dp = testing::load(&DatapathOptions::default());
        let rules = rules.iter().map(|r| dp.add_rule(r.parse().unwrap()).unwrap()).collect();
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = events.clone();
        let ring = dp.events(move |e| sink.lock().unwrap().push(e)).unwrap();
        Some(Bed { dp, ring, events, rules })
    }

    /// Runs `frame` through the ingress program: it passes untouched, "continue"; the counters'
    /// change.
    fn run(&self, frame: &[u8]) -> Counters {
        let before = self.dp.counters().unwrap();
        let (ret, out) = testing::run(&self.dp.skel().progs.tc_ingress_mirror, frame, SkbContext::default());
        assert_eq!(ret, VERDICT_CONTINUE, "verdict must always be 'continue'");
        assert_eq!(out, frame, "the frame must pass untouched");
        self.dp.counters().unwrap().since(&before)
    }

    /// Runs each frame in turn; the counters' change over all of them.
    fn run_all(&self, frames: &[Vec<u8>]) -> Counters {
        let before = self.dp.counters().unwrap();
        for f in frames {
            self.run(f);
        }
        self.dp.counters().unwrap().since(&before)
    }

    fn take(&self) -> Vec<TriggerEvent> {
        Datapath::poll_events(&self.ring, Duration::from_millis(50)).unwrap();
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

/// The HTTP/2 counters, the triggers and the requests the filters turned down.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct H2 {
    connections: u64,
    requests: u64,
    responses: u64,
    trailers: u64,
    unresolved: u64,
    lost: u64,
    continuation: u64,
    stream_missed: u64,
    grpc_triggers: u64,
    triggers: u64,
    filtered_out: u64,
}

fn h2c(c: &Counters) -> H2 {
    H2 {
        connections: c.get(S::STAT_H2_CONNECTIONS),
        requests: c.get(S::STAT_H2_REQUESTS),
        responses: c.get(S::STAT_H2_RESPONSES),
        trailers: c.get(S::STAT_H2_TRAILERS),
        unresolved: c.get(S::STAT_H2_UNRESOLVED),
        lost: c.get(S::STAT_H2_LOST),
        continuation: c.get(S::STAT_H2_CONTINUATION),
        stream_missed: c.get(S::STAT_H2_STREAM_MISSED),
        grpc_triggers: c.get(S::STAT_GRPC_TRIGGERS),
        triggers: c.get(S::STAT_TRIGGERS),
        filtered_out: c.get(S::STAT_FILTERED_OUT),
    }
}

/// What an event says of its trigger and request: kind, status (gRPC: the code), stream,
/// method, target, authority.
type Said<'a> = (TriggerKind, u16, Option<u32>, Option<&'a str>, Option<&'a str>, Option<&'a str>);

fn said(e: &TriggerEvent) -> Said<'_> {
    (e.kind, e.status, e.stream, e.method.as_deref(), e.target.as_deref(), e.authority.as_deref())
}

/// The client's preface and SETTINGS followed by `then` (its first requests) in one segment.
fn client_opens(c: &mut Conn, then: &[u8]) -> Vec<u8> {
    c.client(&[h2::PREFACE, &h2::client_settings(), &h2::window_update(0, 15 << 20), then].concat())
}

/// The server's SETTINGS and its acknowledgement of the client's.
fn server_opens(c: &mut Conn) -> Vec<u8> {
    c.server(&[h2::server_settings(), h2::settings_ack()].concat())
}

/// A connection opened with prior knowledge and a request on `stream` for each of `requests`
/// (their HEADERS end their streams): its first two segments, run, counted as two directions
/// and as many requests.
fn open(bed: &Bed, c: &mut Conn, requests: &[(u32, Block)]) {
    let heads: Vec<u8> =
        requests.iter().flat_map(|(s, b)| Headers::new(*s, b).end_stream().build()).collect();
    let d = bed.run_all(&[client_opens(c, &heads), server_opens(c)]);
    let want = H2 { connections: 2, requests: requests.len() as u64, ..H2::default() };
    assert_eq!(h2c(&d), want, "opening {}", c.cport);
}

/// A response block of `status` and a few fields encoders add (content-type inserted, a
/// date not).
fn response(status: u16) -> Block {
    Block::new()
        .status(status)
        .literal(Indexing::Incremental, Name::Index(st::CONTENT_TYPE), Text::Raw("application/json"))
        .literal(Indexing::Without, Name::Index(st::DATE), Text::Huffman("Wed, 25 Nov 2026 08:00:00 GMT"))
}

mod discovery;
mod filters;
mod frames;
mod hpack;
