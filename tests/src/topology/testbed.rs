//! One test's world: a topology, the classifier loaded and attached to the pods' veths, the
//! servers, and recordings of the traffic at an endpoint and on the mirror sink. The test's
//! thread stays inside the node namespace while the testbed lives.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::RingBuffer;
use mirror_bpf::testing::{self, ifindex};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{
    AttachMode, Attachment, Counters, Datapath, DatapathOptions, HistKind, Histogram, MirrorDelivery,
    MirrorMethod, ReplayHook, RuleId, TriggerEvent,
};
use tempfile::TempDir;

use crate::capture::tcpdump::Recorder;
pub use crate::capture::tcpdump::Recording;
use crate::oracles::oracle::Expected;
use crate::topology::netns::{Entered, Netns, Pod, Topology, MIRROR_DEV, MIRROR_SINK};
use crate::workload::servers::Server;

/// Trigger events, collected as they are polled.
pub struct Events {
    ring: RingBuffer<'static>,
    seen: Rc<RefCell<Vec<(u64, TriggerEvent)>>>,
}

impl Events {
    /// The events received so far.
    pub fn take(&self) -> Vec<TriggerEvent> {
        self.poll(Duration::from_millis(100)).into_iter().map(|(_, ev)| ev).collect()
    }

    /// Waits up to `timeout` for events (returns at the first), then hands over those received
    /// so far, each with the time user space received it (monotonic ns, the classifier's clock).
    pub fn poll(&self, timeout: Duration) -> Vec<(u64, TriggerEvent)> {
        Datapath::poll_events(&self.ring, timeout).expect("polling events");
        self.seen.take()
    }
}

/// A test's topology with the classifier loaded (dropped in field order: servers first, the
/// namespaces and files last).
pub struct Testbed {
    servers: Vec<Server>,
    attachments: Vec<Attachment>,
    replay: Option<ReplayHook>,
    rules: Vec<RuleId>,
    /// The classifier.
    pub dp: Datapath<'static>,
    _inside: Entered,
    /// The namespaces.
    pub topo: Topology,
    /// Configs and captures.
    pub dir: TempDir,
    recorder: Recorder,
}

