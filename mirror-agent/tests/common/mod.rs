//! What the agent's end-to-end tests share: the binaries under test, typed views of
//! mirrorctl's JSON, and the classifier as the kernel shows it.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::time::Duration;

use serde::de::DeserializeOwned;

use mirror_agent::views::{FlowView, PodView, RuleView, StatusView};
use mirror_bpf::attach::tcx_prog_ids;
use mirror_e2e::agent::{AgentEnv, Binaries};

/// How long an agent may take to attach to the links present at its start.
pub const ATTACH: Duration = Duration::from_secs(5);

/// The node-side veths of the client and server pods of [`mirror_e2e::scenario::PODS`].
pub const VETHS: [&str; 2] = ["vethclient", "vethserver"];

/// The binaries of this package.
pub fn bins() -> Binaries {
    Binaries { agent: env!("CARGO_BIN_EXE_mirror-agent").into(), ctl: env!("CARGO_BIN_EXE_mirrorctl").into() }
}

/// Parses mirrorctl's JSON output.
#[track_caller]
pub fn json<T: DeserializeOwned>(text: &str) -> T {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not the expected JSON ({e}): {text}"))
}

/// `mirrorctl -o json status`.
#[track_caller]
pub fn status(env: &AgentEnv) -> StatusView {
    json(&env.ctl_ok(&["-o", "json", "status"]))
}

/// `mirrorctl -o json rules list`.
#[track_caller]
pub fn rules(env: &AgentEnv) -> Vec<RuleView> {
    json(&env.ctl_ok(&["-o", "json", "rules", "list"]))
}

/// `mirrorctl -o json flows`.
#[track_caller]
pub fn flows(env: &AgentEnv) -> Vec<FlowView> {
    json(&env.ctl_ok(&["-o", "json", "flows", "--limit", "1000"]))
}

/// `mirrorctl rules add RULE`, which prints the new rule's id.
#[track_caller]
pub fn add_rule(env: &AgentEnv, rule: &str) -> u32 {
    let mut args = vec!["rules", "add"];
    args.extend(rule.split_whitespace());
    let out = env.ctl_ok(&args);
    out.trim().parse().unwrap_or_else(|e| panic!("rules add printed {out:?}, not an id: {e}"))
}

/// TCX programs on the ingress and egress of a link (of the calling thread's namespace).
#[track_caller]
pub fn tcx_programs(ifindex: u32) -> [usize; 2] {
    [false, true].map(|egress| {
        tcx_prog_ids(ifindex, egress)
            .unwrap_or_else(|e| panic!("querying TCX of ifindex {ifindex}: {e}"))
            .len()
    })
}

/// Whether a link of that name exists in the calling thread's namespace.
pub fn link_exists(name: &str) -> bool {
    let c = std::ffi::CString::new(name).expect("a link name");
    // SAFETY: a valid C string, only read.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// Where the metrics listen, inside a test's own node namespace.
pub const METRICS: &str = "127.0.0.1:9464";

/// `mirrorctl pods`.
pub fn pods(env: &AgentEnv) -> Vec<PodView> {
    json(&env.ctl_ok(&["-o", "json", "pods"]))
}

/// The pod behind `interface`.
#[track_caller]
pub fn find<'a>(pods: &'a [PodView], interface: &str) -> &'a PodView {
    pods.iter()
        .find(|p| p.interface == interface)
        .unwrap_or_else(|| panic!("no pod on {interface}: {pods:?}"))
}

/// python's port in the recorder's tests.
pub const ALT: u16 = 8080;

/// `mirrorctl -o json captures`.
pub fn captures(env: &AgentEnv) -> Vec<mirror_agent::views::CaptureView> {
    json(&env.ctl_ok(&["-o", "json", "captures"]))
}

/// The value of an unlabelled sample `name` in a scrape.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in the scrape: {text}")) as u64
}

/// Runs `n` connections from the client pod to python on ALT, one after the other `pause_ms`
/// apart, each a GET of a 500 with `bytes` of body, closed after its answer; returns how many
/// got their 500.
pub fn failing_connections(
    topo: &mirror_e2e::topology::netns::Topology,
    n: u32,
    bytes: u32,
    pause_ms: u32,
) -> u32 {
    let server = topo.pod("server").v4;
    let script = format!(
        "import http.client, time\nok=0\nfor i in range({n}):\n    c=http.client.HTTPConnection('{server}',{ALT},timeout=5)\n    \
         c.request('GET','/fail?bytes={bytes}')\n    r=c.getresponse(); r.read(); c.close()\n    ok+=r.status==500\n    time.sleep({pause_ms}/1000)\nprint(ok)\n"
    );
    let out = topo.pod("client").ns.command("python3").args(["-c", &script]).output().expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count")
}
