//! The request behind a trigger, replayed to the mirror ahead of the response (see
//! `src/bpf/include/replay.h`): which flows keep the segment of their latest request, the
//! replay program on the mirror interface's egress, and the kept segment as events carry it.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use libbpf_rs::{TcHookBuilder, TC_EGRESS};

use crate::attach::{attach_tcx, free_prio, TcxLink, TC_HANDLE};
use crate::error::{Context, Error, Result};
use crate::netlink;
use crate::rule::Rule;
use crate::shared::types;
use crate::skel::classifier::ClassifierSkel;

/// The Ethernet source address of a replayed request (`02:72:65:70:6c:79`, locally
/// administered): what tells a reader of the mirror a replay from a copy.
pub const REPLAY_MAC: [u8; 6] = [0x02, 0x72, 0x65, 0x70, 0x6c, 0x79];

/// Bytes of a request's segment kept, from its Ethernet header.
pub const FRAME_MAX: usize = types::mirror_limits::REPLAY_FRAME_MAX.0 as usize;

/// Bytes of the map per slot (one flow's latest request).
pub const SLOT_BYTES: usize = std::mem::size_of::<types::replay_slot>();

/// The request segment an event carries: what the mirror received ahead of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedRequest {
    /// When the request passed, monotonic ns.
    pub ts_ns: u64,
    /// The segment's length on the wire (more than `frame`: it was kept cut).
    pub wire_len: u32,
    /// The segment from its Ethernet header on, as it passed (at most [`FRAME_MAX`] bytes).
    pub frame: Vec<u8>,
}

impl ReplayedRequest {
    /// The TCP payload in `frame` (the request's first bytes), `None` if the headers do not
    /// parse (Ethernet, up to two VLAN tags, IPv4 or IPv6 without extension headers, TCP).
    pub fn payload(&self) -> Option<&[u8]> {
        let f = &self.frame;
        let mut l3 = 14;
        let mut proto = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
        for _ in 0..2 {
            if proto == 0x8100 || proto == 0x88a8 {
                proto = u16::from_be_bytes([*f.get(l3 + 2)?, *f.get(l3 + 3)?]);
                l3 += 4;
            }
        }
        let (l4, next) = match proto {
            0x0800 => (l3 + usize::from(f.get(l3)? & 0x0f) * 4, *f.get(l3 + 9)?),
            0x86dd => (l3 + 40, *f.get(l3 + 6)?),
            _ => return None,
        };
        if next != 6 {
            return None;
        }
        let data = l4 + usize::from(f.get(l4 + 12)? >> 4) * 4;
        f.get(data..)
    }
}

/// Which flows keep their latest request (`settings.replay_keep`) for `rules`: every flow when a
/// rule covers any server port, only flows to the ports that have rules otherwise.
pub(crate) fn keep_mode<'a>(on: bool, rules: impl IntoIterator<Item = &'a Rule>) -> u32 {
    use types::replay_keep as k;
    let mut mode = k::REPLAY_OFF.0;
    if !on {
        return mode;
    }
    for r in rules {
        if r.port.is_none() {
            return k::REPLAY_ALL.0;
        }
        mode = k::REPLAY_PORTS.0;
    }
    mode
}

#[derive(Debug)]
enum Hook {
    Tcx(TcxLink, Option<PathBuf>),
    Tc { prio: u16, created_qdisc: bool },
}

/// The replay program attached to a mirror interface's egress; give it back to
/// [`crate::datapath::Datapath::detach_replay`].
#[derive(Debug)]
pub struct ReplayHook {
    /// The interface.
    pub ifindex: u32,
    hook: Hook,
}

impl ReplayHook {
    /// Whether the program runs from a TCX link (else a cls_bpf filter).
    pub fn tcx(&self) -> bool {
        matches!(self.hook, Hook::Tcx(..))
    }
}

/// Where the TCX link of the replay program on `ifindex` is pinned.
fn link_pin(pin_path: Option<&Path>, ifindex: u32) -> Option<PathBuf> {
    pin_path.map(|d| d.join(crate::attach::LINKS_DIR).join(format!("replay-{ifindex}")))
}

