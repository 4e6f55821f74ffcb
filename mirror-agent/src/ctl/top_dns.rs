//! `mirrorctl top`'s DNS panel, where the `dns` protocol is followed: the DNS responses by rcode
//! (since the agent started, and per second, from the data path's counts, as `mirrorctl status`
//! and `mirror_dns_responses_total{rcode}` give them), and the failed lookups that triggered a
//! rule, by client pod (from the trigger events: `dns=` responses and DNS queries left
//! unanswered under `noresponse>`), with their rcodes and the last question.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use ratatui::Frame;

use crate::api::text::{rcode_text, request_text};
use crate::views::{EventView, FlowView, StatusView};

/// Trigger events asked for each tick (the newest, when more came).
pub const EVENTS: usize = 1000;
/// How the trigger of a DNS query left unanswered is shown among the rcodes.
const NO_ANSWER: &str = "no answer";

/// What the panel shows.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DnsView {
    /// Responses by rcode (`NOERROR`): since the agent started, per second; lowest rcode first.
    pub rcodes: Vec<(String, u64, f64)>,
    /// Failed lookups that triggered, by client pod, most first.
    pub pods: Vec<DnsPodRow>,
}

/// A client pod's failed lookups that triggered.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsPodRow {
    /// The pod (`namespace/name`), or the client's address when no pod has it.
    pub pod: String,
    /// Its failed lookups that triggered, since `top` started (those the agent still kept then
    /// included).
    pub failed: u64,
    /// Per second.
    pub per_s: f64,
    /// By rcode (`NXDOMAIN 3, SERVFAIL 1, no answer 1`), most first.
    pub rcodes: String,
    /// The last one: its question and rcode (`AAAA api.example NXDOMAIN`).
    pub last: String,
}

/// What the panel keeps from tick to tick.
#[derive(Debug, Default)]
pub struct DnsTally {
    /// The last trigger event read.
    seq: u64,
    /// The rcode counts of the previous tick.
    rcodes: BTreeMap<String, u64>,
    /// Pods by address, from the flows' endpoints.
    pods_by_addr: HashMap<String, String>,
    /// Per client pod: by rcode, the last question, the count of the previous tick.
    pods: BTreeMap<String, PodTally>,
}

#[derive(Debug, Default)]
struct PodTally {
    by_rcode: BTreeMap<String, u64>,
    last: String,
    before: u64,
}

/// The address of `addr:port` (`[v6]:port` too).
fn addr_of(endpoint: &str) -> String {
    endpoint.parse::<SocketAddr>().map_or_else(|_| endpoint.to_string(), |a| a.ip().to_string())
}

impl DnsTally {
    /// The events to ask for: those after this one.
    pub fn after(&self) -> u64 {
        self.seq
    }

    /// Takes a tick's status, flows and new events (`secs` after the previous tick; 0 at the
    /// first).
    pub fn update(
        &mut self,
        secs: f64,
        st: &StatusView,
        flows: &[FlowView],
        events: &[EventView],
    ) -> DnsView {
        let rate = |now: u64, then: Option<&u64>| match then {
            Some(t) if secs > 0.0 => now.saturating_sub(*t) as f64 / secs,
            _ => 0.0,
        };
        for p in flows.iter().flat_map(|f| &f.pods) {
            self.pods_by_addr.insert(addr_of(&p.endpoint), p.pod.clone());
        }
        let after = self.seq;
        for e in events.iter().filter(|e| e.seq > after) {
            self.seq = e.seq;
            let rcode = match e.kind.as_str() {
                "dns" => rcode_text(e.status),
                "noresponse" if e.proto.as_deref() == Some("dns") => NO_ANSWER.to_string(),
                _ => continue,
            };
            let client = addr_of(&e.client_side.client);
            // A query left unanswered is marked where it was seen, at the client's interface.
            let seen_at_client = (e.kind == "noresponse").then(|| e.pod.clone()).flatten();
            let pod = self.pods_by_addr.get(&client).cloned().or(seen_at_client).unwrap_or(client);
            let t = self.pods.entry(pod).or_default();
            *t.by_rcode.entry(rcode.clone()).or_default() += 1;
            t.last = match request_text(e) {
                Some(q) => format!("{q} {rcode}"),
                None => rcode,
            };
        }
        // The data path's rcodes, lowest first (as `rcode_counts` lists them).
        let rcodes: Vec<(String, u64, f64)> = st
            .dns_rcodes
            .iter()
            .map(|(name, n)| (name.clone(), *n, rate(*n, self.rcodes.get(name))))
            .collect();
        let order = |name: &str| (0..16u16).position(|r| rcode_text(r) == name).unwrap_or(16);
        let mut rcodes = rcodes;
        rcodes.sort_by_key(|(name, _, _)| order(name));
        self.rcodes = st.dns_rcodes.clone();
        let mut pods: Vec<DnsPodRow> = self
            .pods
            .iter_mut()
            .map(|(pod, t)| {
                let failed: u64 = t.by_rcode.values().sum();
                let per_s = rate(failed, Some(&t.before)).max(0.0);
                t.before = failed;
                let mut by: Vec<(&String, &u64)> = t.by_rcode.iter().collect();
                by.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
                let rcodes = by.iter().map(|(r, n)| format!("{r} {n}")).collect::<Vec<_>>().join(", ");
                DnsPodRow { pod: pod.clone(), failed, per_s, rcodes, last: t.last.clone() }
            })
            .collect();
        pods.sort_by_key(|p| std::cmp::Reverse(p.failed));
        DnsView { rcodes, pods }
    }
}

