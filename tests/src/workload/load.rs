//! Production load that runs while faults are injected: HTTP requests on keep-alive
//! connections, every request's outcome and latency recorded, and iperf3 between two pods in
//! back-to-back runs, every interval's throughput recorded.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::oracles::http_stream::{self, Parsed};
use crate::proc::Proc;
use crate::topology::netns::{join, Netns};

/// How long a connection or a request may take before it counts as failed.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Request {
    /// When it was sent.
    pub start: Instant,
    /// Until its response was read (or it failed).
    pub took: Duration,
    /// Why it failed (connection, read, unexpected status).
    pub error: Option<String>,
}

/// What the load asks for on each connection.
#[derive(Debug, Clone)]
pub struct HttpSpec {
    /// Connections at once, each on a thread of its own.
    pub connections: usize,
    /// The first request of each connection and its expected status (e.g. `/bar`, 500: a
    /// connection the rule marks), if any.
    pub first: Option<(&'static str, u16)>,
    /// Every other request; the answer must be 200.
    pub path: &'static str,
    /// Pause between a response and the next request.
    pub pause: Duration,
}

/// HTTP requests on keep-alive connections from a namespace, until [`HttpLoad::finish`].
pub struct HttpLoad {
    stop: Arc<AtomicBool>,
    ports: Arc<Mutex<Vec<u16>>>,
    threads: Vec<JoinHandle<Vec<Request>>>,
}

impl HttpLoad {
    /// Starts the connections from `ns` to `server`.
    pub fn start(ns: &Netns, server: SocketAddr, spec: &HttpSpec) -> HttpLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let ports = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..spec.connections)
            .map(|_| {
                let (stop, ports, spec, ns) = (stop.clone(), ports.clone(), spec.clone(), ns.path());
                thread::spawn(move || {
                    join(&ns);
                    connection(server, &spec, &stop, &ports)
                })
            })
            .collect();
        HttpLoad { stop, ports, threads }
    }

    /// The local ports of every connection opened so far, in order.
    pub fn ports(&self) -> Vec<u16> {
        self.ports.lock().unwrap().clone()
    }

    /// Stops the load and returns every request, in the order sent per connection.
    pub fn finish(self) -> Vec<Request> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().flat_map(|t| t.join().expect("a load thread panicked")).collect()
    }
}

/// One connection's loop: reconnects when the server closes it (nginx after 1,000 requests),
/// records a failure and reconnects when anything goes wrong.
fn connection(
    server: SocketAddr,
    spec: &HttpSpec,
    stop: &AtomicBool,
    ports: &Mutex<Vec<u16>>,
) -> Vec<Request> {
    let mut done = Vec::new();
    let mut conn: Option<(TcpStream, Vec<u8>)> = None;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let (path, want) = match (&conn, spec.first) {
            (None, Some(first)) => first,
            _ => (spec.path, 200),
        };
        let outcome = (|| -> Result<bool, String> {
            if conn.is_none() {
                let c = TcpStream::connect_timeout(&server, TIMEOUT).map_err(|e| format!("connect: {e}"))?;
                c.set_nodelay(true)
                    .and_then(|()| c.set_read_timeout(Some(TIMEOUT)))
                    .map_err(|e| e.to_string())?;
                ports.lock().unwrap().push(c.local_addr().map_err(|e| e.to_string())?.port());
                conn = Some((c, Vec::new()));
            }
            let (c, buf) = conn.as_mut().expect("connected");
            get(c, buf, path, want)
        })();
        done.push(Request { start, took: start.elapsed(), error: outcome.as_ref().err().cloned() });
        if !matches!(outcome, Ok(true)) {
            conn = None;
        }
        thread::sleep(spec.pause);
    }
    done
}

