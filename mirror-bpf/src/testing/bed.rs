//! A classifier with some rules and its trigger events as they come: what the BPF tests of
//! triggers run their frames through.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::datapath::{Datapath, DatapathOptions};
use crate::event::TriggerEvent;
use crate::EventRing;

/// The classifier with its rules, and its events as they come.
pub struct Bed {
    /// The classifier.
    pub dp: Datapath<'static>,
    ring: EventRing<'static>,
    events: Arc<Mutex<Vec<TriggerEvent>>>,
}

impl Bed {
    /// Loads the classifier with `rules`; `None` when this process may not (outside CI, where
    /// that fails instead: [`super::require_root`]).
    pub fn new(rules: &[&str]) -> Option<Bed> {
        if !super::require_root() {
            return None;
        }
        let mut dp = super::load(&DatapathOptions::default());
        for r in rules {
            dp.add_rule(r.parse().unwrap_or_else(|e| panic!("{r}: {e}"))).expect("adding a rule");
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let ring = dp.events(move |e| sink.lock().unwrap().push(e)).expect("opening the event ring");
        Some(Bed { dp, ring, events })
    }

    /// The events that came since the last call.
    pub fn take(&self) -> Vec<TriggerEvent> {
        Datapath::poll_events(&self.ring, Duration::from_millis(50)).expect("polling the event ring");
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}
