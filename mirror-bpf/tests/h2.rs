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

/// The literal name of grpc-status the classifier compares Huffman-coded (hpack.h) is the
/// Huffman code of "grpc-status", as the crate the fixtures use encodes it.
#[test]
fn the_huffman_name_of_grpc_status_is_the_one_the_classifier_compares() {
    assert_eq!(h2::huffman(b"grpc-status"), [0x9a, 0xca, 0xc8, 0xb2, 0x12, 0x34, 0xda, 0x8f]);
    // So are the pseudo-headers' names (hpack_literal_name, its words read little-endian).
    assert_eq!(h2::huffman(b":path"), 0x3fd3_58b9_u32.to_le_bytes());
    assert_eq!(h2::huffman(b":method"), 0xe4_3953_49b9_u64.to_le_bytes()[..5]);
    assert_eq!(h2::huffman(b":status"), 0xa3_368d_84b8_u64.to_le_bytes()[..5]);
    assert_eq!(h2::huffman(b":authority"), 0x7f7d_32ec_3953_3bb8_u64.to_le_bytes());
    // And the short values used below: "502" is two whole bytes (16 bits), "503" and "404"
    // 17 bits, padded with 7 bits of EOS.
    assert_eq!(h2::huffman(b"502"), [0x6c, 0x02]);
    assert_eq!(h2::huffman(b"503"), [0x6c, 0x0c, 0xff]);
    assert_eq!(h2::huffman(b"404"), [0x68, 0x0d, 0x7f]);
}

/// Case 1: prior knowledge. The client's preface, SETTINGS and first request in one segment;
/// a `:status 500` by its static index (0x8e) triggers `status=500` with its stream's request
/// (stream id, method, path, :authority, the segment that carried it); a `:status 200` does not.
#[test]
fn prior_knowledge_a_static_500_triggers_with_its_streams_request() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47100, PORT_HTTP);
    let first = c.client(
        &[
            h2::PREFACE,
            &h2::client_settings(),
            &Headers::new(1, &Block::request("GET", "/health", "api.example")).end_stream().build(),
        ]
        .concat(),
    );
    let d = bed.run(&first);
    assert_eq!(h2c(&d), H2 { connections: 1, requests: 1, ..H2::default() });
    let d = bed.run(&server_opens(&mut c));
    assert_eq!(h2c(&d), H2 { connections: 1, ..H2::default() });
    bed.run(&c.client(&h2::settings_ack()));
    // The second request: a gRPC-style POST with its :authority carrying a port, and a body.
    let req: Vec<u8> = [
        h2::headers(3, &Block::request("POST", "/pkg.Svc/Method", "API.example:8080")),
        h2::data(3, true, &h2::grpc_message(b"\x0a\x03abc")),
    ]
    .concat();
    let second = c.client(&req);
    let d = bed.run(&second);
    assert_eq!(h2c(&d), H2 { requests: 1, ..H2::default() });
    assert_eq!(d.get(S::STAT_REPLAY_KEPT), 1, "{d:?}");
    // Stream 1: 200 (static 0x88), no trigger.
    let ok = c.server(&[h2::headers(1, &Block::new().indexed(8)), h2::data(1, true, b"ok")].concat());
    let d = bed.run(&ok);
    assert_eq!(h2c(&d), H2 { responses: 1, ..H2::default() });
    assert!(bed.take().is_empty());
    // Stream 3: 500 (static 0x8e).
    let error = c.server(&h2::headers(3, &Block::new().indexed(st::STATUS_500)));
    assert_eq!(&error[error.len() - 10..], [0, 0, 1, 1, 4, 0, 0, 0, 3, 0x8e]);
    let d = bed.run(&error);
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(
        said(e),
        (TriggerKind::Status, 500, Some(3), Some("POST"), Some("/pkg.Svc/Method"), Some("api.example"))
    );
    assert_eq!((e.rule_id, e.key, e.proto), (bed.rules[0], c.key(), Some(HttpProto::Http2)));
    assert!(e.request_to_response.is_some_and(|t| t < Duration::from_secs(5)), "{e:?}");
    let kept = e.request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
    assert_eq!(kept.as_deref(), Some(&req[..]), "the replayed request is the segment of stream 3's HEADERS");
    let mark = bed.dp.mark(&c.key()).unwrap().expect("the flow is marked");
    assert_eq!((mark.kind, mark.status, mark.rule_id), (TriggerKind::Status, 500, bed.rules[0]));
    // The rest of the flow is mirrored (no sink here: counted as such).
    let d = bed.run(&c.server(&h2::data(3, true, b"{\"error\":1}")));
    assert_eq!(d.get(S::STAT_MIRROR_NO_TARGET), 1, "{d:?}");

    // Another connection where every answer is a 200: nothing.
    let mut c = Conn::new(47101, PORT_HTTP);
    open(
        &bed,
        &mut c,
        &[(1, Block::request("GET", "/", "web.example")), (3, Block::request("GET", "/a", "web.example"))],
    );
    let d = bed.run(
        &c.server(
            &[
                h2::headers(3, &response(200)),
                h2::data(3, true, b"{}"),
                h2::headers(1, &Block::new().indexed(8)),
                h2::data(1, true, b"{}"),
            ]
            .concat(),
        ),
    );
    assert_eq!(h2c(&d), H2 { responses: 2, ..H2::default() });
    assert!(bed.take().is_empty());
    assert_eq!(bed.dp.mark(&c.key()).unwrap(), None);
    let total = bed.dp.counters().unwrap();
    assert_eq!(
        h2c(&total),
        H2 { connections: 4, requests: 4, responses: 4, triggers: 1, ..H2::default() },
        "{total:?}"
    );
    assert_eq!(total.get(S::STAT_HTTP_REQUESTS) + total.get(S::STAT_HTTP_RESPONSES), 0, "no HTTP/1.x seen");
}

