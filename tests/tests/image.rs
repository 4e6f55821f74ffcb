//! The image as a node runs it: built from `docker/Dockerfile` (the `runtime-prebuilt` target,
//! on the local base image), its container started with the DaemonSet's pod spec (init
//! container, capabilities instead of privileged, seccomp, read-only root, mounts and their
//! propagation, memory limit, arguments, environment; the test's node namespace stands for
//! the host network), then what an operator does: `mirrorctl rules add status=500` in the
//! container, a 500 from a pod, the flow on the sink; an upgrade (a second container takes the
//! data path over, one keep-alive connection mirrored without a gap throughout); an uninstall
//! (the last container stopped: nothing left on the node).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mirror_bpf::attach::tcx_prog_ids;
use mirror_bpf::testing::{ifindex, require_root};
use mirror_e2e::agent::Binaries;
use mirror_e2e::capture::tcpdump::Recorder;
use mirror_e2e::cluster::kube::{Manifests, Node};
use mirror_e2e::cluster::kubelet::{pod_uid, PodProcess, PodSpec};
use mirror_e2e::cluster::podman::{build_prebuilt, Container, SharedMount};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url, Session};
use mirror_e2e::workload::servers::Server;

/// The bpffs magic number (statfs f_type).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// podman stop's grace period, the DaemonSet's terminationGracePeriodSeconds.
const GRACE: Duration = Duration::from_secs(30);
/// The sink of the ConfigMap (`create: auto`: a veth pair on this kernel) and its peer.
const SINK: &str = "mirror0";
const SINK_PEER: &str = "mirror0p";

fn fs_type(path: &std::path::Path) -> i64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: statfs fills the struct we pass; the path is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0, "statfs {}", path.display());
    st.f_type
}

/// What the bpffs holds besides the kernel's own preload files.
fn pins(bpffs: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(bpffs)
        .expect("reading the bpffs")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.ends_with(".debug"))
        .collect()
}

