//! `cluster:` whether and how the agent follows the mirror rules of the Kubernetes API
//! (`MirrorRule`, `ClusterMirrorRule`), and how often it writes their status back.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, err, ConfigError};

/// Whether to follow the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// In a pod (`KUBERNETES_SERVICE_HOST` set) or with a kubeconfig given: on; else off.
    #[default]
    Auto,
    /// Always (a start without a usable configuration fails).
    On,
    /// Never: the rules are the configuration's and mirrorctl's only.
    Off,
}

/// `cluster:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    /// auto | on | off.
    pub mode: ClusterMode,
    /// A kubeconfig file; none: the pod's service account (in a pod), else `$KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, as the Node object and the pods' `spec.nodeName` say it; none:
    /// `$NODE_NAME`, else the host name.
    pub node: Option<String>,
    /// The least time between two writes of one rule's status by this agent when only its
    /// hits or latest trigger changed (a change of state is written at once).
    #[serde(deserialize_with = "duration")]
    pub status_interval: Duration,
    /// What all agents together aim at for one rule: its status writes per second over the
    /// cluster. An agent spaces its writes of a rule by the larger of `status_interval` and
    /// (nodes in the rule's status) / this, so a hot rule on 1,000 nodes costs the API server
    /// this many writes per second, not 1,000 / `status_interval`.
    pub status_writes_per_second: f64,
    /// A trigger becomes a Kubernetes Event on its pod (`kubectl describe pod`).
    pub events: bool,
    /// Events this agent sends per minute at most (a burst of up to a tenth of a minute's); one
    /// per pod and rule per minute, the triggers in between counted in the next.
    pub events_per_minute: u32,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            mode: ClusterMode::Auto,
            kubeconfig: None,
            node: None,
            status_interval: Duration::from_secs(10),
            status_writes_per_second: 2.0,
            events: true,
            events_per_minute: 60,
        }
    }
}

impl Cluster {
    /// Checks the section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = &self.kubeconfig {
            if !p.is_absolute() {
                return Err(err("cluster.kubeconfig", format!("'{}' is not an absolute path", p.display())));
            }
        }
        if let Some(n) = &self.node {
            let ok = (1..=253).contains(&n.len())
                && n.split('.').all(|l| {
                    !l.is_empty()
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                        && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                });
            if !ok {
                return Err(err("cluster.node", format!("'{n}' is not a node name (a lower-case DNS name)")));
            }
        }
        if self.status_interval < Duration::from_secs(1) || self.status_interval > Duration::from_secs(3600) {
            return Err(err("cluster.status_interval", "between 1s and 1h"));
        }
        if !(self.status_writes_per_second > 0.0 && self.status_writes_per_second <= 100.0) {
            return Err(err("cluster.status_writes_per_second", "above 0 and at most 100"));
        }
        if !(1..=6000).contains(&self.events_per_minute) {
            return Err(err("cluster.events_per_minute", "1 to 6000"));
        }
        Ok(())
    }

    /// Whether the agent follows the API: `mode`, and for `auto` whether it runs in a pod or
    /// was given a kubeconfig.
    pub fn enabled(&self) -> bool {
        match self.mode {
            ClusterMode::On => true,
            ClusterMode::Off => false,
            ClusterMode::Auto => {
                self.kubeconfig.is_some() || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            }
        }
    }

    /// This node's name.
    pub fn node_name(&self) -> String {
        self.node
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
            .unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_default()
            })
    }
}
