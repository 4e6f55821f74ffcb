//! A Kubernetes control plane for the end-to-end tests: etcd and kube-apiserver, built once per
//! machine by `tests/kube/build.sh` into the cache (see
//! [`crate::workload::cache::cache_dir`]), run in a network namespace of their own. No
//! controller-manager, scheduler nor kubelet: objects are stored, validated, admitted,
//! authorised and watched as in a cluster, never acted upon (a pod bound to a node by
//! `spec.nodeName` stays Pending; a DaemonSet makes no pods).
//!
//! Addresses, all from 198.19.250.0/24 and all inside namespaces made here:
//! - [`ADDRESS`] (198.19.250.1/32) on the control plane namespace's loopback: the API server's
//!   advertised address, which its self-signed serving certificate names, port [`PORT`];
//! - 198.19.250.2-127, /31 links: [`ControlPlane::connect`] joins a node namespace to the
//!   control plane by a veth pair (`node<k>` there, [`NODE_LINK`] in the node) and routes
//!   [`ADDRESS`] over it;
//! - 198.19.250.128/25: the Service range (API objects only; nothing routes it).
//!
//! etcd listens on the control plane namespace's 127.0.0.1 only. Its data, the certificates,
//! keys, kubeconfigs and the audit log are in a temp dir removed with the plane, so nothing a
//! test creates (namespaces included) needs deleting.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mirror_bpf::testing::in_ci;
use serde_json::{json, Value};

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{nsenter, Netns};
use crate::workload::cache::cache_dir;
use crate::workload::h2_stacks::run_ok;
use crate::workload::servers::find_program;

/// The API server's address: on the control plane namespace's loopback, routed to from the
/// node namespaces that [`ControlPlane::connect`] joins.
pub const ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 19, 250, 1);
/// The API server's (TLS) port.
pub const PORT: u16 = 6443;
/// The link to the control plane in a node namespace (not `veth*`: the agent leaves it alone).
pub const NODE_LINK: &str = "k8sapi";
/// The user of the admin kubeconfig (group `system:masters`).
pub const ADMIN: &str = "admin";
/// The Service range: 198.19.250.128/25 (the `kubernetes` Service takes .129).
pub const SERVICE_RANGE: &str = "198.19.250.128/25";
/// etcd's client URL, on the control plane namespace's loopback.
const ETCD: &str = "http://127.0.0.1:2379";
/// How long the API server may take to answer /readyz (about 3.5 s on an idle machine).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// A cold build (Kubernetes' packages, etcd, CoreDNS) takes about 15 minutes on 2 CPUs.
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// TokenRequest refuses shorter tokens.
const MIN_TOKEN: Duration = Duration::from_secs(600);

/// Whether this machine can run a control plane: curl and openssl on the PATH (kubectl is built
/// with the API server, of its version), and a
/// Go toolchain of 1.26 or newer (`go` or /usr/local/go/bin/go) to build it once. Without them
/// the test fails in CI and says that it did not run elsewhere.
#[track_caller]
pub fn available() -> bool {
    let mut missing: Vec<String> = ["curl", "openssl"]
        .iter()
        .filter(|t| find_program(t, &format!("/usr/bin/{t}")).is_none())
        .map(|t| t.to_string())
        .collect();
    // As build.sh looks for it: `go` on the PATH, else /usr/local/go's (a distribution's older
    // Go may come first on the PATH).
    let go_ok = [find_program("go", "/usr/local/go/bin/go"), Some(PathBuf::from("/usr/local/go/bin/go"))]
        .into_iter()
        .flatten()
        .any(|go| {
            let out = Command::new(&go).arg("version").output();
            let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            // "go version go1.26.8 linux/amd64"
            let minor = text
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.strip_prefix("go1.")?.split('.').next()?.parse().ok());
            minor.is_some_and(|m: u32| m >= 26)
        });
    if !go_ok {
        missing.push("Go 1.26 or newer (go or /usr/local/go/bin/go)".into());
    }
    if missing.is_empty() {
        return true;
    }
    let here = std::panic::Location::caller();
    assert!(!in_ci(), "{here}: a control plane needs {missing:?}, and CI=true forbids skipping");
    eprintln!("NOT RUN ({here}): a control plane needs {missing:?}");
    false
}

