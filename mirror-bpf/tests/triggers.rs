//! The kinds of trigger besides a status, and the request behind each, with BPF_PROG_TEST_RUN:
//! a reset of an established HTTP connection (and who sent it), a request left unanswered (a
//! timer marks the flow, without a packet, when the rule's time has passed), request filters
//! (method, path prefix, Host), and under pipelining the request each trigger concerns.

use std::thread::sleep;
use std::time::{Duration, Instant};

use mirror_bpf::testing::bed::Bed;
use mirror_bpf::testing::{consts::*, fixtures, ingress, packet::*};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{FlowKey, Side, TriggerKind};

fn v4_flow(cport: u16) -> FlowKey {
    FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), cport),
        std::net::SocketAddr::new(V4_SERVER.into(), PORT_HTTP),
        6,
    )
}

/// A client -> server segment of `text` at `seq`, from client port `cport` to `dport`.
fn to_server(cport: u16, dport: u16, seq: u32, text: &[u8]) -> Vec<u8> {
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .tcp(cport, dport, tcp_flags::ACK | tcp_flags::PSH)
        .seq(seq)
        .payload(text)
        .build()
}

/// A server -> client segment of `text` at `seq`, from the HTTP port to client port `cport`.
fn to_client(cport: u16, seq: u32, text: &[u8]) -> Vec<u8> {
    PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .tcp(PORT_HTTP, cport, tcp_flags::ACK | tcp_flags::PSH)
        .seq(seq)
        .payload(text)
        .build()
}

#[test]
fn a_reset_marks_an_established_http_connection_and_says_who_reset() {
    let Some(bed) = Bed::new(&["reset"]) else { return };
    let dp = &bed.dp;
    // The server resets while a request is pending.
    ingress(dp, &fixtures::v4_request(45000, PORT_HTTP, b"POST /api/pay HTTP/1.1\r\nHost: x\r\n\r\n"));
    sleep(Duration::from_millis(2));
    let d = ingress(dp, &fixtures::v4_rst(45000, true));
    assert_eq!((d.get(S::STAT_TRIGGERS), d.get(S::STAT_RESET_TRIGGERS)), (1, 1), "{d:?}");
    assert_eq!(d.get(S::STAT_MIRROR_NO_TARGET), 1, "the RST itself is a packet of the marked flow");
    // The client resets after its answer: the request behind it is the latest.
    ingress(dp, &fixtures::v4_request(45001, PORT_HTTP, REQ_GET_BAR));
    ingress(dp, &fixtures::v4_response(PORT_HTTP, 45001, RESP_200));
    let d = ingress(dp, &fixtures::v4_rst(45001, false));
    assert_eq!(d.get(S::STAT_RESET_TRIGGERS), 1, "{d:?}");
    // A RST with no request before it (a refused SYN, a port scan) is not an HTTP failure.
    let syn = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(45002, PORT_HTTP, tcp_flags::SYN).build();
    ingress(dp, &syn);
    let d = ingress(dp, &fixtures::v4_rst(45002, true));
    assert_eq!(d.get(S::STAT_TRIGGERS), 0, "{d:?}");

    let events = bed.take();
    assert_eq!(events.len(), 2, "{events:?}");
    let (server, client) = (&events[0], &events[1]);
    assert_eq!(
        (server.kind, server.by, server.status, server.key),
        (TriggerKind::Reset, Some(Side::Server), 0, v4_flow(45000))
    );
    assert_eq!((server.method.as_deref(), server.target.as_deref()), (Some("POST"), Some("/api/pay")));
    let after = server.request_to_response.expect("the time since the request");
    assert!(after >= Duration::from_millis(2) && after < Duration::from_secs(5), "{after:?}");
    assert_eq!(
        (client.kind, client.by, client.key),
        (TriggerKind::Reset, Some(Side::Client), v4_flow(45001))
    );
    assert_eq!(client.target.as_deref(), Some("/bar"));
    let flows = dp.flows().unwrap();
    let mark = flows.iter().find(|f| f.key == v4_flow(45000)).and_then(|f| f.mark).expect("marked");
    assert_eq!((mark.kind, mark.status), (TriggerKind::Reset, 0));
}

