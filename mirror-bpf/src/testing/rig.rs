//! The classifier as the fixtures are decided under, and running a fixture on it: shared by
//! the BPF tests, which assert each fixture's decision, and the data-path benchmark, which
//! times the same fixtures and checks the same decision on every run.

use libbpf_rs::{MapCore, MapFlags, MapMut, ProgramMut, RingBuffer};

use super::fixtures::{Fixture, Parsed, Repeat};
use super::{run_repeat, SkbContext, VERDICT_CONTINUE};
use crate::datapath::{Datapath, DatapathOptions};
use crate::rule::RuleId;
use crate::shared::{bytes_of, types};
use crate::stats::{counter, Counters};
use types::stat_idx as S;

/// The rule every fixture is decided under: a 500 marks its flow, copied without limit (a
/// mirrored flow stays on the copy path for millions of packets).
pub const RULE: &str = "status=500 packets=0 bytes=0 duration=0";
/// The rule the DNS fixtures are decided under: an NXDOMAIN marks its flow, as [`RULE`] does.
pub const DNS_RULE: &str = "dns=nxdomain packets=0 bytes=0 duration=0";
/// Port-scoped rules beyond [`RULE`] use server ports from here up; fixtures answer from port
/// 80, so they miss every one and reach the global rule.
pub const FIRST_RULE_PORT: u16 = 1000;

/// Counters that no fixture may move: failures, limits, the egress skip, translations.
const NEVER: [S; 10] = [
    S::STAT_DUPLICATE,
    S::STAT_MIRROR_ERRORS,
    S::STAT_MIRROR_NO_TARGET,
    S::STAT_MIRROR_ENDED,
    S::STAT_FLOW_INSERT_FAILED,
    S::STAT_MARK_INSERT_FAILED,
    S::STAT_TIMING_INSERT_FAILED,
    S::STAT_HIST_INSERT_FAILED,
    S::STAT_RINGBUF_DROPS,
    S::STAT_NAT_FLOWS,
];

/// Creates a veth pair `mir0`/`mir1`, both up, in the calling thread's network namespace (which
/// must be private), without IPv6 neighbour discovery so that only copies reach `mir1`; returns
/// the ifindex of `mir0`, the mirror interface.
pub fn mirror_veth() -> u32 {
    super::sh("sysctl -qw net.ipv6.conf.default.disable_ipv6=1");
    super::sh("ip link add mir0 type veth peer name mir1 && ip link set mir0 up && ip link set mir1 up");
    super::ifindex("mir0")
}

/// One classifier with [`RULE`] and port-scoped rules up to a count, copying to a mirror
/// interface.
pub struct Rig {
    /// The classifier.
    pub dp: Datapath<'static>,
    /// Rules installed.
    pub rules: u32,
    /// Trigger events, drained so that none is dropped for lack of room.
    events: RingBuffer<'static>,
    /// skb->ifindex of every test_run: loopback of the caller's namespace.
    pub ctx: SkbContext,
    /// [`DNS_RULE`]'s id.
    dns_rule: RuleId,
}

impl Rig {
    /// Loads the classifier with [`RULE`] and `rules - 1` rules `port=N status=500` (N from
    /// [`FIRST_RULE_PORT`]), copying to `mirror_ifindex` (see [`mirror_veth`]).
    pub fn new(rules: u32, mirror_ifindex: u32) -> Self {
        assert!(rules >= 1, "the global rule is always installed");
        let mut dp = super::load(&DatapathOptions::default());
        dp.set_mirror_ifindex(mirror_ifindex).expect("setting the mirror interface");
        dp.add_rule(RULE.parse().expect("the fixtures' rule")).expect("adding the fixtures' rule");
        let dns_rule =
            dp.add_rule(DNS_RULE.parse().expect("the DNS fixtures' rule")).expect("adding the DNS rule");
        for i in 0..rules - 1 {
            let port = u16::try_from(i)
                .ok()
                .and_then(|i| FIRST_RULE_PORT.checked_add(i))
                .expect("too many rules for distinct ports");
            dp.add_rule(format!("port={port} status=500").parse().expect("a port rule"))
                .expect("adding a rule");
        }
        let events = dp.events(|_| {}).expect("opening the event ring");
        Rig { dp, rules, events, ctx: SkbContext::default(), dns_rule }
    }

