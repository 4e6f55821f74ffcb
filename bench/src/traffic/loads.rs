//! The loads, each run once for a given time from a pinned client: iperf3 throughput (pod to
//! pod, node to pod), sockperf TCP ping-pong latency, and HTTP/1.1 with wrk against nginx over
//! keep-alive connections; and the parsers of their outputs.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::cmd::run;
use super::topology::{Bed, H2_PORT, HTTP_PORT, IPERF_PORT, SOCKPERF_PORT};

/// What traffic a run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// iperf3, one TCP stream, client pod to server pod (crosses both pod veths).
    IperfPodToPod,
    /// iperf3, one TCP stream, node to server pod (crosses the server's veth only).
    IperfNodeToPod,
    /// sockperf TCP ping-pong, client pod to server pod.
    Sockperf,
    /// wrk against nginx, this percentage of the connections asking for the 500 page.
    Http { errors_pct: u8 },
    /// h2load against nginx over HTTP/2 cleartext (prior knowledge), H2_CONNECTIONS
    /// connections of H2_STREAMS streams at once, this percentage of the requests asking for the
    /// 500 page.
    H2 { errors_pct: u8 },
    /// h2load fetching nginx's 256 KiB page over HTTP/2: DATA frames across many segments,
    /// few of which begin a frame.
    H2Data,
}

/// Percentiles of a latency distribution, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The result of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Gbit/s (iperf3) or requests/s (HTTP).
    pub throughput: Option<f64>,
    pub latency: Option<Latency>,
}

/// wrk connections and threads: 2 threads so that thread 1 can ask `/foo` and thread 2
/// `/bar` (50% errors); two keep-alive connections each.
const WRK_THREADS: u32 = 2;
const WRK_CONNECTIONS: u32 = 4;

/// Thread i asks the i-th path given after `--` (round robin) on all of its connections, so
/// `-- /foo /bar` sends half the connections to the 500 page. `done` prints the numbers in
/// one line for [`parse_wrk`] (latencies in µs).
pub const WRK_SCRIPT: &str = r#"local threads = 0
function setup(thread)
  thread:set("index", threads)
  threads = threads + 1
