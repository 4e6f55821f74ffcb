//! What the tests of the kernel's drops share (`drops.rs`, `drops_pods.rs`, `drops_flood.rs`):
//! connecting from a pod, the SYNs of a client's capture, the agent's events, its status and
//! metrics, `mirrorctl capture` and tshark's reading of it.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mirror_e2e::agent::{Agent, AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::pcap::{Packet, Trace};
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::topology::netns::{nsenter, Netns};
use serde_json::Value;

/// A SYN.
pub const SYN: u8 = 0x02;
/// A RST.
pub const RST: u8 = 0x04;
/// The Ethernet source of the agent's copy of a dropped packet.
pub const DROP_SRC: &str = "02:64:72:6f:70:73";
/// Where the agent's metrics listen, in the node's namespace.
pub const METRICS: &str = "127.0.0.1:9464";

/// Connects from `ns` to `to`, giving up after `wait`: whether it connected.
pub fn connect(ns: &Netns, to: SocketAddr, wait: Duration) -> bool {
    let _inside = ns.enter();
    TcpStream::connect_timeout(&to, wait).is_ok()
}

/// The SYNs the client sent to `port`, first one first.
pub fn syns_to(client: &Trace, port: u16) -> Vec<&Packet> {
    client.packets.iter().filter(|p| p.flags & SYN != 0 && p.dst.port() == port).collect()
}

/// `mirrorctl capture` of the agent of `env` in `node`, into `file`, running.
pub fn ctl_capture(bins: &Binaries, node: &Netns, env: &AgentEnv, file: &Path) -> Proc {
    let mut cmd = nsenter(&node.path(), &bins.ctl);
    cmd.arg("--socket").arg(env.socket()).args(["capture", "-w"]).arg(file);
    let mut p = Proc::spawn("mirrorctl capture", &mut cmd);
    p.wait_for_output("capturing", Duration::from_secs(5));
    p
}

/// tshark's reading of pcapng `file`: per frame, its Ethernet source, comment and summary,
/// tab-separated.
pub fn tshark_lines(file: &Path) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-e", "eth.src", "-e", "frame.comment", "-e", "_ws.col.Info"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

/// The agent's events, as JSON.
pub fn events(env: &AgentEnv) -> Vec<Value> {
    let v: Value = serde_json::from_str(&env.ctl_ok(&["-o", "json", "events"])).expect("events as JSON");
    v.as_array().expect("a list of events").clone()
}

/// The pod label (`namespace/name`, or the name alone) of the pod behind `veth`, as the
/// agent's pod list has it once it has resolved the pod (its addresses known).
pub fn pod_label(env: &AgentEnv, veth: &str) -> String {
    let mut pod = None;
    let found = wait_until(Duration::from_secs(10), || {
        let st = env.status();
        pod = st["pods"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["interface"] == veth && p["addresses"].as_array().is_some_and(|a| !a.is_empty()))
                .cloned()
        });
        pod.is_some()
    });
    assert!(found, "no pod behind {veth}: {}", env.status()["pods"]);
    let p = pod.expect("found");
    let name = p["name"].as_str().expect("a name");
    match p["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// `mirror_drops_total` as the agent's metrics give it (metrics listening on [`METRICS`] in
/// `node`): (reason, pod, count), in order.
pub fn drop_metrics(node: &Netns) -> Vec<(String, String, u64)> {
    let text = node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    let label = |l: &str, k: &str| {
        let from = l.find(&format!("{k}=\"")).map(|i| i + k.len() + 2)?;
        Some(l[from..from + l[from..].find('"')?].to_string())
    };
    let mut out: Vec<(String, String, u64)> = text
        .lines()
        .filter(|l| l.starts_with("mirror_drops_total{"))
        .map(|l| {
            let n =
                l.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("a count: {l}"));
            (label(l, "reason").expect("a reason"), label(l, "pod").expect("a pod"), n)
        })
        .collect();
    out.sort();
    out
}

/// The agent's configuration for a drop test: `rules`, and the metrics on [`METRICS`] when
/// `metrics`.
pub fn drop_config(rules: &[&str], metrics: bool) -> AgentConfig {
    AgentConfig {
        rules: rules.iter().map(|r| r.to_string()).collect(),
        metrics: if metrics { METRICS.into() } else { AgentConfig::default().metrics },
        ..AgentConfig::default()
    }
}

/// The agent of `env` started, attached to both pods' veths.
pub fn start_attached(env: &AgentEnv) -> Agent<'_> {
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    agent
}
