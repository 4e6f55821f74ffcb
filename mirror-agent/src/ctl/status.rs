//! `mirrorctl status`: the agent, its mirror interface, its programs, its maps' kernel memory,
//! the attached interfaces with their pods, the classifier's counters, DNS responses by rcode
//! and the network stack's
//! share of each CPU (`/v1/status`).

use hyper::Method;

use super::{print_json, table};
use crate::api::client::Client;
use crate::views::{PodView, StatusView};

/// Prints the status.
pub async fn run(c: &Client<'_>, json: bool) -> anyhow::Result<()> {
    let s: StatusView = c.call(Method::GET, "/v1/status", None).await?;
    if json {
        return print_json(&s);
    }
    print_summary(&s);
    print!(
        "{}",
        table::render(&["INTERFACE", "IFINDEX", "POD", "MODE", "METHOD", "DIRECTIONS"], &interface_rows(&s))
    );
    println!();
    let rows: Vec<Vec<String>> = s.counters.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
    print!("{}", table::render(&["COUNTER", "VALUE"], &rows));
    println!(
        "(duplicate: packets seen a second time, on the other pod's veth, and skipped there so \
         that each is mirrored once; non_tcp: ARP, ICMP, UDP other than DNS and the like, passed on \
         untouched)"
    );
    if let Some(line) = dns_rcodes_line(&s) {
        println!("{line}");
    }
    if !s.drops.is_empty() {
        let parts: Vec<String> = s.drops.iter().map(|(r, n)| format!("{r} {n}")).collect();
        println!("kernel drops of the pods' packets, by reason: {}", parts.join(", "));
    }
    if !s.pod_drops.is_empty() {
        let parts: Vec<String> = s
            .pod_drops
            .iter()
            .map(|d| format!("{} {} {}", if d.pod.is_empty() { "-" } else { &d.pod }, d.reason, d.packets))
            .collect();
        println!("kernel drops by pod: {}", parts.join(", "));
    }
    if !s.net_cpu.is_empty() {
        let pct = |v: f64| format!("{:.1}%", v * 100.0);
        let rows: Vec<Vec<String>> = s
            .net_cpu
            .iter()
            .map(|c| vec![c.cpu.to_string(), pct(c.syscall), pct(c.softirq_rx), pct(c.softirq_tx)])
            .collect();
        println!();
        print!("{}", table::render(&["CPU", "SEND/RECV CALLS", "NET_RX", "NET_TX"], &rows));
    }
    Ok(())
}

/// The lines above the tables: version and attach mode, the mirror interface, attach latency,
/// tracing, protocols and programs, the maps' kernel memory (as `mirror-agent --check` prints
/// it).
fn print_summary(s: &StatusView) {
    println!(
        "mirror-agent {}  attach mode {} (TCX available: {})",
        s.version, s.attach_mode, s.tcx_available
    );
    let m = &s.mirror;
    let state = m.ifindex.map_or("absent".to_string(), |i| format!("ifindex {i}"));
    let how = match (m.copies_to.as_deref(), m.delivery.as_deref()) {
        (Some(to), Some("ingress")) => format!("; copies received by {to}"),
        (Some(to), Some(_)) => format!("; copies sent out of {to}"),
        _ => String::new(),
    };
    let kind = m.kind.as_deref().map_or(String::new(), |k| format!("{k}, "));
    println!(
        "mirror interface {} ({kind}{state}{}{how})",
        m.interface,
        if m.created { ", created by the agent" } else { "" }
    );
    let l = &s.attach_latency;
    println!(
        "attach latency: {} attachments, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        l.count, l.p50_ms, l.p99_ms, l.max_ms
    );
    println!("tracing programs: {}", s.tracing);
    let programs: Vec<String> = s
        .programs
        .iter()
        .map(|p| match p.verify_ms {
            Some(ms) => format!("{} {} ({ms:.0} ms)", p.name, p.verified_insns),
            None => format!("{} {}", p.name, p.verified_insns),
        })
        .collect();
    println!("protocols: {}", if s.protocols.is_empty() { "-" } else { &s.protocols });
    println!("programs, instructions verified (of 1,000,000): {}", programs.join(", "));
    if let Some(memory) = &s.memory {
        print!("{}", crate::memory::render(memory));
    }
    println!();
}

/// `DNS responses by rcode: NOERROR 120, NXDOMAIN 4`, when some were seen.
fn dns_rcodes_line(s: &StatusView) -> Option<String> {
    // By rcode, as the agent sends them ordered by name.
    let mut seen: Vec<(&String, &u64)> = s.dns_rcodes.iter().collect();
    let rcode = |name: &str| {
        mirror_bpf::rule::dns::RCODE_NAMES
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| name.parse().unwrap_or(99))
    };
    seen.sort_by_key(|(name, _)| rcode(name));
    let parts: Vec<String> = seen.iter().map(|(name, n)| format!("{name} {n}")).collect();
    (!parts.is_empty()).then(|| format!("DNS responses by rcode: {}", parts.join(", ")))
}

/// The attached interfaces, each with the pod behind it (`-`: none known).
fn interface_rows(s: &StatusView) -> Vec<Vec<String>> {
    let pod_of =
        |ifindex: u32| s.pods.iter().find(|p| p.ifindex == ifindex).map_or("-".to_string(), PodView::label);
    s.interfaces
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                i.ifindex.to_string(),
                pod_of(i.ifindex),
                i.mode.clone(),
                i.method.clone(),
                i.directions.join(","),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_responses_are_listed_by_rcode() {
        let mut s: StatusView = serde_json::from_value(serde_json::json!({
            "version": "0", "attach_mode": "auto", "tcx_available": true, "adopted": false,
            "interfaces": [], "mirror": {"interface": "mirror0", "ifindex": null, "created": false},
            "counters": {}, "attach_latency": {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        }))
        .unwrap();
        assert_eq!(dns_rcodes_line(&s), None);
        s.dns_rcodes = [("NXDOMAIN".into(), 4), ("13".into(), 1), ("NOERROR".into(), 120)].into();
        assert_eq!(dns_rcodes_line(&s).unwrap(), "DNS responses by rcode: NOERROR 120, NXDOMAIN 4, 13 1");
    }
}