impl Testbed {
    /// The set-up most tests start from, over a topology with one pod per role (see
    /// [`TestbedBuilder`]).
    pub fn builder<'a>(roles: &'a [&'a str]) -> TestbedBuilder<'a> {
        TestbedBuilder::over(Nodes::Roles(roles))
    }

    /// Like [`Testbed::builder`] over a topology made elsewhere ([`Topology::adopt`]).
    pub fn builder_on<'a>(topo: Topology) -> TestbedBuilder<'a> {
        TestbedBuilder::over(Nodes::Made(topo))
    }

    /// A topology with one pod per role, the calling thread in its node, the classifier loaded.
    pub fn new(roles: &[&str]) -> Testbed {
        Testbed::on(Topology::new(roles))
    }

    /// `topo` (with its mirror sink), the calling thread in its node, the classifier loaded.
    pub fn on(topo: Topology) -> Testbed {
        let dir = tempfile::Builder::new().prefix("mirror-e2e").tempdir().expect("creating a temp dir");
        let inside = topo.node.enter();
        let dp = testing::load(&DatapathOptions::default());
        Testbed {
            servers: Vec::new(),
            attachments: Vec::new(),
            replay: None,
            rules: Vec::new(),
            dp,
            _inside: inside,
            topo,
            recorder: Recorder::new(dir.path()),
            dir,
        }
    }

    /// The pod with that role.
    #[track_caller]
    pub fn pod(&self, role: &str) -> &Pod {
        self.topo.pod(role)
    }

    /// The node namespace.
    pub fn node(&self) -> &Netns {
        &self.topo.node
    }

    /// Makes the classifier copy to the mirror sink.
    pub fn mirror_to_sink(&self) {
        self.dp.set_mirror_ifindex(ifindex(MIRROR_DEV)).expect("setting the mirror interface");
    }

    /// Makes the classifier copy to the mirror sink's peer, where captures read, either out of
    /// the sink (`Egress`, what [`Testbed::mirror_to_sink`] does) or into the peer's receive
    /// path directly (`Ingress`).
    pub fn mirror_to_sink_via(&mut self, delivery: MirrorDelivery) {
        let target = match delivery {
            MirrorDelivery::Egress => MIRROR_DEV,
            MirrorDelivery::Ingress => MIRROR_SINK,
        };
        self.dp.set_mirror_target(ifindex(target), delivery).expect("setting the mirror interface");
    }

    /// Attaches the replay program to the mirror sink: the request behind each trigger reaches
    /// the mirror ahead of the response (recorded in [`crate::capture::pcap::Trace::replayed`]).
    pub fn replay_to_sink(&mut self) {
        let hook = self.dp.attach_replay(ifindex(MIRROR_DEV)).expect("attaching the replay program");
        self.replay = Some(hook);
    }

    /// Adds a rule.
    #[track_caller]
    pub fn add_rule(&mut self, rule: &str) -> RuleId {
        self.try_add_rule(rule).unwrap_or_else(|e| panic!("{rule}: {e}"))
    }

    /// Adds a rule given as text, as an operator gives it: the error when it does not parse or
    /// does not fit.
    pub fn try_add_rule(&mut self, rule: &str) -> mirror_bpf::Result<RuleId> {
        let id = self.dp.add_rule(rule.parse()?)?;
        self.rules.push(id);
        Ok(id)
    }

    /// Removes a rule [`Testbed::add_rule`] added (flows it marked stay marked).
    #[track_caller]
    pub fn remove_rule(&mut self, id: RuleId) {
        self.dp.remove_rule(id).unwrap_or_else(|e| panic!("removing rule {id}: {e}"));
        self.rules.retain(|r| *r != id);
    }

    /// The ids of the rules [`Testbed::add_rule`] added, in order.
    pub fn rule_ids(&self) -> &[RuleId] {
        &self.rules
    }

    /// Starts nginx in a pod.
    pub fn nginx(&mut self, role: &str, port: u16) {
        let server = Server::nginx(self.topo.pod(role), port, self.dir.path());
        self.servers.push(server);
    }

    /// Starts python's http.server in a pod.
    pub fn python(&mut self, role: &str, port: u16) {
        let server = Server::python(&self.topo.pod(role).ns, port, self.dir.path());
        self.servers.push(server);
    }

    /// Starts the raw HTTP server (scripted byte layouts) in a pod.
    pub fn raw_server(&mut self, role: &str, port: u16) {
        let server = Server::raw(&self.topo.pod(role).ns, port, self.dir.path());
        self.servers.push(server);
    }

    /// Starts the asyncio HTTP server (many connections, delays and resets on request) in a pod.
    pub fn asyncio_server(&mut self, role: &str, port: u16) {
        let server = Server::asyncio(&self.topo.pod(role).ns, port, self.dir.path());
        self.servers.push(server);
    }

    /// Keeps a server started elsewhere running as long as the testbed.
    pub fn keep_server(&mut self, server: Server) {
        self.servers.push(server);
    }

    /// Starts python's http.server in the node namespace (a host-network server).
    pub fn python_in_node(&mut self, port: u16) {
        let server = Server::python(&self.topo.node, port, self.dir.path());
        self.servers.push(server);
    }

    /// Attaches the classifier to every pod's veth.
    pub fn attach(&mut self, mode: AttachMode, method: MirrorMethod) {
        let roles: Vec<String> = self.topo.pods.iter().map(|p| p.role().to_string()).collect();
        self.attach_to(&roles.iter().map(String::as_str).collect::<Vec<_>>(), mode, method);
    }

    /// Attaches the classifier to the veths of some pods only.
    pub fn attach_to(&mut self, roles: &[&str], mode: AttachMode, method: MirrorMethod) {
        for role in roles {
            self.try_attach(role, mode, method).unwrap_or_else(|e| panic!("attaching to {role}'s veth: {e}"));
        }
    }

    /// Attaches the classifier to one pod's veth, if it can.
    pub fn try_attach(
        &mut self,
        role: &str,
        mode: AttachMode,
        method: MirrorMethod,
    ) -> mirror_bpf::Result<()> {
        let att = self.dp.attach(ifindex(&self.topo.pod(role).veth), mode, method)?;
        self.attachments.push(att);
        Ok(())
    }

    /// Detaches from every pod's veth.
    pub fn detach(&mut self) {
        for att in self.attachments.drain(..) {
            self.dp.detach(att).expect("detaching");
        }
    }

    /// Collects trigger events from now on.
    pub fn events(&self) -> Events {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&seen);
        let ring = self
            .dp
            .events(move |ev| sink.borrow_mut().push((mirror_bpf::flow::monotonic_ns(), ev)))
            .expect("opening the events");
        Events { ring, seen }
    }

    /// The counters.
    pub fn counters(&self) -> Counters {
        self.dp.counters().expect("reading counters")
    }

    /// The histograms of `kind` (and status `class`, if given) merged over interfaces.
    pub fn histogram(&self, kind: HistKind, class: Option<u8>) -> Option<Histogram> {
        let mut hs = self
            .dp
            .histograms()
            .expect("reading histograms")
            .into_iter()
            .filter(|h| h.kind == kind && class.is_none_or(|c| h.class == c));
        let mut all = hs.next()?;
        hs.for_each(|h| all.merge(&h));
        Some(all)
    }

