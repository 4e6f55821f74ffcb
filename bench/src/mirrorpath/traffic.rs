//! ns per copied packet on real traffic: wrk against nginx between two pods through a node
//! namespace, the classifier attached to both pod veths, every flow marked (a rule on status
//! 200, the status every response has), the copies going each way in turn, alternating run
//! after run with no copy at all. Costs are taken from the CPU time of the one CPU the load
//! runs on (client, server and their softirqs: /proc/stat) and from the kernel's BPF run-time
//! accounting, per request, and the no-copy run's cost is subtracted; perf says where the
//! difference goes; captures on the sink check what a consumer sees.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use mirror_bpf::testing;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{AttachMode, Datapath, DatapathOptions, MirrorMethod};
use mirror_e2e::topology::netns::{Netns, Topology};
use mirror_e2e::workload::servers::Server;

use super::perf::{self, Breakdown};
use super::sinks::{self, SinkKind, Variant};
use crate::stats::{median, Summary};

/// Every response of nginx's `/foo` is a 200: every connection is marked by its first response
/// and copied from then on, both directions.
const RULE: &str = "status=200 packets=0 bytes=0 duration=0";
const PATH: &str = "/foo";
const CONNECTIONS: u32 = 4;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub rounds: usize,
    pub secs: u32,
    /// Seconds of perf sampling per variant (0: none).
    pub perf_secs: u32,
    /// Seconds of load while capturing on the sink (0: no capture check).
    pub capture_secs: u32,
}

/// One timed run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub requests: u64,
    pub secs: f64,
    /// Packets the classifier saw (once each: not again at the second veth), and copied.
    pub packets: u64,
    pub mirrored: u64,
    /// Copies that failed (bpf_clone_redirect returned an error).
    pub copy_errors: u64,
    /// Packets dropped at a full backlog meanwhile (any CPU).
    pub backlog_drops: u64,
    /// Packets the pods' eth0 received beyond those they sent: copies that came back into the
    /// node's data path and were delivered (0 when copies stay on the sink).
    pub extra_delivered: i64,
    /// Kernel run-time accounting of the classifier's programs.
    pub bpf_ns: u64,
    /// CPU time of the load: wrk, nginx and the load CPU's ksoftirqd (their run time, which
    /// includes the softirqs run in their context: this kernel has no separate IRQ time
    /// accounting). Other work on the CPU (a build) is not in it.
    pub cpu_ns: u64,
}

impl Run {
    pub fn per_request(&self, v: u64) -> f64 {
        v as f64 / self.requests.max(1) as f64
    }

    /// Copies made, whether the sink took them or refused them.
    pub fn copies(&self) -> u64 {
        self.mirrored + self.copy_errors
    }
}

/// What a capture on the sink saw during a load.
#[derive(Debug, Clone, Default)]
pub struct CaptureCheck {
    pub dev: String,
    /// Copies made meanwhile (classifier's counter).
    pub mirrored: u64,
    /// Packets tcpdump captured, received (`-Q in`) and sent (`-Q out`) by the interface.
    pub seen_in: u64,
    pub seen_out: u64,
    /// Dropped by the kernel before tcpdump read them (both captures).
    pub dropped: u64,
    /// tshark's verdicts on the TCP checksums, e.g. "bad 120, good 3".
    pub tcp_checksums: String,
    /// Packets dropped meanwhile at a full backlog (any CPU).
    pub backlog_drops: u64,
    /// The largest frame captured (GSO packets are copied whole).
    pub max_len: u64,
    /// Why there is no capture, if none.
    pub error: Option<String>,
}

/// A variant's runs and what was derived from them.
#[derive(Debug, Clone)]
pub struct Row {
    pub variant: Variant,
    pub runs: Vec<Run>,
    /// Medians over rounds.
    pub requests_per_s: f64,
    pub copies_per_request: f64,
    /// Share of the copies bpf_clone_redirect reported as failed (the sink refused them).
    pub copy_errors: f64,
    /// Packets delivered to the pods beyond those sent, per copy (copies re-entering the node).
    pub extra_per_copy: f64,
    /// Packets dropped at a full backlog during the runs (any CPU).
    pub backlog_drops: u64,
    /// CPU ns per request of the load's CPU.
    pub cpu_ns_per_request: f64,
    /// Median over rounds of (this run − the round's no-copy run) per request, divided by the
    /// copies per request: ns per copied packet.
    pub copy_cpu_ns: Summary,
    pub copy_bpf_ns: Summary,
    /// perf over one more run: ns per copy of each stage of the copy, and that run.
    pub profile: Option<(Breakdown, Run)>,
    pub capture: Option<CaptureCheck>,
}