/// Holds an exclusive lock on a file of the cache until dropped.
struct FileLock(#[allow(dead_code)] File);

impl FileLock {
    fn take(path: &Path) -> FileLock {
        let f = File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        // SAFETY: flock on a file we hold open; released when it is closed.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0, "locking {}", path.display());
        FileLock(f)
    }
}

/// What `tests/kube/build.sh` builds, all in one directory.
pub const CLUSTER_BINARIES: [&str; 8] = [
    "kube-apiserver",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "etcd",
    "coredns",
];

/// The directory holding [`CLUSTER_BINARIES`]: built by `tests/kube/build.sh` once per
/// machine (one builder at a time across processes: a lock in the cache), once per process
/// asked.
pub fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cache = cache_dir();
        let _lock = FileLock::take(&cache.join("kube.lock"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kube/build.sh");
        let t = Instant::now();
        let mut proc =
            Proc::spawn("tests/kube/build.sh", Command::new("bash").arg(&script).env("MIRROR_E2E_CACHE", &cache));
        // Cached, the script answers at once; anything longer is the build.
        let building = !wait_until(Duration::from_secs(3), || !proc.running());
        if building {
            eprintln!(
                "building Kubernetes, etcd and CoreDNS (tests/kube/build.sh) into {}: once per machine, about 15 minutes",
                cache.display()
            );
        }
        let status = proc.wait(BUILD_TIMEOUT);
        let output = proc.output();
        assert!(status.is_some_and(|s| s.success()), "tests/kube/build.sh: {status:?}: {output}");
        // Its last line (stdout) names the directory; the build's messages go to stderr before it.
        let dir = PathBuf::from(output.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim());
        for b in CLUSTER_BINARIES {
            assert!(dir.join(b).is_file(), "tests/kube/build.sh: no {b} in {}: {output}", dir.display());
        }
        if building {
            eprintln!("Kubernetes, etcd and CoreDNS built in {:.0} s: {}", t.elapsed().as_secs_f64(), dir.display());
        }
        dir
    })
}

/// Resident memory of the control plane's processes, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// kube-apiserver's (0 while it is stopped).
    pub apiserver: u64,
    /// etcd's.
    pub etcd: u64,
}

/// etcd and kube-apiserver in a network namespace of their own; everything stopped and removed
/// on drop.
pub struct ControlPlane {
    apiserver: Option<Proc>,
    etcd: Proc,
    ns: Netns,
    dir: tempfile::TempDir,
    apiserver_args: Vec<String>,
    ca: String,
    admin_token: String,
    admin_kubeconfig: PathBuf,
    links: AtomicU32,
    kubeconfigs: AtomicU32,
    startup: Duration,
}

impl ControlPlane {
    /// Builds the binaries if needed ([`binaries`]), then starts etcd and the API server in a new
    /// namespace and waits until the API server is ready (`/readyz`: etcd reached, the RBAC
    /// bootstrap roles in place) and answers the admin through its CA.
    ///
    /// The API server's flags, and why:
    /// - `--token-auth-file`: the admin, a static token in group `system:masters`;
    /// - `--service-account-issuer`, `--service-account-key-file`,
    ///   `--service-account-signing-key-file` (an RSA key made here with openssl): TokenRequest
    ///   (`kubectl create token`), the tokens an agent's kubeconfig carries;
    /// - `--authorization-mode=RBAC`: the Node authorizer only concerns kubelets' credentials,
    ///   and none runs here (it would also keep a graph of pods and nodes for nothing);
    /// - `--advertise-address` [`ADDRESS`]: the self-signed serving certificate (in `--cert-dir`,
    ///   made at the first start, kept across restarts) names it, so kubeconfigs verify the
    ///   server with its CA;
    /// - `--endpoint-reconciler-type=none`: nothing to reconcile (no other API server, no
    ///   kube-proxy), and the lease reconciler's writes would only add traffic;
    /// - `--disable-admission-plugins=ServiceAccount`: that plugin refuses pods of namespaces
    ///   without a `default` ServiceAccount, which the controller-manager (absent) creates; the
    ///   token volume it adds would be mounted by a kubelet (absent). Pods are then admissible
    ///   in any namespace, made by [`ControlPlane::create_namespace`] or by plain YAML;
    /// - `--allow-privileged=true`: deploy/'s init container is privileged, which the API server
    ///   otherwise refuses even in a DaemonSet's template;
    /// - audit at `Metadata` level to a file, written as each request completes (blocking
    ///   mode): who did what, read by [`ControlPlane::audit_counts`];
    /// - `--profiling=false`; the watch cache stays on, as in a cluster (agents' watches are
    ///   served from it).
    pub fn start() -> ControlPlane {
        Self::start_with(false)
    }

