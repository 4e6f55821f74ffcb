//! The workloads as users run them (Deployments behind ClusterIP Services, a client calling
//! them by name), the overlay a user writes over `deploy/`, and the client's own record.

use std::path::{Component, Path};
use std::time::{Duration, Instant};

use mirror_e2e::cluster::apps::APPS_IMAGE;
use mirror_e2e::cluster::podman::repo_root;
use mirror_e2e::cluster::single_node::Cluster;
use mirror_e2e::proc::wait_until;

/// The workloads: servers behind Services, the client calling them by name.
pub(crate) fn workloads() -> String {
    // A server's Deployment (`command` runs it on `port`) and its ClusterIP Service.
    let served = |name: &str, port: u16, command: &str| {
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
          command: [{command}, "{port}"]
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
    let http = |name: &str, port: u16| served(name, port, "perl, /usr/local/lib/http-server.pl");
    let plan = r#"{"channels":[{"target":"grpc:50051","calls":[{"method":"/shop.Cart/Get","code":13},{"method":"/shop.Cart/Get","code":0}]}]}"#;
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
{web}{api}{grpc}apiVersion: apps/v1
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
        grpc = served("grpc", 50051, "/usr/local/bin/grpc-stack, server"),
    )
}

/// The overlay a user writes over `deploy/`: the image's tag when given (named as `deploy/`
/// has already named it: an overlay's image transformer sees the base's output), the node's
/// paths (the test's node), no expedited
/// RCU (a sysctl of the whole machine), and no local rule (the ConfigMap's `status=500` would
/// mirror every pod's 500s: here only the cluster's rules count); `deploy/` named by a relative
/// path, as kustomize requires.
pub(crate) fn write_overlay(dir: &Path, c: &Cluster, bpffs: &Path, tag: Option<&str>) {
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
pub(crate) fn http_record(c: &Cluster, container: &str) -> Vec<(u16, u16)> {
    let logs = c.kubectl_ok(&["-n", "shop", "logs", "deploy/client", "-c", container]);
    logs.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            (f.next()? == "http").then_some(())?;
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

/// The client's last lines of each container, for failures.
pub(crate) fn client_logs(c: &Cluster) -> String {
    ["web", "api", "grpc"]
        .map(|k| {
            let out = c.plane.kubectl(&["-n", "shop", "logs", "deploy/client", "-c", k, "--tail=5"]);
            format!("{k}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        })
        .join("\n")
}

/// Waits for `n` more of web's 500s in the client's record (`what`: when, for a failure).
#[track_caller]
pub(crate) fn more_500s(c: &Cluster, what: &str, n: usize) {
    let from = http_record(c, "web").len();
    let enough = wait_until(Duration::from_secs(60), || {
        http_record(c, "web").iter().skip(from).filter(|r| r.1 == 500).count() >= n
    });
    assert!(enough, "the client stopped {what}: {}\n{}", client_logs(c), c.describe("shop"));
}

/// The workloads applied and rolled out, answered by name (web's and api's 500s among the
/// answers); returns the time they took.
pub(crate) fn start(c: &Cluster) -> Duration {
    let t = Instant::now();
    c.apply(&workloads());
    for d in ["web", "api", "grpc", "client"] {
        c.rollout("shop", &format!("deploy/{d}"), Duration::from_secs(120));
    }
    let workloads_up = t.elapsed();
    let answered = wait_until(Duration::from_secs(60), || {
        let (w, a) = (http_record(c, "web"), http_record(c, "api"));
        w.iter().any(|r| r.1 == 500) && a.iter().any(|r| r.1 == 500)
    });
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
        client_logs(c),
        c.describe("shop"),
        c.describe("kube-system")
    );
    workloads_up
}
