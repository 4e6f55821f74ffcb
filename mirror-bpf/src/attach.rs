//! Attaching the classifier to an interface, at ingress and egress: TCX links at the head of
//! the chain where the kernel has them (6.6+), else clsact + cls_bpf. Only what we create is
//! ever removed: our own filters (our handle, a priority that was free), and the clsact qdisc
//! only when we created it and no other filter is left on it.

use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags, Program, TcHookBuilder, TC_EGRESS, TC_INGRESS};

use crate::error::{Context, Error, Result};
use crate::netlink;
use crate::rcu::Expedited;
use crate::settings;
use crate::shared::types::hook_kind;
use crate::skel::classifier::ClassifierSkel;
pub use crate::tcx_link::TcxLink;

/// How to attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// TCX where the kernel has it, else clsact + cls_bpf.
    #[default]
    Auto,
    /// TCX links only.
    Tcx,
    /// clsact + cls_bpf only.
    Tc,
}

/// How a triggered packet is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MirrorMethod {
    /// `bpf_clone_redirect` from the classifier (direct action).
    #[default]
    Clone,
    /// A classic cls_bpf filter with an `act_mirred egress mirror` action (implies tc mode).
    Mirred,
}

/// Whether this kernel has TCX (6.6+): a read-only query of the TCX programs on loopback,
/// which older kernels refuse as an unknown attach type.
pub fn tcx_supported() -> bool {
    tcx_prog_ids(1, false).is_ok()
}

impl AttachMode {
    /// The mode `attach` will use with `method` (never `Auto`): mirred needs a classic filter,
    /// and auto is TCX where the kernel has it.
    pub fn resolve(self, method: MirrorMethod) -> AttachMode {
        match (self, method) {
            (_, MirrorMethod::Mirred) => AttachMode::Tc,
            (AttachMode::Auto, _) if tcx_supported() => AttachMode::Tcx,
            (AttachMode::Auto, _) => AttachMode::Tc,
            (m, _) => m,
        }
    }
}

/// Our filter handle on clsact hooks ("MR"): a filter with it is ours.
pub const TC_HANDLE: u32 = 0x4d52;

/// Subdirectory of the pin path holding TCX links, one per interface and hook.
pub const LINKS_DIR: &str = "links";

#[derive(Debug)]
enum Hook {
    /// The link, and where it is pinned (if it is).
    Tcx(TcxLink, Option<PathBuf>),
    Tc {
        egress: bool,
        prio: u16,
    },
}

/// The classifier attached to one interface; give it back to [`crate::datapath::Datapath::detach`].
#[derive(Debug)]
pub struct Attachment {
    /// The interface.
    pub ifindex: u32,
    /// The mode used (never `Auto`).
    pub mode: AttachMode,
    /// The mirror method.
    pub method: MirrorMethod,
    /// Whether we created the clsact qdisc (tc mode).
    pub created_qdisc: bool,
    /// Where the time of this attach went.
    pub timings: AttachTimings,
    hooks: Vec<Hook>,
}

/// Where the time of one attach went, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttachTimings {
    /// Creating the hooks: TCX links (`bpf_link_create`, which waits for an RCU grace period
    /// per hook under RTNL) or the clsact qdisc and cls_bpf filters (netlink), both hooks.
    pub hooks: Duration,
    /// Pinning the TCX links (or opening and updating those pinned by an earlier instance).
    pub pin: Duration,
    /// Recording the interface in `attached_ifaces` and bumping the attach epoch.
    pub maps: Duration,
    /// Whether expedited RCU grace periods were switched on for this attach.
    pub expedited: bool,
}

