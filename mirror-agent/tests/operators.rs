//! What an operator reads, on real traffic in namespaces, checked with other tools than ours:
//!
//! - trigger events through a kube-proxy ClusterIP (iptables DNAT): `mirrorctl events`, its
//!   `-f` stream and the JSON lines of `events.output` carry the trigger once, with both tuples
//!   of the connection; each tuple's Community ID is the one the reference implementation (the
//!   `communityid` Python package) computes for the tuples tshark reads from the mirror capture;
//! - `/healthz`, `/readyz`, and `/metrics` parsed by the Prometheus client library's strict
//!   OpenMetrics parser, every name following Prometheus's conventions; every metric that the
//!   Grafana dashboard (`dashboards/mirror-agent.json`) queries is in that scrape;
//! - a rule POSTed with curl's default form Content-Type, or none, is taken as JSON.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mirror_agent::views::EventView;
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, SERVICE_PORT};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

use common::{bins, json, ATTACH, VETHS};

/// Where scripts/install-deps.sh puts the `communityid` package.
const PYTHON_LIBS: &str = "/usr/local/lib/mirror-tests/python";
/// The system's interpreter, for which the distribution's prometheus-client is installed.
const PYTHON: &str = "/usr/bin/python3";

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The distinct TCP tuples (src, dst) of a capture, as tshark reads them.
fn tshark_tuples(pcap: &std::path::Path) -> BTreeSet<(SocketAddr, SocketAddr)> {
    let out = run(Command::new("tshark").arg("-r").arg(pcap).args([
        "-Y",
        "tcp",
        "-T",
        "fields",
        "-E",
        "separator=,",
        "-e",
        "ip.src",
        "-e",
        "tcp.srcport",
        "-e",
        "ip.dst",
        "-e",
        "tcp.dstport",
    ]));
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let ep = |a: &str, p: &str| {
                SocketAddr::new(a.parse().expect("an address"), p.parse().expect("a port"))
            };
            (ep(f[0], f[1]), ep(f[2], f[3]))
        })
        .collect()
}

/// Community IDs of TCP tuples by the reference implementation.
fn reference_community_ids(tuples: &BTreeSet<(SocketAddr, SocketAddr)>) -> BTreeSet<String> {
    let script = "import sys, communityid\n\
        cid = communityid.CommunityID()\n\
        for line in sys.argv[1:]:\n\
        \x20   s, sp, d, dp = line.split(',')\n\
        \x20   print(cid.calc(communityid.FlowTuple.make_tcp(s, d, int(sp), int(dp))))\n";
    let args: Vec<String> =
        tuples.iter().map(|(s, d)| format!("{},{},{},{}", s.ip(), s.port(), d.ip(), d.port())).collect();
    let out = run(Command::new(PYTHON).env("PYTHONPATH", PYTHON_LIBS).arg("-c").arg(script).args(&args));
    out.lines().map(String::from).collect()
}

