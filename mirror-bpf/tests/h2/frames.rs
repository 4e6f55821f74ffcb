//! Frames followed by sequence number across segments: blocks split across segments and
//! continuation frames, interleaved streams, large data frames, padding and priority,
//! retransmissions and gaps.

use super::*;

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

/// More streams awaiting answers than the stream table holds (8,192 ways): 20 connections of
/// 500 requests each, none answered, each request's path naming its connection and stream.
/// Then a 500 on each connection, to its oldest request on the first ten and to its latest on
/// the last one: every request an event names is the one answered (a request pushed out of the
/// table is not named, never another), some of the oldest were pushed out (the table is full:
/// counted as streams missed), and the newest request of all is named.
#[test]
fn a_full_stream_table_names_no_other_request() {
    const CONNS: u16 = 20;
    const STREAMS: u32 = 500;
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let path = |conn: u16, stream: u32| format!("/c{conn}/s{stream}");
    let mut conns: Vec<Conn> = (0..CONNS).map(|i| Conn::new(47500 + i, PORT_HTTP)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        let i = i as u16;
        open(&bed, c, &[(1, Block::request("GET", &path(i, 1), "table.example"))]);
        for first in (3..2 * STREAMS).step_by(100) {
            let heads: Vec<u8> = (first..first + 100)
                .step_by(2)
                .flat_map(|s| {
                    Headers::new(s, &Block::request("GET", &path(i, s), "table.example")).end_stream().build()
                })
                .collect();
            let d = bed.run(&c.client(&heads));
            assert_eq!(h2c(&d).requests, 50, "connection {i}, streams from {first}");
        }
    }
    let last = 2 * STREAMS - 1;
    let mut answered = Vec::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let stream = if i < 10 {
            1
        } else if i == usize::from(CONNS) - 1 {
            last
        } else {
            continue;
        };
        answered.push((i as u16, stream));
        let d = bed.run(&c.server(&h2::headers(stream, &Block::new().status(500))));
        assert_eq!(h2c(&d).triggers, 1, "connection {i}");
    }
    let events = bed.take();
    assert_eq!(events.len(), answered.len(), "{events:?}");
    let mut missed = 0;
    for ((conn, stream), e) in answered.iter().zip(&events) {
        assert_eq!(e.stream, Some(*stream));
        match e.target.as_deref() {
            Some(target) => assert_eq!(target, path(*conn, *stream), "the request named"),
            None => missed += 1,
        }
    }
    assert!(missed > 0, "none of the ten oldest requests was pushed out: {events:?}");
    let newest = events.last().unwrap();
    assert_eq!(newest.target.as_deref(), Some(path(CONNS - 1, last).as_str()), "the newest request");
    let c = bed.dp.counters().unwrap();
    assert!(c.get(S::STAT_H2_STREAM_MISSED) >= missed, "{missed} not named");
}

/// More streams of one connection awaiting answers than its ring of buckets holds (128 ways):
/// 1,000 requests, none answered, then an answer to each, the newest first, the oldest (in its
/// ring) last with a 500. The streams past the ring are kept in their spill buckets: all but a
/// few (a spill bucket can fill, 4 ways of 2,048 buckets) are found by their answers, and the
/// one event names the oldest request.
#[test]
fn streams_past_a_connections_ring_are_kept() {
    const STREAMS: u32 = 1000;
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let path = |stream: u32| format!("/ring/s{stream}");
    let mut c = Conn::new(47600, PORT_HTTP);
    open(&bed, &mut c, &[(1, Block::request("GET", &path(1), "ring.example"))]);
    for first in (3..2 * STREAMS).step_by(100) {
        let heads: Vec<u8> = (first..first + 100)
            .step_by(2)
            .flat_map(|s| {
                Headers::new(s, &Block::request("GET", &path(s), "ring.example")).end_stream().build()
            })
            .collect();
        let d = bed.run(&c.client(&heads));
        assert_eq!(h2c(&d).requests, 50, "streams from {first}");
    }
    let mut missed = 0;
    for s in (3..2 * STREAMS).step_by(2).rev() {
        let d = h2c(&bed.run(&c.server(&h2::headers(s, &Block::new().status(200)))));
        assert_eq!((d.responses, d.triggers), (1, 0), "stream {s}");
        missed += d.stream_missed;
    }
    assert!(missed <= 5, "{missed} of {} answers found no stream", STREAMS - 1);
    let d = bed.run(&c.server(&h2::headers(1, &Block::new().status(500))));
    assert_eq!((h2c(&d).triggers, h2c(&d).stream_missed), (1, 0));
    let events = bed.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        said(&events[0]),
        (TriggerKind::Status, 500, Some(1), Some("GET"), Some("/ring/s1"), Some("ring.example"))
    );
}

