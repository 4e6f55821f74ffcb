//! The recorder on real traffic: one capture per trigger, each exactly its flow's copies as
//! tcpdump saw them on the mirror, the replayed request first, read by tshark, fetched
//! byte-equal by `mirrorctl captures get`; the budget (bytes on disk never above it, the
//! oldest gone first, the counts right); a read-only and a full filesystem (the mirror goes
//! on, the error is counted).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mirror_agent::views::EventView;
use mirror_bpf::replay::REPLAY_MAC;
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::capture::pcap::PacketId;
use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::load::{HttpLoad, HttpSpec};
use mirror_e2e::workload::servers::Server;

use common::{bins, captures, failing_connections, json, metric, status, ALT, ATTACH, METRICS, VETHS};

/// A packet of a pcapng file as tshark reads it: its identity and whether it is a replay.
fn tshark_packets(file: &Path) -> Vec<(PacketId, bool, String)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "separator=|"])
        .args(["-e", "eth.src", "-e", "ip.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport"])
        .args([
            "-e",
            "tcp.seq_raw",
            "-e",
            "tcp.ack_raw",
            "-e",
            "tcp.flags",
            "-e",
            "tcp.len",
            "-e",
            "frame.comment",
        ])
        .output()
        .expect("running tshark");
    assert!(out.status.success(), "tshark -r {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let replay_mac = REPLAY_MAC.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let addr =
                |ip: &str, port: &str| format!("{ip}:{port}").parse().unwrap_or_else(|e| panic!("{l}: {e}"));
            let num = |s: &str| s.parse::<u32>().unwrap_or_else(|e| panic!("{l}: {s}: {e}"));
            let id = PacketId {
                src: addr(f[1], f[2]),
                dst: addr(f[3], f[4]),
                seq: num(f[5]),
                ack: num(f[6]),
                flags: u16::from_str_radix(f[7].trim_start_matches("0x"), 16).expect("tcp.flags") as u8,
                len: num(f[8]),
            };
            (id, f[0] == replay_mac, f[9..].join("|"))
        })
        .collect()
}

