//! The configurations compared, set up around one run of a load and torn down after it,
//! each checked to have done what it stands for (the agent saw the traffic and triggered or
//! not, the static mirror and tcpdump copied packets).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mirror_e2e::proc::Proc;
use mirror_e2e::topology::netns::{Netns, MIRROR_DEV};

use super::agent::{AgentSpec, Agents, Method, Rules, Timing};
use super::loads::{Load, Sample};
use super::topology::Bed;

/// What is running on the node besides the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// Nothing: the baseline.
    NoAgent,
    /// Empty clsact qdiscs on the pod veths.
    Qdiscs,
    /// mirror-agent.
    Agent(AgentSpec),
    /// clsact on the pod veths and, on the server's veth, a filter with `action mirred egress
    /// mirror` copying the service port's traffic to a sink: the classic static mirror.
    StaticMirror,
    /// tcpdump on the server's veth, the service port, written to a file.
    Tcpdump,
}

/// A configuration: its letter in the report, what it is, and how to set it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub key: &'static str,
    pub label: &'static str,
    pub setup: Setup,
}

const fn agent(key: &'static str, label: &'static str, rules: Rules, method: Method) -> Config {
    timed(key, label, rules, method, Timing::Default)
}

const fn timed(
    key: &'static str,
    label: &'static str,
    rules: Rules,
    method: Method,
    timing: Timing,
) -> Config {
    Config { key, label, setup: Setup::Agent(AgentSpec { rules, method, timing, replays: true }) }
}

impl Config {
    /// The same agent with `mirror.replay_requests: 0` (other setups unchanged).
    /// The same agent with `rules`.
    pub fn with_rules(&self, rules: Rules) -> Config {
        match self.setup {
            Setup::Agent(spec) => Config { setup: Setup::Agent(AgentSpec { rules, ..spec }), ..*self },
            _ => *self,
        }
    }

    pub fn without_replays(&self) -> Config {
        match self.setup {
            Setup::Agent(spec) => {
                Config { setup: Setup::Agent(AgentSpec { replays: false, ..spec }), ..*self }
            }
            _ => *self,
        }
    }
}

pub const NO_AGENT: Config = Config { key: "a", label: "no agent (baseline)", setup: Setup::NoAgent };
pub const QDISCS: Config = Config { key: "b", label: "clsact qdiscs only", setup: Setup::Qdiscs };
pub const PASS: Config = agent("c", "agent, 1 rule, nothing triggered", Rules::Pass(1), Method::Clone);
pub const PASS_100: Config =
    agent("c100", "agent, 100 rules, nothing triggered", Rules::Pass(100), Method::Clone);
pub const PASS_10K: Config =
    agent("c10k", "agent, 10,000 rules, nothing triggered", Rules::Pass(10_000), Method::Clone);
pub const MIRROR: Config = agent("d", "agent mirroring the 500s (clone, TCX)", Rules::Mirror, Method::Clone);
pub const STATIC: Config =
    Config { key: "e", label: "static tc mirror of the port", setup: Setup::StaticMirror };
pub const TCPDUMP: Config =
    Config { key: "f", label: "tcpdump of the port to a file", setup: Setup::Tcpdump };
pub const MIRRED: Config = agent("g", "agent mirroring, mirred method (tc)", Rules::Mirror, Method::MirredTc);
pub const CLONE_TC: Config =
    agent("g'", "agent mirroring, clone method (tc)", Rules::Mirror, Method::CloneTc);
pub const TIMING_OFF: Config =
    timed("h0", "agent passing, HTTP and handshake timing off", Rules::Pass(1), Method::Clone, Timing::Off);
pub const STACK: Config =
    timed("hs", "agent passing, + kernel stack latency group", Rules::Pass(1), Method::Clone, Timing::Stack);
pub const CPU: Config =
    timed("hc", "agent passing, + network-stack CPU group", Rules::Pass(1), Method::Clone, Timing::Cpu);

/// What a configuration did during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observed {
    /// Packets copied (mirrored by the agent, sent to the static mirror's sink, captured by
    /// tcpdump).
    pub copies: u64,
    /// Copies lost (agent copy errors, tcpdump's kernel drops).
    pub lost: u64,
}

