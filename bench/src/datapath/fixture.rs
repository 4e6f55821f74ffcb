//! Everything the measurement runs against, set up in the calling thread's private network
//! namespace: a veth pair for the mirror copies, the empty tc program, and one classifier
//! instance per rule count (so that cases with different rule sets can be interleaved).

use anyhow::{ensure, Context, Result};
use libbpf_rs::{MapCore, MapFlags, ProgramMut, RingBuffer};
use mirror_bpf::skel::baseline::BaselineSkel;
use mirror_bpf::testing::{self, SkbContext};
use mirror_bpf::{Counters, Datapath, DatapathOptions, FlowKey, Rule};

/// The mirror interface; its peer is up so that copies are delivered, not dropped at xmit.
const MIRROR_LINK: &str = "bench-mir0";
const MIRROR_PEER: &str = "bench-mir1";
/// Port-scoped rules use server ports from here up; responses come from port 80, so they
/// miss every port-scoped rule and reach the global one.
const FIRST_RULE_PORT: u16 = 1000;
/// Unlimited budget: a mirrored flow stays on the copy path for millions of packets.
const GLOBAL_RULE: &str = "status=500 packets=0 bytes=0 duration=0";

/// One classifier with a given number of rules.
pub struct Instance {
    pub rules: u32,
    pub dp: Datapath<'static>,
    /// Drained between trigger samples so that events are never dropped for lack of room.
    events: RingBuffer<'static>,
}

impl Instance {
    fn new(rules: u32, mirror_ifindex: u32) -> Result<Self> {
        ensure!(rules >= 1, "the global rule is always installed");
        let mut dp = testing::load(&DatapathOptions::default());
        dp.set_mirror_ifindex(mirror_ifindex)?;
        dp.add_rule(GLOBAL_RULE.parse()?)?;
        for i in 0..rules - 1 {
            let port = u16::try_from(i)
                .ok()
                .and_then(|i| FIRST_RULE_PORT.checked_add(i))
                .context("too many rules for distinct ports")?;
            dp.add_rule(format!("port={port} status=500").parse::<Rule>()?)?;
        }
        let events = dp.events(|_| {})?;
        Ok(Instance { rules, dp, events })
    }

    pub fn prog(&self) -> &ProgramMut<'static> {
        &self.dp.skel().progs.tc_ingress_mirror
    }

    pub fn counters(&self) -> Result<Counters> {
        Ok(self.dp.counters()?)
    }

    /// Deletes the mark of `key`, which must exist.
    pub fn unmark(&self, key: &FlowKey) -> Result<()> {
        let raw = key.to_raw();
        // SAFETY: flow_key is plain old data with explicit padding.
        let bytes = unsafe { plain::as_bytes(&raw) };
        self.dp.skel().maps.mirror_marks.delete(bytes).with_context(|| format!("deleting the mark of {key}"))
    }

    /// Puts both directions of `key`'s HTTP stream back to "look at segment starts", so that
    /// the next packet is read as the start of a message, not as a retransmission.
    pub fn rewind(&self, key: &FlowKey) -> Result<()> {
        let raw = key.to_raw();
        // SAFETY: flow_key is plain old data with explicit padding.
        let k = unsafe { plain::as_bytes(&raw) };
        let map = &self.dp.skel().maps.flow_timing;
        let Some(mut v) =
            map.lookup(k, MapFlags::ANY).with_context(|| format!("reading the stream of {key}"))?
        else {
            return Ok(());
        };
        let mut t = mirror_bpf::types::flow_timing::default();
        plain::copy_from_bytes(&mut t, &v).map_err(|e| anyhow::anyhow!("flow_timing value: {e:?}"))?;
        for st in &mut t.stream {
            st.state = 0;
            st.partial_len = 0;
        }
        // SAFETY: flow_timing is plain old data with explicit padding.
        v.copy_from_slice(unsafe { plain::as_bytes(&t) });
        map.update(k, &v, MapFlags::ANY).with_context(|| format!("rewinding the stream of {key}"))
    }

    /// Deletes every entry of `key`'s flow (flow table, shared timing, NAT), so that its next
    /// packet creates it.
    pub fn forget(&self, key: &FlowKey) -> Result<()> {
        let raw = key.to_raw();
        // SAFETY: flow_key is plain old data with explicit padding.
        let k = unsafe { plain::as_bytes(&raw) };
        let maps = &self.dp.skel().maps;
        for map in [&maps.flow_table, &maps.flow_timing, &maps.flow_nat] {
            // Absent already is fine: only a shot's own entries are removed.
            let _ = map.delete(k);
        }
        Ok(())
    }

    pub fn drain_events(&self) -> Result<()> {
        self.events.consume().context("draining trigger events")
    }
}

pub struct Fixture {
    baseline: BaselineSkel<'static>,
    pub instances: Vec<Instance>,
    /// skb->ifindex of every test_run: loopback of the private namespace.
    pub ctx: SkbContext,
}

impl Fixture {
    /// Builds the fixture in the calling thread's network namespace (which must be private:
    /// links are created in it).
    pub fn new(rule_counts: &[u32]) -> Result<Self> {
        testing::sh(&format!(
            "ip link add {MIRROR_LINK} type veth peer name {MIRROR_PEER} && \
             ip link set {MIRROR_LINK} up && ip link set {MIRROR_PEER} up"
        ));
        let mirror_ifindex = testing::ifindex(MIRROR_LINK);
        let instances =
            rule_counts.iter().map(|&n| Instance::new(n, mirror_ifindex)).collect::<Result<_>>()?;
        Ok(Fixture { baseline: testing::empty_program()?, instances, ctx: SkbContext::default() })
    }

    pub fn baseline(&self) -> &ProgramMut<'static> {
        &self.baseline.progs.tc_empty
    }

    pub fn instance(&self, rules: u32) -> &Instance {
        self.instances.iter().find(|i| i.rules == rules).expect("an instance per rule count")
    }
}
