//! The classifier's cost on a steady HTTP/2 exchange as h2load makes it against nginx (ten
//! requests in flight per connection: one client segment of ten HEADERS frames, one server
//! segment of ten answers, each a HEADERS frame and a DATA frame) under BPF_PROG_TEST_RUN, one
//! run per segment, beside the empty program on the same segments. The header blocks are coded
//! as those tools code them once their connection is warm: the request's fields indexed (the
//! authority and user agent from the dynamic table), the answer's status indexed and its other
//! fields literal, Huffman-coded, not indexed.
//!
//! Usage: `h2_cost [EXCHANGES]` (default 5000; the first tenth warms up), as root.
use mirror_bpf::testing::h2::{self, kind, Block, Conn, Indexing, Name, Text};
use mirror_bpf::testing::{self, run_repeat, SkbContext};

/// Requests in flight per connection (h2load -m10).
const IN_FLIGHT: u32 = 10;

/// The client's first segment: preface, SETTINGS, and the first ten requests, whose literals
/// insert the authority and the user agent into the dynamic table.
fn opening(conn: &mut Conn) -> (Vec<u8>, Vec<u8>) {
    let mut c = h2::PREFACE.to_vec();
    c.extend(h2::client_settings());
    let first = Block::request("GET", "/", "198.18.2.2:8080").literal(
        Indexing::Incremental,
        Name::Index(h2::static_index::USER_AGENT),
        Text::Raw("h2load nghttp2/1.52.0"),
    );
    c.extend(h2::headers(1, &first));
    let mut s = h2::server_settings();
    s.extend(h2::settings_ack());
    s.extend(answers(1, 1));
    (conn.client(&c), conn.server(&s))
}

/// A warm request: every field indexed (user agent 62, authority 63).
fn request(stream: u32) -> Vec<u8> {
    let block = Block::new()
        .indexed(h2::static_index::METHOD_GET)
        .indexed(h2::static_index::SCHEME_HTTP)
        .indexed(h2::static_index::PATH_ROOT)
        .indexed(h2::DYNAMIC_FIRST + 1)
        .indexed(h2::DYNAMIC_FIRST);
    h2::headers(stream, &block)
}

/// The answers to `n` streams from `first`: nginx's fields, then four bytes of DATA.
fn answers(first: u32, n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let stream = first + 2 * i;
        let block = Block::new()
            .status(200)
            .literal(Indexing::Without, Name::Index(h2::static_index::SERVER), Text::Huffman("nginx/1.22.1"))
            .literal(
                Indexing::Without,
                Name::Index(h2::static_index::DATE),
                Text::Huffman("Fri, 27 Nov 2026 22:00:00 GMT"),
            )
            .literal(
                Indexing::Without,
                Name::Index(h2::static_index::CONTENT_TYPE),
                Text::Huffman("application/octet-stream"),
            )
            .literal(Indexing::Without, Name::Index(h2::static_index::CONTENT_LENGTH), Text::Huffman("4"));
        out.extend(h2::headers(stream, &block));
        out.extend(h2::frame(kind::DATA, h2::flags::END_STREAM, stream, b"foo\n"));
    }
    out
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5000);
    let _ = testing::pin_thread(1);
    testing::enter_private_netns();
    let rig = testing::rig::Rig::new(1, testing::rig::mirror_veth());
    let empty = testing::empty_program().expect("empty program");
    let prog = rig.prog();
    let ctx = SkbContext::default();
    let mut conns: Vec<Conn> = (0..4).map(|i| Conn::new(41000 + i, 8080)).collect();
    for c in &mut conns {
        let (a, b) = opening(c);
        run_repeat(prog, &a, ctx, 1);
        run_repeat(prog, &b, ctx, 1);
    }
    let mut next = vec![3u32; conns.len()];
    let (mut req, mut resp, mut req_e, mut resp_e) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let c = i % conns.len();
        let first = next[c];
        let reqs: Vec<u8> = (0..IN_FLIGHT).flat_map(|k| request(first + 2 * k)).collect();
        let a = conns[c].client(&reqs);
        let b = conns[c].server(&answers(first, IN_FLIGHT));
        next[c] = first + 2 * IN_FLIGHT;
        req.push(run_repeat(prog, &a, ctx, 1).2);
        req_e.push(run_repeat(&empty.progs.tc_empty, &a, ctx, 1).2);
        resp.push(run_repeat(prog, &b, ctx, 1).2);
        resp_e.push(run_repeat(&empty.progs.tc_empty, &b, ctx, 1).2);
    }
    let skip = n / 10;
    let stat = |mut v: Vec<f64>| {
        let mut v = v.split_off(skip);
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
    };
    for (name, a, e) in [("requests", req, req_e), ("answers", resp, resp_e)] {
        let ((ma, aa), (me, ae)) = (stat(a), stat(e));
        println!(
            "{name:9} ({IN_FLIGHT} per segment) classifier median {ma:6.0} mean {aa:6.0} | empty median {me:4.0} \
             mean {ae:4.0} | added median {:6.0}, per message {:4.0}",
            ma - me,
            (ma - me) / f64::from(IN_FLIGHT)
        );
    }
    println!("{:?}", rig.counters());
}