/// Filter kind of the static mirror: matchall where the kernel has it, else u32 on the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticFilter {
    Matchall,
    U32,
}

impl StaticFilter {
    /// Tries a matchall filter on a scratch veth pair in `ns`.
    pub fn probe(ns: &Netns) -> StaticFilter {
        let ok = ns
            .command("sh")
            .arg("-c")
            .arg(
                "ip link add mbprobe0 type veth peer name mbprobe1 && tc qdisc add dev mbprobe0 clsact \
                 && tc filter add dev mbprobe0 ingress matchall action mirred egress mirror dev mbprobe1; \
                 rc=$?; ip link del mbprobe0; exit $rc",
            )
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            StaticFilter::Matchall
        } else {
            StaticFilter::U32
        }
    }

    /// For the report.
    pub fn describe(self) -> &'static str {
        match self {
            StaticFilter::Matchall => "matchall on the server's veth (it carries only the service)",
            StaticFilter::U32 => {
                "u32 on the service port (`match ip sport P` at ingress, `dport P` at egress; \
                 matchall is not built into this kernel)"
            }
        }
    }
}

/// What every run needs.
pub struct Ctx<'a> {
    pub bed: &'a Bed,
    pub agents: Agents<'a>,
    pub static_filter: StaticFilter,
}

/// Runs `load` for `secs` under `cfg`.
pub fn run(cfg: &Config, ctx: &Ctx<'_>, load: Load, secs: u32) -> Result<(Sample, Observed)> {
    let bed = ctx.bed;
    let veths = bed.pod_veths();
    match cfg.setup {
        Setup::NoAgent => Ok((load.run(bed, secs)?, Observed::default())),
        Setup::Qdiscs => {
            let _q = Clsact::add(bed.node(), &veths)?;
            Ok((load.run(bed, secs)?, Observed::default()))
        }
        Setup::StaticMirror => {
            let _q = Clsact::add(bed.node(), &veths)?;
            add_static_mirror(bed, ctx.static_filter, load.port())?;
            let before = tx_packets(bed.node(), MIRROR_DEV)?;
            let sample = load.run(bed, secs)?;
            let copies = tx_packets(bed.node(), MIRROR_DEV)? - before;
            ensure!(copies > 0, "the static mirror copied nothing");
            Ok((sample, Observed { copies, lost: 0 }))
        }
        Setup::Tcpdump => {
            let dump = Tcpdump::start(bed, load.port())?;
            let sample = load.run(bed, secs)?;
            let seen = dump.stop()?;
            ensure!(seen.copies > 0, "tcpdump captured nothing");
            Ok((sample, seen))
        }
        Setup::Agent(spec) => {
            let (sample, c) = ctx.agents.run(spec, &veths, |_| load.run(bed, secs))?;
            let get = |k: &str| c.get(k).copied().unwrap_or(0);
            ensure!(get("packets") > 0, "the classifier saw no packet: {c:?}");
            match spec.rules {
                Rules::Pass(_) | Rules::Triggers => {
                    ensure!(get("triggers") == 0, "a rule that matches nothing triggered: {c:?}")
                }
                Rules::Mirror if matches!(load, Load::Http { errors_pct } | Load::H2 { errors_pct } if errors_pct > 0) =>
                {
                    ensure!(get("mirrored_packets") > 0, "nothing was mirrored: {c:?}")
                }
                Rules::Mirror => {}
            }
            let lost = get("mirror_errors") + get("mirror_no_target");
            Ok((sample, Observed { copies: get("mirrored_packets"), lost }))
        }
    }
}

/// clsact qdiscs added to links, deleted on drop.
struct Clsact<'a> {
    ns: &'a Netns,
    devs: Vec<String>,
}

