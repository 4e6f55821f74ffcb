//! Real HTTP servers: nginx (`/foo` and `/ok` 200, `/bar` and `/fail` 500) on a pod's
//! addresses, python3's http.server (`/ok` 200, `/fail` 500, `/status/N` N, `?bytes=M` for an
//! M-byte body), a raw server writing scripted byte layouts ([`RAW_SERVER`]) and an asyncio
//! server for many connections at once that delays and resets on request ([`ASYNC_SERVER`]) on
//! every address of their namespace, and one that never answers ([`SILENT_SERVER`]). All keep
//! connections alive and listen when started.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{Netns, Pod};

/// A server process, stopped on drop.
pub struct Server {
    proc: Proc,
}

/// How long a server may take to listen.
const STARTUP: Duration = Duration::from_secs(10);

/// nginx in `ns` with one worker and no access log, its configuration, pid, logs and temp
/// paths under `dir` (created): `http` added to its http block, `server` the body of its one
/// server block. The command that runs it in the foreground.
pub fn nginx_command(ns: &Netns, dir: &Path, http: &str, server: &str) -> Command {
    std::fs::create_dir_all(dir).expect("creating the nginx dir");
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
    {http}
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        {server}
    }}
}}
"#
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("writing nginx.conf");
    let mut cmd = ns.command("nginx");
    cmd.arg("-p").arg(dir).arg("-c").arg(&conf_path).arg("-e").arg(dir.join("error.log"));
    cmd
}

impl Server {
    /// nginx on `port` of `pod`, with its config, pid, logs and temp paths under `dir`.
    pub fn nginx(pod: &Pod, port: u16, dir: &Path) -> Server {
        Self::nginx_with(pod, port, dir, "")
    }

    /// Like [`Server::nginx`], keeping a connection open for as many requests as it is sent
    /// (nginx closes one after 1,000 by default): a load that must stay on its connections.
    pub fn nginx_long_lived(pod: &Pod, port: u16, dir: &Path) -> Server {
        Self::nginx_with(pod, port, dir, "keepalive_requests 100000000;\n    keepalive_timeout 600s;")
    }

    fn nginx_with(pod: &Pod, port: u16, dir: &Path, http: &str) -> Server {
        let dir = dir.join(format!("nginx-{}-{port}", pod.ns.name()));
        let server = format!(
            r#"listen {v4}:{port};
        listen [{v6}]:{port};
        location /foo {{ return 200 "foo\n"; }}
        location /bar {{ return 500 "bar\n"; }}
        location = /ok {{ return 200 "ok\n"; }}
        location = /fail {{ return 500 "fail\n"; }}"#,
            v4 = pod.v4,
            v6 = pod.v6,
        );
        let mut cmd = nginx_command(&pod.ns, &dir, http, &server);
        let server = Server { proc: Proc::spawn(&format!("nginx in {}", pod.ns.name()), &mut cmd) };
        server.ready(&pod.ns, port, || std::fs::read_to_string(dir.join("error.log")).unwrap_or_default())
    }

    /// python3's http.server on `port` in `ns` (both families), its script written in `dir`.
    pub fn python(ns: &Netns, port: u16, dir: &Path) -> Server {
        Self::python_script(ns, port, dir.join("http_server.py"), PYTHON_SERVER, "python http.server")
    }

    /// The raw HTTP server ([`RAW_SERVER`]) on `port` in `ns` (both families), its script
    /// written in `dir`.
    pub fn raw(ns: &Netns, port: u16, dir: &Path) -> Server {
        Self::python_script(ns, port, dir.join("raw_http_server.py"), RAW_SERVER, "raw http server")
    }

    /// The asyncio server ([`ASYNC_SERVER`]) on `port` in `ns` (both families), its script
    /// written in `dir`.
    pub fn asyncio(ns: &Netns, port: u16, dir: &Path) -> Server {
        Self::python_script(ns, port, dir.join("async_http_server.py"), ASYNC_SERVER, "asyncio http server")
    }

