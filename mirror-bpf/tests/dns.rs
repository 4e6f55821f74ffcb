//! DNS over UDP through the DNS program, with BPF_PROG_TEST_RUN: a query kept until its
//! response (timed, counted by rcode), a response whose question differs never taken for the
//! query's, messages the program cannot read counted, names longer than kept, UDP that is not
//! DNS left alone; the dns= rules with their filters (qname=, qname=!, qtype=, latency>) and
//! the event each trigger gives; a query left unanswered marked by the tick.

use std::thread::sleep;
use std::time::{Duration, Instant};

use mirror_bpf::testing::bed::Bed;
use mirror_bpf::testing::{consts::*, dns, ingress, packet::*};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{FlowKey, HistKind, TriggerKind};

const CLIENT_PORT: u16 = 40053;

/// A query from the client to the server's port 53.
fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .udp(CLIENT_PORT, 53)
        .payload(&dns::query(id, name, qtype))
        .build()
}

/// The server's response with `rcode`.
fn response(id: u16, name: &str, qtype: u16, rcode: u8) -> Vec<u8> {
    PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .udp(53, CLIENT_PORT)
        .payload(&dns::response(id, name, qtype, rcode))
        .build()
}

fn flow() -> FlowKey {
    FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), CLIENT_PORT),
        std::net::SocketAddr::new(V4_SERVER.into(), 53),
        17,
    )
}

/// DNS responses by rcode so far.
fn rcodes(bed: &Bed) -> Vec<u64> {
    bed.dp.dns_rcodes().unwrap().to_vec()
}

/// DNS answers timed so far, over every interface.
fn dns_histogram_count(bed: &Bed) -> u64 {
    let hists = bed.dp.histograms().unwrap();
    hists.iter().filter(|h| h.kind == HistKind::DnsResponse).map(|h| h.count).sum()
}

#[test]
fn a_response_finds_its_query_and_is_timed_and_counted_by_rcode() {
    let Some(bed) = Bed::new(&[]) else { return };
    let d = ingress(&bed.dp, &query(7, "Missing.Example.com", dns::A));
    assert_eq!((d.get(S::STAT_DNS_QUERIES), d.get(S::STAT_NON_TCP)), (1, 0));
    let d = ingress(&bed.dp, &response(7, "missing.example.com", dns::A, dns::NXDOMAIN));
    assert_eq!(
        (d.get(S::STAT_DNS_RESPONSES), d.get(S::STAT_DNS_UNMATCHED), d.get(S::STAT_DNS_MALFORMED)),
        (1, 0, 0),
        "the response matched its query (names compared in lower case)"
    );
    assert_eq!(rcodes(&bed)[3], 1, "counted as NXDOMAIN");
    assert_eq!(dns_histogram_count(&bed), 1, "timed");
    // Answered: a second response to the same id finds nothing.
    let d = ingress(&bed.dp, &response(7, "missing.example.com", dns::A, dns::NXDOMAIN));
    assert_eq!(d.get(S::STAT_DNS_UNMATCHED), 1);
    assert!(bed.take().is_empty(), "no rule, no event");
    let flows = bed.dp.flows().unwrap();
    assert!(flows.iter().any(|f| f.key == flow()), "the UDP flow is in the flow table");
}

#[test]
fn a_response_with_another_question_is_not_the_querys() {
    let Some(bed) = Bed::new(&["dns=nxdomain"]) else { return };
    ingress(&bed.dp, &query(9, "a.example.com", dns::A));
    let d = ingress(&bed.dp, &response(9, "b.example.com", dns::A, dns::NXDOMAIN));
    assert_eq!(d.get(S::STAT_DNS_UNMATCHED), 1, "same id, another name: unmatched");
    let ev = bed.take();
    assert_eq!(ev.len(), 1, "the rule still triggers on the response: {ev:?}");
    let q = ev[0].dns.as_ref().expect("a DNS event");
    assert_eq!(q.qname, "b.example.com", "named by the response's own question");
    assert_eq!(ev[0].request_to_response, None, "no query matched: no time");
    // Another type, same name and id: not the query's either.
    ingress(&bed.dp, &query(10, "c.example.com", dns::A));
    let d = ingress(&bed.dp, &response(10, "c.example.com", dns::AAAA, dns::SERVFAIL));
    assert_eq!(d.get(S::STAT_DNS_UNMATCHED), 1);
}