/// Makes every entry of the classifier's cache of `attached_ifaces` stale: called after each
/// change of that map (this module is its only writer), and at load with a fresh value.
pub(crate) fn bump_attach_epoch(skel: &ClassifierSkel<'_>) -> Result<()> {
    let key = 0u32.to_ne_bytes();
    let map = &skel.maps.attach_epoch;
    let cur = map
        .lookup(&key, MapFlags::ANY)
        .ok()
        .flatten()
        .and_then(|v| v.get(..4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
        .unwrap_or(0);
    let next = cur.wrapping_add(1).max(1);
    map.update(&key, &next.to_ne_bytes(), MapFlags::ANY).context(|| "changing attach_epoch".into())
}

/// Whether `e` says "this kernel has no TCX".
fn tcx_missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | libc::EPERM))
}

/// Attaches `prog` with a TCX link at the head of the ingress (or `egress`) hook of `ifindex`.
pub fn attach_tcx(prog: &Program<'_>, ifindex: u32, egress: bool) -> io::Result<TcxLink> {
    TcxLink::attach(prog, ifindex, egress)
}

/// The lowest priority no filter uses on that hook: we run before any filter added later
/// with a higher number, and never share a priority (a tcf_proto) with another tool.
pub(crate) fn free_prio(used: &[netlink::FilterId]) -> u16 {
    (1..u16::MAX).find(|p| !used.iter().any(|f| f.prio == *p)).unwrap_or(u16::MAX)
}

/// What attaching needs from the loaded classifier: its programs and maps, where links are
/// pinned, and which programs were loaded.
pub(crate) struct Attacher<'a, 'obj> {
    /// The loaded classifier.
    pub skel: &'a ClassifierSkel<'obj>,
    /// The pin directory, if any (TCX links go under [`LINKS_DIR`] in it).
    pub pin_path: Option<&'a Path>,
    /// The mode (resolved) and method whose programs alone were loaded; `None`: all.
    pub loaded: Option<(AttachMode, MirrorMethod)>,
    /// Marker of expedited RCU grace periods around TCX link changes; `None`: normal ones.
    pub expedite_rcu: Option<&'a Path>,
}

impl Attacher<'_, '_> {
    fn programs(&self, mode: AttachMode, method: MirrorMethod) -> [&Program<'_>; 2] {
        let p = &self.skel.progs;
        match (mode, method) {
            (AttachMode::Tcx, _) => [&p.tcx_ingress_mirror, &p.tcx_egress_mirror],
            (_, MirrorMethod::Clone) => [&p.tc_ingress_mirror, &p.tc_egress_mirror],
            (_, MirrorMethod::Mirred) => [&p.tc_ingress_mirred, &p.tc_egress_mirred],
        }
    }

    /// The mode `attach` uses (`Auto` only when every program is loaded), or why it cannot.
    fn effective_mode(
        &self,
        mode: AttachMode,
        method: MirrorMethod,
    ) -> std::result::Result<AttachMode, String> {
        let mode = match (mode, method) {
            (AttachMode::Tcx, MirrorMethod::Mirred) => {
                return Err("the mirred method needs tc mode (a classic filter carries the action)".into())
            }
            (_, MirrorMethod::Mirred) => AttachMode::Tc,
            (m, _) => m,
        };
        // With only some programs loaded, auto is what was resolved at load.
        match self.loaded {
            Some(loaded) if (mode == AttachMode::Auto || mode == loaded.0) && method == loaded.1 => {
                Ok(loaded.0)
            }
            Some(loaded) => Err(format!(
                "only the programs for {:?} mode with the {:?} method were loaded",
                loaded.0, loaded.1
            )),
            None => Ok(mode),
        }
    }