/// The streams of the table that hold a request: (bucket, stream) of each way taken.
fn ways_taken(bed: &Bed) -> Vec<(u32, u32)> {
    let map = &bed.dp.skel().maps.h2_streams;
    let buckets = mirror_bpf::types::mirror_limits::H2_STREAM_BUCKETS.0;
    let ways = mirror_bpf::types::mirror_limits::H2_STREAM_WAYS.0 as usize;
    let mut taken = Vec::new();
    for b in 0..buckets {
        let v = map.lookup(&b.to_ne_bytes(), libbpf_rs::MapFlags::ANY).unwrap().expect("a bucket");
        // The bucket's heads first, struct h2_way_head each: seq, stream (u32), time (u64).
        for w in 0..ways {
            let stream = u32::from_ne_bytes(v[16 * w + 4..16 * w + 8].try_into().unwrap());
            if stream != 0 {
                taken.push((b, stream));
            }
        }
    }
    taken
}

/// Across NAT a connection's answers pass under its other tuple (the pod's address, not the
/// Service's): each answer finds the stream its request opened, and the stream is freed at
/// its end, whether its END_STREAM comes in the segment of its HEADERS or in a later one, or
/// the server resets it. The table holds no stream after.
#[test]
fn streams_answered_across_nat_are_freed_at_their_end() {
    use mirror_bpf::testing::consts::V4_CLIENT;
    use mirror_bpf::testing::packet::{tcp_flags, PacketBuilder};
    use std::net::{Ipv4Addr, SocketAddr};
    let Some(bed) = Bed::new(&["status=500"]) else { return };
    let pod = Ipv4Addr::new(198, 18, 9, 9);
    let mut c = Conn::new(47700, PORT_HTTP);
    let service = c.key();
    let behind = mirror_bpf::FlowKey::new(
        SocketAddr::new(V4_CLIENT.into(), c.cport),
        SocketAddr::new(pod.into(), PORT_HTTP),
        6,
    );
    // What conntrack teaches the data path: each tuple's other one (struct flow_nat: the peer's
    // key first).
    for (k, peer) in [(service, behind), (behind, service)] {
        let mut value = vec![0u8; std::mem::size_of::<mirror_bpf::types::flow_nat>()];
        let peer = peer.to_raw();
        let peer = testing::key_bytes(&peer);
        value[..peer.len()].copy_from_slice(peer);
        let k = k.to_raw();
        bed.dp.skel().maps.flow_nat.update(testing::key_bytes(&k), &value, libbpf_rs::MapFlags::ANY).unwrap();
    }
    let heads: Vec<u8> = [1u32, 3, 5]
        .iter()
        .flat_map(|s| {
            Headers::new(*s, &Block::request("GET", &format!("/nat/{s}"), "nat.example")).end_stream().build()
        })
        .collect();
    assert_eq!(h2c(&bed.run(&client_opens(&mut c, &heads))).requests, 3);
    assert_eq!(ways_taken(&bed).len(), 3, "the three requests' streams");
    // The server's stream as the pod sends it.
    let mut next = 0u32;
    let mut from_pod = |payload: &[u8]| {
        let seq = h2::FIRST_SEQ.wrapping_add(next);
        next += payload.len() as u32;
        PacketBuilder::ipv4(pod, V4_CLIENT)
            .tcp(PORT_HTTP, c.cport, tcp_flags::ACK | tcp_flags::PSH)
            .seq(seq)
            .payload(payload)
            .build()
    };
    let answer = |s: u32| h2::headers(s, &Block::new().status(200));
    // Stream 1 ends in its answer's segment, 3 in the next segment, 5 is reset by the server.
    let segments = [
        [h2::server_settings(), h2::settings_ack(), answer(1), h2::data(1, true, b"one")].concat(),
        answer(3),
        h2::data(3, true, b"three"),
        [answer(5), h2::rst_stream(5, 8)].concat(),
    ];
    let (mut responses, mut missed) = (0, 0);
    for seg in &segments {
        let d = h2c(&bed.run(&from_pod(seg)));
        responses += d.responses;
        missed += d.stream_missed;
    }
    assert_eq!((responses, missed), (3, 0), "each answer found its stream");
    assert_eq!(ways_taken(&bed), vec![], "streams left in the table");
}