/// Case 2: `:status` as a literal (static name index 8) raw or Huffman-coded, with or without
/// indexing or never indexed, and from the dynamic table once inserted; a status no rule
/// covers does not trigger; a value that is no number is no status.
#[test]
fn literal_statuses_raw_huffman_and_from_the_dynamic_table() {
    let Some(bed) = Bed::new(&["status=5xx", "status=404 path=/missing"]) else { return };
    let (five, missing) = (bed.rules[0], bed.rules[1]);
    let name = Name::Index(st::STATUS_200);
    /// A connection's client port, its request's path, the answer's :status fields, their
    /// first bytes, and the rule (and status) it triggers.
    type Case<'a> = (u16, &'a str, Block, &'a [u8], Option<(RuleId, u16)>);
    let cases: [Case; 7] = [
        (
            47200,
            "/a",
            Block::new().literal(Indexing::Without, name, Text::Raw("503")),
            b"\x08\x03503",
            Some((five, 503)),
        ),
        (
            47201,
            "/a",
            Block::new().literal(Indexing::Never, name, Text::Huffman("503")),
            b"\x18\x83\x6c\x0c\xff",
            Some((five, 503)),
        ),
        (
            47202,
            "/a",
            Block::new().literal(Indexing::Incremental, name, Text::Huffman("502")),
            b"\x48\x82\x6c\x02",
            Some((five, 502)),
        ),
        (
            47203,
            "/a",
            Block::new().literal(Indexing::Incremental, name, Text::Raw("599")),
            b"\x48\x03599",
            Some((five, 599)),
        ),
        // 404 Huffman-coded (padded with EOS bits): read, turned down by the path filter.
        (
            47204,
            "/other",
            Block::new().literal(Indexing::Never, name, Text::Huffman("404")),
            b"\x18\x83",
            None,
        ),
        (
            47205,
            "/missing",
            Block::new().literal(Indexing::Without, name, Text::Huffman("404")),
            b"\x08\x83",
            Some((missing, 404)),
        ),
        // 201: covered by no rule.
        (47206, "/a", Block::new().literal(Indexing::Without, name, Text::Raw("201")), b"\x08\x03201", None),
    ];
    let mut want = Vec::new();
    for (port, path, block, head, rule) in cases {
        assert!(block.bytes().starts_with(head), "{port}: {:x?}", block.bytes());
        let mut c = Conn::new(port, PORT_HTTP);
        open(&bed, &mut c, &[(1, Block::request("GET", path, "h.example"))]);
        let block = block.literal(Indexing::Without, Name::Index(st::SERVER), Text::Raw("test"));
        let d = bed.run(&c.server(&Headers::new(1, &block).end_stream().build()));
        let filtered = u64::from(path == "/other");
        assert_eq!(
            h2c(&d),
            H2 { responses: 1, triggers: u64::from(rule.is_some()), filtered_out: filtered, ..H2::default() },
            "{port}"
        );
        want.extend(rule.map(|(id, status)| (port, id, status)));
    }
    let got: Vec<(u16, RuleId, u16)> =
        bed.take().iter().map(|e| (e.key.lo.port(), e.rule_id, e.status)).collect();
    assert_eq!(got, want);

    // Not a status: "5x3", "5030", an empty value: no response at all.
    let mut c = Conn::new(47210, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", "/", "h.example"))]);
    for (i, v) in ["5x3", "5030", ""].iter().enumerate() {
        let block = Block::new().literal(Indexing::Without, name, Text::Raw(v));
        let d = bed.run(&c.server(&h2::headers(1 + 2 * i as u32, &block)));
        assert_eq!(h2c(&d), H2::default(), "{v:?}");
    }

    // An interim answer (103, a literal) is no response; the final one after it is.
    let mut c = Conn::new(47212, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", "/a", "h.example"))]);
    let early = Block::new().literal(Indexing::Without, name, Text::Raw("103")).literal(
        Indexing::Without,
        Name::Literal(Text::Raw("link")),
        Text::Raw("</s.css>; rel=preload"),
    );
    assert_eq!(h2c(&bed.run(&c.server(&h2::headers(1, &early)))), H2::default());
    let d = bed.run(&c.server(&h2::trailers(1, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.iter().map(|e| (e.status, e.stream)).collect::<Vec<_>>(), [(500, Some(1))]);

    // From the dynamic table: a 404 inserted for /other (turned down), then named by its
    // index (63: a content-type was inserted after it) for /missing.
    let mut c = Conn::new(47211, PORT_HTTP);
    open(
        &bed,
        &mut c,
        &[
            (1, Block::request("GET", "/other", "h.example")),
            (3, Block::request("GET", "/missing", "h.example")),
        ],
    );
    let first = Block::new().literal(Indexing::Incremental, name, Text::Raw("404")).literal(
        Indexing::Incremental,
        Name::Index(st::CONTENT_TYPE),
        Text::Raw("text/plain"),
    );
    let d = bed.run(&c.server(&Headers::new(1, &first).end_stream().build()));
    assert_eq!(h2c(&d), H2 { responses: 1, filtered_out: 1, ..H2::default() });
    let d = bed.run(&c.server(&Headers::new(3, &Block::new().indexed(63).indexed(62)).end_stream().build()));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 404, Some(3), Some("GET"), Some("/missing"), Some("h.example"))
    );
    assert_eq!(events[0].rule_id, missing);
}

/// Case 3: gRPC. Trailers carry `grpc-status`: first `0` inserted with a literal Huffman name,
/// then referred to by its dynamic index (no trigger under `grpc-status=internal`); then `13`
/// as a literal under the dynamic entry's name: a trigger of kind Grpc, status 13; a later
/// call's trailers naming `grpc-status: 13` by its index find the flow marked already: a
/// flow is marked once.
#[test]
fn grpc_status_in_trailers_literal_then_from_the_dynamic_table() {
    let Some(bed) = Bed::new(&["grpc-status=internal"]) else { return };
    let mut c = Conn::new(47300, PORT_HTTP);
    let path = "/pkg.Svc/Method";
    let call = |c: &mut Conn, stream: u32| {
        c.client(
            &[
                h2::headers(stream, &Block::grpc_request(path, "grpc.example")),
                h2::data(stream, true, &h2::grpc_message(b"\x08\x01")),
            ]
            .concat(),
        )
    };
    let first = client_opens(&mut c, &[]);
    let d = bed.run_all(&[first, server_opens(&mut c), call(&mut c, 1)]);
    assert_eq!(h2c(&d), H2 { connections: 2, requests: 1, ..H2::default() });
    // The answer: :status 200, content-type inserted (insertion 0), a message, trailers with
    // grpc-status: 0 inserted (insertion 1) under a Huffman-coded literal name.
    let ok_trailers = Block::new().literal(
        Indexing::Incremental,
        Name::Literal(Text::Huffman("grpc-status")),
        Text::Raw("0"),
    );
    assert_eq!(&ok_trailers.bytes()[..2], [0x40, 0x88]);
    let answer = |c: &mut Conn, stream: u32, head: &Block, trailers: &Block| {
        c.server(
            &[
                h2::headers(stream, head),
                h2::data(stream, false, &h2::grpc_message(b"\x08\x02")),
                h2::trailers(stream, trailers),
            ]
            .concat(),
        )
    };
    let head = Block::new().indexed(8).grpc_content_type();
    let d = bed.run(&answer(&mut c, 1, &head, &ok_trailers));
    assert_eq!(h2c(&d), H2 { responses: 1, trailers: 1, ..H2::default() });
    // The second call: content-type (63) and grpc-status: 0 (62) by index.
    let head = Block::new().indexed(8).indexed(63);
    let d = bed.run_all(&[call(&mut c, 3), answer(&mut c, 3, &head, &Block::new().indexed(62))]);
    assert_eq!(h2c(&d), H2 { requests: 1, responses: 1, trailers: 1, ..H2::default() });
    assert!(bed.take().is_empty());
    // The third: grpc-status 13, a literal under the name of entry 62 (grpc-status), inserted.
    let failed = Block::new().literal(Indexing::Incremental, Name::Index(62), Text::Raw("13")).literal(
        Indexing::Without,
        Name::Literal(Text::Raw("grpc-message")),
        Text::Raw("boom"),
    );
    assert_eq!(&failed.bytes()[..4], b"\x7e\x0213");
    let d = bed.run_all(&[call(&mut c, 5), answer(&mut c, 5, &head, &failed)]);
    assert_eq!(
        h2c(&d),
        H2 { requests: 1, responses: 1, trailers: 1, grpc_triggers: 1, triggers: 1, ..H2::default() }
    );
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(said(e), (TriggerKind::Grpc, 13, Some(5), Some("POST"), Some(path), Some("grpc.example")));
    assert_eq!(
        (e.grpc_status_name(), e.proto, e.rule_id),
        (Some("INTERNAL"), Some(HttpProto::Http2), bed.rules[0])
    );
    let mark = bed.dp.mark(&c.key()).unwrap().expect("marked");
    assert_eq!((mark.kind, mark.status), (TriggerKind::Grpc, 13));
    // The fourth: grpc-status 13 again, by its index (62; content-type is 64 now): read,
    // matched, but the flow is marked already: no second trigger; its packets are mirrored.
    let head = Block::new().indexed(8).indexed(64);
    let d = bed.run_all(&[call(&mut c, 7), answer(&mut c, 7, &head, &Block::new().indexed(62))]);
    assert_eq!(h2c(&d), H2 { requests: 1, responses: 1, trailers: 1, ..H2::default() });
    assert_eq!(d.get(S::STAT_MIRROR_NO_TARGET), 2, "{d:?}");
    assert!(bed.take().is_empty());
    let total = bed.dp.counters().unwrap();
    assert_eq!(
        h2c(&total),
        H2 {
            connections: 2,
            requests: 4,
            responses: 4,
            trailers: 4,
            grpc_triggers: 1,
            triggers: 1,
            ..H2::default()
        }
    );

    // A trailers-only answer (HEADERS with :status 200, grpc-status 13 Huffman-coded, never
    // indexed, END_STREAM) on another connection: a trigger.
    let mut c = Conn::new(47301, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::grpc_request("/pkg.Svc/Other", "grpc.example"))]);
    let only = Block::new().indexed(8).grpc_content_type().grpc_status(Indexing::Never, true, 13);
    let d = bed.run(&c.server(&h2::trailers(1, &only)));
    assert_eq!(h2c(&d), H2 { responses: 1, trailers: 1, grpc_triggers: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Grpc, 13, Some(1), Some("POST"), Some("/pkg.Svc/Other"), Some("grpc.example"))
    );
}

