//! The request behind a `noresponse>` mark reaches the mirror at the mark. A timer marks the
//! flow when its request has waited the rule's time, with no packet to make a replay of: the
//! agent replays the kept request as it reads the trigger event, not the flow's next packet,
//! which may come seconds later or never. With the real agent and `noresponse>1s`, against a
//! server that answers 3 s late and one that never answers (its client keeps waiting until the
//! test ends the connection): the replayed request is on the mirror 1.0-1.3 s after the client
//! sent it (a capture where the copies go against one on the client), exactly once (not again
//! with the late answer), with the replay MAC as its Ethernet source, whichever way copies are
//! delivered (received by the veth sink's peer, transmitted by the sink, received by the sink),
//! and in `mirrorctl capture` with the comment of a replay. The collector's side, through a
//! VXLAN sink, is in `collector.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::capture::pcap::{Packet, Trace};
use mirror_e2e::capture::tcpdump::{Capture, SETTLE};
use mirror_e2e::proc::Proc;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{nsenter, Netns, Topology};
use mirror_e2e::workload::servers::Server;

/// The servers' port.
const PORT: u16 = 8080;
/// The rule's time.
const WAIT: Duration = Duration::from_secs(1);
/// How late past [`WAIT`] the replay may reach the mirror.
const LATE_MAX: Duration = Duration::from_millis(300);
/// The first bytes of the request that hangs.
const HANG: &str = "GET /hang";

/// The server behind the hanging request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// The asyncio server, which answers 3 s late.
    Late,
    /// A server that never answers; the client waits 2.5 s, then the test closes the connection.
    Never,
}

/// Sends one request from `ns` to `server` on a new connection and waits for its answer
/// (`Late`: the status) or 2.5 s (`Never`: `None`), then closes the connection.
fn client(ns: &Netns, server: SocketAddr, hold: Hold) -> Option<u16> {
    let _inside = ns.enter();
    let mut c = TcpStream::connect(server).expect("connecting to the server");
    let target = if hold == Hold::Late { "/hang?delay_ms=3000" } else { "/hang" };
    c.write_all(format!("GET {target} HTTP/1.1\r\nHost: shop.example\r\n\r\n").as_bytes())
        .expect("sending the request");
    if hold == Hold::Never {
        thread::sleep(Duration::from_millis(2500));
        return None;
    }
    c.set_read_timeout(Some(Duration::from_secs(6))).expect("a read timeout");
    let mut buf = [0u8; 256];
    let n = c.read(&mut buf).expect("reading the answer");
    std::str::from_utf8(buf.get(9..12)?).ok()?.parse().ok().filter(|_| n >= 12)
}

/// `mirrorctl capture` of the agent of `env` in `node`, into `file`, running.
fn ctl_capture(bins: &Binaries, node: &Netns, env: &AgentEnv, file: &Path) -> Proc {
    let mut cmd = nsenter(&node.path(), &bins.ctl);
    cmd.arg("--socket").arg(env.socket()).args(["capture", "-w"]).arg(file);
    let mut p = Proc::spawn("mirrorctl capture", &mut cmd);
    p.wait_for_output("capturing", Duration::from_secs(5));
    p
}

/// The frame comments of the replays (Ethernet source 02:72:65:70:6c:79) in pcapng `file`.
fn replay_comments(file: &Path) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-Y", "eth.src == 02:72:65:70:6c:79", "-T", "fields", "-e", "frame.comment"])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

/// The hanging request's segment in the client's capture.
fn request(client: &Trace) -> &Packet {
    let mut requests = client.packets.iter().filter(|p| p.payload.starts_with(HANG.as_bytes()));
    let first = requests.next().expect("the client's capture has the request");
    assert!(requests.next().is_none(), "the request was sent once");
    first
}

