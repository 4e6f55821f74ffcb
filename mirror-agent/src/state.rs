//! What the agent keeps across restarts besides the pinned maps: the rules (with their ids
//! and hit-counter slots) and what it created, so that it removes only that.
//!
//! The file has one writer, a [`StateStore`]: the agent opens it once at start (after taking
//! the single-instance lock), hands it to the engine, which records rules and qdiscs in it
//! while it runs, and gets it back when the engine stops, to record the sink's removal.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// A saved rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedRule {
    /// Its id.
    pub id: u32,
    /// Its hit-counter slot in the pinned map.
    pub slot: u32,
    /// Its canonical text.
    pub rule: String,
    /// The cluster resource it comes from (`MirrorRule NAMESPACE/NAME`); none: a local rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For a rule that applies to the pods it selects only: the interfaces of those pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected: Option<Vec<u32>>,
}

/// The state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SavedState {
    /// Rules, by id.
    pub rules: Vec<SavedRule>,
    /// Interfaces on which we created the clsact qdisc.
    pub created_qdiscs: Vec<u32>,
    /// Whether we created the mirror sink.
    pub created_sink: bool,
}

impl SavedState {
    /// Reads the state file; a missing file is an empty state (first start).
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_yaml_ng::from_str(&text)
                .with_context(|| format!("reading state {} (fix or remove it)", path.display()))
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading state {}", path.display())),
        }
    }

    /// Writes the state file atomically (a crash leaves the old or the new one).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = path.with_extension("tmp");
        let text = serde_yaml_ng::to_string(self)?;
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }
}

/// The state file and its contents: the only thing that writes it. Not `Clone`: whoever holds
/// it is the file's one writer.
#[derive(Debug)]
pub struct StateStore {
    path: PathBuf,
    state: SavedState,
    first_start: bool,
}

impl StateStore {
    /// Reads the state file (a missing one: first start) and checks that every saved rule
    /// parses, so that a file that cannot be used stops the start before anything is loaded.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let saved = SavedState::load(path)?;
        let first_start = saved.is_none();
        let state = saved.unwrap_or_default();
        for r in &state.rules {
            r.rule.parse::<mirror_bpf::Rule>().with_context(|| {
                format!("saved rule {} in the state file {} (fix or remove it)", r.id, path.display())
            })?;
        }
        Ok(Self { path: path.to_path_buf(), state, first_start })
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether there was no state file (the configured rules are installed then).
    pub fn first_start(&self) -> bool {
        self.first_start
    }

    /// The saved rules.
    pub fn rules(&self) -> &[SavedRule] {
        &self.state.rules
    }

    /// Whether an agent created the mirror sink (and so removes it at exit).
    pub fn created_sink(&self) -> bool {
        self.state.created_sink
    }

    /// Whether an agent created the clsact qdisc on `ifindex`.
    pub fn created_qdisc(&self, ifindex: u32) -> bool {
        self.state.created_qdiscs.contains(&ifindex)
    }

    /// Records the rules installed now and writes the file.
    pub fn save_rules(&mut self, rules: Vec<SavedRule>) -> anyhow::Result<()> {
        self.state.rules = rules;
        self.save()
    }

    /// Records whether we created the clsact qdisc on `ifindex`; writes the file if it changed.
    pub fn set_created_qdisc(&mut self, ifindex: u32, created: bool) -> anyhow::Result<()> {
        if self.created_qdisc(ifindex) == created {
            return Ok(());
        }
        if created {
            self.state.created_qdiscs.push(ifindex);
        } else {
            self.state.created_qdiscs.retain(|i| *i != ifindex);
        }
        self.save()
    }

    /// Forgets every created qdisc (all removed); written with the next save.
    pub fn clear_created_qdiscs(&mut self) {
        self.state.created_qdiscs.clear();
    }

    /// Records whether we created the mirror sink; writes the file if it changed.
    pub fn set_created_sink(&mut self, created: bool) -> anyhow::Result<()> {
        if self.state.created_sink != created {
            self.state.created_sink = created;
            self.save()?;
        }
        Ok(())
    }

    fn save(&self) -> anyhow::Result<()> {
        self.state.save(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_writes_what_it_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let mut store = StateStore::open(&path).unwrap();
        assert!(store.first_start());
        store
            .save_rules(vec![SavedRule {
                id: 1,
                slot: 0,
                rule: "status=500".into(),
                source: None,
                selected: None,
            }])
            .unwrap();
        store.set_created_qdisc(4, true).unwrap();
        store.set_created_sink(true).unwrap();
        let again = StateStore::open(&path).unwrap();
        assert!(!again.first_start() && again.created_sink() && again.created_qdisc(4));
        assert_eq!(again.rules().len(), 1);
        std::fs::write(&path, "rules: [{id: 2, slot: 0, rule: 'status=999'}]").unwrap();
        let err = format!("{:#}", StateStore::open(&path).unwrap_err());
        assert!(err.contains("saved rule 2"), "{err}");
    }

    #[test]
    fn round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.yaml");
        assert_eq!(SavedState::load(&path).unwrap(), None);
        let s = SavedState {
            rules: vec![SavedRule {
                id: 3,
                slot: 1,
                rule: "status=500".into(),
                source: None,
                selected: None,
            }],
            created_qdiscs: vec![7],
            created_sink: true,
        };
        s.save(&path).unwrap();
        assert_eq!(SavedState::load(&path).unwrap(), Some(s));
        std::fs::write(&path, "rules: 5").unwrap();
        assert!(SavedState::load(&path).is_err());
    }
}
