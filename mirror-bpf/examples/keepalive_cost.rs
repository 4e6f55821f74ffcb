//! The classifier's cost on a steady keep-alive exchange (wrk's request, nginx's answer) under
//! BPF_PROG_TEST_RUN, one run per segment with advancing sequence numbers, beside the empty
//! program on the same segments: the per-flow state moves as on real traffic (requests queued,
//! answered, the framing followed), which repeating one packet does not give.
//!
//! Two classifiers run side by side, packet by packet: one keeping each request for a replay
//! (the default), one not: the cost of keeping them is the difference.
//!
//! Usage: `keepalive_cost [EXCHANGES]` (default 20000; the first tenth warms up), as root.
use mirror_bpf::testing::packet::PacketBuilder;
use mirror_bpf::testing::{self, run_repeat, SkbContext};

const REQ: &[u8] = b"GET /foo HTTP/1.1\r\nHost: 198.18.2.2\r\n\r\n";
const RESP: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 23 Nov 2026 05:40:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\nfoo\n";

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let _ = testing::pin_thread(1);
    testing::enter_private_netns();
    let mirror = testing::rig::mirror_veth();
    let rig = testing::rig::Rig::new(1, mirror);
    let mut plain = testing::rig::Rig::new(1, mirror);
    plain.dp.set_replay(false).expect("switching replays off");
    let empty = testing::empty_program().expect("empty program");
    let (prog, plain_prog) = (rig.prog(), plain.prog());
    let conns: Vec<u16> = (0..4).map(|i| 40000 + i).collect();
    let mut seq = vec![(1000u32, 5000u32); conns.len()];
    let (mut req_ns, mut resp_ns, mut req_e, mut resp_e) = (vec![], vec![], vec![], vec![]);
    let (mut req_p, mut resp_p) = (vec![], vec![]);
    let ctx = SkbContext::default();
    for i in 0..n {
        let c = i % conns.len();
        let (cs, ss) = seq[c];
        let req = PacketBuilder::ipv4(testing::consts::V4_CLIENT, testing::consts::V4_SERVER)
            .tcp(conns[c], 80, 0x18)
            .seq(cs)
            .payload(REQ)
            .build();
        let resp = PacketBuilder::ipv4(testing::consts::V4_SERVER, testing::consts::V4_CLIENT)
            .tcp(80, conns[c], 0x18)
            .seq(ss)
            .payload(RESP)
            .build();
        seq[c] = (cs + REQ.len() as u32, ss + RESP.len() as u32);
        req_ns.push(run_repeat(prog, &req, ctx, 1).2);
        req_p.push(run_repeat(plain_prog, &req, ctx, 1).2);
        req_e.push(run_repeat(&empty.progs.tc_empty, &req, ctx, 1).2);
        resp_ns.push(run_repeat(prog, &resp, ctx, 1).2);
        resp_p.push(run_repeat(plain_prog, &resp, ctx, 1).2);
        resp_e.push(run_repeat(&empty.progs.tc_empty, &resp, ctx, 1).2);
    }
    let c = rig.counters();
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
    };
    let skip = n / 10; // warm-up
    for (name, mut a, mut p, mut e) in
        [("request", req_ns, req_p, req_e), ("response", resp_ns, resp_p, resp_e)]
    {
        let (ma, aa) = med(&mut a.split_off(skip));
        let (mp, ap) = med(&mut p.split_off(skip));
        let (me, ae) = med(&mut e.split_off(skip));
        println!(
            "{name:9} classifier median {ma:6.0} mean {aa:6.0} | without replays median {mp:6.0} mean {ap:6.0} | \
             empty median {me:4.0} mean {ae:4.0} | added median {:6.0} (replays {:+4.0})",
            ma - me,
            ma - mp
        );
    }
    println!("{c:?}");
}
