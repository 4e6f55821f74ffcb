//! A real S3-compatible server for the recorder's upload tests: gofakes3 (MIT; a Go module) in a
//! small program of the tests (`tests/s3`) built once per machine into the tests' cache. It
//! keeps its objects in a bbolt file, so a server stopped and started again on the same file
//! has what it had, and writes one JSON line per request it answered (method, path, status,
//! the access key id of its SigV4 signature): what the server itself saw, to count PUTs by.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::proc::Proc;
use crate::topology::netns::Netns;
use crate::workload::{cache, servers};

/// The program's binary, built into the tests' cache once; `None` without a Go toolchain.
pub fn binary() -> Option<PathBuf> {
    let go = servers::go_toolchain()?;
    Some(cache::build_go(&go, "s3-server", &Path::new(env!("CARGO_MANIFEST_DIR")).join("s3")))
}

/// A request the server answered.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// `/bucket/key`.
    pub path: String,
    pub status: u16,
    /// Its body's length (-1: unknown).
    pub bytes: i64,
    /// The access key id it was signed with ("": unsigned).
    pub access_key: String,
}

/// The server, running in a namespace on an address of it; stopped on drop.
pub struct S3Server {
    binary: PathBuf,
    ns: String,
    listen: String,
    db: PathBuf,
    bucket: String,
    proc: Option<Proc>,
    /// What earlier runs answered.
    earlier: Vec<Request>,
}

impl S3Server {
    /// Starts `binary` in `ns` on `listen` (127.0.0.1:PORT), its objects in `dir`, `bucket`
    /// created.
    pub fn start(binary: &Path, ns: &Netns, listen: &str, dir: &Path, bucket: &str) -> S3Server {
        let mut s = S3Server {
            binary: binary.to_path_buf(),
            ns: ns.name().to_string(),
            listen: listen.to_string(),
            db: dir.join("s3.db"),
            bucket: bucket.to_string(),
            proc: None,
            earlier: Vec::new(),
        };
        s.run();
        s
    }

    fn run(&mut self) {
        let ns = Netns::existing(&self.ns);
        let mut cmd = ns.command(self.binary.to_str().expect("a UTF-8 path"));
        cmd.arg("-listen").arg(&self.listen).arg("-db").arg(&self.db).arg("-bucket").arg(&self.bucket);
        let mut proc = Proc::spawn("the S3 server", &mut cmd);
        proc.wait_for_output("serving bucket", Duration::from_secs(10));
        self.proc = Some(proc);
    }

    /// Stops it (SIGTERM); its objects stay in its file.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop(libc::SIGTERM, Duration::from_secs(5));
            self.earlier.extend(parse(&p.output()));
        }
    }

    /// Starts it again on the same file and address.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "the S3 server is running");
        self.run();
    }

    /// Every request it answered, over all its runs.
    pub fn requests(&self) -> Vec<Request> {
        let mut all = self.earlier.clone();
        if let Some(p) = &self.proc {
            all.extend(parse(&p.output()));
        }
        all
    }

    /// The bytes of object `key`, fetched from the server (which does not ask for a
    /// signature); `None` when it has none.
    pub fn object(&self, key: &str) -> Option<Vec<u8>> {
        let url = format!("http://{}/{}/{key}", self.listen, self.bucket);
        let out = Netns::existing(&self.ns)
            .command("curl")
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", &url])
            .output()
            .expect("running curl");
        assert!(out.status.success(), "curl {url}: {}", String::from_utf8_lossy(&out.stderr));
        let body = out.stdout;
        let at = body.iter().rposition(|b| *b == b'\n').expect("curl's status line");
        match &body[at + 1..] {
            b"200" => Some(body[..at].to_vec()),
            b"404" => None,
            other => panic!("GET {url}: status {}", String::from_utf8_lossy(other)),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The request lines of the server's output (its log lines are not JSON).
fn parse(output: &str) -> Vec<Request> {
    output.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).collect()
}