#[test]
fn without_a_reset_rule_a_reset_costs_nothing_and_marks_nothing() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    ingress(&bed.dp, &fixtures::v4_request(45100, PORT_HTTP, REQ_GET_BAR));
    let d = ingress(&bed.dp, &fixtures::v4_rst(45100, true));
    assert_eq!((d.get(S::STAT_TRIGGERS), d.get(S::STAT_CT_LOOKUPS)), (0, 0), "{d:?}");
    assert!(bed.take().is_empty());
}

/// A request unanswered for the rule's time marks its flow when the time passes, with no packet;
/// a request answered in time does not; a request that came after an answered one is timed from
/// its own start.
#[test]
fn a_request_left_unanswered_marks_its_flow_when_the_time_passes() {
    let Some(bed) = Bed::new(&["noresponse>300ms"]) else { return };
    let dp = &bed.dp;
    let started = Instant::now();
    // Unanswered.
    ingress(dp, &fixtures::v4_request(45200, PORT_HTTP, b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"));
    // Answered in time.
    ingress(dp, &fixtures::v4_request(45201, PORT_HTTP, REQ_GET_BAR));
    ingress(dp, &fixtures::v4_response(PORT_HTTP, 45201, RESP_200));
    // Answered, then a second request 200 ms later that is not.
    ingress(dp, &fixtures::v4_request(45202, PORT_HTTP, REQ_GET_BAR));
    ingress(dp, &fixtures::v4_response(PORT_HTTP, 45202, RESP_200));
    sleep(Duration::from_millis(200));
    let second = Instant::now();
    // Where the stream goes on (the first request's bytes before it): a new request, not a
    // retransmission of the first.
    let next = to_server(45202, PORT_HTTP, 1000 + REQ_GET_BAR.len() as u32, b"GET /second HTTP/1.1\r\n\r\n");
    ingress(dp, &next);

    let mut events = Vec::new();
    while started.elapsed() < Duration::from_millis(900) {
        events.extend(bed.take());
    }
    assert_eq!(events.len(), 2, "{events:?}");
    let (hang, late) = (&events[0], &events[1]);
    assert_eq!((hang.kind, hang.by, hang.key), (TriggerKind::NoResponse, None, v4_flow(45200)));
    assert_eq!(hang.target.as_deref(), Some("/hang"));
    let waited = hang.request_to_response.expect("the wait");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_millis(330), "{waited:?}");
    assert!(!hang.reverse, "the request's direction: from the client (lo)");
    assert_eq!((late.key, late.target.as_deref()), (v4_flow(45202), Some("/second")));
    let waited = late.request_to_response.expect("the wait");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_millis(400), "{waited:?}");
    assert!(second.elapsed() >= Duration::from_millis(300));
    let c = dp.counters().unwrap();
    assert_eq!(c.get(S::STAT_NORESPONSE_TRIGGERS), 2, "{c:?}");
    // The tick ran every 10 ms or so meanwhile, and never failed to start.
    assert!((50..=100).contains(&c.get(S::STAT_NORESPONSE_TICKS)), "{c:?}");
    assert_eq!(c.get(S::STAT_NORESPONSE_FAILED), 0, "{c:?}");
    let marked: Vec<FlowKey> =
        dp.flows().unwrap().iter().filter(|f| f.mark.is_some()).map(|f| f.key).collect();
    assert_eq!(marked.len(), 2, "{marked:?}");
    // The late response is a packet of a marked flow: copied (no sink here: counted as such).
    let d = ingress(dp, &fixtures::v4_response(PORT_HTTP, 45200, RESP_200));
    assert_eq!(d.get(S::STAT_MIRROR_NO_TARGET), 1, "{d:?}");
}

