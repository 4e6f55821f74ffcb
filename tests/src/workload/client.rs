//! curl as the HTTP client. Several URLs in one call share one keep-alive connection; separate
//! calls are separate connections. A [`Session`] keeps one connection open between requests.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::Netns;

/// The outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Connections curl opened for it (0: it reused the previous one).
    pub new_connections: u32,
}

/// The URL of `path` on `ip`:`port`.
pub fn url(ip: IpAddr, port: u16, path: &str) -> String {
    format!("http://{}{path}", SocketAddr::new(ip, port))
}

/// curl fetching every URL in order on one connection, printing "status connections" each.
fn curl(ns: &Netns, urls: &[String]) -> Command {
    let mut cmd = ns.command("curl");
    // -g: brackets of IPv6 literals are not globs. Bounded: 2 s to connect, 5 s per transfer.
    cmd.args(["-sS", "-g", "--noproxy", "*", "--connect-timeout", "2", "--max-time", "5"]);
    cmd.args(["-w", "%{http_code} %{num_connects}\\n"]);
    for u in urls {
        cmd.args(["-o", "/dev/null", u]);
    }
    cmd
}

/// Panics if curl failed (not on an HTTP error status: that is the point).
#[track_caller]
fn responses(urls: &[String], out: &Output) -> Vec<Response> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl {urls:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let responses: Vec<Response> = stdout
        .lines()
        .map(|l| {
            let (status, conns) = l.split_once(' ').unwrap_or_else(|| panic!("curl printed {l:?}"));
            Response { status: status.parse().unwrap(), new_connections: conns.parse().unwrap() }
        })
        .collect();
    assert_eq!(responses.len(), urls.len(), "curl {urls:?}: {stdout}");
    responses
}

/// GETs every URL in order, in one curl run from `ns`.
#[track_caller]
pub fn get(ns: &Netns, urls: &[String]) -> Vec<Response> {
    responses(urls, &curl(ns, urls).output().expect("running curl"))
}

/// Runs one curl per list of URLs, all at once, and returns the statuses of each.
#[track_caller]
pub fn get_concurrently(ns: &Netns, runs: &[Vec<String>]) -> Vec<Vec<u16>> {
    let children: Vec<_> = runs
        .iter()
        .map(|urls| {
            curl(ns, urls).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("running curl")
        })
        .collect();
    children
        .into_iter()
        .zip(runs)
        .map(|(c, urls)| {
            let out = c.wait_with_output().expect("waiting for curl");
            responses(urls, &out).iter().map(|r| r.status).collect()
        })
        .collect()
}

/// GETs every URL in one curl run and returns the statuses, asserting that all the requests
/// shared one connection.
#[track_caller]
pub fn get_keepalive(ns: &Netns, urls: &[String]) -> Vec<u16> {
    let r = get(ns, urls);
    assert_eq!(
        r.iter().map(|r| r.new_connections).sum::<u32>(),
        1,
        "{urls:?} were not on one connection: {r:?}"
    );
    r.iter().map(|r| r.status).collect()
}

/// GETs each URL on a connection of its own and returns the statuses.
#[track_caller]
pub fn get_each(ns: &Netns, urls: &[String]) -> Vec<u16> {
    urls.iter().map(|u| get(ns, std::slice::from_ref(u))[0].status).collect()
}

/// One keep-alive connection held open while other things happen (an agent restarts): python's
/// http.client, one request per [`Session::get`].
pub struct Session {
    proc: Proc,
    answered: usize,
}

/// Reads paths on stdin, GETs each on one connection, prints "status local_port".
const SESSION_CLIENT: &str = r#"import http.client, sys
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)
for line in sys.stdin:
    conn.request("GET", line.strip())
    r = conn.getresponse()
    r.read()
    print(r.status, conn.sock.getsockname()[1], flush=True)
"#;

impl Session {
    /// A session from `ns` to `server`:`port`; it connects at the first request.
    pub fn open(ns: &Netns, server: IpAddr, port: u16) -> Session {
        let mut cmd = ns.command("python3");
        cmd.args(["-c", SESSION_CLIENT, &server.to_string(), &port.to_string()]);
        Session {
            proc: Proc::spawn_with_input(&format!("http session from {}", ns.name()), &mut cmd),
            answered: 0,
        }
    }

    /// GETs `path`; returns the status and the local port (the same on every call as long as
    /// the connection stays open: http.client reconnects silently otherwise).
    #[track_caller]
    pub fn get(&mut self, path: &str) -> (u16, u16) {
        self.proc.send(path);
        let mut answers = Vec::new();
        let answered = wait_until(Duration::from_secs(5), || {
            answers = self
                .proc
                .output()
                .lines()
                .filter_map(|l| {
                    let (status, port) = l.split_once(' ')?;
                    Some((status.parse().ok()?, port.parse().ok()?))
                })
                .collect::<Vec<(u16, u16)>>();
            answers.len() > self.answered || !self.proc.running()
        });
        assert!(answered && answers.len() > self.answered, "GET {path}: {}", self.proc.output());
        self.answered += 1;
        answers[self.answered - 1]
    }
}
