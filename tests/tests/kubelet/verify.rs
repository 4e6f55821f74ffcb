//! What the capture of the sink and the cluster's objects say: each of web's 500s on the
//! mirror exactly once from the rule on (the client's own record against the capture), nothing
//! of the others; the rule's hits and the `Mirrored` Events as `kubectl` shows them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::cluster::single_node::Cluster;
use mirror_e2e::proc::wait_until;
use serde_json::Value;

use crate::install::rule_status;
use crate::life::{Switch, Upgrade};
use crate::workloads::http_record;

/// Where the steps were in the client's records: `web_from`, `api_from` (the rule active;
/// indices into the whole records), `strict_until` (the upgrade and kube-proxy's switch
/// done), `rescheduled_from` (web's new pod Ready), and the steps' own indices (from the rule
/// on).
pub(crate) struct Windows<'a> {
    pub(crate) web_from: usize,
    pub(crate) api_from: usize,
    pub(crate) upgrade: &'a Upgrade,
    pub(crate) switch: &'a Switch,
    pub(crate) strict_until: usize,
    pub(crate) rescheduled_from: usize,
    pub(crate) new_web: &'a str,
}

/// What the check counted.
pub(crate) struct Checked {
    /// web's 500s since the rule that had to be on the mirror (each once).
    pub(crate) web_500s: usize,
    /// The new pod's 500s before the agent named it.
    pub(crate) missed_at_reschedule: usize,
    /// 500s answered while kube-proxy switched and not mirrored (none so far).
    pub(crate) missed_at_switch: usize,
    /// 500s through iptables' NAT after the switch, before the reschedule.
    pub(crate) after_switch: usize,
}