    /// Runs `traffic` while capturing at `reference`'s `eth0` (TCP only) and on the mirror sink
    /// (everything).
    pub fn record(&self, reference: &str, traffic: impl FnOnce()) -> Recording {
        self.capture(reference, true, traffic)
    }

    /// Like [`Testbed::record`], keeping at `reference` what the pcap filter `filter` matches
    /// (`"udp port 53"`: DNS).
    pub fn record_filtered(&self, reference: &str, filter: &str, traffic: impl FnOnce()) -> Recording {
        let mirror = Some((&self.topo.node, MIRROR_SINK));
        self.recorder.record_filtered(&self.pod(reference).ns, filter, mirror, traffic)
    }

    /// Gives the captures of later recordings `kib` KiB of kernel buffer each (for heavy
    /// traffic: tcpdump must lose nothing).
    pub fn capture_buffer_kib(&self, kib: u32) {
        self.recorder.set_buffer_kib(kib);
    }

    /// Like [`Testbed::record`] when the mirror sink is gone: the mirror trace is empty.
    pub fn record_without_sink(&self, reference: &str, traffic: impl FnOnce()) -> Recording {
        self.capture(reference, false, traffic)
    }

    fn capture(&self, reference: &str, sink: bool, traffic: impl FnOnce()) -> Recording {
        let mirror = sink.then_some((&self.topo.node, MIRROR_SINK));
        self.recorder.record(&self.pod(reference).ns, mirror, traffic)
    }

    /// Checks the mirror against the reference (see [`Expected`]) and the classifier's view
    /// against both: counters, rule hits, the flow table and its marks. `trigger(status,
    /// server_port)` is what the rules match.
    #[track_caller]
    pub fn check(&self, rec: &Recording, trigger: impl Fn(u16, u16) -> bool) -> Expected {
        self.check_since(rec, Expected::from_reference(&rec.reference, trigger), &Snapshot::default())
    }

    /// Like [`Testbed::check`] with what the mirror must carry computed by the caller, and
    /// counters and rule hits counted from `since` (the recording's traffic alone, on a testbed
    /// that carried other traffic before; the rules installed then still are).
    #[track_caller]
    pub fn check_since(&self, rec: &Recording, expected: Expected, since: &Snapshot) -> Expected {
        expected.assert_mirror(&rec.mirror);
        self.assert_marks(&expected);
        let now = self.snapshot();
        let c = now.counters.since(&since.counters);
        let n_triggered = expected.triggered.len() as u64;
        assert_eq!(c.get(stat_idx::STAT_TRIGGERS), n_triggered, "{c:?}");
        assert_eq!(c.get(stat_idx::STAT_MIRRORED_PACKETS), rec.mirror.packets.len() as u64, "{c:?}");
        assert_eq!(c.get(stat_idx::STAT_MIRROR_ERRORS), 0, "{c:?}");
        assert_eq!(c.get(stat_idx::STAT_MIRROR_NO_TARGET), 0, "{c:?}");
        assert_eq!(now.hits - since.hits, n_triggered, "rule hits");
        expected
    }

    /// The counters and the rules' hits now, for [`Testbed::check_since`].
    pub fn snapshot(&self) -> Snapshot {
        let hits = self.dp.rules().expect("reading rules").iter().map(|r| r.hits).sum();
        Snapshot { counters: self.counters(), hits }
    }

    /// Asserts that the flow table lists every connection of the reference, the triggered
    /// ones with a mark that charged exactly their packets from the trigger on (and any that
    /// crossed the trigger).
    #[track_caller]
    pub fn assert_marks(&self, expected: &Expected) {
        let flows = self.dp.flows().expect("reading flows");
        let find = |key| {
            flows.iter().find(|f| f.key == key).unwrap_or_else(|| panic!("{key} not in the flow table"))
        };
        for t in &expected.triggered {
            let mark = find(t.flow).mark.unwrap_or_else(|| panic!("{} triggered but has no mark", t.flow));
            assert!(
                mark.status == t.status && t.admits(mark.packets) && !mark.ended,
                "mark of {}: {mark:?}; expected status {}, {} packets ({} more crossed the trigger)",
                t.flow,
                t.status,
                t.packets,
                t.crossing
            );
        }
        for f in expected.untriggered() {
            assert_eq!(find(*f).mark, None, "{f} never triggered but is marked");
        }
    }
}

/// Counters and rule hits at a moment (the default: all zero, the testbed's start).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The counters.
    pub counters: Counters,
    /// Hits of the rules then installed, summed.
    pub hits: u64,
}