/// Case 4a: a frame header split across segments (4 bytes then 5, 8 then 1), a header
/// block split across two segments and across three, and a frame header that ends a segment
/// with its block in the next: each read whole where its frame ends.
#[test]
fn headers_split_across_segments_are_read_where_they_end() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    // A block whose :status comes last, after 60 bytes of other fields.
    let block = Block::new()
        .literal(Indexing::Incremental, Name::Index(st::CONTENT_TYPE), Text::Raw("application/json"))
        .literal(Indexing::Without, Name::Index(st::SERVER), Text::Raw("a-server-with-a-long-name/1.2.3"))
        .indexed(st::STATUS_500);
    let frame = h2::headers(5, &block);
    let lead = h2::window_update(0, 1 << 16);
    // (client port, where the segments of lead + frame are cut)
    let cuts: [(u16, &[usize]); 5] = [
        // The frame header: 4 bytes, then 5 and the block.
        (47400, &[13 + 4]),
        // The frame header: 8 bytes, then 1 and the block.
        (47401, &[13 + 8]),
        // The block: 3 bytes, then the rest.
        (47402, &[13 + 9 + 3]),
        // The frame header ends the segment, its block in the next.
        (47403, &[13 + 9]),
        // The block over three segments.
        (47404, &[13 + 9 + 10, 20]),
    ];
    for (port, cut) in cuts {
        let mut c = Conn::new(port, PORT_HTTP);
        open(&bed, &mut c, &[(5, Block::request("GET", "/split", "s.example"))]);
        let segs = c.split(false, &[lead.clone(), frame.clone()].concat(), cut);
        for (i, s) in segs.iter().enumerate() {
            let d = bed.run(s);
            let last = i + 1 == segs.len();
            assert_eq!(
                h2c(&d),
                H2 { responses: u64::from(last), triggers: u64::from(last), ..H2::default() },
                "{port}: segment {i}"
            );
        }
        let events = bed.take();
        assert_eq!(events.len(), 1, "{port}: {events:?}");
        assert_eq!(
            said(&events[0]),
            (TriggerKind::Status, 500, Some(5), Some("GET"), Some("/split"), Some("s.example"))
        );
        // The content-type it inserted was counted: the next block's 62 resolves (no status:
        // nothing to say, nothing unresolved).
        let d = bed.run(&c.server(&h2::headers(7, &Block::new().indexed(62))));
        assert_eq!(h2c(&d), H2::default(), "{port}");
    }
}

