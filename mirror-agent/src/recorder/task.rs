//! The recorder's one task: the socket on the interface copies are handed to, the triggers,
//! the open captures and the store; every few hundred milliseconds it asks the data path
//! whether each open capture's flow is still mirrored.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use mirror_bpf::flow::monotonic_ns;
use mirror_bpf::FlowKey;

use super::capture::{Open, Wrote, GRACE, STOPPED};
use super::store::{Budget, Store, Why};
use super::upload::{Done, Uploader};
use super::{Msg, Stats};
use crate::api::text::{request_text, trigger_text};
use crate::api::AgentInfo;
use crate::capture::socket::Frame;
use crate::config::Recorder as RecorderCfg;
use crate::engine::Engine;
use crate::pods::Pods;
use crate::views::{CaptureView, EventView};

/// How often open captures are checked against their marks, and flushed.
const TICK: Duration = Duration::from_millis(100);
/// How long a copy waits for its trigger's event, and how many bytes wait at most.
const PENDING_FOR: Duration = Duration::from_secs(2);
const PENDING_BYTES: usize = 8 << 20;

mod tap;
use tap::{readable, Tap};

pub(super) struct Task {
    cfg: RecorderCfg,
    dir: PathBuf,
    engine: Engine,
    info: Arc<Mutex<AgentInfo>>,
    pods: Pods,
    stats: Arc<Stats>,
    store: Option<Store>,
    open: HashMap<u64, Open>,
    by_key: HashMap<FlowKey, u64>,
    pending: VecDeque<(Instant, FlowKey, Frame)>,
    pending_bytes: usize,
    tap: Option<Tap>,
    /// The interface (and direction) whose socket could not be opened: said once, tried again
    /// quietly.
    tap_failed: Option<(String, bool)>,
    /// When the directory was last found unusable (said once a minute at most).
    dir_warned: Option<Instant>,
    /// Where closed captures are queued for object storage, with uploads.
    uploader: Option<Uploader>,
}

