//! `/healthz` and `/readyz` on the metrics listener, for probes: healthy while the data-path
//! thread answers; ready once the links present at start have been listed and every link that
//! matches `interfaces` is attached (one whose attach failed keeps the agent not ready, and
//! `/readyz` names it); not ready either while a newer agent waits to take over (the probes of
//! its pod reach this agent until the hand-over: [`crate::handover`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::engine::Engine;

#[derive(Default)]
struct Links {
    /// Every link present at start has been reported.
    synced: bool,
    /// Matching links not attached (yet, or their attach failed): ifindex -> name and why.
    pending: BTreeMap<u32, (String, String)>,
}

/// Whether every matching link is attached; updated by the agent as link events are handled.
#[derive(Default, Clone)]
pub struct Readiness {
    links: Arc<Mutex<Links>>,
}

impl Readiness {
    /// The links present at start have all been handled.
    pub fn set_synced(&self) {
        self.links.lock().expect("readiness lock").synced = true;
    }

    /// A matching link is not attached, for `why`.
    pub fn pending(&self, ifindex: u32, name: &str, why: &str) {
        self.links.lock().expect("readiness lock").pending.insert(ifindex, (name.into(), why.into()));
    }

    /// A link is attached, gone, or no longer matches.
    pub fn settled(&self, ifindex: u32) {
        self.links.lock().expect("readiness lock").pending.remove(&ifindex);
    }

    /// `Ok` when ready, else what is awaited.
    pub fn check(&self) -> Result<(), String> {
        let l = self.links.lock().expect("readiness lock");
        if !l.synced {
            return Err("listing the links present at start".into());
        }
        if l.pending.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = l.pending.values().map(|(n, why)| format!("{n} ({why})")).collect();
        Err(format!("matching links not attached: {}", names.join(", ")))
    }
}

#[derive(Clone)]
struct Probe {
    engine: Engine,
    ready: Readiness,
    /// The API socket, beside which a successor's claim is looked for.
    socket: PathBuf,
}

async fn healthz(State(p): State<Probe>) -> (StatusCode, String) {
    match p.engine.status().await {
        Ok(_) => (StatusCode::OK, "ok\n".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {e:#}\n")),
    }
}

async fn readyz(State(p): State<Probe>) -> (StatusCode, String) {
    let attached = match p.engine.status().await {
        Ok(s) => s.interfaces.len(),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e:#}\n")),
    };
    if crate::handover::successor_waiting(&p.socket) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: handing over to a newer agent\n".into());
    }
    match p.ready.check() {
        Ok(()) => (StatusCode::OK, format!("ready: {attached} interfaces attached\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

/// The probe routes; `socket`: the API socket (a successor's claim is beside it).
pub fn router(engine: Engine, ready: Readiness, socket: PathBuf) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(Probe {
        engine,
        ready,
        socket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_synced_and_nothing_pending() {
        let r = Readiness::default();
        assert!(r.check().unwrap_err().contains("listing"));
        r.pending(4, "vethA", "attaching");
        r.set_synced();
        assert_eq!(r.check().unwrap_err(), "matching links not attached: vethA (attaching)");
        r.settled(4);
        assert_eq!(r.check(), Ok(()));
    }
}