    /// Stops following DNS: [`DNS_RULE`] removed and DNS times off, so that UDP, to a DNS port
    /// too, is "other" (as the reference of the differential test states it).
    pub fn follow_no_dns(&mut self) {
        self.dp.remove_rule(self.dns_rule).expect("removing the DNS rule");
        self.dp.set_timing(crate::TimingGroup::Dns, false).expect("switching DNS times off");
    }

    /// The program the fixtures run through.
    pub fn prog(&self) -> &ProgramMut<'static> {
        &self.dp.skel().progs.tc_ingress_mirror
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Counters {
        self.dp.counters().expect("reading the counters")
    }

    /// Brings the fixture's flow to its state: forgets it, runs the setup frames, and keeps
    /// what [`Self::reset`] puts back.
    pub fn setup(&self, fx: &Fixture) -> Result<Primed, String> {
        let Some(key) = fx.expect.key() else { return Ok(Primed::default()) };
        let maps = &self.dp.skel().maps;
        super::forget_flow(&self.dp, &key.to_raw());
        for frame in &fx.setup {
            let (verdict, _, _) = run_repeat(self.prog(), frame, self.ctx, 1);
            if verdict != VERDICT_CONTINUE {
                return Err(format!("{}: a setup frame's verdict is {verdict}, not continue", fx.name));
            }
        }
        self.drain_events();
        let lookup = |map: &MapMut<'_>| {
            map.lookup(bytes_of(&key.to_raw()), MapFlags::ANY)
                .map_err(|e| format!("{}: reading {key}: {e}", fx.name))
        };
        let timing = match super::timing_slot(&self.dp, &key.to_raw()) {
            Some(slot) => maps
                .flow_timing
                .lookup(&slot.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| format!("{}: reading {key}'s shared entry: {e}", fx.name))?
                .map(|v| (slot, v)),
            None => None,
        };
        let raw = key.to_raw();
        let dns = maps
            .dns_queries
            .keys()
            .filter(|k| k.starts_with(bytes_of(&raw)))
            .filter_map(|k| maps.dns_queries.lookup(&k, MapFlags::ANY).ok().flatten().map(|v| (k, v)))
            .collect();
        Ok(Primed { timing, mark: lookup(&maps.mirror_marks)?, dns })
    }

    /// Puts back what the fixture's frame changed, so that it runs again with the same
    /// decision (see [`Repeat`]).
    pub fn reset(&self, fx: &Fixture, primed: &Primed) -> Result<(), String> {
        let key = match (fx.repeat, fx.expect.key()) {
            (Repeat::AsIs, _) | (_, None) => return Ok(()),
            (Repeat::Setup, _) => return self.setup(fx).map(drop),
            (Repeat::Restore, Some(key)) => key.to_raw(),
        };
        let maps = &self.dp.skel().maps;
        let failed = |e: libbpf_rs::Error| format!("{}: restoring its flow: {e}", fx.name);
        match &primed.timing {
            // The frame runs on the flow's own slot: it keeps it.
            Some((slot, v)) => {
                maps.flow_timing.update(&slot.to_ne_bytes(), v, MapFlags::ANY).map_err(failed)?
            }
            None => super::forget_timing(&self.dp, &key).map_err(failed)?,
        }
        match &primed.mark {
            Some(v) => maps.mirror_marks.update(bytes_of(&key), v, MapFlags::ANY).map_err(failed)?,
            None => maps.mirror_marks.delete(bytes_of(&key)).or(Ok(())).map_err(failed)?,
        }
        for (k, v) in &primed.dns {
            maps.dns_queries.update(k, v, MapFlags::ANY).map_err(failed)?;
        }
        Ok(())
    }

    /// Runs the frame once after its setup and checks its decision: the verdict, the frame left
    /// untouched, the counters, the flow and its mark.
    pub fn decide(&self, fx: &Fixture) -> Result<Primed, String> {
        let primed = self.setup(fx)?;
        self.run_and_check(fx)?;
        Ok(primed)
    }

    /// Runs the frame once more after [`Self::reset`], and checks the same decision.
    pub fn decide_again(&self, fx: &Fixture, primed: &Primed) -> Result<(), String> {
        self.reset(fx, primed)?;
        self.run_and_check(fx)
    }

    fn run_and_check(&self, fx: &Fixture) -> Result<(), String> {
        let before = self.counters();
        let (verdict, out, _) = run_repeat(self.prog(), &fx.frame, self.ctx, 1);
        self.drain_events();
        if verdict != VERDICT_CONTINUE {
            return Err(format!("{}: verdict {verdict}, not continue", fx.name));
        }
        if out != fx.frame {
            return Err(format!("{}: the frame was changed", fx.name));
        }
        check(fx, &self.counters().since(&before), 1)?;
        let Some(key) = fx.expect.key() else { return Ok(()) };
        let flows = self.dp.flows().map_err(|e| e.to_string())?;
        if !flows.iter().any(|f| f.key == key) {
            return Err(format!("{}: no flow {key}", fx.name));
        }
        let marked = self.dp.mark(&key).map_err(|e| e.to_string())?.is_some();
        if marked != fx.expect.mirrored {
            return Err(format!("{}: flow {key} marked: {marked}, expected {}", fx.name, fx.expect.mirrored));
        }
        Ok(())
    }

    /// Consumes the trigger events waiting.
    pub fn drain_events(&self) {
        self.events.consume().expect("draining trigger events");
    }
}

