//! The request filters on :method, :path and :authority.

use super::*;

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
