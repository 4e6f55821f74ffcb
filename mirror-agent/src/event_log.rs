//! Recent trigger events: a bounded ring, read by the API (`GET /v1/events`, which can wait
//! for the next ones: `mirrorctl events -f`), and optionally each event as a JSON line on
//! stdout or in a file rotated by size (`events.output`).
//!
//! The engine's thread pushes; API handlers read. Sequence numbers start at 1 and never
//! repeat while the agent runs, so a follower asks for what came after the last it saw and
//! learns from a gap that the ring overtook it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Notify;

use crate::config::Events as EventsCfg;
use crate::pods::Pods;
use crate::views::EventView;

/// Where events go as JSON lines.
pub enum Output {
    /// The agent's stdout (its log is on stderr).
    Stdout,
    /// A file, renamed to `FILE.1` (and older ones shifted up to `FILE.<keep>`) when it
    /// reaches `max_bytes`.
    File { path: PathBuf, file: File, written: u64, max_bytes: u64, keep: u32 },
}

impl Output {
    /// The output `cfg` asks for (`None`: none).
    pub fn open(cfg: &EventsCfg) -> anyhow::Result<Option<Output>> {
        Ok(match cfg.output.as_str() {
            "" => None,
            "stdout" => Some(Output::Stdout),
            path => {
                let path = PathBuf::from(path);
                let (file, written) = open_append(&path)?;
                Some(Output::File { path, file, written, max_bytes: cfg.max_bytes, keep: cfg.keep })
            }
        })
    }

    fn write(&mut self, line: &str) -> anyhow::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(line.as_bytes())?;
                out.flush()?;
            }
            Output::File { path, file, written, max_bytes, keep } => {
                if *max_bytes > 0 && *written > 0 && *written + line.len() as u64 > *max_bytes {
                    rotate(path, *keep)?;
                    (*file, *written) = open_append(path)?;
                }
                file.write_all(line.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
                *written += line.len() as u64;
            }
        }
        Ok(())
    }
}

fn open_append(path: &Path) -> anyhow::Result<(File, u64)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening events.output {}", path.display()))?;
    let len = file.metadata()?.len();
    Ok((file, len))
}

/// `FILE` -> `FILE.1` -> ... -> `FILE.<keep>` (the oldest dropped); `keep` 0: `FILE` is
/// truncated.
fn rotate(path: &Path, keep: u32) -> anyhow::Result<()> {
    let numbered = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    if keep == 0 {
        return std::fs::remove_file(path).with_context(|| format!("rotating {}", path.display()));
    }
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))
                .with_context(|| format!("rotating {}", from.display()))?;
        }
    }
    std::fs::rename(path, numbered(1)).with_context(|| format!("rotating {}", path.display()))
}

struct Ring {
    next_seq: u64,
    events: VecDeque<EventView>,
}

/// The recent events and their output.
pub struct EventLog {
    capacity: usize,
    ring: Mutex<Ring>,
    output: Mutex<Option<Output>>,
    arrived: Notify,
    /// Names the pod of each event, once the pods are known.
    pods: Mutex<Option<Pods>>,
    /// Sees each event before it is numbered (the recorder, which names its capture).
    tap: Mutex<Option<Tap>>,
}

/// What sees each event before it is kept: it may add to it.
pub type Tap = Box<dyn Fn(&mut EventView) + Send>;

/// The most a follower waits for new events in one request (below the API's request timeout).
pub const MAX_WAIT: Duration = Duration::from_secs(30);

impl EventLog {
    /// Keeps the last `capacity` events (at least 1) and writes each to `output`.
    pub fn new(capacity: usize, output: Option<Output>) -> Self {
        Self {
            capacity: capacity.max(1),
            ring: Mutex::new(Ring { next_seq: 1, events: VecDeque::new() }),
            output: Mutex::new(output),
            arrived: Notify::new(),
            pods: Mutex::new(None),
            tap: Mutex::new(None),
        }
    }

    /// From now on `tap` sees each event first (after its pod is named).
    pub fn tap(&self, tap: Tap) {
        *self.tap.lock().expect("event tap lock") = Some(tap);
    }

    /// From now on each event names the pod behind its interface.
    pub fn name_pods(&self, pods: Pods) {
        *self.pods.lock().expect("event pods lock") = Some(pods);
    }

