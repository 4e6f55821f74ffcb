//! The recorder: each trigger opens a capture of its own, a pcapng holding the request
//! replayed ahead of the trigger, then every copy of that flow until its mirror ends, kept on
//! the node within a budget ([`store`]) and listed and fetched by id (`mirrorctl captures`).
//!
//! How it sees the copies: an AF_PACKET socket on the interface the agent hands copies to
//! (as `mirrorctl capture` reads), each frame given to the open capture of its tuple (either
//! side of a translated connection). The trigger's event names the flow; frames that come
//! before their event (the ring buffer is read every few milliseconds) wait a moment in a
//! small queue. A capture closes when its flow's mirror ends: the mark's limits reached (read
//! from the data path), the connection closed, the flow gone, or no copy for
//! `recorder.idle_close`.
//!
//! One task owns the store and the open captures ([`task`]); the API and the event log talk
//! to it through [`Recorder`]. With `recorder.upload`, each closed capture is queued to the
//! [`upload`]er, and deleted from the node once stored.

pub mod capture;
pub mod metrics;
pub mod store;
mod task;
pub mod upload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::api::AgentInfo;
use crate::config::Recorder as RecorderCfg;
use crate::engine::Engine;
use crate::event_log::EventLog;
use crate::pods::Pods;
use crate::views::{CaptureRef, CaptureView, EventView};

/// The recorder's counts, for the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Captures opened.
    pub opened: AtomicU64,
    /// Captures closed whole.
    pub complete: AtomicU64,
    /// Captures closed cut.
    pub cut: AtomicU64,
    /// Triggers that got no capture (too many open, the directory unusable).
    pub failed: AtomicU64,
    /// Captures deleted to make room (budget or age).
    pub deleted: AtomicU64,
    /// Writes the disk refused (full, read-only, an I/O error).
    pub write_errors: AtomicU64,
    /// Packets written.
    pub packets: AtomicU64,
    /// Copies of no open capture (their flow's trigger has none).
    pub unclaimed: AtomicU64,
    /// Copies the kernel dropped from the recorder's socket (it fell behind).
    pub socket_drops: AtomicU64,
    /// Bytes kept on disk, and captures (gauges).
    pub stored_bytes: AtomicU64,
    /// Captures kept.
    pub stored: AtomicU64,
    /// Captures open.
    pub open: AtomicU64,
    /// Captures stored in object storage, and their bytes.
    pub uploaded: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    /// Attempts to upload that failed.
    pub upload_failures: AtomicU64,
    /// Captures waiting to be uploaded (gauge).
    pub upload_pending: AtomicU64,
    /// Captures deleted for the budget or their age before they were uploaded.
    pub upload_abandoned: AtomicU64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A request to the recorder's task.
enum Msg {
    Trigger(Box<EventView>),
    List(oneshot::Sender<Vec<CaptureView>>),
    /// The file of a capture (flushed first when open), and its view.
    Get(u64, oneshot::Sender<Option<(PathBuf, CaptureView)>>),
    Remove(u64, oneshot::Sender<Result<bool, String>>),
    /// What an upload attempt did.
    Uploaded(upload::Done),
    Stop(oneshot::Sender<()>),
}

/// The recorder's handle; cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<Msg>,
    stats: Arc<Stats>,
}

impl Recorder {
    /// Starts the recorder: captures go to `dir`; each event of `events` gets the id of its
    /// capture (and its object storage key, with uploads), `node` names this node in it. A
    /// directory that cannot be used is said and counted; triggers then get no capture until
    /// it can (asked again at each). Fails only when the uploads' client cannot be made.
    pub fn start(
        cfg: RecorderCfg,
        dir: PathBuf,
        node: String,
        engine: Engine,
        info: Arc<Mutex<AgentInfo>>,
        pods: Pods,
        events: &EventLog,
    ) -> anyhow::Result<Recorder> {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Stats::default());
        let upload = if cfg.upload.enabled {
            let keys = upload::KeyLayout::new(&cfg.upload, &node);
            Some((upload::Uploader::start(&cfg.upload, tx.clone())?, keys))
        } else {
            None
        };
        let layout = upload.as_ref().map(|(_, k)| k.clone());
        let mut task = task::Task::new(cfg, dir, engine, info, pods, stats.clone(), upload.map(|(u, _)| u));
        let next = Arc::new(AtomicU64::new(task.last_id() + 1));
        let tap_tx = tx.clone();
        events.tap(Box::new(move |ev| {
            let id = next.fetch_add(1, Ordering::Relaxed);
            let key = layout.as_ref().map(|l| l.key(id, &ev.time, ev.pod.as_deref(), &ev.interface));
            ev.capture = Some(CaptureRef { id, node: node.clone(), key });
            let _ = tap_tx.send(Msg::Trigger(Box::new(ev.clone())));
        }));
        tokio::spawn(async move { task.run(rx).await });
        Ok(Recorder { tx, stats })
    }

    /// Its counts.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> anyhow::Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| anyhow::anyhow!("the recorder has stopped"))?;
        rx.await.map_err(|_| anyhow::anyhow!("the recorder has stopped"))
    }

    /// The captures kept, oldest first.
    pub async fn list(&self) -> anyhow::Result<Vec<CaptureView>> {
        self.ask(Msg::List).await
    }

    /// Capture `id`'s file and view.
    pub async fn get(&self, id: u64) -> anyhow::Result<Option<(PathBuf, CaptureView)>> {
        self.ask(|r| Msg::Get(id, r)).await
    }

    /// Deletes capture `id` (an open one is refused); whether it was there.
    pub async fn remove(&self, id: u64) -> anyhow::Result<Result<bool, String>> {
        self.ask(|r| Msg::Remove(id, r)).await
    }

    /// Closes the open captures (cut: the agent stopped) and stops.
    pub async fn stop(&self) {
        let _ = self.ask(Msg::Stop).await;
    }
}
