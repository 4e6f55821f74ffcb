//! Bad input is refused with a message that says where: configurations naming the key, rules
//! pointing at the token, an unknown rule id, an agent that is not there, a node without the
//! capabilities. Nothing changes.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::topology::netns::Topology;

use common::{bins, rules};

fn run(cmd: &mut Command) -> (Output, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

/// mirror-agent with a configuration, bounded in time (a bad one must fail at once).
fn agent(bins: &Binaries, config: &Path, check: bool) -> (Output, String) {
    let mut cmd = Command::new("timeout");
    cmd.arg("10").arg(&bins.agent).arg("--config").arg(config);
    if check {
        cmd.arg("--check");
    }
    run(&mut cmd)
}

#[test]
fn bad_configs_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let bins = bins();
    // Should a bad config be taken, the agent would touch only the temp dir.
    let d = dir.path().display();
    let confined =
        format!("api:\n  socket: {d}/api.sock\nbpf:\n  pin_path: {d}/bpf\nstate:\n  path: {d}/state.yaml\n");
    let cases = [
        ("mirror:\n  interfce: mirror0\n", "mirror.interfce", "unknown field `interfce`"),
        ("colour: red\n", "colour", "unknown field `colour`"),
        ("mirror:\n  create: tun\n", "mirror.create", "unknown variant `tun`"),
        ("flows:\n  max: lots\n", "flows.max", "invalid"),
        ("rules: [\"status=500\", \"status=999\"]\n", "rules[1]", "bad rule at 'status=999'"),
        ("rules: [\"colour=red\"]\n", "rules[0]", "bad rule at 'colour=red'"),
        (
            "flows:\n  marks_max: 4294967295\n",
            "flows.marks_max",
            "the most entries the kernel gives a hash map",
        ),
        ("flows:\n  max: 4294967295\n", "flows.max", "the most entries the kernel gives a hash map"),
        ("flows:\n  max: 200000000\n", "flows.max", "of kernel memory"),
        ("rules: [\"status=500\", \"status=500\"]\n", "rules[1]", "same rule as rules[0]"),
        ("rules: [\"status=500 duration=99999999999999h\"]\n", "rules[0]", "longer than 24h"),
        ("mirror:\n  interface: \"..\"\n", "mirror.interface", "not a link name"),
        (
            "protocols: [http1, http2]\nrules: [\"status=500\", \"dns=nxdomain qname=.svc.cluster.local\"]\n",
            "rules[1]",
            "needs the dns protocol, which the setting protocols: [http1, http2] leaves out",
        ),
    ];
    let many: Vec<String> = (1..=200_001).map(|n| format!("status=500 packets={n}")).collect();
    let many = format!("rules: {}\n", serde_json::to_string(&many).unwrap());
    let cases: Vec<(&str, &str, &str)> =
        cases.into_iter().chain([(many.as_str(), "rules", "200001 rules, more than the 16383")]).collect();
    for (i, (text, key, reason)) in cases.iter().copied().enumerate() {
        let path = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&path, format!("{confined}{text}")).unwrap();
        let text = &text[..text.len().min(120)];
        for check in [false, true] {
            let (out, said) = agent(&bins, &path, check);
            assert_eq!(out.status.code(), Some(2), "{text} (--check {check}): {said}");
            // "mirror-agent: config FILE: KEY: ...REASON..."
            let (_, after) = said.split_once(".yaml: ").unwrap_or_else(|| panic!("{said}"));
            assert!(
                after.starts_with(&format!("{key}: ")) && after.contains(reason),
                "{text} (--check {check}): {said}"
            );
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), cases.len(), "a refused config created files");
    let (out, said) = agent(&bins, &dir.path().join("absent.yaml"), false);
    assert!(!out.status.success() && said.contains("absent.yaml"), "{said}");
}

