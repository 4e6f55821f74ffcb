//! `mirrorctl top`: a live view of the agent, refreshed each second over the API: the mirror's
//! rate and drops, the kernel's drops of the pods' packets by reason and by pod, triggers per rule, DNS
//! responses by rcode and failed lookups by pod (where DNS is followed: [`super::top_dns`]), the
//! mirrored flows and the busiest ones, by pod. `q` (or Esc, or Ctrl-C) quits.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use hyper::Method;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use ratatui::Frame;

use super::top_dns::{self, DnsTally, DnsView};
use crate::api::client::Client;
use crate::api::text::trigger_text;
use crate::views::{EventView, FlowView, RuleView, StatusView};

/// How often the view is refreshed.
const TICK: Duration = Duration::from_secs(1);
/// Flows asked for each tick.
const FLOWS: usize = 500;

/// One refresh's worth of what the agent said, with rates against the one before.
#[derive(Debug, Default, Clone)]
pub struct View {
    /// Copies per second.
    pub mirror_pps: f64,
    /// Copied bytes per second.
    pub mirror_bps: f64,
    /// Drops per second: (copy errors, no mirror interface, trigger events lost).
    pub drops_ps: [f64; 3],
    /// The same, since the agent started.
    pub drops_total: [u64; 3],
    /// The kernel's drops of the pods' packets per second, and since the start by reason (most
    /// first).
    pub kernel_drops_ps: f64,
    /// The same by reason, since the agent started, most first.
    pub kernel_drops: Vec<(String, u64)>,
    /// The same by pod (`namespace/name`, `-` for none found): per second, and since the
    /// agent started (of the pods there are), most per second first.
    pub kernel_drops_by_pod: Vec<(String, f64, u64)>,
    /// Attached interfaces, pods known.
    pub interfaces: usize,
    /// Pods known.
    pub pods: usize,
    /// Rules: id, text, triggers, triggers per second.
    pub rules: Vec<(u32, String, u64, f64)>,
    /// Mirrored flows (most copies first): pods, endpoints, rule and status, copies, ended.
    pub mirrored: Vec<FlowRow>,
    /// Busiest flows (bytes per second).
    pub busiest: Vec<FlowRow>,
    /// DNS, where the agent follows it.
    pub dns: Option<DnsView>,
}

/// A flow as shown.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRow {
    /// Pods among its endpoints (`namespace/name`), or "-".
    pub pods: String,
    /// `a <-> b`.
    pub endpoints: String,
    /// `rule N (500)`, `rule N (grpc 13 INTERNAL)`, `rule N (reset)`, or "-".
    pub rule: String,
    /// Copies made.
    pub copied: u64,
    /// Bytes per second, both ways.
    pub bps: f64,
    /// Bytes, both ways.
    pub bytes: u64,
}

/// What the previous tick saw.
#[derive(Default)]
struct Before {
    at: Option<Instant>,
    counters: HashMap<String, u64>,
    hits: HashMap<u32, u64>,
    flow_bytes: HashMap<(String, String), u64>,
    pod_drops: HashMap<String, u64>,
    dns: DnsTally,
}

fn row(f: &FlowView, bps: f64) -> FlowRow {
    let pods: Vec<&str> = f.pods.iter().map(|p| p.pod.as_str()).collect();
    FlowRow {
        pods: if pods.is_empty() { "-".into() } else { pods.join(", ") },
        endpoints: format!("{} <-> {}", f.lo, f.hi),
        rule: match f.rule_id {
            Some(r) => {
                let on = trigger_text(f.trigger.as_deref(), f.status.unwrap_or(0), None);
                format!("rule {r} ({on}){}", if f.mirror_ended { " ended" } else { "" })
            }
            None => "-".into(),
        },
        copied: f.mirrored_packets,
        bps,
        bytes: f.forward.bytes + f.reverse.bytes,
    }
}

