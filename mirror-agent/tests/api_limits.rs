//! The API socket under connections that never finish a request: idle ones, half-sent heads,
//! half-sent bodies. The agent closes each after its timeout and gets its descriptors back,
//! holds at most `api.max_connections` at once however many come, and a normal client is
//! answered meanwhile.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::netns::Topology;
use mirror_e2e::proc::wait_until;

use common::{bins, status};

const MAX_CONNECTIONS: usize = 64;
/// The test's timeouts: header and request 1 s, idle 2 s.
const HEADER: Duration = Duration::from_secs(1);
/// Descriptors the agent may hold beyond its count at the start for its own work meanwhile (a
/// netlink request, a file it reads): a leak of connections is counted exactly, by name.
const SLACK: usize = 4;

/// Open descriptors of a process.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// API connections the agent holds: its descriptors that are sockets accepted on `socket`
/// (bound to its path, not listening). Counted by name rather than by the total of descriptors,
/// which moves with whatever else the agent opens and closes meanwhile. An accepted socket lives
/// in the network namespace of the client that connected (this test's), not the agent's.
fn api_connections(pid: u32, socket: &std::path::Path) -> usize {
    let table = std::fs::read_to_string("/proc/self/net/unix").unwrap_or_default();
    let path = socket.to_string_lossy();
    // Num RefCount Protocol Flags Type St Inode Path; St 03 is connected.
    let accepted: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[5] == "03" && f[7] == path).then(|| f[6].to_string())
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
        d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| {
                let l = l.to_string_lossy();
                l.strip_prefix("socket:[")
                    .and_then(|i| i.strip_suffix(']'))
                    .is_some_and(|i| accepted.contains(i))
            })
            .count()
    })
}

/// Waits until the agent holds no API connection and about the descriptors it held at first.
#[track_caller]
fn assert_released(pid: u32, socket: &std::path::Path, base: usize) {
    assert!(
        wait_until(Duration::from_secs(5), || api_connections(pid, socket) == 0 && fds(pid) <= base + SLACK),
        "descriptors did not come back: {} API connections, {} descriptors after, {base} before",
        api_connections(pid, socket),
        fds(pid)
    );
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or(0)
}

/// What a client that stopped mid-request gets: everything the agent sent until it closed the
/// connection, and when that was (`None`: still open after `within`).
fn read_until_closed(s: &mut UnixStream, within: Duration) -> (String, Option<Instant>) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (String::from_utf8_lossy(&got).into_owned(), None);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), Some(Instant::now())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
            }
            // Reset by the agent: closed too.
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), Some(Instant::now())),
        }
    }
}

/// A connection that sends part of a request and stops: nothing, half a head, or a whole head
/// and half its body.
fn stalled(socket: &std::path::Path, kind: usize) -> UnixStream {
    let mut s =
        UnixStream::connect(socket).unwrap_or_else(|e| panic!("connecting {}: {e}", socket.display()));
    let partial: &[u8] = match kind % 3 {
        0 => b"",
        1 => b"GET /v1/status HTTP/1.1\r\nHost: agent\r\nAccept: app",
        _ => b"POST /v1/rules HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"rule\": \"stat",
    };
    s.write_all(partial).unwrap();
    s
}

#[test]
fn idle_and_half_sent_connections_are_closed_and_clients_still_served() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&[]);
    let api = [
        ("max_connections", MAX_CONNECTIONS.to_string()),
        ("header_timeout", "1s".into()),
        ("request_timeout", "1s".into()),
        ("idle_timeout", "2s".into()),
    ];
    let cfg = AgentConfig { api: api.map(|(k, v)| (k.to_string(), v)).to_vec(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let agent = env.start(&[]);
    let pid = agent.pid();
    let socket = env.socket();
    // Whatever the agent opens at its first request is open from here on.
    status(&env);
    let base = fds(pid);
    let rss_before = rss_kib(pid);

    // Within the limit: 60 stalled connections, all accepted at once.
    let t0 = Instant::now();
    let mut conns: Vec<UnixStream> = (0..60).map(|i| stalled(&socket, i)).collect();
    assert!(
        wait_until(Duration::from_secs(5), || api_connections(pid, &socket) >= 60),
        "the agent holds {} API connections after 60 were opened",
        api_connections(pid, &socket)
    );
    // A normal client meanwhile: answered at once.
    let t = Instant::now();
    status(&env);
    assert!(t.elapsed() < HEADER, "status took {:?} beside 60 stalled connections", t.elapsed());
    // Each stalled connection is closed by the agent after its timeout; a half-sent body gets
    // a 408 that says which limit it hit.
    for (i, c) in conns.iter_mut().enumerate() {
        let (answer, closed) = read_until_closed(c, Duration::from_secs(10));
        let closed = closed.unwrap_or_else(|| panic!("connection {i} still open after 10 s: {answer:?}"));
        let took = closed - t0;
        assert!(
            took >= HEADER - Duration::from_millis(100) && took < 4 * HEADER,
            "connection {i} closed after {took:?}"
        );
        if i % 3 == 2 {
            assert!(
                answer.starts_with("HTTP/1.1 408") && answer.contains("api.request_timeout"),
                "connection {i}: {answer:?}"
            );
        }
    }
    drop(conns);
    assert_released(pid, &socket, base);

    // Beyond the limit: 400 stalled connections. The agent holds at most MAX_CONNECTIONS of
    // them at once; the others wait to be accepted, and so does a normal client, which is
    // answered as soon as the ones before it have timed out (in rounds of HEADER).
    let t0 = Instant::now();
    let mut conns: Vec<UnixStream> = (0..400).map(|i| stalled(&socket, i)).collect();
    let ctl = std::thread::scope(|scope| {
        let ctl = scope.spawn(|| {
            let t = Instant::now();
            (env.ctl(&["status"]), t.elapsed())
        });
        let mut most = 0;
        while !ctl.is_finished() || t0.elapsed() < 3 * HEADER {
            most = most.max(api_connections(pid, &socket));
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            most <= MAX_CONNECTIONS,
            "{most} API connections held with 400 waiting: more than {MAX_CONNECTIONS}"
        );
        ctl.join().unwrap()
    });
    let (out, took) = ctl;
    eprintln!("status answered after {took:?} behind 400 stalled connections");
    assert!(
        out.status.success() && out.stdout.contains("mirror-agent"),
        "status beside 401 connections: {out:?}"
    );
    // 401 connections before it at most, 64 a round of 1 to 2 s.
    assert!(took < Duration::from_secs(9), "status took {took:?}");
    for (i, c) in conns.iter_mut().enumerate() {
        let (answer, closed) = read_until_closed(c, Duration::from_secs(20));
        assert!(closed.is_some(), "connection {i} of 400 still open after {:?}: {answer:?}", t0.elapsed());
    }
    drop(conns);
    assert_released(pid, &socket, base);
    let rss_after = rss_kib(pid);
    eprintln!(
        "agent: {base} descriptors before and after; RSS {rss_before} KiB before, {rss_after} KiB after 460 stalled connections"
    );
    // Buffers are freed (the allocator may keep some pages).
    assert!(rss_after < rss_before + 32 * 1024, "RSS grew from {rss_before} to {rss_after} KiB");
    // And the API still answers.
    status(&env);
    agent.terminate();
}
