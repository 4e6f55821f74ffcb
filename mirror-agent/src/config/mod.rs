//! The agent's configuration: YAML, every key optional with the default shown in
//! `config/agent.yaml`; unknown keys and bad values are refused with the key's path.
//!
//! This file is the schema: each section, its keys and their defaults (the data path's
//! settings take theirs from `mirror_bpf`, where the data path keeps them). Beside it:
//! `validate.rs`, what a configuration must be wherever it runs; `host.rs`, what it must be on
//! this host (memory, descriptors, the BPF filesystem, kernel features); `pods.rs`,
//! `tunnel.rs` and `dns.rs`, the `pods:`, `mirror.tunnel:`, `mirror.budget:` and `dns:`
//! sections with their checks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use mirror_bpf::{AttachMode, DatapathOptions, MirrorMethod, Protocol, Protocols, TimingGroup, Tracing};

use crate::capacity::Host;

mod cluster;
mod dns;
mod host;
mod pods;
mod recorder;
mod tunnel;
mod upload;
mod validate;
pub use cluster::{Cluster, ClusterMode};
pub use dns::Dns;
pub use pods::{metric_label, CriSockets, Pods};
pub use recorder::{Recorder, RuleSnaplen};
pub use tunnel::{Budget, Tunnel};
pub use upload::{Upload, KEY_ID_FILE, SECRET_FILE, TOKEN_FILE};

/// A configuration that cannot be used: where, and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ConfigError {
    /// Dotted path of the key (`mirror.create`, `rules[1]`), or the file.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

fn err(path: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError { path: path.into(), reason: reason.into() }
}

/// Which links the classifier is attached to.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Interfaces {
    /// Globs of link names attached now and whenever they appear.
    pub include: Vec<String>,
    /// Globs of link names never attached (wins over include).
    pub exclude: Vec<String>,
}

impl Default for Interfaces {
    fn default() -> Self {
        Self { include: vec!["veth*".into(), "cali*".into(), "lxc*".into()], exclude: vec![] }
    }
}

impl Interfaces {
    /// Whether a link of this name is to be attached.
    pub fn matches(&self, name: &str) -> bool {
        let any =
            |globs: &[String]| globs.iter().any(|g| glob::Pattern::new(g).is_ok_and(|p| p.matches(name)));
        any(&self.include) && !any(&self.exclude)
    }
}

/// tc attach mode.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttachModeCfg {
    /// TCX where the kernel has it, else clsact + cls_bpf.
    #[default]
    Auto,
    /// TCX only.
    Tcx,
    /// clsact + cls_bpf only.
    Tc,
}

impl From<AttachModeCfg> for AttachMode {
    fn from(m: AttachModeCfg) -> Self {
        match m {
            AttachModeCfg::Auto => AttachMode::Auto,
            AttachModeCfg::Tcx => AttachMode::Tcx,
            AttachModeCfg::Tc => AttachMode::Tc,
        }
    }
}

/// `attach:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Attach {
    /// auto | tcx | tc.
    pub mode: AttachModeCfg,
    /// Expedited RCU grace periods (`/sys/kernel/rcu_expedited`) held around each TCX link
    /// the agent creates or removes, then put back: a TCX attach waits for a grace period per
    /// hook under RTNL (about 14 ms each here; expedited about 20 µs).
    pub expedite_rcu: bool,
}

impl Default for Attach {
    fn default() -> Self {
        Self { mode: AttachModeCfg::default(), expedite_rcu: true }
    }
}

/// How the mirror sink is created when absent.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SinkCreate {
    /// A dummy link where the kernel has the dummy type, else a veth pair (said in the log and
    /// in the status).
    #[default]
    Auto,
    /// A dummy link.
    Dummy,
    /// A veth pair: the sink and its peer `<name>p`, where captures read.
    Veth,
    /// A VXLAN tunnel to a collector (`mirror.tunnel`).
    Vxlan,
    /// A Geneve tunnel to a collector.
    Geneve,
    /// A GRE (Ethernet) tunnel to a collector.
    Gretap,
    /// An ERSPAN (type II) session to a collector.
    Erspan,
    /// Never create it: wait for it to appear.
    None,
}

