//! mirror-agent and mirrorctl as an operator runs them: the agent in a node namespace with a
//! configuration, socket, state file and pin path of its own; mirrorctl against that socket.
//!
//! The agent is started with `nsenter --net`, not `ip netns exec`: the latter gives it a
//! private mount namespace whose /sys/fs/bpf vanishes with it, so a restarted agent would find
//! no pins to adopt.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::proc::{wait_until, Proc};
use crate::topology::netns::{nsenter, Netns};

/// How long an agent may take to serve its API, and to stop.
const STARTUP: Duration = Duration::from_secs(10);
/// How long mirrorctl may take.
const CTL_TIMEOUT_S: &str = "10";
/// Where test agents pin: `<PIN_ROOT>/<PIN_PREFIX><pid>-<n>`, so stale pins can be told apart.
pub(crate) const PIN_ROOT: &str = "/sys/fs/bpf";
pub(crate) const PIN_PREFIX: &str = "mirror-e2e-";

/// The two binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// mirror-agent.
    pub agent: PathBuf,
    /// mirrorctl.
    pub ctl: PathBuf,
}

impl Binaries {
    /// `$MIRROR_AGENT_BIN` and `$MIRRORCTL_BIN`, else the ones built next to the running
    /// executable (target/<profile>/, also from target/<profile>/deps/).
    pub fn locate() -> Result<Binaries, String> {
        let exe = std::env::current_exe().map_err(|e| format!("locating this executable: {e}"))?;
        let find = |var: &str, name: &str| -> Result<PathBuf, String> {
            if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
                return if p.is_file() { Ok(p) } else { Err(format!("{var}={}: no such file", p.display())) };
            }
            exe.ancestors().skip(1).take(2).map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
                format!(
                    "{name} not found next to {} (cargo build -p mirror-agent, or set {var})",
                    exe.display()
                )
            })
        };
        Ok(Binaries {
            agent: find("MIRROR_AGENT_BIN", "mirror-agent")?,
            ctl: find("MIRRORCTL_BIN", "mirrorctl")?,
        })
    }
}

/// What varies in an agent's configuration; socket, state and pins are always its own, the
/// sink is a veth pair it creates unless told otherwise.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `interfaces.include`.
    pub include: Vec<String>,
    /// `interfaces.exclude`.
    pub exclude: Vec<String>,
    /// `attach.mode`.
    pub attach_mode: String,
    /// `mirror.interface` (its peer, where captures read, adds "p").
    pub sink: String,
    /// `rules`.
    pub rules: Vec<String>,
    /// `mirror.create`: `veth` (the sink is a veth pair the agent creates), or `none`.
    pub sink_create: String,
    /// `metrics.listen` ("": off).
    pub metrics: String,
    /// `metrics.rule_text`.
    pub metrics_rule_text: bool,
    /// More keys of the `api:` section (key, YAML value), such as its connection limits.
    pub api: Vec<(String, String)>,
    /// More top-level sections, as YAML text (e.g. `events:`).
    pub extra: String,
    /// More keys of the `mirror:` section (key, YAML value, flow style for sections), such as
    /// `tunnel` and `budget`.
    pub mirror: Vec<(String, String)>,
    /// `RUST_LOG` of the agent (none: the test's own), for a test that reads a line logged at
    /// debug, e.g. `info,mirror_agent::pods=debug`.
    pub log: Option<String>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            include: vec!["veth*".into()],
            exclude: vec![],
            attach_mode: "auto".into(),
            sink: "mirror0".into(),
            rules: vec![],
            sink_create: "veth".into(),
            metrics: String::new(),
            metrics_rule_text: true,
            api: vec![],
            extra: String::new(),
            mirror: vec![],
            log: None,
        }
    }
}

/// A YAML scalar or flow sequence (JSON is YAML).
fn quote<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("strings serialize")
}

static NEXT_AGENT: AtomicU32 = AtomicU32::new(0);

/// The files of one agent, kept across its restarts; the pin path is removed on drop.
pub struct AgentEnv {
    bins: Binaries,
    /// The node namespace's name and path.
    node: (String, String),
    sink: String,
    log: Option<String>,
    pin_path: PathBuf,
    dir: TempDir,
}

/// What mirrorctl did.
#[derive(Debug)]
pub struct CtlOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl AgentEnv {
    /// Writes the configuration of an agent that is to run in `node`.
    pub fn new(bins: &Binaries, node: &Netns, cfg: &AgentConfig) -> AgentEnv {
        let dir = tempfile::Builder::new().prefix("mirror-agent").tempdir().expect("creating a temp dir");
        let unique = format!("{}-{}", std::process::id(), NEXT_AGENT.fetch_add(1, Ordering::Relaxed));
        let env = AgentEnv {
            bins: bins.clone(),
            node: (node.name().to_string(), node.path()),
            sink: cfg.sink.clone(),
            log: cfg.log.clone(),
            pin_path: Path::new(PIN_ROOT).join(format!("{PIN_PREFIX}{unique}")),
            dir,
        };
        let yaml = format!(
            "interfaces:\n  include: {}\n  exclude: {}\nattach:\n  mode: {}\n\
             mirror:\n  interface: {}\n  create: {}\n{}api:\n  socket: {}\n{}metrics:\n  listen: {}\n  rule_text: {}\n\
             bpf:\n  pin_path: {}\nstate:\n  path: {}\nrules: {}\n{}",
            quote(&cfg.include),
            quote(&cfg.exclude),
            quote(&cfg.attach_mode),
            quote(&cfg.sink),
            quote(&cfg.sink_create),
            cfg.mirror.iter().map(|(k, v)| format!("  {k}: {v}\n")).collect::<String>(),
            quote(&env.socket()),
            cfg.api.iter().map(|(k, v)| format!("  {k}: {v}\n")).collect::<String>(),
            quote(&cfg.metrics),
            cfg.metrics_rule_text,
            quote(&env.pin_path),
            quote(&env.state_path()),
            quote(&cfg.rules),
            cfg.extra,
        );
        std::fs::write(env.config_path(), yaml).expect("writing the agent config");
        env
    }