end
function init(args)
  req = wrk.format("GET", args[(index % #args) + 1])
end
function request()
  return req
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "wrk-result requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p99_us=%d p999_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"#;

impl Load {
    /// Short name for tables.
    pub fn name(self) -> String {
        match self {
            Load::IperfPodToPod => "iperf3 pod→pod".into(),
            Load::IperfNodeToPod => "iperf3 node→pod".into(),
            Load::Sockperf => "sockperf ping-pong".into(),
            Load::Http { errors_pct } => format!("HTTP {errors_pct}% errors"),
            Load::H2 { errors_pct } => format!("HTTP/2 {errors_pct}% errors"),
            Load::H2Data => "HTTP/2 256 KiB answers".into(),
        }
    }

    /// Whether its throughput counts requests (HTTP/1.1 or HTTP/2).
    pub fn is_http(self) -> bool {
        matches!(self, Load::Http { .. } | Load::H2 { .. } | Load::H2Data)
    }

    /// The server port of its traffic (what a static mirror or tcpdump selects).
    pub fn port(self) -> u16 {
        match self {
            Load::IperfPodToPod | Load::IperfNodeToPod => IPERF_PORT,
            Load::Sockperf => SOCKPERF_PORT,
            Load::Http { .. } => HTTP_PORT,
            Load::H2 { .. } | Load::H2Data => H2_PORT,
        }
    }

    /// Runs it for `secs` seconds (iperf3 omits one more second of slow start before).
    pub fn run(self, bed: &Bed, secs: u32) -> Result<Sample> {
        let server = bed.server().v4.to_string();
        let timeout = Duration::from_secs(u64::from(secs) + 30);
        let client = &bed.client().ns;
        let cpu = bed.pins.client;
        let t = secs.to_string();
        match self {
            Load::IperfPodToPod | Load::IperfNodeToPod => {
                let ns = if self == Load::IperfPodToPod { client } else { bed.node() };
                let port = IPERF_PORT.to_string();
                let argv = ["iperf3", "-c", &server, "-p", &port, "-t", &t, "-O", "1", "-J"];
                let out = run(bed.pinned_for(ns, cpu, timeout, &argv), "iperf3")?;
                let gbps = parse_iperf3(&String::from_utf8_lossy(&out.stdout))?;
                Ok(Sample { throughput: Some(gbps), latency: None })
            }
            Load::Sockperf => {
                let port = SOCKPERF_PORT.to_string();
                let argv =
                    ["sockperf", "ping-pong", "--tcp", "-i", &server, "-p", &port, "-t", &t, "--full-rtt"];
                let out = run(bed.pinned_for(client, cpu, timeout, &argv), "sockperf")?;
                let latency = parse_sockperf(&String::from_utf8_lossy(&out.stdout))?;
                Ok(Sample { throughput: None, latency: Some(latency) })
            }
            Load::Http { errors_pct } => {
                let script = bed.path("wrk.lua");
                if !script.exists() {
                    std::fs::write(&script, WRK_SCRIPT).context("writing the wrk script")?;
                }
                let paths = http_paths(errors_pct)?;
                let (threads, conns, dur) =
                    (WRK_THREADS.to_string(), WRK_CONNECTIONS.to_string(), format!("{secs}s"));
                let url = format!("http://{server}:{HTTP_PORT}/");
                let script = script.to_string_lossy();
                let mut argv =
                    vec!["wrk", "-t", &threads, "-c", &conns, "-d", &dur, "-s", &script, &url, "--"];
                argv.extend(paths);
                let out = run(bed.pinned_for(client, cpu, timeout, &argv), "wrk")?;
                let w = parse_wrk(&String::from_utf8_lossy(&out.stdout))?;
                // nginx closes a keep-alive connection after its keepalive_requests, and wrk counts
                // the close as a read error: a few are normal, many mean the run is broken.
                ensure!(
                    w.socket_errors * 100 <= w.requests.max(1),
                    "wrk had {} socket errors in {} requests",
                    w.socket_errors,
                    w.requests
                );
                let expected = f64::from(errors_pct) / 100.0;
                // Half the connections are not half the requests exactly: allow some skew.
                ensure!(
                    (w.non2xx_share() - expected).abs() < 0.15,
                    "wrk saw {:.0}% errors, not about {errors_pct}%",
                    w.non2xx_share() * 100.0
                );
                Ok(Sample { throughput: Some(w.requests_per_s()), latency: Some(w.latency) })
            }
            Load::H2 { .. } | Load::H2Data => {
                let paths = match self {
                    Load::H2 { errors_pct } => h2_paths(errors_pct)?,
                    _ => vec!["/big"],
                };
                let urls: Vec<String> =
                    paths.iter().map(|p| format!("http://{server}:{H2_PORT}{p}")).collect();
                let (conns, streams) = (H2_CONNECTIONS.to_string(), H2_STREAMS.to_string());
                let mut argv = vec!["h2load", "-D", &t, "-c", &conns, "-m", &streams];
                argv.extend(urls.iter().map(String::as_str));
                let out = run(bed.pinned_for(client, cpu, timeout, &argv), "h2load")?;
                let h = parse_h2load(&String::from_utf8_lossy(&out.stdout))?;
                // h2load counts a 5xx as failed; errored are the requests whose stream or
                // connection broke.
                ensure!(
                    h.errored * 100 <= h.done.max(1),
                    "h2load: {} of {} requests errored",
                    h.errored,
                    h.done
                );
                let expected = match self {
                    Load::H2 { errors_pct } => f64::from(errors_pct) / 100.0,
                    _ => 0.0,
                };
                ensure!(
                    (h.share_5xx() - expected).abs() < 0.15,
                    "h2load saw {:.0}% 5xx, not about {expected:.0}%",
                    h.share_5xx() * 100.0
                );
                Ok(Sample { throughput: Some(h.requests_per_s), latency: None })
            }
        }
    }
}

/// h2load's connections and streams at once on each.
const H2_CONNECTIONS: u32 = 4;
const H2_STREAMS: u32 = 10;

/// The paths h2load asks (in turn) for a share of errors.
fn h2_paths(errors_pct: u8) -> Result<Vec<&'static str>> {
    Ok(match errors_pct {
        0 => vec!["/ok"],
        50 => vec!["/ok", "/fail"],
        100 => vec!["/fail"],
        _ => bail!("{errors_pct}% errors: h2load asks /ok and /fail in turn, so 0, 50 or 100"),
    })
}

/// What h2load reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct H2load {
    pub done: u64,
    pub errored: u64,
    pub status_5xx: u64,
    pub requests_per_s: f64,
}

impl H2load {
    /// Share of the requests done that got a 5xx.
    pub fn share_5xx(&self) -> f64 {
        self.status_5xx as f64 / self.done.max(1) as f64
    }
}

/// h2load's summary: "finished in 5.00s, 8123.40 req/s, ...", "requests: 40617 total, ...
/// 40617 done, 40617 succeeded, 0 failed, ...", "status codes: 40617 2xx, 0 3xx, 0 4xx, 0 5xx".
pub fn parse_h2load(text: &str) -> Result<H2load> {
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .with_context(|| format!("h2load printed no {prefix:?} line: {text}"))
    };
    // The number before `word` in a comma-separated line.
    let count = |l: &str, word: &str| -> Result<u64> {
        l.split(',')
            .find_map(|part| part.trim().strip_suffix(word)?.trim().parse().ok())
            .with_context(|| format!("h2load: no {word:?} in {l:?}"))
    };
    let finished = line("finished in ")?;
    let requests_per_s = finished
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" req/s")?.parse().ok())
        .with_context(|| format!("h2load: no req/s in {finished:?}"))?;
    let requests = line("requests: ")?;
    let codes = line("status codes: ")?;
    Ok(H2load {
        done: count(requests, " done")?,
        errored: count(requests, " errored")?,
        status_5xx: count(codes, " 5xx")?,
        requests_per_s,
    })
}

