//! mirror-agent as the benchmark runs it, through the end-to-end harness: in the node
//! namespace with `nsenter --net` (so that pins land on the host's bpffs), with a config,
//! API socket, state file and pin path of its own (removed afterwards), its sink created as a
//! veth pair and metrics off.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use mirror_e2e::agent::{AgentConfig, AgentEnv, Binaries};
use mirror_e2e::topology::netns::Netns;
use serde_json::Value;

/// How the agent copies packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// bpf_clone_redirect, attach mode auto (TCX on this kernel): the default configuration.
    Clone,
    /// bpf_clone_redirect from clsact + cls_bpf (attach.mode: tc).
    CloneTc,
    /// A classic cls_bpf filter with an act_mirred action (mirror.method: mirred, tc mode).
    MirredTc,
}

/// Which rules it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// This many rules that no response matches.
    Pass(u32),
    /// One rule that mirrors every flow answered 500, without limits.
    Mirror,
    /// The one rule of `Pass(1)` and one of each other kind, none of which the load meets: a
    /// reset rule (the load closes with FINs), a noresponse rule (every request is answered
    /// within it: each connection's timer runs, and fires once per its time), and a status rule
    /// with request filters (no response has its status). What the triggers of another kind
    /// cost the common path.
    Triggers,
}

/// The agent of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentSpec {
    pub rules: Rules,
    pub method: Method,
    pub timing: Timing,
    /// Whether requests are kept for replays (`mirror.replay_requests`, on by default).
    pub replays: bool,
}

/// Which measurement groups are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// The defaults: HTTP response and handshake times.
    Default,
    /// None: what the HTTP and handshake timing cost.
    Off,
    /// The defaults and the kernel stack latency group (tracing programs).
    Stack,
    /// The defaults and the network-stack CPU group (tracing programs).
    Cpu,
}

impl Timing {
    /// The `latency:` section of the agent's configuration.
    fn yaml(self) -> String {
        let timed = self != Timing::Off;
        format!(
            "latency:\n  http: {timed}\n  handshake: {timed}\n  stack: {}\n  cpu: {}\n",
            self == Timing::Stack,
            self == Timing::Cpu
        )
    }
}

/// Mirrors a flow from its first 500 on, for as long as it lasts.
pub const MIRROR_RULE: &str = "status=500 packets=0 bytes=0 duration=0";
/// Rules beyond the first are scoped to the ports after this one, never the HTTP service's.
pub const FIRST_RULE_PORT: u32 = 1000;

impl Rules {
    /// The rule texts: for `Pass(n)`, the global `status=599` (no server here answers it) and
    /// n-1 rules `port=P status=500` on ports 1001.. (not the HTTP port: no response matches
    /// them, but each response's status is looked up among them).
    pub fn texts(self) -> Vec<String> {
        match self {
            Rules::Mirror => vec![MIRROR_RULE.into()],
            Rules::Triggers => [
                "status=599",
                "reset",
                "noresponse>2s",
                "status=598 method=POST path=/api/ host=shop.example",
            ]
            .map(String::from)
            .to_vec(),
            Rules::Pass(n) => std::iter::once("status=599".to_string())
                .chain((1..n).map(|i| format!("port={} status=500", FIRST_RULE_PORT + i)))
                .collect(),
        }
    }
}

impl AgentSpec {
    /// The harness's configuration for this spec, attaching to `include`.
    fn config(self, include: &[&str]) -> AgentConfig {
        AgentConfig {
            include: include.iter().map(|s| s.to_string()).collect(),
            attach_mode: if self.method == Method::Clone { "auto" } else { "tc" }.into(),
            rules: self.rules.texts(),
            ..AgentConfig::default()
        }
    }
}

