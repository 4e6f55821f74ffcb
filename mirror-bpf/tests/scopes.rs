//! Rules selected per pod, with BPF_PROG_TEST_RUN: a selected rule applies on the interfaces
//! whose pod selects it, and there only where that pod is the flow's server (its responses at
//! ingress, the requests into it at egress, the resets it sends or receives as the server);
//! rules everywhere apply as before on every interface. Interfaces that select the same rules
//! share a scope, two sets make two scopes, the lowest id wins inside a scope across rules
//! everywhere and selected ones, hits are counted once per rule whatever the scope, and a rule
//! removed or an interface unselected stops at once. Needs root (fails without it in CI).

use std::collections::BTreeSet;
use std::thread::sleep;
use std::time::{Duration, Instant};

use libbpf_rs::MapCore;
use mirror_bpf::testing::h2::{self, Block, Conn, Indexing};
use mirror_bpf::testing::{self, consts::*, fixtures, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{
    Datapath, DatapathOptions, Error, EventRing, Reach, RuleId, Side, TriggerEvent, TriggerKind,
};

type Dp = Datapath<'static>;

const RESP_502: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n";
const RESP_404: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";

/// The classifier in a private network namespace with veths standing for pods' host-side ones,
/// and its events as they come.
struct Bed {
    dp: Dp,
    ring: EventRing<'static>,
    events: std::sync::Arc<std::sync::Mutex<Vec<TriggerEvent>>>,
    /// The ifindex of each link, by the name given to [`Bed::new`].
    links: Vec<u32>,
}

impl Bed {
    fn new(links: &[&str]) -> Option<Bed> {
        if !testing::require_root() {
            return None;
        }
        // What the classifier learns of a direction per CPU stays in one CPU's slot.
        testing::pin_thread(0).expect("pinning the test to CPU 0");
        testing::enter_private_netns();
        let links = links
            .iter()
            .map(|l| {
                testing::sh(&format!("ip link add {l} type veth peer name {l}p && ip link set {l} up"));
                testing::ifindex(l)
            })
            .collect();
        let dp = testing::load(&DatapathOptions::default());
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = events.clone();
        let ring = dp.events(move |e| sink.lock().unwrap().push(e)).unwrap();
        Some(Bed { dp, ring, events, links })
    }

    fn add(&mut self, rule: &str, reach: Reach) -> RuleId {
        self.dp.add_rule_with(rule.parse().unwrap(), reach).unwrap()
    }

    fn select(&mut self, ifindex: u32, rules: &[RuleId]) {
        self.dp.select(ifindex, &rules.iter().copied().collect()).unwrap();
    }

    /// Runs `frame` at the ingress (`egress`: egress) of `ifindex`; the triggers it made.
    fn run(&self, ifindex: u32, egress: bool, frame: &[u8]) -> u64 {
        let progs = &self.dp.skel().progs;
        let prog = if egress { &progs.tc_egress_mirror } else { &progs.tc_ingress_mirror };
        let before = self.dp.counters().unwrap();
        let (ret, out) = testing::run(prog, frame, SkbContext { ifindex, ingress_ifindex: 0 });
        assert_eq!(ret, VERDICT_CONTINUE, "verdict must always be 'continue'");
        assert_eq!(out, frame, "the frame must pass untouched");
        self.dp.counters().unwrap().since(&before).get(S::STAT_TRIGGERS)
    }

    /// An HTTP/1.1 exchange on connection `cport` seen on `ifindex`, its pod the server
    /// (`pod_serves`: the request goes in at egress, the response `resp` comes out at ingress)
    /// or the client (the other way round). The rule that marked the flow, if one did.
    fn exchange(&self, ifindex: u32, pod_serves: bool, cport: u16, resp: &[u8]) -> Option<RuleId> {
        assert_eq!(self.run(ifindex, pod_serves, &fixtures::v4_request(cport, PORT_HTTP, REQ_GET_BAR)), 0);
        let n = self.run(ifindex, !pod_serves, &fixtures::v4_response(PORT_HTTP, cport, resp));
        let events = self.take();
        assert_eq!(events.len() as u64, n, "{events:?}");
        let e = events.first()?;
        assert_eq!((e.ifindex, e.egress, e.kind), (ifindex, !pod_serves, TriggerKind::Status));
        Some(e.rule_id)
    }

    fn take(&self) -> Vec<TriggerEvent> {
        Datapath::poll_events(&self.ring, Duration::from_millis(20)).unwrap();
        std::mem::take(&mut *self.events.lock().unwrap())
    }

    fn hits(&self, id: RuleId) -> u64 {
        self.dp.rules().unwrap().iter().find(|r| r.id == id).map_or(0, |r| r.hits)
    }

    fn scoped(&self) -> u32 {
        self.dp.settings().unwrap().scoped
    }

    /// Entries of iface_scopes, and of port_rules in scopes other than 0.
    fn scope_entries(&self) -> (usize, usize) {
        let maps = &self.dp.skel().maps;
        let ifaces = maps.iface_scopes.keys().count();
        let scoped =
            maps.port_rules.keys().filter(|k| u32::from_ne_bytes(k[4..8].try_into().unwrap()) != 0).count();
        (ifaces, scoped)
    }
}

#[test]
fn a_selected_rule_applies_where_its_pod_is_the_server() {
    let Some(mut bed) = Bed::new(&["sa", "sb"]) else { return };
    let (a, b) = (bed.links[0], bed.links[1]);
    let sel = bed.add("status=500", Reach::Selected);
    assert_eq!((bed.scoped(), bed.dp.scopes()), (0, 0), "a selected rule no interface selects");
    assert_eq!(bed.exchange(a, true, 46000, RESP_500), None, "selected nowhere yet");
    bed.select(a, &[sel]);
    assert_eq!((bed.scoped(), bed.dp.scopes()), (1, 1));
    assert_eq!(bed.dp.rule_reach(sel), Some(Reach::Selected));
    assert_eq!(bed.dp.selected(a), BTreeSet::from([sel]));

    // The pod behind A answers a 500: its rule.
    assert_eq!(bed.exchange(a, true, 46001, RESP_500), Some(sel));
    // The same on B, whose pod did not select it: nothing.
    assert_eq!(bed.exchange(b, true, 46002, RESP_500), None);
    // A's pod as the client (its request out at ingress, the 500 into it at egress): nothing.
    assert_eq!(bed.exchange(a, false, 46003, RESP_500), None);

    // A rule everywhere marks on B, and on A's client side; on A's server side the selected
    // rule has the lower id.
    let all = bed.add("status=500", Reach::Everywhere);
    assert!(all > sel);
    assert_eq!(bed.exchange(b, true, 46004, RESP_500), Some(all));
    assert_eq!(bed.exchange(a, false, 46005, RESP_500), Some(all));
    assert_eq!(bed.exchange(a, true, 46006, RESP_500), Some(sel));
    assert_eq!((bed.hits(sel), bed.hits(all)), (2, 2));
    // A rule everywhere added while the scope exists reaches it too.
    let late = bed.add("status=404", Reach::Everywhere);
    assert_eq!(bed.exchange(a, true, 46007, RESP_404), Some(late));
    // Selecting the same set again changes nothing.
    bed.select(a, &[sel]);
    assert_eq!((bed.dp.scopes(), bed.scope_entries().0), (1, 1));
}

#[test]
fn two_scopes_and_the_lowest_id_inside_each() {
    let Some(mut bed) = Bed::new(&["sa", "sb", "sc", "sd"]) else { return };
    let [a, b, c, d] = bed.links[..] else { unreachable!() };
    let r502 = bed.add("status=502", Reach::Selected);
    let all = bed.add("status=5xx", Reach::Everywhere);
    let r500 = bed.add("status=500", Reach::Selected);
    let r404 = bed.add("status=404", Reach::Selected);
    bed.select(a, &[r502, r500]);
    bed.select(b, &[r404]);
    bed.select(d, &[r500, r502]);
    assert_eq!(bed.dp.scopes(), 2, "a and d share a scope");

    // In A's scope the selected 502 rule has the lowest id, the 500 rule loses to 5xx.
    assert_eq!(bed.exchange(a, true, 46100, RESP_502), Some(r502));
    assert_eq!(bed.exchange(a, true, 46101, RESP_500), Some(all));
    assert_eq!(bed.exchange(a, true, 46102, RESP_404), None);
    assert_eq!(bed.exchange(d, true, 46103, RESP_502), Some(r502));
    // B's scope: its 404 rule, and the rules everywhere.
    assert_eq!(bed.exchange(b, true, 46104, RESP_404), Some(r404));
    assert_eq!(bed.exchange(b, true, 46105, RESP_502), Some(all));
    // C selects nothing.
    assert_eq!(bed.exchange(c, true, 46106, RESP_500), Some(all));
    assert_eq!(bed.exchange(c, true, 46107, RESP_404), None);
    // One counter per rule, whatever the scope it matched in.
    let hits: Vec<u64> = [r502, all, r500, r404].iter().map(|id| bed.hits(*id)).collect();
    assert_eq!(hits, [2, 3, 0, 1]);
}

#[test]
fn unselecting_or_removing_the_rule_stops_it() {
    let Some(mut bed) = Bed::new(&["sa", "sb"]) else { return };
    let (a, b) = (bed.links[0], bed.links[1]);
    let sel = bed.add("status=500", Reach::Selected);
    let other = bed.add("status=404", Reach::Selected);
    let all = bed.add("status=503", Reach::Everywhere);
    bed.select(a, &[sel]);
    bed.select(b, &[sel, other]);
    assert_eq!(bed.exchange(a, true, 46200, RESP_500), Some(sel));
    // Unknown ids and rules everywhere are refused, and change nothing.
    assert!(matches!(bed.dp.select(a, &[sel, 999].into()), Err(Error::NoSuchRule(999))));
    assert!(matches!(bed.dp.select(a, &[all].into()), Err(Error::NotSelected(id)) if id == all));
    assert_eq!(bed.dp.selected(a), BTreeSet::from([sel]));

    bed.dp.forget_iface(a).unwrap();
    assert_eq!(bed.exchange(a, true, 46201, RESP_500), None);
    assert_eq!((bed.dp.scopes(), bed.scope_entries().0), (1, 1), "b's scope stays");
    bed.select(a, &[sel]);
    assert_eq!(bed.exchange(a, true, 46202, RESP_500), Some(sel));

    // Removed: it stops in every scope; b's scope is now {other}, a's empty (scope 0).
    bed.dp.remove_rule(sel).unwrap();
    assert_eq!(bed.exchange(a, true, 46203, RESP_500), None);
    assert_eq!(bed.exchange(b, true, 46204, RESP_500), None);
    assert_eq!(bed.exchange(b, true, 46205, RESP_404), Some(other));
    assert_eq!((bed.dp.selected(a), bed.dp.selected(b)), (BTreeSet::new(), BTreeSet::from([other])));
    assert_eq!((bed.dp.scopes(), bed.scoped()), (1, 1));
    bed.dp.remove_rule(other).unwrap();
    assert_eq!((bed.dp.scopes(), bed.scoped()), (0, 0));
    assert_eq!(bed.scope_entries(), (0, 0), "no interface entry, no scope's entry left");
    assert_eq!(
        bed.exchange(b, true, 46206, b"HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n"),
        Some(all)
    );
}

#[test]
fn a_selected_reset_rule_applies_where_its_pod_is_the_server() {
    let Some(mut bed) = Bed::new(&["sa", "sb"]) else { return };
    let (a, b) = (bed.links[0], bed.links[1]);
    let sel = bed.add("reset", Reach::Selected);
    bed.select(a, &[sel]);
    // (interface, its pod serves, the server resets, client port): the reset is seen where it
    // goes out of or into the pod.
    let cases = [
        (a, true, true, 46300, true),    // A's pod, the server, resets: at ingress
        (a, true, false, 46301, true),   // the client resets A's pod: at egress
        (a, false, true, 46302, false),  // A's pod is the client, its server resets: at egress
        (a, false, false, 46303, false), // A's pod, the client, resets: at ingress
        (b, true, true, 46304, false),   // B's pod, the server, resets: not selected there
    ];
    for (ifindex, pod_serves, server_resets, cport, want) in cases {
        assert_eq!(bed.run(ifindex, pod_serves, &fixtures::v4_request(cport, PORT_HTTP, REQ_GET_BAR)), 0);
        // The reset leaves the pod at ingress, enters it at egress.
        let from_pod = server_resets == pod_serves;
        let n = bed.run(ifindex, !from_pod, &fixtures::v4_rst(cport, server_resets));
        assert_eq!(n, u64::from(want), "{cport}");
        let events = bed.take();
        assert_eq!(events.len(), usize::from(want), "{cport}: {events:?}");
        if let Some(e) = events.first() {
            let by = if server_resets { Side::Server } else { Side::Client };
            assert_eq!((e.kind, e.rule_id, e.by, e.ifindex), (TriggerKind::Reset, sel, Some(by), a));
        }
    }
    assert_eq!(bed.hits(sel), 2);
}

#[test]
fn selected_http2_status_and_grpc_status_rules_apply_where_their_pod_serves() {
    let Some(mut bed) = Bed::new(&["sa", "sb"]) else { return };
    let (a, b) = (bed.links[0], bed.links[1]);
    let grpc = bed.add("grpc-status=internal", Reach::Selected);
    let status = bed.add("status=500", Reach::Selected);
    bed.select(a, &[grpc, status]);
    // A call on `ifindex` whose pod serves (`pod_serves`: the client's frames in at egress,
    // the server's out at ingress) or calls; answered with `answer` on stream 1: the triggers.
    let call = |ifindex: u32, pod_serves: bool, cport: u16, answer: &[u8]| {
        let mut c = Conn::new(cport, PORT_HTTP);
        let open = [
            h2::PREFACE,
            &h2::client_settings(),
            &h2::Headers::new(1, &Block::grpc_request("/pkg.Svc/Call", "grpc.example")).end_stream().build(),
        ]
        .concat();
        let mut n = bed.run(ifindex, pod_serves, &c.client(&open));
        n += bed.run(ifindex, !pod_serves, &c.server(&[h2::server_settings(), h2::settings_ack()].concat()));
        n += bed.run(ifindex, !pod_serves, &c.server(answer));
        (n, bed.take())
    };
    let internal = h2::trailers(1, &Block::new().status(200).grpc_status(Indexing::Never, true, 13));
    let (n, ev) = call(a, true, 46400, &internal);
    assert_eq!(n, 1, "{ev:?}");
    assert_eq!((ev[0].kind, ev[0].status, ev[0].rule_id), (TriggerKind::Grpc, 13, grpc));
    assert_eq!(call(b, true, 46401, &internal).0, 0, "B does not select it");
    assert_eq!(call(a, false, 46402, &internal).0, 0, "A's pod calls");
    let err = h2::headers(1, &Block::new().status(500));
    let (n, ev) = call(a, true, 46403, &err);
    assert_eq!((n, ev[0].kind, ev[0].rule_id), (1, TriggerKind::Status, status));
    assert_eq!(call(b, true, 46404, &err).0, 0);
    assert_eq!(call(a, false, 46405, &err).0, 0);
}

#[test]
fn a_selected_noresponse_rule_applies_to_requests_into_its_pod() {
    let Some(mut bed) = Bed::new(&["sa", "sb"]) else { return };
    let (a, b) = (bed.links[0], bed.links[1]);
    let sel = bed.add("noresponse>100ms", Reach::Selected);
    bed.select(a, &[sel]);
    let started = Instant::now();
    // Into A's pod (egress): marked when the time passes. Out of A's pod (its request, at
    // ingress), and into B's pod: never.
    bed.run(a, true, &fixtures::v4_request(46500, PORT_HTTP, REQ_GET_BAR));
    bed.run(a, false, &fixtures::v4_request(46501, PORT_HTTP, REQ_GET_BAR));
    bed.run(b, true, &fixtures::v4_request(46502, PORT_HTTP, REQ_GET_BAR));
    let mut events = Vec::new();
    while started.elapsed() < Duration::from_millis(400) {
        events.extend(bed.take());
        sleep(Duration::from_millis(10));
    }
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    let key = mirror_bpf::FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), 46500),
        std::net::SocketAddr::new(V4_SERVER.into(), PORT_HTTP),
        6,
    );
    assert_eq!((e.kind, e.rule_id, e.ifindex, e.key), (TriggerKind::NoResponse, sel, a, key));
    assert_eq!(bed.dp.counters().unwrap().get(S::STAT_NORESPONSE_TRIGGERS), 1);
}