/// GET on the node's address from inside the node: the HTTP status (0: no answer).
fn http_status(topo: &Topology, addr: &str, port: u16, path: &str) -> u16 {
    let out = topo
        .node
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-m", "3", "-w", "%{http_code}"])
        .arg(format!("http://{addr}:{port}{path}"))
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

fn status_json(c: &Container) -> serde_json::Value {
    serde_json::from_str(&c.exec_ok(&["mirrorctl", "-o", "json", "status"])).expect("status is JSON")
}

#[test]
fn the_image_installs_upgrades_and_uninstalls_as_the_daemonset_runs_it() {
    if !require_root() {
        return;
    }
    let m = Manifests::load();
    let bins = Binaries::locate().expect("the binaries");
    let built = build_prebuilt(&bins, &m.image("mirror-agent"));
    eprintln!(
        "image {}: {:.1} MB, built in {:.1} s (base image {:.1} s)",
        built.tag,
        built.size as f64 / 1e6,
        built.build_s,
        built.base_s
    );

    let topo = Topology::without_sink(&PODS);
    // A pod's process, as the kubelet starts them (its name in the environment, its UID in the
    // cgroup path): the DaemonSet's agent names the pod from the node's processes.
    let web = PodSpec {
        env_name: Some("web-0".into()),
        env_namespace: Some("shop".into()),
        uid: pod_uid(7),
        ..PodSpec::default()
    };
    let _web = PodProcess::start(&topo.pod("server").ns, &web);
    let dir = tempfile::Builder::new().prefix("mirror-image").tempdir().expect("a temp dir");
    let bpffs = SharedMount::new(&dir.path().join("bpf"));
    let (state, run, config) = (dir.path().join("state"), dir.path().join("run"), dir.path().join("config"));
    let host_run = dir.path().join("host-run");
    for d in [&state, &run, &config, &host_run] {
        std::fs::create_dir_all(d).expect("creating a host directory");
    }
    m.write_config_files(&config);
    let node_ip = topo.pod("client").gw4.to_string();
    let node = Node {
        host_paths: BTreeMap::from([
            ("/sys/fs/bpf", bpffs.path().to_path_buf()),
            ("/var/lib/mirror-agent", state.clone()),
            ("/run/mirror-agent", run.clone()),
            // No container runtime here: an empty /run, the pods named from /proc.
            ("/run", host_run.clone()),
        ]),
        config_maps: BTreeMap::from([("mirror-agent", config.clone())]),
        fields: BTreeMap::from([
            ("status.hostIP", node_ip.clone()),
            ("spec.nodeName", "e2e-node".to_string()),
        ]),
        netns_path: topo.node.path(),
    };
    let unique = format!("mirror-e2e-{}", std::process::id());

    // The init container mounts a bpffs where the node has none, on the host's side.
    assert_ne!(fs_type(bpffs.path()), BPF_FS_MAGIC);
    Container::run_to_end(&m.podman_args("mount-bpffs", &node));
    assert_eq!(fs_type(bpffs.path()), BPF_FS_MAGIC, "the init container's bpffs did not reach the host");

    let _nginx = Server::nginx(topo.pod("server"), HTTP, dir.path());
    let args = m.podman_args("agent", &node);
    let started = Instant::now();
    let first = Container::start(&format!("{unique}-a"), &args);
    let socket = run.join("api.sock");
    let serving =
        wait_until(Duration::from_secs(30), || std::os::unix::net::UnixStream::connect(&socket).is_ok());
    assert!(serving, "the agent did not serve: {}", first.logs());
    // Whether the agent in `c` serves and reports both veths attached.
    let attached = |c: &Container| {
        let out = c.exec(&["mirrorctl", "-o", "json", "status"]);
        let Ok(st) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { return false };
        let names: Vec<String> = st["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["name"].as_str().map(String::from))
            .collect();
        PODS.iter().all(|p| names.contains(&format!("veth{p}")))
    };
    assert!(wait_until(Duration::from_secs(10), || attached(&first)), "not attached: {}", first.logs());
    eprintln!("first agent serving and attached in {:.1} s", started.elapsed().as_secs_f64());
    let st = status_json(&first);
    assert_eq!(st["mirror"]["kind"], "veth", "this kernel has no dummy type: {st}");
    // The one line the start logs at info (the DaemonSet's RUST_LOG) says so.
    let said = "mirror interface mirror0 (veth, created; copies to mirror0p)";
    let up = wait_until(Duration::from_secs(5), || {
        first.logs().lines().any(|l| l.contains(" up in ") && l.contains(said))
    });
    assert!(up, "{}", first.logs());
    // And nothing else: the node meets every requirement, no warning.
    assert_eq!(first.logs().lines().filter(|l| !l.trim().is_empty()).count(), 1, "{}", first.logs());

    // The probes of the manifest: the startup probe in the container (its own agent holds the
    // data path), then /healthz and /readyz on the node's address.
    let startup = m.startup_probe_command("agent");
    let startup: Vec<&str> = startup.iter().map(String::as_str).collect();
    assert!(!startup.is_empty(), "the agent's container has no exec startup probe");
    let said = first.exec_ok(&startup);
    assert!(said.starts_with("this container's agent (pid "), "{said}");
    for (kind, path, port) in m.probes("agent") {
        let code = http_status(&topo, &node_ip, port, &path);
        assert_eq!(code, 200, "{kind} {path} on {node_ip}:{port}");
    }

    let named = wait_until(Duration::from_secs(5), || {
        let pods: serde_json::Value =
            serde_json::from_str(&first.exec_ok(&["mirrorctl", "-o", "json", "pods"])).expect("pods is JSON");
        pods.as_array().is_some_and(|p| p.iter().any(|p| p["name"] == "web-0" && p["namespace"] == "shop"))
    });
    assert!(named, "the pod is not named: {}", first.exec_ok(&["mirrorctl", "pods"]));

    let id = first.exec_ok(&["mirrorctl", "rules", "add", "status=500"]);
    assert!(!id.trim().is_empty());

    let client_ns = &topo.pod("client").ns;
    let server = topo.pod("server").addr(false);
    let recorder = Recorder::new(dir.path());
    let mut second = None;
    let mut during = 0;
    let rec = recorder.record(client_ns, Some((&topo.node, SINK_PEER)), || {
        let mut session = Session::open(client_ns, server, HTTP);
        let (code, port) = session.get("/bar");
        assert_eq!(code, 500);
        let mut same_connection =
            |path: &str, want: u16| assert_eq!(session.get(path), (want, port), "{path}");
        same_connection("/foo", 200);

        // Upgrade: the surge pod starts beside the running one and takes the data path over;
        // the connection goes on throughout.
        let handover = Instant::now();
        let next = Container::start(&format!("{unique}-b"), &args);
        let done = wait_until(Duration::from_secs(60), || {
            same_connection("/foo", 200);
            during += 1;
            first.logs().contains("standing by") && attached(&next)
        });
        assert!(done, "no hand-over:\n--- old\n{}\n--- new\n{}", first.logs(), next.logs());
        eprintln!(
            "hand-over in {:.1} s, {during} requests on the mirrored connection meanwhile",
            handover.elapsed().as_secs_f64()
        );
        let st = status_json(&next);
        assert_eq!(st["adopted"], true, "{st}");
        assert!(first.running(), "the old agent stands by until its pod is deleted");
        // The startup probe: passed in the new pod, failed in the old one standing by.
        let said = next.exec_ok(&startup);
        assert!(said.starts_with("this container's agent (pid "), "{said}");
        let old = first.exec(&startup);
        let old_said = String::from_utf8_lossy(&old.stdout);
        assert!(!old.status.success() && old_said.contains("of another cgroup"), "{old_said}");
        same_connection("/foo", 200);

        // The old pod deleted: it changes nothing.
        let (code, log) = first.stop(GRACE);
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("nothing to undo"), "{log}");
        same_connection("/foo", 200);
        assert_eq!(client::get_each(client_ns, &[url(server, HTTP, "/bar")]), [500]);
        second = Some(next);
    });
    let second = second.expect("the second agent");
    let expected = Expected::from_reference(&rec.reference, |status, _| status == 500);
    // In a container /proc/sys is read-only: the sink's IPv6 cannot be switched off, only its
    // addresses (see the README, "Consuming the mirror"); a node that forwards IPv6 has it join
    // the routers' group and report that. Those frames are the sink's own, not copies.
    let mut mirror = rec.mirror.clone();
    if mirror.ipv6_own > 0 {
        eprintln!("the sink's own IPv6 frames (MLD, DAD) on its peer: {}", mirror.ipv6_own);
        mirror.other -= mirror.ipv6_own;
    }
    expected.assert_mirror(&mirror);
    assert_eq!(expected.triggered.len(), 2, "{:?}", expected.triggered);

    // Uninstall: the DaemonSet deleted, its last pod stopped without a hand-over.
    let (code, log) = second.stop(GRACE);
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("detached everywhere, pins removed"), "{log}");
    assert!(log.contains("mirror sink removed"), "{log}");
    assert_eq!(pins(bpffs.path()), Vec::<String>::new(), "pins left in the bpffs");
    let _inside = topo.node.enter();
    for p in PODS {
        let i = ifindex(&format!("veth{p}"));
        for egress in [false, true] {
            assert_eq!(tcx_prog_ids(i, egress).expect("querying TCX"), Vec::<u32>::new(), "veth{p}");
        }
    }
    for l in [SINK, SINK_PEER] {
        let c = std::ffi::CString::new(l).expect("a link name");
        // SAFETY: a valid C string, only read.
        assert_eq!(unsafe { libc::if_nametoindex(c.as_ptr()) }, 0, "{l} left on the node");
    }
}