/// Writes the agent's files for `spec` (not started yet).
pub fn env(bins: &Binaries, node: &Netns, spec: AgentSpec, include: &[&str]) -> Result<AgentEnv> {
    let env = AgentEnv::new(bins, node, &spec.config(include));
    if spec.method == Method::MirredTc {
        set_mirror_key(&env.config_path(), "method", "mirred")?;
    }
    if !spec.replays {
        set_mirror_key(&env.config_path(), "replay_requests", "0")?;
    }
    // The harness's AgentConfig has no `latency:` section either: appended.
    let config = env.config_path();
    let yaml = std::fs::read_to_string(&config)?;
    ensure!(!yaml.contains("\nlatency:"), "{} has a latency section already", config.display());
    std::fs::write(&config, format!("{yaml}{}", spec.timing.yaml()))?;
    Ok(env)
}

/// The harness's AgentConfig has no `mirror.method` nor `mirror.replay_requests`: adds
/// `key: value` to the `mirror:` section of the written file.
fn set_mirror_key(config: &Path, key: &str, value: &str) -> Result<()> {
    let yaml = std::fs::read_to_string(config)?;
    let patched = yaml.replacen("mirror:\n", &format!("mirror:\n  {key}: {value}\n"), 1);
    ensure!(patched != yaml, "no mirror: section in {}", config.display());
    Ok(std::fs::write(config, patched)?)
}

/// Adds `key: value` to the `attach:` section of the written configuration.
pub fn set_attach_key(config: &Path, key: &str, value: &str) -> Result<()> {
    let yaml = std::fs::read_to_string(config)?;
    let patched = yaml.replacen("attach:\n", &format!("attach:\n  {key}: {value}\n"), 1);
    ensure!(patched != yaml, "no attach: section in {}", config.display());
    Ok(std::fs::write(config, patched)?)
}

/// The agents of a benchmark: one set of files per spec, kept across runs, so that the first
/// start adds the initial rules and later ones restore them from the state file.
pub struct Agents<'a> {
    bins: &'a Binaries,
    node: &'a Netns,
    envs: RefCell<Vec<(AgentSpec, Rc<AgentEnv>)>>,
    starts: RefCell<Vec<(AgentSpec, Vec<f64>)>>,
    /// The CPU the agent's threads are pinned to, if any.
    cpu: Option<usize>,
}

/// How long a first start may take (10,000 initial rules), and a later one.
const FIRST_START: Duration = Duration::from_secs(900);
const RESTART: Duration = Duration::from_secs(120);

impl<'a> Agents<'a> {
    pub fn new(bins: &'a Binaries, node: &'a Netns, cpu: Option<usize>) -> Self {
        Agents { bins, node, envs: RefCell::default(), starts: RefCell::default(), cpu }
    }

    /// Starts the agent for `spec` attached to `veths`, runs `body` with its pid, and returns
    /// what `body` returned and the classifier's counters after it. The agent is stopped with
    /// SIGTERM (it detaches and removes its sink) and must exit cleanly.
    pub fn run<T>(
        &self,
        spec: AgentSpec,
        veths: &[&str],
        body: impl FnOnce(u32) -> Result<T>,
    ) -> Result<(T, BTreeMap<String, u64>)> {
        let known = self.envs.borrow().iter().find(|(s, _)| *s == spec).map(|(_, e)| Rc::clone(e));
        let (env, timeout) = match known {
            Some(env) => (env, RESTART),
            None => {
                let env = Rc::new(env(self.bins, self.node, spec, veths)?);
                self.envs.borrow_mut().push((spec, Rc::clone(&env)));
                (env, FIRST_START)
            }
        };
        let started = Instant::now();
        let agent = env.start_within(&[], timeout);
        agent.wait_attached(veths, Duration::from_secs(20));
        if let Some(cpu) = self.cpu {
            super::cmd::pin_threads(&agent.pid().to_string(), cpu)?;
        }
        let start_s = started.elapsed().as_secs_f64();
        let mut starts = self.starts.borrow_mut();
        match starts.iter_mut().find(|(s, _)| *s == spec) {
            Some((_, times)) => times.push(start_s),
            None => starts.push((spec, vec![start_s])),
        }
        drop(starts);
        check_attachments(&env.status(), spec)?;
        let out = body(agent.pid());
        let counters = counters(&env.status());
        agent.terminate();
        Ok((out?, counters?))
    }

