//! `make demo`: a first look at the traffic-aware mirror, narrated. A node namespace with a
//! client pod and an nginx pod, mirror-agent in the node, a rule added with mirrorctl, some
//! keep-alive connections (some answered 500, some not), then what the mirror sink carried and
//! what mirrorctl says. Everything is removed at the end, also on failure or Ctrl-C.
//!
//! The agent binaries are found next to this one (`cargo build --release -p mirror-agent`), or
//! at `$MIRROR_AGENT_BIN` and `$MIRRORCTL_BIN`.

mod interrupt;

use std::panic;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::thread;
use std::time::{Duration, Instant};

use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

/// The connections the client opens: a name and the paths it GETs, in order, keep-alive.
const CONNECTIONS: [(&str, &[&str]); 4] =
    [("A", &["/foo", "/bar", "/foo"]), ("B", &["/foo", "/foo"]), ("C", &["/bar", "/foo"]), ("D", &["/foo"])];

/// Time for the last packets (the connections' close) to reach the captures.
const SETTLE: Duration = Duration::from_millis(300);

fn main() -> ExitCode {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("The demo creates network namespaces and loads BPF programs: run it as root.");
        return ExitCode::FAILURE;
    }
    let bins = match Binaries::locate() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    interrupt::install();
    let started = Instant::now();
    match panic::catch_unwind(|| demo(&bins)) {
        Ok(()) => {
            println!("\nDone in {:.1} s; nothing is left behind.", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(_) if interrupt::interrupted() => {
            eprintln!("\nInterrupted: everything the demo created has been removed.");
            ExitCode::from(130)
        }
        Err(_) => {
            eprintln!("\nThe demo failed (see above); everything it created has been removed.");
            ExitCode::FAILURE
        }
    }
}

/// A new step (or the end, if Ctrl-C was pressed).
fn step(title: &str) {
    interrupt::check();
    println!("\n== {title}\n");
}

/// Narration, indented; a final newline makes a blank line.
fn say(text: &str) {
    for line in text.split('\n') {
        if line.is_empty() {
            println!();
        } else {
            println!("   {line}");
        }
    }
}

/// Runs mirrorctl, showing the command and its output.
fn mirrorctl(env: &AgentEnv, args: &[&str]) {
    println!("   $ mirrorctl {}", args.join(" "));
    say(&indent(&env.ctl_ok(args)));
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// tcpdump's listing of a pcap file, without TCP options and window sizes (they make each line
/// twice as long and say nothing about mirroring).
fn listing(file: &Path) -> String {
    let out = Command::new("tcpdump").args(["-nn", "-t", "-r"]).arg(file).output().expect("running tcpdump");
    assert!(out.status.success(), "tcpdump -r: {}", String::from_utf8_lossy(&out.stderr));
    // "IP a > b: Flags [P.], seq 1:80, ack 1, win 502, options [nop,nop,TS val 1 ecr 2], length 79: HTTP..."
    let trimmed = |l: &str| -> String {
        let kept: Vec<&str> =
            l.split(", ").filter(|t| !t.starts_with("win ") && !t.starts_with("options [")).collect();
        kept.join(", ") + "\n"
    };
    String::from_utf8_lossy(&out.stdout).lines().map(trimmed).collect()
}

fn demo(bins: &Binaries) {
    step("1. A node with two pods");
    let topo = Topology::without_sink(&PODS);
    let (client, server) = (topo.pod("client"), topo.pod("server"));
    say(&format!(
        "Network namespace {node} plays the node. The pods are namespaces of their own:\n\
         client ({c}) and server ({s}), each joined to the node by a veth pair whose\n\
         node side is {cv} or {sv}, as a CNI plugin does.",
        node = topo.node.name(),
        c = client.v4,
        s = server.v4,
        cv = client.veth,
        sv = server.veth,
    ));
    let env = AgentEnv::new(bins, &topo.node, &AgentConfig::default());
    let _nginx = Server::nginx(server, HTTP, env.dir());
    say("nginx runs in the server pod: GET /foo answers 200, GET /bar answers 500.");

    step("2. mirror-agent starts in the node");
    let config = env.config_path();
    say(&format!("Its configuration, {}:\n", config.display()));
    say(&indent(&std::fs::read_to_string(&config).expect("reading the config")));
    // nsenter keeps the host's /sys/fs/bpf (ip netns exec would not): the pins outlive the agent.
    say(&format!("$ nsenter --net={} mirror-agent --config {}", topo.node.path(), config.display()));
    let agent = env.start(&[]);
    agent.wait_attached(&[&client.veth, &server.veth], Duration::from_secs(5));
    let sink = env.sink();
    let peer = env.sink_peer();
    say(&format!(
        "\nIt attached its classifier to both veths (they match veth*), on ingress and egress,\n\
         and created the mirror sink: the veth pair {sink}/{peer}. What is mirrored to {sink}\n\
         comes out of {peer}, where tcpdump, Zeek or Suricata listen."
    ));

    step("3. A rule: mirror every connection that answers 500");
    mirrorctl(&env, &["rules", "add", "status=500"]);
    say("It printed the new rule's id. When a response with status 500 passes, its connection\n\
         is marked and copied from that packet on, both directions, until it ends or reaches\n\
         the rule's limits (10000 packets or 60 s unless given).\n");
    mirrorctl(&env, &["rules", "list"]);

    step("4. Traffic from the client pod");
    let files = env.dir();
    let at_client = Capture::start(&client.ns, "eth0", "tcp", &files.join("client.pcap"));
    let at_sink = Capture::start(&topo.node, &peer, "", &files.join("mirror.pcap"));
    say(&format!("tcpdump records on {peer} (and on the client's eth0, to check the mirror against).\n"));
    let server_ip = server.addr(false);
    for (name, paths) in CONNECTIONS {
        let urls: Vec<String> = paths.iter().map(|p| url(server_ip, HTTP, p)).collect();
        let statuses = client::get_keepalive(&client.ns, &urls);
        let got: Vec<String> = paths.iter().zip(&statuses).map(|(p, s)| format!("{p} {s}")).collect();
        say(&format!("connection {name}: {}", got.join(", ")));
    }
    thread::sleep(SETTLE);
    let mirror_file = at_sink.file().to_path_buf();
    let reference = at_client.stop();
    let mirror = at_sink.stop();
    say("\nA and C got a 500: they are mirrored from that response on. B and D only got 200s.");

    step(&format!("5. What came out of the mirror sink: tcpdump -nn -t -r mirror.pcap (on {peer})"));
    say(&listing(&mirror_file));
    let expected = Expected::from_reference(&reference, |status, _| status == 500);
    expected.assert_mirror(&mirror);
    say(&format!(
        "{} packets: the 500 responses and everything after them on connections A and C,\n\
         each packet once, and each one's request replayed ahead of them ({} replays, from\n\
         Ethernet source 02:72:65:70:6c:79); nothing of B and D (checked against the client's\n\
         own capture).",
        mirror.packets.len(),
        mirror.replayed.len()
    ));

    step("6. The flows, as the agent sees them");
    mirrorctl(&env, &["flows"]);
    say("Every connection is in the flow table; the mirrored ones show their rule, the status\nthat triggered, and how many packets were copied.");

    step("7. The agent's status");
    mirrorctl(&env, &["status"]);
    say("duplicate: packets seen twice on the node (leaving one pod's veth and entering the\n\
         other's), counted once and skipped the second time, so each is mirrored once.\n\
         non_tcp: packets that are not TCP (ARP, ICMP, UDP other than DNS): passed on, not followed.");

    step("8. The agent's log of the triggers");
    for line in agent.output().lines().filter(|l| l.contains("trigger")) {
        // Without the timestamp and level: "mirror_agent::engine: trigger: ..."
        say(line.split_once(": ").map_or(line, |(_, rest)| rest));
    }

    step("9. Stop the agent (SIGTERM) and clean up");
    agent.terminate();
    say(&format!(
        "On SIGTERM the agent detached from every veth and removed {sink} and its pins\n\
         (with --keep-attached it would leave them for the next agent to adopt, mirroring\n\
         all along). The demo now deletes its namespaces."
    ));
    // The capture outlives the demo's files: kept where the operator can open it.
    let kept = std::env::temp_dir().join("mirror-demo.pcap");
    match std::fs::copy(&mirror_file, &kept) {
        Ok(_) => say(&format!(
            "\nThe mirror's capture is kept: open it with\n    tshark -r {}\n(or Wireshark, Zeek: zeek -r FILE, Suricata: suricata -r FILE).",
            kept.display()
        )),
        Err(e) => eprintln!("keeping the capture as {}: {e}", kept.display()),
    }
}
