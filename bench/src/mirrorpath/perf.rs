//! Where the time goes, from `perf record -g` (JITed BPF programs have symbols with
//! `net.core.bpf_jit_kallsyms=1`): the share of samples under each kernel function, callees
//! included ("children"), read from `perf report --children --sort sym`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{ensure, Context, Result};

/// A running `perf record`.
pub struct Recording {
    child: std::cell::RefCell<Child>,
    comms: String,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Recording {
    /// Samples `cpu` (every CPU when `None`), with call chains, for `secs`; the report keeps
    /// the samples of the commands named in `comms` (comma-separated; all when empty), and
    /// gives shares relative to them.
    pub fn start(cpu: Option<usize>, secs: u32, comms: &str) -> Result<Recording> {
        let dir = tempfile::Builder::new().prefix("mirror-bench-perf").tempdir()?;
        let file = dir.path().join("perf.data");
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-q", "-g", "-F", "4999", "-o"]).arg(&file);
        match cpu {
            Some(c) => cmd.args(["-C", &c.to_string()]),
            None => cmd.arg("-a"),
        };
        cmd.args(["--", "sleep", &secs.to_string()]);
        let child =
            cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().context("starting perf record")?;
        // perf needs a moment to set up its buffers before samples count.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Recording { child: std::cell::RefCell::new(child), comms: comms.to_string(), file, _dir: dir })
    }

    /// Whether perf has stopped recording.
    pub fn finished(&self) -> bool {
        self.child.borrow_mut().try_wait().ok().flatten().is_some()
    }

    /// Waits for perf, then reads the samples by stage (see [`stages`]).
    pub fn stages(self, name: &str, within: &str, receive_is_copy: bool) -> Result<Stages> {
        let file = self.file.clone();
        let comms = self.comms.clone();
        self.wait()?;
        self.keep(name)?;
        let mut cmd = Command::new("perf");
        cmd.args(["script", "-F", "comm,ip,sym"]);
        if !comms.is_empty() {
            cmd.args(["--comms", &comms]);
        }
        let out = cmd.arg("-i").arg(&file).output().context("running perf script")?;
        ensure!(out.status.success(), "perf script: {}", String::from_utf8_lossy(&out.stderr));
        let st = stages(&String::from_utf8_lossy(&out.stdout), within, receive_is_copy);
        ensure!(st.total > 0, "{name}: no sample of the load");
        Ok(st)
    }

    fn wait(&self) -> Result<()> {
        let mut child = self.child.borrow_mut();
        let status = child.wait().context("waiting for perf record")?;
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        ensure!(status.success(), "perf record: {err}");
        Ok(())
    }

    /// With `MIRROR_BENCH_PERF_DIR` set, writes perf's report there for a look by hand:
    /// `<name>.txt` (by function, callees included) and `<name>.callers.txt` (call graphs).
    fn keep(&self, name: &str) -> Result<()> {
        let Some(dir) = std::env::var_os("MIRROR_BENCH_PERF_DIR") else { return Ok(()) };
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir)?;
        for (suffix, args) in [
            ("txt", &["--children", "--sort", "sym", "-g", "none", "--percent-limit", "0.1"][..]),
            ("callers.txt", &["--no-children", "--sort", "sym", "-G", "--percent-limit", "1"][..]),
        ] {
            let mut cmd = Command::new("perf");
            cmd.args(["report", "--stdio"]).args(args);
            if !self.comms.is_empty() {
                cmd.args(["--comms", &self.comms, "--percentage", "relative"]);
            }
            let out = cmd.arg("-i").arg(&self.file).output().context("running perf report")?;
            std::fs::write(dir.join(format!("{name}.{suffix}")), &out.stdout)?;
        }
        Ok(())
    }
}

/// ns per packet or per copy, by function (callees included) or by stage.
#[derive(Debug, Clone, Default)]
pub struct Breakdown {
    pub ns: BTreeMap<String, f64>,
}

impl Breakdown {
    pub fn get(&self, sym: &str) -> f64 {
        self.ns.get(sym).copied().unwrap_or(0.0)
    }
}