    /// Attaches the classifier to `ifindex`, ingress and egress.
    pub(crate) fn attach(&self, ifindex: u32, mode: AttachMode, method: MirrorMethod) -> Result<Attachment> {
        let mode = self.effective_mode(mode, method).map_err(Error::Unsupported)?;
        let mut att = Attachment {
            ifindex,
            mode,
            method,
            created_qdisc: false,
            timings: AttachTimings::default(),
            hooks: Vec::new(),
        };
        let result = match mode {
            AttachMode::Tcx => self.attach_tcx_both(&mut att),
            AttachMode::Tc => self.attach_tc_both(&mut att),
            AttachMode::Auto => match self.attach_tcx_both(&mut att) {
                Err(Error::Io { ref cause, .. }) if tcx_missing(cause) => {
                    // An expected fallback on kernels before 6.6, not an error.
                    tracing::debug!(ifindex, kernel_said = %cause, "expected: no TCX, using clsact + cls_bpf");
                    att.mode = AttachMode::Tc;
                    self.attach_tc_both(&mut att)
                }
                r => r,
            },
        };
        if let Err(e) = result {
            // Undo whatever half was done; the error that matters is the first one.
            let _ = self.detach_hooks(&mut att);
            return Err(e);
        }
        let maps = Instant::now();
        let bits = (1u32 << hook_kind::HOOK_INGRESS.0) | (1u32 << hook_kind::HOOK_EGRESS.0);
        self.skel
            .maps
            .attached_ifaces
            .update(&ifindex.to_ne_bytes(), &bits.to_ne_bytes(), MapFlags::ANY)
            .context(|| format!("recording ifindex {ifindex} as attached"))?;
        bump_attach_epoch(self.skel)?;
        att.timings.maps = maps.elapsed();
        Ok(att)
    }

    /// Expedited RCU grace periods until the guard drops, if asked for (see [`crate::rcu`]).
    fn expedite(&self) -> Option<Expedited> {
        self.expedite_rcu.map(Expedited::begin)
    }

    fn link_pin(&self, ifindex: u32, egress: bool) -> Option<PathBuf> {
        let hook = if egress { "egress" } else { "ingress" };
        self.pin_path.map(|d| d.join(LINKS_DIR).join(format!("{ifindex}-{hook}")))
    }

    /// A TCX link pinned by an earlier instance now runs our program: no moment unclassified.
    fn adopt_tcx(prog: &Program<'_>, pin: &Path) -> Result<TcxLink> {
        let link = TcxLink::open(pin).context(|| format!("opening {}", pin.display()))?;
        link.update_prog(prog).context(|| format!("updating the program of {}", pin.display()))?;
        Ok(link)
    }

    fn attach_tcx_both(&self, att: &mut Attachment) -> Result<()> {
        att.mode = AttachMode::Tcx;
        let ifindex = att.ifindex;
        let progs = self.programs(AttachMode::Tcx, att.method);
        let pins = [self.link_pin(ifindex, false), self.link_pin(ifindex, true)];
        // Held over both hooks: two grace periods, one switch.
        let guard = pins.iter().any(|p| !p.as_ref().is_some_and(|p| p.exists())).then(|| self.expedite());
        att.timings.expedited = guard.as_ref().is_some_and(|g| g.as_ref().is_some_and(Expedited::switched));
        for ((prog, pin), egress) in progs.into_iter().zip(pins).zip([false, true]) {
            let link = match &pin {
                Some(p) if p.exists() => {
                    let t = Instant::now();
                    let link = Self::adopt_tcx(prog, p)?;
                    att.timings.pin += t.elapsed();
                    link
                }
                _ => {
                    let t = Instant::now();
                    let link = attach_tcx(prog, ifindex, egress)
                        .context(|| format!("attaching TCX to ifindex {ifindex}"))?;
                    att.timings.hooks += t.elapsed();
                    if let Some(p) = &pin {
                        let t = Instant::now();
                        let dir = p.parent().unwrap_or(p);
                        std::fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
                        link.pin(p).context(|| format!("pinning {}", p.display()))?;
                        att.timings.pin += t.elapsed();
                    }
                    link
                }
            };
            att.hooks.push(Hook::Tcx(link, pin));
        }
        drop(guard);
        Ok(())
    }

    fn attach_tc_both(&self, att: &mut Attachment) -> Result<()> {
        let start = Instant::now();
        let result = self.attach_tc_hooks(att);
        att.timings.hooks = start.elapsed();
        result
    }

