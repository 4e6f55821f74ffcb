//! Where the timer of `noresponse>` rules lives, by measurement. The data path has one BPF
//! timer, a tick every 10 ms that looks at the flows whose pending bit a request set
//! (`include/noresponse.h`); the alternatives are a BPF timer per flow (refused by this kernel
//! past a few hundred: their memory is allocated where BPF may not wait for it) and the agent
//! scanning every flow's pending requests (`flow_timing`) from user space. For the tick: the
//! cost per request on the common path (BPF_PROG_TEST_RUN, the same requests with and without a
//! noresponse rule) and how late the marks come with many requests pending at once (the real
//! timer, the real ring buffer). For the scan: what one read of `flow_timing` costs, hence the
//! CPU a scan often enough for the same lateness would take.

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use libbpf_rs::{MapCore, MapFlags};
use mirror_bpf::testing::{self, consts::*, packet::*, SkbContext};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{Datapath, DatapathOptions, TriggerKind};

/// What was measured.
pub struct Timers {
    /// Requests pending at once (one per flow).
    pub pending: usize,
    /// ns per request of a new flow: without a noresponse rule, with one (its pending bit set),
    /// medians of the batches.
    pub new_flow_ns: (f64, f64),
    /// ns per next request of a flow whose bit is set, without and with the rule.
    pub next_request_ns: (f64, f64),
    /// The rule's time.
    pub wait: Duration,
    /// Flows marked, of `pending`.
    pub marked: usize,
    /// How late the marks came (ms after the rule's time): p50, p99, max.
    pub late_ms: (f64, f64, f64),
    /// Ticks run meanwhile, and seconds from the first request to the last mark.
    pub ticks: u64,
    pub secs: f64,
    /// One user-space read of flow_timing at `flows` entries, ms (median of the reads).
    pub scan_ms: f64,
    pub flows: u32,
}

/// A request of flow `i` (client address and port from `i`), its `n`th on the connection.
fn request(i: usize, n: u32) -> Vec<u8> {
    const REQ: &[u8] = b"GET /pending HTTP/1.1\r\nHost: bench\r\n\r\n";
    let client = std::net::Ipv4Addr::new(198, 18, 64 + (i / 50_000) as u8, 2);
    PacketBuilder::ipv4(client, V4_SERVER)
        .tcp(1024 + (i % 50_000) as u16, PORT_HTTP, tcp_flags::ACK | tcp_flags::PSH)
        .seq(1000 + n * REQ.len() as u32)
        .payload(REQ)
        .build()
}

/// ns per run of each of `frames` (one test_run each), median over the frames.
fn per_request(dp: &Datapath<'_>, frames: impl Iterator<Item = Vec<u8>>) -> f64 {
    let mut ns: Vec<f64> = frames
        .map(|f| testing::run_repeat(&dp.skel().progs.tc_ingress_mirror, &f, SkbContext::default(), 1).2)
        .collect();
    ns.sort_by(f64::total_cmp);
    ns[ns.len() / 2]
}

