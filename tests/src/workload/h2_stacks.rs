//! HTTP/2 cleartext and gRPC stacks for the end-to-end tests, their sources in `tests/h2/`:
//!
//! - gRPC servers and clients of three implementations, each answering a call with the
//!   `grpc-status` its request asks for (`code=N`) and the client's port in its trailers
//!   (`x-peer-port`): grpc-go (a Go module built once per machine into the cache), grpcio
//!   (Debian's python3-grpcio, generic handlers, no generated code) and @grpc/grpc-js
//!   (installed once from the npm registry into the cache). Their clients run a [`GrpcPlan`]:
//!   channels (one connection each) of calls, and write what each call got.
//! - nginx serving h2c with prior knowledge (`listen ... http2`: `/fail` 500, `/ok` 200, the
//!   client's port in `x-peer-port`), and an h2c server on the h2 package (python3-h2) that also
//!   takes `Upgrade: h2c`.
//! - The clients of nghttp2 (`nghttp`, `h2load`) and curl (`--http2-prior-knowledge`, and
//!   `--http2`, which asks for the upgrade), each call's outcome read from their own output.
//!
//! What is built or installed once per machine is kept in the tests' cache
//! ([`crate::workload::cache`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{Netns, Pod};
use crate::workload::cache::{self, cache_dir, hash_files, CacheLock};
use crate::workload::servers::{self, find_program};

/// The sources: `tests/h2`.
pub fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("h2")
}

/// Runs `cmd`; panics with its output unless it succeeds.
#[track_caller]
pub(crate) fn run_ok(what: &str, cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The grpc-go server and client (`tests/h2/go`), built with the toolchain `go` into the cache
/// once (the first build compiles grpc, a minute or so of CPU); the binary.
pub fn build_grpc_go(go: &Path) -> PathBuf {
    cache::build_go(go, "grpc-go", &sources().join("go"))
}

/// npm: in PATH or /usr/bin/npm.
pub fn npm() -> Option<PathBuf> {
    find_program("npm", "/usr/bin/npm")
}

/// @grpc/grpc-js as `tests/h2/node/package-lock.json` pins it, installed into the cache once
/// (`npm ci`, no install scripts); the `node_modules` directory, for NODE_PATH.
pub fn install_grpc_js(npm: &Path) -> PathBuf {
    let src = sources().join("node");
    let files: Vec<PathBuf> = ["package.json", "package-lock.json"].iter().map(|f| src.join(f)).collect();
    let cache = cache_dir();
    let dir = cache.join(format!("grpc-js-{}", hash_files(&files)));
    let modules = dir.join("node_modules");
    let _lock = CacheLock::take(&cache, "h2");
    if modules.join("@grpc/grpc-js/package.json").is_file() {
        return modules;
    }
    let t = Instant::now();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the grpc-js dir");
    for f in &files {
        std::fs::copy(f, dir.join(f.file_name().unwrap())).expect("copying package.json");
    }
    run_ok(
        "npm ci (tests/h2/node)",
        Command::new(npm).current_dir(&dir).args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ]),
    );
    eprintln!("@grpc/grpc-js installed in {:.1} s: {}", t.elapsed().as_secs_f64(), modules.display());
    modules
}

/// A python3 that imports `module` (Debian's packages are /usr/bin/python3's).
pub fn python_with(module: &str) -> Option<PathBuf> {
    let candidates = [Some(PathBuf::from("/usr/bin/python3")), find_program("python3", "/usr/bin/python3")];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
    })
}

/// A server process in a namespace, stopped on drop.
pub struct Daemon {
    proc: Proc,
}

/// How long a server may take to listen.
const STARTUP: Duration = Duration::from_secs(15);

impl Daemon {
    /// Starts `cmd` (a command in `ns`) and waits until something listens on each of `ports`
    /// there; panics with its output and `log()` if it exits or takes too long.
    #[track_caller]
    pub fn start(
        what: &str,
        ns: &Netns,
        cmd: &mut Command,
        ports: &[u16],
        log: impl Fn() -> String,
    ) -> Daemon {
        let mut proc = Proc::spawn(&format!("{what} in {}", ns.name()), cmd);
        let mut exited = false;
        let listening = wait_until(STARTUP, || {
            exited = !proc.running();
            exited || ports.iter().all(|p| !ns.sh(&format!("ss -Hltn sport = :{p}")).trim().is_empty())
        });
        assert!(listening && !exited, "{what}: not listening on {ports:?}: {}{}", proc.output(), log());
        Daemon { proc }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.proc.stop(libc::SIGTERM, Duration::from_secs(2));
    }
}