pub struct Results {
    pub rows: Vec<Row>,
    pub missing: Vec<(SinkKind, String)>,
    pub plan: Plan,
    pub cpu: usize,
    pub offloads: String,
    /// What tcpdump said when asked to capture on the down peer of a veth sink.
    pub down_peer: Option<String>,
}

/// Runs in a thread of its own (inside the node namespace while it lives).
pub fn run(plan: Plan, cpu: usize, other_cpu: usize) -> Result<Results> {
    std::thread::spawn(move || {
        mirror_bpf::testing::pin_thread(other_cpu).with_context(|| format!("pinning to CPU {other_cpu}"))?;
        measure(plan, cpu)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

struct Bed {
    topo: Topology,
    cpu: usize,
    dir: tempfile::TempDir,
    load: Option<LoadCpu>,
}

impl Bed {
    fn load_ns(&self) -> u64 {
        self.load.as_ref().map_or(0, LoadCpu::now)
    }

    fn server_url(&self) -> String {
        format!("http://{}:80{PATH}", self.topo.pod("server").v4)
    }

    fn pod_veths(&self) -> [String; 2] {
        [self.topo.pod("client").veth.clone(), self.topo.pod("server").veth.clone()]
    }

    fn node(&self) -> &Netns {
        &self.topo.node
    }

    /// Packets received and sent by the pods' eth0, summed over both pods.
    fn pod_packets(&self) -> (u64, u64) {
        let mut rx_tx = (0, 0);
        for role in ["client", "server"] {
            let out = self.topo.pod(role).ns.sh("ip -s -j link show dev eth0");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
            let st = &v[0]["stats64"];
            rx_tx.0 += st["rx"]["packets"].as_u64().unwrap_or(0);
            rx_tx.1 += st["tx"]["packets"].as_u64().unwrap_or(0);
        }
        rx_tx
    }

    /// wrk in the client pod on the load's CPU for `secs`: (requests, seconds).
    fn wrk(&self, secs: u32, connections: u32) -> Result<(u64, f64)> {
        let mut cmd = self.topo.pod("client").ns.command("timeout");
        cmd.args([&(secs + 10).to_string(), "taskset", "-c", &self.cpu.to_string(), "wrk", "-t", "1"])
            .args(["-c", &connections.to_string(), "-d", &format!("{secs}s"), &self.server_url()]);
        let out = cmd.output().context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(out.status.success(), "wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        parse_wrk(&text)
    }
}

/// "  123456 requests in 5.00s, 17.89MB read"; refuses errors and non-2xx answers.
pub fn parse_wrk(text: &str) -> Result<(u64, f64)> {
    let line = text.lines().find(|l| l.contains(" requests in ")).with_context(|| format!("wrk: {text}"))?;
    let mut f = line.split_whitespace();
    let requests: u64 = f.next().and_then(|n| n.parse().ok()).with_context(|| format!("wrk: {line}"))?;
    let secs = line
        .split(" requests in ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|d| d.trim().strip_suffix('s'))
        .and_then(|d| d.parse::<f64>().ok())
        .with_context(|| format!("wrk: {line}"))?;
    ensure!(!text.contains("Non-2xx"), "wrk saw errors: {text}");
    ensure!(!text.contains("Socket errors"), "wrk saw socket errors: {text}");
    ensure!(requests > 0, "wrk made no request");
    Ok((requests, secs))
}

/// Packets dropped because a CPU's backlog was full (`netdev_max_backlog`), all CPUs: a copy
/// delivered through the backlog (to a veth's peer, or to any sink's ingress) can be lost there,
/// before a capture sees it.
fn backlog_drops() -> u64 {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default();
    text.lines().filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok()).sum()
}

/// Run time (ns) of every thread of `pid` (schedstat's first field).
fn task_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time (ns) of the children this process has reaped (wrk, once it has exited).
fn reaped_children_ns() -> u64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The processes whose CPU time is the load's: nginx (running) and ksoftirqd of the load's
/// CPU; wrk is counted when reaped.
struct LoadCpu {
    pids: Vec<u32>,
}

impl LoadCpu {
    fn new(server: &Netns, cpu: usize) -> Result<LoadCpu> {
        let out = Command::new("ip").args(["netns", "pids", server.name()]).output()?;
        let mut pids: Vec<u32> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
        ensure!(!pids.is_empty(), "no process in the server pod");
        let ksoftirqd = format!("ksoftirqd/{cpu}");
        for e in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == ksoftirqd) {
                pids.push(pid);
            }
        }
        Ok(LoadCpu { pids })
    }

    fn now(&self) -> u64 {
        reaped_children_ns() + self.pids.iter().map(|&p| task_ns(p)).sum::<u64>()
    }
}

/// Commands whose perf samples are the load's.
fn load_comms(cpu: usize) -> String {
    format!("wrk,nginx,ksoftirqd/{cpu}")
}

/// run_time_ns and run_cnt of a program we hold, from its fdinfo (accounting on).
fn prog_stats(prog: &libbpf_rs::ProgramMut<'_>) -> (u64, u64) {
    use std::os::fd::{AsFd, AsRawFd};
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", prog.as_fd().as_raw_fd()))
        .unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("run_time_ns:"), field("run_cnt:"))
}

/// Run time (ns) of all the classifier's programs.
fn all_prog_stats(dp: &Datapath<'static>) -> u64 {
    let p = &dp.skel().progs;
    [
        &p.tcx_ingress_mirror,
        &p.tcx_egress_mirror,
        &p.tc_ingress_mirror,
        &p.tc_egress_mirror,
        &p.tc_ingress_mirred,
        &p.tc_egress_mirred,
    ]
    .into_iter()
    .map(|p| prog_stats(p).0)
    .sum()
}

/// Keeps BPF run-time accounting on while held.
struct StatsOn {
    _fd: std::os::fd::OwnedFd,
}

fn stats_on() -> Result<StatsOn> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscall wrapper; a non-negative return is a new fd we own.
    let fd = unsafe { libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME) };
    if fd < 0 {
        bail!("BPF_ENABLE_STATS: {}", std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: fd is open and ours alone.
    Ok(StatsOn { _fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) } })
}

