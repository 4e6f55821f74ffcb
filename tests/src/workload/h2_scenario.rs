//! The HTTP/2 and gRPC scenario (`tests/tests/h2.rs`): the stacks in their pods, the clients'
//! runs, all at once from one pod, and what they recorded; then the harness's own checks on a
//! recording of it (the oracle and tshark against the clients), before any classifier is
//! judged.
//!
//! Servers: grpc-go, grpcio and @grpc/grpc-js (each failing the calls whose request asks for
//! it), nginx serving h2c with prior knowledge (`/fail` 500) and an h2c server that takes
//! `Upgrade: h2c`. Clients: each gRPC stack's own (channels of calls one after another, or all
//! at once), `nghttp` and `h2load`, `curl --http2-prior-knowledge` and `curl --http2`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mirror_bpf::testing::in_ci;
use mirror_bpf::FlowKey;

use crate::capture::pcap::Trace;
use crate::capture::tshark::{self, Aspects, Decode};
use crate::oracles::h2_oracle::{self, H2Expected, H2Rule};
use crate::topology::netns::{Pod, Topology};
use crate::workload::h2_stacks::{self, at, Channel, Daemon, Grpc, GrpcCall, GrpcPlan, H2Call, PlannedCall};
use crate::workload::servers;

/// The rules, in the order installed.
pub const RULES: [&str; 3] =
    ["status=500", "grpc-status=internal,unavailable", "grpc-status=not_found path=/mirror.Inventory/"];

/// The gRPC servers' port.
pub const GRPC_PORT: u16 = 50051;
/// nginx's port for nghttp and curl.
pub const NGINX_PORT: u16 = 80;
/// nginx's port for h2load's failing connection (h2load names no port: the server's tells).
pub const H2LOAD_FAIL_PORT: u16 = 8081;
/// nginx's port for h2load's other connection.
pub const H2LOAD_PASS_PORT: u16 = 8082;
/// The upgrade-capable h2c server's port.
pub const UPGRADE_PORT: u16 = 8080;
/// Every server port, all HTTP/2.
pub const PORTS: [u16; 5] = [GRPC_PORT, NGINX_PORT, H2LOAD_FAIL_PORT, H2LOAD_PASS_PORT, UPGRADE_PORT];

/// The Greeter's method.
pub const GREETER: &str = "/helloworld.Greeter/SayHello";
/// The Inventory's method (`path=/mirror.Inventory/`).
pub const INVENTORY: &str = "/mirror.Inventory/Get";

/// The pods: the client, then one per server.
pub const ROLES: [&str; 6] = ["client", "grpcgo", "grpcpy", "grpcnode", "nginx", "h2py"];

/// A stack that cannot run here: fails in CI, else says so and is left out (false).
pub fn missing(stack: &str, what: &str) -> bool {
    assert!(!in_ci(), "the {stack} stack needs {what}, and CI=true forbids leaving it out");
    eprintln!("NOT RUN: the {stack} stack ({what} not found)");
    false
}

/// The rules, read.
pub fn rules() -> Vec<H2Rule> {
    RULES.iter().map(|r| H2Rule::parse(r)).collect()
}

