//! `reset`: a TCP RST of an established HTTP connection, from either side.

use super::*;

/// The server resets a connection (SO_LINGER 0, then close) after reading `/abort`, on a
/// keep-alive connection after three requests answered (IPv4) and on a connection of that
/// request alone (IPv6), while plain connections run beside it: that connection alone is
/// marked, from the RST, and `/abort` is replayed ahead of the RST's copy.
#[test]
fn server_reset_marks_the_connection_and_replays_the_request() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let rule = bed.rule_ids()[0];
    let events = bed.events();
    for (answered_before, v6) in [(3, false), (0, true)] {
        let since = bed.snapshot();
        let server = SocketAddr::new(bed.pod("server").addr(v6), PORT);
        let ns = &bed.pod("client").ns;
        let mut aborted = None;
        let rec = bed.record("client", || {
            thread::scope(|s| {
                let plain = s.spawn(|| plain_traffic(ns, server, Duration::from_millis(400)));
                let _inside = ns.enter();
                thread::sleep(Duration::from_millis(100));
                let mut c = Conn::open(server);
                for _ in 0..answered_before {
                    assert_eq!(finals(&c.round(&get("/ok"))), [200]);
                }
                c.send(&get("/abort"));
                aborted = Some(c.local());
                c.expect_reset();
                plain.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            })
        });
        let flow = FlowKey::new(aborted.unwrap(), server, 6);
        let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
        let expected = bed.check_since(&rec, expected, &since);
        assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), [flow]);
        assert!(expected.untriggered().count() >= 4, "plain connections ran beside it");
        assert_eq!(expected.triggered[0].target.as_deref(), Some("/abort"));
        let rst = rst_of(&rec.reference, flow);
        assert_eq!(rst.src, server, "the server reset it");
        let mirrored: Vec<_> = rec.mirror.packets.iter().map(Packet::id).collect();
        assert_eq!(mirrored, [rst.id()], "the mirror has the RST and nothing else");
        assert_eq!(rec.mirror.replayed.len(), 1, "one replay: {:?}", rec.mirror.replayed);

        let events = events.take();
        let ev = event_of(&events, flow);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (ev.kind, ev.by, ev.status, ev.rule_id),
            (TriggerKind::Reset, Some(Side::Server), 0, rule)
        );
        assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some("GET"), Some("/abort")));
        let request = request_packet(&rec.reference, flow, "GET /abort ");
        assert_took(ev.request_to_response, request, rst);
        assert_eq!(assert_replayed(&rec, request, ev).id(), rst.id(), "the RST follows the replay");
        assert_counted(&bed, &since, stat_idx::STAT_RESET_TRIGGERS, 1);
    }
}

/// The client resets two connections (SO_LINGER 0, then close): one while its request waits
/// on the server (held 1 s), one after its request was answered. Both are marked, by the
/// client; the request behind each is the one pending, else the latest.
#[test]
fn client_reset_marks_the_connection() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let ns = &bed.pod("client").ns;
    let (mut after_answer, mut pending) = (None, None);
    let rec = bed.record("client", || {
        thread::scope(|s| {
            let plain = s.spawn(|| plain_traffic(ns, server, Duration::from_millis(500)));
            let _inside = ns.enter();
            thread::sleep(Duration::from_millis(50));
            let mut c = Conn::open(server);
            assert_eq!(finals(&c.round(&get("/ok"))), [200]);
            thread::sleep(Duration::from_millis(50));
            after_answer = Some(c.local());
            c.abort();
            let mut c = Conn::open(server);
            c.send(&get("/hold?delay_ms=1000"));
            thread::sleep(Duration::from_millis(100));
            pending = Some(c.local());
            c.abort();
            plain.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        })
    });
    let flows = [after_answer, pending].map(|local| FlowKey::new(local.unwrap(), server, 6));
    let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
    let expected = bed.check_since(&rec, expected, &Snapshot::default());
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), flows);
    assert_eq!(rec.mirror.replayed.len(), 2, "a replay each: {:?}", rec.mirror.replayed);
    let events = events.take();
    assert_eq!(events.len(), 2, "{events:?}");
    for (flow, target) in flows.into_iter().zip(["/ok", "/hold?delay_ms=1000"]) {
        let ev = event_of(&events, flow);
        assert_eq!((ev.kind, ev.by, ev.status), (TriggerKind::Reset, Some(Side::Client), 0), "{ev:?}");
        assert_eq!((ev.method.as_deref(), ev.target.as_deref()), (Some("GET"), Some(target)));
        let rst = rst_of(&rec.reference, flow);
        assert_ne!(rst.src, server, "the client reset it");
        let request = request_packet(&rec.reference, flow, &format!("GET {target} "));
        assert_took(ev.request_to_response, request, rst);
        assert_eq!(assert_replayed(&rec, request, ev).id(), rst.id(), "the RST reaches the mirror");
    }
    assert_counted(&bed, &Snapshot::default(), stat_idx::STAT_RESET_TRIGGERS, 2);
}

/// RSTs of connections that carried no request do not trigger: the answer to a SYN to a
/// closed port, and a connection the client resets before sending anything. A connection the
/// server resets after a request, last, shows the rule was live.
#[test]
fn reset_without_an_http_request_does_not_trigger() {
    if !require_root() {
        return;
    }
    let bed = bed("reset");
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let closed = SocketAddr::new(server.ip(), 9);
    let mut control = None;
    let rec = bed.record("client", || {
        raw::in_ns(&bed.pod("client").ns, || {
            let refused = std::net::TcpStream::connect_timeout(&closed, Duration::from_secs(2));
            assert_eq!(refused.map_err(|e| e.kind()).err(), Some(std::io::ErrorKind::ConnectionRefused));
            let c = Conn::open(server);
            thread::sleep(Duration::from_millis(20));
            c.abort();
            thread::sleep(Duration::from_millis(20));
            let mut c = Conn::open(server);
            c.send(&get("/abort"));
            control = Some(c.local());
            c.expect_reset();
        })
    });
    let resets: Vec<&Packet> = rec.reference.packets.iter().filter(|p| p.flags & RST != 0).collect();
    assert_eq!(resets.len(), 3, "the port's answer, the client's reset, the control's: {resets:?}");
    assert_eq!(resets[0].src, closed, "the closed port answered with a RST");
    let control = FlowKey::new(control.unwrap(), server, 6);
    let expected = Expected::from_packets(&rec.reference, reset_point(&rec.reference));
    let expected = bed.check_since(&rec, expected, &Snapshot::default());
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<Vec<_>>(), [control]);
    let events = events.take();
    assert_eq!(events.iter().map(|e| e.key).collect::<Vec<_>>(), [control], "{events:?}");
    assert_counted(&bed, &Snapshot::default(), stat_idx::STAT_RESET_TRIGGERS, 1);
}