/// A stage of the copy path and the kernel functions that make it up. A sample belongs to the
/// deepest stage on its call chain (a sample in `enqueue_to_backlog`, called by `veth_xmit`,
/// called by `__dev_queue_xmit`, is the enqueue's).
pub const STAGES: [(&str, &[&str]); 12] = [
    ("clone", &["skb_clone"]),
    ("unclone the original", &["pskb_expand_head"]),
    ("transmit", &["__dev_queue_xmit"]),
    ("taps", &["dev_queue_xmit_nit"]),
    ("veth: to its peer", &["veth_xmit"]),
    ("ifb: to its tasklet", &["ifb_xmit"]),
    ("to the receive path", &["__dev_forward_skb2", "dev_forward_skb_nomtu"]),
    ("enqueue to the backlog", &["enqueue_to_backlog", "netif_rx_internal", "__netif_rx", "netif_rx"]),
    ("receive: backlog, taps, tc", &["net_rx_action", "process_backlog", "__netif_receive_skb_core"]),
    ("receive: IP (drop: another host's)", &["ip_rcv", "ip_rcv_core", "ipv6_rcv"]),
    (
        "free",
        &["sk_skb_reason_drop", "kfree_skb_list_reason", "skb_release_data", "kfree_skbmem", "consume_skb"],
    ),
    ("act_mirred", &["tcf_mirred_act"]),
];

/// Functions under which everything is the copy's: the helper and the action.
pub const COPY_ROOTS: [&str; 2] = ["bpf_clone_redirect", "tcf_mirred_act"];

/// Samples by stage, from `perf script`.
#[derive(Debug, Clone, Default)]
pub struct Stages {
    /// Samples counted (those under `within`, if given, else all of the commands kept).
    pub total: u64,
    /// Samples under a copy root (the helper, the action), and under the receive softirq when
    /// it counts as the copy's (test_run, where nothing else is received).
    pub copy: u64,
    /// Samples of the copy by stage (a copy sample matching no stage is in "other").
    pub by_stage: BTreeMap<String, u64>,
}

impl Stages {
    /// ns of each stage when `total` samples stand for `total_ns`.
    pub fn scaled(&self, total_ns: f64) -> Breakdown {
        let per = total_ns / self.total.max(1) as f64;
        let mut ns: BTreeMap<String, f64> =
            self.by_stage.iter().map(|(k, v)| (k.clone(), *v as f64 * per)).collect();
        ns.insert("copy, all of it".into(), self.copy as f64 * per);
        Breakdown { ns }
    }
}

/// Reads `perf script -F comm,ip,sym` (call chains leaf first, samples separated by blank
/// lines): keeps the samples that have `within` on their chain (all when empty); a sample is
/// the copy's when a [`COPY_ROOTS`] function is on its chain, or `net_rx_action` when
/// `receive_is_copy`.
pub fn stages(script: &str, within: &str, receive_is_copy: bool) -> Stages {
    let mut st = Stages::default();
    for sample in script.split("\n\n") {
        let frames: Vec<String> = sample
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                f.next()?; // the address
                let sym = f.next()?;
                Some(sym.split(['+', '.']).next().unwrap_or(sym).to_string())
            })
            .collect();
        if frames.is_empty() || (!within.is_empty() && !frames.iter().any(|f| f == within)) {
            continue;
        }
        st.total += 1;
        // Root first: the copy starts at the outermost copy root.
        let root = frames
            .iter()
            .rposition(|f| COPY_ROOTS.contains(&f.as_str()) || (receive_is_copy && f == "net_rx_action"));
        let Some(root) = root else { continue };
        st.copy += 1;
        let stage = frames[..=root]
            .iter()
            .find_map(|f| STAGES.iter().find(|(_, fs)| fs.contains(&f.as_str())).map(|(name, _)| *name))
            .unwrap_or("other");
        *st.by_stage.entry(stage.to_string()).or_default() += 1;
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_go_to_their_deepest_stage() {
        let script = "wrk \n\tffff0001 enqueue_to_backlog+0x10\n\tffff0002 veth_xmit\n\t\
                      ffff0003 __dev_queue_xmit\n\tffff0004 bpf_clone_redirect\n\tffff0005 net_rx_action\n\n\
                      wrk \n\tffff0006 memcpy_orig\n\tffff0007 pskb_expand_head\n\tffff0004 bpf_clone_redirect\n\n\
                      wrk \n\tffff0008 tcp_sendmsg\n\tffff0005 net_rx_action\n\n\
                      wrk \n\tffff0009 ip_rcv_core.constprop.0\n\tffff0005 net_rx_action\n";
        let st = stages(script, "", false);
        assert_eq!((st.total, st.copy), (4, 2));
        assert_eq!(st.by_stage["enqueue to the backlog"], 1);
        assert_eq!(st.by_stage["unclone the original"], 1);
        let st = stages(script, "", true);
        assert_eq!((st.total, st.copy), (4, 4));
        assert_eq!(st.by_stage["receive: backlog, taps, tc"], 1);
        assert_eq!(st.by_stage["receive: IP (drop: another host's)"], 1);
        assert_eq!(stages(script, "tcp_sendmsg", true).total, 1);
        let b = stages(script, "", false).scaled(400.0);
        assert_eq!((b.get("copy, all of it"), b.get("clone")), (200.0, 0.0));
    }
}
