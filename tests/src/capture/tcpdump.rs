//! tcpdump on one interface of one namespace, written to a pcap file and read back on stop;
//! recordings of the same traffic at an endpoint and on the mirror sink.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use crate::capture::pcap::{self, Trace};
use crate::proc::Proc;
use crate::topology::netns::Netns;

/// A running capture.
pub struct Capture {
    proc: Proc,
    file: PathBuf,
}

/// Which packets of an interface a capture keeps (tcpdump's `-Q`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received by the interface.
    In,
    /// Sent by it.
    Out,
    /// Both.
    Both,
}

impl Capture {
    /// Captures on `dev` in `ns` into `file`, keeping frames that match `filter` (a pcap filter
    /// expression, "" for all). Returns once tcpdump is capturing.
    pub fn start(ns: &Netns, dev: &str, filter: &str, file: &Path) -> Capture {
        Capture::start_with(ns, dev, Direction::Both, filter, file, BUFFER_KIB)
    }

    /// Like [`Capture::start`], keeping only the frames that go `direction`.
    pub fn start_directed(ns: &Netns, dev: &str, direction: Direction, filter: &str, file: &Path) -> Capture {
        Capture::start_with(ns, dev, direction, filter, file, BUFFER_KIB)
    }

    /// Like [`Capture::start`] with `buffer_kib` KiB of kernel buffer.
    pub fn start_with_buffer(ns: &Netns, dev: &str, filter: &str, file: &Path, buffer_kib: u32) -> Capture {
        Capture::start_with(ns, dev, Direction::Both, filter, file, buffer_kib)
    }

    fn start_with(
        ns: &Netns,
        dev: &str,
        direction: Direction,
        filter: &str,
        file: &Path,
        buffer_kib: u32,
    ) -> Capture {
        let mut cmd = ns.command("tcpdump");
        // -U with --immediate-mode: each packet reaches the file at once, so SIGINT loses none.
        // -Z root: tcpdump would otherwise drop to a user that cannot write our temp dir.
        // -B: kernel buffer, so that bursts of short connections are not dropped. In immediate
        // mode its slots are as large as the biggest (GSO) packet, so it holds few of them.
        // Nanosecond time stamps: captures on several interfaces of one namespace share a clock
        // and are merged in time order.
        let buffer = buffer_kib.to_string();
        cmd.args(["-i", dev, "-nn", "-s", "0", "-B", &buffer, "-U", "--immediate-mode", "-Z", "root"]);
        cmd.args(["--time-stamp-precision", "nano"]);
        match direction {
            Direction::In => cmd.args(["-Q", "in"]),
            Direction::Out => cmd.args(["-Q", "out"]),
            Direction::Both => &mut cmd,
        };
        cmd.arg("-w").arg(file);
        if !filter.is_empty() {
            cmd.arg(filter);
        }
        let mut proc = Proc::spawn(&format!("tcpdump on {dev} in {}", ns.name()), &mut cmd);
        // Its ring is allocated before it listens: a large -B on a busy machine took over 5 s.
        proc.wait_for_output("listening on", Duration::from_secs(30));
        Capture { proc, file: file.to_path_buf() }
    }

    /// The pcap file it writes.
    pub fn file(&self) -> &Path {
        &self.file
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

/// Default kernel buffer of a capture: 8 MiB.
pub const BUFFER_KIB: u32 = 8192;

/// Time for the last packets (the connection's close) to pass every capture point.
pub const SETTLE: Duration = Duration::from_millis(300);

/// Packets seen at an endpoint and on the mirror during the same traffic.
pub struct Recording {
    /// At the reference endpoint's `eth0`.
    pub reference: Trace,
    /// On the mirror sink.
    pub mirror: Trace,
}

/// Takes recordings into numbered pcap files of one directory.
pub struct Recorder {
    dir: PathBuf,
    taken: Cell<u32>,
    buffer_kib: Cell<u32>,
}

impl Recorder {
    /// Files go to `dir`.
    pub fn new(dir: &Path) -> Recorder {
        Recorder { dir: dir.to_path_buf(), taken: Cell::new(0), buffer_kib: Cell::new(BUFFER_KIB) }
    }

    /// Gives the captures of later recordings `kib` KiB of kernel buffer each.
    pub fn set_buffer_kib(&self, kib: u32) {
        self.buffer_kib.set(kib);
    }

    /// Runs `traffic` while capturing TCP at the `eth0` of `reference` (a pod's namespace)
    /// and everything on `mirror` (namespace and device; `None`: the mirror trace is empty).
    pub fn record(
        &self,
        reference: &Netns,
        mirror: Option<(&Netns, &str)>,
        traffic: impl FnOnce(),
    ) -> Recording {
        self.record_filtered(reference, "tcp", mirror, traffic)
    }

    /// Like [`Recorder::record`], keeping at `reference` what the pcap filter `filter` matches.
    pub fn record_filtered(
        &self,
        reference: &Netns,
        filter: &str,
        mirror: Option<(&Netns, &str)>,
        traffic: impl FnOnce(),
    ) -> Recording {
        let n = self.taken.replace(self.taken.get() + 1);
        let start = |ns, dev, filter, name: &str| {
            let file = self.dir.join(format!("{name}-{n}.pcap"));
            Capture::start_with_buffer(ns, dev, filter, &file, self.buffer_kib.get())
        };
        let at_pod = start(reference, "eth0", filter, "reference");
        let at_sink = mirror.map(|(ns, dev)| start(ns, dev, "", "mirror"));
        traffic();
        thread::sleep(SETTLE);
        let reference = at_pod.stop();
        let mirror = at_sink.map(Capture::stop).unwrap_or_default();
        Recording { reference, mirror }
    }
}
