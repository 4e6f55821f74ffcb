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
    let usec = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("verification time ")?.strip_suffix(" usec")?.parse().ok());
    if let (Some(usec), Ok(mut times)) = (usec, VERIFY_TIMES.lock()) {
        times.insert(name.to_string(), Duration::from_micros(usec));
    }
}

/// Fills `info` (its pointers and counts say what to copy) for the program behind `fd`.
fn info_into(fd: BorrowedFd<'_>, info: &mut libbpf_sys::bpf_prog_info) -> std::io::Result<()> {
    let mut len = std::mem::size_of_val(info) as u32;
    // SAFETY: `info` is a bpf_prog_info of `len` bytes, and the buffers its pointers name hold
    // the counts it gives; all outlive the call.
    let rc = unsafe {
        libbpf_sys::bpf_obj_get_info_by_fd(
            fd.as_raw_fd(),
            (info as *mut libbpf_sys::bpf_prog_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(-rc));
    }
    Ok(())
}

/// The kernel's id and `verified_insns` of the program behind `fd` (kernel 5.16+ for the
/// count; 0 before).
pub fn prog_info(fd: BorrowedFd<'_>) -> std::io::Result<(u32, u32)> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    info_into(fd, &mut info)?;
    Ok((info.id, info.verified_insns))
}

/// The kernel's generic map helpers. The verifier turns a program's map lookup into a few
/// inlined instructions (arrays) or a direct call of the map's own function (hash maps), and an
/// update or delete into such a call, except where one call instruction may see two maps (the
/// compiler merged two calls into one): that call stays a call of the helper, which calls the
/// map's function through a pointer, a retpoline on this kind of CPU.
const GENERIC_MAP_HELPERS: [&str; 3] = ["bpf_map_lookup_elem", "bpf_map_update_elem", "bpf_map_delete_elem"];

/// The instruction offsets at which the program behind `fd`, as the verifier translated it,
/// calls one of the generic map helpers (see GENERIC_MAP_HELPERS). Needs root: the kernel
/// gives the calls' targets and its symbols' addresses only to it.
pub fn generic_map_calls(fd: BorrowedFd<'_>) -> std::io::Result<Vec<usize>> {
    let syms = std::fs::read_to_string("/proc/kallsyms")?;
    let addr = |name: &str| {
        syms.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let a = u64::from_str_radix(f.next()?, 16).ok()?;
            (f.nth(1)? == name && a != 0).then_some(a)
        })
    };
    let missing =
        |what: &str| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what}: no address"));
    let base = addr("__bpf_call_base").ok_or_else(|| missing("__bpf_call_base"))?;
    // A helper call's immediate is its address less __bpf_call_base (kernel/bpf/core.c).
    let targets = GENERIC_MAP_HELPERS
        .iter()
        .map(|h| addr(h).map(|a| a.wrapping_sub(base) as i32).ok_or_else(|| missing(h)))
        .collect::<std::io::Result<Vec<i32>>>()?;
    let mut info = libbpf_sys::bpf_prog_info::default();
    info_into(fd, &mut info)?;
    let mut insns = vec![0u64; info.xlated_prog_len as usize / 8];
    let mut info = libbpf_sys::bpf_prog_info {
        xlated_prog_len: (insns.len() * 8) as u32,
        xlated_prog_insns: insns.as_mut_ptr() as u64,
        ..Default::default()
    };
    info_into(fd, &mut info)?;
    // struct bpf_insn: code, registers (source in the high nibble), offset, immediate.
    const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    Ok(insns
        .iter()
        .enumerate()
        .filter(|(_, i)| {
            let b = i.to_le_bytes();
            let imm = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            b[0] == CALL && b[1] >> 4 == 0 && targets.contains(&imm)
        })
        .map(|(at, _)| at)
        .collect())
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

/// A source line of a loaded BPF program at the JITed address where its code starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitedLine {
    /// The kernel address of the line's first JITed instruction.
    pub addr: u64,
    /// The program it belongs to.
    pub prog: String,
    /// "file:line", from the program's BTF line info.
    pub place: String,
    /// The line's source text.
    pub text: String,
}

/// Every source line of every loaded program whose name is in `names`, with the address its
/// JITed code starts at (BTF line info, kernel 5.0+): what turns a sampled address into a line.
pub fn jited_lines(names: &[&str]) -> Vec<JitedLine> {
    let mut out = Vec::new();
    let mut id = 0u32;
    // SAFETY: plain syscalls on ids and descriptors we own; buffers outlive each call.
    unsafe {
        while libbpf_sys::bpf_prog_get_next_id(id, &mut id) == 0 {
            let fd = libbpf_sys::bpf_prog_get_fd_by_id(id);
            if fd < 0 {
                continue;
            }
            let fd = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
            let mut info = libbpf_sys::bpf_prog_info::default();
            if info_into(fd.as_fd(), &mut info).is_err() {
                continue;
            }
            let name: String = info.name.iter().take_while(|c| **c != 0).map(|c| *c as u8 as char).collect();
            if !names.iter().any(|n| n.starts_with(&name) && !name.is_empty()) || info.nr_jited_line_info == 0
            {
                continue;
            }
            let n = info.nr_line_info.min(info.nr_jited_line_info) as usize;
            let mut lines = vec![libbpf_sys::bpf_line_info::default(); info.nr_line_info as usize];
            let mut addrs = vec![0u64; info.nr_jited_line_info as usize];
            let (btf_id, nl, nj) = (info.btf_id, info.nr_line_info, info.nr_jited_line_info);
            let mut info = libbpf_sys::bpf_prog_info {
                nr_line_info: nl,
                line_info_rec_size: std::mem::size_of::<libbpf_sys::bpf_line_info>() as u32,
                line_info: lines.as_mut_ptr() as u64,
                nr_jited_line_info: nj,
                jited_line_info_rec_size: 8,
                jited_line_info: addrs.as_mut_ptr() as u64,
                ..Default::default()
            };
            if info_into(fd.as_fd(), &mut info).is_err() {
                continue;
            }
            let btf = libbpf_sys::btf__load_from_kernel_by_id(btf_id);
            if btf.is_null() {
                continue;
            }
            let s = |off: u32| {
                let p = libbpf_sys::btf__name_by_offset(btf, off);
                if p.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            for i in 0..n {
                let li = &lines[i];
                let file = s(li.file_name_off);
                let file = file.rsplit('/').next().unwrap_or(&file).to_string();
                out.push(JitedLine {
                    addr: addrs[i],
                    prog: name.clone(),
                    place: format!("{file}:{}", li.line_col >> 10),
                    text: s(li.line_off).trim().to_string(),
                });
            }
            libbpf_sys::btf__free(btf);
        }
    }
    out.sort_by_key(|l| l.addr);
    out
}