#[test]
fn events_carry_both_tuples_and_their_community_ids() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let _inside = topo.node.enter();
    let node = &topo.node;
    let server = topo.pod("server").addr(false);
    let kp = KubeProxy::install(node, Flavour::Iptables, false, server);
    let out_dir = tempfile::tempdir().unwrap();
    let events_file = out_dir.path().join("events.jsonl");
    let cfg = AgentConfig {
        rules: vec!["status=500".into()],
        extra: format!("events:\n  output: {}\n", serde_json::to_string(&events_file).unwrap()),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    assert_eq!(env.ctl_ok(&["events"]).trim(), "no trigger events yet");

    // Following from before the trigger (we started it: killed by its handle below).
    let mut follower = Command::new(&bins().ctl)
        .arg("--socket")
        .arg(env.socket())
        .args(["-o", "json", "events", "-f"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting mirrorctl events -f");
    let (tx, followed) = mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });

    let pcap = env.dir().join("mirror.pcap");
    let capture = Capture::start(node, &env.sink_peer(), "", &pcap);
    let vip = SocketAddr::new(kp.vip(), SERVICE_PORT);
    let urls = ["/foo", "/bar", "/foo"].map(|p| url(vip.ip(), vip.port(), p));
    assert_eq!(client::get_keepalive(&topo.pod("client").ns, &urls), [200, 500, 200]);
    std::thread::sleep(SETTLE);
    capture.stop();

    let events: Vec<EventView> = json(&env.ctl_ok(&["-o", "json", "events"]));
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    let client_addr = topo.pod("client").addr(false);
    assert_eq!(
        (e.seq, e.status, e.rule_id, e.rule.as_str()),
        (1, 500, 1, "status=500 packets=10000 bytes=0 duration=60s")
    );
    assert_eq!((e.method.as_deref(), e.target.as_deref()), (Some("GET"), Some("/bar")));
    assert!(e.response_ms.is_some_and(|ms| ms > 0.0 && ms < 1000.0), "{e:?}");
    assert!(e.nat, "the ClusterIP connection is translated: {e:?}");
    assert_eq!(e.client_side.server, vip.to_string(), "{e:?}");
    assert_eq!(e.server_side.server, SocketAddr::new(server, SERVICE_PORT).to_string(), "{e:?}");
    let client_ep: SocketAddr = e.client_side.client.parse().unwrap();
    assert_eq!(client_ep.ip(), client_addr, "{e:?}");
    assert_eq!(e.server_side.client, e.client_side.client, "DNAT only: {e:?}");
    assert!(VETHS.contains(&e.interface.as_str()), "{e:?}");
    let at = chrono::DateTime::parse_from_rfc3339(&e.time).expect("an RFC 3339 time");
    let age = chrono::Utc::now() - at.with_timezone(&chrono::Utc);
    assert!(age.num_seconds().abs() < 30, "{e:?}");

    // The mirror holds both forms of the connection (client to VIP, pod to client): their
    // Community IDs by the reference implementation are the event's two.
    let tuples = tshark_tuples(&pcap);
    assert!(!tuples.is_empty(), "nothing mirrored");
    let reference = reference_community_ids(&tuples);
    let ours: BTreeSet<String> =
        [e.client_side.community_id.clone(), e.server_side.community_id.clone()].into();
    assert_eq!(ours, reference, "tuples in the mirror: {tuples:?}");
    assert_ne!(e.client_side.community_id, e.server_side.community_id);

    // The stream got it, once.
    let line = followed.recv_timeout(Duration::from_secs(5)).expect("mirrorctl events -f printed nothing");
    assert_eq!(&serde_json::from_str::<EventView>(&line).unwrap(), e);
    follower.kill().unwrap();
    follower.wait().unwrap();
    assert!(followed.recv_timeout(Duration::from_millis(200)).is_err(), "a second event streamed");

    // events.output: the same, as a JSON line.
    let written = std::fs::read_to_string(&events_file).unwrap();
    let lines: Vec<EventView> = written.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, events);

    // The table names what an operator looks for: the pod, or the interface while the pod
    // behind it is not known yet (naming runs beside the data path, and may finish after the
    // trigger).
    let table = env.ctl_ok(&["events"]);
    let who = e.pod.as_deref().unwrap_or(&e.interface);
    for want in ["GET /bar", "500", &e.client_side.community_id, who] {
        assert!(table.contains(want), "{want:?} missing: {table}");
    }
    agent.terminate();
}

/// The metric families of an OpenMetrics text, parsed by the Prometheus client library's
/// strict parser, checked against Prometheus's naming conventions; returns `name type` lines.
fn parse_metrics(text: &str) -> Vec<(String, String)> {
    let script = r#"
import re, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
bad = []
for f in text_string_to_metric_families(sys.stdin.read()):
    n = f.name
    if not n.startswith("mirror_"): bad.append(n + ": no mirror_ prefix")
    if re.search(r"_(ms|milliseconds|us|microseconds|ns|nanoseconds|kb|mb|kib|mib|percent|share)(_|$)", n):
        bad.append(n + ": not a base unit")
    if f.type == "counter":
        if not all(s.name.endswith(("_total", "_created")) for s in f.samples): bad.append(n + ": counter sample without _total")
    if f.type == "gauge" and n.endswith("_total"): bad.append(n + ": gauge named _total")
    if f.type == "histogram" and not re.search(r"_(seconds|bytes)$", n): bad.append(n + ": histogram without a unit")
    if ("latency" in n or "duration" in n or "time" in n or "cpu" in n) and f.type != "gauge" and not re.search(r"_seconds$", n):
        bad.append(n + ": time not in seconds")
    if f.type == "gauge" and "cpu" in n and not n.endswith("_ratio"): bad.append(n + ": a share is a _ratio")
    if not f.documentation: bad.append(n + ": no help")
    print(n, f.type)
if bad:
    sys.exit("\n".join(bad))
"#;
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running python3");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "/metrics: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(n, t)| (n.to_string(), t.to_string())))
        .collect()
}

