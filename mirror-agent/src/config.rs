//! The agent's configuration: YAML, every key optional with the default shown in
//! `config/agent.yaml`; unknown keys and bad values are refused with the key's path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use mirror_bpf::{AttachMode, MirrorMethod, Rule};

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
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Attach {
    /// auto | tcx | tc.
    pub mode: AttachModeCfg,
}

/// How the mirror sink is created when absent.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SinkCreate {
    /// A dummy link.
    #[default]
    Dummy,
    /// A veth pair: the sink and its peer `<name>p`, where captures read.
    Veth,
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

/// `mirror:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Mirror {
    /// Name of the mirror interface.
    pub interface: String,
    /// dummy | veth | none.
    pub create: SinkCreate,
    /// clone | mirred.
    pub method: MethodCfg,
    /// MTU set on a sink we create: large enough for the GSO packets that get mirrored.
    pub mtu: u32,
}

impl Default for Mirror {
    fn default() -> Self {
        Self { interface: "mirror0".into(), create: SinkCreate::Dummy, method: MethodCfg::Clone, mtu: 65535 }
    }
}

/// `api:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    /// Unix socket of the HTTP/JSON API (mode 0600).
    pub socket: PathBuf,
}

impl Default for Api {
    fn default() -> Self {
        Self { socket: PathBuf::from(DEFAULT_SOCKET) }
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
}

impl Default for Metrics {
    fn default() -> Self {
        Self { listen: "127.0.0.1:9464".into() }
    }
}

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
    pub const AUTO_MAX: u32 = 65_536;

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
        Self { max: FlowsMax::Auto, marks_max: 16_384 }
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
    /// Kernel stack latency per stage (tracing programs).
    pub stack: bool,
    /// Share of CPU time in the network stack (tracing programs).
    pub cpu: bool,
    /// The stack group stamps 1 in this many packets (1: every packet).
    pub stack_sample: u32,
}

impl Default for Latency {
    fn default() -> Self {
        Self { http: true, handshake: true, stack: false, cpu: false, stack_sample: 16 }
    }
}

impl Latency {
    /// Each group with its state at start.
    pub fn groups(&self) -> Vec<(crate::groups::Group, bool)> {
        use crate::groups::Group;
        use mirror_bpf::{TimingGroup, TraceGroup};
        vec![
            (Group::Timing(TimingGroup::Http), self.http),
            (Group::Timing(TimingGroup::Handshake), self.handshake),
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
    /// Logging.
    pub log: Log,
    /// On SIGTERM, leave the data path attached and pinned for the next agent.
    pub keep_attached: bool,
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| err(path.display().to_string(), e.to_string()))?;
        Self::parse(&text)
    }

    /// Parses and checks configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // An empty file is the defaults.
        let cfg: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." { "config".to_string() } else { path };
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

    fn validate(&self) -> Result<(), ConfigError> {
        for (key, globs) in [
            ("interfaces.include", &self.interfaces.include),
            ("interfaces.exclude", &self.interfaces.exclude),
        ] {
            for (i, g) in globs.iter().enumerate() {
                glob::Pattern::new(g)
                    .map_err(|e| err(format!("{key}[{i}]"), format!("bad glob '{g}': {e}")))?;
            }
        }
        let name = &self.mirror.interface;
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', ':']) {
            return Err(err("mirror.interface", format!("'{name}' is not a link name (1-15 characters)")));
        }
        if self.mirror.create == SinkCreate::Veth && name.len() > 14 {
            return Err(err(
                "mirror.interface",
                "with create: veth the name has at most 14 characters (the peer adds 'p')",
            ));
        }
        if !(1280..=65535).contains(&self.mirror.mtu) {
            return Err(err("mirror.mtu", format!("{} is outside 1280-65535", self.mirror.mtu)));
        }
        if self.mirror.method == MethodCfg::Mirred && self.attach.mode == AttachModeCfg::Tcx {
            return Err(err(
                "mirror.method",
                "mirred needs attach.mode tc or auto (a classic filter carries the action)",
            ));
        }
        if !self.metrics.listen.is_empty() {
            self.metrics
                .listen
                .parse::<SocketAddr>()
                .map_err(|e| err("metrics.listen", format!("'{}': {e}", self.metrics.listen)))?;
        }
        for (key, p) in [
            ("api.socket", &self.api.socket),
            ("bpf.pin_path", &self.bpf.pin_path),
            ("state.path", &self.state.path),
        ] {
            if !p.is_absolute() {
                return Err(err(key, format!("'{}' must be an absolute path", p.display())));
            }
        }
        if matches!(self.flows.max, FlowsMax::Fixed(n) if n < 64) || self.flows.marks_max < 64 {
            return Err(err("flows", "max and marks_max must be at least 64"));
        }
        if self.latency.stack_sample == 0 {
            return Err(err("latency.stack_sample", "must be at least 1 (1: every packet)"));
        }
        for (i, r) in self.rules.iter().enumerate() {
            r.parse::<Rule>().map_err(|e| err(format!("rules[{i}]"), e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid_and_documents_the_defaults() {
        let text = include_str!("../../config/agent.yaml");
        let cfg = Config::parse(text).unwrap();
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
    fn empty_is_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("{}").unwrap(), Config::default());
    }

    #[test]
    fn bad_configs_name_the_key() {
        let cases = [
            ("mirror:\n  create: tun\n", "mirror.create", "unknown variant"),
            ("mirror:\n  interfce: m0\n", "mirror.interfce", "unknown field `interfce`"),
            ("colour: red\n", "colour", "unknown field `colour`"),
            ("flows:\n  max: lots\n", "flows.max", "a number of flows or `auto`"),
            ("flows:\n  max: -5\n", "flows.max", "must be positive"),
            ("flows:\n  max: 10\n", "flows", "at least 64"),
            ("rules: [\"status=500\", \"status=999\"]\n", "rules[1]", "outside"),
            ("metrics:\n  listen: here\n", "metrics.listen", "here"),
            ("interfaces:\n  include: [\"veth[\"]\n", "interfaces.include[0]", "bad glob"),
            ("api:\n  socket: relative.sock\n", "api.socket", "absolute"),
            ("attach:\n  mode: tcx\nmirror:\n  method: mirred\n", "mirror.method", "mirred"),
            ("mirror:\n  interface: a-very-long-name0\n", "mirror.interface", "1-15"),
        ];
        for (text, path, reason) in cases {
            let e = Config::parse(text).expect_err(text);
            assert_eq!(e.path, path, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn include_and_exclude_globs() {
        let i = Interfaces { include: vec!["veth*".into()], exclude: vec!["veth-skip*".into()] };
        assert!(i.matches("veth123"));
        assert!(!i.matches("veth-skip1"));
        assert!(!i.matches("eth0"));
    }
}