/// How packets are copied.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MethodCfg {
    /// bpf_clone_redirect.
    #[default]
    Clone,
    /// act_mirred on a classic cls_bpf filter (tc mode).
    Mirred,
}

impl From<MethodCfg> for MirrorMethod {
    fn from(m: MethodCfg) -> Self {
        match m {
            MethodCfg::Clone => MirrorMethod::Clone,
            MethodCfg::Mirred => MirrorMethod::Mirred,
        }
    }
}

/// How copies are handed to the sink.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeliverCfg {
    /// The cheapest way that keeps captures where they read for this sink: `peer-ingress` for
    /// the veth pair the agent creates (captures read its peer), `ingress` for an ifb (which
    /// would hand copies sent to it back to the interface they came from), `egress` otherwise
    /// and with the mirred method.
    #[default]
    Auto,
    /// Transmitted by the sink: a capture on it sees them going out, one on a veth sink's peer
    /// coming in.
    Egress,
    /// Received by the sink, as if from the wire: captures on the sink see them coming in.
    Ingress,
    /// Received by the peer of the veth sink (`<interface>p`) without crossing the veth:
    /// captures on the peer see them as before.
    PeerIngress,
}

/// `mirror:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Mirror {
    /// Name of the mirror interface.
    pub interface: String,
    /// auto | dummy | veth | vxlan | geneve | gretap | erspan | none.
    pub create: SinkCreate,
    /// clone | mirred.
    pub method: MethodCfg,
    /// auto | egress | ingress | peer-ingress.
    pub deliver: DeliverCfg,
    /// MTU set on a sink we create: large enough for the GSO packets that get mirrored.
    pub mtu: u32,
    /// The collector a tunnel sink carries the copies to.
    pub tunnel: Tunnel,
    /// The node-wide ceiling on copies.
    pub budget: Budget,
    /// Flows whose latest request is kept, to replay it to the sink ahead of the response that
    /// triggers (a power of two; 0: off; see [`DatapathOptions::replay_requests`]).
    pub replay_requests: u32,
}

impl Default for Mirror {
    fn default() -> Self {
        Self {
            interface: "mirror0".into(),
            create: SinkCreate::Auto,
            method: MethodCfg::Clone,
            deliver: DeliverCfg::Auto,
            mtu: 65535,
            tunnel: Tunnel::default(),
            budget: Budget::default(),
            replay_requests: DatapathOptions::REPLAY_REQUESTS,
        }
    }
}

/// `api:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    /// Unix socket of the HTTP/JSON API (mode 0600).
    pub socket: PathBuf,
    /// Connections kept at once: beyond, the one idle the longest (no request in progress) is
    /// closed for the new one; only while every one has a request in progress do new ones wait
    /// to be accepted.
    pub max_connections: u32,
    /// A request's line and headers must arrive within this (10 s by default), counted from
    /// the connection's start or the previous answer: idle keep-alive connections close after
    /// it too.
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// A request's body and its handling; past it the answer is 408.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// A connection on which nothing is read or written for this long while it waits is
    /// closed (a client that stops reading its answer); longer than `request_timeout`.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for Api {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_SOCKET),
            max_connections: 128,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// A duration such as `500ms`, `10s`, `2m` (a YAML string).
fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    match mirror_bpf::rule::syntax::parse_duration(&text) {
        Ok(v) if !v.is_zero() => Ok(v),
        Ok(_) => Err(serde::de::Error::custom(format!("'{text}': must be more than 0"))),
        Err(_) => Err(serde::de::Error::custom(format!("'{text}' is not a duration (e.g. 500ms, 10s, 2m)"))),
    }
}

/// The API socket unless configured otherwise (mirrorctl's default too).
pub const DEFAULT_SOCKET: &str = "/run/mirror-agent/api.sock";

