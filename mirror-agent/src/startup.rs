//! The one line a start logs at info, once the agent is up (its API served and the links
//! present at start attached): what it attached and how, where copies go, its rules, its
//! programs, the maps' memory, where to reach it. Every detail of the start is at debug.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::AgentInfo;
use crate::config::{AttachModeCfg, Config};
use crate::engine::Engine;
use crate::views::{InterfaceView, MirrorView};

/// What the start knows before the agent is up.
#[derive(Debug, Clone)]
pub struct Start {
    /// When the start began.
    pub at: Instant,
    /// Where the configuration came from.
    pub config: String,
    /// The state file the rules were restored from (none: a first start, the configuration's
    /// rules installed).
    pub restored_from: Option<PathBuf>,
    /// Whether the agent follows the cluster's rules.
    pub cluster: bool,
}

/// The agent once up.
#[derive(Debug, Clone)]
pub struct Up {
    /// The start.
    pub start: Start,
    /// How long it took.
    pub took: Duration,
    /// `interfaces.include`, said when nothing matched.
    pub include: Vec<String>,
    /// The attached interfaces.
    pub interfaces: Vec<InterfaceView>,
    /// `attach.mode` is `auto`.
    pub auto: bool,
    /// The data path was adopted from an earlier agent.
    pub adopted: bool,
    /// The sink.
    pub mirror: MirrorView,
    /// Rules installed.
    pub rules: usize,
    /// The protocols followed.
    pub protocols: String,
    /// The data path's programs.
    pub programs: usize,
    /// The maps' kernel memory (none: not known).
    pub maps_bytes: Option<u64>,
    /// The API's socket.
    pub api: PathBuf,
    /// `metrics.listen` ("": off).
    pub metrics: String,
}