    /// Seconds from starting the agent to all its veths attached, per spec, in start order.
    pub fn start_times(&self) -> Vec<(AgentSpec, Vec<f64>)> {
        self.starts.borrow().clone()
    }
}

/// The attachments are of the kind the spec asks for.
fn check_attachments(status: &Value, spec: AgentSpec) -> Result<()> {
    let want_method = if spec.method == Method::MirredTc { "mirred" } else { "clone" };
    for i in status["interfaces"].as_array().context("status has no interfaces")? {
        let (mode, method) = (i["mode"].as_str().unwrap_or("?"), i["method"].as_str().unwrap_or("?"));
        let mode_ok = spec.method == Method::Clone || mode == "tc";
        ensure!(
            mode_ok && method == want_method,
            "{} attached as {mode}/{method}, not as {spec:?} asks",
            i["name"]
        );
    }
    Ok(())
}

/// The classifier's counters from `mirrorctl -o json status`.
pub fn counters(status: &Value) -> Result<BTreeMap<String, u64>> {
    let map = status["counters"].as_object().ok_or_else(|| anyhow!("status has no counters: {status}"))?;
    Ok(map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect())
}

/// mirror-agent and mirrorctl, copied aside for the whole run so that a rebuild in the shared
/// target directory cannot swap the agent between runs.
pub struct Tools {
    pub bins: Binaries,
    _dir: tempfile::TempDir,
}

/// Locates mirror-agent and mirrorctl (`MIRROR_AGENT_BIN` and `MIRRORCTL_BIN`, else next to
/// this executable). Under `cargo run` (CARGO is set) and without those variables they are
/// built first in this executable's profile, so that the agent measured is this tree's.
pub fn binaries() -> Result<Tools> {
    let overridden =
        std::env::var_os("MIRROR_AGENT_BIN").is_some() && std::env::var_os("MIRRORCTL_BIN").is_some();
    if let (Some(cargo), false) = (std::env::var_os("CARGO"), overridden) {
        let exe = std::env::current_exe()?;
        let release = exe.parent().and_then(Path::file_name).is_some_and(|d| d == "release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "mirror-agent", "--bins"]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().context("building mirror-agent")?;
        ensure!(status.success(), "building mirror-agent failed");
    }
    let found = Binaries::locate().map_err(|e| anyhow!(e))?;
    let dir = tempfile::Builder::new().prefix("mirror-bench-bin").tempdir()?;
    let copy = |from: &Path, name: &str| -> Result<std::path::PathBuf> {
        let to = dir.path().join(name);
        std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        Ok(to)
    };
    let bins = Binaries { agent: copy(&found.agent, "mirror-agent")?, ctl: copy(&found.ctl, "mirrorctl")? };
    Ok(Tools { bins, _dir: dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_sets() {
        assert_eq!(Rules::Pass(1).texts(), ["status=599"]);
        let many = Rules::Pass(10_000).texts();
        assert_eq!(many.len(), 10_000);
        assert_eq!(many[1], "port=1001 status=500");
        assert_eq!(many[9_999], "port=10999 status=500");
        assert_eq!(Rules::Mirror.texts(), [MIRROR_RULE]);
    }

    #[test]
    fn method_goes_into_the_mirror_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, "attach:\n  mode: \"tc\"\nmirror:\n  interface: \"mirror0\"\n  create: veth\n")
            .unwrap();
        set_mirror_key(&path, "method", "mirred").unwrap();
        let yaml = std::fs::read_to_string(&path).unwrap();
        assert!(yaml.contains("mirror:\n  method: mirred\n  interface: \"mirror0\"\n"), "{yaml}");
        std::fs::write(&path, "rules: []\n").unwrap();
        assert!(set_mirror_key(&path, "method", "mirred").is_err());
    }

    #[test]
    fn counters_from_status() {
        let status: Value = serde_json::from_str(r#"{"counters": {"packets": 10, "triggers": 0}}"#).unwrap();
        let c = counters(&status).unwrap();
        assert_eq!((c["packets"], c["triggers"]), (10, 0));
        assert!(counters(&Value::Null).is_err());
    }
}