#[test]
fn a_broken_state_file_stops_the_start_before_anything_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let pins = format!("/sys/fs/bpf/mirror-e2e-state-{}", std::process::id());
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!("api:\n  socket: {d}/api.sock\nbpf:\n  pin_path: {pins}\nstate:\n  path: {d}/state.yaml\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("state.yaml"), "rules: 5\n").unwrap();
    let (out, said) = agent(&bins(), &config, false);
    assert!(!out.status.success() && said.contains("reading state") && said.contains("state.yaml"), "{said}");
    assert!(!Path::new(&pins).exists(), "pins were created: {said}");
    std::fs::write(dir.path().join("state.yaml"), "rules:\n- {id: 1, slot: 1, rule: status=999}\n").unwrap();
    let (out, said) = agent(&bins(), &config, false);
    assert!(!out.status.success() && said.contains("saved rule 1 in the state file"), "{said}");
    assert!(!Path::new(&pins).exists(), "pins were created: {said}");
}

/// A memory cgroup of its own with a limit (v2, or v1's memory controller), removed on drop.
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let v1 =
            own.lines().any(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")));
        let (root, file) = if v1 {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            ("/sys/fs/cgroup", "memory.max")
        };
        let dir = Path::new(root).join(format!("mirror-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join(file), limit.to_string()).unwrap_or_else(|e| {
            panic!("no memory limit on {} ({e}): memory controller missing?", dir.display())
        });
        MemoryCgroup(dir)
    }

    /// `program args...` run inside it.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("timeout");
        c.args(["20", "sh", "-c", r#"echo $$ > "$0/cgroup.procs" && exec "$@""#]).arg(&self.0).arg(program);
        c
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// An agent config in `dir` with nothing to attach to and no sink to create (only the maps and
/// the API socket), its pins under a path named after `tag`; returns the config and pin paths.
fn bare_config(dir: &Path, tag: &str) -> (std::path::PathBuf, String) {
    let d = dir.display();
    let pins = format!("/sys/fs/bpf/mirror-e2e-{tag}-{}", std::process::id());
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "interfaces:\n  include: [\"none-such*\"]\nmirror:\n  create: none\nmetrics:\n  listen: \"\"\n\
             api:\n  socket: {d}/api.sock\nbpf:\n  pin_path: {pins}\nstate:\n  path: {d}/state.yaml\n"
        ),
    )
    .unwrap();
    (config, pins)
}

#[test]
fn maps_beyond_the_cgroups_memory_are_refused_before_loading() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (config, pins) = bare_config(dir.path(), "cg");
    // 64 MiB: the default maps take more than that less the agent's own 16 MiB; the kernel
    // would have refused them (or left the agent nothing) once loading.
    let small = MemoryCgroup::new(64 << 20);
    for check in [true, false] {
        let mut cmd = small.command(&bins().agent);
        cmd.arg("--config").arg(&config);
        if check {
            cmd.arg("--check");
        }
        let (out, said) = run(&mut cmd);
        assert_eq!(out.status.code(), Some(2), "--check {check}: {said}");
        assert!(
            said.contains("flows.max: the classifier's maps take")
                && said.contains("the memory limit of the agent's cgroup"),
            "--check {check}: {said}"
        );
        assert!(!Path::new(&pins).exists(), "pins were created: {said}");
    }
    // 192 MiB: they fit, and the agent starts and stops.
    let roomy = MemoryCgroup::new(192 << 20);
    let mut cmd = roomy.command(&bins().agent);
    cmd.arg("--config").arg(&config).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    let agent = cmd.spawn().unwrap();
    let socket = dir.path().join("api.sock");
    let up = mirror_e2e::proc::wait_until(std::time::Duration::from_secs(15), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    // timeout(1) passes SIGTERM on to the agent.
    // SAFETY: kill only sends a signal to our child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let out = agent.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(up && out.status.success(), "the agent did not start within 192 MiB: {log}");
    assert!(!Path::new(&pins).exists(), "pins left: {log}");
}