    /// Adds an event, numbering it; returns its sequence number.
    pub fn push(&self, mut ev: EventView) -> u64 {
        if ev.pod.is_none() {
            if let Some(pods) = self.pods.lock().expect("event pods lock").as_ref() {
                // Else the pod of an address of the flow (a drop in a pod's own namespace has no
                // interface of ours): the server's, then the client's.
                let by_addr =
                    |a: &str| a.parse::<std::net::SocketAddr>().ok().and_then(|sa| pods.by_addr(sa.ip()));
                let pod = pods
                    .by_ifindex(ev.ifindex)
                    .or_else(|| by_addr(&ev.server_side.server))
                    .or_else(|| by_addr(&ev.client_side.client));
                if let Some(p) = pod {
                    ev.pod = Some(p.label());
                    ev.labels = p.labels;
                }
            }
        }
        if let Some(tap) = self.tap.lock().expect("event tap lock").as_ref() {
            tap(&mut ev);
        }
        let seq = {
            let mut ring = self.ring.lock().expect("event ring lock");
            ev.seq = ring.next_seq;
            ring.next_seq += 1;
            if ring.events.len() == self.capacity {
                ring.events.pop_front();
            }
            ring.events.push_back(ev.clone());
            ev.seq
        };
        if let Some(out) = self.output.lock().expect("event output lock").as_mut() {
            let line = serde_json::to_string(&ev).expect("events serialize") + "\n";
            if let Err(e) = out.write(&line) {
                tracing::warn!(error = format!("{e:#}"), "writing an event to events.output");
            }
        }
        self.arrived.notify_waiters();
        seq
    }

    /// Events numbered after `after`, oldest first, at most `limit` (the newest ones when
    /// there are more: a listing shows the latest).
    pub fn after(&self, after: u64, limit: usize) -> Vec<EventView> {
        let ring = self.ring.lock().expect("event ring lock");
        let newer: Vec<&EventView> = ring.events.iter().filter(|e| e.seq > after).collect();
        newer[newer.len().saturating_sub(limit)..].iter().map(|e| (*e).clone()).collect()
    }

    /// Like [`EventLog::after`], but when there are none yet, waits up to `wait` (at most
    /// [`MAX_WAIT`]) for the next.
    pub async fn wait_after(&self, after: u64, limit: usize, wait: Duration) -> Vec<EventView> {
        let arrived = self.arrived.notified();
        tokio::pin!(arrived);
        // Registered before looking: an event pushed in between still wakes us.
        arrived.as_mut().enable();
        let now = self.after(after, limit);
        if !now.is_empty() || wait.is_zero() {
            return now;
        }
        let _ = tokio::time::timeout(wait.min(MAX_WAIT), arrived).await;
        self.after(after, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::TupleView;

    fn event(status: u16) -> EventView {
        let t = TupleView {
            client: "198.18.0.2:40000".into(),
            server: "198.18.0.3:80".into(),
            community_id: "1:x".into(),
        };
        EventView {
            seq: 0,
            time: "2025-01-01T00:00:00.000Z".into(),
            interface: "vethserver".into(),
            pod: None,
            labels: Default::default(),
            ifindex: 3,
            hook: "ingress".into(),
            client_side: t.clone(),
            server_side: t,
            nat: false,
            rule_id: 1,
            rule: "status=500".into(),
            kind: "status".into(),
            by: Some("server".into()),
            status,
            status_name: None,
            proto: Some("http1".into()),
            stream: None,
            authority: None,
            method: Some("GET".into()),
            target: Some("/bar".into()),
            response_ms: Some(1.5),
            after_request_ms: None,
            request_missing: None,
            request: None,
            ..EventView::default()
        }
    }

    #[test]
    fn ring_keeps_the_latest_and_numbers_them() {
        let log = EventLog::new(3, None);
        for s in 500..505 {
            log.push(event(s));
        }
        let all = log.after(0, 100);
        assert_eq!(all.iter().map(|e| (e.seq, e.status)).collect::<Vec<_>>(), [(3, 502), (4, 503), (5, 504)]);
        assert_eq!(log.after(4, 100).len(), 1);
        assert_eq!(log.after(0, 2).iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn file_output_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev/events.jsonl");
        let line_len = serde_json::to_string(&event(500)).unwrap().len() as u64 + 1;
        let cfg = EventsCfg {
            output: path.display().to_string(),
            max_bytes: line_len * 2,
            keep: 2,
            ..EventsCfg::default()
        };
        let log = EventLog::new(10, Output::open(&cfg).unwrap());
        for s in 500..507 {
            log.push(event(s));
        }
        let read = |p: &Path| -> Vec<u16> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<EventView>(l).unwrap().status)
                .collect()
        };
        assert_eq!(read(&path), [506]);
        assert_eq!(read(&dir.path().join("ev/events.jsonl.1")), [504, 505]);
        assert_eq!(read(&dir.path().join("ev/events.jsonl.2")), [502, 503]);
        assert!(!dir.path().join("ev/events.jsonl.3").exists());
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_the_next_event() {
        let log = std::sync::Arc::new(EventLog::new(10, None));
        let reader = {
            let log = log.clone();
            tokio::spawn(async move { log.wait_after(0, 10, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.push(event(500));
        let got = tokio::time::timeout(Duration::from_secs(2), reader).await.unwrap().unwrap();
        assert_eq!(got.len(), 1);
        assert!(log.wait_after(1, 10, Duration::from_millis(10)).await.is_empty());
    }
}