#[test]
fn unreadable_messages_are_counted_and_other_udp_is_left_alone() {
    let Some(bed) = Bed::new(&["dns=any"]) else { return };
    // A compression pointer in the question.
    let mut m = dns::query(1, "x", dns::A);
    m.truncate(12);
    m.extend_from_slice(&[0xC0, 0x0C, 0, 1, 0, 1]);
    let frame = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(CLIENT_PORT, 53).payload(&m).build();
    assert_eq!(ingress(&bed.dp, &frame).get(S::STAT_DNS_MALFORMED), 1);
    // A question cut short.
    let frame = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .udp(CLIENT_PORT, 53)
        .payload(&dns::query(2, "abcdefgh.example", dns::A)[..20])
        .build();
    assert_eq!(ingress(&bed.dp, &frame).get(S::STAT_DNS_MALFORMED), 1);
    // Two questions: not followed, not counted as malformed.
    let mut m = dns::query(3, "x", dns::A);
    m[5] = 2;
    let frame = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(CLIENT_PORT, 53).payload(&m).build();
    let d = ingress(&bed.dp, &frame);
    assert_eq!((d.get(S::STAT_DNS_QUERIES), d.get(S::STAT_DNS_MALFORMED)), (0, 0));
    // UDP between other ports: the parser only.
    let frame = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).udp(CLIENT_PORT, 443).payload(&[0; 40]).build();
    let d = ingress(&bed.dp, &frame);
    assert_eq!((d.get(S::STAT_NON_TCP), d.get(S::STAT_FLOWS_CREATED)), (1, 0));
    // A "query" from port 53 to a client port: the client is not a server.
    let frame = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .udp(53, CLIENT_PORT)
        .payload(&dns::query(4, "x.example", dns::A))
        .build();
    assert_eq!(ingress(&bed.dp, &frame).get(S::STAT_DNS_QUERIES), 0);
    assert!(bed.take().is_empty());
}

#[test]
fn a_long_name_is_kept_cut_and_passes_no_name_filter() {
    let Some(bed) = Bed::new(&["dns=nxdomain qname=.example.com"]) else { return };
    let long = format!("{}.example.com", ["abcdefghij"; 9].join("."));
    assert!(long.len() > 80);
    ingress(&bed.dp, &query(5, &long, dns::A));
    let d = ingress(&bed.dp, &response(5, &long, dns::A, dns::NXDOMAIN));
    assert_eq!(d.get(S::STAT_DNS_UNMATCHED), 0, "the cut names are the same");
    assert!(bed.take().is_empty(), "its end unknown, it passes no qname= filter");
}

#[test]
fn rules_and_their_filters_decide_and_the_event_names_the_question() {
    let Some(bed) =
        Bed::new(&["dns=nxdomain qname=.svc.cluster.local qtype=AAAA", "dns=servfail qname=!.cluster.local"])
    else {
        return;
    };
    let cases: [(u16, &str, u16, u8, bool); 6] = [
        (11, "web.shop.svc.cluster.local", dns::AAAA, dns::NXDOMAIN, true),
        (12, "web.shop.svc.cluster.local", dns::A, dns::NXDOMAIN, false),
        (13, "svc.cluster.local.evil", dns::AAAA, dns::NXDOMAIN, false),
        (14, "api.example.com", dns::A, dns::SERVFAIL, true),
        (15, "api.example.com.shop.svc.cluster.local", dns::A, dns::SERVFAIL, false),
        (16, "api.example.com", dns::A, dns::NXDOMAIN, false),
    ];
    for (i, (id, name, qtype, rcode, triggers)) in cases.into_iter().enumerate() {
        // A flow per case: a marked flow triggers no more.
        let port = 41000 + i as u16;
        let q = PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
            .udp(port, 53)
            .payload(&dns::query(id, name, qtype))
            .build();
        let r = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
            .udp(53, port)
            .payload(&dns::response(id, name, qtype, rcode))
            .build();
        ingress(&bed.dp, &q);
        let d = ingress(&bed.dp, &r);
        assert_eq!(d.get(S::STAT_DNS_TRIGGERS), u64::from(triggers), "{name} type {qtype} rcode {rcode}");
        let ev = bed.take();
        assert_eq!(ev.len(), usize::from(triggers), "{name}: {ev:?}");
        if let Some(e) = ev.first() {
            assert_eq!((e.kind, e.status), (TriggerKind::Dns, u16::from(rcode)));
            let dq = e.dns.as_ref().unwrap();
            assert_eq!((dq.id, dq.qtype, dq.qname.as_str()), (id, qtype, name));
            assert!(e.request_to_response.is_some(), "timed from its query");
            assert_eq!(e.request.as_ref().map(|r| r.frame.len()), Some(q.len()), "the query kept whole");
        }
    }
}

