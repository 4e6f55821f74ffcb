//! `mirrorctl capture` on real traffic between two pods, read back with tshark: one interface
//! per pod veth named `<pod>/<namespace> (<veth>)`, each packet's direction relative to that
//! pod, the rule that mirrored it in its comment, every copy the agent made (GSO packets whole),
//! and no checksum tshark calls bad. Then to stdout, piped into tshark, for one pod, cut short,
//! checksums as copied (tshark does call the pod's own bad: what the fixing is for).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::cluster::kubelet::{pod_uid, PodProcess, PodSpec};
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::{nsenter, Topology};
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

use common::{bins, json, status, ATTACH, VETHS};

/// python's port.
const ALT: u16 = 8080;
/// A 500 with a body large enough for GSO packets.
const BODY: u32 = 300_000;

fn pod(ns: &mirror_e2e::topology::netns::Netns, name: &str, namespace: &str, n: u32) -> PodProcess {
    let spec = PodSpec {
        env_name: Some(name.into()),
        env_namespace: Some(namespace.into()),
        uid: pod_uid(n),
        ..PodSpec::default()
    };
    PodProcess::start(ns, &spec)
}

/// tshark's fields of every packet of `file` (`-` reads stdin, given as `input`), checksum
/// validation on.
fn tshark(file: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-r"]).arg(file).args(["-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE"]);
    cmd.args(["-o", "udp.check_checksum:TRUE", "-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("running tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    rows(&String::from_utf8_lossy(&out.stdout))
}

fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines().map(|l| l.split('|').map(String::from).collect()).collect()
}

#[test]
fn captures_name_pods_directions_and_rules() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let _client = pod(&topo.pod("client").ns, "curl-0", "tools", 1);
    let _server = pod(&topo.pod("server").ns, "web-0", "shop", 2);
    let cfg = AgentConfig { rules: vec!["status=500".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _python = Server::python(&topo.pod("server").ns, ALT, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let resolved = wait_until(Duration::from_secs(5), || {
        let pods: Vec<mirror_agent::views::PodView> = json(&env.ctl_ok(&["-o", "json", "pods"]));
        pods.iter().filter(|p| p.source == "env").count() == 2
    });
    assert!(resolved, "pods not resolved: {}", env.ctl_ok(&["pods"]));

    let (client_ip, server_ip) = (topo.pod("client").v4.to_string(), topo.pod("server").v4.to_string());
    let ctl = |args: &[&str]| {
        let mut cmd = nsenter(&topo.node.path(), &bins().ctl);
        cmd.arg("--socket").arg(env.socket()).arg("capture").args(args);
        cmd
    };
    let traffic = || {
        let urls = [
            url(topo.pod("server").addr(false), ALT, "/ok"),
            url(topo.pod("server").addr(false), ALT, &format!("/fail?bytes={BODY}")),
        ];
        assert_eq!(client::get_keepalive(&topo.pod("client").ns, &urls), [200, 500]);
    };

    // To a file, until SIGINT.
    let file = env.dir().join("mirror.pcapng");
    let mut cap = Proc::spawn("mirrorctl capture", &mut ctl(&["-w", file.to_str().unwrap()]));
    cap.wait_for_output("capturing copies received by", Duration::from_secs(5));
    let before = status(&env).counters["mirrored_packets"];
    traffic();
    let copies = wait_until(Duration::from_secs(5), || status(&env).counters["mirrored_packets"] > before);
    assert!(copies, "nothing mirrored");
    std::thread::sleep(Duration::from_millis(500));
    let mirrored = status(&env).counters["mirrored_packets"] - before;
    // The trigger's event names the pod whose veth saw the 500.
    let events: Vec<mirror_agent::views::EventView> = json(&env.ctl_ok(&["-o", "json", "events"]));
    assert!(events.iter().any(|e| e.status == 500 && e.pod.as_deref() == Some("shop/web-0")), "{events:?}");
    // It carries the request behind the 500, replayed to the sink.
    let request = events.iter().find_map(|e| e.request.as_ref()).expect("the event carries the request");
    assert!(request.text.starts_with("GET /fail?bytes=") && request.replayed && !request.cut, "{request:?}");
    assert!(request.before_ms > 0.0, "{request:?}");
    let st = cap.stop(libc::SIGINT, Duration::from_secs(5));
    assert!(st.is_some_and(|s| s.success()), "mirrorctl capture: {st:?} {}", cap.output());
    assert!(
        cap.output().contains(&format!("{} packets written", mirrored + 1))
            && cap.output().contains("(1 replayed requests,"),
        "{mirrored} mirrored: {}",
        cap.output()
    );

    let fields = [
        "frame.interface_name",
        "frame.packet_flags_direction",
        "frame.comment",
        "ip.src",
        "ip.dst",
        "frame.len",
        "tcp.checksum.status",
        "ip.checksum.status",
    ];
    let pkts = tshark(&file, &fields);
    // The request behind the 500 first, replayed (not a copy: not counted as mirrored).
    assert_eq!(pkts.len() as u64, mirrored + 1, "{pkts:?}");
    assert!(pkts[0][2].starts_with("replayed: the request before the trigger"), "{:?}", pkts[0]);
    assert_eq!(pkts[0][3], client_ip, "{:?}", pkts[0]);
    assert!(pkts[1..].iter().all(|p| !p[2].starts_with("replayed")), "{pkts:?}");
    let names: BTreeSet<&str> = pkts.iter().map(|p| p[0].as_str()).collect();
    assert_eq!(names, BTreeSet::from(["tools/curl-0 (vethclient)", "shop/web-0 (vethserver)"]), "{pkts:?}");
    for p in &pkts {
        // Every copy is of a pod's own packet: outbound, on the sender's interface.
        let sender = if p[3] == client_ip { "tools/curl-0 (vethclient)" } else { "shop/web-0 (vethserver)" };
        assert!([&client_ip, &server_ip].contains(&&p[3]), "{p:?}");
        // epb_flags: 2, outbound.
        assert_eq!((p[0].as_str(), p[1].as_str()), (sender, "0x00000002"), "{p:?}");
        assert!(p[2].contains("mirrored by rule 1 (status=500"), "{p:?}");
        assert!(p[2].ends_with("on a 500"), "{p:?}");
        // 1: good. tshark calls a checksum it could not verify 2, a bad one 0.
        assert_eq!((p[6].as_str(), p[7].as_str()), ("1", "1"), "checksum not good: {p:?}");
    }
    assert!(pkts.iter().any(|p| p[5].parse::<u32>().unwrap() > 1514), "no GSO packet whole: {pkts:?}");
    assert!(pkts.iter().any(|p| p[3] == client_ip) && pkts.iter().any(|p| p[3] == server_ip));
    // tshark's own summary: no expert warning about checksums.
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-o",
            "tcp.check_checksum:TRUE",
            "-o",
            "ip.check_checksum:TRUE",
            "-Y",
            "_ws.expert.group == \"Checksum\"",
        ])
        .output()
        .expect("tshark");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "bad checksums");

    // To stdout, one pod, cut after 100 bytes, checksums as copied.
    let script = format!(
        "exec {} --socket {} capture -w - --pod shop/web-0 --snaplen 1000 --fix-checksums false --duration 6s \
         | tshark -r - -o tcp.check_checksum:TRUE -T fields -E separator='|' \
           -e frame.interface_name -e frame.cap_len -e frame.len -e tcp.checksum.status -e frame.comment",
        bins().ctl.display(),
        env.socket().display()
    );
    let mut sh = nsenter(&topo.node.path(), "sh");
    sh.args(["-c", &script]);
    let mut piped = Proc::spawn("mirrorctl capture | tshark", &mut sh);
    piped.wait_for_output("capturing copies", Duration::from_secs(5));
    traffic();
    let ended = wait_until(Duration::from_secs(15), || !piped.running());
    assert!(ended, "the capture did not end after its duration: {}", piped.output());
    let text = piped.output();
    let pkts: Vec<Vec<String>> = rows(&text).into_iter().filter(|r| r.len() == 5).collect();
    assert!(!pkts.is_empty(), "{text}");
    for p in &pkts {
        assert_eq!(p[0], "shop/web-0 (vethserver)", "{p:?}");
        assert!(p[1].parse::<u32>().unwrap() <= 1000, "{p:?}");
        assert!(p[4].starts_with("mirrored by rule 1"), "{p:?}");
    }
    assert!(pkts.iter().any(|p| p[2].parse::<u32>().unwrap() > 1000), "nothing was cut: {pkts:?}");
    let written = text.lines().find(|l| l.contains("packets written to stdout")).unwrap_or_default();
    assert!(
        written.contains(&format!("{} packets written", pkts.len())) && written.contains(" 0 checksums"),
        "{text}"
    );
    // A cut packet cannot be verified: the uncut ones can, and the client's own are bad.
    assert!(
        pkts.iter().any(|p| p[3] == "0"),
        "no checksum left to offload among the client's packets: {pkts:?}"
    );

    // Bad input: a clear error, nothing written.
    for (args, says) in [
        (["--rule", "99"], "--rule 99: no such rule"),
        (["--pod", "nosuch"], "--pod nosuch: no such pod behind an attached veth (pods: "),
        (["--snaplen", "0"], "--snaplen 0"),
    ] {
        let out = ctl(&[&["-w", "-"][..], &args[..]].concat()).output().expect("running mirrorctl");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && out.stdout.is_empty(), "{args:?}: {err}");
    }
    agent.terminate();
}