/// `metrics:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Address of the Prometheus endpoint (`/metrics`); empty disables it.
    pub listen: String,
    /// Whether `mirror_rule_hits_total` carries each rule's text (label `rule`) beside its
    /// `rule_id`; whoever can reach the endpoint reads it.
    pub rule_text: bool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self { listen: "127.0.0.1:9464".into(), rule_text: true }
    }
}

/// Connections the metrics endpoint serves at once.
pub const METRICS_CONNECTIONS: u32 = 32;

/// `bpf:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Bpf {
    /// Where maps and TCX links are pinned (on a bpffs).
    pub pin_path: PathBuf,
}

impl Default for Bpf {
    fn default() -> Self {
        Self { pin_path: PathBuf::from("/sys/fs/bpf/mirror-agent") }
    }
}

/// `state:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// File where rules persist.
    pub path: PathBuf,
}

impl Default for State {
    fn default() -> Self {
        Self { path: PathBuf::from("/var/lib/mirror-agent/state.yaml") }
    }
}

/// The size of the per-CPU flow table: a number of flows, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlowsMax {
    /// As many flows as fit in [`FlowsMax::AUTO_BUDGET`] on this node's CPUs, within
    /// [`FlowsMax::AUTO_MIN`]..=[`FlowsMax::AUTO_MAX`], a power of two.
    #[default]
    Auto,
    /// That many flows.
    Fixed(u32),
}

impl FlowsMax {
    /// Bytes the flow table may take with `auto` (its values are per CPU).
    pub const AUTO_BUDGET: u64 = 64 << 20;
    pub const AUTO_MIN: u32 = 4096;
    /// The data path's own default size.
    pub const AUTO_MAX: u32 = DatapathOptions::FLOWS_MAX;

    /// The number of flows, for `cpus` possible CPUs and `value_bytes` per flow and CPU.
    pub fn resolve(self, cpus: u32, value_bytes: u32) -> u32 {
        match self {
            FlowsMax::Fixed(n) => n,
            FlowsMax::Auto => {
                let fit = Self::AUTO_BUDGET / (u64::from(cpus.max(1)) * u64::from(value_bytes.max(1)));
                let fit = fit.clamp(u64::from(Self::AUTO_MIN), u64::from(Self::AUTO_MAX)) as u32;
                // The largest power of two not above it (both bounds are powers of two).
                1 << (31 - fit.leading_zeros())
            }
        }
    }
}

