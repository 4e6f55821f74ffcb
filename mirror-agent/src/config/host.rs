//! What a configuration must be on this host: the memory the classifier's sized maps take
//! on its CPUs, the descriptors the API's connections take, a BPF filesystem for the pins,
//! the kernel features the chosen attach mode needs, and the credentials of the recorder's
//! uploads. [`Config::load`] runs it (so do
//! `--check` and the start), after [`Config::parse`].

use super::{err, AttachModeCfg, Config, ConfigError, METRICS_CONNECTIONS};
use crate::capacity::{self, Host, TableMemory};

/// Descriptors the agent keeps for itself beyond its connections: maps, programs, links of
/// the attached interfaces' hooks, netlink, the state and lock files.
const RESERVED_FDS: u64 = 256;

impl Config {
    /// What depends on the host: the memory the sized tables take, the descriptors the API's
    /// connections take, where the pins go.
    pub fn check_host(&self, host: &Host) -> Result<(), ConfigError> {
        let flows = crate::memory::flows_on(self.flows.max, host.cpus);
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
        if self.recorder.enabled {
            self.recorder.upload.check_credentials(&|k| std::env::var(k).ok())?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // A cgroup's limit, 288 MiB (the DaemonSet's), less 16 MiB for the agent itself.
        let daemonset = 288 << 20;
        cgroup(2, daemonset).check_host_ok(&Config::parse(pins).unwrap());
        cgroup(20, daemonset).check_host_ok(&Config::parse(pins).unwrap());
        // On 24 CPUs the defaults take 285 MiB; fewer flows fit.
        let e = Config::parse(pins).unwrap().check_host(&cgroup(24, daemonset)).unwrap_err();
        assert_eq!(e.path, "flows.max", "{e}");
        cgroup(24, daemonset).check_host_ok(&cfg("max: 4096"));
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
}