/// Pipelined requests: the trigger's request is the one its response answered (each pending
/// request keeps its own segment), and a no-response mark concerns the oldest.
#[test]
fn under_pipelining_each_trigger_carries_the_request_it_concerns() {
    let Some(bed) = Bed::new(&["status=500", "noresponse>200ms port=8080"]) else { return };
    let dp = &bed.dp;
    let reqs: [&[u8]; 3] =
        [b"GET /a HTTP/1.1\r\n\r\n", b"GET /b HTTP/1.1\r\n\r\n", b"GET /c HTTP/1.1\r\n\r\n"];
    let mut seq = 1000;
    for r in reqs {
        let d = ingress(dp, &to_server(45300, PORT_HTTP, seq, r));
        assert_eq!(d.get(S::STAT_REPLAY_KEPT), 1, "{d:?}");
        seq += r.len() as u32;
    }
    ingress(dp, &to_client(45300, 5000, RESP_200));
    let d = ingress(dp, &to_client(45300, 5000 + RESP_200.len() as u32, RESP_500));
    assert_eq!(d.get(S::STAT_TRIGGERS), 1, "{d:?}");
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].target.as_deref(), Some("/b"), "the 500 answered /b");
    let kept = events[0].request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
    assert_eq!(kept.as_deref(), Some(reqs[1]), "the replay is /b's segment, not the latest (/c)");

    // Three requests in one segment, the first never answered: the mark concerns the first.
    let all: Vec<u8> = reqs.concat();
    ingress(dp, &to_server(45301, 8080, 1000, &all));
    sleep(Duration::from_millis(350));
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].kind, events[0].target.as_deref()), (TriggerKind::NoResponse, Some("/a")));
}

/// A request left unanswered is reported with its own kept segment or none, never a later
/// request's. Its answer may come, and the connection's next request be kept in the slot it
/// held, while the timer reads the flow on another CPU. Test_run cannot run the two at once, so
/// the flow is brought there by hand: `/a` answered, `/b` kept in `/a`'s slot, then the queue put
/// back to `/a` pending, as the timer finds it when it looked before the answer. The event names
/// `/a` and carries no segment (the build before sent `/b`'s). Beside it, a request alone on its
/// flow is reported with its own segment.
#[test]
fn a_request_left_unanswered_never_carries_a_later_requests_segment() {
    let Some(bed) = Bed::new(&["noresponse>200ms"]) else { return };
    let dp = &bed.dp;
    let (a, b, x): (&[u8], &[u8], &[u8]) =
        (b"GET /a HTTP/1.1\r\n\r\n", b"GET /b HTTP/1.1\r\n\r\n", b"GET /x HTTP/1.1\r\n\r\n");
    let started = Instant::now();
    ingress(dp, &to_server(45401, PORT_HTTP, 1000, x));
    ingress(dp, &to_server(45400, PORT_HTTP, 1000, a));
    ingress(dp, &to_client(45400, 5000, RESP_200));
    let d = ingress(dp, &to_server(45400, PORT_HTTP, 1000 + a.len() as u32, b));
    assert_eq!(d.get(S::STAT_REPLAY_KEPT), 1, "{d:?}");
    let key = v4_flow(45400).to_raw();
    let was = mirror_bpf::testing::change_timing(dp, &key, |t| {
        t.req_head = 0;
        t.req_tail = 1;
        t.req_done = 0;
    })
    .expect("changing the flow's entry")
    .expect("the flow has an entry");
    let (ra, rb) = (&was.req[0], &was.req[1]);
    assert_eq!((was.req_head, was.req_tail), (1, 2), "/a answered, /b pending");
    assert!(ra.replay != 0 && ra.replay == rb.replay, "/b took over /a's slot: {} {}", ra.replay, rb.replay);
    assert_ne!(ra.replay_req, rb.replay_req, "each keep of the slot has a mark of its own");

    let mut events = Vec::new();
    while started.elapsed() < Duration::from_millis(700) && events.len() < 2 {
        events.extend(bed.take());
    }
    events.sort_by_key(|e| e.key.to_raw().port_lo);
    assert_eq!(events.len(), 2, "{events:?}");
    let (late, alone) = (&events[0], &events[1]);
    assert_eq!(
        (late.kind, late.key, late.target.as_deref()),
        (TriggerKind::NoResponse, v4_flow(45400), Some("/a"))
    );
    let sent = late.request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
    assert_eq!(sent, None, "no segment rather than /b's");
    assert_eq!((alone.key, alone.target.as_deref()), (v4_flow(45401), Some("/x")));
    let sent = alone.request.as_ref().and_then(|r| r.payload().map(<[u8]>::to_vec));
    assert_eq!(sent.as_deref(), Some(x), "a request alone on its flow comes with its segment");
}

