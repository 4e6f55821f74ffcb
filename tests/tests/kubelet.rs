//! The product on a real single-node cluster ([`mirror_e2e::cluster::single_node`]): a kubelet
//! runs the DaemonSet that `kubectl apply -k` of an overlay over `deploy/` makes (only what a
//! user overrides: the node's paths, `attach.expedite_rcu`), with the image `make image`
//! builds imported into the node's containerd. Workloads as users run them: two Deployments of
//! an HTTP server answering 500s on `/fail` (`web`, `api`) and one of a gRPC server, each
//! behind a ClusterIP Service, and a client Deployment calling them by their DNS names
//! (CoreDNS). A `MirrorRule` selecting `web`: each of web's 500s from the rule on is on the
//! mirror exactly once, against the client's own record (`kubectl logs`); api's and the gRPC
//! server's flows, and web's 200s, never; the rule's status and the pod's Events as `kubectl`
//! shows them. Under the same capture of the sink: a rolling upgrade of the DaemonSet to a
//! second image tag (the new agent adopts the data path and the same sink: none of web's 500s
//! missed nor mirrored twice), kube-proxy switched from nftables to iptables mode (web's 500s
//! through iptables' NAT, each once), and web's pod rescheduled (a new veth and address: its
//! 500s mirrored once the agent has named it). Then `kubectl delete -k`: nothing of the
//! agent's left on the node (programs on the veths, pins, the sink).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::Binaries;
use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::cluster::apps::{build_apps_image, APPS_IMAGE};
use mirror_e2e::cluster::containerd;
use mirror_e2e::cluster::control_plane;
use mirror_e2e::cluster::kube_proxy::ProxyMode;
use mirror_e2e::cluster::podman::{build_prebuilt, repo_root};
use mirror_e2e::cluster::single_node::{pod_cgroups, Cluster};
use mirror_e2e::proc::wait_until;
use mirror_e2e::workload::h2_stacks::build_grpc_go;
use mirror_e2e::workload::servers::go_toolchain;
use serde_json::Value;

/// The agent's image, as deploy/kustomization.yaml names it.
const AGENT_IMAGE: &str = "localhost/mirror-agent:dev";
/// The tag an upgrade moves the DaemonSet to (the same image tagged anew: a new pod all the same).
const UPGRADE_TAG: &str = "upgrade";
/// The sink the agent makes (a veth pair on this kernel) and the peer that receives the copies.
const SINK_PEER: &str = "mirror0p";

/// The workloads: servers behind Services, the client calling them by name.
fn workloads() -> String {
    let http = |name: &str, port: u16| {
        format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
        - name: server
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command: [perl, /usr/local/lib/http-server.pl, "{port}"]
          readinessProbe: {{tcpSocket: {{port: {port}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: shop}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: {port}, targetPort: {port}}}]
---
"#
        )
    };
    let plan = r#"{"channels":[{"target":"grpc:50051","calls":[{"method":"/shop.Cart/Get","code":13},{"method":"/shop.Cart/Get","code":0}]}]}"#;
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
{web}{api}apiVersion: apps/v1
kind: Deployment
metadata: {{name: grpc, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: grpc}}}}
  template:
    metadata: {{labels: {{app: grpc}}}}
    spec:
      containers:
        - name: server
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command: [/usr/local/bin/grpc-stack, server, "50051"]
          readinessProbe: {{tcpSocket: {{port: 50051}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: grpc, namespace: shop}}
spec:
  selector: {{app: grpc}}
  ports: [{{port: 50051, targetPort: 50051}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: client, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: client}}}}
  template:
    metadata: {{labels: {{app: client}}}}
    spec:
      containers:
        - name: web
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command: [perl, /usr/local/lib/http-client.pl, web, "8080", /ok, /fail]
        - name: api
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command: [perl, /usr/local/lib/http-client.pl, api, "8081", /ok, /fail]
        - name: grpc
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command:
            - sh
            - -c
            - |
              echo '{plan}' >/tmp/plan
              while :; do /usr/local/bin/grpc-stack client /tmp/plan /tmp/out && cat /tmp/out; sleep 1; done
"#,
        web = http("web", 8080),
        api = http("api", 8081),
    )
}