fn set_target(dp: &mut Datapath<'static>, v: &Variant) -> Result<()> {
    let ifindex = v.dev().map_or(0, testing::ifindex);
    dp.set_mirror_target(ifindex, v.delivery)?;
    Ok(())
}

/// Attaches as the variant needs (clone: TCX, the default; mirred: tc, which it needs).
fn attach(dp: &Datapath<'static>, bed: &Bed, v: &Variant) -> Result<Vec<mirror_bpf::Attachment>> {
    let mode = if v.method == MirrorMethod::Mirred { AttachMode::Tc } else { AttachMode::Auto };
    bed.pod_veths().iter().map(|veth| Ok(dp.attach(testing::ifindex(veth), mode, v.method)?)).collect()
}

fn detach(dp: &Datapath<'static>, atts: Vec<mirror_bpf::Attachment>) -> Result<()> {
    for a in atts {
        dp.detach(a)?;
    }
    Ok(())
}

/// One load with the variant in place, measured.
fn one_run(dp: &mut Datapath<'static>, bed: &Bed, v: &Variant, secs: u32) -> Result<Run> {
    set_target(dp, v)?;
    let atts = attach(dp, bed, v)?;
    let c0 = dp.counters()?;
    let b0 = all_prog_stats(dp);
    // Spawned outside the measured span: its children's CPU time is not the load's.
    let pods0 = bed.pod_packets();
    let drops0 = backlog_drops();
    let load0 = bed.load_ns();
    let res = bed.wrk(secs, CONNECTIONS);
    let load1 = bed.load_ns();
    let backlog = backlog_drops() - drops0;
    // Late packets of the closing connections settle first.
    std::thread::sleep(Duration::from_millis(100));
    let pods1 = bed.pod_packets();
    let extra_delivered = (pods1.0 - pods0.0) as i64 - (pods1.1 - pods0.1) as i64;
    let b1 = all_prog_stats(dp);
    let d = dp.counters()?.since(&c0);
    detach(dp, atts)?;
    let (requests, secs) = res?;
    Ok(Run {
        requests,
        secs,
        packets: d.get(stat_idx::STAT_PACKETS) - d.get(stat_idx::STAT_DUPLICATE),
        mirrored: d.get(stat_idx::STAT_MIRRORED_PACKETS),
        copy_errors: d.get(stat_idx::STAT_MIRROR_ERRORS),
        backlog_drops: backlog,
        extra_delivered,
        bpf_ns: b1 - b0,
        cpu_ns: load1 - load0,
    })
}

