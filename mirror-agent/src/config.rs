//! The agent's configuration: YAML, every key optional with the default shown in
//! `config/agent.yaml`; unknown keys and bad values are refused with the key's path.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use mirror_bpf::{AttachMode, MirrorMethod};

use crate::capacity::{self, Host, RuleCapacity, TableMemory, HASH_MAX_ENTRIES};

mod pods;
mod tunnel;
pub use pods::{metric_label, CriSockets, Pods};
pub use tunnel::{Budget, Tunnel};

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
    /// triggers (a power of two; 0: off).
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
            replay_requests: 4096,
        }
    }
}

/// The most flows `mirror.replay_requests` can keep a request of (each slot takes
/// `mirror_bpf::replay::SLOT_BYTES`, 696 bytes: 44 MiB at this size).
pub const REPLAY_REQUESTS_MAX: u32 = 65_536;

/// `api:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    /// Unix socket of the HTTP/JSON API (mode 0600).
    pub socket: PathBuf,
    /// Connections served at once; more wait to be accepted until one closes.
    pub max_connections: u32,
    /// A request's line and headers must arrive within this, counted from the connection's
    /// start or the previous answer: idle keep-alive connections close after it too.
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
    match mirror_bpf::rule::parse_duration(&text) {
        Ok(v) if !v.is_zero() => Ok(v),
        Ok(_) => Err(serde::de::Error::custom(format!("'{text}': must be more than 0"))),
        Err(_) => Err(serde::de::Error::custom(format!("'{text}' is not a duration (e.g. 500ms, 10s, 2m)"))),
    }
}

/// The longest of the API's timeouts.
const MAX_API_TIMEOUT: Duration = Duration::from_secs(3600);
/// Descriptors the agent keeps for itself beyond its connections: maps, programs, links of
/// the attached interfaces' hooks, netlink, the state and lock files.
const RESERVED_FDS: u64 = 256;

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
    /// Logging.
    pub log: Log,
    /// On SIGTERM, leave the data path attached and pinned for the next agent.
    pub keep_attached: bool,
}