/// The overlay a user writes over `deploy/`: the image's tag when given (named as `deploy/`
/// has already named it: an overlay's image transformer sees the base's output), the node's
/// paths (the test's node), no expedited
/// RCU (a sysctl of the whole machine), and no local rule (the ConfigMap's `status=500` would
/// mirror every pod's 500s: here only the cluster's rules count); `deploy/` named by a relative
/// path, as kustomize requires.
fn write_overlay(dir: &Path, c: &Cluster, bpffs: &Path, tag: Option<&str>) {
    let deploy = repo_root().join("deploy").canonicalize().expect("deploy/");
    let depth = dir.components().filter(|c| matches!(c, Component::Normal(_))).count();
    let relative = format!("{}{}", "../".repeat(depth), deploy.strip_prefix("/").unwrap().display());
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {relative}\n\
             patches:\n  - path: agent-overrides.yaml\n  - path: node-paths.yaml\n{images}",
            images = tag.map_or(String::new(), |t| format!(
                "images:\n  - name: localhost/mirror-agent\n    newTag: {t}\n"
            )),
        ),
    )
    .expect("writing the overlay");
    std::fs::write(
        dir.join("agent-overrides.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: mirror-agent, namespace: mirror}\ndata:\n  \
         overrides.yaml: |\n    attach:\n      expedite_rcu: false\n    rules: []\n",
    )
    .expect("writing the overlay");
    let host = |name: &str| c.host_dir(name).display().to_string();
    std::fs::write(
        dir.join("node-paths.yaml"),
        format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: mirror-agent, namespace: mirror}}\nspec:\n  \
             template:\n    spec:\n      volumes:\n        - name: bpffs\n          hostPath: {{path: {bpf}}}\n        \
             - name: state\n          hostPath: {{path: {state}}}\n        - name: run\n          hostPath: {{path: {run}}}\n        \
             - name: host-run\n          hostPath: {{path: {host_run}}}\n",
            bpf = bpffs.display(),
            state = host("state"),
            run = host("run"),
            host_run = c.run_dir().display(),
        ),
    )
    .expect("writing the overlay");
}