#[test]
fn a_node_without_the_capabilities_stops_before_loading() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (config, pins) = bare_config(dir.path(), "caps");
    // Root without CAP_BPF and CAP_PERFMON (nor CAP_SYS_ADMIN, which stands for both): the
    // bounding set caps what the agent's exec gets.
    let without = |check: bool| {
        let mut cmd = Command::new("timeout");
        cmd.args(["10", "setpriv", "--bounding-set=-bpf,-perfmon,-sys_admin", "--"]).arg(bins().agent);
        cmd.arg("--config").arg(&config);
        if check {
            cmd.arg("--check");
        }
        run(&mut cmd)
    };
    let (out, said) = without(false);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let want = "mirror-agent: node requirements not met: missing capabilities CAP_BPF, CAP_PERFMON: run \
                mirror-agent as root";
    assert!(said.contains(want), "{said}");
    assert!(!Path::new(&pins).exists() && !dir.path().join("api.sock").exists(), "touched: {said}");
    // --check says the same of the node, the configuration being valid.
    let (out, said) = without(true);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("\n  MISSING  capabilities: missing capabilities CAP_BPF, CAP_PERFMON: "),
        "{said}"
    );
    assert!(said.contains("the agent would not start on this node"), "{said}");
}

#[test]
fn the_example_config_is_valid() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent.yaml");
    let (out, said) = agent(&bins(), &example, true);
    assert!(out.status.success(), "{said}");
    // Then what the maps will take here, map by map, with the settings that size them.
    let valid =
        format!("configuration is valid: {}\nkernel memory of the data path's maps on ", example.display());
    assert!(said.starts_with(&valid), "{said}");
    for map in ["flow_timing", "flow_table", "flow_nat", "mirror_marks", "request_replay", "port_rules"] {
        assert!(said.lines().any(|l| l.trim_start().starts_with(map) && l.contains(" MiB")), "{map}: {said}");
    }
    assert!(said.contains("(flows.max)") && said.contains("(flows.marks_max)"), "{said}");
    // The node's requirements, each on a line.
    assert!(said.contains("\nnode requirements (a start checks them before loading anything):\n"), "{said}");
    assert!(said.lines().any(|l| l.trim_start().starts_with("ok       BTF: ")), "{said}");
    // And what the same configuration takes on other nodes.
    let other = "on 4/16/64 CPUs: ";
    assert!(
        said.lines()
            .any(|l| l.starts_with(other) && l.ends_with(" (flows.max auto: 65536, 32768, 8192 flows)")),
        "{said}"
    );
    // Saved by an editor that starts UTF-8 files with a byte order mark: the same.
    let dir = tempfile::tempdir().unwrap();
    let bom = dir.path().join("agent.yaml");
    std::fs::write(&bom, [&b"\xef\xbb\xbf---\n"[..], &std::fs::read(&example).unwrap()].concat()).unwrap();
    let (out, said) = agent(&bins(), &bom, true);
    assert!(out.status.success(), "{said}");
}

#[test]
fn mirrorctl_without_an_agent_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let (out, said) = run(Command::new(bins().ctl).arg("--socket").arg(&socket).arg("status"));
    assert!(!out.status.success(), "{said}");
    let want = format!("cannot reach the agent at {} (is mirror-agent running?", socket.display());
    assert!(said.contains(&want), "{said}");
}