/// An answer seen again (a retransmission, or a segment that another CPU's queue let a later
/// one overtake) answers no second request, though its direction is not framed (it answered the
/// only request pending): the next 500 names the request it answered.
#[test]
fn an_answer_seen_twice_answers_one_request() {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let dp = &bed.dp;
    let reqs: [&[u8]; 3] =
        [b"GET /a HTTP/1.1\r\n\r\n", b"GET /b HTTP/1.1\r\n\r\n", b"GET /c HTTP/1.1\r\n\r\n"];
    let answer = to_client(45310, 5000, RESP_200);
    ingress(dp, &to_server(45310, PORT_HTTP, 1000, reqs[0]));
    ingress(dp, &answer);
    let mut seq = 1000 + reqs[0].len() as u32;
    for r in &reqs[1..] {
        ingress(dp, &to_server(45310, PORT_HTTP, seq, r));
        seq += r.len() as u32;
    }
    ingress(dp, &answer);
    let d = ingress(dp, &to_client(45310, 5000 + RESP_200.len() as u32, RESP_500));
    assert_eq!(d.get(S::STAT_TRIGGERS), 1, "{d:?}");
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].target.as_deref(), Some("/b"), "the 500 answered /b");
}

/// Requests `/a` to `/e` pipelined from client port `port` (those of `unseen_requests` sent
/// but not seen), the answer to `/a` seen, the one to `/b` not, then the 500 to `/c`: the 500
/// triggers and its event names no request ("not kept"), never `/b`.
fn the_500_to_c_names_none(port: u16, unseen_requests: &[usize]) {
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let dp = &bed.dp;
    let mut seq = 1000;
    for (i, r) in ["/a", "/b", "/c", "/d", "/e"].iter().enumerate() {
        let r = format!("GET {r} HTTP/1.1\r\n\r\n");
        if !unseen_requests.contains(&i) {
            ingress(dp, &to_server(port, PORT_HTTP, seq, r.as_bytes()));
        }
        seq += r.len() as u32;
    }
    ingress(dp, &to_client(port, 5000, RESP_200));
    let d = ingress(dp, &to_client(port, 5000 + 2 * RESP_200.len() as u32, RESP_500));
    assert_eq!((d.get(S::STAT_TRIGGERS), d.get(S::STAT_REQUEST_NOT_KEPT)), (1, 1), "{d:?}");
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].request_state, events[0].target.as_deref()),
        (mirror_bpf::event::RequestState::NotKept, None),
        "the 500 to /c"
    );
}

/// An answer past a gap in its direction (a segment not seen, or one handled at the same time
/// on another CPU) names no request: an answer may have hidden in what was not seen.
#[test]
fn an_answer_past_a_gap_names_no_request() {
    the_500_to_c_names_none(45320, &[]);
}

/// A gap on the answers' side after one on the requests' side (the fourth request's segment
/// not seen, the fifth past it): the answers are uncertain from the oldest pending request,
/// not only from the requests after the first gap.
#[test]
fn a_gap_in_the_answers_after_one_in_the_requests_names_no_request() {
    the_500_to_c_names_none(45330, &[3]);
}

