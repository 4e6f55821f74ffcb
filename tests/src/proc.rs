//! Child processes the tests start (servers, captures): their output is collected in the
//! background, waits are bounded, and whatever is still running is killed on drop.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A process we started, killed on drop if still running.
pub struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    output: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr collected; `what` names it in messages.
    pub fn spawn(what: &str, cmd: &mut Command) -> Proc {
        Self::start(what, cmd.stdin(Stdio::null()))
    }

    /// Like [`Proc::spawn`], with a pipe to its stdin for [`Proc::send`].
    pub fn spawn_with_input(what: &str, cmd: &mut Command) -> Proc {
        let mut proc = Self::start(what, cmd.stdin(Stdio::piped()));
        proc.stdin = proc.child.stdin.take();
        proc
    }

    fn start(what: &str, cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let output = Arc::new(Mutex::new(String::new()));
        // Readers end by themselves when the process closes its pipes.
        let stdout = child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>);
        let stderr = child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>);
        let readers = [stdout, stderr]
            .into_iter()
            .flatten()
            .map(|mut pipe| {
                let out = Arc::clone(&output);
                thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = pipe.read(&mut buf) {
                        out.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                })
            })
            .collect();
        Proc { what: what.to_string(), child, stdin: None, output, readers }
    }

    /// Writes `line` and a newline to its stdin.
    #[track_caller]
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap_or_else(|| panic!("{} has no stdin pipe", self.what));
        let res = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        res.unwrap_or_else(|e| panic!("writing to {}: {e}: {}", self.what, self.output()));
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed so far (stdout and stderr, interleaved).
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until it prints `needle`; panics with its output if it exits or `timeout` passes.
    #[track_caller]
    pub fn wait_for_output(&mut self, needle: &str, timeout: Duration) {
        let mut exited = None;
        let seen = wait_until(timeout, || {
            if self.output().contains(needle) {
                return true;
            }
            exited = self.child.try_wait().ok().flatten();
            exited.is_some()
        });
        assert!(
            seen && exited.is_none(),
            "{} did not print {needle:?} ({exited:?}): {}",
            self.what,
            self.output()
        );
    }

    /// Sends `signal`, waits up to `timeout` for the exit, then kills it.
    pub fn stop(&mut self, signal: i32, timeout: Duration) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        // SAFETY: kill only sends a signal, to a child we have not reaped yet (so not a reused pid).
        unsafe { libc::kill(self.pid() as i32, signal) };
        let status = self.wait(timeout);
        if status.is_none() {
            eprintln!("{} ignored signal {signal} for {timeout:?}: killed it", self.what);
        }
        status
    }

    /// Waits up to `timeout` for it to exit, then kills it: its exit status, `None` when it
    /// had to be killed.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(timeout, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Its last words (tcpdump's statistics) may still be in the pipes.
        wait_until(Duration::from_secs(1), || self.readers.iter().all(|r| r.is_finished()));
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
