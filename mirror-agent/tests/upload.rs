//! The recorder's uploads against a real S3-compatible server (gofakes3, a Go module built
//! once into the tests' cache) on the node's loopback: each closed capture stored under the
//! documented key, signed with the credentials of a mounted Secret's files, byte-equal to the
//! capture the node kept, then deleted from the node; the server stopped for 30 s and started
//! again on the same data: the captures of the outage wait on the node, nothing is lost and
//! nothing is sent twice (PUTs counted by the server).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mirror_agent::views::{CaptureView, EventView};
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::h2_scenario::missing;
use mirror_e2e::workload::s3::{self, S3Server};
use mirror_e2e::workload::servers::Server;

use common::{bins, captures, failing_connections, json, metric, ALT, ATTACH, METRICS, VETHS};

const S3: &str = "127.0.0.1:9000";
const BUCKET: &str = "captures";
const KEY_ID: &str = "MIRRORTESTKEY";
/// How long the server stays away.
const OUTAGE: Duration = Duration::from_secs(30);

/// The key the documentation gives for a capture of `ev`:
/// `<prefix>/<cluster>/<node>/<namespace>/<pod>/<time>-<id>.pcapng`, `_/<pod>` for a pod of no
/// known namespace (here: named from /proc), `_host/<interface>` for a trigger of no known pod,
/// the time without `-` and `:`.
fn documented_key(ev: &EventView) -> String {
    let c = ev.capture.as_ref().expect("the event names its capture");
    let place = match &ev.pod {
        Some(pod) if pod.contains('/') => pod.clone(),
        Some(pod) => format!("_/{pod}"),
        None => format!("_host/{}", ev.interface),
    };
    let stamp = ev.time.replace(['-', ':'], "");
    format!("mirror/test-cluster/{}/{place}/{stamp}-{}.pcapng", c.node, c.id)
}

/// The PUTs the server answered with 200, per key.
fn puts(s3: &S3Server) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for r in s3.requests().into_iter().filter(|r| r.method == "PUT" && r.status == 200) {
        let key = r.path.strip_prefix(&format!("/{BUCKET}/")).unwrap_or(&r.path).to_string();
        *n.entry(key).or_default() += 1;
    }
    n
}