impl Before {
    fn view(
        &mut self,
        st: &StatusView,
        rules: &[RuleView],
        flows: &[FlowView],
        events: &[EventView],
    ) -> View {
        let now = Instant::now();
        let secs = self.at.map_or(0.0, |a| now.duration_since(a).as_secs_f64());
        let rate = |now: u64, then: Option<&u64>| match then {
            Some(t) if secs > 0.0 => now.saturating_sub(*t) as f64 / secs,
            _ => 0.0,
        };
        let c = |k: &str| st.counters.get(k).copied().unwrap_or(0);
        let drop_keys = ["mirror_errors", "mirror_no_target", "ringbuf_drops"];
        let mut v = View {
            mirror_pps: rate(c("mirrored_packets"), self.counters.get("mirrored_packets")),
            mirror_bps: rate(c("mirrored_bytes"), self.counters.get("mirrored_bytes")),
            drops_ps: drop_keys.map(|k| rate(c(k), self.counters.get(k))),
            drops_total: drop_keys.map(c),
            kernel_drops_ps: rate(c("drops"), self.counters.get("drops")),
            interfaces: st.interfaces.len(),
            pods: st.pods.len(),
            ..View::default()
        };
        v.kernel_drops = st.drops.iter().map(|(r, n)| (r.clone(), *n)).collect();
        v.kernel_drops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut pod_drops: HashMap<String, u64> = HashMap::new();
        for d in &st.pod_drops {
            let pod = if d.pod.is_empty() { "-" } else { d.pod.as_str() };
            *pod_drops.entry(pod.to_string()).or_default() += d.packets;
        }
        v.kernel_drops_by_pod =
            pod_drops.iter().map(|(p, n)| (p.clone(), rate(*n, self.pod_drops.get(p)), *n)).collect();
        v.kernel_drops_by_pod
            .sort_by(|a, b| b.1.total_cmp(&a.1).then(b.2.cmp(&a.2)).then_with(|| a.0.cmp(&b.0)));
        v.rules = rules
            .iter()
            .map(|r| (r.id, r.rule.clone(), r.hits, rate(r.hits, self.hits.get(&r.id))))
            .collect();
        let mut bytes = HashMap::new();
        let mut all: Vec<FlowRow> = flows
            .iter()
            .map(|f| {
                let key = (f.lo.clone(), f.hi.clone());
                let total = f.forward.bytes + f.reverse.bytes;
                let bps = rate(total, self.flow_bytes.get(&key));
                bytes.insert(key, total);
                row(f, bps)
            })
            .collect();
        v.mirrored = all.iter().filter(|r| r.rule != "-").cloned().collect();
        v.mirrored.sort_by_key(|r| std::cmp::Reverse(r.copied));
        all.sort_by(|a, b| b.bps.total_cmp(&a.bps).then(b.bytes.cmp(&a.bytes)));
        v.busiest = all;
        let follows_dns = st.protocols.split(", ").any(|p| p == "dns");
        v.dns = follows_dns.then(|| self.dns.update(secs, st, flows, events));
        self.at = Some(now);
        self.counters = st.counters.clone().into_iter().collect();
        self.hits = rules.iter().map(|r| (r.id, r.hits)).collect();
        self.flow_bytes = bytes;
        self.pod_drops = pod_drops;
        v
    }
}

/// `v` with an SI prefix (`1.5k`).
pub(super) fn si(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.1}G", v / 1e9),
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

