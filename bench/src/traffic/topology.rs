//! The test bed: the end-to-end harness's node namespace routing between a client pod and a
//! server pod (198.18.1.2 and 198.18.2.2), the long-running servers in the server pod, and the
//! CPU pinning of clients and servers.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::topology::netns::{Netns, Pod, Topology};
use mirror_e2e::workload::h2_stacks::{nginx_h2c, Daemon};
use mirror_e2e::workload::servers::Server;
use tempfile::TempDir;

/// iperf3's port.
pub const IPERF_PORT: u16 = 5201;
/// sockperf's port.
pub const SOCKPERF_PORT: u16 = 11111;
/// nginx's port (`/foo` answers 200, `/bar` 500).
pub const HTTP_PORT: u16 = 80;
/// nginx's HTTP/2 cleartext port (prior knowledge; `/ok` 200, `/fail` 500, `/big` 256 KiB),
/// the end-to-end tests' configuration.
pub const H2_PORT: u16 = 8080;

/// Which CPU clients and servers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinning {
    pub client: usize,
    pub server: usize,
    /// The agent's CPU: one the loads do not use, when there is one, so that the agent's own
    /// threads never compete with the load (what is measured is the data path).
    pub agent: Option<usize>,
}

/// The namespaces, servers and scratch directory every run shares.
pub struct Bed {
    /// Node, client pod, server pod; the node also has the spare sink `mir0` (peer `mir1`).
    pub topo: Topology,
    pub pins: Pinning,
    /// Configs, captures, the wrk script.
    pub dir: TempDir,
    // Stopped in Drop, before the namespaces go.
    servers: Vec<Proc>,
    nginx: Option<Server>,
    nginx_h2c: Option<Daemon>,
}

impl Bed {
    /// Builds the topology and starts iperf3, sockperf and nginx (HTTP/1.1, and h2c on a port
    /// of its own) in the server pod, all pinned to the server CPU.
    pub fn new(pins: Pinning) -> Result<Bed> {
        let dir = tempfile::Builder::new().prefix("mirror-bench").tempdir().context("creating a temp dir")?;
        let topo = Topology::new(&["client", "server"]);
        let mut bed = Bed { topo, pins, dir, servers: Vec::new(), nginx: None, nginx_h2c: None };
        let server = bed.server();
        let addr = server.v4.to_string();
        let iperf = ["iperf3", "-s", "-B", &addr, "-p", &IPERF_PORT.to_string()];
        let sockperf = ["sockperf", "server", "--tcp", "-i", &addr, "-p", &SOCKPERF_PORT.to_string()];
        let mut started = Vec::new();
        for argv in [&iperf[..], &sockperf[..]] {
            let mut cmd = bed.pinned(&server.ns, bed.pins.server, argv);
            started.push(Proc::spawn(&format!("{} in the server pod", argv[0]), &mut cmd));
        }
        bed.servers = started;
        bed.nginx = Some(Server::nginx(bed.server(), HTTP_PORT, bed.dir.path()));
        bed.nginx_h2c = Some(nginx_h2c(bed.server(), &[H2_PORT], bed.dir.path()));
        // nginx is started by the harness, unpinned: pin whatever runs in the server pod.
        for pid in server_ns_pids(&bed.server().ns)? {
            super::cmd::pin_threads(&pid, bed.pins.server)?;
        }
        for port in [IPERF_PORT, SOCKPERF_PORT] {
            let listening = wait_until(Duration::from_secs(10), || {
                !bed.server().ns.sh(&format!("ss -Hltn sport = :{port}")).trim().is_empty()
            });
            ensure!(listening, "nothing listens on port {port} of the server pod");
        }
        Ok(bed)
    }

    /// The client pod.
    pub fn client(&self) -> &Pod {
        self.topo.pod("client")
    }

    /// The server pod.
    pub fn server(&self) -> &Pod {
        self.topo.pod("server")
    }

    /// The node namespace.
    pub fn node(&self) -> &Netns {
        &self.topo.node
    }

    /// The node-side veths of the pods, where monitors attach.
    pub fn pod_veths(&self) -> [&str; 2] {
        [&self.client().veth, &self.server().veth]
    }

    /// `argv` in `ns`, pinned to `cpu`, bounded by `timeout` (no run can hang the benchmark).
    pub fn pinned_for(&self, ns: &Netns, cpu: usize, timeout: Duration, argv: &[&str]) -> Command {
        let mut cmd = ns.command("timeout");
        cmd.arg(timeout.as_secs().max(1).to_string())
            .arg("taskset")
            .arg("-c")
            .arg(cpu.to_string())
            .args(argv);
        cmd
    }

    /// A long-running `argv` in `ns`, pinned to `cpu`.
    fn pinned(&self, ns: &Netns, cpu: usize, argv: &[&str]) -> Command {
        let mut cmd = ns.command("taskset");
        cmd.arg("-c").arg(cpu.to_string()).args(argv);
        cmd
    }

    /// The offloads of the server pod's node-side veth that matter to the data path, e.g.
    /// "tso on, gso on, gro off, ...".
    pub fn offloads(&self) -> String {
        let text = self.node().sh(&format!("ethtool -k {}", self.server().veth));
        summarize_offloads(&text)
    }

    /// A scratch file path.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // Servers go before the namespaces they run in.
        self.nginx = None;
        self.nginx_h2c = None;
        for p in &mut self.servers {
            p.stop(libc::SIGTERM, Duration::from_secs(2));
        }
    }
}

fn server_ns_pids(ns: &Netns) -> Result<Vec<String>> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "pids", ns.name()]);
    let out = super::cmd::run(cmd, "ip netns pids")?;
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect())
}

/// `ethtool -k` features worth recording, in short form.
const OFFLOADS: [(&str, &str); 7] = [
    ("rx-checksumming", "rx-csum"),
    ("tx-checksumming", "tx-csum"),
    ("scatter-gather", "sg"),
    ("tcp-segmentation-offload", "tso"),
    ("generic-segmentation-offload", "gso"),
    ("generic-receive-offload", "gro"),
    ("rx-gro-list", "gro-list"),
];

fn summarize_offloads(ethtool_k: &str) -> String {
    let mut out = Vec::new();
    for (feature, short) in OFFLOADS {
        let value = ethtool_k.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == feature).then(|| v.split_whitespace().next().unwrap_or("?").to_string())
        });
        if let Some(v) = value {
            out.push(format!("{short} {v}"));
        }
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloads_in_short() {
        let text = "Features for vethserver:\nrx-checksumming: on\ntx-checksumming: on\n\
                    \ttx-checksum-ipv4: off [fixed]\nscatter-gather: on\ntcp-segmentation-offload: on\n\
                    generic-segmentation-offload: on\ngeneric-receive-offload: off\n\
                    large-receive-offload: off [fixed]\nrx-gro-list: off\n";
        assert_eq!(
            summarize_offloads(text),
            "rx-csum on, tx-csum on, sg on, tso on, gso on, gro off, gro-list off"
        );
    }
}