/// Three connections whose first request gets a 500, each then sending requests on, while
/// other connections load the server: three captures, each the copies tcpdump saw of its
/// flow on the mirror, in order, after the request replayed ahead of the 500.
#[test]
fn each_trigger_gets_its_flows_copies_in_a_capture_of_its_own() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let cfg = AgentConfig {
        rules: vec![format!("status=500 port={HTTP} packets=120")],
        metrics: METRICS.into(),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let server = topo.pod("server");
    let _nginx = Server::nginx(server, HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let mirror = Capture::start(&topo.node, &env.sink_peer(), "", &env.dir().join("mirror.pcap"));
    let to = std::net::SocketAddr::new(server.v4.into(), HTTP);
    let client = &topo.pod("client").ns;
    // The load: connections of 200s only, never marked.
    let load = HttpLoad::start(
        client,
        to,
        &HttpSpec { connections: 4, first: None, path: "/foo", pause: Duration::from_millis(2) },
    );
    // Three flows at once, each marked by its first answer.
    let failing = HttpLoad::start(
        client,
        to,
        &HttpSpec {
            connections: 3,
            first: Some(("/fail", 500)),
            path: "/foo",
            pause: Duration::from_millis(5),
        },
    );
    let scrape = || topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    let closed = wait_until(Duration::from_secs(30), || {
        let c = captures(&env);
        c.len() == 3 && c.iter().all(|c| c.state != "open")
    });
    let failed = failing.finish();
    let loaded = load.finish();
    assert!(closed, "three captures, closed: {:?}", captures(&env));
    assert!(failed.iter().chain(&loaded).all(|r| r.error.is_none()), "the load failed");
    std::thread::sleep(Duration::from_millis(300));
    let trace = mirror.stop();

    let list = captures(&env);
    let events: Vec<EventView> = json(&env.ctl_ok(&["-o", "json", "events"]));
    assert_eq!(events.len(), 3, "{events:?}");
    let dir = env.dir().join("captures");
    for c in &list {
        assert_eq!((c.state.as_str(), c.cut.as_deref()), ("complete", None), "{c:?}");
        assert_eq!(c.ended.as_deref(), Some("the rule's limit"), "{c:?}");
        // Its event names it.
        let ev = events.iter().find(|e| e.capture.as_ref().is_some_and(|r| r.id == c.id));
        let ev = ev.unwrap_or_else(|| panic!("no event names capture {}: {events:?}", c.id));
        assert_eq!(c.flow, format!("{} -> {}", ev.client_side.client, ev.server_side.server));
        assert_eq!((c.trigger.as_str(), c.request.as_deref()), ("500", Some("GET /fail")), "{c:?}");
        // What tshark reads of it.
        let file = dir.join(format!("{}.pcapng", c.id));
        let pkts = tshark_packets(&file);
        assert_eq!(pkts.len() as u64, c.packets, "{c:?}");
        let client_addr: std::net::SocketAddr = ev.client_side.client.parse().unwrap();
        let key = mirror_bpf::FlowKey::new(client_addr, to, 6);
        // The request replayed ahead of the 500 first, as on the mirror.
        let replayed: Vec<PacketId> =
            trace.replayed.iter().filter(|r| r.packet.flow() == key).map(|r| r.packet.id()).collect();
        assert_eq!(replayed.len(), 1, "{}: {replayed:?}", c.id);
        assert!(
            pkts[0].1 && pkts[0].0 == replayed[0],
            "{}: first {:?}, replayed {replayed:?}",
            c.id,
            pkts[0]
        );
        assert!(pkts[0].2.starts_with("replayed: the request before the trigger"), "{:?}", pkts[0]);
        // Then exactly the flow's copies, in order: the rule's 120.
        let mirrored: Vec<PacketId> =
            trace.packets.iter().filter(|p| p.flow() == key).map(|p| p.id()).collect();
        let copies: Vec<PacketId> = pkts[1..].iter().map(|p| p.0).collect();
        assert_eq!(mirrored.len(), 120, "{}", c.id);
        assert_eq!(copies, mirrored, "capture {} against the mirror", c.id);
        assert!(
            pkts[1..].iter().all(|p| !p.1
                && p.2.starts_with("mirrored by rule 1 (")
                && p.2.contains("status=500")
                && p.2.ends_with("on a 500")),
            "{}: {:?}",
            c.id,
            pkts[1]
        );
        // Fetched through the API: the same bytes, to a file and to stdout.
        let got = env.dir().join(format!("got-{}.pcapng", c.id));
        env.ctl_ok(&["captures", "get", &c.id.to_string(), "-w", got.to_str().unwrap()]);
        let want = std::fs::read(&file).unwrap();
        assert_eq!(std::fs::read(&got).unwrap(), want, "captures get {}", c.id);
        let out = Command::new(&bins().ctl)
            .arg("--socket")
            .arg(env.socket())
            .args(["captures", "get", &c.id.to_string(), "-w", "-"])
            .output()
            .expect("mirrorctl");
        assert!(out.status.success() && out.stdout == want, "captures get {} -w -", c.id);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let text = scrape();
    assert_eq!(metric(&text, "mirror_recorder_captures_opened_total"), 3, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_write_errors_total"), 0, "{text}");
    // rm: gone from the listing and the disk; a second rm says there is none.
    let id = list[0].id.to_string();
    env.ctl_ok(&["captures", "rm", &id]);
    assert!(!dir.join(format!("{id}.pcapng")).exists() && captures(&env).len() == 2);
    let again = env.ctl(&["captures", "rm", &id]);
    assert!(!again.status.success() && again.stderr.contains(&format!("no capture {id}")), "{again:?}");
    assert!(status(&env).counters["mirrored_packets"] >= 360);
    agent.terminate();
}

/// Sum of the sizes of the files in `dir`.
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
}

/// 500 triggers against a budget of 5 MB: never more on disk (sampled all along), the oldest
/// deleted first, the counts right.
#[test]
fn five_hundred_triggers_stay_within_five_megabytes() {
    if !require_root() {
        return;
    }
    const BUDGET: u64 = 5_000_000;
    let topo = Topology::without_sink(&PODS);
    let cfg = AgentConfig {
        rules: vec![format!("status=500 port={ALT}")],
        metrics: METRICS.into(),
        extra: format!("recorder:\n  max_bytes: {BUDGET}\n  max_captures: 1000\n"),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _python = Server::python(&topo.pod("server").ns, ALT, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);
    let dir = env.dir().join("captures");
    // The disk, sampled every 10 ms while the triggers come.
    let (stop, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let watcher = {
        let (stop, most, dir) = (stop.clone(), most.clone(), dir.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(bytes_in(&dir), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // 60 a second: each capture closes within half a second, a few dozen are open at once.
    assert_eq!(failing_connections(&topo, 500, 30_000, 10), 500);
    let closed = wait_until(Duration::from_secs(10), || captures(&env).iter().all(|c| c.state != "open"));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert!(closed, "{:?}", captures(&env).iter().filter(|c| c.state == "open").collect::<Vec<_>>());
    let most = most.load(Ordering::Relaxed).max(bytes_in(&dir));
    assert!(most <= BUDGET, "{most} bytes on disk, above the budget of {BUDGET}");
    // More than the budget was written: the oldest were deleted, the newest kept.
    let list = captures(&env);
    let events: Vec<EventView> = json(&env.ctl_ok(&["-o", "json", "events", "--limit", "1000"]));
    let ids: Vec<u64> = events.iter().filter_map(|e| e.capture.as_ref().map(|c| c.id)).collect();
    assert_eq!(ids.len(), 500, "every event names its capture");
    let kept: Vec<u64> = list.iter().map(|c| c.id).collect();
    assert!(kept.len() > 10 && kept.len() < 500, "{} kept", kept.len());
    assert_eq!(kept, ids[ids.len() - kept.len()..], "the newest are kept, the oldest went first");
    assert!(list.iter().all(|c| c.state == "complete"), "{list:?}");
    let on_disk: BTreeMap<String, u64> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect();
    assert_eq!(on_disk.len(), kept.len() * 2, "a pcapng and its metadata each: {on_disk:?}");
    for c in &list {
        assert_eq!(on_disk.get(&format!("{}.pcapng", c.id)), Some(&c.bytes), "{c:?}");
    }
    let text = topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    assert_eq!(metric(&text, "mirror_recorder_captures_opened_total"), 500, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_captures_deleted_total"), 500 - kept.len() as u64, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_stored_captures"), kept.len() as u64, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_write_errors_total"), 0, "{text}");
    assert_eq!(metric(&text, "mirror_recorder_captures_failed_total"), 0, "{text}");
    agent.terminate();
}

/// A tmpfs mounted on a directory of the test, unmounted (and so emptied) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st =
            Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).status().unwrap();
        assert!(st.success(), "mount -o {options} {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The recorder's directory read-only, then on a full filesystem: every request answered, the
/// mirror copies on, the errors counted; the agent lives on.
#[test]
fn a_read_only_or_full_disk_is_counted_and_the_mirror_goes_on() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    for (options, min_free) in [("ro,size=1m,mode=0700", 0), ("size=1m,mode=0700", 0)] {
        let base = tempfile::tempdir().unwrap();
        let mount = Tmpfs::mount(&base.path().join("disk"), options);
        let dir = mount.0.join("captures");
        let cfg = AgentConfig {
            rules: vec![format!("status=500 port={ALT}")],
            metrics: METRICS.into(),
            extra: format!(
                "recorder:\n  dir: {:?}\n  min_free_bytes: {min_free}\n",
                dir.display().to_string()
            ),
            ..AgentConfig::default()
        };
        let env = AgentEnv::new(&bins(), &topo.node, &cfg);
        let _python = Server::python(&topo.pod("server").ns, ALT, env.dir());
        let agent = env.start(&[]);
        agent.wait_attached(&VETHS, ATTACH);
        let before = status(&env).counters["mirrored_packets"];
        // 20 triggers of 200 KB each: 4 MB, four times the filesystem.
        assert_eq!(failing_connections(&topo, 20, 200_000, 0), 20, "{options}");
        let scrape = || topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
        let counted = wait_until(Duration::from_secs(5), || {
            metric(&scrape(), "mirror_recorder_write_errors_total") > 0
        });
        assert!(counted, "{options}: no write error counted: {}", scrape());
        let mirrored = status(&env).counters["mirrored_packets"] - before;
        // At least the request, the response's first segment and the FINs of each.
        assert!(mirrored >= 20 * 4, "{options}: the mirror went on: {mirrored} copies");
        if options.starts_with("ro") {
            assert!(agent.output().contains("captures' directory cannot be used"), "{}", agent.output());
            assert_eq!(metric(&scrape(), "mirror_recorder_captures_opened_total"), 0);
        } else {
            // Cut where the disk refused, and listed so.
            let list = captures(&env);
            assert!(
                list.iter().any(|c| c.cut.as_deref().is_some_and(|w| w.contains("writing failed"))),
                "{list:?}"
            );
        }
        let out = agent.terminate();
        assert!(!out.contains("panicked"), "{out}");
        drop(mount);
    }
}
