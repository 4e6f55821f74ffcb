//! Many connections at once, each with one request waiting on its answer: one asyncio client
//! process in a pod's namespace holding tens of thousands of sockets, recording for each
//! connection when its request went out and when the answer came, on the monotonic clock the
//! classifier stamps with. For timers per flow, which no packet drives.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proc::Proc;
use crate::topology::netns::Netns;

/// One connection's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The client's address.
    pub local: SocketAddr,
    /// Just before the request was written, monotonic ns.
    pub sent_ns: u64,
    /// When the whole answer had been read, monotonic ns.
    pub answered_ns: u64,
    /// Its status.
    pub status: u16,
}

/// The client, running.
pub struct Crowd {
    proc: Proc,
    out: PathBuf,
    connections: usize,
}

impl Crowd {
    /// Opens `connections` connections from `ns` to `server` (at most 256 being opened at a
    /// time, so that the server's accept queue holds them) and sends `GET target` on each as
    /// soon as it is open; each closes once answered. The script and its record go to `dir`.
    pub fn start(ns: &Netns, server: SocketAddr, connections: usize, target: &str, dir: &Path) -> Crowd {
        let script = dir.join("crowd.py");
        std::fs::write(&script, CLIENT).expect("writing the crowd client");
        let out = dir.join("crowd.txt");
        let mut cmd = ns.command("python3");
        cmd.arg(&script).arg(server.ip().to_string()).arg(server.port().to_string());
        cmd.arg(connections.to_string()).arg(target).arg(&out);
        let proc = Proc::spawn(&format!("crowd of {connections} connections in {}", ns.name()), &mut cmd);
        Crowd { proc, out, connections }
    }

    /// Whether it is still at work.
    pub fn running(&mut self) -> bool {
        self.proc.running()
    }

    /// Waits up to `timeout` for it to end; every connection's request. Panics when it failed
    /// or took too long.
    #[track_caller]
    pub fn finish(mut self, timeout: Duration) -> Vec<Held> {
        let status = self.proc.wait(timeout);
        assert!(
            status.is_some_and(|s| s.success()),
            "the crowd client failed ({status:?}): {}",
            self.proc.output()
        );
        let text = std::fs::read_to_string(&self.out).expect("reading the crowd's record");
        let held: Vec<Held> = text.lines().map(parse).collect();
        assert_eq!(held.len(), self.connections, "{}", self.proc.output());
        held
    }
}

/// "ip port sent_ns answered_ns status"
fn parse(line: &str) -> Held {
    let f: Vec<&str> = line.split(' ').collect();
    let bad = || panic!("the crowd client wrote {line:?}");
    let [ip, port, sent, answered, status] = f[..] else { bad() };
    let ip: IpAddr = ip.parse().unwrap_or_else(|_| bad());
    Held {
        local: SocketAddr::new(ip, port.parse().unwrap_or_else(|_| bad())),
        sent_ns: sent.parse().unwrap_or_else(|_| bad()),
        answered_ns: answered.parse().unwrap_or_else(|_| bad()),
        status: status.parse().unwrap_or_else(|_| bad()),
    }
}

/// Arguments: server address, port, connections, target, output file.
const CLIENT: &str = r#"import asyncio
import resource
import sys
import time

host, port, count, target, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
REQUEST = b"GET %s HTTP/1.1\r\nHost: crowd\r\n\r\n" % target.encode()
OPENING = 256
DEADLINE = 60


async def one(gate):
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        local = writer.get_extra_info("sockname")
        sent = time.monotonic_ns()
        writer.write(REQUEST)
        await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            await reader.readexactly(int(value))
    answered = time.monotonic_ns()
    writer.close()
    return "%s %d %d %d %s" % (local[0], local[1], sent, answered, lines[0].split(" ")[1])


async def main():
    gate = asyncio.Semaphore(OPENING)
    return await asyncio.wait_for(asyncio.gather(*(one(gate) for _ in range(count))), DEADLINE)


resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
lines = asyncio.run(main())
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
"#;
