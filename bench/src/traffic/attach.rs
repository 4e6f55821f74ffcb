//! Attaching at scale: a running agent, then N veth pairs created at once in its node
//! namespace (as pods appear); the time until the agent reports all N attached, its own
//! per-link attach latency (link event received to classifier attached), and its resident
//! memory and CPU time.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use mirror_e2e::agent::Binaries;
use mirror_e2e::topology::netns::Netns;
use serde_json::Value;

use super::agent::{self, AgentSpec, Method, Rules, Timing};
use super::footprint::Footprint;

/// One measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachRun {
    pub veths: usize,
    /// The attach mode the agent reported: "tcx" or "tc".
    pub mode: String,
    /// How long `ip -batch` took to create the links while the agent attached: TCX holds the
    /// kernel's RTNL lock through an RCU grace period per hook, so other link changes wait.
    pub create_s: f64,
    /// From the creation of the links to all of them reported attached.
    pub all_attached_s: f64,
    /// The agent's attach latency, ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Before the links appear.
    pub idle: Footprint,
    /// Once all are attached.
    pub attached: Footprint,
    /// From deleting the links to the agent listing none.
    pub all_gone_s: f64,
}

impl AttachRun {
    /// CPU time the agent spent attaching.
    pub fn cpu_s(&self) -> f64 {
        self.attached.cpu_s - self.idle.cpu_s
    }
}

/// How long all links may take.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(180);
/// Status polls cost the agent a little CPU too: not more often than this.
const POLL: Duration = Duration::from_millis(100);

/// The agents measured: attach mode auto (TCX where the kernel has it), and tc.
pub const METHODS: [Method; 2] = [Method::Clone, Method::CloneTc];

/// Measures `veths` links appearing under a running agent, in a namespace of its own.
pub fn measure(bins: &Binaries, veths: usize, method: Method) -> Result<AttachRun> {
    measure_with(bins, veths, method, true)
}

/// [`measure`] with `attach.expedite_rcu` set as given (the agent's default is on).
pub fn measure_with(bins: &Binaries, veths: usize, method: Method, expedite_rcu: bool) -> Result<AttachRun> {
    let node = Netns::new("attach");
    let spec = AgentSpec { rules: Rules::Pass(1), method, timing: Timing::Default, replays: true };
    let env = agent::env(bins, &node, spec, &["vethb*"])?;
    agent::set_attach_key(&env.config_path(), "expedite_rcu", &expedite_rcu.to_string())?;
    let agent = env.start(&[]);
    // Let the start settle (sink, rules) before the idle reading.
    std::thread::sleep(Duration::from_millis(500));
    let idle = Footprint::of(agent.pid())?;

    let batch = |name: &str, text: String| -> Result<()> {
        let file = env.dir().join(name);
        std::fs::write(&file, text)?;
        let mut cmd = node.command("ip");
        cmd.arg("-batch").arg(&file);
        super::cmd::run(cmd, &format!("ip -batch {name}")).map(drop)
    };
    // Polls the status until `done` holds for the number attached; returns it and the time.
    let until = |done: &dyn Fn(usize) -> bool, since: Instant| -> Result<(serde_json::Value, f64)> {
        loop {
            let status = env.status();
            let attached = attached_count(&status);
            if done(attached) {
                return Ok((status, since.elapsed().as_secs_f64()));
            }
            if since.elapsed() > ATTACH_TIMEOUT {
                bail!("{attached} of {veths} veths attached after {ATTACH_TIMEOUT:?}: {}", agent.output());
            }
            std::thread::sleep(POLL);
        }
    };
    let start = Instant::now();
    batch("add.batch", node_batch(veths))?;
    let create_s = start.elapsed().as_secs_f64();
    let (status, all_attached_s) = until(&|n| n >= veths, start)?;
    let attached = Footprint::of(agent.pid())?;
    let lat = &status["attach_latency"];
    let ms = |k: &str| lat[k].as_f64().with_context(|| format!("no attach_latency.{k}: {lat}"));
    let count = lat["count"].as_u64().unwrap_or(0);
    ensure!(count >= veths as u64, "the agent timed {count} attachments of {veths}: {status}");
    let mode = status["interfaces"][0]["mode"].as_str().context("no attach mode in the status")?.to_string();
    let run = AttachRun {
        veths,
        mode,
        create_s,
        all_attached_s,
        p50_ms: ms("p50_ms")?,
        p99_ms: ms("p99_ms")?,
        max_ms: ms("max_ms")?,
        idle,
        attached,
        all_gone_s: 0.0,
    };
    // The links go before the agent: a SIGTERM would otherwise detach 1,000 links in turn,
    // longer than the harness waits for an exit.
    let start = Instant::now();
    batch("del.batch", (0..veths).map(|i| format!("link del vethb{i}\n")).collect())?;
    let (_, all_gone_s) = until(&|n| n == 0, start)?;
    agent.terminate();
    Ok(AttachRun { all_gone_s, ..run })
}

/// `ip -batch` lines creating `n` veth pairs `vethbI`/`pbI`, both ends up (a CNI brings the
/// host side up; the peer stays in the node here, which the agent ignores).
fn node_batch(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!("link add vethb{i} type veth peer name pb{i}\nlink set vethb{i} up\nlink set pb{i} up\n")
        })
        .collect()
}

/// Interfaces in `mirrorctl -o json status`.
fn attached_count(status: &Value) -> usize {
    status["interfaces"].as_array().map_or(0, Vec::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_lines() {
        assert_eq!(
            node_batch(1),
            "link add vethb0 type veth peer name pb0\nlink set vethb0 up\nlink set pb0 up\n"
        );
    }

    #[test]
    fn status_shape() {
        let s: Value =
            serde_json::from_str(r#"{"interfaces": [{"name": "vethb0"}, {"name": "vethb1"}]}"#).unwrap();
        assert_eq!(attached_count(&s), 2);
    }
}