fn measure(plan: Plan, cpu: usize) -> Result<Results> {
    let dir = tempfile::Builder::new().prefix("mirror-bench-path").tempdir()?;
    let topo = Topology::new(&["client", "server"]);
    let _inside = topo.node.enter();
    let mut bed = Bed { topo, cpu, dir, load: None };
    let (made, missing) = sinks::create_all(|cmd| {
        let mut c = bed.node().command("sh");
        c.arg("-c").arg(cmd);
        sinks::try_sh(c)
    });
    let _nginx = Server::nginx(bed.topo.pod("server"), 80, bed.dir.path());
    pin_namespace(&bed.topo.pod("server").ns, cpu)?;
    bed.load = Some(LoadCpu::new(&bed.topo.pod("server").ns, cpu)?);
    let offloads = bed.node().sh(&format!("ethtool -k {} | grep -E '^(tx-checksumming|scatter-gather|tcp-segmentation-offload|generic-segmentation-offload|generic-receive-offload):' | tr '\\n' ' '", bed.pod_veths()[1]));

    let mut dp = testing::load(&DatapathOptions::default());
    dp.add_rule(RULE.parse()?)?;
    let _stats = stats_on()?;
    let variants: Vec<Variant> =
        sinks::selected().into_iter().filter(|v| v.sink().is_none_or(|k| made.contains(&k))).collect();

    // Warm-up: nginx, the routes, the neighbours, the classifier's maps.
    one_run(&mut dp, &bed, &variants[0], 1)?;
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    for round in 0..plan.rounds {
        eprintln!("traffic: round {}/{}", round + 1, plan.rounds);
        // Each round starts one variant later: slow stretches spread over all.
        for j in 0..variants.len() {
            let i = (j + round) % variants.len();
            let r = one_run(&mut dp, &bed, &variants[i], plan.secs)?;
            check(&variants[i], &r)?;
            runs[i].push(r);
        }
    }
    let mut down_peer = None;
    let mut rows: Vec<Row> = variants.iter().zip(runs).map(|(v, runs)| summarize(*v, runs)).collect();
    let base = rows[0].runs.clone();
    for row in &mut rows {
        let (cpu, bpf): (Vec<f64>, Vec<f64>) = row
            .runs
            .iter()
            .zip(&base)
            .map(|(r, b)| {
                let copies = r.per_request(r.copies()).max(1e-9);
                (
                    (r.per_request(r.cpu_ns) - b.per_request(b.cpu_ns)) / copies,
                    (r.per_request(r.bpf_ns) - b.per_request(b.bpf_ns)) / copies,
                )
            })
            .unzip();
        if row.variant.dev().is_some() {
            row.copy_cpu_ns = Summary::of(&cpu);
            row.copy_bpf_ns = Summary::of(&bpf);
        }
    }
    if plan.perf_secs > 0 {
        for row in rows.iter_mut().filter(|r| r.variant.dev().is_some()) {
            eprintln!("traffic: perf, {}", row.variant.key);
            row.profile = Some(profile(&mut dp, &bed, &row.variant, plan.perf_secs)?);
        }
    }
    if plan.capture_secs > 0 {
        for row in &mut rows {
            if row.variant.dev().is_some() {
                eprintln!("traffic: capture, {}", row.variant.key);
                row.capture = Some(capture(&mut dp, &bed, &row.variant, plan.capture_secs)?);
            }
        }
        // A veth sink's peer, down: can a capture read it at all?
        if made.contains(&SinkKind::VethPeerDown) {
            let peer = SinkKind::VethPeerDown.peer().expect("a veth has a peer");
            let err = match Tcpdump::start(bed.node(), peer, "in", &bed.dir.path().join("down-peer.pcap")) {
                Ok(t) => {
                    let _ = t.stop();
                    "tcpdump opened it".to_string()
                }
                Err(e) => format!("{e:#}"),
            };
            down_peer = Some(err);
        }
    }
    Ok(Results { rows, missing, plan, cpu, offloads, down_peer })
}