/// The paths given to the wrk threads for a share of errors.
fn http_paths(errors_pct: u8) -> Result<Vec<&'static str>> {
    Ok(match errors_pct {
        0 => vec!["/foo"],
        50 => vec!["/foo", "/bar"],
        100 => vec!["/bar"],
        _ => bail!("{errors_pct}% errors: only 0, 50 and 100 are split over wrk's threads"),
    })
}

/// Received throughput in Gbit/s from `iperf3 -J`.
pub fn parse_iperf3(json: &str) -> Result<f64> {
    let v: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 output has no end.sum_received.bits_per_second")?;
    Ok(bps / 1e9)
}

/// p50, p99 and p99.9 (µs) from sockperf's summary ("---> percentile 99.900 =  214.657").
pub fn parse_sockperf(text: &str) -> Result<Latency> {
    let percentile = |p: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| {
                let rest = l.split("---> percentile ").nth(1)?;
                let (name, value) = rest.split_once('=')?;
                (name.trim() == p).then(|| strip_ansi(value).trim().parse::<f64>().ok()).flatten()
            })
            .with_context(|| format!("sockperf output has no percentile {p}: {text}"))
    };
    Ok(Latency { p50: percentile("50.000")?, p99: percentile("99.000")?, p999: percentile("99.900")? })
}

/// sockperf colours some lines.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What [`WRK_SCRIPT`] prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wrk {
    pub requests: u64,
    pub duration_us: u64,
    pub non2xx: u64,
    pub socket_errors: u64,
    pub latency: Latency,
}

impl Wrk {
    pub fn requests_per_s(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
    }

    /// Share of responses that were not 2xx or 3xx.
    pub fn non2xx_share(&self) -> f64 {
        self.non2xx as f64 / self.requests.max(1) as f64
    }
}