/// One run: the agent with `noresponse>1s`, a veth sink and `mirror.deliver: deliver`, the
/// hanging request against `hold`'s server, captured on the client and where the copies go
/// (and by `mirrorctl capture` when `ctl` is set). Checks the replay and returns how long
/// after the client sent the request it reached the mirror.
fn replayed_at_the_mark(deliver: &str, hold: Hold, ctl: bool) -> Duration {
    let bins = Binaries::locate().expect("the binaries");
    let topo = Topology::without_sink(&PODS);
    let dir = tempfile::tempdir().expect("a temp dir");
    let server_ns = &topo.pod("server").ns;
    let _server = match hold {
        Hold::Late => Server::asyncio(server_ns, PORT, dir.path()),
        Hold::Never => Server::silent(server_ns, PORT, dir.path()),
    };
    let cfg = AgentConfig {
        rules: vec!["noresponse>1s".into()],
        mirror: vec![("deliver".into(), deliver.into())],
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins, &topo.node, &cfg);
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver"], Duration::from_secs(10));
    let st = env.status();
    let (copies_to, delivery) = (st["mirror"]["copies_to"].clone(), st["mirror"]["delivery"].clone());
    let expected = match deliver {
        "peer-ingress" => ("mirror0p", "ingress"),
        "egress" => ("mirror0", "egress"),
        _ => ("mirror0", "ingress"),
    };
    assert_eq!((copies_to.as_str(), delivery.as_str()), (Some(expected.0), Some(expected.1)), "{st}");

    let (client_file, sink_file) = (dir.path().join("client.pcap"), dir.path().join("sink.pcap"));
    let client_cap = Capture::start(&topo.pod("client").ns, "eth0", "tcp", &client_file);
    let sink_cap = Capture::start(&topo.node, expected.0, "tcp", &sink_file);
    let ctl_file = dir.path().join("mirrorctl.pcapng");
    let mut ctl_proc = ctl.then(|| ctl_capture(&bins, &topo.node, &env, &ctl_file));

    let server = SocketAddr::new(topo.pod("server").addr(false), PORT);
    let answer = client(&topo.pod("client").ns, server, hold);
    thread::sleep(SETTLE);
    let (client_trace, sink_trace) = (client_cap.stop(), sink_cap.stop());
    if let Some(p) = &mut ctl_proc {
        let status = p.stop(libc::SIGTERM, Duration::from_secs(5));
        assert!(status.is_some_and(|s| s.success()), "mirrorctl capture: {}", p.output());
    }

    let sent = request(&client_trace);
    let flow = sent.flow();
    let replays: Vec<_> = sink_trace.replayed.iter().filter(|r| r.packet.flow() == flow).collect();
    assert_eq!(replays.len(), 1, "one replay of the request on the mirror: {replays:?}");
    let replay = &replays[0].packet;
    assert_eq!(replay.id(), sent.id(), "the replay is the request's segment");
    assert_eq!(replay.payload, sent.payload);
    let after = Duration::from_nanos(replay.ts_ns - sent.ts_ns);
    assert!(after >= WAIT && after < WAIT + LATE_MAX, "the replay came {after:?} after the request");
    // Nothing of the flow was copied before the mark: the replay is its first packet there.
    assert_eq!(replays[0].after_copies, 0, "copies before the replay");
    let answered: Vec<&Packet> =
        sink_trace.packets.iter().filter(|p| p.flow() == flow && p.http_status().is_some()).collect();
    match hold {
        Hold::Late => {
            assert_eq!(answer, Some(200), "the late answer");
            let [a] = answered[..] else { panic!("the late answer copied once: {answered:?}") };
            assert!(a.ts_ns >= sent.ts_ns + 3_000_000_000, "the answer came 3 s after the request");
        }
        Hold::Never => assert!(answer.is_none() && answered.is_empty(), "{answered:?}"),
    }
    // The client's FIN, after the mark, is copied; the mark's replay is not made again then.
    assert!(sink_trace.packets.iter().any(|p| p.flow() == flow && p.flags & 0x01 != 0), "the FIN copied");

    let counters = env.status()["counters"].clone();
    let count = |k: &str| counters[k].as_u64().unwrap_or_else(|| panic!("no counter {k}: {counters}"));
    assert_eq!(
        (count("noresponse_triggers"), count("replayed"), count("replay_failed"), count("replay_missed")),
        (1, 1, 0, 0),
        "{counters}"
    );
    let events: serde_json::Value =
        serde_json::from_str(&env.ctl_ok(&["-o", "json", "events"])).expect("events as JSON");
    let events = events.as_array().expect("a list of events");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((&events[0]["kind"], &events[0]["request"]["replayed"]), (&"noresponse".into(), &true.into()));
    // The mark came the event's wait after the request (the classifier's clock), the replay
    // `after` it (the captures'): the difference is how late the replay came after the mark.
    let waited = events[0]["after_request_ms"].as_f64().expect("the event's wait");
    eprintln!(
        "deliver {deliver}, server {hold:?}: marked {waited:.3} ms after the request, replayed {:.3} ms \
         after it: the replay {:.3} ms after the mark",
        after.as_secs_f64() * 1e3,
        after.as_secs_f64() * 1e3 - waited
    );

    if ctl {
        let comments = replay_comments(&ctl_file);
        assert_eq!(comments.len(), 1, "one replay in mirrorctl's capture: {comments:?}");
        assert!(
            comments[0].starts_with(
                "replayed: the request before the trigger, kept by the classifier; mirrored by rule"
            ),
            "{comments:?}"
        );
    }
    drop(agent);
    after
}

/// A request the server answers 3 s late: replayed 1.0-1.3 s after it, once, ahead of the late
/// answer; received by the veth sink's peer (the default), and in `mirrorctl capture`.
#[test]
fn the_request_is_replayed_at_the_mark_not_with_the_late_answer() {
    if !require_root() {
        return;
    }
    replayed_at_the_mark("peer-ingress", Hold::Late, true);
}

/// A request that is never answered, its client waiting until the connection is closed:
/// replayed 1.0-1.3 s after it, once; transmitted by the sink, then received by it.
#[test]
fn a_request_never_answered_is_replayed_at_the_mark() {
    if !require_root() {
        return;
    }
    replayed_at_the_mark("egress", Hold::Never, false);
    replayed_at_the_mark("ingress", Hold::Never, true);
}