/// Ends the capture once web's last 500 is on it, and checks it: every 500 of web from the rule
/// on mirrored exactly once, through the upgrade and kube-proxy's switch and, after the
/// reschedule, from the new pod's first mirrored 500 on; web's 200s, api's and the gRPC
/// server's flows never.
pub(crate) fn exactly_once(c: &Cluster, capture: Capture, w: &Windows) -> Checked {
    let web: Vec<(u16, u16)> = http_record(c, "web").into_iter().skip(w.web_from).collect();
    let last_500 = web.iter().rev().find(|r| r.1 == 500).map(|r| r.0).expect("a 500");
    // The last 500's copy reaching the sink ends the capture (no fixed wait).
    let file = capture.file().to_path_buf();
    let seen = wait_until(Duration::from_secs(10), || {
        mirror_e2e::capture::pcap::read(&file).packets.iter().any(|p| p.dst.port() == last_500)
    });
    let trace = capture.stop();
    assert!(seen, "web's last 500 (client port {last_500}) never reached the mirror");

    // Exactly once from the trigger on: each 500 response on the mirror once, by client port.
    // The client's containers share its pod's ports: a web flow is told by web's port 8080 as
    // well as by the client's port (api's connection may have the same client port).
    let side = |p: &mirror_e2e::capture::pcap::Packet, server: u16, port: u16| {
        (p.src.port() == server && p.dst.port() == port) || (p.dst.port() == server && p.src.port() == port)
    };
    let web_side = |p: &mirror_e2e::capture::pcap::Packet, port: u16| side(p, 8080, port);
    let responses_500 = |port: u16| {
        trace.packets.iter().filter(|p| web_side(p, port) && p.payload.starts_with(b"HTTP/1.1 500")).count()
    };
    let ports = |p: &mirror_e2e::capture::pcap::Packet| [p.src.port(), p.dst.port()];
    let mirrored: BTreeSet<u16> = trace.packets.iter().flat_map(ports).collect();
    let web_mirrored = |port: u16| trace.packets.iter().any(|p| web_side(p, port));
    // Strict through the upgrade; after the reschedule, from the new
    // pod's first mirrored 500 on (the agent names a new pod within seconds: until then its
    // rule does not select it), and never twice nor a 200 before that.
    let (strict_end, resched) = (w.strict_until - w.web_from, w.rescheduled_from - w.web_from);
    let (switch_from, switched_at) = (w.switch.from, w.switch.at);
    let (upgrade_from, upgrade_to) = (w.upgrade.from, w.upgrade.to);
    let followed_at = web
        .iter()
        .enumerate()
        .skip(resched)
        .find(|(_, (port, status))| *status == 500 && responses_500(*port) > 0)
        .map(|(i, _)| i);
    let followed_at =
        followed_at.unwrap_or_else(|| panic!("no 500 of web's new pod {} on the mirror", w.new_web));
    let mut wrong = BTreeMap::new();
    let (mut missed_at_reschedule, mut missed_at_switch) = (0, 0);
    for (i, (port, status)) in web.iter().enumerate() {
        let n = responses_500(*port);
        let mut expected = usize::from(*status == 500);
        if (strict_end..followed_at).contains(&i) && *status == 500 && n == 0 {
            missed_at_reschedule += 1;
            expected = 0;
        }
        if (switch_from..switched_at).contains(&i) && *status == 500 && n == 0 {
            missed_at_switch += 1;
            expected = 0;
        }
        if n != expected || (*status == 200 && web_mirrored(*port)) {
            wrong.insert(*port, (i, *status, n));
        }
    }
    assert!(
        wrong.is_empty(),
        "web's flows mirrored wrongly (port: (index, status, 500s on the mirror)): {wrong:?}; of {} answers: \
         the upgrade from {upgrade_from} to {upgrade_to}, strict until {strict_end}, web rescheduled \
         at {resched}, followed at {followed_at}, kube-proxy switched from {switch_from} to \
         {switched_at}\nthe new agent's log:\n{}",
        web.len(),
        c.kubectl_ok(&["-n", "mirror", "logs", &w.upgrade.new_pod])
    );
    let after_followed = web[followed_at..].iter().filter(|r| r.1 == 500).count();
    assert!(after_followed >= 3, "too few of the new pod's 500s checked: {after_followed}");
    // api's flows (the same 500s, not selected) and the gRPC server's, never.
    let api: Vec<(u16, u16)> = http_record(c, "api").into_iter().skip(w.api_from).collect();
    assert!(api.iter().any(|r| r.1 == 500));
    let leaked: Vec<&(u16, u16)> =
        api.iter().filter(|r| trace.packets.iter().any(|p| side(p, 8081, r.0))).collect();
    assert!(leaked.is_empty(), "api's flows on the mirror: {leaked:?}");
    assert!(!mirrored.contains(&8081) && !mirrored.contains(&50051), "unselected servers on the mirror");
    let after_switch = web[switched_at..strict_end].iter().filter(|r| r.1 == 500).count();
    assert!(after_switch >= 12, "too few 500s through iptables' NAT checked: {after_switch}");
    let web_500s = web.iter().filter(|r| r.1 == 500).count() - missed_at_reschedule - missed_at_switch;
    Checked { web_500s, missed_at_reschedule, missed_at_switch, after_switch }
}

/// The rule's status and the pods' Events, as a user reads them (the agent writes hits and
/// Events in batches: polled): hits for each of `web_500s`, `Mirrored` on web's pods (the new
/// one too) and on no other. Returns the hits.
pub(crate) fn status_and_events(c: &Cluster, web_500s: usize, new_web: &str) -> u64 {
    let hits = || -> u64 { rule_status(c, "{.status.nodes[0].hits}").parse().unwrap_or(0) };
    let mirrored_events = || -> Value {
        let out = c.plane.kubectl(&[
            "-n",
            "shop",
            "get",
            "events",
            "--field-selector",
            "reason=Mirrored",
            "-o",
            "json",
        ]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    let on_web = |events: &Value| {
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["involvedObject"]["name"].as_str().is_some_and(|n| n.starts_with("web-")))
            .count()
    };
    let on_new_web = |events: &Value| {
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["involvedObject"]["name"].as_str() == Some(new_web))
    };
    let counted = wait_until(Duration::from_secs(30), || {
        let events = mirrored_events();
        hits() >= web_500s as u64 && on_web(&events) >= 1 && on_new_web(&events)
    });
    let (hits, events) = (hits(), mirrored_events());
    assert!(counted, "hits {hits} (web's 500s since the rule: {web_500s}); Mirrored Events: {events}");
    let on_other: Vec<&Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !e["involvedObject"]["name"].as_str().is_some_and(|n| n.starts_with("web-")))
        .collect();
    assert!(on_other.is_empty(), "Mirrored Events on pods the rule does not select: {on_other:?}");
    hits
}