/// Attaches the replay program to the egress of `ifindex`, with a TCX link (pinned, adopted
/// from an earlier instance) when `tcx`, else a cls_bpf filter on clsact.
pub(crate) fn attach(
    skel: &ClassifierSkel<'_>,
    pin_path: Option<&Path>,
    ifindex: u32,
    tcx: bool,
) -> Result<ReplayHook> {
    let what = || format!("attaching the replay program to ifindex {ifindex}");
    if tcx {
        let prog = &skel.progs.tcx_replay;
        let pin = link_pin(pin_path, ifindex);
        let link = match &pin {
            Some(p) if p.exists() => {
                let link = TcxLink::open(p).context(|| format!("opening {}", p.display()))?;
                link.update_prog(prog).context(what)?;
                link
            }
            _ => {
                let link = attach_tcx(prog, ifindex, true).context(what)?;
                if let Some(p) = &pin {
                    let dir = p.parent().unwrap_or(p);
                    std::fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
                    link.pin(p).context(|| format!("pinning {}", p.display()))?;
                }
                link
            }
        };
        return Ok(ReplayHook { ifindex, hook: Hook::Tcx(link, pin) });
    }
    let prog = &skel.progs.tc_replay;
    let mut qdisc = TcHookBuilder::new(prog.as_fd()).ifindex(ifindex as i32).hook(TC_EGRESS);
    let created_qdisc = match qdisc.create() {
        Ok(_) => true,
        Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(Error::Bpf { what: format!("creating clsact on ifindex {ifindex}"), cause: e }),
    };
    let filters = netlink::filters(ifindex, true).context(what)?;
    let ours = filters.iter().find(|f| f.handle == TC_HANDLE && f.kind == "bpf").map(|f| f.prio);
    let prio = ours.unwrap_or_else(|| free_prio(&filters));
    TcHookBuilder::new(prog.as_fd())
        .ifindex(ifindex as i32)
        .replace(ours.is_some())
        .handle(TC_HANDLE)
        .priority(prio as u32)
        .hook(TC_EGRESS)
        .attach()
        .context(what)?;
    Ok(ReplayHook { ifindex, hook: Hook::Tc { prio, created_qdisc } })
}

/// Detaches the replay program (and removes the clsact qdisc it created, if left empty).
pub(crate) fn detach(skel: &ClassifierSkel<'_>, hook: ReplayHook) -> Result<()> {
    let ifindex = hook.ifindex;
    let gone = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENOENT));
    match hook.hook {
        Hook::Tcx(link, pin) => {
            if let Some(p) = pin {
                let _ = std::fs::remove_file(p);
            }
            link.detach().map_err(|cause| Error::Io {
                what: format!("detaching the replay program from ifindex {ifindex}"),
                cause,
            })
        }
        Hook::Tc { prio, created_qdisc } => {
            match netlink::del_filter(ifindex, true, prio, TC_HANDLE) {
                Ok(()) => {}
                Err(e) if gone(&e) => return Ok(()),
                Err(e) => {
                    return Err(Error::Io {
                        what: format!("removing the replay filter of ifindex {ifindex}"),
                        cause: e,
                    })
                }
            }
            let empty = netlink::filters(ifindex, false).is_ok_and(|f| f.is_empty())
                && netlink::filters(ifindex, true).is_ok_and(|f| f.is_empty());
            if created_qdisc && empty {
                let prog = &skel.progs.tc_replay;
                let mut q = TcHookBuilder::new(prog.as_fd()).ifindex(ifindex as i32).hook(TC_EGRESS);
                let _ = q.destroy();
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_mode_follows_the_rules() {
        use types::replay_keep as k;
        let global: Rule = "status=500".parse().unwrap();
        let scoped: Rule = "port=8080 status=500".parse().unwrap();
        assert_eq!(keep_mode(true, []), k::REPLAY_OFF.0);
        assert_eq!(keep_mode(true, [&scoped]), k::REPLAY_PORTS.0);
        assert_eq!(keep_mode(true, [&scoped, &global]), k::REPLAY_ALL.0);
        assert_eq!(keep_mode(false, [&global]), k::REPLAY_OFF.0);
    }

    #[test]
    fn payload_skips_the_headers() {
        // Ethernet, one VLAN tag, IPv4 with options (IHL 6), TCP with options (doff 8).
        let mut f = vec![0u8; 12];
        f.extend([0x81, 0x00, 0, 5, 0x08, 0x00]);
        let mut ip = vec![0u8; 24];
        ip[0] = 0x46;
        ip[9] = 6;
        f.extend(ip);
        let mut tcp = vec![0u8; 32];
        tcp[12] = 8 << 4;
        f.extend(tcp);
        f.extend(b"GET /x HTTP/1.1\r\n");
        let r = ReplayedRequest { ts_ns: 1, wire_len: f.len() as u32, frame: f.clone() };
        assert_eq!(r.payload(), Some(&b"GET /x HTTP/1.1\r\n"[..]));
        // Cut inside the headers: no payload.
        let cut = ReplayedRequest { frame: f[..40].to_vec(), ..r };
        assert_eq!(cut.payload(), None);
    }
}