    /// The configuration file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("agent.yaml")
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }

    /// The state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.yaml")
    }

    /// Where maps and links are pinned.
    pub fn pin_path(&self) -> &Path {
        &self.pin_path
    }

    /// A directory for other files of the test (captures).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The mirror sink.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    /// The sink's peer, where mirrored packets are captured.
    pub fn sink_peer(&self) -> String {
        format!("{}p", self.sink)
    }

    /// Starts the agent (with extra arguments such as `--keep-attached`) and waits until its
    /// API answers; panics with its output if it does not.
    #[track_caller]
    pub fn start(&self, args: &[&str]) -> Agent<'_> {
        self.start_within(args, STARTUP)
    }

    /// Like [`AgentEnv::start`], waiting up to `timeout` for the API (a first start with
    /// thousands of initial rules takes longer).
    #[track_caller]
    pub fn start_within(&self, args: &[&str], timeout: Duration) -> Agent<'_> {
        let mut cmd = nsenter(&self.node.1, &self.bins.agent);
        cmd.arg("--config").arg(self.config_path()).args(args);
        if let Some(log) = &self.log {
            cmd.env("RUST_LOG", log);
        }
        let mut proc = Proc::spawn(&format!("mirror-agent in {}", self.node.0), &mut cmd);
        let socket = self.socket();
        let serving = wait_until(timeout, || UnixStream::connect(&socket).is_ok() || !proc.running());
        assert!(serving && proc.running(), "mirror-agent did not start: {}", proc.output());
        Agent { env: self, proc }
    }

    /// Runs mirrorctl with these arguments against the agent's socket.
    pub fn ctl(&self, args: &[&str]) -> CtlOutput {
        let mut cmd = Command::new("timeout");
        cmd.arg(CTL_TIMEOUT_S).arg(&self.bins.ctl).arg("--socket").arg(self.socket()).args(args);
        let out = cmd.output().unwrap_or_else(|e| panic!("running mirrorctl: {e}"));
        CtlOutput {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs mirrorctl and returns its stdout; panics unless it succeeds.
    #[track_caller]
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(out.status.success(), "mirrorctl {args:?}: {out:?}");
        out.stdout
    }

    /// `mirrorctl -o json status`.
    #[track_caller]
    pub fn status(&self) -> Value {
        let text = self.ctl_ok(&["-o", "json", "status"]);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("status is not JSON ({e}): {text}"))
    }

    /// Names of the interfaces the agent reports as attached.
    #[track_caller]
    pub fn attached(&self) -> Vec<String> {
        let status = self.status();
        let names = status["interfaces"].as_array().unwrap_or_else(|| panic!("no interfaces: {status}"));
        names.iter().filter_map(|i| i["name"].as_str().map(String::from)).collect()
    }
}

impl Drop for AgentEnv {
    fn drop(&mut self) {
        if self.pin_path.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.pin_path) {
                eprintln!("removing {}: {e}", self.pin_path.display());
            }
        }
    }
}

/// A running agent; stopped with SIGTERM on drop (so that it removes what it created).
pub struct Agent<'a> {
    env: &'a AgentEnv,
    proc: Proc,
}

impl Agent<'_> {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// What it logged so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Waits until the agent reports every one of `names` as attached; panics with its log
    /// after `timeout`.
    #[track_caller]
    pub fn wait_attached(&self, names: &[&str], timeout: Duration) {
        let mut attached = Vec::new();
        let done = wait_until(timeout, || {
            attached = self.env.attached();
            names.iter().all(|n| attached.iter().any(|a| a == n))
        });
        assert!(done, "attached {attached:?}, not all of {names:?}: {}", self.output());
    }

    /// Sends `signal` and returns the exit status; panics if it does not exit in time.
    #[track_caller]
    fn halt(&mut self, signal: i32) -> ExitStatus {
        let status = self.proc.stop(signal, STARTUP);
        status.unwrap_or_else(|| panic!("mirror-agent ignored signal {signal}: {}", self.output()))
    }

    /// SIGTERM: the agent detaches and removes what it created (unless told to keep it
    /// attached). Returns its log; panics unless it exits with success.
    #[track_caller]
    pub fn terminate(mut self) -> String {
        let status = self.halt(libc::SIGTERM);
        let log = self.output();
        assert!(status.success(), "mirror-agent exited with {status}: {log}");
        log
    }

    /// SIGKILL: the agent leaves everything as it was.
    #[track_caller]
    pub fn kill(mut self) {
        self.halt(libc::SIGKILL);
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        if self.proc.running() {
            self.proc.stop(libc::SIGTERM, STARTUP);
        }
    }
}
