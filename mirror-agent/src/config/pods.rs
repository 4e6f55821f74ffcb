//! `pods:` where the names of the pods behind the veths come from (the container runtime's
//! CRI socket, else `/proc`), and which of their labels are shown.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, err, ConfigError};

/// The CRI sockets to try: `auto`, `none`, or a list of paths.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CriSockets {
    /// containerd's and CRI-O's usual sockets, under `/run` and `/var/run`.
    #[default]
    Auto,
    /// Never ask a runtime: the pods come from `/proc`.
    None,
    /// These, in order.
    Paths(Vec<PathBuf>),
}

impl CriSockets {
    /// The sockets to try, in order (empty: none).
    pub fn paths(&self) -> Vec<PathBuf> {
        match self {
            CriSockets::Auto => DEFAULT_SOCKETS.iter().map(PathBuf::from).collect(),
            CriSockets::None => Vec::new(),
            CriSockets::Paths(p) => p.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for CriSockets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<PathBuf>),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "`auto`, `none`, or a list of socket paths (e.g. [/run/containerd/containerd.sock])",
            )
        })? {
            Raw::Word(w) if w == "auto" => Ok(CriSockets::Auto),
            Raw::Word(w) if w == "none" => Ok(CriSockets::None),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "'{w}': `auto`, `none`, or a list of socket paths (a single path goes in brackets: [{w}])"
            ))),
            Raw::List(p) => Ok(CriSockets::Paths(p)),
        }
    }
}

/// The sockets tried by default, in order.
pub const DEFAULT_SOCKETS: [&str; 4] = [
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/var/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
];

/// Pod labels shown at most.
pub const LABELS_MAX: usize = 16;

/// `pods:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Pods {
    /// The container runtime's CRI sockets to ask, first that answers: `auto`, `none`, or paths.
    pub cri: CriSockets,
    /// Connecting, and each refresh of the runtime's sandboxes, must end within this.
    #[serde(deserialize_with = "duration")]
    pub cri_timeout: Duration,
    /// The pod labels shown (from the runtime's sandboxes): in the API, events, captures and as
    /// `label_<key>` on the per-interface metrics.
    pub labels: Vec<String>,
}

impl Default for Pods {
    fn default() -> Self {
        Self {
            cri: CriSockets::Auto,
            cri_timeout: Duration::from_secs(2),
            labels: vec!["app".into(), "app.kubernetes.io/name".into()],
        }
    }
}

/// The metrics label of pod label `key` (as kube-state-metrics names them): `label_` and the
/// key with every character but ASCII letters, digits and `_` made `_`.
pub fn metric_label(key: &str) -> String {
    let mut s = String::from("label_");
    s.extend(key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }));
    s
}

/// A Kubernetes label key: `[prefix/]name`, name 1-63 characters of `[A-Za-z0-9._-]`, starting
/// and ending with a letter or digit; prefix a DNS subdomain of at most 253.
fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let alnum_ends = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric()) && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let name_ok = (1..=63).contains(&name.len())
        && alnum_ends(name)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                !l.is_empty()
                    && alnum_ends(l)
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

impl Pods {
    /// Checks the section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let CriSockets::Paths(paths) = &self.cri {
            for (i, p) in paths.iter().enumerate() {
                if !p.is_absolute() {
                    return Err(err(
                        format!("pods.cri[{i}]"),
                        format!("'{}' is not an absolute path", p.display()),
                    ));
                }
            }
        }
        if self.cri_timeout > Duration::from_secs(60) {
            return Err(err("pods.cri_timeout", "at most 60s (the pods are resolved in the meantime)"));
        }
        if self.labels.len() > LABELS_MAX {
            return Err(err("pods.labels", format!("{} labels: at most {LABELS_MAX}", self.labels.len())));
        }
        for (i, key) in self.labels.iter().enumerate() {
            if !valid_label_key(key) {
                return Err(err(
                    format!("pods.labels[{i}]"),
                    format!(
                        "'{}' is not a label key ([prefix/]name, e.g. app.kubernetes.io/name)",
                        key.escape_debug()
                    ),
                ));
            }
            if let Some(j) = self.labels[..i].iter().position(|k| metric_label(k) == metric_label(key)) {
                return Err(err(
                    format!("pods.labels[{i}]"),
                    format!("'{key}' and pods.labels[{j}] are the same metrics label {}", metric_label(key)),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        for ok in ["app", "app.kubernetes.io/name", "team", "a", "x-y_z.1", "example.com/tier"] {
            assert!(valid_label_key(ok), "{ok}");
        }
        for bad in ["", "-app", "app-", "a b", "Example.com/x", "/x", "x/", &"n".repeat(64)] {
            assert!(!valid_label_key(bad), "{bad}");
        }
        assert_eq!(metric_label("app.kubernetes.io/name"), "label_app_kubernetes_io_name");
    }

    #[test]
    fn cri_sockets_auto_none_or_paths() {
        let cri = |t: &str| crate::config::Config::parse(&format!("pods:\n  cri: {t}\n")).unwrap().pods.cri;
        assert_eq!(cri("auto").paths().len(), 4);
        assert_eq!(cri("auto").paths()[0], PathBuf::from("/run/containerd/containerd.sock"));
        assert_eq!(cri("none").paths(), Vec::<PathBuf>::new());
        assert_eq!(
            cri("[/run/k3s/containerd/containerd.sock]").paths(),
            [PathBuf::from("/run/k3s/containerd/containerd.sock")]
        );
        assert_eq!(cri("[]"), CriSockets::Paths(Vec::new()));
    }
}