/// The client's record: `http PORT STATUS PATH` lines of one container, in order.
fn http_record(c: &Cluster, container: &str) -> Vec<(u16, u16)> {
    let logs = c.kubectl_ok(&["-n", "shop", "logs", "deploy/client", "-c", container]);
    logs.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            (f.next()? == "http").then_some(())?;
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_kubelet_runs_the_daemonset_and_its_agent_mirrors_one_services_failures() {
    if !require_root() || !containerd::available() || !control_plane::available() {
        return;
    }
    let t0 = Instant::now();
    let bins = Binaries::locate().expect("the agent's binaries (cargo build --release)");
    let go = go_toolchain().expect("a Go toolchain (scripts/install-deps.sh)");
    let grpc = build_grpc_go(&go);
    build_prebuilt(&bins, AGENT_IMAGE);
    build_apps_image(&grpc);
    let images = t0.elapsed();

    let kubelet_dirs_before =
        Path::new("/var/lib/kubelet").exists() || Path::new("/var/log/containers").exists();
    let pod_cgroups_before = pod_cgroups().iter().any(|p| p.exists());
    let mut c = Cluster::start();
    eprintln!("cluster up: {:?}", c.timings);
    for image in [AGENT_IMAGE, APPS_IMAGE] {
        c.import_image(image);
    }
    let dns = c.install_dns();

    // The workloads, by DNS name through ClusterIP Services.
    let t = Instant::now();
    c.apply(&workloads());
    for d in ["web", "api", "grpc", "client"] {
        c.rollout("shop", &format!("deploy/{d}"), Duration::from_secs(120));
    }
    let workloads_up = t.elapsed();
    let answered = wait_until(Duration::from_secs(60), || {
        let (w, a) = (http_record(&c, "web"), http_record(&c, "api"));
        w.iter().any(|r| r.1 == 500) && a.iter().any(|r| r.1 == 500)
    });
    let client_logs = |c: &Cluster| {
        ["web", "api", "grpc"]
            .map(|k| {
                let out = c.plane.kubectl(&["-n", "shop", "logs", "deploy/client", "-c", k, "--tail=5"]);
                format!(
                    "{k}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .join("\n")
    };
    let dbg = |args: &[&str]| {
        let out = c.plane.kubectl(args);
        format!("{args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    assert!(
        answered,
        "the client got no answers by name:\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        dbg(&["-n", "shop", "exec", "deploy/client", "-c", "web", "--", "getent", "hosts", "web"]),
        dbg(&["-n", "shop", "exec", "deploy/client", "-c", "web", "--", "cat", "/etc/resolv.conf"]),
        dbg(&["-n", "shop", "get", "endpointslices", "-o", "wide"]),
        dbg(&["-n", "shop", "exec", "deploy/client", "-c", "web", "--", "perl", "-MIO::Socket::INET", "-e", "my $c = IO::Socket::INET->new(PeerAddr => $ARGV[0], PeerPort => 8080, Timeout => 3); print $c ? \"ok\\n\" : \"fail $! $@\\n\"", "web"]),
        c.node_sh("nft list ruleset | head -80"),
        client_logs(&c),
        c.describe("shop"),
        c.describe("kube-system")
    );

    // Installed as a user installs it.
    let overlay = tempfile::Builder::new().prefix("mirror-overlay").tempdir().expect("a temp dir");
    write_overlay(overlay.path(), &c, &c.bpffs_dir(), None);
    let t = Instant::now();
    let applied = c.kubectl_ok(&["apply", "-k", &overlay.path().display().to_string()]);
    assert!(applied.contains("daemonset.apps/mirror-agent created"), "{applied}");
    c.rollout("mirror", "ds/mirror-agent", Duration::from_secs(180));
    let rollout = t.elapsed();
    let pod = c.kubectl_ok(&[
        "-n",
        "mirror",
        "get",
        "pod",
        "-l",
        "app.kubernetes.io/name=mirror-agent",
        "-o",
        "name",
    ]);
    let pod = pod.trim().to_string();
    let log = c.kubectl_ok(&["-n", "mirror", "logs", &pod]);
    assert!(
        log.contains("config /etc/mirror-agent/overrides.yaml over /etc/mirror-agent/agent.yaml"),
        "{log}"
    );
    // Probes: Ready (readiness passed) and never restarted (liveness); metrics through the
    // pod's address, as Prometheus scrapes it from the annotations.
    let status: Value =
        serde_json::from_str(&c.kubectl_ok(&["-n", "mirror", "get", &pod, "-o", "json"])).expect("JSON");
    assert_eq!(status["status"]["containerStatuses"][0]["restartCount"], 0, "{status}");
    let pod_ip = status["status"]["podIP"].as_str().expect("a pod IP").to_string();
    assert_eq!(pod_ip, c.node_ip().to_string());
    let metrics = c.node_sh(&format!("curl -sf http://{pod_ip}:9464/metrics"));
    assert!(metrics.contains("mirror_"), "{metrics}");

    // The clients go on answered with the agent attached (fail-open).
    let (w0, a0) = (http_record(&c, "web").len(), http_record(&c, "api").len());
    let going = wait_until(Duration::from_secs(60), || {
        http_record(&c, "web").len() > w0 + 4 && http_record(&c, "api").len() > a0 + 4
    });
    assert!(going, "the clients stopped with the agent attached:\n{}", client_logs(&c));

    // The capture of the mirror, then the rule.
    let pcap = tempfile::Builder::new().prefix("mirror-sink").tempdir().expect("a temp dir");
    let capture = Capture::start(&c.node.node, SINK_PEER, "", &pcap.path().join("sink.pcap"));
    c.apply(
        "apiVersion: mirror.ebpf.io/v1alpha1\nkind: MirrorRule\nmetadata: {name: web-500s, namespace: shop}\n\
         spec:\n  status: \"500\"\n  podSelector: {matchLabels: {app: web}}\n",
    );
    let active = wait_until(Duration::from_secs(30), || {
        let out = c.plane.kubectl(&[
            "-n",
            "shop",
            "get",
            "mirrorrule",
            "web-500s",
            "-o",
            "jsonpath={.status.nodes[0].state}/{.status.nodes[0].pods}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim() == "Active/1"
    });
    assert!(
        active,
        "{}\nthe agent's log:\n{}",
        c.kubectl_ok(&["-n", "shop", "get", "mirrorrule", "web-500s", "-o", "yaml"]),
        c.kubectl_ok(&["-n", "mirror", "logs", &pod])
    );
    // From here on, every web 500 is mirrored: the record's lines after this point count.
    let (web_from, api_from) = (http_record(&c, "web").len(), http_record(&c, "api").len());
    let more_500s = |c: &Cluster, what: &str, n: usize| {
        let from = http_record(c, "web").len();
        let enough = wait_until(Duration::from_secs(60), || {
            http_record(c, "web").iter().skip(from).filter(|r| r.1 == 500).count() >= n
        });
        assert!(enough, "the client stopped {what}: {}\n{}", client_logs(c), c.describe("shop"));
    };
    more_500s(&c, "before the upgrade", 5);

    // A rolling upgrade to a second tag, as a user upgrades: the overlay's image, applied.
    let sink_index = || c.node_sh("cat /sys/class/net/mirror0/ifindex").trim().to_string();
    let sink_before = sink_index();
    let agent_pods = |c: &Cluster| {
        c.kubectl_ok(&[
            "-n",
            "mirror",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=mirror-agent",
            "-o",
            "name",
        ])
        .lines()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let upgraded = format!("localhost/mirror-agent:{UPGRADE_TAG}");
    mirror_e2e::cluster::podman::run_ok(mirror_e2e::cluster::podman::podman().args([
        "tag",
        AGENT_IMAGE,
        &upgraded,
    ]));
    c.import_image(&upgraded);
    write_overlay(overlay.path(), &c, &c.bpffs_dir(), Some(UPGRADE_TAG));
    let upgrade_from = http_record(&c, "web").len() - web_from;
    let t = Instant::now();
    c.kubectl_ok(&["apply", "-k", &overlay.path().display().to_string()]);
    c.rollout("mirror", "ds/mirror-agent", Duration::from_secs(180));
    let old_log = {
        let out = c.plane.kubectl(&["-n", "mirror", "logs", &pod]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let replaced = wait_until(Duration::from_secs(60), || {
        let pods = agent_pods(&c);
        pods.len() == 1 && pods[0] != pod
    });
    let upgrade = t.elapsed();
    assert!(replaced, "the old agent's pod is left: {}", c.describe("mirror"));
    let upgrade_to = http_record(&c, "web").len() - web_from;
    let new_pod = agent_pods(&c).remove(0);
    let new_log = c.kubectl_ok(&["-n", "mirror", "logs", &new_pod]);
    assert!(new_log.contains("the running agent handed over: adopting its data path"), "{new_log}");
    let new_status: Value = serde_json::from_str(&c.kubectl_ok(&[
        "-n",
        "mirror",
        "exec",
        &new_pod,
        "--",
        "mirrorctl",
        "-o",
        "json",
        "status",
    ]))
    .expect("mirrorctl's JSON");
    assert_eq!(
        new_status["adopted"],
        true,
        "the new agent did not adopt the data path: {new_status}\nits log:\n{new_log}\nthe old agent's log:\n{old_log}\n\
         bpffs mounts: {}",
        c.node_sh(&format!("grep {} /proc/self/mountinfo || true", c.bpffs_dir().display()))
    );
    let spec: Value =
        serde_json::from_str(&c.kubectl_ok(&["-n", "mirror", "get", &new_pod, "-o", "json"])).expect("JSON");
    assert_eq!(spec["spec"]["containers"][0]["image"], upgraded.as_str());
    assert_eq!(spec["status"]["containerStatuses"][0]["restartCount"], 0, "{spec}");
    assert_eq!(sink_index(), sink_before, "the sink was removed and made anew during the upgrade");
    more_500s(&c, "after the upgrade", 5);

    // kube-proxy switched from nftables to iptables mode as an operator switches it (stopped,
    // `kube-proxy --cleanup`, started in the other mode): web's next connections go through
    // iptables' NAT, each 500 mirrored once. While no rules exist the ClusterIP answers nothing.
    let switch_from = http_record(&c, "web").len() - web_from;
    let t = Instant::now();
    assert_eq!(c.kube_proxy().mode(), ProxyMode::Nftables);
    c.kube_proxy().switch(ProxyMode::Iptables);
    let rules_now = |c: &mut Cluster| {
        let rules = c.kube_proxy().rules();
        let chains: u32 = rules.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
        (!rules.contains("kube-proxy") && chains > 0, rules)
    };
    let iptables = wait_until(Duration::from_secs(30), || rules_now(&mut c).0);
    let rules = rules_now(&mut c).1;
    assert!(iptables, "kube-proxy's iptables rules never came: {rules}\n{}", c.kube_proxy().output());
    let switched_at = http_record(&c, "web").len() - web_from;
    more_500s(&c, "after kube-proxy switched to iptables", 12);
    let switched = t.elapsed();

    let strict_until = http_record(&c, "web").len();

    // web's pod rescheduled: deleted, made again by its Deployment (a new veth, a new address).
    let web_pod = |c: &Cluster| -> (String, String) {
        let out = c.kubectl_ok(&[
            "-n",
            "shop",
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name} {.items[*].status.podIP}",
        ]);
        let mut f = out.split_whitespace().map(str::to_string);
        (f.next().unwrap_or_default(), f.next().unwrap_or_default())
    };
    let (old_web, old_ip) = web_pod(&c);
    let veths_before = c.node_sh("ip -o link show type veth | grep -o \"veth[0-9a-f]*@\" | sort");
    let t = Instant::now();
    c.kubectl_ok(&["-n", "shop", "delete", "pod", &old_web, "--grace-period=1", "--wait=true"]);
    c.rollout("shop", "deploy/web", Duration::from_secs(120));
    let (new_web, new_ip) = web_pod(&c);
    assert!(
        new_web != old_web && new_ip != old_ip && !new_ip.is_empty(),
        "{old_web} {old_ip} {new_web} {new_ip}"
    );
    let veths_after = c.node_sh("ip -o link show type veth | grep -o \"veth[0-9a-f]*@\" | sort");
    assert_ne!(veths_before, veths_after, "no new veth for the new pod");
    let rescheduled_from = http_record(&c, "web").len();
    let rescheduled = t.elapsed();
    more_500s(&c, "after web's pod was rescheduled", 5);

    let web: Vec<(u16, u16)> = http_record(&c, "web").into_iter().skip(web_from).collect();
    let last_500 = web.iter().rev().find(|r| r.1 == 500).map(|r| r.0).expect("a 500");
    // The last 500's copy reaching the sink ends the capture (no fixed wait).
    let file = capture.file().to_path_buf();
    let seen = wait_until(Duration::from_secs(10), || {
        mirror_e2e::capture::pcap::read(&file).packets.iter().any(|p| p.dst.port() == last_500)
    });
    let trace = capture.stop();
    assert!(seen, "web's last 500 (client port {last_500}) never reached the mirror");

    // Exactly once from the trigger on: each 500 response on the mirror once, by client port.
    // The client's containers share its pod's ports: a web flow is told by web's port 8080 as
    // well as by the client's port (api's connection may have the same client port).
    let side = |p: &mirror_e2e::capture::pcap::Packet, server: u16, port: u16| {
        (p.src.port() == server && p.dst.port() == port) || (p.dst.port() == server && p.src.port() == port)
    };
    let web_side = |p: &mirror_e2e::capture::pcap::Packet, port: u16| side(p, 8080, port);
    let responses_500 = |port: u16| {
        trace.packets.iter().filter(|p| web_side(p, port) && p.payload.starts_with(b"HTTP/1.1 500")).count()
    };
    let ports = |p: &mirror_e2e::capture::pcap::Packet| [p.src.port(), p.dst.port()];
    let mirrored: BTreeSet<u16> = trace.packets.iter().flat_map(ports).collect();
    let web_mirrored = |port: u16| trace.packets.iter().any(|p| web_side(p, port));
    // Strict through the upgrade; after the reschedule, from the new
    // pod's first mirrored 500 on (the agent names a new pod within seconds: until then its
    // rule does not select it), and never twice nor a 200 before that.
    let (strict_end, resched) = (strict_until - web_from, rescheduled_from - web_from);
    let followed_at = web
        .iter()
        .enumerate()
        .skip(resched)
        .find(|(_, (port, status))| *status == 500 && responses_500(*port) > 0)
        .map(|(i, _)| i);
    let followed_at =
        followed_at.unwrap_or_else(|| panic!("no 500 of web's new pod {new_web} on the mirror"));
    let mut wrong = BTreeMap::new();
    let (mut missed_at_reschedule, mut missed_at_switch) = (0, 0);
    for (i, (port, status)) in web.iter().enumerate() {
        let n = responses_500(*port);
        let mut expected = usize::from(*status == 500);
        if (strict_end..followed_at).contains(&i) && *status == 500 && n == 0 {
            missed_at_reschedule += 1;
            expected = 0;
        }
        if (switch_from..switched_at).contains(&i) && *status == 500 && n == 0 {
            missed_at_switch += 1;
            expected = 0;
        }
        if n != expected || (*status == 200 && web_mirrored(*port)) {
            wrong.insert(*port, (i, *status, n));
        }
    }
    assert!(
        wrong.is_empty(),
        "web's flows mirrored wrongly (port: (index, status, 500s on the mirror)): {wrong:?}; of {} answers: \
         the upgrade from {upgrade_from} to {upgrade_to}, strict until {strict_end}, web rescheduled \
         at {resched}, followed at {followed_at}, kube-proxy switched from {switch_from} to \
         {switched_at}\nthe new agent's log:\n{}",
        web.len(),
        c.kubectl_ok(&["-n", "mirror", "logs", &new_pod])
    );
    let after_followed = web[followed_at..].iter().filter(|r| r.1 == 500).count();
    assert!(after_followed >= 3, "too few of the new pod's 500s checked: {after_followed}");
    // api's flows (the same 500s, not selected) and the gRPC server's, never.
    let api: Vec<(u16, u16)> = http_record(&c, "api").into_iter().skip(api_from).collect();
    assert!(api.iter().any(|r| r.1 == 500));
    let leaked: Vec<&(u16, u16)> =
        api.iter().filter(|r| trace.packets.iter().any(|p| side(p, 8081, r.0))).collect();
    assert!(leaked.is_empty(), "api's flows on the mirror: {leaked:?}");
    assert!(!mirrored.contains(&8081) && !mirrored.contains(&50051), "unselected servers on the mirror");
    let after_switch = web[switched_at..strict_end].iter().filter(|r| r.1 == 500).count();
    assert!(after_switch >= 12, "too few 500s through iptables' NAT checked: {after_switch}");
    let web_500s = web.iter().filter(|r| r.1 == 500).count() - missed_at_reschedule - missed_at_switch;

    // The rule's status and the pod's Events, as a user reads them (the agent writes hits
    // and Events in batches: polled).
    let hits = || -> u64 {
        let out = c.plane.kubectl(&[
            "-n",
            "shop",
            "get",
            "mirrorrule",
            "web-500s",
            "-o",
            "jsonpath={.status.nodes[0].hits}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
    };
    let mirrored_events = || -> Value {
        let out = c.plane.kubectl(&[
            "-n",
            "shop",
            "get",
            "events",
            "--field-selector",
            "reason=Mirrored",
            "-o",
            "json",
        ]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    let on_web = |events: &Value| {
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["involvedObject"]["name"].as_str().is_some_and(|n| n.starts_with("web-")))
            .count()
    };
    let on_new_web = |events: &Value| {
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["involvedObject"]["name"].as_str() == Some(new_web.as_str()))
    };
    let counted = wait_until(Duration::from_secs(30), || {
        let events = mirrored_events();
        hits() >= web_500s as u64 && on_web(&events) >= 1 && on_new_web(&events)
    });
    let (hits, events) = (hits(), mirrored_events());
    assert!(counted, "hits {hits} (web's 500s since the rule: {web_500s}); Mirrored Events: {events}");
    let on_other: Vec<&Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !e["involvedObject"]["name"].as_str().is_some_and(|n| n.starts_with("web-")))
        .collect();
    assert!(on_other.is_empty(), "Mirrored Events on pods the rule does not select: {on_other:?}");

    // Uninstall: nothing of the agent's left on the node.
    let t = Instant::now();
    c.kubectl_ok(&["delete", "-k", &overlay.path().display().to_string(), "--wait=true", "--timeout=120s"]);
    let gone = wait_until(Duration::from_secs(60), || {
        !c.plane.kubectl(&["-n", "mirror", "get", "pods", "-o", "name"]).stdout.iter().any(|_| true)
    });
    assert!(gone, "{}", c.describe("mirror"));
    let uninstall = t.elapsed();
    let links = c.node_sh("ip -o link show");
    assert!(!links.contains("mirror0"), "the sink outlived the agent: {links}");
    let tcx = c.node_sh("for l in $(ls /sys/class/net); do bpftool net show dev $l 2>/dev/null; done");
    assert!(!tcx.contains("tcx") && !tcx.contains("mirror"), "programs left on the node: {tcx}");
    // A new bpffs holds the kernel's own iterators, `maps.debug` and `progs.debug`: nothing else.
    let pins: Vec<_> = std::fs::read_dir(c.bpffs_dir())
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !p.ends_with("maps.debug") && !p.ends_with("progs.debug"))
        .collect();
    assert!(pins.is_empty(), "pins left: {pins:?}");

    // A node whose /sys/fs/bpf is a private mount: the runtime refuses the init container
    // (Bidirectional), in the words docs/deployment.md quotes; the agent never starts.
    let private = c.host_dir("private-bpf");
    let p = private.display();
    mirror_bpf::testing::sh(&format!("mount --bind {p} {p} && mount --make-private {p}"));
    write_overlay(overlay.path(), &c, &private, None);
    c.kubectl_ok(&["apply", "-k", &overlay.path().display().to_string()]);
    let (mut said, mut status) = (String::new(), String::new());
    let refused = wait_until(Duration::from_secs(60), || {
        let out = |args: &[&str]| String::from_utf8_lossy(&c.plane.kubectl(args).stdout).trim().to_string();
        said = out(&["-n", "mirror", "get", "events", "-o", "jsonpath={.items[*].message}"]);
        status = out(&[
            "-n",
            "mirror",
            "get",
            "pods",
            "-o",
            "jsonpath={.items[*].status.initContainerStatuses[0].state.waiting.reason}",
        ]);
        said.contains(&format!("path \"{p}\" is mounted on \"{p}\" but it is not a shared mount"))
            && status == "CreateContainerError"
    });
    c.kubectl_ok(&["delete", "-k", &overlay.path().display().to_string(), "--wait=true", "--timeout=120s"]);
    mirror_bpf::testing::sh(&format!("umount {p}"));
    assert!(refused, "the private mount not refused as expected: pod {status}, events: {said}");

    eprintln!(
        "images {:.1} s; cluster {:.1} s (control plane {:.1} s, containerd {:.1} s, node Ready {:.1} s); CoreDNS {:.1} s; \
         agent rolled out {:.1} s; workloads {:.1} s; upgrade {:.1} s (0 of web's 500s missed); \
         web rescheduled in {:.1} s, {missed_at_reschedule} of its 500s before the agent followed it; \
         kube-proxy switched to iptables in {:.1} s, {missed_at_switch} of web's 500s missed meanwhile, \
         {after_switch} through iptables after; \
         web 500s mirrored {web_500s}, each once; hits {hits}; uninstall {:.1} s; \
         node components {} MiB; total {:.1} s",
        images.as_secs_f64(),
        c.timings.total.as_secs_f64(),
        c.timings.control_plane.as_secs_f64(),
        c.timings.containerd.as_secs_f64(),
        c.timings.node_ready.as_secs_f64(),
        dns.as_secs_f64(),
        rollout.as_secs_f64(),
        workloads_up.as_secs_f64(),
        upgrade.as_secs_f64(),
        rescheduled.as_secs_f64(),
        switched.as_secs_f64(),
        uninstall.as_secs_f64(),
        c.node_memory() >> 20,
        t0.elapsed().as_secs_f64()
    );

    // Torn down: nothing of the cluster left on the host.
    let (pids, dir, netns) = (c.pids(), c.dir().display().to_string(), c.node.node.name().to_string());
    let t = Instant::now();
    drop(c);
    eprintln!("cluster torn down in {:.1} s", t.elapsed().as_secs_f64());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let ours: Vec<&str> =
        mounts.lines().filter(|l| l.contains(&dir) || l.contains("mirror-containerd")).collect();
    assert!(ours.is_empty(), "mounts left: {ours:?}");
    assert!(!Path::new(&format!("/run/netns/{netns}")).exists(), "the node's namespace is left");
    let alive: Vec<u32> = pids.into_iter().filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
    assert!(alive.is_empty(), "processes left: {alive:?}");
    let host_rules =
        mirror_bpf::testing::sh("nft list tables; iptables-save 2>/dev/null | grep -c KUBE- || true");
    assert!(!host_rules.contains("kube-proxy"), "kube-proxy's rules on the host: {host_rules}");
    assert_eq!(host_rules.lines().last().map(str::trim), Some("0"), "KUBE- chains on the host: {host_rules}");
    if !kubelet_dirs_before {
        assert!(!Path::new("/var/lib/kubelet").exists() && !Path::new("/var/log/containers").exists());
    }
    if !pod_cgroups_before {
        let left: Vec<_> = pod_cgroups().into_iter().filter(|p| p.exists()).collect();
        assert!(left.is_empty(), "pods' cgroups left: {left:?}");
    }
}