    /// A server that never answers ([`SILENT_SERVER`]) on `port` in `ns` (both families), its
    /// script written in `dir`.
    pub fn silent(ns: &Netns, port: u16, dir: &Path) -> Server {
        Self::python_script(ns, port, dir.join("silent_server.py"), SILENT_SERVER, "silent server")
    }

    /// python3 running `script`, written to `path`, with the port as its argument, in `ns`.
    fn python_script(ns: &Netns, port: u16, path: PathBuf, script: &str, what: &str) -> Server {
        std::fs::write(&path, script).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let mut cmd = ns.command("python3");
        cmd.arg(&path).arg(port.to_string());
        let server = Server { proc: Proc::spawn(&format!("{what} in {}", ns.name()), &mut cmd) };
        server.ready(ns, port, String::new)
    }

    /// The Go server built by [`build_go_server`] on `port` in `ns` (both families).
    pub fn go(ns: &Netns, port: u16, binary: &Path) -> Server {
        let mut cmd = ns.command(&binary.to_string_lossy());
        cmd.arg(port.to_string());
        let server = Server { proc: Proc::spawn(&format!("go net/http in {}", ns.name()), &mut cmd) };
        server.ready(ns, port, String::new)
    }

    /// Node's http module on `port` in `ns` (both families): `/fail` 500, anything else 200.
    pub fn node(ns: &Netns, port: u16, node: &Path) -> Server {
        let mut cmd = ns.command(&node.to_string_lossy());
        cmd.args(["-e", NODE_SERVER, &port.to_string()]);
        let server = Server { proc: Proc::spawn(&format!("node http in {}", ns.name()), &mut cmd) };
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

/// `program` in PATH, else at `fallback`, if it is there.
pub fn find_program(program: &str, fallback: &str) -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()));
    in_path.or_else(|| Some(PathBuf::from(fallback)).filter(|p| p.is_file()))
}

/// The Go toolchain: `go` in PATH or /usr/local/go/bin/go.
pub fn go_toolchain() -> Option<PathBuf> {
    find_program("go", "/usr/local/go/bin/go")
}

/// Node.js: `node` in PATH or /usr/bin/node.
pub fn node_runtime() -> Option<PathBuf> {
    find_program("node", "/usr/bin/node")
}

