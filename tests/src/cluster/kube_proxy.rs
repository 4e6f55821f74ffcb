//! kube-proxy on the cluster's node ([`crate::cluster::single_node`]), in the node's network
//! namespace (its rules end with it), in either of its Linux modes: `nftables` (its own
//! table) or `iptables` (`KUBE-` chains). [`KubeProxy::switch`] changes the mode within a run
//! as an operator would: kube-proxy stopped, `kube-proxy --cleanup` (which removes the rules
//! of every mode), started again in the other mode; the Services answer again once it has
//! written its rules.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::containerd::POD_SUBNET4;
use crate::cluster::control_plane::binaries;
use crate::proc::{wait_until, Proc};
use crate::topology::netns::{nsenter, Netns};

/// kube-proxy's Linux modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Its own nftables table, `kube-proxy`.
    Nftables,
    /// iptables chains (`KUBE-SERVICES` and the like) in the nat and filter tables.
    Iptables,
}

impl ProxyMode {
    /// The mode's name in kube-proxy's configuration.
    pub fn name(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
        }
    }
}

/// What a kube-proxy of the node is run with.
pub struct ProxySetup {
    /// The node's network namespace (left to its owner: [`Netns::existing`]).
    pub node: Netns,
    /// Where its configuration is written.
    pub dir: PathBuf,
    /// The admin's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The node's address (NodePorts answer there only).
    pub node_ip: Ipv4Addr,
    /// The node's name.
    pub node_name: String,
}

/// A running kube-proxy.
pub struct KubeProxy {
    setup: ProxySetup,
    mode: ProxyMode,
    proc: Option<Proc>,
}

impl KubeProxy {
    /// Starts kube-proxy in `mode`; returns once its health port listens.
    #[track_caller]
    pub fn start(setup: ProxySetup, mode: ProxyMode) -> KubeProxy {
        let mut p = KubeProxy { setup, mode, proc: None };
        p.spawn();
        p
    }

    fn config(&self) -> PathBuf {
        self.setup.dir.join(format!("kube-proxy-{}.yaml", self.mode.name()))
    }

    fn write_config(&self) {
        let s = &self.setup;
        let config = format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: {mode}
clientConnection: {{kubeconfig: {kc}}}
hostnameOverride: {node}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: {POD_SUBNET4}
nodePortAddresses: ["{ip}/32"]
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#,
            mode = self.mode.name(),
            kc = s.kubeconfig.display(),
            node = s.node_name,
            ip = s.node_ip
        );
        std::fs::write(self.config(), config).expect("writing kube-proxy's config");
    }

    #[track_caller]
    fn spawn(&mut self) {
        self.write_config();
        let mut cmd = nsenter(&self.setup.node.path(), binaries().join("kube-proxy"));
        cmd.arg(format!("--config={}", self.config().display()));
        let mut proc = Proc::spawn(&format!("kube-proxy ({})", self.mode.name()), &mut cmd);
        let node = &self.setup.node;
        let healthy = wait_until(Duration::from_secs(30), || {
            !proc.running() || node.sh("ss -Hltn sport = :10256").contains("10256")
        });
        assert!(healthy && proc.running(), "kube-proxy did not start: {}", proc.output());
        self.proc = Some(proc);
    }

    /// The mode it runs in.
    pub fn mode(&self) -> ProxyMode {
        self.mode
    }

    /// Stops it, removes its rules (`kube-proxy --cleanup`) and starts it in `mode`; returns
    /// once its health port listens (its rules follow within its sync period).
    #[track_caller]
    pub fn switch(&mut self, mode: ProxyMode) {
        self.stop();
        let mut cmd = nsenter(&self.setup.node.path(), binaries().join("kube-proxy"));
        cmd.arg(format!("--config={}", self.config().display())).arg("--cleanup");
        let out = cmd.output().expect("running kube-proxy --cleanup");
        assert!(
            out.status.success(),
            "kube-proxy --cleanup: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.mode = mode;
        self.spawn();
    }

    /// The rules it wrote in the node's namespace, as `nft` and `iptables-save` list them.
    pub fn rules(&self) -> String {
        self.setup.node.sh("nft list tables; iptables-save 2>/dev/null | grep -c KUBE-SVC || true")
    }

    /// Its log.
    pub fn output(&self) -> String {
        self.proc.as_ref().map(Proc::output).unwrap_or_default()
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Stops it (SIGTERM); its rules stay until the node's namespace goes.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop(libc::SIGTERM, Duration::from_secs(10));
        }
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.stop();
    }
}