/// The panel's height for `v`.
pub fn height(v: &DnsView) -> u16 {
    v.pods.len().clamp(1, 6) as u16 + 4
}

/// Draws `v` in `area`.
pub fn draw(f: &mut Frame, area: Rect, v: &DnsView) {
    let block =
        Block::default().borders(Borders::ALL).title("DNS: responses by rcode, failed lookups by pod");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let [line, table] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(inner);
    let responses: Vec<String> =
        v.rcodes.iter().map(|(name, n, ps)| format!("{name} {n} ({}/s)", super::top::si(*ps))).collect();
    let responses = if responses.is_empty() { "none yet".to_string() } else { responses.join("  ") };
    f.render_widget(Paragraph::new(format!("responses: {responses}")), line);
    let rows: Vec<Row> = v
        .pods
        .iter()
        .map(|p| {
            Row::new(vec![
                p.pod.clone(),
                p.failed.to_string(),
                format!("{:.1}", p.per_s),
                p.rcodes.clone(),
                p.last.clone(),
            ])
        })
        .collect();
    let widths = [
        Constraint::Percentage(24),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Percentage(30),
        Constraint::Min(20),
    ];
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let t = Table::new(rows, widths)
        .header(Row::new(["CLIENT POD", "FAILED", "/S", "RCODES", "LAST"]).style(bold));
    f.render_widget(t, table);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn event(seq: u64, kind: &str, client: &str, rcode: u16, qname: &str) -> EventView {
        serde_json::from_value(serde_json::json!({
            "seq": seq, "time": "2025-06-02T09:16:02.311Z", "interface": "veth-dns", "ifindex": 9,
            "pod": if kind == "noresponse" { "shop/web-0" } else { "kube-system/coredns-0" },
            "hook": "ingress", "nat": true, "rule_id": 1, "rule": "dns=nxdomain,servfail", "kind": kind,
            "status": rcode, "proto": "dns", "qname": qname, "qtype": 28,
            "client_side": {"client": client, "server": "198.19.0.10:53", "community_id": "1:x"},
            "server_side": {"client": client, "server": "198.18.3.5:53", "community_id": "1:y"},
            "method": null, "target": null, "response_ms": 0.9
        }))
        .unwrap()
    }

    #[test]
    fn failed_lookups_are_counted_by_client_pod() {
        let flow: FlowView = serde_json::from_value(serde_json::json!({
            "lo": "198.18.1.2:53124", "hi": "198.19.0.10:53", "forward": {"packets": 1, "bytes": 10},
            "reverse": {"packets": 1, "bytes": 10}, "rule_id": 1, "status": 3, "trigger": "dns",
            "mirrored_packets": 2, "mirror_ended": false, "idle_ms": 0,
            "pods": [{"endpoint": "198.18.1.2:53124", "pod": "shop/web-0", "interface": "veth-web"},
                     {"endpoint": "198.18.3.5:53", "pod": "kube-system/coredns-0", "interface": "veth-dns"}]
        }))
        .unwrap();
        let mut st: StatusView = serde_json::from_value(serde_json::json!({
            "version": "0", "attach_mode": "auto", "tcx_available": true, "adopted": false,
            "interfaces": [], "mirror": {"interface": "mirror0", "ifindex": null, "created": false},
            "counters": {}, "attach_latency": {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0},
            "protocols": "http1, http2, dns", "dns_rcodes": {"NOERROR": 100, "NXDOMAIN": 4}
        }))
        .unwrap();
        let mut tally = DnsTally::default();
        let first = [
            event(1, "dns", "198.18.1.2:53124", 3, "api.example"),
            event(2, "dns", "198.18.1.2:53125", 2, "x.fail.example"),
            event(3, "status", "198.18.1.2:40000", 500, ""),
            event(4, "dns", "198.18.1.9:40001", 3, "nosuch.example"),
        ];
        let v = tally.update(0.0, &st, std::slice::from_ref(&flow), &first);
        assert_eq!(tally.after(), 4);
        assert_eq!(v.rcodes, [("NOERROR".to_string(), 100, 0.0), ("NXDOMAIN".to_string(), 4, 0.0)]);
        let web = &v.pods[0];
        assert_eq!((web.pod.as_str(), web.failed), ("shop/web-0", 2));
        assert_eq!(web.rcodes, "NXDOMAIN 1, SERVFAIL 1");
        assert_eq!(web.last, "AAAA x.fail.example SERVFAIL");
        assert_eq!((v.pods[1].pod.as_str(), v.pods[1].failed), ("198.18.1.9", 1), "no pod has that address");
        // A second later: two more responses, a query left unanswered (named by the event's pod).
        st.dns_rcodes = [("NOERROR".into(), 101), ("NXDOMAIN".into(), 5)].into();
        let v = tally.update(1.0, &st, &[], &[event(5, "noresponse", "198.18.1.7:5353", 0, "slow.example")]);
        assert_eq!(v.rcodes, [("NOERROR".to_string(), 101, 1.0), ("NXDOMAIN".to_string(), 5, 1.0)]);
        let web = &v.pods[0];
        assert_eq!((web.failed, web.per_s, web.last.as_str()), (3, 1.0, "AAAA slow.example no answer"));

        let mut term = Terminal::new(TestBackend::new(160, 12)).unwrap();
        term.draw(|f| draw(f, f.area(), &v)).unwrap();
        let text: String = term.backend().buffer().content().iter().map(|c| c.symbol()).collect();
        for want in
            ["NOERROR 101 (1/s)", "NXDOMAIN 5 (1/s)", "shop/web-0", "no answer 1", "AAAA slow.example"]
        {
            assert!(text.contains(want), "{want} not shown: {text}");
        }
    }
}