/// The `wrk-result key=value ...` line of [`WRK_SCRIPT`].
pub fn parse_wrk(text: &str) -> Result<Wrk> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("wrk-result "))
        .with_context(|| format!("wrk printed no result line: {text}"))?;
    let field = |name: &str| -> Result<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("wrk result has no {name}: {line}"))
    };
    let w = Wrk {
        requests: field("requests")?,
        duration_us: field("duration_us")?,
        non2xx: field("non2xx")?,
        socket_errors: field("socket_errors")?,
        latency: Latency {
            p50: field("p50_us")? as f64,
            p99: field("p99_us")? as f64,
            p999: field("p999_us")? as f64,
        },
    };
    ensure!(w.requests > 0 && w.duration_us > 0, "wrk made no requests: {line}");
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2load_summary_is_read() {
        let text = "finished in 5.00s, 8123.40 req/s, 1.21MB/s\n\
                    requests: 40617 total, 40657 started, 40617 done, 40600 succeeded, 17 failed, 17 errored, 0 timeout\n\
                    status codes: 20300 2xx, 0 3xx, 0 4xx, 20300 5xx\n";
        let h = parse_h2load(text).unwrap();
        assert_eq!((h.done, h.errored, h.status_5xx), (40617, 17, 20300));
        assert!((h.requests_per_s - 8123.4).abs() < 1e-9);
        assert!((h.share_5xx() - 0.4998).abs() < 0.001);
        assert!(parse_h2load("finished in 5.00s, 1 req/s\n").is_err());
    }

    #[test]
    fn iperf3_received_throughput() {
        let json = r#"{"start": {}, "intervals": [],
            "end": {"sum_sent": {"bits_per_second": 9.9e9, "retransmits": 3},
                    "sum_received": {"seconds": 5.0, "bytes": 6000000000, "bits_per_second": 9.6e9}}}"#;
        assert_eq!(parse_iperf3(json).unwrap(), 9.6);
        let err = parse_iperf3(r#"{"start": {}, "error": "the server is busy running a test"}"#);
        assert!(err.unwrap_err().to_string().contains("busy"));
        assert!(parse_iperf3("iperf3: error").is_err());
        assert!(parse_iperf3(r#"{"end": {}}"#).is_err());
    }

    const SOCKPERF: &str = "sockperf: [Total Run] RunTime=2.001 sec; Warm up time=400 msec\n\
        sockperf: \x1b[2;35m====> avg-rtt=42.403 (std-dev=45.357)\x1b[0m\n\
        sockperf: Summary: Round trip is 42.403 usec\n\
        sockperf: \x1b[2;35mTotal 36497 observations\x1b[0m; each percentile contains 364.97 observations\n\
        sockperf: ---> <MAX> observation = 2131.307\n\
        sockperf: ---> percentile 99.999 = 2131.307\n\
        sockperf: ---> percentile 99.990 = 1087.900\n\
        sockperf: ---> percentile 99.900 =  214.657\n\
        sockperf: ---> percentile 99.000 =  130.863\n\
        sockperf: ---> percentile 90.000 =   90.305\n\
        sockperf: ---> percentile 50.000 =    7.006\n\
        sockperf: ---> <MIN> observation =    6.304\n";

    #[test]
    fn sockperf_percentiles() {
        assert_eq!(parse_sockperf(SOCKPERF).unwrap(), Latency { p50: 7.006, p99: 130.863, p999: 214.657 });
        let cut = SOCKPERF.replace("percentile 99.900", "percentile 99.800");
        assert!(parse_sockperf(&cut).unwrap_err().to_string().contains("99.900"));
        assert_eq!(strip_ansi("\x1b[2;35m 1.5\x1b[0m"), " 1.5");
    }

    #[test]
    fn wrk_result_line() {
        let text = "Running 3s test @ http://198.18.2.2:80/\n  2 threads and 4 connections\n\
                    Requests/sec:  47256.45\n\
                    wrk-result requests=146494 duration_us=3099979 non2xx=73179 socket_errors=0 \
                    p50_us=68 p99_us=1586 p999_us=4521\n";
        let w = parse_wrk(text).unwrap();
        assert_eq!(w.requests, 146494);
        assert_eq!(w.latency, Latency { p50: 68.0, p99: 1586.0, p999: 4521.0 });
        assert!((w.requests_per_s() - 47256.4).abs() < 0.1, "{}", w.requests_per_s());
        assert!((w.non2xx_share() - 0.4995).abs() < 1e-3);
        assert!(parse_wrk("Requests/sec: 1\n").is_err());
        assert!(parse_wrk(
            "wrk-result requests=0 duration_us=1 non2xx=0 socket_errors=0 p50_us=1 p99_us=1 p999_us=1"
        )
        .is_err());
        assert!(parse_wrk("wrk-result requests=5 duration_us=1").is_err());
    }

    #[test]
    fn error_shares_split_over_threads() {
        assert_eq!(http_paths(50).unwrap(), ["/foo", "/bar"]);
        assert!(http_paths(25).is_err());
        assert_eq!(Load::Http { errors_pct: 100 }.name(), "HTTP 100% errors");
    }
}