/// Logs the line, once the agent is up.
pub async fn say(
    start: Start,
    cfg: &Config,
    engine: &Engine,
    info: &Arc<Mutex<AgentInfo>>,
) -> anyhow::Result<()> {
    let status = engine.status().await?;
    let rules = engine.rules().await?.len();
    let (mirror, memory) = {
        let info = info.lock().expect("info lock");
        (info.mirror.clone(), info.memory.as_ref().map(|m| m.report(status.map_sizes).total_bytes))
    };
    let up = Up {
        took: start.at.elapsed(),
        start,
        include: cfg.interfaces.include.clone(),
        interfaces: status.interfaces,
        auto: cfg.attach.mode == AttachModeCfg::Auto,
        adopted: status.adopted,
        mirror,
        rules,
        protocols: status.protocols,
        programs: status.programs.len(),
        maps_bytes: memory,
        api: cfg.api.socket.clone(),
        metrics: cfg.metrics.listen.clone(),
    };
    tracing::info!("{}", up.line());
    Ok(())
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl Up {
    /// The line, e.g. `mirror-agent 0.1.0 up in 1.5 s: 1 interface attached (tcx); mirror
    /// interface mirror0 (veth, created; copies to mirror0p); 1 rule; protocols http1, http2 in
    /// 7 programs; maps 150.9 MiB of kernel memory; API /run/mirror-agent/api.sock, metrics
    /// 127.0.0.1:9464; cluster rules off; config /etc/mirror-agent/agent.yaml (details:
    /// RUST_LOG=debug)`.
    pub fn line(&self) -> String {
        let mut parts = vec![self.attached(), self.sink(), self.rules()];
        parts.push(format!(
            "protocols {} in {}",
            self.protocols,
            plural(self.programs, "program", "programs")
        ));
        if let Some(bytes) = self.maps_bytes {
            parts.push(format!("maps {} of kernel memory", crate::capacity::human(bytes)));
        }
        let metrics =
            if self.metrics.is_empty() { "metrics off".into() } else { format!("metrics {}", self.metrics) };
        parts.push(format!("API {}, {metrics}", self.api.display()));
        parts.push(format!("cluster rules {}", if self.start.cluster { "followed" } else { "off" }));
        parts.push(format!("config {} (details: RUST_LOG=debug)", self.start.config));
        format!(
            "mirror-agent {} up in {:.1} s: {}",
            env!("CARGO_PKG_VERSION"),
            self.took.as_secs_f64(),
            parts.join("; ")
        )
    }

    /// `1 interface attached (tcx)`, `2 interfaces attached (tc: this kernel has no TCX, the
    /// expected fallback before Linux 6.6)`, or none yet and what would match.
    fn attached(&self) -> String {
        let adopted = if self.adopted { ", the data path adopted from the previous agent" } else { "" };
        if self.interfaces.is_empty() {
            return format!(
                "no interface attached yet (interfaces.include: {}){adopted}",
                self.include.join(", ")
            );
        }
        let mut modes: Vec<&str> = self.interfaces.iter().map(|i| i.mode.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        let how = match modes.as_slice() {
            ["tc"] if self.auto => {
                "tc: this kernel has no TCX, the expected fallback before Linux 6.6".to_string()
            }
            [one] => one.to_string(),
            _ => self
                .interfaces
                .iter()
                .fold(std::collections::BTreeMap::<&str, usize>::new(), |mut m, i| {
                    *m.entry(i.mode.as_str()).or_default() += 1;
                    m
                })
                .iter()
                .map(|(mode, n)| format!("{n} {mode}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        format!("{} attached ({how}){adopted}", plural(self.interfaces.len(), "interface", "interfaces"))
    }

    /// `mirror interface mirror0 (veth, created; copies to mirror0p)`, or absent.
    fn sink(&self) -> String {
        let m = &self.mirror;
        if m.ifindex.is_none() {
            return format!(
                "mirror interface {} absent: copies counted, not made, until it appears",
                m.interface
            );
        }
        let mut what: Vec<String> = m.kind.iter().cloned().collect();
        if m.created {
            what.push("created".into());
        }
        let to = m.copies_to.as_ref().filter(|to| **to != m.interface).map(|to| format!("; copies to {to}"));
        format!("mirror interface {} ({}{})", m.interface, what.join(", "), to.unwrap_or_default())
    }

    /// `1 rule`, `3 rules restored from FILE`, `no rules yet`.
    fn rules(&self) -> String {
        match (self.rules, &self.start.restored_from) {
            (0, None) => "no rules yet (mirrorctl rules add)".into(),
            (n, None) => plural(n, "rule", "rules"),
            (n, Some(file)) => format!("{} restored from {}", plural(n, "rule", "rules"), file.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, mode: &str) -> InterfaceView {
        InterfaceView {
            name: name.into(),
            ifindex: 3,
            mode: mode.into(),
            method: "clone".into(),
            directions: vec!["ingress".into(), "egress".into()],
        }
    }

    fn up() -> Up {
        Up {
            start: Start {
                at: Instant::now(),
                config: "/etc/mirror-agent/agent.yaml".into(),
                restored_from: None,
                cluster: false,
            },
            took: Duration::from_millis(1460),
            include: vec!["veth*".into(), "cali*".into()],
            interfaces: vec![iface("veth-tour", "tcx")],
            auto: true,
            adopted: false,
            mirror: MirrorView {
                interface: "mirror0".into(),
                ifindex: Some(5),
                created: true,
                copies_to: Some("mirror0p".into()),
                delivery: Some("ingress".into()),
                kind: Some("veth".into()),
            },
            rules: 1,
            protocols: "http1, http2".into(),
            programs: 7,
            maps_bytes: Some(158_229_000),
            api: "/run/mirror-agent/api.sock".into(),
            metrics: "127.0.0.1:9464".into(),
        }
    }

    #[test]
    fn one_line_says_what_the_agent_is_up_with() {
        let v = env!("CARGO_PKG_VERSION");
        assert_eq!(
            up().line(),
            format!(
                "mirror-agent {v} up in 1.5 s: 1 interface attached (tcx); mirror interface mirror0 (veth, created; \
                 copies to mirror0p); 1 rule; protocols http1, http2 in 7 programs; maps 150.9 MiB of kernel memory; \
                 API /run/mirror-agent/api.sock, metrics 127.0.0.1:9464; cluster rules off; config \
                 /etc/mirror-agent/agent.yaml (details: RUST_LOG=debug)"
            )
        );
    }

    #[test]
    fn fallbacks_restores_and_absences_are_said_as_such() {
        let mut u = up();
        u.interfaces = vec![iface("veth1", "tc"), iface("veth2", "tc")];
        assert!(u
            .line()
            .contains(": 2 interfaces attached (tc: this kernel has no TCX, the expected fallback"));
        // attach.mode: tc asked for it: no fallback to speak of.
        u.auto = false;
        assert!(u.line().contains(": 2 interfaces attached (tc); "), "{}", u.line());
        u.interfaces.push(iface("veth3", "tcx"));
        assert!(u.line().contains(": 3 interfaces attached (2 tc, 1 tcx); "), "{}", u.line());
        u.interfaces.clear();
        u.adopted = true;
        assert!(u.line().contains(
            ": no interface attached yet (interfaces.include: veth*, cali*), the data path adopted from"
        ));
        u.start.restored_from = Some("/var/lib/mirror-agent/state.yaml".into());
        u.rules = 3;
        assert!(u.line().contains("; 3 rules restored from /var/lib/mirror-agent/state.yaml; "));
        u.start.restored_from = None;
        u.rules = 0;
        assert!(u.line().contains("; no rules yet (mirrorctl rules add); "));
        u.mirror.ifindex = None;
        assert!(u
            .line()
            .contains("; mirror interface mirror0 absent: copies counted, not made, until it appears; "));
        // A dummy sink the operator made: copies go to it.
        u.mirror = MirrorView {
            ifindex: Some(9),
            created: false,
            copies_to: Some("mirror0".into()),
            kind: Some("dummy".into()),
            ..u.mirror
        };
        assert!(u.line().contains("; mirror interface mirror0 (dummy); "), "{}", u.line());
        u.metrics.clear();
        u.start.cluster = true;
        assert!(u.line().contains(", metrics off; cluster rules followed; "), "{}", u.line());
    }
}