/// Case 4b: many streams' frames interleaved in one segment: 20 requests in one segment, 20
/// responses with their DATA interleaved in another, the 7th a 500: one trigger, for its
/// stream (13), with its request.
#[test]
fn many_streams_interleaved_in_one_segment() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47410, PORT_HTTP);
    let streams: Vec<u32> = (0..20).map(|i| 1 + 2 * i).collect();
    let requests: Vec<(u32, Block)> =
        streams.iter().map(|s| (*s, Block::request("GET", &format!("/item/{s}"), "many.example"))).collect();
    open(&bed, &mut c, &requests);
    let mut answers = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        let status = if i == 6 { 500 } else { 200 };
        answers.extend(h2::headers(*s, &Block::new().status(status)));
        if i > 0 {
            answers.extend(h2::data(streams[i - 1], true, b"{\"ok\":true}"));
        }
    }
    answers.extend(h2::data(streams[19], true, b"{}"));
    let d = bed.run(&c.server(&answers));
    assert_eq!(h2c(&d), H2 { responses: 20, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 500, Some(13), Some("GET"), Some("/item/13"), Some("many.example"))
    );

    // More frames in one segment than the classifier looks at (64): the framing is lost there
    // (counted), and found again at the next segment that is a chain of frames.
    let mut c = Conn::new(47411, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", "/", "many.example"))]);
    let updates: Vec<u8> = (0..70).flat_map(|_| h2::window_update(0, 1)).collect();
    let d = bed.run(&c.server(&updates));
    assert_eq!(h2c(&d), H2 { lost: 1, ..H2::default() });
    let d = bed.run(&c.server(&h2::headers(1, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { connections: 1, responses: 1, triggers: 1, ..H2::default() });
    assert_eq!(bed.take().iter().map(|e| e.stream).collect::<Vec<_>>(), [Some(1)]);
}

/// Case 4c: a DATA frame of 40,000 bytes across 29 segments, its payload made of what would be
/// HEADERS frames of a 500: the segments inside it are not parsed (nothing counted, nothing
/// lost), and the HEADERS after it, in its last segment, is.
#[test]
fn a_large_data_frame_is_skipped_by_its_length() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47420, PORT_HTTP);
    open(
        &bed,
        &mut c,
        &[
            (1, Block::request("GET", "/big", "big.example")),
            (3, Block::request("GET", "/next", "big.example")),
        ],
    );
    let fake = h2::headers(1, &Block::new().indexed(st::STATUS_500));
    assert_eq!(fake.len(), 10);
    let body: Vec<u8> = fake.iter().copied().cycle().take(40_000).collect();
    // The response's HEADERS and the DATA frame's header end the first segment; 28 segments
    // of 1,400 bytes each start where a fake frame does; the last has the rest and stream 3's
    // 500.
    let data = h2::data(1, true, &body);
    let head = [h2::headers(1, &Block::new().indexed(8)), data[..9].to_vec()].concat();
    let d = bed.run(&c.server(&head));
    assert_eq!(h2c(&d), H2 { responses: 1, ..H2::default() });
    let rest = [&data[9..], &h2::headers(3, &Block::new().indexed(st::STATUS_500))[..]].concat();
    let segs = c.split(false, &rest, &[1400; 28]);
    assert_eq!(segs.len(), 29);
    for (i, s) in segs.iter().enumerate() {
        let d = bed.run(s);
        let last = i + 1 == segs.len();
        assert_eq!(
            h2c(&d),
            H2 { responses: u64::from(last), triggers: u64::from(last), ..H2::default() },
            "segment {i}"
        );
    }
    assert_eq!(
        bed.take().iter().map(|e| (e.stream, e.target.clone())).collect::<Vec<_>>(),
        [(Some(3), Some("/next".into()))]
    );
}

/// CONTINUATION: a block continued in CONTINUATION frames is counted once, its first frame's
/// fields read (a :status there triggers), and the table state lost: a later reference to an
/// entry inserted before is counted as unresolved, never guessed.
#[test]
fn a_block_continued_in_continuation_frames() {
    let Some(bed) = Bed::new(&["status=503"]) else { return };
    let mut c = Conn::new(47430, PORT_HTTP);
    open(
        &bed,
        &mut c,
        &[(1, Block::request("GET", "/a", "c.example")), (3, Block::request("GET", "/b", "c.example"))],
    );
    // Stream 1: 404 inserted (62), no trigger.
    let d = bed.run(&c.server(&h2::trailers(
        1,
        &Block::new().literal(Indexing::Incremental, Name::Index(st::STATUS_200), Text::Raw("404")),
    )));
    assert_eq!(h2c(&d), H2 { responses: 1, ..H2::default() });
    // Stream 3: :status 503 in the HEADERS frame, a field inserted in its CONTINUATION.
    let first = Block::new().literal(Indexing::Without, Name::Index(st::STATUS_200), Text::Raw("503"));
    let more = Block::new().literal(Indexing::Incremental, Name::Index(st::SERVER), Text::Raw("x"));
    let frames =
        [Headers::new(3, &first).end_stream().continued().build(), h2::continuation(3, true, more.bytes())]
            .concat();
    let d = bed.run(&c.server(&frames));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, continuation: 1, lost: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.iter().map(|e| (e.status, e.stream)).collect::<Vec<_>>(), [(503, Some(3))]);
    // The 404 is 63 now (the CONTINUATION inserted a field): the classifier cannot know it.
    let d = bed.run(&c.server(&h2::headers(5, &Block::new().indexed(63))));
    assert_eq!(h2c(&d), H2 { unresolved: 1, ..H2::default() });

    // One block over a HEADERS and two CONTINUATIONs (one empty): counted once.
    let mut c = Conn::new(47431, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", "/a", "c.example"))]);
    let frames = [
        Headers::new(1, &Block::new().indexed(st::DATE)).continued().build(),
        h2::continuation(1, false, &[]),
        h2::continuation(1, true, Block::new().indexed(st::SERVER).bytes()),
    ]
    .concat();
    let d = bed.run(&c.server(&frames));
    assert_eq!(h2c(&d), H2 { continuation: 1, lost: 1, ..H2::default() });
    assert!(bed.take().is_empty());
}

/// Padding and priority in HEADERS, and a server's PUSH_PROMISE: only the block is read
/// (not the pad length, the priority fields, the promised stream or the padding, here
/// bytes that would read as `:status 404`), and the PUSH_PROMISE's insertions are counted in
/// the server's table.
#[test]
fn padding_priority_and_push_promise_around_the_block() {
    let Some(bed) = Bed::new(&["status=503 path=/three", "status=500"]) else { return };
    let mut c = Conn::new(47440, PORT_HTTP);
    open(
        &bed,
        &mut c,
        &[(1, Block::request("GET", "/one", "p.example")), (3, Block::request("GET", "/three", "p.example"))],
    );
    let mut padded =
        Headers::new(1, &Block::new().literal(Indexing::Incremental, Name::Index(8), Text::Raw("503")))
            .padded(6)
            .priority(0, true, 0x8d)
            .build();
    // Padding of 0x8d (:status 404 as an indexed field) instead of zeros.
    let n = padded.len();
    padded[n - 6..].fill(0x8d);
    let d = bed.run(&c.server(&padded));
    assert_eq!(h2c(&d), H2 { responses: 1, filtered_out: 1, ..H2::default() }, "503 for /one: turned down");
    // A PUSH_PROMISE on stream 1 promising 2: its :path and :authority inserted (63 and 62
    // then, the 503 at 64); the pushed response; then stream 3's 503 by index 64.
    let promise =
        Headers::push_promise(1, 2, &Block::request("GET", "/style.css", "p.example")).padded(3).build();
    let d = bed.run(
        &c.server(&[promise, h2::headers(2, &Block::new().indexed(8)), h2::data(2, true, b"a{}")].concat()),
    );
    assert_eq!(
        h2c(&d),
        H2 { responses: 1, stream_missed: 1, ..H2::default() },
        "a pushed stream has no request"
    );
    let d = bed.run(
        &c.server(&Headers::new(3, &Block::new().indexed(64)).end_stream().priority(1, false, 200).build()),
    );
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (said(&events[0]), events[0].rule_id),
        ((TriggerKind::Status, 503, Some(3), Some("GET"), Some("/three"), Some("p.example")), bed.rules[0])
    );
    // A pad length longer than the frame: the block is lost, nothing read.
    let mut c = Conn::new(47441, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", "/", "p.example"))]);
    let mut bad = Headers::new(1, &Block::new().indexed(st::STATUS_500)).padded(1).build();
    bad[9] = 200;
    let d = bed.run(&c.server(&bad));
    assert_eq!(h2c(&d), H2 { lost: 1, ..H2::default() });
    assert!(bed.take().is_empty());
}