    /// A control plane for a cluster with nodes ([`crate::cluster::single_node`]): as
    /// [`ControlPlane::start`], but with the ServiceAccount admission plugin (pods get their
    /// tokens: a controller-manager makes each namespace's `default` account), the endpoint
    /// reconciler (the `kubernetes` Service's endpoint is [`ADDRESS`], for in-cluster clients
    /// through kube-proxy) and the kubelets reached at their InternalIP (logs, exec).
    pub fn start_for_nodes() -> ControlPlane {
        Self::start_with(true)
    }

    fn start_with(nodes: bool) -> ControlPlane {
        let bin = binaries().to_path_buf();
        let ns = Netns::new("kcp");
        ns.sh(&format!("ip addr add {ADDRESS}/32 dev lo"));
        let dir = tempfile::Builder::new().prefix("mirror-e2e-kube").tempdir().expect("a temp dir");
        let d = dir.path();
        let path = |name: &str| d.join(name).to_string_lossy().into_owned();

        // The admin's token, random; the service-account signing key.
        let admin_token = random_hex(16);
        write_private(&d.join("tokens.csv"), &format!("{admin_token},{ADMIN},{ADMIN},\"system:masters\"\n"));
        run_ok("openssl genrsa", Command::new("openssl").args(["genrsa", "-out", &path("sa.key"), "2048"]));
        run_ok(
            "openssl rsa -pubout",
            Command::new("openssl").args(["rsa", "-in", &path("sa.key"), "-pubout", "-out", &path("sa.pub")]),
        );
        std::fs::write(
            d.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n",
        )
        .expect("writing the audit policy");

        let mut etcd = Proc::spawn(
            "etcd",
            nsenter(&ns.path(), bin.join("etcd")).args([
                "--name=e2e",
                &format!("--data-dir={}", path("etcd")),
                &format!("--listen-client-urls={ETCD}"),
                &format!("--advertise-client-urls={ETCD}"),
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=e2e=http://127.0.0.1:2380",
                // The data is thrown away with the plane: no need to wait for the disk.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ]),
        );
        let listening = wait_until(Duration::from_secs(30), || {
            !etcd.running() || !ns.sh("ss -Hltn sport = :2379").trim().is_empty()
        });
        assert!(listening && etcd.running(), "etcd did not listen: {}", etcd.output());

        let apiserver_args: Vec<String> = [
            format!("--etcd-servers={ETCD}"),
            // Every address of the plane's namespace (its loopback, ADDRESS, the links): only
            // the namespaces joined to it reach any of them.
            "--bind-address=0.0.0.0".into(),
            format!("--secure-port={PORT}"),
            format!("--advertise-address={ADDRESS}"),
            format!("--cert-dir={}", path("pki")),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--endpoint-reconciler-type=none".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--allow-privileged=true".into(),
            format!("--audit-policy-file={}", path("audit-policy.yaml")),
            format!("--audit-log-path={}", path("audit.log")),
            "--audit-log-mode=blocking".into(),
            // No rotation within a test's life (the default rotates at 100 MB).
            "--audit-log-maxsize=1024".into(),
            "--profiling=false".into(),
        ]
        .into();
        let apiserver_args: Vec<String> = if nodes {
            let none = ["--endpoint-reconciler-type=none", "--disable-admission-plugins=ServiceAccount"];
            let mut a: Vec<String> =
                apiserver_args.into_iter().filter(|a| !none.contains(&a.as_str())).collect();
            a.push("--kubelet-preferred-address-types=InternalIP".into());
            a
        } else {
            apiserver_args
        };

        let mut plane = ControlPlane {
            apiserver: None,
            etcd,
            admin_kubeconfig: d.join("admin.kubeconfig"),
            ns,
            dir,
            apiserver_args,
            ca: String::new(),
            admin_token,
            links: AtomicU32::new(0),
            kubeconfigs: AtomicU32::new(0),
            startup: Duration::ZERO,
        };
        plane.start_apiserver();
        plane
    }

    /// Starts the API server (again, after [`ControlPlane::stop_apiserver`]: the same etcd,
    /// address, certificates and keys, so kubeconfigs and tokens stay valid) and waits until it
    /// is ready.
    #[track_caller]
    pub fn start_apiserver(&mut self) {
        assert!(self.apiserver.is_none(), "the API server is running");
        let t = Instant::now();
        let mut cmd = nsenter(&self.ns.path(), binaries().join("kube-apiserver"));
        cmd.args(&self.apiserver_args);
        let mut proc = Proc::spawn("kube-apiserver", &mut cmd);
        let readyz = format!("https://{ADDRESS}:{PORT}/readyz");
        let auth = format!("Authorization: Bearer {}", self.admin_token);
        // A probe only, before the certificate can be read whole: -k.
        let ready = wait_until(READY_TIMEOUT, || {
            if !proc.running() {
                return true;
            }
            let out =
                nsenter(&self.ns.path(), "curl").args(["-sk", "-m", "2", "-H", &auth, &readyz]).output();
            out.is_ok_and(|o| o.stdout == b"ok")
        });
        assert!(ready && proc.running(), "kube-apiserver not ready in {READY_TIMEOUT:?}: {}", proc.output());
        self.startup = t.elapsed();
        self.apiserver = Some(proc);
        if self.ca.is_empty() {
            self.ca = read_ca(&self.dir.path().join("pki/apiserver.crt"));
            std::fs::write(self.ca_path(), &self.ca).expect("writing the CA");
            write_kubeconfig(&self.admin_kubeconfig, &self.ca_path(), &self.admin_token, ADMIN);
        }
        // Through the CA, as every client: the certificate names the address.
        self.kubectl_ok(&["get", "--raw", "/readyz"]);
    }

    /// Stops the API server (SIGTERM, as a node's shutdown would; killed after 3 s: it would
    /// wait for its watches to drain), etcd and everything stored kept.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.stop(libc::SIGTERM, Duration::from_secs(3));
        }
    }

