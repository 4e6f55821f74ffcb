//! What loading cost each program of the classifier: the instructions the verifier processed
//! (the kernel's `verified_insns`, bounded by its 1,000,000) and the time it took, as the
//! verifier's statistics say (log level 4, one line per program, read from libbpf's log).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Mutex;
use std::time::Duration;

use libbpf_rs::{Object, OpenProgramMut};

/// The verifier's log level that gives its statistics alone (BPF_LOG_STATS).
pub(crate) const LOG_STATS: u32 = 4;

/// One loaded program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStats {
    /// Its name in the classifier (`tcx_ingress_mirror`, `proto_http1`, ...).
    pub name: String,
    /// The kernel's id of it.
    pub id: u32,
    /// Instructions the verifier processed (of its limit of 1,000,000).
    pub verified_insns: u32,
    /// The verifier's time on it, when its statistics were read.
    pub verify_time: Option<Duration>,
}

/// Verification times by program name, from the latest load's log.
static VERIFY_TIMES: Mutex<BTreeMap<String, Duration>> = Mutex::new(BTreeMap::new());

/// Asks the verifier for its statistics on `prog` (the log of a successful load).
pub(crate) fn ask_stats(prog: &mut OpenProgramMut<'_>) {
    prog.set_log_level(LOG_STATS);
}

/// Reads a program's verification time from a message of libbpf's log, if it is one:
/// "prog 'NAME': -- BEGIN PROG LOAD LOG --" ... "verification time N usec".
pub(crate) fn note_log(msg: &str) {
    let msg = msg.strip_prefix("libbpf: ").unwrap_or(msg);
    let Some(rest) = msg.strip_prefix("prog '") else { return };
    let Some((name, log)) = rest.split_once("': -- BEGIN PROG LOAD LOG --") else { return };
    let usec = log.lines().find_map(|l| l.trim().strip_prefix("verification time ")?.strip_suffix(" usec")?.parse().ok());
    if let (Some(usec), Ok(mut times)) = (usec, VERIFY_TIMES.lock()) {
        times.insert(name.to_string(), Duration::from_micros(usec));
    }
}

/// The kernel's id and `verified_insns` of the program behind `fd` (kernel 5.16+ for the
/// count; 0 before).
pub fn prog_info(fd: BorrowedFd<'_>) -> std::io::Result<(u32, u32)> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a bpf_prog_info of `len` bytes that outlives the call.
    let rc = unsafe {
        libbpf_sys::bpf_obj_get_info_by_fd(fd.as_raw_fd(), (&mut info as *mut libbpf_sys::bpf_prog_info).cast(), &mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(-rc));
    }
    Ok((info.id, info.verified_insns))
}

/// Every program of `obj` that was loaded, with what loading it cost.
pub(crate) fn stats(obj: &Object) -> Vec<ProgramStats> {
    let times = VERIFY_TIMES.lock().map(|t| t.clone()).unwrap_or_default();
    obj.progs()
        .filter(|p| p.autoload())
        .filter_map(|p| {
            let name = p.name().to_string_lossy().into_owned();
            let (id, verified_insns) = prog_info(p.as_fd()).ok()?;
            let verify_time = times.get(&name).copied();
            Some(ProgramStats { name, id, verified_insns, verify_time })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verification_time_is_read_from_the_log_of_a_load() {
        note_log(
            "prog 'proto_test_only': -- BEGIN PROG LOAD LOG --\nverification time 12345 usec\nstack depth 0\n\
             processed 7 insns (limit 1000000)\n-- END PROG LOAD LOG --",
        );
        note_log("libbpf: some other line");
        let times = VERIFY_TIMES.lock().unwrap();
        assert_eq!(times.get("proto_test_only"), Some(&Duration::from_micros(12345)));
    }
}
