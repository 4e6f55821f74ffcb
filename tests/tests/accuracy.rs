//! Accuracy under concurrency: hundreds of keep-alive connections from one client pod to real
//! server stacks, each in a pod of its own (nginx, python's ThreadingHTTPServer, Go's net/http,
//! Node's http, and the raw server, which answers pipelined requests in one write so that 500s
//! begin mid-segment), IPv4 and IPv6, half with their requests pipelined, a known third
//! answered a 500 at known requests. What the clients received is the truth; the trigger
//! events and the flow table's marks must name exactly the connections that received a 500
//! (precision and recall 1.0), and the mirror must equal what the oracle reads in the client's
//! capture. Prints a table per stack.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Instant;

use mirror_bpf::testing::{in_ci, require_root};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, FlowKey, MirrorMethod};
use mirror_e2e::oracles::http_stream::{self, ResponseSeen};
use mirror_e2e::oracles::oracle::{self, Expected};
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::raw::{self, get};
use mirror_e2e::workload::servers::{self, Server};

/// Connections per stack.
const CONNECTIONS: usize = 80;
/// Clients running at once per stack, each opening its connections one after another.
const WORKERS: usize = 8;

/// The server stacks (and their pods): name, port.
const STACKS: [(&str, u16); 5] =
    [("nginx", 80), ("python", 8080), ("go", 8080), ("node", 8080), ("raw", 8080)];

/// What connection `i` of a stack does: its requests (`/fail` answers 500, `/ok` 200), how
/// many go in each write, and the address family.
struct Plan {
    paths: Vec<&'static str>,
    writes: Vec<usize>,
    v6: bool,
}

impl Plan {
    fn new(i: usize) -> Plan {
        let n = 4 + i % 5;
        let mut paths = vec!["/ok"; n];
        // A third fail: once at a request that moves with i, or also at the last.
        match i % 6 {
            0 => paths[i / 6 % n] = "/fail",
            3 => {
                paths[i / 6 % n] = "/fail";
                paths[n - 1] = "/fail";
            }
            _ => {}
        }
        // Half are pipelined: all requests in one write, or three at a time.
        let writes = match i % 4 {
            1 => vec![n],
            2 => (0..n).step_by(3).map(|s| (n - s).min(3)).collect(),
            _ => vec![1; n],
        };
        Plan { paths, writes, v6: (i / 2) % 2 == 1 }
    }

    fn pipelined(&self) -> bool {
        self.writes.iter().any(|&w| w > 1)
    }

    fn rounds(&self) -> Vec<Vec<u8>> {
        let mut paths = self.paths.iter();
        self.writes.iter().map(|&w| paths.by_ref().take(w).flat_map(|p| get(p)).collect()).collect()
    }
}

/// What one connection received.
struct Received {
    stack: usize,
    flow: FlowKey,
    pipelined: bool,
    statuses: Vec<u16>,
}

/// The columns of a row of the table after its connections (besides those that received a
/// 500, shown after the pipelined): the indices of `Row::counts`.
const PIPELINED: usize = 0;
const RESPONSES_500: usize = 1;
const MID_SEGMENT_500: usize = 2;

/// One row of the table.
type Row = oracle::Row<3>;

/// A stack that cannot run here: fails in CI, else says so and is left out (false).
fn missing(stack: &str, what: &str) -> bool {
    assert!(!in_ci(), "the {stack} stack needs {what}, and CI=true forbids leaving it out");
    eprintln!("NOT RUN: the {stack} stack ({what} not found)");
    false
}