impl<'a> Clsact<'a> {
    fn add(ns: &'a Netns, devs: &[&str]) -> Result<Clsact<'a>> {
        let mut q = Clsact { ns, devs: Vec::new() };
        for dev in devs {
            sh(ns, &format!("tc qdisc add dev {dev} clsact"))?;
            q.devs.push(dev.to_string());
        }
        Ok(q)
    }
}

impl Drop for Clsact<'_> {
    fn drop(&mut self) {
        // Deleting the qdisc deletes its filters too.
        for dev in &self.devs {
            if let Err(e) = sh(self.ns, &format!("tc qdisc del dev {dev} clsact")) {
                eprintln!("{e:#}");
            }
        }
    }
}

/// Copies the server's traffic on `port`, both directions, to the spare sink `mir0`: at the
/// ingress of the server's veth what the server sends, at its egress what it receives.
fn add_static_mirror(bed: &Bed, filter: StaticFilter, port: u16) -> Result<()> {
    let dev = &bed.server().veth;
    let action = format!("action mirred egress mirror dev {MIRROR_DEV}");
    for (hook, dir) in [("ingress", "sport"), ("egress", "dport")] {
        let sel = match filter {
            StaticFilter::Matchall => "matchall".to_string(),
            StaticFilter::U32 => format!("protocol ip u32 match ip {dir} {port} 0xffff"),
        };
        sh(bed.node(), &format!("tc filter add dev {dev} {hook} prio 1 {sel} {action}"))?;
    }
    Ok(())
}

fn tx_packets(ns: &Netns, dev: &str) -> Result<u64> {
    let text = sh(ns, &format!("cat /sys/class/net/{dev}/statistics/tx_packets"))?;
    text.trim().parse().with_context(|| format!("tx_packets of {dev}: {text}"))
}

/// A shell command in `ns`; its stdout, or an error with its output.
fn sh(ns: &Netns, cmd: &str) -> Result<String> {
    let mut sh = ns.command("sh");
    sh.arg("-c").arg(cmd);
    let out = super::cmd::run(sh, cmd)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// tcpdump as an operator runs it to catch errors without a mirror: everything on the port,
/// whole packets, written to a file (a ring of two files of 256 MB bounds the disk used).
struct Tcpdump {
    proc: Proc,
    dir: tempfile::TempDir,
}

impl Tcpdump {
    fn start(bed: &Bed, port: u16) -> Result<Tcpdump> {
        let dir = tempfile::Builder::new().prefix("capture").tempdir_in(bed.dir.path())?;
        let mut cmd = bed.node().command("tcpdump");
        // -Z root: tcpdump would otherwise drop to a user that cannot write our temp dir.
        cmd.args(["-i", &bed.server().veth, "-nn", "-s", "0", "-Z", "root", "-C", "256", "-W", "2", "-w"])
            .arg(dir.path().join("capture.pcap"))
            .arg(format!("tcp port {port}"));
        let mut proc = Proc::spawn("tcpdump on the server's veth", &mut cmd);
        proc.wait_for_output("listening on", Duration::from_secs(5));
        Ok(Tcpdump { proc, dir })
    }

    /// Stops it (SIGINT: it flushes and prints its statistics) and removes the capture.
    fn stop(mut self) -> Result<Observed> {
        self.proc.stop(libc::SIGINT, Duration::from_secs(10));
        let out = self.proc.output();
        let count = |suffix: &str| -> Result<u64> {
            out.lines()
                .find_map(|l| l.strip_suffix(suffix)?.trim().parse().ok())
                .with_context(|| format!("no '{suffix}' in tcpdump's output: {out}"))
        };
        let seen =
            Observed { copies: count(" packets captured")?, lost: count(" packets dropped by kernel")? };
        drop(self.dir);
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique() {
        // Every configuration a plan runs, under any load or as a profile.
        let mut all: Vec<Config> = Vec::new();
        for plan in [crate::traffic::Plan::full(), crate::traffic::Plan::quick()] {
            let planned = plan.cells.iter().flat_map(|(_, c)| c.iter().copied());
            for cfg in planned.chain(plan.profiles.iter().map(|(_, c)| *c)) {
                if !all.contains(&cfg) {
                    all.push(cfg);
                }
            }
        }
        assert_eq!(all.len(), 13, "{:?}", all.iter().map(|c| c.key).collect::<Vec<_>>());
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b.key != a.key), "{}", a.key);
        }
    }
}