impl Config {
    /// Reads a configuration file and checks it, against this host too: what `--check`
    /// says, and what the agent checks before it loads anything.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| err(path.display().to_string(), e.to_string()))?;
        let cfg = Self::parse(&text)?;
        let host =
            Host::this().map_err(|e| err("config", format!("reading this host's CPUs and memory: {e:#}")))?;
        cfg.check_host(&host)?;
        Ok(cfg)
    }

    /// Parses and checks configuration text (everything that does not depend on the host).
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
        if !valid_link_name(name) {
            return Err(err(
                "mirror.interface",
                format!(
                    "'{}' is not a link name (1-15 bytes, not '.' or '..', no '/', ':' or white space)",
                    name.escape_debug()
                ),
            ));
        }
        if matches!(self.mirror.create, SinkCreate::Veth | SinkCreate::Auto) && name.len() > 14 {
            return Err(err(
                "mirror.interface",
                "with create: veth or auto (a veth pair where the kernel has no dummy type) the name \
                 has at most 14 characters (the peer adds 'p')",
            ));
        }
        if !(1280..=65535).contains(&self.mirror.mtu) {
            return Err(err("mirror.mtu", format!("{} is outside 1280-65535", self.mirror.mtu)));
        }
        self.mirror.tunnel.validate(self.mirror.create)?;
        self.pods.validate()?;
        self.mirror.budget.validate()?;
        if self.mirror.method == MethodCfg::Mirred && self.attach.mode == AttachModeCfg::Tcx {
            return Err(err(
                "mirror.method",
                "mirred needs attach.mode tc or auto (a classic filter carries the action)",
            ));
        }
        match (self.mirror.deliver, self.mirror.method, self.mirror.create) {
            (DeliverCfg::Ingress | DeliverCfg::PeerIngress, MethodCfg::Mirred, _) => {
                return Err(err(
                    "mirror.deliver",
                    "the mirred method copies to the sink's egress only (act_mirred's ingress mirror \
                     leaves the copy addressed to this node, which would route it again)",
                ));
            }
            (DeliverCfg::PeerIngress, _, create) if create != SinkCreate::Veth => {
                return Err(err(
                    "mirror.deliver",
                    "peer-ingress needs create: veth (the peer is <interface>p); for a veth pair of \
                     your own, name the end captures read as the interface and use ingress",
                ));
            }
            _ => {}
        }
        if !(1..=1_000_000).contains(&self.events.recent) {
            return Err(err("events.recent", format!("{} is outside 1-1000000", self.events.recent)));
        }
        if !self.metrics.listen.is_empty() {
            self.metrics
                .listen
                .parse::<SocketAddr>()
                .map_err(|e| err("metrics.listen", format!("'{}': {e}", self.metrics.listen)))?;
        }
        self.validate_paths()?;
        self.validate_api()?;
        // Hash maps: the kernel refuses more entries (E2BIG) whatever the memory.
        for (key, n) in [
            (
                "flows.max",
                match self.flows.max {
                    FlowsMax::Fixed(n) => n,
                    FlowsMax::Auto => FlowsMax::AUTO_MAX,
                },
            ),
            ("flows.marks_max", self.flows.marks_max),
        ] {
            if n < 64 {
                return Err(err(key, format!("{n}: at least 64")));
            }
            if n > HASH_MAX_ENTRIES {
                return Err(err(
                    key,
                    format!(
                        "{n}: more than {HASH_MAX_ENTRIES}, the most entries the kernel gives a hash map"
                    ),
                ));
            }
        }
        let replay = self.mirror.replay_requests;
        if replay != 0 && (!replay.is_power_of_two() || !(64..=REPLAY_REQUESTS_MAX).contains(&replay)) {
            return Err(err(
                "mirror.replay_requests",
                format!("{replay}: 0 (off) or a power of two from 64 to {REPLAY_REQUESTS_MAX}"),
            ));
        }
        if self.latency.stack_sample == 0 {
            return Err(err("latency.stack_sample", "must be at least 1 (1: every packet)"));
        }
        self.validate_rules()
    }

    /// Paths: absolute, within the kernel's limits on names, and for the socket on sun_path.
    fn validate_paths(&self) -> Result<(), ConfigError> {
        for (key, p) in [
            ("api.socket", &self.api.socket),
            ("bpf.pin_path", &self.bpf.pin_path),
            ("state.path", &self.state.path),
        ] {
            if !p.is_absolute() {
                return Err(err(key, format!("'{}' must be an absolute path", p.display())));
            }
            // The state file is written beside itself as <name>.tmp first.
            let longest = p
                .components()
                .map(|c| c.as_os_str().len())
                .chain(p.with_extension("tmp").file_name().map(|n| n.len()))
                .max()
                .unwrap_or(0);
            if longest > NAME_MAX {
                return Err(err(
                    key,
                    format!("'{}' has a name of {longest} bytes: at most {NAME_MAX} in a path", p.display()),
                ));
            }
            // Files go below the pin path (links/<ifindex>-<hook>): keep room for them.
            if p.as_os_str().len() > PATH_MAX - 256 {
                return Err(err(
                    key,
                    format!(
                        "{} bytes: at most {} (PATH_MAX, less room for files below it)",
                        p.as_os_str().len(),
                        PATH_MAX - 256
                    ),
                ));
            }
        }
        let socket = self.api.socket.as_os_str().len();
        if socket > SUN_PATH_MAX {
            return Err(err(
                "api.socket",
                format!(
                    "'{}' is {socket} bytes: a Unix socket's path has at most {SUN_PATH_MAX}",
                    self.api.socket.display()
                ),
            ));
        }
        Ok(())
    }

    fn validate_api(&self) -> Result<(), ConfigError> {
        let api = &self.api;
        if !(1..=65_536).contains(&api.max_connections) {
            return Err(err("api.max_connections", format!("{} is outside 1-65536", api.max_connections)));
        }
        for (key, d) in [
            ("api.header_timeout", api.header_timeout),
            ("api.request_timeout", api.request_timeout),
            ("api.idle_timeout", api.idle_timeout),
        ] {
            if d > MAX_API_TIMEOUT {
                return Err(err(key, format!("{d:?}: at most 1h")));
            }
        }
        if api.idle_timeout <= api.request_timeout {
            return Err(err(
                "api.idle_timeout",
                format!(
                    "{:?} must be longer than api.request_timeout ({:?}): a connection waits that long while its request is handled",
                    api.idle_timeout, api.request_timeout
                ),
            ));
        }
        Ok(())
    }

    /// Each rule parses within the agent's bounds, none is given twice, and all fit the
    /// classifier's rule maps at once.
    fn validate_rules(&self) -> Result<(), ConfigError> {
        let mut parsed = Vec::with_capacity(self.rules.len());
        let mut seen = HashMap::with_capacity(self.rules.len());
        for (i, text) in self.rules.iter().enumerate() {
            let rule = crate::rules::parse(text).map_err(|e| err(format!("rules[{i}]"), e.to_string()))?;
            if let Some(first) = seen.insert(rule.clone(), i) {
                return Err(err(
                    format!("rules[{i}]"),
                    format!("the same rule as rules[{first}] ({rule}): give it once"),
                ));
            }
            parsed.push(rule);
        }
        crate::rules::check_fits(&parsed, RuleCapacity::classifier()).map_err(|e| err("rules", e.to_string()))
    }

    /// What depends on the host: the memory the sized tables take, the descriptors the API's
    /// connections take, where the pins go.
    pub fn check_host(&self, host: &Host) -> Result<(), ConfigError> {
        let flows =
            self.flows.max.resolve(host.cpus, std::mem::size_of::<mirror_bpf::types::flow_traffic>() as u32);
        let mem = TableMemory::of(flows, self.flows.marks_max, self.mirror.replay_requests, host.cpus);
        let budget = host.map_budget();
        if mem.total() > budget {
            // The key that can bring it down; none when the fixed maps alone are too much.
            let key = if mem.fixed >= budget {
                "config"
            } else if mem.replay > mem.flows && mem.replay > mem.marks {
                "mirror.replay_requests"
            } else if mem.flows >= mem.marks {
                "flows.max"
            } else {
                "flows.marks_max"
            };
            let (largest, largest_bytes) = &mem.largest_fixed;
            return Err(err(
                key,
                format!(
                    "the classifier's maps take {} of kernel memory on {} CPUs: {} for {flows} flows (flows.max), \
                     {} for {} marks (flows.marks_max), {} for {} requests (mirror.replay_requests), {} for the \
                     other maps (the largest: {largest}, {}): more than {}, {}",
                    capacity::human(mem.total()),
                    host.cpus,
                    capacity::human(mem.flows),
                    capacity::human(mem.marks),
                    self.flows.marks_max,
                    capacity::human(mem.replay),
                    self.mirror.replay_requests,
                    capacity::human(mem.fixed),
                    capacity::human(*largest_bytes),
                    capacity::human(budget),
                    host.map_budget_text(),
                ),
            ));
        }
        let metrics = if self.metrics.listen.is_empty() { 0 } else { u64::from(METRICS_CONNECTIONS) };
        let fds = u64::from(self.api.max_connections) + metrics + RESERVED_FDS;
        if fds > host.open_files {
            return Err(err(
                "api.max_connections",
                format!(
                    "{} connections (with {metrics} for metrics and {RESERVED_FDS} descriptors the agent keeps) need \
                     {fds} descriptors: more than the {} this process may open (RLIMIT_NOFILE)",
                    self.api.max_connections, host.open_files
                ),
            ));
        }
        crate::bpffs::check(&self.bpf.pin_path).map_err(|e| err("bpf.pin_path", e))?;
        // Programs for TCX do not load on a kernel without it. (The query needs root: without
        // it, the agent could not start anyway.)
        // SAFETY: geteuid has no preconditions.
        if self.attach.mode == AttachModeCfg::Tcx
            && unsafe { libc::geteuid() } == 0
            && !mirror_bpf::tcx_supported()
        {
            return Err(err("attach.mode", "tcx: this kernel has no TCX (Linux 6.6+): use auto or tc"));
        }
        Ok(())
    }
}