#[test]
fn triggers_are_exact_under_concurrency_on_five_server_stacks() {
    if !require_root() {
        return;
    }
    let start = Instant::now();
    let roles: Vec<&str> = ["client"].into_iter().chain(STACKS.iter().map(|(name, _)| *name)).collect();
    let mut bed = Testbed::new(&roles);
    // Built while nothing else runs: the first build on a machine compiles net/http.
    let go = servers::go_toolchain().map(|go| servers::build_go_server(&go, bed.dir.path()));
    let mut running = Vec::new();
    for (i, (name, port)) in STACKS.iter().enumerate() {
        let started = match *name {
            "nginx" => {
                bed.nginx(name, *port);
                true
            }
            "python" => {
                bed.python(name, *port);
                true
            }
            "raw" => {
                bed.raw_server(name, *port);
                true
            }
            "go" => match &go {
                Some(binary) => {
                    let server = Server::go(&bed.pod(name).ns, *port, binary);
                    bed.keep_server(server);
                    true
                }
                None => missing(name, "a Go toolchain (go in PATH or /usr/local/go/bin/go)"),
            },
            "node" => match servers::node_runtime() {
                Some(node) => {
                    let server = Server::node(&bed.pod(name).ns, *port, &node);
                    bed.keep_server(server);
                    true
                }
                None => missing(name, "Node.js (node in PATH or /usr/bin/node)"),
            },
            other => unreachable!("{other}"),
        };
        if started {
            running.push(i);
        }
    }
    bed.mirror_to_sink();
    bed.add_rule("status=500");
    bed.attach(AttachMode::Auto, MirrorMethod::Clone);
    let events = bed.events();
    let setup = start.elapsed();

    let client = &bed.pod("client").ns;
    let servers: Vec<(usize, SocketAddr, SocketAddr)> = running
        .iter()
        .map(|&s| {
            let (name, port) = STACKS[s];
            (
                s,
                SocketAddr::new(bed.pod(name).addr(false), port),
                SocketAddr::new(bed.pod(name).addr(true), port),
            )
        })
        .collect();
    // Thousands of packets in bursts: tcpdump needs room.
    bed.capture_buffer_kib(128 * 1024);
    let traffic = Instant::now();
    let mut received: Vec<Received> = Vec::new();
    let rec = bed.record("client", || {
        std::thread::scope(|scope| {
            let workers: Vec<_> = servers
                .iter()
                .flat_map(|&(stack, v4, v6)| {
                    (0..WORKERS).map(move |w| {
                        scope.spawn(move || {
                            let _inside = client.enter();
                            (w..CONNECTIONS)
                                .step_by(WORKERS)
                                .map(|i| {
                                    let plan = Plan::new(i);
                                    let server = if plan.v6 { v6 } else { v4 };
                                    let ex = raw::exchange_here(server, &plan.rounds());
                                    let want: Vec<u16> = plan
                                        .paths
                                        .iter()
                                        .map(|p| if *p == "/fail" { 500 } else { 200 })
                                        .collect();
                                    assert_eq!(ex.statuses(), want, "{} connection {i}", STACKS[stack].0);
                                    Received {
                                        stack,
                                        flow: FlowKey::new(ex.local, server, 6),
                                        pipelined: plan.pipelined(),
                                        statuses: ex.statuses(),
                                    }
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                })
                .collect();
            for w in workers {
                received.extend(w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            }
        });
    });
    let traffic = traffic.elapsed();

    let flows: BTreeSet<FlowKey> = received.iter().map(|r| r.flow).collect();
    assert_eq!(flows.len(), received.len(), "a connection reused another's endpoints");
    let truth: BTreeSet<FlowKey> =
        received.iter().filter(|r| r.statuses.contains(&500)).map(|r| r.flow).collect();
    let by_events: BTreeSet<FlowKey> = events.take().iter().map(|e| e.key).collect();
    let by_marks: BTreeSet<FlowKey> = bed
        .dp
        .flows()
        .expect("reading flows")
        .into_iter()
        .filter(|f| f.mark.is_some())
        .map(|f| f.key)
        .collect();
    let triggered: BTreeSet<FlowKey> = by_events.union(&by_marks).copied().collect();
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    let oracle: BTreeMap<FlowKey, u64> = expected.triggered.iter().map(|t| (t.flow, t.packets)).collect();
    // 500s whose status line does not begin a segment: after other bytes, or split.
    let mid_segment: BTreeMap<FlowKey, usize> = http_stream::conversations(&rec.reference)
        .iter()
        .map(|c| {
            let mid =
                |r: &&ResponseSeen| r.status == 500 && (!r.starts_segment || r.first_packet != r.packet);
            (c.flow, c.responses.iter().filter(mid).count())
        })
        .collect();
    let mut mirrored: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for p in &rec.mirror.packets {
        *mirrored.entry(p.flow()).or_default() += 1;
    }

    let mut rows: Vec<(usize, Row)> = running.iter().map(|&s| (s, Row::default())).collect();
    for r in &received {
        let row = &mut rows.iter_mut().find(|(s, _)| *s == r.stack).unwrap().1;
        let fail = truth.contains(&r.flow);
        let hit = triggered.contains(&r.flow);
        row.connections += 1;
        row.counts[PIPELINED] += usize::from(r.pipelined);
        row.relevant += usize::from(fail);
        row.counts[RESPONSES_500] += r.statuses.iter().filter(|s| **s == 500).count();
        row.counts[MID_SEGMENT_500] += mid_segment.get(&r.flow).copied().unwrap_or(0);
        row.triggered += usize::from(hit);
        row.correct += usize::from(hit && fail);
        row.mirrored += mirrored.get(&r.flow).copied().unwrap_or(0);
        row.expected_mirrored += oracle.get(&r.flow).copied().unwrap_or(0);
    }
    let mut total = Row::default();
    rows.iter().for_each(|(_, r)| total.add(r));
    // Those that received a 500 are shown after the pipelined.
    let line = |name: &str, r: &Row| r.line(name, RESPONSES_500);
    let mut table = vec![
        "| stack | connections | pipelined | received a 500 | 500s | 500s mid-segment | triggered | precision | recall | mirrored / expected packets |".to_string(),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|".to_string(),
    ];
    table.extend(rows.iter().map(|(s, r)| line(STACKS[*s].0, r)));
    table.push(line("all", &total));
    eprintln!(
        "accuracy, rule status=500: {} connections, {} requests, {WORKERS} clients per stack at once \
         (set-up {:.1} s, traffic {:.1} s)\n{}",
        received.len(),
        received.iter().map(|r| r.statuses.len()).sum::<usize>(),
        setup.as_secs_f64(),
        traffic.as_secs_f64(),
        table.join("\n")
    );

    // The harness first: the oracle, reading the capture, must find what the clients received.
    let oracle_flows: BTreeSet<FlowKey> = oracle.keys().copied().collect();
    assert_eq!(oracle_flows, truth, "the oracle disagrees with the clients");
    // The classifier.
    let show = |set: &BTreeSet<FlowKey>| set.iter().map(|f| format!("  {f}")).collect::<Vec<_>>().join("\n");
    let false_triggers: BTreeSet<FlowKey> = triggered.difference(&truth).copied().collect();
    let missed: BTreeSet<FlowKey> = truth.difference(&triggered).copied().collect();
    assert!(
        false_triggers.is_empty() && missed.is_empty(),
        "precision {:.3}, recall {:.3}\nfalse triggers:\n{}\nmissed:\n{}",
        total.precision(),
        total.recall(),
        show(&false_triggers),
        show(&missed)
    );
    assert_eq!(by_events, by_marks, "trigger events and marks disagree");
    assert_eq!(bed.counters().get(stat_idx::STAT_TRIGGERS), truth.len() as u64);
    bed.check(&rec, |status, _| status == 500);
    eprintln!("accuracy: {:.1} s in all", start.elapsed().as_secs_f64());
}