/// A gRPC implementation with its server and client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grpc {
    /// grpc-go: the binary built by [`build_grpc_go`].
    Go(PathBuf),
    /// grpcio: a python3 that imports grpc.
    Python(PathBuf),
    /// @grpc/grpc-js: node, and the node_modules from [`install_grpc_js`].
    Node(PathBuf, PathBuf),
}

impl Grpc {
    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Grpc::Go(_) => "grpc-go",
            Grpc::Python(_) => "grpcio",
            Grpc::Node(..) => "grpc-js",
        }
    }

    fn command(&self, ns: &Netns) -> Command {
        match self {
            Grpc::Go(binary) => ns.command(&binary.to_string_lossy()),
            Grpc::Python(python) => {
                let mut cmd = ns.command(&python.to_string_lossy());
                cmd.arg(sources().join("python/grpc_stack.py"));
                cmd
            }
            Grpc::Node(node, modules) => {
                let mut cmd = ns.command(&node.to_string_lossy());
                cmd.env("NODE_PATH", modules).arg(sources().join("node/grpc_stack.js"));
                cmd
            }
        }
    }

    /// Its server on `port` of `ns` (every address, both families).
    pub fn server(&self, ns: &Netns, port: u16) -> Daemon {
        let mut cmd = self.command(ns);
        cmd.args(["server", &port.to_string()]);
        Daemon::start(&format!("{} server", self.name()), ns, &mut cmd, &[port], String::new)
    }

    /// Runs `plan` with its client from `ns` (files in `dir`): what each call got, by channel
    /// then call.
    #[track_caller]
    pub fn client(&self, ns: &Netns, plan: &GrpcPlan, dir: &Path) -> Vec<GrpcCall> {
        let plan_file = dir.join(format!("{}-plan.json", self.name()));
        let out_file = dir.join(format!("{}-calls.jsonl", self.name()));
        std::fs::write(&plan_file, plan.to_json().to_string()).expect("writing the plan");
        let mut cmd = self.command(ns);
        cmd.arg("client").arg(&plan_file).arg(&out_file);
        let mut proc = Proc::spawn(&format!("{} client", self.name()), &mut cmd);
        let status = proc.wait(Duration::from_secs(60));
        assert!(status.is_some_and(|s| s.success()), "{} client: {status:?}: {}", self.name(), proc.output());
        let text =
            std::fs::read_to_string(&out_file).unwrap_or_else(|e| panic!("{}: {e}", out_file.display()));
        let calls: Vec<GrpcCall> = text.lines().map(|l| GrpcCall::parse(l, plan)).collect();
        assert_eq!(calls.len(), plan.calls(), "{} client: {text}", self.name());
        calls
    }
}

/// One call of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCall {
    /// Its method's path, `/pkg.Service/Method`.
    pub method: String,
    /// The code its request asks the server for.
    pub code: u32,
}

/// One channel of a plan: a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// The server.
    pub target: SocketAddr,
    /// All calls at once (else one after another: call i on stream 2i + 1).
    pub burst: bool,
    /// Its calls.
    pub calls: Vec<PlannedCall>,
}

/// What a gRPC client does: its channels, all at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcPlan {
    /// The channels.
    pub channels: Vec<Channel>,
}

impl GrpcPlan {
    fn to_json(&self) -> Value {
        let channels: Vec<Value> = self
            .channels
            .iter()
            .map(|c| {
                let calls: Vec<Value> =
                    c.calls.iter().map(|k| json!({"method": k.method, "code": k.code})).collect();
                json!({"target": c.target.to_string(), "burst": c.burst, "calls": calls})
            })
            .collect();
        json!({ "channels": channels })
    }

    /// Calls in all.
    pub fn calls(&self) -> usize {
        self.channels.iter().map(|c| c.calls.len()).sum()
    }
}

/// What one gRPC call got, by its client's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcCall {
    /// Its channel (index in the plan).
    pub channel: usize,
    /// Its index in the channel.
    pub call: usize,
    /// Its method's path.
    pub method: String,
    /// The grpc-status received.
    pub code: u32,
    /// The client's port, as the server's trailers said (0: none came).
    pub port: u16,
}

