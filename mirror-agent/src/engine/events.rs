//! Trigger events: read from the data path's ring buffer between commands and logged.

use std::sync::mpsc;

use mirror_bpf::{Datapath, EventRing, TriggerEvent};

/// The ring buffer of trigger events and what its callback has read.
pub(super) struct Events {
    ring: EventRing<'static>,
    rx: mpsc::Receiver<TriggerEvent>,
}

impl Events {
    /// Opens the data path's ring buffer.
    pub(super) fn open(dp: &Datapath<'static>) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let ring = dp.events(move |e| {
            let _ = tx.send(e);
        })?;
        Ok(Self { ring, rx })
    }

    /// Reads what the ring buffer holds and logs each trigger.
    pub(super) fn drain(&mut self) {
        if let Err(e) = self.ring.consume() {
            tracing::warn!(error = %e, "reading trigger events");
        }
        while let Ok(e) = self.rx.try_recv() {
            let (server, client) = if e.reverse { (e.key.hi, e.key.lo) } else { (e.key.lo, e.key.hi) };
            tracing::info!(
                rule = e.rule_id,
                status = e.status,
                %server,
                %client,
                method = e.method.as_deref().unwrap_or("-"),
                target = e.target.as_deref().unwrap_or("-"),
                response_ms = e.request_to_response.map(|d| d.as_secs_f64() * 1e3),
                ifindex = e.ifindex,
                nat = e.nat.map(|k| k.to_string()),
                "trigger: flow mirrored"
            );
        }
    }
}