fn check(v: &Variant, r: &Run) -> Result<()> {
    if v.dev().is_some() {
        // Every packet but each connection's first few (before its first response). A copy the
        // sink refuses (bpf_clone_redirect returns the transmit's error) is made all the same:
        // counted, and reported.
        let copies = r.copies();
        ensure!(copies * 10 >= r.packets * 9, "{}: {} of {} packets copied", v.key, copies, r.packets);
    } else {
        ensure!(r.mirrored == 0 || v.method == MirrorMethod::Clone, "{}: copies made", v.key);
    }
    Ok(())
}

fn summarize(variant: Variant, runs: Vec<Run>) -> Row {
    let of = |f: &dyn Fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Row {
        variant,
        requests_per_s: of(&|r| r.requests as f64 / r.secs),
        copies_per_request: of(&|r| r.per_request(r.copies())),
        copy_errors: runs.iter().map(|r| r.copy_errors).sum::<u64>() as f64
            / runs.iter().map(Run::copies).sum::<u64>().max(1) as f64,
        backlog_drops: runs.iter().map(|r| r.backlog_drops).sum(),
        extra_per_copy: runs.iter().map(|r| r.extra_delivered).sum::<i64>() as f64
            / runs.iter().map(Run::copies).sum::<u64>().max(1) as f64,
        cpu_ns_per_request: of(&|r| r.per_request(r.cpu_ns)),
        copy_cpu_ns: Summary::of(&[]),
        copy_bpf_ns: Summary::of(&[]),
        profile: None,
        capture: None,
        runs,
    }
}

/// Pins every thread of every process in `ns` to `cpu`.
fn pin_namespace(ns: &Netns, cpu: usize) -> Result<()> {
    let out = Command::new("ip").args(["netns", "pids", ns.name()]).output()?;
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let st = Command::new("taskset").args(["-a", "-p", "-c", &cpu.to_string(), pid]).output()?;
        ensure!(st.status.success(), "taskset {pid}: {}", String::from_utf8_lossy(&st.stderr));
    }
    Ok(())
}

/// One more run under perf: ns per copy of each stage of the copy (see [`perf::stages`]), the
/// load's samples standing for its CPU time.
fn profile(dp: &mut Datapath<'static>, bed: &Bed, v: &Variant, secs: u32) -> Result<(Breakdown, Run)> {
    set_target(dp, v)?;
    let atts = attach(dp, bed, v)?;
    let c0 = dp.counters()?;
    let load0 = bed.load_ns();
    // perf starts first and stops first: every sample falls inside the load.
    let rec = perf::Recording::start(Some(bed.cpu), secs, &load_comms(bed.cpu))?;
    let res = bed.wrk(secs + 1, CONNECTIONS);
    let load1 = bed.load_ns();
    let d = dp.counters()?.since(&c0);
    detach(dp, atts)?;
    let (requests, wrk_secs) = res?;
    let st = rec.stages(&format!("traffic-{}", v.key), "", false)?;
    let run = Run {
        requests,
        secs: wrk_secs,
        packets: d.get(stat_idx::STAT_PACKETS) - d.get(stat_idx::STAT_DUPLICATE),
        mirrored: d.get(stat_idx::STAT_MIRRORED_PACKETS),
        copy_errors: d.get(stat_idx::STAT_MIRROR_ERRORS),
        cpu_ns: load1 - load0,
        ..Default::default()
    };
    Ok((st.scaled(run.cpu_ns as f64 / run.copies().max(1) as f64), run))
}

/// tcpdump on one interface of the node, one direction, to a file.
struct Tcpdump {
    child: std::process::Child,
    stderr: std::path::PathBuf,
}