impl GrpcCall {
    #[track_caller]
    fn parse(line: &str, plan: &GrpcPlan) -> GrpcCall {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("a call's record {line:?}: {e}"));
        let num = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {line}"));
        let call = GrpcCall {
            channel: num("channel") as usize,
            call: num("call") as usize,
            method: v["method"].as_str().unwrap_or_default().to_string(),
            code: num("code") as u32,
            port: num("port") as u16,
        };
        assert!(call.channel < plan.channels.len(), "{line}");
        call
    }
}

/// nginx serving h2c with prior knowledge on `ports` of `pod` (its two addresses): `/ok` 200,
/// `/fail` 500, `/big` 200 with a 256 KiB body (DATA frames across many segments), anything
/// else 404, each with the client's port in `x-peer-port`. Config, pid, logs under `dir`.
pub fn nginx_h2c(pod: &Pod, ports: &[u16], dir: &Path) -> Daemon {
    let dir = dir.join(format!("nginx-h2c-{}", pod.ns.name()));
    let d = dir.display();
    let listen: String = ports
        .iter()
        .map(|p| format!("listen {}:{p} http2;\n        listen [{}]:{p} http2;\n        ", pod.v4, pod.v6))
        .collect();
    let server = format!(
        r#"{listen}add_header x-peer-port $remote_port always;
        location = /ok {{ return 200 "ok\n"; }}
        location = /fail {{ return 500 "fail\n"; }}
        location = /big {{ alias {d}/big; }}
        location / {{ return 404 "none\n"; }}"#
    );
    let mut cmd = servers::nginx_command(
        &pod.ns,
        &dir,
        "keepalive_timeout 600s;\n    keepalive_requests 1000000;",
        &server,
    );
    std::fs::write(dir.join("big"), vec![b'x'; 256 << 10]).expect("writing the large body");
    let log = dir.join("error.log");
    Daemon::start("nginx (h2c)", &pod.ns, &mut cmd, ports, || {
        std::fs::read_to_string(&log).unwrap_or_default()
    })
}

/// The h2 package's server (`tests/h2/python/h2c_server.py`) on `port` of `ns`: HTTP/2 with
/// prior knowledge or after `Upgrade: h2c`; `/fail` 500, `/status/N` N, anything else 200,
/// each with `x-peer-port`.
pub fn h2c_upgrade_server(python: &Path, ns: &Netns, port: u16) -> Daemon {
    let mut cmd = ns.command(&python.to_string_lossy());
    cmd.arg(sources().join("python/h2c_server.py")).arg(port.to_string());
    Daemon::start("h2c server (python3-h2)", ns, &mut cmd, &[port], String::new)
}

/// What one request of an HTTP/2 client got, by the client's own output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Call {
    /// Its index among the client's requests.
    pub index: usize,
    /// Its path.
    pub path: String,
    /// The status received (0: none).
    pub status: u16,
    /// Its stream, when the client says.
    pub stream: Option<u32>,
    /// The client's port, when the client (or the server's `x-peer-port`) says.
    pub port: Option<u16>,
}

/// `http://ip:port/path`, with brackets for IPv6.
pub fn url(server: SocketAddr, path: &str) -> String {
    format!("http://{server}{path}")
}

/// curl fetching `paths` from `server` on one connection from `ns`: with prior knowledge, or
/// (`upgrade`) asking for h2c on the first request. Asserts that every answer came over
/// HTTP/2. (curl 7.88's prior knowledge fails any request after the first on a connection,
/// "Error in the HTTP2 framing layer", curl issue 10634: give it one path then.)
#[track_caller]
pub fn curl(ns: &Netns, server: SocketAddr, paths: &[&str], upgrade: bool) -> Vec<H2Call> {
    let mut cmd = ns.command("curl");
    cmd.args(["-sS", "-g", "--noproxy", "*", "--connect-timeout", "2", "--max-time", "10"]);
    cmd.arg(if upgrade { "--http2" } else { "--http2-prior-knowledge" });
    cmd.args(["-w", "%{local_port} %{http_code} %{http_version}\\n"]);
    for p in paths {
        cmd.args(["-o", "/dev/null", &url(server, p)]);
    }
    let out = run_ok("curl", &mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let calls: Vec<H2Call> = stdout
        .lines()
        .zip(paths)
        .enumerate()
        .map(|(index, (line, path))| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.get(2), Some(&"2"), "curl {path}: not HTTP/2: {stdout}");
            H2Call {
                index,
                path: path.to_string(),
                status: f[1].parse().unwrap_or(0),
                stream: None,
                port: f[0].parse().ok(),
            }
        })
        .collect();
    assert_eq!(calls.len(), paths.len(), "curl: {stdout}");
    calls
}