/// Case 5: a connection that began before the classifier saw it: no preface, no SETTINGS,
/// each direction found by a segment that is a chain of whole frames. A static `:status 500`
/// triggers; a reference to a dynamic entry inserted before is counted unresolved and
/// triggers nothing; a segment whose frame runs past it is not taken for HTTP/2.
#[test]
fn a_connection_followed_late_is_found_by_its_frames() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47500, PORT_HTTP);
    c.skip(true, 51_000);
    c.skip(false, 1_234_567);
    let req = Headers::new(101, &Block::request("POST", "/late", "late.example")).build();
    let d = bed.run(&c.client(&[req, h2::data(101, true, b"{}")].concat()));
    assert_eq!(h2c(&d), H2 { connections: 1, requests: 1, ..H2::default() });
    let d = bed.run(&c.server(
        &[h2::window_update(0, 100), h2::headers(101, &Block::new().indexed(st::STATUS_500))].concat(),
    ));
    assert_eq!(h2c(&d), H2 { connections: 1, responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 500, Some(101), Some("POST"), Some("/late"), Some("late.example"))
    );

    // The server's first segment refers to entries inserted before (62, and 70 as a name):
    // unresolved; a 200 after them is read; its stream's request was never seen.
    let mut c = Conn::new(47501, PORT_HTTP);
    c.skip(false, 90_000);
    let block =
        Block::new().indexed(62).literal(Indexing::Without, Name::Index(70), Text::Raw("500")).indexed(8);
    let d = bed.run(&c.server(&[h2::headers(7, &block), h2::data(7, true, b"x")].concat()));
    assert_eq!(
        h2c(&d),
        H2 { connections: 1, responses: 1, unresolved: 2, stream_missed: 1, ..H2::default() }
    );
    // A dynamic reference alone: unresolved, nothing decided.
    let d = bed.run(&c.server(&h2::headers(9, &Block::new().indexed(63))));
    assert_eq!(h2c(&d), H2 { unresolved: 1, ..H2::default() });
    // What it inserts from here on is followed.
    let d = bed.run(&c.server(&h2::headers(
        11,
        &Block::new().literal(Indexing::Incremental, Name::Index(8), Text::Raw("404")),
    )));
    assert_eq!(h2c(&d), H2 { responses: 1, stream_missed: 1, ..H2::default() });
    let d = bed.run(&c.server(&h2::headers(13, &Block::new().indexed(62))));
    assert_eq!(h2c(&d), H2 { responses: 1, stream_missed: 1, ..H2::default() });
    assert!(bed.take().is_empty());

    // A 500 whose request was never seen: a trigger without a request.
    let mut c = Conn::new(47502, PORT_HTTP);
    c.skip(false, 4_000);
    let d = bed.run(&c.server(&h2::headers(9, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { connections: 1, responses: 1, stream_missed: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(said(&events[0]), (TriggerKind::Status, 500, Some(9), None, None, None));

    // A segment whose last frame runs past it is no chain; nor is the next, which starts
    // inside that frame; the one after, whole frames, is.
    let mut c = Conn::new(47503, PORT_HTTP);
    c.skip(false, 10_000);
    let frame = h2::headers(15, &response(500));
    let segs = c.split(false, &[h2::ping(true), frame].concat(), &[30]);
    let d = bed.run_all(&segs);
    assert_eq!(h2c(&d), H2::default());
    let d = bed.run(&c.server(&h2::headers(17, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { connections: 1, responses: 1, stream_missed: 1, triggers: 1, ..H2::default() });
    assert_eq!(bed.take().iter().map(|e| e.stream).collect::<Vec<_>>(), [Some(17)]);
}

/// Case 6: Upgrade: h2c. The HTTP/1.1 request asks for it, the server answers 101 and its
/// SETTINGS, the client its preface; a `:status 500` on stream 1 answers the HTTP/1.1 request:
/// it triggers with that request (and replays its segment).
#[test]
fn an_h2c_upgrade_answers_the_http1_request_on_stream_1() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47600, PORT_HTTP);
    let request: &[u8] =
        b"GET /upgrade HTTP/1.1\r\nHost: up.example\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let d = bed.run(&c.client(request));
    assert_eq!((d.get(S::STAT_HTTP_REQUESTS), h2c(&d)), (1, H2::default()));
    let switching: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    let d = bed.run(&c.server(&[switching, &h2::server_settings()].concat()));
    assert_eq!((d.get(S::STAT_HTTP_RESPONSES), h2c(&d)), (1, H2 { connections: 1, ..H2::default() }));
    let d = bed.run(&c.client(&[h2::PREFACE, &h2::client_settings(), &h2::settings_ack()].concat()));
    assert_eq!(h2c(&d), H2 { connections: 1, ..H2::default() });
    let d = bed.run(
        &c.server(
            &[h2::settings_ack(), h2::headers(1, &response(500)), h2::data(1, true, b"upgraded, failed")]
                .concat(),
        ),
    );
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(
        (e.kind, e.status, e.stream, e.method.as_deref(), e.target.as_deref()),
        (TriggerKind::Status, 500, Some(1), Some("GET"), Some("/upgrade"))
    );
    assert_eq!(e.proto, Some(HttpProto::Http2));
    let kept = e.request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
    assert_eq!(kept.as_deref(), Some(request), "the replay is the HTTP/1.1 request");
    // Stream 3, a request of HTTP/2 proper, answered 500 too: the flow is marked already.
    let d = bed.run_all(&[
        c.client(&Headers::new(3, &Block::request("GET", "/after", "up.example")).end_stream().build()),
        c.server(&h2::trailers(3, &Block::new().indexed(st::STATUS_500))),
    ]);
    assert_eq!(h2c(&d), H2 { requests: 1, responses: 1, ..H2::default() });
    // The 101 and the SETTINGS after it in segments of their own (a connection of its own).
    let mut other = Conn::new(47601, PORT_HTTP);
    let d = bed.run_all(&[
        other.client(request),
        other.server(switching),
        other.server(&h2::server_settings()),
        other.client(h2::PREFACE),
        other.client(&h2::client_settings()),
    ]);
    assert_eq!(
        (d.get(S::STAT_HTTP_REQUESTS), d.get(S::STAT_HTTP_RESPONSES), h2c(&d)),
        (1, 1, H2 { connections: 2, ..H2::default() })
    );
    let d = bed.run(&other.server(&h2::headers(1, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        events.iter().map(|e| (e.key, e.stream, e.target.clone())).collect::<Vec<_>>(),
        [(other.key(), Some(1), Some("/upgrade".into()))]
    );
    let c = bed.dp.counters().unwrap();
    assert_eq!(
        (c.get(S::STAT_HTTP_REQUESTS), c.get(S::STAT_HTTP_RESPONSES), c.get(S::STAT_HTTP_UNFRAMED)),
        (2, 2, 0),
        "one request and its 101 on each connection"
    );
}

/// The request behind an h2c upgrade carries its Host header: a `host=` rule applies to it as
/// to any HTTP/1.1 request.
#[test]
fn an_h2c_upgrade_request_passes_a_host_filter_by_its_host_header() {
    let Some(bed) = Bed::new(&["status=500 host=up.example"]) else { return };
    let mut c = Conn::new(47610, PORT_HTTP);
    let request: &[u8] =
        b"GET /upgrade HTTP/1.1\r\nHost: up.example\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let switching: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    let d = bed.run_all(&[
        c.client(request),
        c.server(&[switching, &h2::server_settings()].concat()),
        c.client(&[h2::PREFACE, &h2::client_settings()].concat()),
        c.server(&h2::headers(1, &Block::new().indexed(st::STATUS_500))),
    ]);
    assert_eq!(h2c(&d), H2 { connections: 2, responses: 1, triggers: 1, ..H2::default() });
    assert_eq!(
        bed.take().iter().map(|e| e.target.clone()).collect::<Vec<_>>(),
        [Some("/upgrade".to_string())]
    );
}

/// Case 7: request filters. `grpc-status=13 path=/pkg.Svc/Fail` applies to that method's
/// failures only (its :path literal, or from the client's dynamic table); `host=` compares the
/// :authority (lower case, without its port); `method=` the :method.
#[test]
fn request_filters_on_path_method_and_authority() {
    let Some(bed) = Bed::new(&[
        "grpc-status=13 path=/pkg.Svc/Fail",
        "status=500 host=shop.example",
        "status=502 method=DELETE",
        "grpc-status=unavailable port=50051",
        "status=504 path=/~a{b}|c^d",
    ]) else {
        return;
    };
    let (fail, shop, delete, port_scoped, odd) =
        (bed.rules[0], bed.rules[1], bed.rules[2], bed.rules[3], bed.rules[4]);
    let status = |code: &str| {
        Block::new().literal(Indexing::Incremental, Name::Literal(Text::Raw("grpc-status")), Text::Raw(code))
    };

    // One connection: /pkg.Svc/Ok fails with 13 (inserted): turned down; /pkg.Svc/Fail's
    // trailers name it by index: a trigger.
    let mut c = Conn::new(47700, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::grpc_request("/pkg.Svc/Ok", "g.example"))]);
    let head = Block::new().indexed(8).grpc_content_type();
    let d = bed.run(&c.server(&[h2::headers(1, &head), h2::trailers(1, &status("13"))].concat()));
    assert_eq!(h2c(&d), H2 { responses: 1, trailers: 1, filtered_out: 1, ..H2::default() });
    let d = bed.run_all(&[
        c.client(&Headers::new(3, &Block::grpc_request("/pkg.Svc/Fail", "g.example")).end_stream().build()),
        c.server(
            &[
                h2::headers(3, &Block::new().indexed(8).indexed(63)),
                h2::trailers(3, &Block::new().indexed(62)),
            ]
            .concat(),
        ),
    ]);
    assert_eq!(
        h2c(&d),
        H2 { requests: 1, responses: 1, trailers: 1, grpc_triggers: 1, triggers: 1, ..H2::default() }
    );
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Grpc, 13, Some(3), Some("POST"), Some("/pkg.Svc/Fail"), Some("g.example"))
    );
    assert_eq!(events[0].rule_id, fail);

    // Another: the second call's request names its :path, :authority, content-type and te by
    // their indices in the client's table (65, 64, 63, 62): the filter sees /pkg.Svc/Fail.
    let mut c = Conn::new(47701, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::grpc_request("/pkg.Svc/Fail", "g.example"))]);
    let d = bed.run(&c.server(&h2::trailers(
        1,
        &Block::new().indexed(8).grpc_content_type().grpc_status(Indexing::Incremental, true, 0),
    )));
    assert_eq!(h2c(&d), H2 { responses: 1, trailers: 1, ..H2::default() });
    let again = Block::new()
        .indexed(st::METHOD_POST)
        .indexed(st::SCHEME_HTTP)
        .indexed(65)
        .indexed(64)
        .indexed(63)
        .indexed(62);
    let d = bed.run_all(&[
        c.client(&Headers::new(3, &again).end_stream().build()),
        // grpc-status 13 Huffman-coded under the literal name, never indexed.
        c.server(
            &[
                h2::headers(3, &Block::new().indexed(8).indexed(63)),
                h2::trailers(3, &Block::new().grpc_status(Indexing::Never, true, 13)),
            ]
            .concat(),
        ),
    ]);
    assert_eq!(
        h2c(&d),
        H2 { requests: 1, responses: 1, trailers: 1, grpc_triggers: 1, triggers: 1, ..H2::default() }
    );
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Grpc, 13, Some(3), Some("POST"), Some("/pkg.Svc/Fail"), Some("g.example"))
    );

    // host=: the :authority, lower case, without its port; raw or Huffman-coded.
    let authority = |a: &str, huffman: bool| {
        let text = if huffman { Text::Huffman(a) } else { Text::Raw(a) };
        Block::new().indexed(st::METHOD_GET).scheme_http().indexed(st::PATH_ROOT).literal(
            Indexing::Without,
            Name::Index(st::AUTHORITY),
            text,
        )
    };
    let cases: [(u16, Block, u16, Option<RuleId>); 7] = [
        (47710, authority("Shop.Example:8443", false), 500, Some(shop)),
        (47711, authority("shop.example", true), 500, Some(shop)),
        (47712, authority("shop.example.org", false), 500, None),
        (47713, authority("www.shop.example", true), 500, None),
        (47714, Block::new().indexed(st::METHOD_GET).indexed(st::PATH_ROOT), 500, None),
        (47715, Block::new().method("DELETE").path("/x").authority("d.example"), 502, Some(delete)),
        (47716, Block::new().method("GET").path("/x").authority("d.example"), 502, None),
    ];
    let mut want = Vec::new();
    for (port, block, code, rule) in cases {
        let mut c = Conn::new(port, PORT_HTTP);
        open(&bed, &mut c, &[(1, block)]);
        let d = bed.run(&c.server(&h2::trailers(1, &Block::new().status(code))));
        let passed = u64::from(rule.is_some());
        assert_eq!(
            h2c(&d),
            H2 { responses: 1, triggers: passed, filtered_out: 1 - passed, ..H2::default() },
            "{port}"
        );
        want.extend(rule.map(|r| (port, r)));
    }
    let events = bed.take();
    assert_eq!(events.iter().map(|e| (e.key.lo.port(), e.rule_id)).collect::<Vec<_>>(), want);
    assert_eq!(events[0].authority.as_deref(), Some("shop.example"));
    assert_eq!((events[2].method.as_deref(), events[2].target.as_deref()), (Some("DELETE"), Some("/x")));

    // A port-scoped gRPC rule: on its port, not on another.
    for (port, sport, rule) in [(47720, 50051, Some(port_scoped)), (47721, PORT_HTTP, None)] {
        let mut c = Conn::new(port, sport);
        open(&bed, &mut c, &[(1, Block::grpc_request("/pkg.Svc/Get", "g.example"))]);
        let only = Block::new().indexed(8).grpc_content_type().grpc_status(Indexing::Without, false, 14);
        let d = bed.run(&c.server(&h2::trailers(1, &only)));
        let hit = u64::from(rule.is_some());
        assert_eq!(
            h2c(&d),
            H2 { responses: 1, trailers: 1, grpc_triggers: hit, triggers: hit, ..H2::default() },
            "{port}"
        );
        let events = bed.take();
        assert_eq!(
            events.iter().map(|e| (e.rule_id, e.status)).collect::<Vec<_>>(),
            rule.map(|r| (r, 14)).into_iter().collect::<Vec<_>>()
        );
    }

    // A :path Huffman-coded with symbols of long codes (~ 13 bits, { 15, | 11, ^ 14, } 14).
    let path = "/~a{b}|c^d?q=%7E";
    let mut c = Conn::new(47730, PORT_HTTP);
    let block = Block::new().method("GET").scheme_http().literal(
        Indexing::Never,
        Name::Index(st::PATH_ROOT),
        Text::Huffman(path),
    );
    open(&bed, &mut c, &[(1, block)]);
    let d = bed.run(&c.server(&h2::trailers(1, &Block::new().status(504))));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        events.iter().map(|e| (e.rule_id, e.target.clone())).collect::<Vec<_>>(),
        [(odd, Some(path.to_string()))]
    );
}

