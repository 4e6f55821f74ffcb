//! How a direction is found speaking HTTP/2: by its frames when followed late, by an h2c
//! upgrade; and what a flow that is not HTTP/2 costs.

use super::*;

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
