//! What a configuration must be wherever it runs: names the kernel takes, paths within its
//! limits, values within their bounds, settings that go together, rules that parse and fit
//! the classifier. [`Config::parse`] runs it; the checks against this host are in `host.rs`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use mirror_bpf::rule::capacity::{fits, Capacity};
use mirror_bpf::{DatapathOptions, Protocols};

use super::{err, AttachModeCfg, Config, ConfigError, DeliverCfg, FlowsMax, MethodCfg, SinkCreate};
use crate::capacity::HASH_MAX_ENTRIES;

/// The longest of the API's timeouts.
const MAX_API_TIMEOUT: Duration = Duration::from_secs(3600);

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

impl Config {
    /// Every check of the configuration that does not depend on the host.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.recorder.check()?;
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
        self.cluster.validate()?;
        self.mirror.budget.validate()?;
        self.dns.validate()?;
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
        DatapathOptions::check_replay_requests(self.mirror.replay_requests)
            .map_err(|why| err("mirror.replay_requests", why))?;
        let protocols = self.protocol_set()?;
        if self.latency.stack_sample == 0 {
            return Err(err("latency.stack_sample", "must be at least 1 (1: every packet)"));
        }
        self.validate_rules(protocols)
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

    /// Each rule parses within the agent's bounds, needs no protocol `protocols` leaves out,
    /// none is given twice, and all fit the classifier's rule maps at once.
    fn validate_rules(&self, protocols: Protocols) -> Result<(), ConfigError> {
        let mut parsed = Vec::with_capacity(self.rules.len());
        let mut seen = HashMap::with_capacity(self.rules.len());
        for (i, text) in self.rules.iter().enumerate() {
            let rule = crate::rules::parse(text).map_err(|e| err(format!("rules[{i}]"), e.to_string()))?;
            protocols
                .admits(&rule)
                .map_err(|why| err(format!("rules[{i}]"), format!("rule '{text}' {why}")))?;
            if let Some(first) = seen.insert(rule.clone(), i) {
                return Err(err(
                    format!("rules[{i}]"),
                    format!("the same rule as rules[{first}] ({rule}): give it once"),
                ));
            }
            parsed.push(rule);
        }
        fits(&parsed, Capacity::classifier()).map_err(|e| err("rules", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::assert_refused;

    #[test]
    fn bad_configs_name_the_key() {
        assert_refused(&[
            ("flows:\n  max: 10\n", "flows.max", "at least 64"),
            ("flows:\n  marks_max: 4294967295\n", "flows.marks_max", "the most entries the kernel gives"),
            ("flows:\n  max: 268435457\n", "flows.max", "268435456"),
            ("mirror:\n  interface: \"..\"\n", "mirror.interface", "not a link name"),
            ("mirror:\n  replay_requests: 1000\n", "mirror.replay_requests", "a power of two"),
            (
                "protocols: [http1, http3]\n",
                "protocols[1]",
                "unknown protocol 'http3' (one of: http1, http2, dns)",
            ),
            ("protocols: [http2]\n", "protocols", "http2 needs http1"),
            (
                "protocols: [http1, http2]\nrules: [\"status=500\", \"dns=servfail qname=.svc.cluster.local\"]\n",
                "rules[1]",
                "rule 'dns=servfail qname=.svc.cluster.local' needs the dns protocol, which the setting protocols: [http1, http2] leaves out",
            ),
            ("protocols: [dns]\nrules: [\"noresponse>2s\", \"status=5xx\"]\n", "rules[1]", "needs the http1 protocol"),
            ("mirror:\n  replay_requests: 1048576\n", "mirror.replay_requests", "65536"),
            ("mirror:\n  interface: \"m\\t0\"\n", "mirror.interface", "not a link name"),
            (
                "rules: [\"status=500\", \"status=5xx\", \"status=500 packets=10k\"]\n",
                "rules[2]",
                "same rule as rules[0]",
            ),
            ("rules: [\"status=500 duration=99999999999999h\"]\n", "rules[0]", "longer than 24h"),
            ("api:\n  idle_timeout: 30s\n", "api.idle_timeout", "longer than api.request_timeout"),
            ("api:\n  max_connections: 0\n", "api.max_connections", "outside"),
            ("api:\n  header_timeout: 2h\n", "api.header_timeout", "at most 1h"),
            ("rules: [\"status=500\", \"status=999\"]\n", "rules[1]", "outside"),
            ("metrics:\n  listen: here\n", "metrics.listen", "here"),
            ("interfaces:\n  include: [\"veth[\"]\n", "interfaces.include[0]", "bad glob"),
            ("api:\n  socket: relative.sock\n", "api.socket", "absolute"),
            ("attach:\n  mode: tcx\nmirror:\n  method: mirred\n", "mirror.method", "mirred"),
            ("mirror:\n  interface: a-very-long-name0\n", "mirror.interface", "1-15"),
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
            ("pods:\n  cri: [run/crio.sock]\n", "pods.cri[0]", "absolute"),
            ("pods:\n  cri_timeout: 5m\n", "pods.cri_timeout", "at most 60s"),
            ("pods:\n  labels: [app, \"team name\"]\n", "pods.labels[1]", "not a label key"),
            ("pods:\n  labels: [app.name, app_name]\n", "pods.labels[1]", "label_app_name"),
        ]);
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
}
