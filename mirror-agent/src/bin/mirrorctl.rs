//! mirrorctl: the operator's CLI for mirror-agent.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes away.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = mirror_agent::ctl::Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mirrorctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(mirror_agent::ctl::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mirrorctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
