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

/// The `skb->mark` (a packet socket's `SO_MARK`) of a replay the agent writes to the sink:
/// the replay program on the sink's egress hands such a frame on the way copies go, within the
/// node-wide budget (`REPLAY_AGENT_MARK` in replay.h).
pub const AGENT_MARK: u32 = 0x7270_6c79;

/// Bytes of a request's segment kept, from its Ethernet header.
pub const FRAME_MAX: usize = types::mirror_limits::REPLAY_FRAME_MAX.0 as usize;

/// The shortest segment the replay program makes a replay of (Ethernet, IPv4 and TCP headers).
const FRAME_MIN: usize = 54;

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
    /// The TCP or UDP payload in `frame` (the request's first bytes; a DNS query's message, after
    /// its 2-byte length over TCP), `None` if the headers do not parse (Ethernet, up to two
    /// VLAN tags, IPv4 or IPv6 without extension headers, TCP or UDP).
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
        let data = match next {
            6 => l4 + usize::from(f.get(l4 + 12)? >> 4) * 4,
            17 => l4 + 8,
            _ => return None,
        };
        f.get(data..)
    }

    /// The frame a replay of this request puts on the mirror, made as the replay program makes
    /// it (`replay_reshape` in replay.h): the kept segment, its Ethernet source set to
    /// [`REPLAY_MAC`]; when it was kept cut, the IP header made to say so (`replay_fix_length`:
    /// the IPv4 total length and, updated as `bpf_l3_csum_replace` does, the header checksum,
    /// or the IPv6 payload length; the TCP checksum is left as it was). `None` where the
    /// program makes no replay either: a segment shorter than 54 bytes, or cut and neither
    /// IPv4 nor IPv6 (behind up to two VLAN tags).
    pub fn reshaped(&self) -> Option<Vec<u8>> {
        let mut f = self.frame.clone();
        if f.len() < FRAME_MIN || f.len() > FRAME_MAX {
            return None;
        }
        f[6..12].copy_from_slice(&REPLAY_MAC);
        let len = f.len();
        if self.wire_len as usize <= len {
            return Some(f);
        }
        let be16 = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
        let mut l3 = 14;
        let mut proto = be16(&f, 12);
        for _ in 0..2 {
            if proto == 0x8100 || proto == 0x88a8 {
                proto = be16(&f, l3 + 2);
                l3 += 4;
            }
        }
        match proto {
            0x0800 => {
                let old = be16(&f, l3 + 2);
                let new = (len - l3) as u16;
                f[l3 + 2..l3 + 4].copy_from_slice(&new.to_be_bytes());
                let sum = csum_replace2(be16(&f, l3 + 10), old, new);
                f[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
            }
            0x86dd => {
                let payload = len.wrapping_sub(l3 + 40) as u16;
                f[l3 + 4..l3 + 6].copy_from_slice(&payload.to_be_bytes());
            }
            _ => return None,
        }
        Some(f)
    }
}

/// One's complement sum of two 16-bit words (the kernel's `csum16_add`).
fn csum16_add(sum: u16, v: u16) -> u16 {
    let (r, carry) = sum.overflowing_add(v);
    r + u16::from(carry)
}