/// One GET on `c`; returns whether the connection stays open.
fn get(c: &mut TcpStream, buf: &mut Vec<u8>, path: &str, want: u16) -> Result<bool, String> {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: load\r\n\r\n").as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    loop {
        match http_stream::response(buf, Some("GET"), false) {
            Parsed::Done(r, n) => {
                buf.drain(..n);
                if r.status != want {
                    return Err(format!("GET {path}: status {}, not {want}", r.status));
                }
                return Ok(!r.head.values("connection").any(|v| v.eq_ignore_ascii_case("close")));
            }
            Parsed::Incomplete => {
                let mut chunk = [0u8; 4096];
                match c.read(&mut chunk) {
                    Ok(0) => return Err(format!("GET {path}: closed by the server")),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) => return Err(format!("GET {path}: read: {e}")),
                }
            }
            Parsed::Invalid(e) => return Err(format!("GET {path}: {e}")),
        }
    }
}

/// Requests, failures and the longest request among `requests` sent within `from..=to`.
pub fn summary(requests: &[Request], from: Instant, to: Instant) -> (usize, usize, Duration) {
    let within: Vec<&Request> = requests.iter().filter(|r| r.start >= from && r.start <= to).collect();
    let failed = within.iter().filter(|r| r.error.is_some()).count();
    (within.len(), failed, within.iter().map(|r| r.took).max().unwrap_or_default())
}

/// iperf3's port.
pub const IPERF_PORT: u16 = 5201;

/// iperf3 from one pod to another in back-to-back runs, until [`Iperf::finish`].
pub struct Iperf {
    _server: Proc,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<IperfRun>>,
}

/// One iperf3 run.
#[derive(Debug, Clone)]
pub struct IperfRun {
    /// Its exit status was success.
    pub ok: bool,
    /// Throughput of each interval, bits per second.
    pub intervals: Vec<f64>,
    /// TCP retransmissions of the sender.
    pub retransmits: u64,
    /// What it printed, when it failed.
    pub output: String,
}

impl Iperf {
    /// Starts the server in `server_ns` on `addr` and the runs (each `run` long, at most
    /// `bitrate`, e.g. "500M") from `client_ns`.
    pub fn start(server_ns: &Netns, addr: IpAddr, client_ns: &Netns, run: Duration, bitrate: &str) -> Iperf {
        let mut cmd = server_ns.command("iperf3");
        cmd.args(["-s", "-B", &addr.to_string(), "-p", &IPERF_PORT.to_string()]);
        let server = Proc::spawn(&format!("iperf3 -s in {}", server_ns.name()), &mut cmd);
        let listening = crate::proc::wait_until(Duration::from_secs(10), || {
            !server_ns.sh(&format!("ss -Hltn sport = :{IPERF_PORT}")).trim().is_empty()
        });
        assert!(listening, "iperf3 -s does not listen: {}", server.output());
        let stop = Arc::new(AtomicBool::new(false));
        let args: Vec<String> = [
            "netns",
            "exec",
            client_ns.name(),
            "iperf3",
            "-c",
            &addr.to_string(),
            "-p",
            &IPERF_PORT.to_string(),
            "-t",
            &format!("{}", run.as_secs_f64()),
            "-i",
            "0.25",
            "-b",
            bitrate,
            "-J",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut runs = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let out = std::process::Command::new("ip").args(&args).output().expect("running iperf3");
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let json = serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default();
                let intervals: Vec<f64> = json["intervals"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|i| i["sum"]["bits_per_second"].as_f64()).collect())
                    .unwrap_or_default();
                let retransmits = json["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or_default();
                let ok = out.status.success() && !intervals.is_empty();
                let output = if ok { String::new() } else { text + &String::from_utf8_lossy(&out.stderr) };
                runs.push(IperfRun { ok, intervals, retransmits, output });
            }
            runs
        });
        Iperf { _server: server, stop, thread }
    }

    /// Waits for the run under way to end and returns every run.
    pub fn finish(self) -> Vec<IperfRun> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the iperf3 thread panicked")
    }
}