/// nghttp fetching `paths` from `server` on one connection (all requests at once), with prior
/// knowledge or (`upgrade`) after `Upgrade: h2c`; each request's stream, status and port (the
/// server's `x-peer-port`) from its verbose output. (nghttp fetches a URL given twice once:
/// each path gets a query of its own, `?n=i`.)
#[track_caller]
pub fn nghttp(ns: &Netns, server: SocketAddr, paths: &[&str], upgrade: bool) -> Vec<H2Call> {
    let mut cmd = ns.command("nghttp");
    cmd.args(["-v", "-n", "--timeout=10"]);
    if upgrade {
        cmd.arg("-u");
    }
    let targets: Vec<String> = paths.iter().enumerate().map(|(i, p)| format!("{p}?n={i}")).collect();
    cmd.args(targets.iter().map(|t| url(server, t)));
    let out = run_ok("nghttp", &mut cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    // Streams' paths (sent HEADERS, or the upgrade request for stream 1), statuses and ports.
    let mut path_of: BTreeMap<u32, String> = BTreeMap::new();
    let mut received: BTreeMap<u32, (u16, Option<u16>)> = BTreeMap::new();
    let mut sending: Option<u32> = None;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let stream_of = |l: &str| -> Option<u32> {
            l.split("stream_id=").nth(1)?.split([')', '>', ',']).next()?.parse().ok()
        };
        if line.ends_with("HTTP Upgrade request") {
            let request = lines.next().unwrap_or_default();
            path_of.insert(1, request.split(' ').nth(1).unwrap_or_default().to_string());
        } else if line.contains("] send HEADERS frame") {
            sending = stream_of(line);
        } else if line.contains("] ") {
            sending = None;
            if let (Some(s), Some(rest)) = (stream_of(line), line.split_once(") ").map(|(_, r)| r)) {
                if let Some(v) = rest.strip_prefix(":status: ") {
                    received.entry(s).or_default().0 = v.trim().parse().unwrap_or(0);
                } else if let Some(v) = rest.strip_prefix("x-peer-port: ") {
                    received.entry(s).or_default().1 = v.trim().parse().ok();
                }
            }
        } else if let (Some(s), Some(p)) = (sending, line.trim().strip_prefix(":path: ")) {
            path_of.insert(s, p.to_string());
        }
    }
    // Requests in the order given; each path's streams in order.
    let mut calls = Vec::new();
    let mut taken: Vec<u32> = Vec::new();
    for (index, (p, target)) in paths.iter().zip(&targets).enumerate() {
        let stream = path_of.iter().find(|(s, q)| *q == target && !taken.contains(s)).map(|(s, _)| *s);
        let stream = stream.unwrap_or_else(|| panic!("nghttp: no stream for {target}: {text}"));
        taken.push(stream);
        let (status, port) = received.get(&stream).copied().unwrap_or_default();
        calls.push(H2Call { index, path: p.to_string(), status, stream: Some(stream), port });
    }
    calls
}

/// h2load sending `requests` requests over one connection to `server`, `concurrent` at a time,
/// cycling through `paths`; each request's status from its log file (in the order they ended),
/// which names neither stream nor port (`dir` holds it).
#[track_caller]
pub fn h2load(
    ns: &Netns,
    server: SocketAddr,
    paths: &[&str],
    requests: usize,
    concurrent: usize,
    dir: &Path,
) -> Vec<H2Call> {
    let log = dir.join(format!("h2load-{}.log", server.port()));
    let mut cmd = ns.command("h2load");
    cmd.args(["-c", "1", "-n", &requests.to_string(), "-m", &concurrent.to_string(), "-T", "10"]);
    cmd.arg(format!("--log-file={}", log.display()));
    cmd.args(paths.iter().map(|p| url(server, p)));
    let out = run_ok("h2load", &mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}: {stdout}", log.display()));
    let calls: Vec<H2Call> = text
        .lines()
        .enumerate()
        .map(|(index, l)| H2Call {
            index,
            path: String::new(),
            status: l.split('\t').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0),
            stream: None,
            port: None,
        })
        .collect();
    assert_eq!(calls.len(), requests, "h2load: {stdout}");
    calls
}

/// The address of `pod` in the family asked for, with `port`.
pub fn at(pod: &Pod, v6: bool, port: u16) -> SocketAddr {
    SocketAddr::new(pod.addr(v6), port)
}
