//! What the agent keeps across restarts besides the pinned maps: the rules (with their ids
//! and hit-counter slots) and what it created, so that it removes only that.

use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.yaml");
        assert_eq!(SavedState::load(&path).unwrap(), None);
        let s = SavedState {
            rules: vec![SavedRule { id: 3, slot: 1, rule: "status=500".into() }],
            created_qdiscs: vec![7],
            created_sink: true,
        };
        s.save(&path).unwrap();
        assert_eq!(SavedState::load(&path).unwrap(), Some(s));
        std::fs::write(&path, "rules: 5").unwrap();
        assert!(SavedState::load(&path).is_err());
    }
}
