//! `recorder:` the capture of each trigger's flow kept on the node: where, within which
//! budget, and whether it is shipped to object storage.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{duration, err, ConfigError};

/// `recorder:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Recorder {
    /// Whether each trigger's flow is written to a capture of its own.
    pub enabled: bool,
    /// The directory of the captures ("": `captures/` beside the state file).
    pub dir: String,
    /// The most bytes the captures take together (their metadata included).
    pub max_bytes: u64,
    /// The most captures kept.
    pub max_captures: u32,
    /// A closed capture older than this is deleted (0: kept until the budget needs room).
    #[serde(deserialize_with = "duration")]
    pub max_age: Duration,
    /// Free space the recorder always leaves on the directory's filesystem.
    pub min_free_bytes: u64,
    /// Captures open at once (flows mirrored together); a trigger beyond gets none.
    pub max_open: u32,
    /// Bytes of each packet kept (0: whole packets); `snaplen` of a rule wins.
    pub snaplen: u32,
    /// A capture whose flow sent no copy for this long is closed, its mirror not ended.
    #[serde(deserialize_with = "duration")]
    pub idle_close: Duration,
    /// Per rule, the bytes of each packet kept: the rule's text (as `mirrorctl rules list`
    /// shows it) or, for a cluster rule, `namespace/name` (or the name of a cluster-wide one).
    pub rule_snaplen: Vec<RuleSnaplen>,
    /// Closed captures shipped to object storage.
    pub upload: super::Upload,
}

/// A rule's snap length.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleSnaplen {
    /// The rule's text, or its resource.
    pub rule: String,
    /// Bytes of each packet kept (at least 64: Ethernet, IP and TCP headers).
    pub snaplen: u32,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: String::new(),
            max_bytes: 256 << 20,
            max_captures: 1000,
            max_age: Duration::from_secs(7 * 24 * 3600),
            min_free_bytes: 64 << 20,
            max_open: 256,
            snaplen: 0,
            idle_close: Duration::from_secs(60),
            rule_snaplen: Vec::new(),
            upload: super::Upload::default(),
        }
    }
}

/// The least snap length: Ethernet, a VLAN tag, IPv6 and TCP with options.
pub const MIN_SNAPLEN: u32 = 64;

impl Recorder {
    /// The directory: `dir`, or `captures/` beside the state file `state`.
    pub fn dir(&self, state: &Path) -> PathBuf {
        if self.dir.is_empty() {
            state.parent().unwrap_or(Path::new("/")).join("captures")
        } else {
            PathBuf::from(&self.dir)
        }
    }

    /// The snap length of packets of `rule` (its text), of `source` (its resource, if any).
    pub fn snaplen_of(&self, rule: &str, source: Option<&str>) -> u32 {
        self.rule_snaplen
            .iter()
            .find(|r| r.rule == rule || Some(r.rule.as_str()) == source)
            .map_or(self.snaplen, |r| r.snaplen)
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.max_bytes < 1 << 20 {
            return Err(err("recorder.max_bytes", "must be at least 1048576 (1 MiB)"));
        }
        if self.max_captures == 0 || self.max_open == 0 {
            let key = if self.max_captures == 0 { "max_captures" } else { "max_open" };
            return Err(err(
                format!("recorder.{key}"),
                "must be at least 1 (recorder.enabled: false turns it off)",
            ));
        }
        if self.max_open > 65_536 {
            return Err(err("recorder.max_open", "must be at most 65536 (each is an open file)"));
        }
        if self.snaplen != 0 && self.snaplen < MIN_SNAPLEN {
            return Err(err(
                "recorder.snaplen",
                format!("must be 0 (whole packets) or at least {MIN_SNAPLEN}"),
            ));
        }
        for (i, r) in self.rule_snaplen.iter().enumerate() {
            if r.snaplen < MIN_SNAPLEN {
                return Err(err(
                    format!("recorder.rule_snaplen[{i}].snaplen"),
                    format!("must be at least {MIN_SNAPLEN}"),
                ));
            }
            if r.rule.trim().is_empty() {
                return Err(err(format!("recorder.rule_snaplen[{i}].rule"), "names no rule"));
            }
        }
        if self.idle_close.is_zero() {
            return Err(err("recorder.idle_close", "must be more than 0"));
        }
        self.upload.check()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_refused;
    use super::super::Config;

    #[test]
    fn snap_lengths_per_rule_and_bad_values() {
        let cfg = Config::parse(
            "recorder:\n  snaplen: 0\n  rule_snaplen: [{rule: \"port=8080 status=500\", snaplen: 128}]\n",
        )
        .unwrap();
        assert_eq!(cfg.recorder.snaplen_of("port=8080 status=500", None), 128);
        assert_eq!(cfg.recorder.snaplen_of("status=404", None), 0);
        let dir = cfg.recorder.dir(std::path::Path::new("/var/lib/mirror-agent/state.yaml"));
        assert_eq!(dir, std::path::Path::new("/var/lib/mirror-agent/captures"));
        assert_refused(&[
            ("recorder:\n  max_bytes: 1000\n", "recorder.max_bytes", "at least 1048576"),
            ("recorder:\n  max_open: 0\n", "recorder.max_open", "at least 1"),
            ("recorder:\n  snaplen: 20\n", "recorder.snaplen", "at least 64"),
            (
                "recorder:\n  rule_snaplen: [{rule: x, snaplen: 10}]\n",
                "recorder.rule_snaplen[0].snaplen",
                "at least 64",
            ),
            ("recorder:\n  max_age: soon\n", "recorder.max_age", "not a duration"),
            ("recorder:\n  bucket: x\n", "recorder.bucket", "unknown field"),
        ]);
    }
}