/// Draws `v` on the whole frame.
pub fn draw(f: &mut Frame, v: &View) {
    let areas = Layout::vertical([
        Constraint::Length(5),
        Constraint::Length(v.rules.len().clamp(1, 8) as u16 + 3),
        Constraint::Length(v.dns.as_ref().map_or(0, top_dns::height)),
        Constraint::Percentage(40),
        Constraint::Min(5),
    ])
    .split(f.area());
    let [e, n, l] = v.drops_ps;
    let [et, nt, lt] = v.drops_total;
    let head = vec![Line::from(format!(
        "mirror {} pkt/s {}B/s   drops/s: copy errors {} no target {} events lost {} (total {et}/{nt}/{lt})   {} interfaces, {} pods   q quits",
        si(v.mirror_pps),
        si(v.mirror_bps),
        si(e),
        si(n),
        si(l),
        v.interfaces,
        v.pods
    ))];
    let mut head = head;
    let by_reason: Vec<String> = v.kernel_drops.iter().take(4).map(|(r, n)| format!("{r} {n}")).collect();
    head.push(Line::from(format!(
        "kernel drops of the pods' packets {}/s{}",
        si(v.kernel_drops_ps),
        if by_reason.is_empty() { String::new() } else { format!(" (total: {})", by_reason.join(", ")) }
    )));
    let by_pod: Vec<String> =
        v.kernel_drops_by_pod.iter().take(4).map(|(p, ps, n)| format!("{p} {}/s ({n})", si(*ps))).collect();
    head.push(Line::from(format!(
        "kernel drops by pod: {}",
        if by_pod.is_empty() { "none".to_string() } else { by_pod.join(", ") }
    )));
    f.render_widget(
        Paragraph::new(head).block(Block::default().borders(Borders::ALL).title("mirrorctl top")),
        areas[0],
    );

    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rules: Vec<Row> = v
        .rules
        .iter()
        .map(|(id, text, hits, ps)| {
            Row::new(vec![id.to_string(), hits.to_string(), format!("{ps:.1}"), text.clone()])
        })
        .collect();
    let t = Table::new(
        rules,
        [Constraint::Length(4), Constraint::Length(9), Constraint::Length(9), Constraint::Min(20)],
    )
    .header(Row::new(["ID", "TRIGGERS", "/S", "RULE"]).style(bold))
    .block(Block::default().borders(Borders::ALL).title("triggers per rule"));
    f.render_widget(t, areas[1]);

    let flows = |rows: &[FlowRow], title: &str| {
        let body: Vec<Row> = rows
            .iter()
            .map(|r| {
                Row::new(vec![
                    r.pods.clone(),
                    r.endpoints.clone(),
                    r.rule.clone(),
                    r.copied.to_string(),
                    format!("{}B/s", si(r.bps)),
                    format!("{}B", si(r.bytes as f64)),
                ])
            })
            .collect();
        let widths = [
            Constraint::Percentage(26),
            Constraint::Percentage(32),
            // `rule 12 (grpc 4 DEADLINE_EXCEEDED)` whole.
            Constraint::Length(34),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(9),
        ];
        Table::new(body, widths)
            .header(Row::new(["PODS", "ENDPOINTS", "MIRRORED", "COPIED", "RATE", "BYTES"]).style(bold))
            .block(Block::default().borders(Borders::ALL).title(title.to_string()))
    };
    if let Some(dns) = &v.dns {
        top_dns::draw(f, areas[2], dns);
    }
    f.render_widget(flows(&v.mirrored, "mirrored flows"), areas[3]);
    f.render_widget(flows(&v.busiest, "busiest flows"), areas[4]);
}

/// What a tick reads: the status, the rules, the flows, the trigger events after `after`.
type Fetched = (StatusView, Vec<RuleView>, Vec<FlowView>, Vec<EventView>);

async fn fetch(c: &Client<'_>, after: u64) -> anyhow::Result<Fetched> {
    let st: StatusView = c.call(Method::GET, "/v1/status", None).await?;
    let rules: Vec<RuleView> = c.call(Method::GET, "/v1/rules", None).await?;
    let flows: Vec<FlowView> = c.call(Method::GET, &format!("/v1/flows?limit={FLOWS}"), None).await?;
    let events = format!("/v1/events?after={after}&limit={}", top_dns::EVENTS);
    let events: Vec<EventView> = c.call(Method::GET, &events, None).await?;
    Ok((st, rules, flows, events))
}