#[test]
fn captures_are_uploaded_once_each_and_an_outage_loses_none() {
    if !require_root() {
        return;
    }
    let Some(server_bin) = s3::binary() else {
        missing("S3 server", "a Go toolchain (go in PATH or /usr/local/go/bin/go)");
        return;
    };
    let topo = Topology::without_sink(&PODS);
    // The credentials as a Secret mounted as a volume shows them: one file per key.
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("access_key_id"), format!("{KEY_ID}\n")).unwrap();
    std::fs::write(secret.path().join("secret_access_key"), "not-a-real-secret\n").unwrap();
    let cfg = AgentConfig {
        rules: vec![format!("status=500 port={ALT}")],
        metrics: METRICS.into(),
        extra: format!(
            "recorder:\n  upload:\n    enabled: true\n    endpoint: http://{S3}\n    bucket: {BUCKET}\n    \
             prefix: mirror/\n    cluster: test-cluster\n    credentials_dir: {:?}\n    retry_min: 500ms\n    \
             retry_max: 4s\n",
            secret.path().display().to_string()
        ),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _python = Server::python(&topo.pod("server").ns, ALT, env.dir());
    let mut s3 = S3Server::start(&server_bin, &topo.node, S3, env.dir(), BUCKET);
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let scrape = || topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    let dir = env.dir().join("captures");

    // Served: three triggers, each capture stored once closed, then gone from the node.
    assert_eq!(failing_connections(&topo, 3, 20_000, 50), 3);
    let uploaded = |n: usize| {
        let c = captures(&env);
        c.len() == n && c.iter().all(|c| c.uploaded)
    };
    assert!(wait_until(Duration::from_secs(20), || uploaded(3)), "{:?}", captures(&env));
    for c in captures(&env) {
        assert!(!dir.join(format!("{}.pcapng", c.id)).exists(), "{c:?} still on the node");
        assert_eq!(c.state, "complete", "{c:?}");
        let object = s3.object(c.key.as_deref().unwrap()).unwrap_or_else(|| panic!("no object of {c:?}"));
        assert_eq!(object.len() as u64, c.bytes, "{c:?}");
        // Fetched by id it says where it went.
        let got = env.ctl(&["captures", "get", &c.id.to_string(), "-w", "/dev/null"]);
        assert!(!got.status.success() && got.stderr.contains(c.key.as_deref().unwrap()), "{got:?}");
        assert!(env.ctl_ok(&["captures"]).contains("complete, uploaded"));
    }

    // The server away: the captures closed meanwhile wait on the node, tried again and again.
    s3.stop();
    let down = Instant::now();
    assert_eq!(failing_connections(&topo, 4, 20_000, 50), 4);
    let waiting = |c: &CaptureView| c.state == "complete" && !c.uploaded && c.key.is_some();
    let pending = wait_until(Duration::from_secs(20), || {
        let c = captures(&env);
        c.len() == 7
            && c.iter().filter(|c| waiting(c)).count() == 4
            && c.iter().any(|c| c.upload_failures > 1)
    });
    assert!(pending, "{:?}", captures(&env));
    // What the node keeps of them, fetched by id (byte-equal to its file), to compare with
    // what the server will hold.
    let mut kept = BTreeMap::new();
    for c in captures(&env).into_iter().filter(waiting) {
        let file = dir.join(format!("{}.pcapng", c.id));
        let got = env.dir().join(format!("got-{}.pcapng", c.id));
        env.ctl_ok(&["captures", "get", &c.id.to_string(), "-w", got.to_str().unwrap()]);
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(std::fs::read(&got).unwrap(), bytes, "captures get {}", c.id);
        assert_eq!(bytes.len() as u64, c.bytes, "{c:?}");
        kept.insert(c.key.clone().unwrap(), bytes);
    }
    let text = scrape();
    assert_eq!(metric(&text, "mirror_recorder_upload_pending"), 4, "{text}");
    assert!(metric(&text, "mirror_recorder_upload_failures_total") > 1, "{text}");
    assert!(env.ctl_ok(&["captures"]).contains("upload pending ("), "{}", env.ctl_ok(&["captures"]));
    std::thread::sleep(OUTAGE.saturating_sub(down.elapsed()));

    // Back, on the same data: the four stored, each byte-equal to what the node kept.
    s3.restart();
    assert!(wait_until(Duration::from_secs(20), || uploaded(7)), "{:?}", captures(&env));
    for (key, bytes) in &kept {
        let object = s3.object(key).unwrap_or_else(|| panic!("no object {key}"));
        assert!(object == *bytes, "{key}: {} bytes stored, {} kept on the node", object.len(), bytes.len());
    }
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".pcapng")));

    // Nothing lost, nothing twice: one PUT per trigger, under the key its event names, as
    // documented, and the stored ones from before the outage still there.
    let events: Vec<EventView> = json(&env.ctl_ok(&["-o", "json", "events"]));
    assert_eq!(events.len(), 7, "{events:?}");
    let keys: Vec<String> = events.iter().map(documented_key).collect();
    for (ev, key) in events.iter().zip(&keys) {
        assert_eq!(ev.capture.as_ref().unwrap().key.as_deref(), Some(key.as_str()), "{ev:?}");
        assert!(s3.object(key).is_some(), "{key} lost");
    }
    let sent = puts(&s3);
    assert_eq!(sent.keys().cloned().collect::<Vec<_>>(), {
        let mut k = keys.clone();
        k.sort();
        k
    });
    assert!(sent.values().all(|n| *n == 1), "a capture sent twice: {sent:?}");
    // Every request of the agent (HEADs and PUTs; the GETs are the test's) signed with the
    // Secret's key.
    let requests = s3.requests();
    let agents: Vec<_> = requests.iter().filter(|r| r.method != "GET").collect();
    assert_eq!(agents.iter().filter(|r| r.method == "PUT").count(), 7, "{agents:?}");
    assert!(agents.iter().all(|r| r.access_key == KEY_ID), "{agents:?}");
    let text = scrape();
    assert_eq!(metric(&text, "mirror_recorder_uploads_total"), 7, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_upload_pending"), 0, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_uploads_abandoned_total"), 0, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_write_errors_total"), 0, "{text}");
    let out = agent.terminate();
    assert!(!out.contains("panicked"), "{out}");
}