/// The stacks this machine has: gRPC stacks by pod role; nghttp2's clients; a python3 with h2.
pub struct Stacks {
    /// (role, stack).
    pub grpc: Vec<(&'static str, Grpc)>,
    /// nghttp and h2load are there.
    pub nghttp2: bool,
    /// A python3 that imports h2 (the upgrade server).
    pub h2: Option<PathBuf>,
}

impl Stacks {
    /// Finds (builds, installs into the cache) what this machine has; what it lacks fails in
    /// CI and is left out elsewhere.
    pub fn find() -> Stacks {
        let go = match servers::go_toolchain() {
            Some(go) => Some(Grpc::Go(h2_stacks::build_grpc_go(&go))),
            None => none(missing("grpc-go", "a Go toolchain (go in PATH or /usr/local/go/bin/go)")),
        };
        let python = match h2_stacks::python_with("grpc") {
            Some(p) => Some(Grpc::Python(p)),
            None => none(missing("grpcio", "python3 with grpc (python3-grpcio)")),
        };
        let node = match (servers::node_runtime(), h2_stacks::npm()) {
            (Some(node), Some(npm)) => Some(Grpc::Node(node, h2_stacks::install_grpc_js(&npm))),
            _ => none(missing("grpc-js", "Node.js and npm")),
        };
        let nghttp2 = (servers::find_program("nghttp", "/usr/bin/nghttp").is_some()
            && servers::find_program("h2load", "/usr/bin/h2load").is_some())
            || missing("nghttp2", "nghttp and h2load (nghttp2-client)");
        let h2 = match h2_stacks::python_with("h2") {
            Some(p) => Some(p),
            None => none(missing("h2c upgrade", "python3 with h2 (python3-h2)")),
        };
        let grpc = [("grpcgo", go), ("grpcpy", python), ("grpcnode", node)]
            .into_iter()
            .filter_map(|(r, g)| Some((r, g?)))
            .collect();
        Stacks { grpc, nghttp2, h2 }
    }

    /// Starts the servers in their pods of `topo` (files in `dir`); they stop when dropped.
    pub fn start(&self, topo: &Topology, dir: &Path) -> Vec<Daemon> {
        let mut daemons: Vec<Daemon> = Vec::new();
        for (role, g) in &self.grpc {
            daemons.push(g.server(&topo.pod(role).ns, GRPC_PORT));
        }
        daemons.push(h2_stacks::nginx_h2c(
            topo.pod("nginx"),
            &[NGINX_PORT, H2LOAD_FAIL_PORT, H2LOAD_PASS_PORT],
            dir,
        ));
        if let Some(python) = &self.h2 {
            daemons.push(h2_stacks::h2c_upgrade_server(python, &topo.pod("h2py").ns, UPGRADE_PORT));
        }
        daemons
    }