/// `--rule ID` with two rules mirroring at once (500s on nginx's port and on python's): only the
/// copies of the named rule's flows are written, and they are all of them.
#[test]
fn a_capture_of_one_rule_leaves_out_the_others() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let _client = pod(&topo.pod("client").ns, "curl-0", "tools", 1);
    let _server = pod(&topo.pod("server").ns, "web-0", "shop", 2);
    let port = mirror_e2e::scenario::HTTP;
    let cfg = AgentConfig {
        rules: vec![format!("status=500 port={port}"), format!("status=500 port={ALT}")],
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), port, env.dir());
    let _python = Server::python(&topo.pod("server").ns, ALT, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let rules: Vec<mirror_agent::views::RuleView> = json(&env.ctl_ok(&["-o", "json", "rules", "list"]));
    let id_of = |p: u16| {
        rules
            .iter()
            .find(|r| r.rule.contains(&format!("port={p}")))
            .unwrap_or_else(|| panic!("no rule for port {p}: {rules:?}"))
            .id
    };
    let (nginx_rule, python_rule) = (id_of(port), id_of(ALT));

    let file = env.dir().join("one-rule.pcapng");
    let mut cmd = nsenter(&topo.node.path(), &bins().ctl);
    cmd.arg("--socket").arg(env.socket()).args(["capture", "-w", file.to_str().unwrap()]);
    cmd.args(["--rule", &python_rule.to_string()]);
    let mut cap = Proc::spawn("mirrorctl capture --rule", &mut cmd);
    cap.wait_for_output("capturing copies received by", Duration::from_secs(5));
    let server = topo.pod("server").addr(false);
    let before = status(&env).counters["mirrored_packets"];
    // Two connections, each triggering its own rule.
    let urls = [url(server, port, "/bar"), url(server, port, "/foo")];
    assert_eq!(client::get_keepalive(&topo.pod("client").ns, &urls), [500, 200]);
    let urls = [url(server, ALT, "/fail?bytes=20000"), url(server, ALT, "/ok")];
    assert_eq!(client::get_keepalive(&topo.pod("client").ns, &urls), [500, 200]);
    let both = wait_until(Duration::from_secs(5), || {
        let flows: Vec<mirror_agent::views::FlowView> = json(&env.ctl_ok(&["-o", "json", "flows"]));
        [nginx_rule, python_rule]
            .iter()
            .all(|r| flows.iter().any(|f| f.rule_id == Some(*r) && f.mirrored_packets > 0))
    });
    assert!(both, "both rules mirror: {}", env.ctl_ok(&["flows"]));
    std::thread::sleep(Duration::from_millis(500));
    let flows: Vec<mirror_agent::views::FlowView> = json(&env.ctl_ok(&["-o", "json", "flows"]));
    let mirrored_by =
        |r: u32| -> u64 { flows.iter().filter(|f| f.rule_id == Some(r)).map(|f| f.mirrored_packets).sum() };
    let total = status(&env).counters["mirrored_packets"] - before;
    assert_eq!(total, mirrored_by(nginx_rule) + mirrored_by(python_rule), "{flows:?}");
    let st = cap.stop(libc::SIGINT, Duration::from_secs(5));
    assert!(st.is_some_and(|s| s.success()), "mirrorctl capture: {st:?} {}", cap.output());

    let pkts = tshark(&file, &["frame.comment", "tcp.srcport", "tcp.dstport"]);
    // The rule's copies, and the request replayed ahead of its trigger.
    let replayed = pkts.iter().filter(|p| p[0].starts_with("replayed: ")).count() as u64;
    assert_eq!(replayed, 1, "{pkts:?}");
    assert_eq!(pkts.len() as u64, mirrored_by(python_rule) + replayed, "{pkts:?}");
    for p in &pkts {
        assert!(p[0].contains(&format!("mirrored by rule {python_rule} (")), "{p:?}");
        assert!(p[1] == ALT.to_string() || p[2] == ALT.to_string(), "{p:?}");
    }
    assert!(cap.output().contains(&format!("{} packets written", pkts.len())), "{}", cap.output());
    agent.terminate();
}