#[test]
fn latency_rules_take_slow_answers_only() {
    let Some(bed) = Bed::new(&["dns=any latency>200ms"]) else { return };
    ingress(&bed.dp, &query(21, "fast.example", dns::A));
    ingress(&bed.dp, &response(21, "fast.example", dns::A, 0));
    assert!(bed.take().is_empty(), "answered at once");
    ingress(&bed.dp, &query(22, "slow.example", dns::A));
    sleep(Duration::from_millis(250));
    ingress(&bed.dp, &response(22, "slow.example", dns::A, 0));
    let ev = bed.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].request_to_response.unwrap() >= Duration::from_millis(200));
}

#[test]
fn a_query_left_unanswered_is_marked_by_the_tick() {
    let Some(bed) = Bed::new(&["noresponse>300ms qname=.example"]) else { return };
    let start = Instant::now();
    ingress(&bed.dp, &query(31, "never.example", dns::AAAA));
    ingress(&bed.dp, &query(32, "other.test", dns::AAAA));
    let mut got = Vec::new();
    while start.elapsed() < Duration::from_secs(2) && got.is_empty() {
        got = bed.take();
    }
    let waited = start.elapsed();
    assert_eq!(got.len(), 1, "only the query the filter passes: {got:?}");
    let e = &got[0];
    assert_eq!(e.kind, TriggerKind::NoResponse);
    assert_eq!(e.dns.as_ref().map(|q| (q.id, q.qname.as_str())), Some((31, "never.example")));
    assert!(e.request.is_some(), "the query kept for the agent to replay");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_millis(700), "{waited:?}");
    assert!(bed.dp.mark(&flow()).unwrap().is_some(), "its flow marked");
}

/// `msg` as DNS over TCP sends it: its 2-byte length first, from `from` to `to` at `seq`.
fn tcp_segment(
    from: (std::net::Ipv4Addr, u16),
    to: (std::net::Ipv4Addr, u16),
    seq: u32,
    msg: &[u8],
) -> Vec<u8> {
    let mut payload = (msg.len() as u16).to_be_bytes().to_vec();
    payload.extend_from_slice(msg);
    PacketBuilder::ipv4(from.0, to.0)
        .tcp(from.1, to.1, tcp_flags::ACK | tcp_flags::PSH)
        .seq(seq)
        .payload(&payload)
        .build()
}

#[test]
fn dns_over_tcp_is_followed_and_a_segment_that_is_no_message_names_nothing() {
    let Some(bed) = Bed::new(&["dns=nxdomain"]) else { return };
    let (client, server) = ((V4_CLIENT, 42053), (V4_SERVER, 53));
    let d = ingress(&bed.dp, &tcp_segment(client, server, 1, &dns::query(41, "tcp.example", dns::A)));
    assert_eq!(d.get(S::STAT_DNS_QUERIES), 1, "the query after its length");
    let d = ingress(
        &bed.dp,
        &tcp_segment(server, client, 1, &dns::response(41, "tcp.example", dns::A, dns::NXDOMAIN)),
    );
    assert_eq!((d.get(S::STAT_DNS_RESPONSES), d.get(S::STAT_DNS_TRIGGERS)), (1, 1));
    let ev = bed.take();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].dns.as_ref().map(|q| q.qname.as_str()), Some("tcp.example"));
    // A later segment that happens to look like a response with no query kept: not taken.
    let (client, server) = ((V4_CLIENT, 42054), (V4_SERVER, 53));
    let d = ingress(
        &bed.dp,
        &tcp_segment(server, client, 9000, &dns::response(77, "guess.example", dns::A, dns::NXDOMAIN)),
    );
    assert_eq!(
        (d.get(S::STAT_DNS_RESPONSES), d.get(S::STAT_DNS_UNMATCHED), d.get(S::STAT_DNS_TRIGGERS)),
        (0, 1, 0)
    );
    assert!(bed.take().is_empty());
    assert_eq!(rcodes(&bed)[3], 1, "only the response that answered its query is counted");
}