    /// Runs every client at once from the "client" pod of `topo` (files in `dir`): the
    /// connections, by their clients' records.
    pub fn run_clients(&self, topo: &Topology, dir: &Path) -> Vec<Conn> {
        let client = topo.pod("client");
        let (nginx, h2py) = (topo.pod("nginx"), topo.pod("h2py"));
        let mut conns = Vec::new();
        std::thread::scope(|scope| {
            let mut runs: Vec<std::thread::ScopedJoinHandle<'_, Vec<Conn>>> = Vec::new();
            for (role, g) in &self.grpc {
                let plan = grpc_plan(topo.pod(role));
                runs.push(scope.spawn(move || {
                    let calls = g.client(&client.ns, &plan, dir);
                    grpc_conns(g.name(), &plan, &calls, client)
                }));
            }
            if self.nghttp2 {
                runs.push(scope.spawn(move || {
                    let mixed = ["/ok", "/ok", "/fail", "/ok", "/ok", "/fail", "/ok", "/ok"];
                    [(false, &mixed[..]), (true, &["/ok"; 6][..])]
                        .into_iter()
                        .map(|(v6, paths)| {
                            let server = at(nginx, v6, NGINX_PORT);
                            let calls = h2_stacks::nghttp(&client.ns, server, paths, false);
                            h2_conn("nginx / nghttp", server, calls, client, false)
                        })
                        .collect()
                }));
                runs.push(scope.spawn(move || {
                    [
                        (H2LOAD_FAIL_PORT, &["/ok", "/ok", "/ok", "/fail"][..]),
                        (H2LOAD_PASS_PORT, &["/ok"][..]),
                    ]
                    .into_iter()
                    .map(|(port, paths)| {
                        let server = at(nginx, port == H2LOAD_PASS_PORT, port);
                        let calls = h2_stacks::h2load(&client.ns, server, paths, 40, 4, dir);
                        h2_conn("nginx / h2load", server, calls, client, false)
                    })
                    .collect()
                }));
            }
            runs.push(scope.spawn(move || {
                // One request per connection (curl 7.88's prior knowledge fails any after).
                [(false, "/ok"), (false, "/fail"), (true, "/ok"), (true, "/fail")]
                    .into_iter()
                    .map(|(v6, path)| {
                        let server = at(nginx, v6, NGINX_PORT);
                        let calls = h2_stacks::curl(&client.ns, server, &[path], false);
                        h2_conn("nginx / curl", server, calls, client, true)
                    })
                    .collect()
            }));
            if self.h2.is_some() {
                runs.push(scope.spawn(move || {
                    let plans: [(bool, &[&str], bool); 5] = [
                        (false, &["/ok", "/ok", "/fail", "/ok"], false),
                        (true, &["/fail", "/ok", "/ok"], false),
                        (false, &["/ok", "/ok"], false),
                        (false, &["/ok", "/ok", "/fail", "/ok"], true),
                        (true, &["/ok", "/ok"], true),
                    ];
                    plans
                        .into_iter()
                        .map(|(v6, paths, curl)| {
                            let server = at(h2py, v6, UPGRADE_PORT);
                            if curl {
                                let calls = h2_stacks::curl(&client.ns, server, paths, true);
                                h2_conn("upgrade / curl --http2", server, calls, client, true)
                            } else {
                                let calls = h2_stacks::nghttp(&client.ns, server, paths, true);
                                h2_conn("upgrade / nghttp -u", server, calls, client, false)
                            }
                        })
                        .collect()
                }));
            }
            for r in runs {
                conns.extend(r.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            }
        });
        conns
    }
}

/// Nothing, after [`missing`] said why.
fn none<T>(_: bool) -> Option<T> {
    None
}

/// A channel of `n` calls (every third to the Inventory service, the rest to the Greeter, all
/// OK) but for `special` (index, method, code).
pub fn channel(target: SocketAddr, burst: bool, n: usize, special: &[(usize, &str, u32)]) -> Channel {
    let calls = (0..n)
        .map(|i| match special.iter().find(|(k, _, _)| *k == i) {
            Some((_, method, code)) => PlannedCall { method: method.to_string(), code: *code },
            None => PlannedCall { method: if i % 3 == 2 { INVENTORY } else { GREETER }.to_string(), code: 0 },
        })
        .collect();
    Channel { target, burst, calls }
}

/// What each gRPC client does against its server: seven connections, four of which get a call
/// the rules match (INTERNAL, UNAVAILABLE, or NOT_FOUND from the Inventory service), at known
/// calls, one of them among calls made all at once; the others get NOT_FOUND from the Greeter
/// or INVALID_ARGUMENT, which no rule matches, or only OK.
pub fn grpc_plan(server: &Pod) -> GrpcPlan {
    let t = |v6| at(server, v6, GRPC_PORT);
    GrpcPlan {
        channels: vec![
            channel(t(false), false, 10, &[]),
            channel(t(false), false, 10, &[(4, GREETER, 13), (7, GREETER, 14)]),
            channel(t(true), false, 10, &[(2, GREETER, 5), (5, INVENTORY, 3)]),
            channel(t(true), false, 12, &[(6, INVENTORY, 5)]),
            channel(t(false), true, 8, &[(5, GREETER, 14)]),
            channel(t(true), true, 8, &[(3, GREETER, 5)]),
            channel(t(false), false, 6, &[(0, INVENTORY, 13)]),
        ],
    }
}

/// How a connection is known from its client's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// By its local address: (local, server).
    Port(SocketAddr, SocketAddr),
    /// As the only connection to this server address.
    OnlyTo(SocketAddr),
}

/// One call by its client's record.
#[derive(Debug, Clone)]
pub struct Call {
    /// Its index among the connection's calls.
    pub index: usize,
    /// Its stream, when the client says or its calls went one after another.
    pub stream: Option<u32>,
    /// Its `:path`.
    pub path: String,
    /// HTTP: the status received.
    pub status: Option<u16>,
    /// gRPC: the code received.
    pub grpc: Option<u32>,
}

impl Call {
    /// Whether some rule matches its outcome.
    pub fn fails(&self, rules: &[H2Rule]) -> bool {
        rules.iter().any(|r| r.matches_outcome(self.status, self.grpc, Some((&self.path, None))).is_some())
    }
}

/// One connection by its client's record.
#[derive(Debug, Clone)]
pub struct Conn {
    /// Which stack and client: the table's row.
    pub row: &'static str,
    /// How it is known.
    pub known: Known,
    /// Its calls, in the order made.
    pub calls: Vec<Call>,
}

impl Conn {
    /// The first call the rules match (in the order made).
    pub fn first_failing(&self, rules: &[H2Rule]) -> Option<&Call> {
        self.calls.iter().find(|c| c.fails(rules))
    }