impl<'de> Deserialize<'de> for FlowsMax {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FlowsMax;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of flows or `auto`")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<FlowsMax, E> {
                u32::try_from(n).map(FlowsMax::Fixed).map_err(|_| E::custom(format!("{n} flows: too many")))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<FlowsMax, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("{n}: must be positive")))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<FlowsMax, E> {
                match s {
                    "auto" => Ok(FlowsMax::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `flows:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Flows {
    /// Flows in the flow table.
    pub max: FlowsMax,
    /// Flows marked for mirroring at once.
    pub marks_max: u32,
}

impl Default for Flows {
    fn default() -> Self {
        Self { max: FlowsMax::Auto, marks_max: DatapathOptions::MARKS_MAX }
    }
}

/// `latency:` section: which measurement groups are on at start (all switch at run time with
/// `mirrorctl latency enable|disable GROUP`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Latency {
    /// HTTP response time per flow and in histograms (needed by `latency>` rules).
    pub http: bool,
    /// TCP handshake time.
    pub handshake: bool,
    /// DNS answer time and response codes on the DNS ports, without a DNS rule too.
    pub dns: bool,
    /// Kernel stack latency per stage (tracing programs).
    pub stack: bool,
    /// Share of CPU time in the network stack (tracing programs).
    pub cpu: bool,
    /// The stack group stamps 1 in this many packets (1: every packet).
    pub stack_sample: u32,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            http: TimingGroup::Http.on_by_default(),
            handshake: TimingGroup::Handshake.on_by_default(),
            dns: TimingGroup::Dns.on_by_default(),
            stack: false,
            cpu: false,
            stack_sample: Tracing::STACK_SAMPLE,
        }
    }
}

impl Latency {
    /// Each group with its state at start.
    pub fn groups(&self) -> Vec<(crate::groups::Group, bool)> {
        use crate::groups::Group;
        use mirror_bpf::TraceGroup;
        vec![
            (Group::Timing(TimingGroup::Http), self.http),
            (Group::Timing(TimingGroup::Handshake), self.handshake),
            (Group::Timing(TimingGroup::Dns), self.dns),
            (Group::Trace(TraceGroup::Stack), self.stack),
            (Group::Trace(TraceGroup::Cpu), self.cpu),
        ]
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `events:` section: trigger events (`mirrorctl events`, `GET /v1/events`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Events {
    /// Recent events kept in memory for the API (1 to 1,000,000).
    pub recent: usize,
    /// Also write each event as a JSON line: "" (no), `stdout`, or a file's path.
    pub output: String,
    /// A file output is rotated when it would grow past this many bytes (0: never).
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` newest ... `FILE.<keep>`).
    pub keep: u32,
}

impl Default for Events {
    fn default() -> Self {
        Self { recent: 1024, output: String::new(), max_bytes: 10 << 20, keep: 3 }
    }
}

/// `log:` section.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// text | json (the level comes from RUST_LOG, default info).
    pub format: LogFormat,
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which links to attach to.
    pub interfaces: Interfaces,
    /// How to attach.
    pub attach: Attach,
    /// The mirror sink.
    pub mirror: Mirror,
    /// The local API.
    pub api: Api,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// BPF pins.
    pub bpf: Bpf,
    /// Persistent state.
    pub state: State,
    /// Flow table sizes.
    pub flows: Flows,
    /// Rules installed at the first start (same syntax as `mirrorctl rules add`).
    pub rules: Vec<String>,
    /// Measurement groups on at start.
    pub latency: Latency,
    /// Trigger events.
    pub events: Events,
    /// Where pods are named from, and their labels shown.
    pub pods: Pods,
    /// The mirror rules of the Kubernetes API.
    pub cluster: Cluster,
    /// Logging.
    pub log: Log,
    /// On SIGTERM, leave the data path attached and pinned for the next agent.
    pub keep_attached: bool,
    /// The protocols followed, each a program of the data path loaded at start: `http1`,
    /// `http2` (which needs `http1`), `dns`. All of them unless set.
    pub protocols: Vec<String>,
    /// Where DNS is followed.
    pub dns: Dns,
    /// The capture of each trigger's flow, kept on the node.
    pub recorder: Recorder,
}

impl Config {
    /// The protocols of `protocols:` (all when the key is absent); the error names the entry.
    pub fn protocol_set(&self) -> Result<Protocols, ConfigError> {
        if self.protocols.is_empty() {
            return Ok(Protocols::default());
        }
        let mut set = Vec::new();
        for (i, name) in self.protocols.iter().enumerate() {
            set.push(Protocol::parse(name).map_err(|why| err(format!("protocols[{i}]"), why))?);
        }
        let set = Protocols::from_iter(set);
        set.check().map_err(|why| err("protocols", why))?;
        Ok(set)
    }