/// A pin directory on the bpffs, removed even if the test fails.
struct PinDir(std::path::PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A restarted instance adopts the pinned maps but not the scopes of the one before (their ids
/// are that instance's): the interfaces' entries and the scopes' rule entries are cleared, the
/// rules everywhere stay; the restored rules are selected again.
#[test]
fn an_adopting_instance_clears_the_scopes_it_finds() {
    let Some(mut bed) = Bed::new(&["sa"]) else { return };
    let a = bed.links[0];
    let pins = PinDir(format!("/sys/fs/bpf/mirror-bpf-test-scopes-{}", std::process::id()).into());
    let opts = DatapathOptions { pin_path: Some(pins.0.clone()), ..Default::default() };
    let mut first = testing::load(&opts);
    let all = first.add_rule("port=8080 status=503".parse().unwrap()).unwrap();
    let sel = first.add_rule_with("status=500".parse().unwrap(), Reach::Selected).unwrap();
    first.select(a, &[sel].into()).unwrap();
    let saved: Vec<_> = first
        .rule_slots()
        .into_iter()
        .map(|(id, slot, rule)| (id, slot, rule, first.rule_reach(id).unwrap()))
        .collect();
    drop(first);

    bed.dp = testing::load(&opts);
    assert!(bed.dp.adopted());
    assert_eq!((bed.scope_entries(), bed.scoped()), ((0, 0), 0));
    let port_rules = bed.dp.skel().maps.port_rules.keys().count();
    assert_eq!(port_rules, 1, "the rule everywhere's entry is kept until it is restored");
    bed.ring = bed
        .dp
        .events({
            let sink = bed.events.clone();
            move |e| sink.lock().unwrap().push(e)
        })
        .unwrap();
    assert_eq!(bed.exchange(a, true, 46600, RESP_500), None);
    for (id, slot, rule, reach) in saved {
        bed.dp.restore_rule_with(id, slot, rule, reach).unwrap();
    }
    assert_eq!(
        (bed.dp.rule_reach(all), bed.dp.rule_reach(sel)),
        (Some(Reach::Everywhere), Some(Reach::Selected))
    );
    bed.select(a, &[sel]);
    assert_eq!(bed.exchange(a, true, 46601, RESP_500), Some(sel));
    bed.dp.unpin_all().unwrap();
}