/// Runs the view until `q`.
pub async fn run(c: &Client<'_>) -> anyhow::Result<()> {
    // Fails before the screen is taken when the agent does not answer.
    let mut before = Before::default();
    let (st, rules, flows, events) = fetch(c, before.dns.after()).await?;
    let mut view = before.view(&st, &rules, &flows, &events);
    let mut term = ratatui::init();
    let res = async {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                let (st, rules, flows, events) = fetch(c, before.dns.after()).await?;
                view = before.view(&st, &rules, &flows, &events);
                term.draw(|f| draw(f, &view))?;
                next = Instant::now() + TICK;
            }
            // Keys are read between ticks (the API calls are short).
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => {
                        let ctrl_c =
                            k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                        if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                            return Ok(());
                        }
                    }
                    Event::Resize(..) => {
                        term.draw(|f| draw(f, &view))?;
                    }
                    _ => {}
                }
            }
        }
    }
    .await;
    ratatui::restore();
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn the_view_shows_rules_and_flows_by_pod() {
        let v = View {
            mirror_pps: 1500.0,
            mirror_bps: 2.5e6,
            rules: vec![(3, "status=500".into(), 7, 2.0)],
            mirrored: vec![FlowRow {
                pods: "shop/web-0".into(),
                endpoints: "198.18.1.2:80 <-> 198.18.2.2:40000".into(),
                rule: "rule 3 (500)".into(),
                copied: 42,
                bps: 1000.0,
                bytes: 5000,
            }],
            kernel_drops_ps: 12.0,
            kernel_drops: vec![("netfilter_drop".into(), 40), ("no_socket".into(), 2)],
            kernel_drops_by_pod: vec![("shop/web-0".into(), 12.0, 40), ("-".into(), 0.0, 2)],
            ..View::default()
        };
        let mut term = Terminal::new(TestBackend::new(160, 30)).unwrap();
        term.draw(|f| draw(f, &v)).unwrap();
        let text: String = term.backend().buffer().content().iter().map(|c| c.symbol()).collect();
        for want in [
            "mirror 1.5k pkt/s 2.5MB/s",
            "status=500",
            "shop/web-0",
            "rule 3 (500)",
            "198.18.1.2:80",
            "kernel drops of the pods' packets 12/s (total: netfilter_drop 40, no_socket 2)",
            "kernel drops by pod: shop/web-0 12/s (40), - 0/s (2)",
        ] {
            assert!(text.contains(want), "{want} not shown");
        }
    }

    #[test]
    fn flows_name_their_trigger() {
        let flow = |trigger: Option<&str>, status| {
            let f = serde_json::json!({
                "lo": "198.18.1.2:50051", "hi": "198.18.2.2:40000", "forward": {"packets": 1, "bytes": 10},
                "reverse": {"packets": 1, "bytes": 10}, "rule_id": 4, "status": status, "trigger": trigger,
                "mirrored_packets": 2, "mirror_ended": false, "idle_ms": 0
            });
            row(&serde_json::from_value(f).unwrap(), 0.0).rule
        };
        assert_eq!(flow(None, 500), "rule 4 (500)");
        assert_eq!(flow(Some("status"), 503), "rule 4 (503)");
        assert_eq!(flow(Some("grpc-status"), 13), "rule 4 (grpc 13 INTERNAL)");
        assert_eq!(flow(Some("reset"), 0), "rule 4 (reset)");
        let v = View {
            mirrored: vec![FlowRow {
                pods: "shop/greeter-0".into(),
                endpoints: "198.18.1.2:50051 <-> 198.18.2.2:40000".into(),
                rule: flow(Some("grpc-status"), 4),
                copied: 2,
                bps: 0.0,
                bytes: 20,
            }],
            ..View::default()
        };
        let mut term = Terminal::new(TestBackend::new(160, 30)).unwrap();
        term.draw(|f| draw(f, &v)).unwrap();
        let text: String = term.backend().buffer().content().iter().map(|c| c.symbol()).collect();
        assert!(text.contains("rule 4 (grpc 4 DEADLINE_EXCEEDED)"), "not shown whole: {text}");
    }
}