    /// Its flow, `reference` telling the connections known by their server alone.
    #[track_caller]
    pub fn flow(&self, reference: &Trace) -> FlowKey {
        match self.known {
            Known::Port(local, server) => FlowKey::new(local, server, 6),
            Known::OnlyTo(server) => {
                let to: BTreeSet<FlowKey> =
                    reference.packets.iter().filter(|p| p.dst == server).map(|p| p.flow()).collect();
                assert_eq!(to.len(), 1, "one connection to {server} expected: {to:?}");
                *to.first().unwrap()
            }
        }
    }
}

/// One connection per curl, nghttp or h2load run, or per gRPC channel: the port its calls
/// agree on.
#[track_caller]
fn port_of(what: &str, ports: impl Iterator<Item = Option<u16>>) -> u16 {
    let ports: BTreeSet<Option<u16>> = ports.collect();
    match ports.iter().collect::<Vec<_>>().as_slice() {
        [Some(p)] if *p != 0 => *p,
        _ => panic!("{what}: its calls went over several connections or named none: {ports:?}"),
    }
}

/// The connections of a gRPC client's run, checked against its plan.
#[track_caller]
pub fn grpc_conns(row: &'static str, plan: &GrpcPlan, calls: &[GrpcCall], client: &Pod) -> Vec<Conn> {
    plan.channels
        .iter()
        .enumerate()
        .map(|(i, ch)| {
            let mine: Vec<&GrpcCall> = calls.iter().filter(|c| c.channel == i).collect();
            let port = port_of(&format!("{row} channel {i}"), mine.iter().map(|c| Some(c.port)));
            let local = SocketAddr::new(client.addr(ch.target.is_ipv6()), port);
            let mut calls: Vec<Call> = mine
                .iter()
                .map(|c| Call {
                    index: c.call,
                    stream: (!ch.burst).then_some(2 * c.call as u32 + 1),
                    path: c.method.clone(),
                    status: None,
                    grpc: Some(c.code),
                })
                .collect();
            calls.sort_by_key(|c| c.index);
            for (c, want) in calls.iter().zip(&ch.calls) {
                assert_eq!(
                    (c.path.as_str(), c.grpc),
                    (want.method.as_str(), Some(want.code)),
                    "{row} channel {i}"
                );
            }
            Conn { row, known: Known::Port(local, ch.target), calls }
        })
        .collect()
}

/// The connection of one curl, nghttp or h2load run; `in_order`: its requests went one after
/// another (request i on stream 2i + 1).
pub fn h2_conn(
    row: &'static str,
    server: SocketAddr,
    calls: Vec<H2Call>,
    client: &Pod,
    in_order: bool,
) -> Conn {
    let known = if calls.iter().all(|c| c.port.is_none()) {
        Known::OnlyTo(server)
    } else {
        let port = port_of(&format!("{row} to {server}"), calls.iter().map(|c| c.port));
        Known::Port(SocketAddr::new(client.addr(server.is_ipv6()), port), server)
    };
    let calls = calls
        .into_iter()
        .map(|c| Call {
            index: c.index,
            stream: c.stream.or(in_order.then_some(2 * c.index as u32 + 1)),
            path: c.path,
            status: Some(c.status),
            grpc: None,
        })
        .collect();
    Conn { row, known, calls }
}

/// What the harness read of a recording: the oracle's expectations, the connections' flows and
/// the truth, once they agree.
pub struct Judged {
    /// The oracle's reading of the client's capture.
    pub expected: H2Expected,
    /// Each connection's flow, in the order of `conns`.
    pub flows: Vec<FlowKey>,
    /// The flows with a call the rules match.
    pub failed: BTreeSet<FlowKey>,
    /// tshark on the client's capture: HEADERS frames, resolved fields, unresolved ones (none)
    /// and gRPC messages that agreed with the oracle.
    pub plain_agreed: [usize; 4],
}

/// The harness's checks of a recording (`reference`, its pcap file): every connection of the
/// clients is HTTP/2 to the oracle, which decodes all of it; the oracle finds the connections
/// the clients say failed, at the first failing call where they know its stream; tshark reads
/// the capture as the oracle does. Panics with what differs.
#[track_caller]
pub fn judge(reference: &Trace, pcap: &Path, conns: &[Conn], rules: &[H2Rule]) -> Judged {
    let flows: Vec<FlowKey> = conns.iter().map(|c| c.flow(reference)).collect();
    assert_eq!(flows.iter().collect::<BTreeSet<_>>().len(), flows.len(), "two runs share a connection");
    let failing: BTreeMap<FlowKey, &Conn> = conns
        .iter()
        .zip(&flows)
        .filter(|(c, _)| c.first_failing(rules).is_some())
        .map(|(c, f)| (*f, c))
        .collect();
    let e = H2Expected::from_reference(reference, rules);
    let mut wrong = Vec::new();
    for c in &e.conversations {
        let undecoded = c.undecoded();
        if !undecoded.is_empty() {
            wrong.push(format!("the oracle could not read {}: {undecoded:?}", c.flow));
        }
    }
    let h2_flows: BTreeSet<FlowKey> = e.conversations.iter().map(|c| c.flow).collect();
    for (f, c) in flows.iter().zip(conns) {
        if !h2_flows.contains(f) {
            wrong.push(format!("{f} ({}): the oracle found no HTTP/2 on it", c.row));
        }
    }
    let oracle: BTreeSet<FlowKey> = e.triggers.iter().map(|t| t.flow).collect();
    let failed: BTreeSet<FlowKey> = failing.keys().copied().collect();
    if oracle != failed {
        wrong.push(format!("the oracle disagrees with the clients: oracle {oracle:?}, clients {failed:?}"));
    }
    for t in &e.triggers {
        if let Some(call) = failing.get(&t.flow).and_then(|c| c.first_failing(rules)) {
            if call.stream.is_some_and(|s| s != t.stream) {
                wrong.push(format!(
                    "{}: the client's first failing call is on stream {:?} ({}), the oracle's {}",
                    t.flow, call.stream, call.path, t.stream
                ));
            }
        }
    }
    // tshark on the client's capture: prior knowledge on the ports said to be HTTP/2; the
    // upgrades left to its HTTP dissector, in a run of their own (tshark 4.0 stops reading an
    // upgraded connection's segment after its first DATA frame when any port is decoded as
    // HTTP/2).
    let (upgraded, known): (Vec<_>, Vec<_>) = e
        .conversations
        .iter()
        .map(|c| (c.flow, h2_oracle::late_view(c, reference, 0, &[])))
        .partition(|(f, _)| f.lo.port() == UPGRADE_PORT || f.hi.port() == UPGRADE_PORT);
    let decode = Decode {
        http2_ports: PORTS.iter().copied().filter(|p| *p != UPGRADE_PORT).collect(),
        ..Decode::default()
    };
    let all = Aspects { fields: true, grpc: Some(&[]) };
    let (mut differ, mut plain_agreed) = tshark::compare(&tshark::dissect(pcap, &decode), &known, all);
    let (more, agreed) = tshark::compare(&tshark::dissect(pcap, &Decode::default()), &upgraded, all);
    differ.extend(more);
    plain_agreed.iter_mut().zip(agreed).for_each(|(a, b)| *a += b);
    if !differ.is_empty() {
        wrong.push(format!(
            "tshark reads the client's capture otherwise than the oracle ({} packets):\n  {}",
            differ.len(),
            differ.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
        ));
    }
    assert!(wrong.is_empty(), "the harness:\n{}", wrong.join("\n"));
    Judged { expected: e, flows, failed, plain_agreed }
}