/// The flow keys of an event: each side's tuple, TCP (and UDP for DNS, which may be either).
fn keys_of(ev: &EventView) -> Vec<FlowKey> {
    let protos: &[u8] = if ev.proto.as_deref() == Some("dns") { &[17, 6] } else { &[6] };
    let mut keys = Vec::new();
    for side in [&ev.client_side, &ev.server_side] {
        let (Ok(c), Ok(s)) = (side.client.parse::<SocketAddr>(), side.server.parse::<SocketAddr>()) else {
            continue;
        };
        for p in protos {
            let k = FlowKey::new(c, s, *p);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

impl Task {
    pub(super) fn new(
        cfg: RecorderCfg,
        dir: PathBuf,
        engine: Engine,
        info: Arc<Mutex<AgentInfo>>,
        pods: Pods,
        stats: Arc<Stats>,
        uploader: Option<Uploader>,
    ) -> Task {
        let mut t = Task {
            cfg,
            dir,
            engine,
            info,
            pods,
            stats,
            store: None,
            open: HashMap::new(),
            by_key: HashMap::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            tap: None,
            tap_failed: None,
            dir_warned: None,
            uploader,
        };
        t.store();
        t
    }

    /// The highest capture id on disk.
    pub(super) fn last_id(&self) -> u64 {
        self.store.as_ref().map_or(0, Store::last_id)
    }

    /// The store, opened now if it was not.
    fn store(&mut self) -> Option<&mut Store> {
        if self.store.is_none() {
            let budget = Budget {
                max_bytes: self.cfg.max_bytes,
                max_captures: self.cfg.max_captures,
                max_age: self.cfg.max_age,
                min_free_bytes: self.cfg.min_free_bytes,
            };
            match Store::open(&self.dir, budget) {
                Ok(s) => {
                    tracing::debug!(dir = %self.dir.display(), captures = s.list().len(), "recorder: captures kept in");
                    // What an earlier run left to upload (an upload of one stored already
                    // finds it there, and is not sent again).
                    if let Some(u) = &self.uploader {
                        for (id, key) in s.to_upload() {
                            u.queue(id, &s.pcap(id), &key);
                        }
                    }
                    self.store = Some(s);
                }
                Err(e) => {
                    Stats::add(&self.stats.write_errors, 1);
                    if self.dir_warned.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!(dir = %self.dir.display(), error = %e,
                            "recorder: the captures' directory cannot be used: triggers get no capture (the mirror goes on)");
                        self.dir_warned = Some(Instant::now());
                    }
                }
            }
        }
        self.store.as_mut()
    }

    pub(super) async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Trigger(ev)) => self.trigger(*ev),
                    Some(Msg::List(reply)) => {
                        let _ = reply.send(self.list());
                    }
                    Some(Msg::Get(id, reply)) => {
                        let _ = reply.send(self.get(id));
                    }
                    Some(Msg::Remove(id, reply)) => {
                        let _ = reply.send(self.remove(id));
                    }
                    Some(Msg::Uploaded(done)) => self.uploaded(done),
                    Some(Msg::Stop(reply)) => {
                        self.close_all();
                        let _ = reply.send(());
                        return;
                    }
                    None => {
                        self.close_all();
                        return;
                    }
                },
                _ = readable(self.tap.as_ref()) => self.read(),
                _ = tick.tick() => self.tick().await,
            }
        }
    }

    fn list(&mut self) -> Vec<CaptureView> {
        let open: HashMap<u64, CaptureView> = self.open.iter().map(|(id, o)| (*id, o.view.clone())).collect();
        let Some(store) = self.store.as_ref() else { return Vec::new() };
        store.list().into_iter().map(|v| open.get(&v.id).cloned().unwrap_or(v)).collect()
    }

    fn get(&mut self, id: u64) -> Option<(PathBuf, CaptureView)> {
        let store = self.store.as_mut()?;
        if let Some(o) = self.open.get_mut(&id) {
            o.flush(store);
            return Some((store.pcap(id), o.view.clone()));
        }
        store.get(id).cloned().map(|v| (store.pcap(id), v))
    }

    fn remove(&mut self, id: u64) -> Result<bool, String> {
        if self.open.contains_key(&id) {
            return Err(format!("capture {id} is open: its flow is still mirrored"));
        }
        Ok(self.store.as_mut().is_some_and(|s| s.remove(id, Why::Asked)))
    }

    /// A trigger: its capture opens, with the copies of its flow that came before it.
    fn trigger(&mut self, ev: EventView) {
        let Some(cref) = ev.capture.clone() else { return };
        let id = cref.id;
        if self.open.len() >= self.cfg.max_open as usize {
            Stats::add(&self.stats.failed, 1);
            tracing::warn!(
                id,
                max_open = self.cfg.max_open,
                "recorder: too many captures open: this trigger gets none"
            );
            return;
        }
        let keys = keys_of(&ev);
        // A flow that triggers again: its earlier capture ends here.
        let earlier: Vec<u64> = keys.iter().filter_map(|k| self.by_key.get(k).copied()).collect();
        for e in earlier {
            self.close(e, "triggered again");
        }
        let trigger = trigger_text(Some(&ev.kind), ev.status, ev.by.as_deref());
        let request = request_text(&ev);
        let pod = ev.pod.clone().unwrap_or_else(|| ev.interface.clone());
        let flow = format!("{} -> {}", ev.client_side.client, ev.server_side.server);
        let view = CaptureView {
            id,
            time: ev.time.clone(),
            pod: pod.clone(),
            rule_id: ev.rule_id,
            rule: ev.rule.clone(),
            trigger: trigger.clone(),
            request: request.clone(),
            flow: flow.clone(),
            state: "open".into(),
            key: cref.key.clone(),
            ..CaptureView::default()
        };
        let snaplen = self.cfg.snaplen_of(&ev.rule, None);
        let header = format!(
            "capture {id} on node {}: {pod}, rule {} ({}), on {trigger}{}, flow {flow}; the request replayed \
             ahead of the trigger first, then every copy of the flow until its mirror ended{}",
            cref.node,
            ev.rule_id,
            ev.rule,
            request.as_deref().map(|r| format!(" to {r}")).unwrap_or_default(),
            if snaplen > 0 { format!(", each cut to {snaplen} bytes") } else { String::new() },
        );
        let on = crate::capture::trigger_on(Some(&ev.kind), ev.status);
        let comment = crate::capture::comment(Some((ev.rule_id, Some(&ev.rule), Some(&on))), false);
        let first = self.pods.by_ifindex(ev.ifindex);
        let sink = self.tap.as_ref().map_or_else(|| "mirror".to_string(), |t| t.iface.clone());
        let Some(store) = self.store() else {
            Stats::add(&self.stats.failed, 1);
            return;
        };
        let file = match store.create(id, view.clone()) {
            Ok(f) => f,
            Err(e) => {
                Stats::add(&self.stats.failed, 1);
                if e.kind() != std::io::ErrorKind::Other {
                    Stats::add(&self.stats.write_errors, 1);
                }
                tracing::warn!(id, error = %e, "recorder: this trigger gets no capture (the mirror goes on)");
                return;
            }
        };
        let (mut open, head) =
            match Open::new(view, keys.clone(), file, &header, comment, snaplen, first, &sink) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(id, error = format!("{e:#}"), "recorder: starting a capture");
                    store.remove(id, Why::Asked);
                    return;
                }
            };
        let wrote = open.start(store, &head);
        self.count(wrote);
        Stats::add(&self.stats.opened, 1);
        for k in &keys {
            self.by_key.insert(*k, id);
        }
        self.open.insert(id, open);
        // Its copies that came before its event, in order.
        let mut i = 0;
        while i < self.pending.len() {
            if keys.contains(&self.pending[i].1) {
                let (_, _, f) = self.pending.remove(i).expect("in range");
                self.pending_bytes -= f.data.len();
                self.write(id, f);
            } else {
                i += 1;
            }
        }
        self.stats.open.store(self.open.len() as u64, Ordering::Relaxed);
    }

    fn count(&self, w: Wrote) {
        match w {
            Wrote::CutByError => Stats::add(&self.stats.write_errors, 1),
            Wrote::Packet | Wrote::Dropped | Wrote::CutByBudget => {}
        }
    }

    fn write(&mut self, id: u64, frame: Frame) {
        let (Some(o), Some(store)) = (self.open.get_mut(&id), self.store.as_mut()) else { return };
        match o.write(store, &self.pods, frame) {
            Ok(w) => {
                if w == Wrote::Packet {
                    Stats::add(&self.stats.packets, 1);
                }
                self.count(w);
            }
            Err(e) => tracing::debug!(id, error = format!("{e:#}"), "recorder: a copy not written"),
        }
    }

    /// The periodic work: the socket follows the sink; open captures whose mirror ended are
    /// closed; what was written is flushed; old captures go.
    async fn tick(&mut self) {
        self.follow_sink();
        self.expire_pending();
        if let Some(tap) = &self.tap {
            Stats::add(&self.stats.socket_drops, tap.sock.get_ref().drops());
        }
        // Which flows' mirror ended.
        let asked: Vec<(u64, Vec<FlowKey>)> = self
            .open
            .iter()
            .filter(|(_, o)| o.ending.is_none())
            .map(|(id, o)| (*id, o.keys.clone()))
            .collect();
        let keys: Vec<FlowKey> = asked.iter().flat_map(|(_, k)| k.iter().copied()).collect();
        if !keys.is_empty() {
            if let Ok(marks) = self.engine.marks(keys).await {
                let now = monotonic_ns();
                let mut at = 0;
                for (id, k) in &asked {
                    let mine = &marks[at..at + k.len()];
                    at += k.len();
                    let Some(o) = self.open.get_mut(id) else { continue };
                    let primary = mine.iter().flatten().find(|m| !m.linked);
                    let why = match primary {
                        None if mine.iter().all(Option::is_none) => Some("the flow is gone"),
                        None => None,
                        Some(m) if m.over(now) => Some("the rule's limit"),
                        Some(_) if o.last_copy.elapsed() >= self.cfg.idle_close => {
                            Some("no copy for recorder.idle_close")
                        }
                        Some(_) => None,
                    };
                    if let Some(why) = why {
                        o.ending = Some((Instant::now(), why));
                    }
                }
            }
        }
        let due: Vec<(u64, &'static str)> = self
            .open
            .iter()
            .filter_map(|(id, o)| o.ending.filter(|(at, _)| at.elapsed() >= GRACE).map(|(_, why)| (*id, why)))
            .collect();
        for (id, why) in due {
            self.close(id, why);
        }
        if let Some(store) = self.store.as_mut() {
            for o in self.open.values_mut() {
                if o.flush(store) == Wrote::CutByError {
                    Stats::add(&self.stats.write_errors, 1);
                }
            }
            store.expire(SystemTime::now());
            self.stats.deleted.store(store.deleted(), Ordering::Relaxed);
            self.stats.stored_bytes.store(store.used(), Ordering::Relaxed);
            self.stats.stored.store(store.list().len() as u64, Ordering::Relaxed);
            self.stats.upload_pending.store(store.to_upload().len() as u64, Ordering::Relaxed);
            self.stats.upload_abandoned.store(store.abandoned(), Ordering::Relaxed);
        }
    }

    /// What an upload attempt did: a capture stored is deleted from the node (its listing
    /// kept, with its key); a failure is noted in it.
    fn uploaded(&mut self, done: Done) {
        let Some(store) = self.store.as_mut() else { return };
        match done {
            Done::Stored { id, bytes, sent } => {
                Stats::add(&self.stats.uploaded, 1);
                if sent {
                    Stats::add(&self.stats.uploaded_bytes, bytes);
                }
                if let Err(e) = store.uploaded(id) {
                    Stats::add(&self.stats.write_errors, 1);
                    tracing::warn!(id, error = %e, "recorder: noting a capture uploaded");
                }
                tracing::debug!(id, bytes, sent, "capture uploaded");
            }
            Done::Failed { id, error } => {
                Stats::add(&self.stats.upload_failures, 1);
                let first = store.get(id).is_some_and(|v| v.upload_failures == 0);
                if first {
                    tracing::warn!(id, %error, "recorder: uploading a capture failed: tried again, with a growing wait");
                }
                let _ = store.update(id, |v| {
                    v.upload_failures += 1;
                    v.upload_error = Some(error);
                });
            }
            Done::Gone { id } => tracing::debug!(id, "recorder: a capture deleted before it was uploaded"),
        }
        self.stats.upload_pending.store(store.to_upload().len() as u64, Ordering::Relaxed);
    }

    fn close(&mut self, id: u64, why: &str) {
        let (Some(o), Some(store)) = (self.open.remove(&id), self.store.as_mut()) else { return };
        for k in &o.keys {
            self.by_key.remove(k);
        }
        let (view, wrote) = o.close(store, why);
        if let (Some(u), Some(key)) = (&self.uploader, &view.key) {
            u.queue(id, &store.pcap(id), key);
        }
        self.count(wrote);
        let c = if view.state == "complete" { &self.stats.complete } else { &self.stats.cut };
        Stats::add(c, 1);
        self.stats.open.store(self.open.len() as u64, Ordering::Relaxed);
        tracing::debug!(id, packets = view.packets, bytes = view.bytes, state = %view.state, ended = why, "capture closed");
    }

    fn close_all(&mut self) {
        let ids: Vec<u64> = self.open.keys().copied().collect();
        for id in ids {
            self.close(id, STOPPED);
        }
    }
}
