//! The request behind a trigger: kept by the classifier before the trigger, it reaches the
//! mirror ahead of the response (marked by its Ethernet source), and the event carries it.
//! Checked against the client's own capture: the replay is the request's segment as it passed.

use std::net::SocketAddr;

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};
use mirror_e2e::pcap::Packet;
use mirror_e2e::raw;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::testbed::{Recording, Testbed};

/// How a test sets the mirror up.
struct Setup {
    mode: AttachMode,
    method: MirrorMethod,
    delivery: MirrorDelivery,
    v6: bool,
}

/// Rule `status=500`; one connection sends `rounds` to nginx (`/bar` answers 500); returns the
/// recording and the reference's segment of the request that triggered.
fn run(setup: &Setup, rounds: &[Vec<u8>]) -> (Testbed, Recording, Packet, Vec<mirror_bpf::TriggerEvent>) {
    let mut bed = Testbed::builder(&PODS)
        .nginx("server", HTTP)
        .mirror_via(setup.delivery)
        .rule("status=500")
        .attach(setup.mode, setup.method)
        .build();
    bed.replay_to_sink();
    let events = bed.events();
    let server = SocketAddr::new(bed.pod("server").addr(setup.v6), HTTP);
    let rec = bed.record("client", || {
        let ex = raw::exchange(&bed.pod("client").ns, server, rounds);
        assert_eq!(ex.finals(), [200, 500, 200]);
    });
    let events = events.take();
    let request = rec
        .reference
        .packets
        .iter()
        .find(|p| p.payload.starts_with(b"GET /bar "))
        .expect("the client sent GET /bar")
        .clone();
    (bed, rec, request, events)
}

/// The replay is the request's segment (as the client's capture has it, up to what was kept),
/// the first thing on the mirror, then the copies from the 500 on; counted, and in the event.
#[track_caller]
fn check(bed: &Testbed, rec: &Recording, request: &Packet, events: &[mirror_bpf::TriggerEvent]) {
    let expected = bed.check(rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1);
    assert_eq!(rec.mirror.replayed.len(), 1, "one replay: {:?}", rec.mirror.replayed);
    let replay = &rec.mirror.replayed[0];
    assert_eq!(replay.after_copies, 0, "the replay comes ahead of every copy");
    let p = &replay.packet;
    assert_eq!(
        (p.src, p.dst, p.seq, p.ack, p.flags),
        (request.src, request.dst, request.seq, request.ack, request.flags)
    );
    assert!(request.payload.starts_with(&p.payload), "the replay is the request's start");
    assert_eq!(p.len as usize, p.payload.len(), "its IP header says what it carries");
    assert_eq!(
        rec.mirror.packets.first().and_then(Packet::http_status),
        Some(500),
        "the response follows the replay"
    );
    let c = bed.counters();
    assert_eq!(c.get(stat_idx::STAT_REPLAYED), 1, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_FAILED), 0, "{c:?}");
    assert_eq!(c.get(stat_idx::STAT_REPLAY_MISSED), 0, "{c:?}");
    assert!(c.get(stat_idx::STAT_REPLAY_KEPT) >= 2, "{c:?}");
    assert_eq!(events.len(), 1, "{events:?}");
    let carried = events[0].request.as_ref().expect("the event carries the request");
    assert_eq!(carried.payload(), Some(&p.payload[..]), "the event has what the mirror got");
}

#[test]
fn request_behind_the_trigger_goes_ahead_of_the_response() {
    if !require_root() {
        return;
    }
    for (delivery, v6) in [(MirrorDelivery::Ingress, false), (MirrorDelivery::Egress, true)] {
        let setup = Setup { mode: AttachMode::Auto, method: MirrorMethod::Clone, delivery, v6 };
        let rounds = [raw::get("/foo"), raw::get("/bar"), raw::get("/foo")];
        let (bed, rec, request, events) = run(&setup, &rounds);
        assert_eq!(rec.mirror.replayed[0].packet.payload, request.payload, "{delivery:?}: kept whole");
        check(&bed, &rec, &request, &events);
    }
}

#[test]
fn request_behind_the_trigger_with_act_mirred() {
    if !require_root() {
        return;
    }
    let setup = Setup {
        mode: AttachMode::Tc,
        method: MirrorMethod::Mirred,
        delivery: MirrorDelivery::Egress,
        v6: false,
    };
    let rounds = [raw::get("/foo"), raw::get("/bar"), raw::get("/foo")];
    let (bed, rec, request, events) = run(&setup, &rounds);
    check(&bed, &rec, &request, &events);
}

#[test]
fn a_long_request_is_replayed_cut_with_its_length_fixed() {
    if !require_root() {
        return;
    }
    let setup = Setup {
        mode: AttachMode::Auto,
        method: MirrorMethod::Clone,
        delivery: MirrorDelivery::Ingress,
        v6: false,
    };
    let long = format!("GET /bar HTTP/1.1\r\nHost: test\r\nX-Pad: {}\r\n\r\n", "p".repeat(1200)).into_bytes();
    let rounds = [raw::get("/foo"), long, raw::get("/foo")];
    let (bed, rec, request, events) = run(&setup, &rounds);
    check(&bed, &rec, &request, &events);
    let p = &rec.mirror.replayed[0].packet;
    assert!(p.payload.len() < request.payload.len(), "cut: {} bytes", p.payload.len());
    assert!(p.payload.len() >= 500, "the first 512 bytes or so are kept: {}", p.payload.len());
    let carried = events[0].request.as_ref().unwrap();
    assert!(carried.wire_len as usize > carried.frame.len());
}