/// Measures with `pending` flows (each a request pending) and a `noresponse>` of `wait`.
pub fn measure(pending: usize, wait: Duration) -> Result<Timers> {
    std::thread::spawn(move || {
        testing::enter_private_netns();
        run(pending, wait)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn run(pending: usize, wait: Duration) -> Result<Timers> {
    // A ring buffer that holds a burst of `pending` events (each carries its request's 640
    // bytes): the marks are measured, not the ring.
    let opts =
        DatapathOptions { ringbuf_bytes: (pending as u32 * 1024).next_power_of_two(), ..Default::default() };
    let flows = opts.flows_max;
    let mut dp = testing::load(&opts);
    // Without the rule: new flows, then their next requests (no timer anywhere).
    let without_new = per_request(&dp, (0..pending).map(|i| request(i, 0)));
    let without_next = per_request(&dp, (0..pending).map(|i| request(i, 1)));
    let rule = format!("noresponse>{}ms", wait.as_millis());
    dp.add_rule(rule.parse()?)?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let ring = dp.events(move |e| sink.lock().unwrap().push(e))?;
    let before = dp.counters()?;
    // With it: other flows, whose first request starts their timer, then their next ones.
    let first = pending;
    let armed_at = Instant::now();
    let with_new = per_request(&dp, (first..first + pending).map(|i| request(i, 0)));
    let with_next = per_request(&dp, (first..first + pending).map(|i| request(i, 1)));
    let armed_in = armed_at.elapsed();
    // The flows without a rule had no timer: only the second set is marked.
    let deadline = Instant::now() + wait + Duration::from_millis(1500) + armed_in;
    while Instant::now() < deadline && events.lock().unwrap().len() < pending {
        Datapath::poll_events(&ring, Duration::from_millis(20))?;
    }
    let secs = armed_at.elapsed().as_secs_f64();
    let c = dp.counters()?.since(&before);
    let events = events.lock().unwrap();
    ensure!(events.iter().all(|e| e.kind == TriggerKind::NoResponse), "an event of another kind");
    let mut late: Vec<f64> = events
        .iter()
        .filter_map(|e| e.request_to_response)
        .map(|w| (w.as_secs_f64() - wait.as_secs_f64()) * 1e3)
        .collect();
    late.sort_by(f64::total_cmp);
    let pick = |q: f64| late.get(((late.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(f64::NAN);
    // The alternative: a scan of every flow's pending requests from user space.
    let mut scans = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let read = dp.skel().maps.flow_timing.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)?.count();
        scans.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(read as u32 == flows, "a scan read {read} of {flows} flow_timing slots");
    }
    scans.sort_by(f64::total_cmp);
    Ok(Timers {
        pending,
        new_flow_ns: (without_new, with_new),
        next_request_ns: (without_next, with_next),
        wait,
        marked: events.len(),
        late_ms: (pick(0.5), pick(0.99), late.last().copied().unwrap_or(f64::NAN)),
        ticks: c.get(S::STAT_NORESPONSE_TICKS),
        secs,
        scan_ms: scans[scans.len() / 2],
        flows,
    })
}

/// The "Requests left unanswered" section of the report.
pub fn render(t: &Timers) -> String {
    let mut s = String::from("\n## Requests left unanswered: where the timer lives\n\n");
    let _ = writeln!(
        s,
        "One BPF timer, a tick every 10 ms over the flows with requests pending (the data path's \
         choice), against the agent scanning every flow's pending requests. ({} flows, each \
         with one request, under `noresponse>{}ms`; each request one test_run, median over the \
         requests. A BPF timer per flow is not a choice on this kernel: their memory is \
         allocated where BPF may not wait for it, and past a few hundred timers that fails.)\n",
        t.pending,
        t.wait.as_millis()
    );
    let _ = writeln!(s, "| measure | without the rule | with it | difference |");
    let _ = writeln!(s, "|---|---:|---:|---:|");
    for (what, (a, b)) in [
        ("a new flow's first request (its timer starts)", t.new_flow_ns),
        ("its next request (the timer runs)", t.next_request_ns),
    ] {
        let _ = writeln!(s, "| {what}, ns | {a:.0} | {b:.0} | {:+.0} |", b - a);
    }
    let _ = writeln!(
        s,
        "\nMarks: {} of {} flows (events read; a ring buffer too small for a burst drops some), \
         late by p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms after the rule's time (the wait as the \
         events give it, from each request's time); {} ticks in {:.1} s.\n",
        t.marked, t.pending, t.late_ms.0, t.late_ms.1, t.late_ms.2, t.ticks, t.secs
    );
    let _ = writeln!(
        s,
        "The alternative: one read of `flow_timing` ({} slots) from user space took {:.1} ms \
         (median of 5). To bound the lateness by 10 ms it would run every 10 ms: {:.0}% of a CPU, \
         whatever the traffic; at 100 ms, {:.0}%, and marks up to 100 ms late.",
        t.flows,
        t.scan_ms,
        100.0 * t.scan_ms / 10.0,
        100.0 * t.scan_ms / 100.0
    );
    s
}
