//! Statuses and grpc-status as HPACK gives them: static and dynamic tables, raw and Huffman
//! strings, literal names of pseudo-headers, a dynamic table followed far back.

use super::*;

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