#[test]
fn mirrorctl_refuses_bad_rules_and_unknown_ids() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let cfg = AgentConfig { rules: vec!["status=500".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    let before = rules(&env);
    assert_eq!(before.len(), 1, "the configured rule: {before:?}");

    let cases: [(&[&str], &str); 7] = [
        (&["rules", "add", "status=999"], "bad rule at 'status=999'"),
        (&["rules", "add", "colour=red"], "bad rule at 'colour=red'"),
        (&["rules", "add", "status=500", "packets=lots"], "bad rule at 'packets=lots'"),
        (&["rules", "add", "status=500", "duration=99999999999999h"], "longer than 24h"),
        (&["rules", "add", "latency>2h"], "bad rule at 'latency>2h' (byte 0): longer than 1h"),
        (&["rules", "del", "12345"], "no rule with id 12345"),
        (&["rules", "del", "first"], "invalid value 'first'"),
    ];
    for (args, message) in cases {
        let out = env.ctl(args);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty() && out.stderr.contains(message), "{args:?}: {out:?}");
    }
    // The agent checks too, for clients other than mirrorctl: 400 with the same message; and
    // a request with a field it does not know is refused naming the field.
    let socket = env.socket();
    let curl = |method: &str, path: &str, body: &str| {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "5", "-w", " %{http_code}", "-H", "content-type: application/json"])
            .arg("--unix-socket")
            .arg(&socket)
            .args(["-X", method, &format!("http://agent{path}")]);
        if !body.is_empty() {
            curl.args(["-d", body]);
        }
        run(&mut curl)
    };
    let cases = [
        ("POST", "/v1/rules", r#"{"rule": "status=999"}"#, "bad rule at 'status=999'"),
        ("POST", "/v1/rules", r#"{"rule": "status=500 duration=99999999999999h"}"#, "longer than 24h"),
        ("POST", "/v1/rules", r#"{"rule": "status=502", "colour": "red"}"#, "unknown field `colour`"),
        ("POST", "/v1/rules", r#"{"rules": "status=502"}"#, "unknown field `rules`"),
        ("PUT", "/v1/latency/groups/http", r#"{"enabled": false, "now": true}"#, "unknown field `now`"),
        ("GET", "/v1/flows?limit=5&top=1", "", "unknown field `top`"),
    ];
    for (method, path, body, message) in cases {
        let (out, said) = curl(method, path, body);
        assert!(out.status.success() && said.contains(message) && said.ends_with(" 400"), "{body}: {said}");
    }
    assert_eq!(rules(&env), before, "a refused rule was added");
    let groups = env.ctl_ok(&["-o", "json", "latency", "groups"]);
    assert!(
        groups.contains("\"group\": \"http\",\n    \"enabled\": true"),
        "a refused request switched http off: {groups}"
    );
    agent.terminate();
}

#[test]
fn the_same_rule_twice_keeps_one_id() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let cfg = AgentConfig { rules: vec!["status=500".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    let before = rules(&env);
    let id = before[0].id;
    // The same rule, however written: its id, and a word on stderr.
    for rule in [&["status=500"][..], &["status=500", "packets=10k", "duration=60s"]] {
        let out = env.ctl(&[&["rules", "add"][..], rule].concat());
        assert!(out.status.success(), "{rule:?}: {out:?}");
        assert_eq!(out.stdout.trim(), id.to_string(), "{rule:?}: {out:?}");
        assert!(out.stderr.contains(&format!("the same rule exists already as rule {id}")), "{out:?}");
    }
    // Through the API: 200 and the existing rule, where a new one gets 201.
    let post = |rule: &str| {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "5", "-w", " %{http_code}", "-H", "content-type: application/json"])
            .arg("--unix-socket")
            .arg(env.socket())
            .args(["-d", &format!(r#"{{"rule": "{rule}"}}"#), "http://agent/v1/rules"]);
        run(&mut curl).1
    };
    let said = post("status=500");
    assert!(said.starts_with(&format!(r#"{{"id":{id},"#)) && said.ends_with(" 200"), "{said}");
    assert_eq!(rules(&env), before, "a second copy was added");
    // Other limits make another rule.
    let said = post("status=500 packets=5");
    assert!(said.ends_with(" 201"), "{said}");
    assert_eq!(rules(&env).len(), 2);
    agent.terminate();
}

/// One request on its own connection to the agent's socket: (status, body).
fn request(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connecting to the agent");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(format!("{head}{body}").as_bytes()).expect("sending");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reading the reply");
    let status = reply.get(9..12).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{reply:?}"));
    (status, reply.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string())
}

#[test]
fn rules_beyond_the_rule_maps_are_refused_and_nothing_changes() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let env = AgentEnv::new(&bins(), &topo.node, &AgentConfig::default());
    let agent = env.start(&[]);
    let socket = env.socket();
    // 131 ports x 500 statuses: 65,500 of the 65,536 (port, status) pairs port_rules holds.
    for port in 1..=131 {
        let (code, body) =
            request(&socket, "POST", "/v1/rules", &format!(r#"{{"rule": "port={port} status=100-599"}}"#));
        assert_eq!(code, 201, "port {port}: {body}");
    }
    let before = rules(&env);
    let (code, body) = request(&socket, "POST", "/v1/rules", r#"{"rule": "port=132 status=100-599"}"#);
    assert_eq!(code, 409, "{body}");
    assert!(
        body.contains("rule not added") && body.contains("66000 distinct (port, status) pairs"),
        "{body}"
    );
    assert_eq!(rules(&env), before, "a refused rule changed the rules");
    // What still fits is taken: 36 more pairs.
    let (code, body) = request(&socket, "POST", "/v1/rules", r#"{"rule": "port=132 status=500-535"}"#);
    assert_eq!(code, 201, "{body}");
    let (code, body) = request(&socket, "POST", "/v1/rules", r#"{"rule": "port=133 status=500"}"#);
    assert_eq!(code, 409, "{body}");
    // The saved state has every accepted rule: a restart restores the same set.
    let listed = rules(&env);
    agent.terminate();
    let agent = env.start(&[]);
    assert_eq!(
        rules(&env).iter().map(|r| (r.id, &r.rule)).collect::<Vec<_>>(),
        listed.iter().map(|r| (r.id, &r.rule)).collect::<Vec<_>>()
    );
    agent.terminate();
}

/// An agent that follows HTTP only (`protocols: [http1, http2]`): a rule with a DNS trigger or
/// a DNS filter is refused through the API (409, naming the rule and the setting) and nothing
/// changes; an HTTP rule is taken.
#[test]
fn dns_rules_are_refused_where_dns_is_not_followed() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let cfg = AgentConfig { extra: "protocols: [http1, http2]\n".into(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    let socket = env.socket();
    for rule in ["dns=servfail", "noresponse>1s qname=.svc.cluster.local", "dns=nxdomain qtype=AAAA"] {
        let (code, body) = request(&socket, "POST", "/v1/rules", &format!(r#"{{"rule": "{rule}"}}"#));
        assert_eq!(code, 409, "{rule}: {body}");
        assert!(
            body.contains("rule not added: rule '")
                && body.contains(
                    "needs the dns protocol, which the setting protocols: [http1, http2] leaves out"
                ),
            "{rule}: {body}"
        );
    }
    assert!(rules(&env).is_empty(), "a refused rule was installed");
    let (code, body) = request(&socket, "POST", "/v1/rules", r#"{"rule": "noresponse>1s"}"#);
    assert_eq!(code, 201, "{body}");
    agent.terminate();
}

#[test]
fn a_second_agent_refuses_and_changes_nothing() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let cfg = AgentConfig { rules: vec!["status=500".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    env.ctl_ok(&["latency", "disable", "http"]);
    let http_on = |env: &AgentEnv| -> bool {
        let text = env.ctl_ok(&["-o", "json", "latency", "groups"]);
        let groups: serde_json::Value = serde_json::from_str(&text).expect("groups are JSON");
        let http = groups.as_array().and_then(|g| g.iter().find(|g| g["group"] == "http")).cloned();
        http.unwrap_or_else(|| panic!("no http group: {text}"))["enabled"].as_bool().expect("a bool")
    };
    assert!(!http_on(&env), "switched off");

    // In the node namespace, like the first (nsenter keeps the host's /sys/fs/bpf).
    let mut cmd = Command::new("timeout");
    cmd.arg("20").arg("nsenter").arg(format!("--net={}", topo.node.path())).arg("--");
    cmd.arg(&bins().agent).arg("--config").arg(env.config_path());
    let (out, said) = run(&mut cmd);
    assert!(!out.status.success(), "a second agent started: {said}");
    assert!(said.contains("another mirror-agent"), "{said}");
    // The first agent is untouched: its socket answers, its group is still off.
    assert!(!http_on(&env), "the second agent switched the http group back on");
    assert_eq!(rules(&env).len(), 1);
    agent.terminate();
}