/// Case 8: flows that are neither HTTP/1 nor HTTP/2 (bytes of no protocol, TLS records), and
/// HTTP/1.1: no direction taken for HTTP/2, nothing of HTTP/2 counted.
#[test]
fn flows_that_are_not_http2_cost_nothing_new() {
    let Some(bed) = Bed::new(&["status=500", "grpc-status=13"]) else { return };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let mut frames = Vec::new();
    let mut c = Conn::new(47800, PORT_HTTP);
    for i in 0..80 {
        let n = [9, 10, 64, 200, 1400][i % 5];
        frames.push(c.client(&random(n)));
        frames.push(c.server(&random(n + 3)));
    }
    // TLS: a ClientHello's record, a ServerHello's, application data.
    let mut c = Conn::new(47801, 443);
    let record = |kind: u8, body: Vec<u8>| {
        let mut r = vec![kind, 3, 3];
        r.extend_from_slice(&(body.len() as u16).to_be_bytes());
        r.extend(body);
        r
    };
    frames.push(c.client(&record(0x16, [&[1, 0, 1, 0xfc, 3, 3][..], &random(506)].concat())));
    frames.push(c.server(&record(0x16, [&[2, 0, 0, 0x56, 3, 3][..], &random(86)].concat())));
    for _ in 0..10 {
        frames.push(c.client(&record(0x17, random(300))));
        frames.push(c.server(&record(0x17, random(1200))));
    }
    // HTTP/1.1, a 200 and a 500.
    let mut c = Conn::new(47802, PORT_HTTP);
    frames.push(c.client(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
    frames.push(c.server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
    frames.push(c.client(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"));
    frames.push(c.server(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"));
    let d = bed.run_all(&frames);
    assert_eq!(h2c(&d), H2 { triggers: 1, ..H2::default() }, "{d:?}");
    assert_eq!((d.get(S::STAT_HTTP_REQUESTS), d.get(S::STAT_HTTP_RESPONSES)), (2, 2));
    // Nor did any of them leave HTTP/2 state behind.
    let conns = &bed.dp.skel().maps.h2_conns;
    assert_eq!(conns.keys().count(), 0, "no h2_conns entry");
}

/// A header block whose frame ends in a later segment keeps what its flags say of the frame:
/// PRIORITY (its 5 bytes are not fields) and PADDED, on a response and on a request (browsers
/// send their requests' HEADERS with PRIORITY).
#[test]
fn split_blocks_keep_their_priority_and_padding() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    // (client port, the HEADERS is the client's (a request on stream 3) or the server's, its
    // flags); every case is run, the ones that went wrong listed.
    type Case = (u16, bool, fn(Headers) -> Headers);
    let cases: [Case; 5] = [
        (47450, false, |h| h.priority(0, true, 15)),
        (47451, false, |h| h.padded(4)),
        (47452, false, |h| h.padded(2).priority(1, false, 200)),
        (47453, true, |h| h.priority(0, true, 255)),
        (47454, true, |h| h.padded(1)),
    ];
    let mut wrong = Vec::new();
    for (port, request, flags) in cases {
        let mut c = Conn::new(port, PORT_HTTP);
        open(&bed, &mut c, &[(1, Block::request("GET", "/one", "split.example"))]);
        let (stream, target, segs) = if request {
            let frame =
                flags(Headers::new(3, &Block::request("POST", "/prio", "split.example")).end_stream())
                    .build();
            let mut segs = c.split(true, &frame, &[9 + 8]);
            segs.push(c.server(&h2::trailers(3, &Block::new().indexed(st::STATUS_500))));
            (3, "/prio", segs)
        } else {
            let frame = flags(Headers::new(1, &response(500)).end_stream()).build();
            (1, "/one", c.split(false, &frame, &[9 + 8]))
        };
        let d = bed.run_all(&segs);
        let want = H2 { requests: u64::from(request), responses: 1, triggers: 1, ..H2::default() };
        let got: Vec<_> = bed.take().iter().map(|e| (e.status, e.stream, e.target.clone())).collect();
        if h2c(&d) != want || got != [(500, Some(stream), Some(target.to_string()))] {
            wrong.push(format!("{port}: {:?}, events {got:?}", h2c(&d)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Frames are followed by sequence number: a retransmitted segment is not read again, one that
/// repeats bytes and goes on is read from where the stream goes on; after a gap the table
/// state is lost (counted) and the direction found again at a segment of whole frames.
#[test]
fn retransmissions_and_gaps() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let mut c = Conn::new(47460, PORT_HTTP);
    let requests: Vec<(u32, Block)> =
        [1, 3, 5].iter().map(|s| (*s, Block::request("GET", &format!("/r{s}"), "seq.example"))).collect();
    open(&bed, &mut c, &requests);
    let at = c.offset(false);
    let a = Headers::new(1, &Block::new().literal(Indexing::Incremental, Name::Index(8), Text::Raw("404")))
        .end_stream()
        .build();
    let first = c.server(&a);
    assert_eq!(h2c(&bed.run(&first)), H2 { responses: 1, ..H2::default() });
    assert_eq!(h2c(&bed.run(&first)), H2::default(), "a retransmission");
    // A's bytes again, then stream 3's 404 by index.
    let b = Headers::new(3, &Block::new().indexed(62)).end_stream().build();
    let again = c.segment_at(false, at, &[a, b.clone()].concat());
    c.skip(false, b.len());
    assert_eq!(h2c(&bed.run(&again)), H2 { responses: 1, ..H2::default() });
    assert_eq!(h2c(&bed.run(&again)), H2::default(), "a retransmission");
    // A gap of 100 bytes; then a segment of whole frames naming the 404 by index: lost, found
    // again, unresolved.
    c.skip(false, 100);
    let d = bed.run(&c.server(&h2::headers(5, &Block::new().indexed(62))));
    assert_eq!(h2c(&d), H2 { connections: 1, lost: 1, unresolved: 1, ..H2::default() });
    let d = bed.run(&c.server(&h2::trailers(5, &Block::new().indexed(st::STATUS_500))));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        events.iter().map(|e| (e.stream, e.target.clone())).collect::<Vec<_>>(),
        [(Some(5), Some("/r5".into()))]
    );
}

/// The dynamic table followed far back: an entry of interest named 100 insertions later (a
/// two-byte index) resolves; once 8 later entries of interest have pushed it out of those
/// remembered, or its age passes the names remembered (128), a reference to it is counted
/// unresolved.
#[test]
fn the_dynamic_table_is_followed_far_back() {
    let Some(bed) = Bed::new(&["status=503 path=/far"]) else { return };
    let mut c = Conn::new(47470, PORT_HTTP);
    let requests: Vec<(u32, Block)> =
        [(1, "/near"), (3, "/far"), (5, "/f"), (7, "/f"), (9, "/f"), (11, "/f"), (13, "/far"), (15, "/far")]
            .iter()
            .map(|(s, p)| (*s, Block::request("GET", p, "far.example")))
            .collect();
    open(&bed, &mut c, &requests);
    let fillers = |block: Block, from: usize| {
        (from..from + 25).fold(block, |b, i| {
            b.literal(
                Indexing::Incremental,
                Name::Literal(Text::Raw("x-filler")),
                Text::Raw(&format!("{i:03}")),
            )
        })
    };
    // Insertion 0: 503 (for /near: turned down).
    let d = bed.run(&c.server(&h2::trailers(
        1,
        &Block::new().literal(Indexing::Incremental, Name::Index(8), Text::Raw("503")),
    )));
    assert_eq!(h2c(&d), H2 { responses: 1, filtered_out: 1, ..H2::default() });
    // Insertions 1 to 100: fillers, in four 200s.
    for (i, s) in [5, 7, 9, 11].iter().enumerate() {
        let block = fillers(Block::new().indexed(8), 1 + 25 * i);
        let d = bed.run(&c.server(&h2::trailers(*s, &block)));
        assert_eq!(h2c(&d), H2 { responses: 1, ..H2::default() }, "stream {s}");
    }
    // The 503 is 162 now: two bytes (0xff, 35).
    let far = Block::new().indexed(62 + 100);
    assert_eq!(far.bytes(), [0xff, 35]);
    let d = bed.run(&c.server(&h2::trailers(3, &far)));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 503, Some(3), Some("GET"), Some("/far"), Some("far.example"))
    );
    // Eight :status 204 inserted (101 to 108), then the 503 (170): pushed out of the 8 entries
    // remembered by value. The block's status is the last 204.
    let block =
        (0..8).fold(Block::new(), |b, _| b.literal(Indexing::Incremental, Name::Index(8), Text::Raw("204")));
    let d = bed.run(&c.server(&h2::trailers(13, &block.indexed(62 + 108))));
    assert_eq!(h2c(&d), H2 { responses: 1, unresolved: 1, ..H2::default() });
    // 25 more fillers (109 to 133); age 127 names filler 6 (nothing of interest: resolved, no
    // count); age 130, beyond the 128 names remembered: unresolved.
    let block = fillers(Block::new(), 109).indexed(62 + 127).indexed(62 + 130);
    let d = bed.run(&c.server(&h2::headers(15, &block)));
    assert_eq!(h2c(&d), H2 { unresolved: 1, ..H2::default() });
}

/// Pseudo-headers under literal names (some encoders never index their names), raw or
/// Huffman-coded: the request's :method, :path and :authority pass the filters, the response's
/// :status triggers, and inserted with its literal name it is found again by index.
#[test]
fn pseudo_headers_under_literal_names() {
    let Some(bed) = Bed::new(&["status=503 method=DELETE path=/lit host=lit.example"]) else { return };
    let lit = |name, value| (Name::Literal(name), value);
    let request = |path| {
        [
            lit(Text::Huffman(":method"), Text::Raw("DELETE")),
            lit(Text::Raw(":scheme"), Text::Raw("http")),
            lit(Text::Raw(":path"), Text::Huffman(path)),
            lit(Text::Huffman(":authority"), Text::Raw("Lit.Example:8080")),
        ]
        .into_iter()
        .fold(Block::new(), |b, (n, v)| b.literal(Indexing::Without, n, v))
    };
    // A raw literal :status.
    let mut c = Conn::new(47740, PORT_HTTP);
    open(&bed, &mut c, &[(1, request("/lit/1"))]);
    let block =
        Block::new().literal(Indexing::Without, Name::Literal(Text::Raw(":status")), Text::Raw("503"));
    let d = bed.run(&c.server(&h2::trailers(1, &block)));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 503, Some(1), Some("DELETE"), Some("/lit/1"), Some("lit.example"))
    );
    // A Huffman-coded literal :status inserted for /other (turned down), found by its index
    // for /lit/2; a name that only begins like it (":statuses") is none of ours.
    let mut c = Conn::new(47741, PORT_HTTP);
    open(&bed, &mut c, &[(1, request("/other")), (3, request("/lit/2"))]);
    let first = Block::new().literal(
        Indexing::Incremental,
        Name::Literal(Text::Huffman(":status")),
        Text::Raw("503"),
    );
    let d = bed.run(&c.server(&h2::trailers(1, &first)));
    assert_eq!(h2c(&d), H2 { responses: 1, filtered_out: 1, ..H2::default() });
    let block = Block::new().indexed(62).literal(
        Indexing::Without,
        Name::Literal(Text::Raw(":statuses")),
        Text::Raw("200"),
    );
    let d = bed.run(&c.server(&h2::trailers(3, &block)));
    assert_eq!(h2c(&d), H2 { responses: 1, triggers: 1, ..H2::default() });
    let events = bed.take();
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 503, Some(3), Some("DELETE"), Some("/lit/2"), Some("lit.example"))
    );
}