/// Builds the Go net/http server (`/fail` 500, anything else 200; the port as its argument)
/// into `dir` with the toolchain `go`, offline; returns the binary. The first build on a
/// machine compiles net/http into Go's build cache (about 45 s of CPU); later ones take
/// under a second.
pub fn build_go_server(go: &Path, dir: &Path) -> PathBuf {
    let src = dir.join("go-server");
    std::fs::create_dir_all(&src).expect("creating the go server dir");
    std::fs::write(src.join("main.go"), GO_SERVER).expect("writing the go server");
    let binary = src.join("server");
    let out = Command::new(go)
        .current_dir(&src)
        .args(["build", "-o"])
        .arg(&binary)
        .arg("main.go")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", go.display()));
    assert!(
        out.status.success(),
        "go build: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    binary
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
    request_queue_size = 128

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


DualStack(("::", int(sys.argv[1])), Handler).serve_forever()
"#;

/// A raw HTTP/1.1 server writing exact byte layouts: TCP_NODELAY, and each response written as
/// scripted by the request's path. The responses to all the requests read at once (pipelined)
/// go out in ONE write, so that later status lines begin mid-segment; `PAUSE` in a script
/// ends the write and sleeps 50 ms, so that what follows begins a new segment.
///
/// - `/a`, `/c`, `/ok`: 200 with a 5-byte body; `/b`, `/fail`: 500 with a 6-byte body (HEAD:
///   the same heads, no body)
/// - `/continue`, `/early-hints`: `100 Continue` or `103 Early Hints`, then a 500, one write
/// - `/split`: `HTTP/1.1 5`, pause, `00 Internal Server Error...`
/// - `/body-text`: a 200 whose body holds `HTTP/1.1 500 Internal Server Error` mid-segment
/// - `/body-segment`: a 200 whose body goes on, after a pause, with a segment that begins with
///   `HTTP/1.1 500 Internal Server Error`
/// - `/chunked-ok`, `/chunked-fail`: chunked 200 (extension, trailer) and 500
/// - `/chunked-body-text`, `/chunked-body-segment`: chunked 200 whose chunk data holds the
///   status text mid-segment, or begins a segment with it
/// - `/http10`: an HTTP/1.0 500 without a length, then the close
/// - `/http10-body-segment`: an HTTP/1.0 200 without a length whose body goes on, after a
///   pause, with a segment that begins with the status text; then the close
pub const RAW_SERVER: &str = r#"import socket
import sys
import threading
import time

PAUSE = None
ERROR_BODY = b"error\n"
STATUS_TEXT = b"HTTP/1.1 500 Internal Server Error\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n\r\n"


def head(status, length):
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, length)


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


ERROR = head(b"500 Internal Server Error", len(ERROR_BODY)) + ERROR_BODY

# Path -> (status, body): HEAD gets the head alone.
SIMPLE = {
    "/a": (b"200 OK", b"hello"),
    "/c": (b"200 OK", b"hello"),
    "/ok": (b"200 OK", b"hello"),
    "/b": (b"500 Internal Server Error", ERROR_BODY),
    "/fail": (b"500 Internal Server Error", ERROR_BODY),
}

BODY_START = b"the next segment begins with a status line:\n"
SEGMENT = STATUS_TEXT + b"Content-Length: 0\r\n\r\n"
TEXT_BODY = b"the log says: " + STATUS_TEXT + b"and more.\n"

# Path -> parts of the response, PAUSE between writes.
SCRIPTED = {
    "/continue": [b"HTTP/1.1 100 Continue\r\n\r\n" + ERROR],
    "/early-hints": [b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + ERROR],
    "/split": [ERROR[:10], PAUSE, ERROR[10:]],
    "/body-text": [head(b"200 OK", len(TEXT_BODY)) + TEXT_BODY],
    "/body-segment": [head(b"200 OK", len(BODY_START) + len(SEGMENT)) + BODY_START, PAUSE, SEGMENT],
    "/chunked-ok": [
        b"HTTP/1.1 200 OK\r\n" + CHUNKED
        + b"5;ext=1\r\nhello\r\n" + chunk(b" world") + b"0\r\nX-Trailer: done\r\n\r\n"
    ],
    "/chunked-fail": [b"HTTP/1.1 500 Internal Server Error\r\n" + CHUNKED + chunk(ERROR_BODY) + b"0\r\n\r\n"],
    "/chunked-body-text": [b"HTTP/1.1 200 OK\r\n" + CHUNKED + chunk(TEXT_BODY) + b"0\r\n\r\n"],
    "/chunked-body-segment": [
        b"HTTP/1.1 200 OK\r\n" + CHUNKED + chunk(BODY_START) + b"%x\r\n" % len(SEGMENT),
        PAUSE,
        SEGMENT + b"\r\n0\r\n\r\n",
    ],
    "/http10": [b"HTTP/1.0 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n" + ERROR_BODY],
    "/http10-body-segment": [b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY_START, PAUSE, SEGMENT],
}
CLOSE = {"/http10", "/http10-body-segment"}


def requests(buf):
    """Whole requests at the start of buf: [(method, path, version)], bytes taken."""
    out, off = [], 0
    while True:
        end = buf.find(b"\r\n\r\n", off)
        if end < 0:
            return out, off
        lines = buf[off:end].decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if end + 4 + length > len(buf):
            return out, off
        out.append((method, target.partition("?")[0], version))
        off = end + 4 + length


def answer(method, path):
    if path in SIMPLE:
        status, body = SIMPLE[path]
        return [head(status, len(body)) + (b"" if method == "HEAD" else body)]
    if path in SCRIPTED:
        return SCRIPTED[path]
    return [head(b"404 Not Found", 0)]


def serve(conn):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            batch, taken = requests(buf)
            buf = buf[taken:]
            out, close = b"", False
            for method, path, version in batch:
                for part in answer(method, path):
                    if part is PAUSE:
                        conn.sendall(out)
                        out = b""
                        time.sleep(0.05)
                    else:
                        out += part
                close = close or path in CLOSE or version == "HTTP/1.0"
            if out:
                conn.sendall(out)
            if close:
                return


listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
listener.bind(("::", int(sys.argv[1])))
listener.listen(128)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"#;

/// A server that accepts every connection on both families and keeps it open, reading and
/// answering nothing: a request to it hangs until its client gives up.
pub const SILENT_SERVER: &str = r#"import socket
import sys

listener = socket.create_server(("::", int(sys.argv[1])), family=socket.AF_INET6, dualstack_ipv6=True)
held = []
while True:
    conn, _ = listener.accept()
    held.append(conn)
"#;

/// An asyncio HTTP/1.1 server for many connections at once (tens of thousands: it raises its
/// open-file limit, listens with a deep backlog) that answers each connection's requests in
/// order, pipelined ones included, each response in a write of its own:
///
/// - `?delay_ms=N` on any target: the answer comes N ms after the request was read (the
///   connection's later requests wait behind it, as HTTP/1.1 orders them)
/// - `/abort`: no answer; the connection is reset (SO_LINGER 0, then close: a RST)
/// - a path under `/api/` or `/web/`: 500; any other: 200 (a 4-byte body, `200\n`)
///
/// A request's body (Content-Length) is read and ignored; a client that resets or goes away is
/// let go quietly.
pub const ASYNC_SERVER: &str = r#"import asyncio
import resource
import socket
import struct
import sys

REASONS = {200: b"OK", 500: b"Internal Server Error"}
LINGER_0 = struct.pack("ii", 1, 0)
BACKLOG = 65535


def status_of(path):
    return 500 if path.startswith(("/api/", "/web/")) else 200


async def read_request(reader):
    """(method, target) of the next request, its body read; None at the end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and int(value):
            await reader.readexactly(int(value))
    return method, target


async def serve(reader, writer):
    try:
        while (request := await read_request(reader)) is not None:
            path, _, query = request[1].partition("?")
            params = dict(p.partition("=")[::2] for p in query.split("&") if p)
            if "delay_ms" in params:
                await asyncio.sleep(int(params["delay_ms"]) / 1000)
            if path == "/abort":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
                writer.transport.abort()
                return
            status = status_of(path)
            body = b"%d\n" % status
            writer.write(b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n\r\n" % (status, REASONS[status], len(body)) + body)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(port):
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", port))
    server = await asyncio.start_server(serve, sock=listener, backlog=BACKLOG)
    async with server:
        await server.serve_forever()


resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
asyncio.run(main(int(sys.argv[1])))
"#;

/// Go's net/http: `/fail` 500, anything else 200; the port as its argument, both families.
const GO_SERVER: &str = r#"package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte("fail\n"))
			return
		}
		w.Write([]byte("ok\n"))
	})
	if err := http.ListenAndServe(":"+os.Args[1], nil); err != nil {
		panic(err)
	}
}
"#;

/// Node's http module: `/fail` 500, anything else 200; the port as its last argument.
const NODE_SERVER: &str = r#"const port = Number(process.argv[process.argv.length - 1]);
require("http")
  .createServer((req, res) => {
    const fail = req.url.split("?")[0] === "/fail";
    res.statusCode = fail ? 500 : 200;
    res.end(fail ? "fail\n" : "ok\n");
  })
  .listen(port, "::");
"#;