/// Checksum `sum` with the word `old` it covers replaced by `new` (the kernel's
/// `csum_replace2`, RFC 1624; byte order does not change a one's complement sum).
fn csum_replace2(sum: u16, old: u16, new: u16) -> u16 {
    !csum16_add(csum16_add(!sum, !old), new)
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

    /// The IPv4 header checksum of `h`, computed whole.
    fn ipv4_checksum(h: &[u8]) -> u16 {
        let mut acc: u32 = h
            .chunks(2)
            .enumerate()
            .filter(|(i, _)| *i != 5)
            .map(|(_, w)| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    /// A TCP segment of `payload` bytes from a client (MAC 02:00:00:00:00:01), IPv4 or IPv6,
    /// behind `vlans` 802.1Q tags, its IPv4 checksum right.
    fn segment(v6: bool, vlans: usize, payload: usize) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
        for _ in 0..vlans {
            f.extend([0x81, 0x00, 0, 7]);
        }
        let tcp_len = 20 + payload;
        if v6 {
            f.extend([0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend((tcp_len as u16).to_be_bytes());
            f.extend([6, 64]);
            f.extend([0x20, 0x01, 0, 2].iter().chain(&[0; 11]).chain(&[1]));
            f.extend([0x20, 0x01, 0, 2].iter().chain(&[0; 11]).chain(&[2]));
        } else {
            let mut ip = vec![0x45, 0];
            ip.extend(((20 + tcp_len) as u16).to_be_bytes());
            ip.extend([0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
            let sum = ipv4_checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend([0x08, 0x00]);
            f.extend(ip);
        }
        let mut tcp = vec![0u8; 20];
        tcp[12] = 5 << 4;
        f.extend(tcp);
        f.extend((0..payload).map(|i| b'a' + (i % 26) as u8));
        f
    }

    #[test]
    fn a_replay_is_reshaped_as_the_program_does() {
        // Kept whole: only the Ethernet source changes.
        let whole = segment(false, 0, 200);
        let r = ReplayedRequest { ts_ns: 1, wire_len: whole.len() as u32, frame: whole.clone() };
        let f = r.reshaped().expect("a replay");
        assert_eq!(f[6..12], REPLAY_MAC);
        assert_eq!((&f[..6], &f[12..]), (&whole[..6], &whole[12..]));

        // Kept cut: the IP header says what the replay carries.
        for (v6, vlans) in [(false, 0), (false, 1), (false, 2), (true, 0), (true, 2)] {
            let wire = segment(v6, vlans, 1200);
            let kept = wire[..FRAME_MAX].to_vec();
            let r = ReplayedRequest { ts_ns: 1, wire_len: wire.len() as u32, frame: kept.clone() };
            let f = r.reshaped().expect("a replay");
            assert_eq!(f.len(), FRAME_MAX);
            assert_eq!(f[6..12], REPLAY_MAC);
            let l3 = 14 + 4 * vlans;
            let be16 = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
            if v6 {
                assert_eq!(usize::from(be16(l3 + 4)), FRAME_MAX - l3 - 40, "v6, {vlans} tags");
            } else {
                assert_eq!(usize::from(be16(l3 + 2)), FRAME_MAX - l3, "{vlans} tags");
                // Updated in place, the checksum is the one computed over the new header.
                assert_eq!(be16(l3 + 10), ipv4_checksum(&f[l3..l3 + 20]), "{vlans} tags");
                assert_ne!(be16(l3 + 10), u16::from_be_bytes([kept[l3 + 10], kept[l3 + 11]]));
            }
            // Nothing else changed.
            let changed: Vec<usize> = (12..f.len()).filter(|&i| f[i] != kept[i]).collect();
            assert!(changed.iter().all(|&i| (l3..l3 + 12).contains(&i)), "{changed:?}");
        }

        // What the program makes no replay of.
        let short = ReplayedRequest { ts_ns: 1, wire_len: 53, frame: segment(false, 0, 0)[..53].to_vec() };
        assert_eq!(short.reshaped(), None);
        let mut arp = segment(false, 0, 600);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let cut = ReplayedRequest { ts_ns: 1, wire_len: arp.len() as u32, frame: arp[..100].to_vec() };
        assert_eq!(cut.reshaped(), None, "cut, and not IP");
    }

    #[test]
    fn checksums_are_updated_as_the_kernel_does() {
        // RFC 1624's example: 0xdd2f, a word 0x5555 changed to 0x3285, gives 0x0000.
        assert_eq!(csum_replace2(0xdd2f, 0x5555, 0x3285), 0x0000);
        assert_eq!(csum_replace2(0x1234, 0xabcd, 0xabcd), 0x1234, "no change");
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
        // A DNS query over UDP (IPv6): after the 8 bytes of its header.
        let mut f = vec![0u8; 12];
        f.extend([0x86, 0xdd]);
        let mut ip = vec![0u8; 40];
        ip[6] = 17;
        f.extend(ip);
        f.extend([0u8; 8]);
        f.extend([0xbe, 0xef, 1, 0]);
        let r = ReplayedRequest { ts_ns: 1, wire_len: f.len() as u32, frame: f };
        assert_eq!(r.payload(), Some(&[0xbe, 0xef, 1, 0][..]));
        let mut icmp = r.frame.clone();
        icmp[14 + 6] = 58;
        assert_eq!(ReplayedRequest { frame: icmp, ..r }.payload(), None);
    }
}