    /// Reads a configuration file and checks it, against this host too (`host.rs`): what
    /// `--check` says, and what the agent checks before it loads anything.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| err(path.display().to_string(), e.to_string()))?;
        let cfg = Self::parse(&text)?;
        let host =
            Host::this().map_err(|e| err("config", format!("reading this host's CPUs and memory: {e:#}")))?;
        cfg.check_host(&host)?;
        Ok(cfg)
    }

    /// Reads configuration files in order, each later one over the earlier ones (`--config`
    /// given more than once: a kustomize overlay's `overrides.yaml` over the ConfigMap's
    /// `agent.yaml`), and checks the result against this host too. A later file's mapping is
    /// merged key by key into the earlier one's; anything else (a list, a value) replaces it.
    /// Each file must be a configuration of its own; an error names the file it is in.
    pub fn load_layers(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let mut texts = Vec::with_capacity(paths.len());
        for p in paths {
            let at = |e: ConfigError| err(format!("{}: {}", p.display(), e.path), e.reason);
            let text = std::fs::read_to_string(p).map_err(|e| err(p.display().to_string(), e.to_string()))?;
            Self::parse(&text).map_err(at)?;
            texts.push(text);
        }
        let cfg = Self::parse(&Self::layered(&texts)?)?;
        let host =
            Host::this().map_err(|e| err("config", format!("reading this host's CPUs and memory: {e:#}")))?;
        cfg.check_host(&host)?;
        Ok(cfg)
    }

    /// The YAML of configuration texts laid over each other, the later ones winning
    /// ([`Config::load_layers`]).
    pub fn layered(texts: &[String]) -> Result<String, ConfigError> {
        let mut merged = serde_yaml_ng::Value::Null;
        for text in texts {
            let text = text.strip_prefix('\u{feff}').unwrap_or(text);
            let layer: serde_yaml_ng::Value =
                serde_yaml_ng::from_str(text).map_err(|e| err("config", e.to_string()))?;
            merge_yaml(&mut merged, layer);
        }
        if merged.is_null() {
            return Ok(String::new());
        }
        serde_yaml_ng::to_string(&merged).map_err(|e| err("config", e.to_string()))
    }

    /// Parses and checks configuration text (everything that does not depend on the host:
    /// `validate.rs`).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // Editors on some systems start UTF-8 files with a byte order mark: not YAML content.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // An empty file is the defaults.
        let cfg: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                // "." is the document; "" a key with an empty name (`? x` in YAML) at its top.
                let path = if path == "." || path.is_empty() { "config".to_string() } else { path };
                // serde_yaml prefixes the enclosing key ("mirror: unknown field ..."): the
                // full path is given already.
                let reason = e.into_inner().to_string();
                let reason = match reason.split_once(": ") {
                    Some((prefix, rest)) if path.starts_with(prefix) && !prefix.contains(' ') => {
                        rest.to_string()
                    }
                    _ => reason,
                };
                err(path, reason)
            })?
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Lays `over` onto `base`: mappings key by key, anything else (and a null `over`: an empty
/// file) as it is.
fn merge_yaml(base: &mut serde_yaml_ng::Value, over: serde_yaml_ng::Value) {
    use serde_yaml_ng::Value;
    match (base, over) {
        (_, Value::Null) => {}
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_mapping() && v.is_mapping() => merge_yaml(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The example configuration, every key with its default.
    const EXAMPLE: &str = include_str!("../../../config/agent.yaml");

    #[test]
    fn the_example_config_is_valid_and_documents_the_defaults() {
        let cfg = Config::parse(EXAMPLE).unwrap();
        let defaults = Config { rules: vec!["status=500".into()], ..Config::default() };
        assert_eq!(cfg, defaults);
    }

    #[test]
    fn flows_max_auto_fits_the_budget() {
        let parse = |t: &str| Config::parse(t).unwrap().flows.max;
        assert_eq!(parse("flows:\n  max: auto\n"), FlowsMax::Auto);
        assert_eq!(parse("flows:\n  max: 1000\n"), FlowsMax::Fixed(1000));
        assert_eq!(FlowsMax::Fixed(1000).resolve(64, 112), 1000);
        // 64 MiB / (112 B x CPUs), a power of two within 4096..=65536.
        assert_eq!(FlowsMax::Auto.resolve(2, 112), 65_536);
        assert_eq!(FlowsMax::Auto.resolve(16, 112), 32_768);
        assert_eq!(FlowsMax::Auto.resolve(64, 112), 8192);
        assert_eq!(FlowsMax::Auto.resolve(1024, 112), 4096);
    }

    #[test]
    fn later_layers_override_earlier_ones_key_by_key() {
        let base =
            "interfaces:\n  include: [\"veth*\", \"cali*\"]\nattach:\n  expedite_rcu: true\n  mode: tc\n\
                    bpf:\n  pin_path: /sys/fs/bpf/mirror-agent\nrules: [\"status=500\"]\n";
        let over =
            "# an overlay's settings\ninterfaces:\n  include: [\"kf*\"]\nattach:\n  expedite_rcu: false\n\
                    bpf:\n  pin_path: /sys/fs/bpf/other\n";
        let cfg = Config::parse(&Config::layered(&[base.into(), over.into()]).unwrap()).unwrap();
        assert_eq!(cfg.interfaces.include, ["kf*"]);
        assert!(!cfg.attach.expedite_rcu);
        // Keys the overlay leaves alone stay as the base has them.
        assert_eq!(cfg.attach.mode, AttachModeCfg::Tc);
        assert_eq!(cfg.rules, ["status=500"]);
        assert_eq!(cfg.bpf.pin_path, Path::new("/sys/fs/bpf/other"));
        // An empty (or all-comment) layer changes nothing; none at all is the defaults.
        let same = Config::parse(&Config::layered(&[base.into(), "# nothing\n".into()]).unwrap()).unwrap();
        assert_eq!(same, Config::parse(base).unwrap());
        assert_eq!(Config::layered(&[]).unwrap(), "");
    }

    #[test]
    fn a_bad_layer_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("agent.yaml");
        let bad = dir.path().join("overrides.yaml");
        std::fs::write(&good, "rules: [\"status=500\"]\n").unwrap();
        std::fs::write(&bad, "attach:\n  expedite_rcu: maybe\n").unwrap();
        let e = Config::load_layers(&[good, bad.clone()]).unwrap_err();
        assert_eq!(e.path, format!("{}: attach.expedite_rcu", bad.display()), "{e}");
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("{}").unwrap(), Config::default());
    }

    /// Each of `cases` (text, key, words of the reason) is refused, naming that key.
    #[track_caller]
    pub(super) fn assert_refused(cases: &[(&str, &str, &str)]) {
        for (text, path, reason) in cases {
            let e = Config::parse(text).expect_err(text);
            assert_eq!(e.path, *path, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn values_of_the_wrong_kind_name_the_key() {
        assert_refused(&[
            ("mirror:\n  create: tun\n", "mirror.create", "unknown variant"),
            ("mirror:\n  interfce: m0\n", "mirror.interfce", "unknown field `interfce`"),
            ("colour: red\n", "colour", "unknown field `colour`"),
            ("flows:\n  max: lots\n", "flows.max", "a number of flows or `auto`"),
            ("flows:\n  max: -5\n", "flows.max", "must be positive"),
            ("api:\n  header_timeout: soon\n", "api.header_timeout", "not a duration"),
            ("api:\n  request_timeout: \"0\"\n", "api.request_timeout", "more than 0"),
            ("metrics:\n  rule_txt: false\n", "metrics.rule_txt", "unknown field"),
            ("mirror:\n  deliver: peer\n", "mirror.deliver", "unknown variant"),
            ("pods:\n  cri: containerd\n", "pods.cri", "[containerd]"),
        ]);
    }

    #[test]
    fn a_byte_order_mark_is_not_content() {
        for text in
            ["flows:\n  max: 1000\n", "---\nflows:\n  max: 1000\n", "%YAML 1.2\n---\nflows:\n  max: 1000\n"]
        {
            let cfg = Config::parse(&format!("\u{feff}{text}")).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(cfg.flows.max, FlowsMax::Fixed(1000));
        }
        assert_eq!(Config::parse("\u{feff}").unwrap(), Config::default());
        assert_eq!(Config::parse(&format!("\u{feff}{EXAMPLE}")).unwrap(), Config::parse(EXAMPLE).unwrap());
    }

    #[test]
    fn include_and_exclude_globs() {
        let i = Interfaces { include: vec!["veth*".into()], exclude: vec!["veth-skip*".into()] };
        assert!(i.matches("veth123"));
        assert!(!i.matches("veth-skip1"));
        assert!(!i.matches("eth0"));
    }
}