/// Metric names in PromQL text: identifiers starting with `mirror_`, series suffixes of
/// histograms removed (label names and values never start so in the dashboard).
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("mirror_") {
        let start = i + at;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
        if start > 0 && ident(bytes[start - 1]) {
            i = start + 1;
            continue;
        }
        let end = start + expr[start..].bytes().take_while(|b| ident(*b)).count();
        let name = &expr[start..end];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        names.insert(base.to_string());
        i = end;
    }
    names
}

/// Every PromQL text of a Grafana dashboard: panel targets' `expr`, template queries.
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains("mirror_") => out.push(s.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

#[test]
fn probes_metrics_dashboard_and_json_bodies() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let _inside = topo.node.enter();
    let node = &topo.node;
    let metrics = "127.0.0.1:9464";
    let cfg = AgentConfig {
        rules: vec!["status=500".into()],
        metrics: metrics.into(),
        // Every group on, so that every metric family exists.
        extra: "latency:\n  stack: true\n  cpu: true\n  stack_sample: 1\n".into(),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let get =
        |path: &str| node.sh(&format!("curl -sS --max-time 5 -w ' %{{http_code}}' http://{metrics}{path}"));
    let health = get("/healthz");
    assert!(health.starts_with("ok") && health.ends_with(" 200"), "{health}");
    let ready = get("/readyz");
    assert!(ready.starts_with("ready: 2 interfaces attached") && ready.ends_with(" 200"), "{ready}");

    let server = topo.pod("server").addr(false);
    let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
    assert_eq!(client::get_keepalive(&topo.pod("client").ns, &urls), [200, 500, 200]);
    // Two samples of the cpu group, one second apart.
    std::thread::sleep(Duration::from_millis(2500));

    let head = node.sh(&format!("curl -sS --max-time 5 -o /dev/null -D - http://{metrics}/metrics"));
    assert!(
        head.to_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    let text = node.sh(&format!("curl -sS --max-time 5 http://{metrics}/metrics"));
    let families = parse_metrics(&text);
    let names: BTreeSet<String> = families.iter().map(|(n, _)| n.clone()).collect();
    for want in [
        "mirror_triggers",
        "mirror_http_response_seconds",
        "mirror_stack_latency_seconds",
        "mirror_attach_duration_seconds",
        "mirror_net_cpu_ratio",
        "mirror_net_cpu_seconds",
        "mirror_server_connections",
        "mirror_server_connections_evicted",
    ] {
        assert!(names.contains(want), "{want} not exported: {names:?}");
    }
    assert!(text.contains("mirror_triggers_total 1\n"), "{text}");

    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../dashboards/mirror-agent.json")).unwrap();
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 10, "{queries:?}");
    // Counter families are named without `_total` by the OpenMetrics parser.
    let exported: BTreeSet<String> = families
        .iter()
        .flat_map(|(n, t)| if t == "counter" { vec![format!("{n}_total")] } else { vec![n.clone()] })
        .collect();
    for q in &queries {
        let used = promql_metrics(q);
        assert!(!used.is_empty(), "no metric in {q}");
        for m in used {
            assert!(
                exported.contains(&m),
                "the dashboard queries {m}, which the agent does not export ({q})"
            );
        }
    }

    // A body is JSON whatever its Content-Type: curl -d's form type, and none.
    let sock = env.socket();
    for (rule, header) in [("status=503", None), ("status=504", Some("Content-Type:"))] {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "5", "-w", " %{http_code}", "--unix-socket"]).arg(&sock);
        if let Some(h) = header {
            curl.args(["-H", h]);
        }
        curl.args(["-d", &format!("{{\"rule\": \"{rule}\"}}"), "http://agent/v1/rules"]);
        let out = run(&mut curl);
        assert!(out.ends_with(" 201") && out.contains(rule), "{rule}: {out}");
    }
    let listed = env.ctl_ok(&["rules", "list"]);
    assert!(listed.contains("status=503") && listed.contains("status=504"), "{listed}");
    agent.terminate();
}