    /// Whether the API server runs.
    pub fn apiserver_running(&mut self) -> bool {
        self.apiserver.as_mut().is_some_and(Proc::running)
    }

    /// How long the API server last took from its start to ready.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// The control plane's network namespace.
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// `https://198.19.250.1:6443`.
    pub fn server(&self) -> String {
        format!("https://{ADDRESS}:{PORT}")
    }

    /// The CA of the API server's serving certificate (PEM), written by it under `--cert-dir`.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The CA as a file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The admin's kubeconfig (user [`ADMIN`], group `system:masters`, a static token).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The temp dir holding etcd's data, certificates, keys, kubeconfigs and the audit log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Joins `node` to the control plane by a veth pair and routes [`ADDRESS`] through it: the
    /// pair's /31 takes 198.19.250.2k (control plane side, `node<k>`) and .2k+1 (the node's
    /// [`NODE_LINK`]), k from 1 to 63. Returns the node's address on the link. Once per node.
    #[track_caller]
    pub fn connect(&self, node: &Netns) -> Ipv4Addr {
        let k = self.links.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(k <= 63, "198.19.250.0/25 holds 63 links");
        let ours = Ipv4Addr::new(198, 19, 250, 2 * k as u8);
        let theirs = Ipv4Addr::new(198, 19, 250, 2 * k as u8 + 1);
        let link = format!("node{k}");
        // No IPv6 on the link: nothing but the API server's traffic crosses it.
        self.ns.sh(&format!(
            "ip link add {link} type veth peer name {NODE_LINK} netns {node} \
             && sysctl -qw net.ipv6.conf.{link}.disable_ipv6=1 \
             && ip addr add {ours}/31 dev {link} && ip link set {link} up",
            node = node.name()
        ));
        node.sh(&format!(
            "sysctl -qw net.ipv6.conf.{NODE_LINK}.disable_ipv6=1 \
             && ip addr add {theirs}/31 dev {NODE_LINK} && ip link set {NODE_LINK} up \
             && ip route add {ADDRESS}/32 via {ours} dev {NODE_LINK}"
        ));
        theirs
    }