/// Connections the metrics endpoint serves at once.
pub const METRICS_CONNECTIONS: u32 = 32;

/// NAME_MAX and PATH_MAX of Linux, and the longest path a Unix socket's sun_path holds.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;
const SUN_PATH_MAX: usize = 107;

/// Whether the kernel takes `name` for a link (dev_valid_name): 1-15 bytes, not `.` or `..`,
/// no `/`, `:` or white space.
fn valid_link_name(name: &str) -> bool {
    // The kernel's isspace() also takes 0xa0 (Latin-1 no-break space).
    let bad = |b: u8| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0x0b || b == 0xa0;
    !name.is_empty() && name.len() <= 15 && name != "." && name != ".." && !name.bytes().any(bad)
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
            ("flows:\n  max: 10\n", "flows.max", "at least 64"),
            ("flows:\n  marks_max: 4294967295\n", "flows.marks_max", "the most entries the kernel gives"),
            ("flows:\n  max: 268435457\n", "flows.max", "268435456"),
            ("mirror:\n  interface: \"..\"\n", "mirror.interface", "not a link name"),
            ("mirror:\n  replay_requests: 1000\n", "mirror.replay_requests", "a power of two"),
            ("mirror:\n  replay_requests: 1048576\n", "mirror.replay_requests", "65536"),
            ("mirror:\n  interface: \"m\\t0\"\n", "mirror.interface", "not a link name"),
            (
                "rules: [\"status=500\", \"status=5xx\", \"status=500 packets=10k\"]\n",
                "rules[2]",
                "same rule as rules[0]",
            ),
            ("rules: [\"status=500 duration=99999999999999h\"]\n", "rules[0]", "longer than 24h"),
            ("api:\n  header_timeout: soon\n", "api.header_timeout", "not a duration"),
            ("api:\n  request_timeout: \"0\"\n", "api.request_timeout", "more than 0"),
            ("api:\n  idle_timeout: 30s\n", "api.idle_timeout", "longer than api.request_timeout"),
            ("api:\n  max_connections: 0\n", "api.max_connections", "outside"),
            ("api:\n  header_timeout: 2h\n", "api.header_timeout", "at most 1h"),
            ("metrics:\n  rule_txt: false\n", "metrics.rule_txt", "unknown field"),
            ("rules: [\"status=500\", \"status=999\"]\n", "rules[1]", "outside"),
            ("metrics:\n  listen: here\n", "metrics.listen", "here"),
            ("interfaces:\n  include: [\"veth[\"]\n", "interfaces.include[0]", "bad glob"),
            ("api:\n  socket: relative.sock\n", "api.socket", "absolute"),
            ("attach:\n  mode: tcx\nmirror:\n  method: mirred\n", "mirror.method", "mirred"),
            ("mirror:\n  interface: a-very-long-name0\n", "mirror.interface", "1-15"),
            ("mirror:\n  deliver: peer\n", "mirror.deliver", "unknown variant"),
            ("mirror:\n  create: vxlan\n", "mirror.tunnel.remote", "collector's address"),
            (
                "mirror:\n  create: vxlan\n  tunnel:\n    remote: 198.18.0.1\n    id: 16777216\n",
                "mirror.tunnel.id",
                "above",
            ),
            (
                "mirror:\n  create: gretap\n  tunnel:\n    remote: \"2001:2::1\"\n",
                "mirror.tunnel.remote",
                "IPv4 only",
            ),
            (
                "mirror:\n  create: gretap\n  tunnel:\n    remote: 198.18.0.1\n    port: 4789\n",
                "mirror.tunnel.port",
                "no UDP port",
            ),
            (
                "mirror:\n  create: vxlan\n  tunnel:\n    remote: 198.18.0.1\n    local: \"2001:2::1\"\n",
                "mirror.tunnel.local",
                "family",
            ),
            ("mirror:\n  tunnel:\n    remote: 198.18.0.1\n", "mirror.tunnel", "only used with"),
            (
                "mirror:\n  budget:\n    packets_per_second: 2000000000\n",
                "mirror.budget.packets_per_second",
                "at most",
            ),
            ("mirror:\n  method: mirred\n  deliver: ingress\n", "mirror.deliver", "egress only"),
            ("mirror:\n  create: dummy\n  deliver: peer-ingress\n", "mirror.deliver", "create: veth"),
            ("pods:\n  cri: containerd\n", "pods.cri", "[containerd]"),
            ("pods:\n  cri: [run/crio.sock]\n", "pods.cri[0]", "absolute"),
            ("pods:\n  cri_timeout: 5m\n", "pods.cri_timeout", "at most 60s"),
            ("pods:\n  labels: [app, \"team name\"]\n", "pods.labels[1]", "not a label key"),
            ("pods:\n  labels: [app.name, app_name]\n", "pods.labels[1]", "label_app_name"),
        ];
        for (text, path, reason) in cases {
            let e = Config::parse(text).expect_err(text);
            assert_eq!(e.path, path, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn paths_within_the_kernels_limits() {
        let long = format!("/run/{}/api.sock", "d".repeat(100));
        let e = Config::parse(&format!("api:\n  socket: {long}\n")).unwrap_err();
        assert_eq!(e.path, "api.socket", "{e}");
        assert!(e.reason.contains("at most 107"), "{e}");
        let e = Config::parse(&format!("state:\n  path: /var/{}\n", "n".repeat(256))).unwrap_err();
        assert_eq!(e.path, "state.path", "{e}");
        assert!(e.reason.contains("at most 255"), "{e}");
        // state.tmp is written beside it.
        let e = Config::parse(&format!("state:\n  path: /var/{}\n", "n".repeat(252))).unwrap_err();
        assert_eq!(e.path, "state.path", "{e}");
        Config::parse(&format!("state:\n  path: /var/{}.yaml\n", "n".repeat(245))).unwrap();
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
        let example = include_str!("../../config/agent.yaml");
        assert_eq!(Config::parse(&format!("\u{feff}{example}")).unwrap(), Config::parse(example).unwrap());
    }

    #[test]
    fn rules_must_fit_the_rule_maps() {
        // 16,384 rules: one more than the hit-counter slots.
        let many: Vec<String> = (0..16_384).map(|i| format!("status=500 packets={}", i + 1)).collect();
        let e = Config::parse(&format!("rules: {}\n", serde_json::to_string(&many).unwrap())).unwrap_err();
        assert_eq!(e.path, "rules", "{e}");
        assert!(e.reason.contains("16384 rules, more than the 16383"), "{e}");
        // 132 ports x 500 statuses: more (port, status) pairs than port_rules holds.
        let ports: Vec<String> = (1..=132).map(|p| format!("port={p} status=100-599")).collect();
        let e = Config::parse(&format!("rules: {}\n", serde_json::to_string(&ports).unwrap())).unwrap_err();
        assert_eq!(e.path, "rules", "{e}");
        assert!(e.reason.contains("66000 distinct (port, status) pairs, more than the 65536"), "{e}");
        Config::parse(&format!("rules: {}\n", serde_json::to_string(&ports[..131]).unwrap())).unwrap();
    }

    fn host(cpus: u32, memory: u64) -> Host {
        Host { cpus, memory, cgroup: None, open_files: 1024 }
    }

    fn cgroup(cpus: u32, limit: u64) -> Host {
        Host { cgroup: Some("/sys/fs/cgroup/agent".into()), ..host(cpus, limit) }
    }

    impl Host {
        #[track_caller]
        fn check_host_ok(&self, cfg: &Config) {
            cfg.check_host(self).unwrap_or_else(|e| panic!("{self:?}: {e}"));
        }
    }

    #[test]
    fn tables_must_fit_the_memory() {
        let gib = 1u64 << 30;
        let pins = "bpf:\n  pin_path: /sys/fs/bpf/mirror-test\n";
        let cfg = |flows: &str| Config::parse(&format!("{pins}flows:\n  {flows}\n")).unwrap();
        // The defaults fit a small node, and auto fits a big one (whose per-CPU latency
        // histograms alone take 2 GiB on 256 CPUs).
        Config::parse(pins).unwrap().check_host(&host(2, gib)).unwrap();
        Config::parse(pins).unwrap().check_host(&host(256, 8 * gib)).unwrap();
        // 65536 flows on 256 CPUs: 1.8 GiB of flow tables more.
        let e = cfg("max: 65536").check_host(&host(256, 6 * gib)).unwrap_err();
        assert_eq!(e.path, "flows.max", "{e}");
        assert!(e.reason.contains("more than 3.0 GiB, half of the host's memory (6.0 GiB)"), "{e}");
        cfg("max: 65536").check_host(&host(256, 10 * gib)).unwrap();
        let e = cfg("marks_max: 10000000").check_host(&host(2, 2 * gib)).unwrap_err();
        assert_eq!(e.path, "flows.marks_max", "{e}");
        // A cgroup's limit, 256 MiB (the DaemonSet's), less 16 MiB for the agent itself.
        cgroup(2, 256 << 20).check_host_ok(&Config::parse(pins).unwrap());
        cgroup(20, 256 << 20).check_host_ok(&Config::parse(pins).unwrap());
        // On 24 CPUs the defaults take 273 MiB; fewer flows fit.
        let e = Config::parse(pins).unwrap().check_host(&cgroup(24, 256 << 20)).unwrap_err();
        assert_eq!(e.path, "flows.max", "{e}");
        cgroup(24, 256 << 20).check_host_ok(&cfg("max: 4096"));
        let e = cfg("max: 262144").check_host(&cgroup(2, 256 << 20)).unwrap_err();
        assert_eq!(e.path, "flows.max", "{e}");
        assert!(e.reason.contains("more than 240.0 MiB, the memory limit of the agent's cgroup"), "{e}");
        // On 64 CPUs the per-CPU latency histograms alone take more than 256 MiB: no
        // flows.max helps.
        let e = cfg("max: 4096").check_host(&cgroup(64, 256 << 20)).unwrap_err();
        assert_eq!(e.path, "config", "{e}");
        assert!(e.reason.contains("(the largest: latency_hists, "), "{e}");
        let mut small = host(2, gib);
        small.open_files = 300;
        let e = Config::parse(pins).unwrap().check_host(&small).unwrap_err();
        assert_eq!(e.path, "api.max_connections", "{e}");
        assert!(e.reason.contains("RLIMIT_NOFILE"), "{e}");
        let e = Config::parse("bpf:\n  pin_path: /var/tmp/pins\n")
            .unwrap()
            .check_host(&host(2, gib))
            .unwrap_err();
        assert_eq!(e.path, "bpf.pin_path", "{e}");
        assert!(e.reason.contains("not on a BPF filesystem"), "{e}");
    }

    #[test]
    fn include_and_exclude_globs() {
        let i = Interfaces { include: vec!["veth*".into()], exclude: vec!["veth-skip*".into()] };
        assert!(i.matches("veth123"));
        assert!(!i.matches("veth-skip1"));
        assert!(!i.matches("eth0"));
    }
}