impl Tcpdump {
    fn start(ns: &Netns, dev: &str, direction: &str, file: &Path) -> Result<Tcpdump> {
        let stderr = file.with_extension("log");
        let log = std::fs::File::create(&stderr)?;
        let child = ns
            .command("tcpdump")
            .args([
                "-i",
                dev,
                "-nn",
                "-s",
                "0",
                "-B",
                "16384",
                "-U",
                "--immediate-mode",
                "-Z",
                "root",
                "-Q",
                direction,
                "-w",
            ])
            .arg(file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting tcpdump")?;
        let mut t = Tcpdump { child, stderr };
        let start = Instant::now();
        loop {
            let log = std::fs::read_to_string(&t.stderr).unwrap_or_default();
            if log.contains("listening on") {
                return Ok(t);
            }
            if let Some(st) = t.child.try_wait()? {
                bail!("tcpdump on {dev} exited ({st}): {}", log.trim());
            }
            if start.elapsed() > Duration::from_secs(5) {
                let _ = t.child.kill();
                let _ = t.child.wait();
                bail!("tcpdump on {dev} did not start: {}", log.trim());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it (SIGINT: it flushes): (captured, dropped by the kernel).
    fn stop(mut self) -> Result<(u64, u64)> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        let mut log = String::new();
        std::fs::File::open(&self.stderr)?.read_to_string(&mut log)?;
        let count = |suffix: &str| {
            log.lines().find(|l| l.ends_with(suffix)).and_then(|l| l.split(' ').next()?.parse::<u64>().ok())
        };
        let captured = count("packets captured").or(count("packet captured")).unwrap_or(0);
        let dropped = count("packets dropped by kernel").or(count("packet dropped by kernel")).unwrap_or(0);
        Ok((captured, dropped))
    }
}

/// tshark's TCP checksum verdicts and the largest frame of a pcap file.
fn checksums(file: &Path) -> (String, u64) {
    let out = Command::new("tshark")
        .args([
            "-n",
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-e",
            "tcp.checksum.status",
            "-e",
            "frame.len",
            "-r",
        ])
        .arg(file)
        .stderr(Stdio::null())
        .output();
    let Ok(out) = out else { return ("tshark not run".into(), 0) };
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    let mut max_len = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut f = line.split('\t');
        let status = match f.next().unwrap_or("").trim() {
            "0" | "Bad" => "bad",
            "1" | "Good" => "good",
            "2" | "Unverified" | "" => "unverified",
            other => other,
        };
        *tally.entry(status.to_string()).or_default() += 1;
        max_len = max_len.max(f.next().and_then(|l| l.trim().parse().ok()).unwrap_or(0));
    }
    (tally.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "), max_len)
}

/// Captures on the sink in both directions during a load: does it see every copy?
fn capture(dp: &mut Datapath<'static>, bed: &Bed, v: &Variant, secs: u32) -> Result<CaptureCheck> {
    let dev = v.capture_dev().expect("a variant with a sink");
    let mut check = CaptureCheck { dev: dev.into(), ..Default::default() };
    let file_in = bed.dir.path().join(format!("{}-in.pcap", v.key));
    let file_out = bed.dir.path().join(format!("{}-out.pcap", v.key));
    let cap_in = Tcpdump::start(bed.node(), dev, "in", &file_in);
    let cap_out = Tcpdump::start(bed.node(), dev, "out", &file_out);
    let (cap_in, cap_out) = match (cap_in, cap_out) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            let err = [a.err(), b.err()].into_iter().flatten().map(|e| format!("{e:#}")).next();
            check.error = err;
            return Ok(check);
        }
    };
    set_target(dp, v)?;
    let atts = attach(dp, bed, v)?;
    let c0 = dp.counters()?;
    let drops0 = backlog_drops();
    // Fewer connections than the timed runs: captures must keep up.
    let res = bed.wrk(secs, 2);
    let d = dp.counters()?.since(&c0);
    detach(dp, atts)?;
    std::thread::sleep(Duration::from_millis(300));
    check.backlog_drops = backlog_drops() - drops0;
    let (seen_in, drop_in) = cap_in.stop()?;
    let (seen_out, drop_out) = cap_out.stop()?;
    res?;
    check.mirrored = d.get(stat_idx::STAT_MIRRORED_PACKETS);
    check.seen_in = seen_in;
    check.seen_out = seen_out;
    check.dropped = drop_in + drop_out;
    let file = if seen_in >= seen_out { &file_in } else { &file_out };
    (check.tcp_checksums, check.max_len) = checksums(file);
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_summary() {
        let text = "Running 5s test @ http://198.18.2.2:80/foo\n  1 threads and 4 connections\n\
                    \x20 123456 requests in 5.00s, 17.89MB read\nRequests/sec:  24691.20\n";
        assert_eq!(parse_wrk(text).unwrap(), (123456, 5.0));
        assert!(parse_wrk("  5 requests in 1.00s, 1KB read\n  Non-2xx or 3xx responses: 5\n").is_err());
    }
}