    /// kubectl with `kubeconfig`, run in the namespace at `netns_path` (the control plane's, or
    /// a node's that [`ControlPlane::connect`] joined), its discovery cache in the plane's dir.
    /// No request timeout (for watches): add `--request-timeout` where a bound is wanted.
    pub fn kubectl_command(&self, netns_path: &str, kubeconfig: &Path) -> Command {
        let mut c = nsenter(netns_path, binaries().join("kubectl"));
        c.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.dir.path().join("kubectl-cache").display()))
            .env_remove("KUBECONFIG");
        c
    }

    /// Runs kubectl as the admin in the control plane's namespace (30 s request timeout).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_from(&self.ns, &self.admin_kubeconfig, args)
    }

    /// Runs kubectl with `kubeconfig` from namespace `ns` (30 s request timeout).
    pub fn kubectl_from(&self, ns: &Netns, kubeconfig: &Path, args: &[&str]) -> Output {
        self.kubectl_command(&ns.path(), kubeconfig)
            .arg("--request-timeout=30s")
            .args(args)
            .output()
            .expect("running kubectl")
    }

    /// Like [`ControlPlane::kubectl`]; panics with its output unless it succeeds; its stdout.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` as the admin with `yaml` (or JSON) on stdin; panics unless it
    /// succeeds; kubectl's stdout.
    #[track_caller]
    pub fn apply_yaml(&self, yaml: &str) -> String {
        let mut child = self
            .kubectl_command(&self.ns.path(), &self.admin_kubeconfig)
            .args(["--request-timeout=30s", "apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl apply");
        child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("writing to kubectl");
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply: {}{}\n{yaml}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A Namespace with `labels`.
    #[track_caller]
    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        self.apply_yaml(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": map(labels)}})
                .to_string(),
        );
    }

    /// A Node object with `labels` (no kubelet behind it: no status, no lease).
    #[track_caller]
    pub fn create_node(&self, name: &str, labels: &[(&str, &str)]) {
        self.apply_yaml(
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": map(labels)}})
                .to_string(),
        );
    }

    /// A Pod with `labels` in namespace `ns`, bound to `node` by `spec.nodeName`. It stays
    /// Pending (no kubelet; its image is never pulled).
    #[track_caller]
    pub fn create_pod(&self, ns: &str, name: &str, labels: &[(&str, &str)], node: &str) {
        self.apply_yaml(
            &json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": map(labels)},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
                },
            })
            .to_string(),
        );
    }

    /// Waits until every CustomResourceDefinition is Established and its resources can be
    /// listed: for a second or so after that condition, lists and watches of a new resource
    /// may answer 429 (its storage is still starting).
    #[track_caller]
    pub fn wait_crds_established(&self) {
        let names = self.kubectl_ok(&[
            "get",
            "crd",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.names.plural}.{.spec.group}{"\n"}{end}"#,
        ]);
        let names: Vec<&str> = names.lines().filter(|l| !l.is_empty()).collect();
        if names.is_empty() {
            return;
        }
        self.kubectl_ok(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
        for name in names {
            let mut last = None;
            let listed = wait_until(Duration::from_secs(30), || {
                let out = self.kubectl(&["get", name, "--all-namespaces", "-o", "name"]);
                let ok = out.status.success();
                last = Some(out);
                ok
            });
            assert!(listed, "{name} cannot be listed: {last:?}");
        }
    }

    /// A kubeconfig (server [`ADDRESS`], the CA) with a token from TokenRequest for service
    /// account `name` of namespace `ns`, valid `duration` (10 minutes at least). The service
    /// account must exist.
    #[track_caller]
    pub fn kubeconfig_for_service_account(&self, ns: &str, name: &str, duration: Duration) -> PathBuf {
        assert!(duration >= MIN_TOKEN, "TokenRequest issues tokens of 10 minutes or more");
        let token = self.kubectl_ok(&[
            "create",
            "token",
            name,
            "-n",
            ns,
            &format!("--duration={}s", duration.as_secs()),
        ]);
        let n = self.kubeconfigs.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.path().join(format!("sa-{ns}-{name}-{n}.kubeconfig"));
        write_kubeconfig(&path, &self.ca_path(), token.trim(), &format!("system:serviceaccount:{ns}:{name}"));
        path
    }

    /// The audit log (JSON lines, Metadata level).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// Requests made as `user` (`admin`, `system:serviceaccount:NS:NAME`; the impersonated user
    /// when a request impersonates one), by (verb, resource), from the audit log: each request
    /// once (by its audit ID), a watch from its start. A resource is named as kubectl names it:
    /// `pods`, `events.events.k8s.io`, `mirrorrules.mirror.ebpf.io/status`; a request that is
    /// not on a resource by its path (`/metrics`). The log is written as each request
    /// completes, a moment after its client had the answer: poll for an expected count. It
    /// spans the plane's life, API server restarts included.
    pub fn audit_counts(&self, user: &str) -> BTreeMap<(String, String), u64> {
        let text = std::fs::read_to_string(self.audit_log()).unwrap_or_default();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        // The last line may be incomplete while being written: lines that do not parse are skipped.
        for v in text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
            let who = v["impersonatedUser"]["username"].as_str().or(v["user"]["username"].as_str());
            let id = v["auditID"].as_str().unwrap_or_default();
            if who != Some(user) || !seen.insert(id.to_string()) {
                continue;
            }
            let o = &v["objectRef"];
            let resource = match o["resource"].as_str() {
                Some(r) => resource_name(
                    r,
                    o["apiGroup"].as_str().unwrap_or(""),
                    o["subresource"].as_str().unwrap_or(""),
                ),
                None => v["requestURI"]
                    .as_str()
                    .unwrap_or_default()
                    .split('?')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            };
            *counts.entry((v["verb"].as_str().unwrap_or_default().to_string(), resource)).or_default() += 1;
        }
        counts
    }

    /// `apiserver_request_total` from the API server's /metrics, summed over response codes and
    /// scopes, by (verb, resource) with the metric's verbs (`LIST`, `WATCH`, `GET`, `POST`,
    /// `PATCH`, `APPLY`...) and resources named as in [`ControlPlane::audit_counts`]. Counts
    /// since the API server's last start, every user's together; a request counts when it
    /// completes (a watch when it ends, unlike the audit log).
    pub fn request_totals(&self) -> BTreeMap<(String, String), u64> {
        let text = self.kubectl_ok(&["get", "--raw", "/metrics"]);
        let mut totals: BTreeMap<(String, String), u64> = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else { continue };
            let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
            let labels = parse_labels(labels);
            let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or("");
            let resource = if get("resource").is_empty() {
                String::new()
            } else {
                resource_name(get("resource"), get("group"), get("subresource"))
            };
            let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            *totals.entry((get("verb").to_string(), resource)).or_default() += n;
        }
        totals
    }

    /// Resident memory of the API server and etcd.
    pub fn memory(&mut self) -> Memory {
        let apiserver = self.apiserver.as_mut().map_or(0, |p| if p.running() { rss(p.pid()) } else { 0 });
        Memory { apiserver, etcd: rss(self.etcd.pid()) }
    }

    /// CPU time (user and system) the running API server and etcd have used since they started.
    pub fn cpu_time(&mut self) -> Duration {
        let apiserver = self.apiserver.as_mut().map_or(Duration::ZERO, |p| {
            if p.running() {
                cpu(p.pid())
            } else {
                Duration::ZERO
            }
        });
        apiserver + cpu(self.etcd.pid())
    }
}

