//! Status lines wherever a response begins, and nowhere else: pipelined responses in one
//! segment, 1xx interim responses followed by the final one, a status code split across
//! segments, chunked and HTTP/1.0 framing; and bodies that carry the text of a status line,
//! mid-segment or at the start of a segment, which must not trigger. A raw server writes the
//! exact byte layouts (TCP_NODELAY, scripted write boundaries); a raw client sends pipelined
//! requests in one write. Rule `status=500`; the mirror must equal what the oracle reads in
//! the client's capture, and the trigger event must name the request the 500 answered.

use std::net::SocketAddr;

use mirror_bpf::testing::require_root;
use mirror_bpf::TriggerEvent;
use mirror_e2e::capture::pcap::Packet;
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::testbed::{Recording, Testbed};
use mirror_e2e::workload::raw::{self, get, pipelined, Exchange};

/// The raw server's port.
const RAW: u16 = 8080;

const STATUS_500: &[u8] = b"HTTP/1.1 500 ";

/// One connection's traffic, recorded and checked.
struct Run {
    exchange: Exchange,
    rec: Recording,
    expected: Expected,
    events: Vec<TriggerEvent>,
    server: SocketAddr,
}

impl Run {
    /// Payloads one side sent (`from_server`, else the client), in order.
    fn segments(&self, from_server: bool) -> Vec<&[u8]> {
        let side = |p: &&Packet| if from_server { p.src == self.server } else { p.dst == self.server };
        self.rec
            .reference
            .packets
            .iter()
            .filter(side)
            .filter(|p| !p.payload.is_empty())
            .map(|p| &p.payload[..])
            .collect()
    }

    /// Payloads the server sent, in order.
    fn server_segments(&self) -> Vec<&[u8]> {
        self.segments(true)
    }

    /// Payloads the client sent, in order.
    fn client_segments(&self) -> Vec<&[u8]> {
        self.segments(false)
    }

    /// Asserts that exactly one connection triggered, on a 500 answering `method target`, and
    /// that the trigger event says so.
    #[track_caller]
    fn assert_triggered_by(&self, method: &str, target: &str) {
        let t = match &self.expected.triggered[..] {
            [t] => t,
            other => panic!("one connection must trigger: {other:?}"),
        };
        assert_eq!(t.status, 500, "{t:?}");
        assert_eq!((t.method.as_deref(), t.target.as_deref()), (Some(method), Some(target)), "{t:?}");
        let ev = match &self.events[..] {
            [ev] => ev,
            other => panic!("one trigger event expected: {other:?}"),
        };
        assert_eq!((ev.key, ev.status), (t.flow, 500), "{ev:?}");
        assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some(method), Some(target)), "{ev:?}");
    }

    /// Asserts that nothing triggered (the mirror is empty: checked with the oracle).
    #[track_caller]
    fn assert_not_triggered(&self) {
        assert!(self.expected.triggered.is_empty(), "{:?}", self.expected.triggered);
        assert!(self.events.is_empty(), "{:?}", self.events);
        assert!(self.rec.mirror.packets.is_empty(), "{} packets mirrored", self.rec.mirror.packets.len());
    }
}

/// A testbed with the raw server in the server pod, rule `status=500`.
fn bed() -> Testbed {
    Testbed::builder(&PODS).raw_server("server", RAW).rule("status=500").build()
}

/// From the client pod to the server pod's `port`, one connection: each round in one write,
/// its responses read before the next. Checks the final statuses against `finals`, then the
/// mirror, counters and marks against the oracle.
#[track_caller]
fn run_on(bed: &Testbed, v6: bool, port: u16, rounds: &[Vec<u8>], finals: &[u16]) -> Run {
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(v6), port);
    let mut exchange = None;
    let rec = bed.record("client", || {
        exchange = Some(raw::exchange(&bed.pod("client").ns, server, rounds));
    });
    let exchange = exchange.unwrap();
    assert_eq!(exchange.finals(), finals, "{exchange:?}");
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!(expected.flows.len(), 1, "one connection");
    let events = events.take();
    Run { exchange, rec, expected, events, server }
}