/// A fixture's flow as its setup left it: its shared entry (streams, requests pending) and
/// its mark, which [`Repeat::Restore`] puts back.
#[derive(Debug, Clone, Default)]
pub struct Primed {
    /// Its flow_timing slot and the slot's bytes.
    timing: Option<(u32, Vec<u8>)>,
    mark: Option<Vec<u8>>,
    /// Its DNS queries kept (dns_queries keys and values), which a response takes away.
    dns: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Whether the counters of `n` runs of the fixture's frame show its decision: each counter
/// the decision names moved by exactly `n` times its count, every other one of them and every
/// failure stayed.
pub fn check(fx: &Fixture, delta: &Counters, n: u64) -> Result<(), String> {
    let e = &fx.expect;
    let (non_tcp, malformed) = match e.parsed {
        Parsed::Tcp(_) | Parsed::Udp(_) => (false, false),
        Parsed::Other => (true, false),
        Parsed::Malformed => (false, true),
    };
    let expected = [
        (S::STAT_PACKETS, 1),
        (S::STAT_NON_TCP, u64::from(non_tcp)),
        (S::STAT_MALFORMED, u64::from(malformed)),
        (S::STAT_FLOWS_CREATED, u64::from(e.creates_flow)),
        (S::STAT_CT_LOOKUPS, e.conntrack),
        (S::STAT_HTTP_REQUESTS, e.requests),
        (S::STAT_HTTP_RESPONSES, e.responses),
        (S::STAT_DNS_QUERIES, e.dns_queries),
        (S::STAT_DNS_RESPONSES, e.dns_responses),
        (S::STAT_TRIGGERS, u64::from(e.triggers)),
        (S::STAT_MIRRORED_PACKETS, u64::from(e.mirrored)),
    ];
    let wrong: Vec<String> = expected
        .into_iter()
        .chain(NEVER.map(|s| (s, 0)))
        .filter(|&(idx, per_run)| delta.get(idx) != per_run * n)
        .map(|(idx, per_run)| format!("{} {} (expected {})", counter(idx).name, delta.get(idx), per_run * n))
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: not the decision expected over {n} runs: {}", fx.name, wrong.join(", ")))
    }
}