    fn attach_tc_hooks(&self, att: &mut Attachment) -> Result<()> {
        let ifindex = att.ifindex;
        let [ingress, egress] = self.programs(AttachMode::Tc, att.method);
        // Create clsact only if absent, and remember whether we did.
        let mut qdisc = libbpf_sys::bpf_tc_hook {
            sz: std::mem::size_of::<libbpf_sys::bpf_tc_hook>() as _,
            ifindex: ifindex as i32,
            attach_point: libbpf_sys::BPF_TC_INGRESS,
            ..Default::default()
        };
        // SAFETY: `qdisc` is a valid, sized bpf_tc_hook that outlives the call.
        let rc = unsafe { libbpf_sys::bpf_tc_hook_create(&mut qdisc) };
        match rc {
            0 => att.created_qdisc = true,
            e if e == -libc::EEXIST => {}
            e => {
                return Err(io::Error::from_raw_os_error(-e))
                    .context(|| format!("creating clsact on ifindex {ifindex}"))
            }
        }
        let mirror_ifindex = settings::read(&self.skel.maps.settings)?.mirror_ifindex;
        let mirror_ingress = settings::mirror_deliver(self.skel) == settings::MirrorDelivery::Ingress;
        if att.method == MirrorMethod::Mirred && mirror_ingress {
            // act_mirred's ingress mirror leaves the copy addressed as it was (to this node), so
            // the node would route the copy again.
            return Err(Error::Unsupported(
                "the mirred method copies to the mirror interface's egress only".into(),
            ));
        }
        for (egress_hook, prog) in [(false, ingress), (true, egress)] {
            let filters = netlink::filters(ifindex, egress_hook)
                .context(|| format!("listing filters of ifindex {ifindex}"))?;
            // A filter of ours left by an earlier instance is replaced in place, atomically.
            let ours = filters.iter().find(|f| f.handle == TC_HANDLE && f.kind == "bpf").map(|f| f.prio);
            let prio = ours.unwrap_or_else(|| free_prio(&filters));
            let what = || {
                format!(
                    "attaching cls_bpf to ifindex {ifindex} ({})",
                    if egress_hook { "egress" } else { "ingress" }
                )
            };
            match att.method {
                MirrorMethod::Clone => {
                    TcHookBuilder::new(prog.as_fd())
                        .ifindex(ifindex as i32)
                        .replace(ours.is_some())
                        .handle(TC_HANDLE)
                        .priority(prio as u32)
                        .hook(if egress_hook { TC_EGRESS } else { TC_INGRESS })
                        .attach()
                        .context(what)?;
                }
                MirrorMethod::Mirred => {
                    if mirror_ifindex == 0 {
                        return Err(Error::Unsupported(
                            "the mirred method needs the mirror interface set before attach".into(),
                        ));
                    }
                    let name = prog.name().to_string_lossy().into_owned();
                    let f = netlink::MirredFilter {
                        ifindex,
                        egress: egress_hook,
                        prio,
                        handle: TC_HANDLE,
                        prog_fd: prog.as_fd().as_raw_fd(),
                        prog_name: &name,
                        mirror_ifindex,
                    };
                    netlink::add_mirred_filter(&f, ours.is_some()).context(what)?;
                }
            }
            att.hooks.push(Hook::Tc { egress: egress_hook, prio });
        }
        Ok(())
    }