/// A server the builder starts.
type StartServer<'a> = Box<dyn FnOnce(&mut Testbed) + 'a>;

/// How a test's [`Testbed`] starts, from [`Testbed::builder`]: the servers it names; the
/// classifier copying to the mirror sink, which sends the copies out to its peer (unless
/// [`mirror_via`](TestbedBuilder::mirror_via) or [`no_mirror`](TestbedBuilder::no_mirror) says
/// otherwise); the rules it names; the classifier on every pod's veth in [`AttachMode::Auto`]
/// with [`MirrorMethod::Clone`] (unless told otherwise). [`TestbedBuilder::build`] takes these
/// steps in that order.
#[must_use = "a set-up does nothing until built"]
pub struct TestbedBuilder<'a> {
    nodes: Nodes<'a>,
    servers: Vec<StartServer<'a>>,
    mirror: Option<MirrorDelivery>,
    rules: Vec<String>,
    attach: Option<(AttachMode, MirrorMethod)>,
    attach_only: Option<&'a [&'a str]>,
}

/// What a [`TestbedBuilder`] starts from.
enum Nodes<'a> {
    /// A topology of its own, one pod per role.
    Roles(&'a [&'a str]),
    /// A topology made elsewhere.
    Made(Topology),
}

impl<'a> TestbedBuilder<'a> {
    fn over(nodes: Nodes<'a>) -> Self {
        TestbedBuilder {
            nodes,
            servers: Vec::new(),
            mirror: Some(MirrorDelivery::Egress),
            rules: Vec::new(),
            attach: Some((AttachMode::Auto, MirrorMethod::Clone)),
            attach_only: None,
        }
    }

    /// Starts nginx in a pod.
    pub fn nginx(mut self, role: &'a str, port: u16) -> Self {
        self.servers.push(Box::new(move |bed| bed.nginx(role, port)));
        self
    }

    /// Starts python's http.server in a pod.
    pub fn python(mut self, role: &'a str, port: u16) -> Self {
        self.servers.push(Box::new(move |bed| bed.python(role, port)));
        self
    }

    /// Starts python's http.server in the node namespace (a host-network server).
    pub fn python_in_node(mut self, port: u16) -> Self {
        self.servers.push(Box::new(move |bed| bed.python_in_node(port)));
        self
    }

    /// Starts the raw HTTP server (scripted byte layouts) in a pod.
    pub fn raw_server(mut self, role: &'a str, port: u16) -> Self {
        self.servers.push(Box::new(move |bed| bed.raw_server(role, port)));
        self
    }

    /// Starts the asyncio HTTP server (many connections, delays and resets on request) in a pod.
    pub fn asyncio_server(mut self, role: &'a str, port: u16) -> Self {
        self.servers.push(Box::new(move |bed| bed.asyncio_server(role, port)));
        self
    }

    /// Hands the copies to the sink as `delivery` says (see [`Testbed::mirror_to_sink_via`]).
    pub fn mirror_via(mut self, delivery: MirrorDelivery) -> Self {
        self.mirror = Some(delivery);
        self
    }

    /// Sets no mirror interface: the classifier only counts what it would copy.
    pub fn no_mirror(mut self) -> Self {
        self.mirror = None;
        self
    }

    /// Adds a rule (ids in [`Testbed::rule_ids`]).
    pub fn rule(mut self, rule: &str) -> Self {
        self.rules.push(rule.to_string());
        self
    }

    /// Attaches in `mode` with `method`.
    pub fn attach(mut self, mode: AttachMode, method: MirrorMethod) -> Self {
        self.attach = Some((mode, method));
        self
    }

    /// Attaches to the veths of these pods only.
    pub fn attach_only(mut self, roles: &'a [&'a str]) -> Self {
        self.attach_only = Some(roles);
        self
    }

    /// Attaches nowhere: the test does.
    pub fn detached(mut self) -> Self {
        self.attach = None;
        self
    }

    /// The testbed, set up.
    #[track_caller]
    pub fn build(self) -> Testbed {
        let mut bed = match self.nodes {
            Nodes::Roles(roles) => Testbed::new(roles),
            Nodes::Made(topo) => Testbed::on(topo),
        };
        for start in self.servers {
            start(&mut bed);
        }
        if let Some(delivery) = self.mirror {
            bed.mirror_to_sink_via(delivery);
        }
        for rule in &self.rules {
            bed.add_rule(rule);
        }
        match (self.attach, self.attach_only) {
            (Some((mode, method)), Some(roles)) => bed.attach_to(roles, mode, method),
            (Some((mode, method)), None) => bed.attach(mode, method),
            (None, _) => {}
        }
        bed
    }
}