/// CPU time of process `pid` (utime + stime of /proc/PID/stat, in clock ticks of 1/100 s).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may hold spaces, closed by the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The API server first (it would retry etcd), then etcd; the namespace and the temp dir
        // go with the fields.
        if let Some(mut p) = self.apiserver.take() {
            p.stop(libc::SIGTERM, Duration::from_secs(5));
        }
        self.etcd.stop(libc::SIGTERM, Duration::from_secs(5));
    }
}

/// `resource[.group][/subresource]`, as kubectl names a resource.
fn resource_name(resource: &str, group: &str, subresource: &str) -> String {
    let mut s = resource.to_string();
    if !group.is_empty() {
        s = format!("{s}.{group}");
    }
    if !subresource.is_empty() {
        s = format!("{s}/{subresource}");
    }
    s
}

/// The labels of a Prometheus sample: `k="v",k2="v2"` (values with `\"` and `\\` escapes).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| if c == 'n' { '\n' } else { c })),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

/// Resident memory of process `pid` in bytes (0 if it is gone).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().strip_suffix(" kB"));
    kb.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// Labels as a JSON object.
fn map(labels: &[(&str, &str)]) -> Value {
    Value::Object(labels.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect())
}

/// `bytes` random bytes from the kernel, in hex.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::io::Read::read_exact(&mut File::open("/dev/urandom").expect("/dev/urandom"), &mut buf)
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a file only its owner reads (credentials).
fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

