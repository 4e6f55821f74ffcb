//! Real HTTP servers: nginx (`/foo` 200, `/bar` 500) on a pod's addresses, and python3's
//! http.server (`/ok` 200, `/fail` 500, `/status/N` N, `?bytes=M` for an M-byte body) on every
//! address of its namespace. Both keep connections alive and listen when started.

use std::path::Path;
use std::time::Duration;

use crate::netns::{Netns, Pod};
use crate::proc::{wait_until, Proc};

/// A server process, stopped on drop.
pub struct Server {
    proc: Proc,
}

/// How long a server may take to listen.
const STARTUP: Duration = Duration::from_secs(10);

impl Server {
    /// nginx on `port` of `pod`, with its config, pid, logs and temp paths under `dir`.
    pub fn nginx(pod: &Pod, port: u16, dir: &Path) -> Server {
        let dir = dir.join(format!("nginx-{}-{port}", pod.ns.name()));
        std::fs::create_dir_all(&dir).expect("creating the nginx dir");
        let d = dir.display();
        let conf = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen {v4}:{port};
        listen [{v6}]:{port};
        location /foo {{ return 200 "foo\n"; }}
        location /bar {{ return 500 "bar\n"; }}
    }}
}}
"#,
            v4 = pod.v4,
            v6 = pod.v6,
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("writing nginx.conf");
        let mut cmd = pod.ns.command("nginx");
        cmd.arg("-p").arg(&dir).arg("-c").arg(&conf_path).arg("-e").arg(dir.join("error.log"));
        let server = Server { proc: Proc::spawn(&format!("nginx in {}", pod.ns.name()), &mut cmd) };
        server.ready(&pod.ns, port, || std::fs::read_to_string(dir.join("error.log")).unwrap_or_default())
    }

    /// python3's http.server on `port` in `ns` (both families), its script written in `dir`.
    pub fn python(ns: &Netns, port: u16, dir: &Path) -> Server {
        let script = dir.join("http_server.py");
        std::fs::write(&script, PYTHON_SERVER).expect("writing the python server");
        let mut cmd = ns.command("python3");
        cmd.arg(&script).arg(port.to_string());
        let server = Server { proc: Proc::spawn(&format!("python http.server in {}", ns.name()), &mut cmd) };
        server.ready(ns, port, String::new)
    }

    /// Waits until something listens on `port` in `ns`; panics with the server's output and
    /// `log()` if it exits or takes too long.
    fn ready(mut self, ns: &Netns, port: u16, log: impl Fn() -> String) -> Server {
        let mut exited = false;
        let listening = wait_until(STARTUP, || {
            exited = !self.proc.running();
            exited || !ns.sh(&format!("ss -Hltn sport = :{port}")).trim().is_empty()
        });
        assert!(listening && !exited, "server on port {port} not listening: {}{}", self.proc.output(), log());
        self
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.proc.stop(libc::SIGTERM, Duration::from_secs(2));
    }
}

/// Dual-stack HTTP/1.1 (keep-alive) server; the status is chosen by the path, the body size
/// by `?bytes=N`, and a delay before answering by `?delay_ms=N`.
const PYTHON_SERVER: &str = r#"import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/ok":
            code = 200
        elif path == "/fail":
            code = 500
        elif path.startswith("/status/"):
            code = int(path[len("/status/"):])
        else:
            code = 404
        body = b"%d\n" % code
        if query.startswith("bytes="):
            body = b"x" * int(query[len("bytes="):])
        if query.startswith("delay_ms="):
            time.sleep(int(query[len("delay_ms="):]) / 1000)
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class DualStack(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


DualStack(("::", int(sys.argv[1])), Handler).serve_forever()
"#;