#[track_caller]
fn run(v6: bool, rounds: &[Vec<u8>], finals: &[u16]) -> Run {
    run_on(&bed(), v6, RAW, rounds, finals)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `/a /b /c` in one write, the three answers (200, 500, 200) in one write: the 500's status
/// line begins mid-segment.
fn pipelined_500_mid_segment(v6: bool) {
    let run = run(v6, &[pipelined(&["/a", "/b", "/c"])], &[200, 500, 200]);
    assert_eq!(run.client_segments().len(), 1, "the three requests in one segment");
    let segments = run.server_segments();
    assert_eq!(segments.len(), 1, "the three responses in one segment");
    assert!(
        find(segments[0], STATUS_500).is_some_and(|at| at > 0),
        "{:?}",
        String::from_utf8_lossy(segments[0])
    );
    run.assert_triggered_by("GET", "/b");
}

#[test]
fn pipelined_500_mid_segment_ipv4() {
    if !require_root() {
        return;
    }
    pipelined_500_mid_segment(false);
}

#[test]
fn pipelined_500_mid_segment_ipv6() {
    if !require_root() {
        return;
    }
    pipelined_500_mid_segment(true);
}

/// A 1xx and the final 500 in one segment.
fn interim_then_500(path: &str, interim: u16) {
    let run = run(false, &[get(path)], &[500]);
    assert_eq!(run.exchange.statuses(), [interim, 500]);
    let segments = run.server_segments();
    assert_eq!(segments.len(), 1, "both responses in one segment");
    assert!(segments[0].starts_with(format!("HTTP/1.1 {interim} ").as_bytes()));
    assert!(find(segments[0], STATUS_500).is_some_and(|at| at > 0));
    run.assert_triggered_by("GET", path);
}

#[test]
fn continue_then_500_in_one_segment() {
    if !require_root() {
        return;
    }
    interim_then_500("/continue", 100);
}

#[test]
fn early_hints_then_500_in_one_segment() {
    if !require_root() {
        return;
    }
    interim_then_500("/early-hints", 103);
}

/// `HTTP/1.1 5` in one segment, `00 Internal Server Error...` 50 ms later in the next: the
/// trigger is the second segment.
fn split_status_line(v6: bool) {
    let run = run(v6, &[get("/split")], &[500]);
    let segments = run.server_segments();
    assert_eq!(segments.len(), 2, "{segments:?}");
    assert_eq!(segments[0], b"HTTP/1.1 5");
    assert!(segments[1].starts_with(b"00 Internal Server Error\r\n"));
    run.assert_triggered_by("GET", "/split");
    let t = &run.expected.triggered[0];
    assert_eq!(
        run.rec.mirror.packets[0].payload, segments[1],
        "the mirror starts with the segment completing the code"
    );
    assert!(t.packets >= 2, "{t:?}");
}

#[test]
fn split_status_line_ipv4() {
    if !require_root() {
        return;
    }
    split_status_line(false);
}

#[test]
fn split_status_line_ipv6() {
    if !require_root() {
        return;
    }
    split_status_line(true);
}

#[test]
fn chunked_200_then_500_on_one_connection() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/chunked-ok"), get("/chunked-fail")], &[200, 500]);
    let r = &run.exchange.responses;
    assert_eq!((&r[0].content[..], &r[1].content[..]), (&b"hello world"[..], &b"error\n"[..]));
    run.assert_triggered_by("GET", "/chunked-fail");
}

#[test]
fn pipelined_chunked_then_500_in_one_segment() {
    if !require_root() {
        return;
    }
    let run = run(false, &[pipelined(&["/chunked-ok", "/b"])], &[200, 500]);
    assert_eq!(run.server_segments().len(), 1);
    run.assert_triggered_by("GET", "/b");
}

#[test]
fn http_1_0_500_without_length_then_close() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/http10")], &[500]);
    assert!(run.server_segments()[0].starts_with(b"HTTP/1.0 500 "));
    run.assert_triggered_by("GET", "/http10");
}

/// `HEAD /a` announces a 5-byte body it does not carry; the 500 to `/b` follows at once, in
/// the same segment.
#[test]
fn pipelined_500_after_a_head_response() {
    if !require_root() {
        return;
    }
    let round = [b"HEAD /a HTTP/1.1\r\nHost: test\r\n\r\n".to_vec(), pipelined(&["/b", "/c"])].concat();
    let run = run(false, &[round], &[200, 500, 200]);
    assert_eq!(run.server_segments().len(), 1);
    run.assert_triggered_by("GET", "/b");
}

#[test]
fn status_text_mid_segment_in_a_body_does_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/body-text")], &[200]);
    assert!(find(run.server_segments()[0], STATUS_500).is_some());
    run.assert_not_triggered();
}

/// The body goes on, after a pause, with a segment that begins with `HTTP/1.1 500 `.
#[test]
fn body_segment_beginning_with_status_text_does_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/body-segment"), get("/ok")], &[200, 200]);
    let segments = run.server_segments();
    assert!(segments.iter().skip(1).any(|s| s.starts_with(STATUS_500)), "{segments:?}");
    run.assert_not_triggered();
}

#[test]
fn chunked_body_with_status_text_does_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/chunked-body-text"), get("/ok")], &[200, 200]);
    assert!(find(run.server_segments()[0], STATUS_500).is_some());
    run.assert_not_triggered();
}

/// Chunk data begins a segment with `HTTP/1.1 500 `.
#[test]
fn chunked_body_segment_beginning_with_status_text_does_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/chunked-body-segment"), get("/ok")], &[200, 200]);
    let segments = run.server_segments();
    assert!(segments.iter().skip(1).any(|s| s.starts_with(STATUS_500)), "{segments:?}");
    run.assert_not_triggered();
}

/// An HTTP/1.0 body without a length runs to the close; a segment of it begins with the
/// status text.
#[test]
fn http_1_0_body_segment_beginning_with_status_text_does_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(false, &[get("/http10-body-segment")], &[200]);
    let segments = run.server_segments();
    assert!(segments.iter().skip(1).any(|s| s.starts_with(STATUS_500)), "{segments:?}");
    run.assert_not_triggered();
}

#[test]
fn pipelined_200s_do_not_trigger() {
    if !require_root() {
        return;
    }
    let run = run(true, &[pipelined(&["/a", "/ok", "/c"])], &[200, 200, 200]);
    run.assert_not_triggered();
}

/// nginx answering `/foo /bar /foo` sent in one write: in one segment or several, whichever
/// nginx does, the 500 triggers and names `/bar`.
#[test]
fn nginx_answering_pipelined_requests() {
    if !require_root() {
        return;
    }
    for v6 in [false, true] {
        let mut bed = bed();
        bed.nginx("server", HTTP);
        let run = run_on(&bed, v6, HTTP, &[pipelined(&["/foo", "/bar", "/foo"])], &[200, 500, 200]);
        let segments = run.server_segments();
        let mid = segments.iter().any(|s| find(s, STATUS_500).is_some_and(|at| at > 0));
        eprintln!(
            "nginx ({}) answered 3 pipelined requests in {} segment(s); the 500 {}",
            if v6 { "IPv6" } else { "IPv4" },
            segments.len(),
            if mid { "mid-segment" } else { "at a segment start" }
        );
        run.assert_triggered_by("GET", "/bar");
    }
}
