//! tcpdump on one interface of one namespace, written to a pcap file and read back on stop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::netns::Netns;
use crate::pcap::{self, Trace};
use crate::proc::Proc;

/// A running capture.
pub struct Capture {
    proc: Proc,
    file: PathBuf,
}

impl Capture {
    /// Captures on `dev` in `ns` into `file`, keeping frames that match `filter` (a pcap filter
    /// expression, "" for all). Returns once tcpdump is capturing.
    pub fn start(ns: &Netns, dev: &str, filter: &str, file: &Path) -> Capture {
        let mut cmd = ns.command("tcpdump");
        // -U with --immediate-mode: each packet reaches the file at once, so SIGINT loses none.
        // -Z root: tcpdump would otherwise drop to a user that cannot write our temp dir.
        // -B: 8 MiB of kernel buffer, so that bursts of short connections are not dropped.
        cmd.args(["-i", dev, "-nn", "-s", "0", "-B", "8192", "-U", "--immediate-mode", "-Z", "root", "-w"])
            .arg(file);
        if !filter.is_empty() {
            cmd.arg(filter);
        }
        let mut proc = Proc::spawn(&format!("tcpdump on {dev} in {}", ns.name()), &mut cmd);
        proc.wait_for_output("listening on", Duration::from_secs(5));
        Capture { proc, file: file.to_path_buf() }
    }

    /// Stops tcpdump (SIGINT, so that it flushes) and reads what it captured. Panics when the
    /// kernel dropped packets: the comparison would be meaningless.
    pub fn stop(mut self) -> Trace {
        let status = self.proc.stop(libc::SIGINT, Duration::from_secs(5));
        let out = self.proc.output();
        assert!(status.is_some_and(|s| s.success()), "tcpdump failed ({status:?}): {out}");
        // "N packet(s) dropped by kernel"
        let dropped =
            out.lines().find(|l| l.ends_with("dropped by kernel")).and_then(|l| l.split(' ').next());
        assert_eq!(dropped, Some("0"), "tcpdump lost packets: {out}");
        pcap::read(&self.file)
    }
}