/// Filters: only the triggers whose request passes; the turned-down ones counted.
#[test]
fn request_filters_pick_the_requests_a_rule_applies_to() {
    let Some(bed) = Bed::new(&["status=500 path=/api/", "status=500 method=POST host=shop.example"]) else {
        return;
    };
    let dp = &bed.dp;
    let cases: [(u16, &[u8], Option<u32>); 5] = [
        (45400, b"GET /api/cart HTTP/1.1\r\nHost: other\r\n\r\n", Some(1)),
        (45401, b"GET /web/cart HTTP/1.1\r\nHost: other\r\n\r\n", None),
        (45402, b"POST /web/cart HTTP/1.1\r\nUser-Agent: t\r\nHost: Shop.Example:8080\r\n\r\n", Some(2)),
        (45403, b"POST /web/cart HTTP/1.1\r\nHost: shop.example.org\r\n\r\n", None),
        (45404, b"PUT /web/cart HTTP/1.1\r\nHost: shop.example\r\n\r\n", None),
    ];
    for (port, request, rule) in cases {
        ingress(dp, &fixtures::v4_request(port, PORT_HTTP, request));
        let d = ingress(dp, &fixtures::v4_response(PORT_HTTP, port, RESP_500));
        assert_eq!(d.get(S::STAT_TRIGGERS), u64::from(rule.is_some()), "{port}: {d:?}");
        // Each 500 tries both rules until one passes.
        let tried = if rule == Some(1) {
            0
        } else if rule == Some(2) {
            1
        } else {
            2
        };
        assert_eq!(d.get(S::STAT_FILTERED_OUT), tried, "{port}: {d:?}");
    }
    let events = bed.take();
    let got: Vec<(u16, u32)> = events.iter().map(|e| (e.key.lo.port(), e.rule_id)).collect();
    assert_eq!(got, [(45400, 1), (45402, 2)]);
    // Another 500 on a flow marked already: no filter is looked at again, none counted.
    let request = cases[0].1;
    ingress(dp, &to_server(45400, PORT_HTTP, 1000 + request.len() as u32, b"GET /web/x HTTP/1.1\r\n\r\n"));
    let d = ingress(dp, &to_client(45400, 1000 + RESP_500.len() as u32, RESP_500));
    assert_eq!((d.get(S::STAT_HTTP_RESPONSES), d.get(S::STAT_FILTERED_OUT)), (1, 0), "{d:?}");
}

/// Many requests pending at once: each flow's timer fires and marks it, once.
#[test]
fn many_requests_pending_at_once_are_each_marked() {
    let Some(bed) = Bed::new(&["noresponse>300ms"]) else { return };
    let dp = &bed.dp;
    const FLOWS: u16 = 1000;
    for i in 0..FLOWS {
        ingress(dp, &fixtures::v4_request(46000 + i, PORT_HTTP, REQ_GET_BAR));
    }
    let started = Instant::now();
    let mut events = Vec::new();
    while started.elapsed() < Duration::from_millis(1200) {
        events.extend(bed.take());
    }
    let c = dp.counters().unwrap();
    let summary = format!(
        "ticks {} marked {} events {} ringbuf drops {} mark insert failed {}",
        c.get(S::STAT_NORESPONSE_TICKS),
        c.get(S::STAT_NORESPONSE_TRIGGERS),
        events.len(),
        c.get(S::STAT_RINGBUF_DROPS),
        c.get(S::STAT_MARK_INSERT_FAILED),
    );
    assert_eq!(c.get(S::STAT_NORESPONSE_TRIGGERS), u64::from(FLOWS), "{summary}");
    let mut ports: Vec<u16> = events.iter().map(|e| e.key.lo.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len() as u64 + c.get(S::STAT_RINGBUF_DROPS), u64::from(FLOWS), "{summary}");
}

/// A rule with a filter alone on its port and status: installed (its key's entry lists only
/// filtered rules), matched, and removed.
#[test]
fn a_port_scoped_rule_with_a_filter_alone_on_its_key() {
    let Some(mut bed) = Bed::new(&[]) else { return };
    let id = bed.dp.add_rule("port=80 status=500 method=GET".parse().unwrap()).unwrap();
    ingress(&bed.dp, &fixtures::v4_request(45500, PORT_HTTP, REQ_GET_BAR));
    let d = ingress(&bed.dp, &fixtures::v4_response(PORT_HTTP, 45500, RESP_500));
    assert_eq!(d.get(S::STAT_TRIGGERS), 1, "{d:?}");
    let e = bed.take();
    assert_eq!(e.iter().map(|e| e.rule_id).collect::<Vec<_>>(), [id]);
    bed.dp.remove_rule(id).unwrap();
    ingress(&bed.dp, &fixtures::v4_request(45501, PORT_HTTP, REQ_GET_BAR));
    let d = ingress(&bed.dp, &fixtures::v4_response(PORT_HTTP, 45501, RESP_500));
    assert_eq!(d.get(S::STAT_TRIGGERS), 0, "{d:?}");
    assert!(bed.dp.rules().unwrap().is_empty());
}