/// The CA of the API server's self-signed serving certificate: the file holds the serving
/// certificate, then the CA that signed it (the last PEM block).
#[track_caller]
fn read_ca(cert: &Path) -> String {
    let text = std::fs::read_to_string(cert).unwrap_or_else(|e| panic!("reading {}: {e}", cert.display()));
    let begin = "-----BEGIN CERTIFICATE-----";
    let last = text.rfind(begin).unwrap_or_else(|| panic!("no certificate in {}", cert.display()));
    let ca = text[last..].trim_end().to_string() + "\n";
    assert!(ca.contains("-----END CERTIFICATE-----"), "{}: {text}", cert.display());
    ca
}

/// A kubeconfig for [`ADDRESS`] with the CA's file and a bearer token; owner-only.
fn write_kubeconfig(path: &Path, ca: &Path, token: &str, user: &str) {
    let server = format!("https://{ADDRESS}:{PORT}");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: e2e\n    cluster:\n      server: {server}\n      \
         certificate-authority: {ca}\nusers:\n  - name: \"{user}\"\n    user:\n      token: {token}\n\
         contexts:\n  - name: e2e\n    context:\n      cluster: e2e\n      user: \"{user}\"\n\
         current-context: e2e\n",
        ca = ca.display()
    );
    write_private(path, &text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_labels_are_read_with_their_escapes() {
        let l = parse_labels(r#"code="200",group="",resource="pods",subresource="",verb="LIST",x="a\"b,c""#);
        assert_eq!(l["verb"], "LIST");
        assert_eq!(l["resource"], "pods");
        assert_eq!(l["group"], "");
        assert_eq!(l["x"], "a\"b,c");
        assert_eq!(
            resource_name("mirrorrules", "mirror.ebpf.io", "status"),
            "mirrorrules.mirror.ebpf.io/status"
        );
        assert_eq!(resource_name("pods", "", ""), "pods");
    }
}