    fn detach_hooks(&self, att: &mut Attachment) -> Result<()> {
        let ifindex = att.ifindex;
        let mut first_err = None;
        let _expedited = att.hooks.iter().any(|h| matches!(h, Hook::Tcx(..))).then(|| self.expedite());
        for hook in att.hooks.drain(..) {
            if let Hook::Tcx(link, pin) = hook {
                // Pinned or not, the link goes now.
                if let Some(p) = pin {
                    let _ = std::fs::remove_file(p);
                }
                if let Err(e) = link.detach() {
                    first_err.get_or_insert(Error::Io {
                        what: format!("detaching TCX from ifindex {ifindex}"),
                        cause: e,
                    });
                }
                continue;
            }
            if let Hook::Tc { egress, prio } = hook {
                match netlink::del_filter(ifindex, egress, prio, TC_HANDLE) {
                    Ok(()) => {}
                    // The interface (and all on it) is gone already.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENOENT)) => {}
                    Err(e) => {
                        first_err.get_or_insert(Error::Io {
                            what: format!("removing our filter from ifindex {ifindex}"),
                            cause: e,
                        });
                    }
                }
            }
        }
        if att.created_qdisc {
            let empty = netlink::filters(ifindex, false).map(|f| f.is_empty()).unwrap_or(false)
                && netlink::filters(ifindex, true).map(|f| f.is_empty()).unwrap_or(false);
            if empty {
                // Any loaded program: destroying the qdisc does not use it.
                let [prog, _] = self.programs(AttachMode::Tc, att.method);
                let mut hook =
                    TcHookBuilder::new(prog.as_fd()).ifindex(ifindex as i32).hook(TC_INGRESS | TC_EGRESS);
                match hook.destroy() {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind(), libbpf_rs::ErrorKind::NotFound) => {}
                    Err(e) => {
                        first_err.get_or_insert(Error::Bpf {
                            what: format!("removing our clsact from ifindex {ifindex}"),
                            cause: e,
                        });
                    }
                }
            } else {
                tracing::info!(ifindex, "leaving the clsact qdisc we created: other filters use it now");
            }
            att.created_qdisc = false;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Detaches from the interface: our filters or links, and our clsact if nobody else uses it.
    pub(crate) fn detach(&self, mut att: Attachment) -> Result<()> {
        let _ = self.skel.maps.attached_ifaces.delete(&att.ifindex.to_ne_bytes());
        crate::drops::forget_pod(&self.skel.maps.drop_pods, att.ifindex);
        bump_attach_epoch(self.skel)?;
        self.detach_hooks(&mut att)
    }

    /// Detaches and unpins the TCX links pinned for interfaces `keep` rejects. Returns how many.
    pub(crate) fn drop_stale_links(&self, keep: impl Fn(u32) -> bool) -> Result<usize> {
        let Some(dir) = self.pin_path.map(|p| p.join(LINKS_DIR)) else { return Ok(0) };
        let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(0) };
        let mut dropped = 0;
        let mut expedited = None;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(ifindex) = name.split('-').next().and_then(|i| i.parse().ok()) else { continue };
            if keep(ifindex) {
                continue;
            }
            if let Ok(link) = TcxLink::open(&e.path()) {
                expedited.get_or_insert_with(|| self.expedite());
                // Already gone with its interface, or detached now.
                let _ = link.detach();
            }
            std::fs::remove_file(e.path()).context(|| format!("removing {}", e.path().display()))?;
            dropped += 1;
        }
        Ok(dropped)
    }
}

/// Ids of the programs attached through TCX to one hook of an interface, in run order.
pub fn tcx_prog_ids(ifindex: u32, egress: bool) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    // SAFETY: a plain C struct; all-zero is its default.
    let mut opts: libbpf_sys::bpf_prog_query_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_prog_query_opts>() as _;
    opts.prog_ids = ids.as_mut_ptr();
    opts.__bindgen_anon_1.count = ids.len() as u32;
    let attach = if egress { libbpf_sys::BPF_TCX_EGRESS } else { libbpf_sys::BPF_TCX_INGRESS };
    // SAFETY: `opts` points into `ids`, which outlives the call; count bounds the writes.
    let rc = unsafe { libbpf_sys::bpf_prog_query_opts(ifindex as i32, attach, &mut opts) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(-rc));
    }
    // SAFETY: the kernel set `count` (the union's only member we use).
    let n = unsafe { opts.__bindgen_anon_1.count } as usize;
    Ok(ids[..n.min(ids.len())].to_vec())
}
