//! Running the tools the benchmark drives: a command must succeed, or its output says why.

use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};

/// Runs `cmd` (`what` names it in errors); its output, or an error with its stdout and stderr.
pub fn run(mut cmd: Command, what: &str) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// Pins every thread of process `pid` to `cpu`.
pub fn pin_threads(pid: &str, cpu: usize) -> Result<()> {
    let mut cmd = Command::new("taskset");
    cmd.args(["-a", "-p", "-c", &cpu.to_string(), pid]);
    run(cmd, &format!("pinning pid {pid} to CPU {cpu}")).map(drop)
}
