//! `mirrorctl flows`: the top flows, one per connection also across NAT (`/v1/flows`).

use hyper::Method;

use super::{print_json, table};
use crate::api::client::Client;
use crate::api::text::trigger_text;
use crate::views::FlowView;

const HEADER: [&str; 9] = [
    "ENDPOINT A",
    "ENDPOINT B",
    "PODS",
    "A->B PKTS/BYTES",
    "B->A PKTS/BYTES",
    "SERVER SIDE (NAT)",
    "MIRRORED",
    "COPIED",
    "IDLE",
];

/// Prints at most `limit` flows.
pub async fn run(c: &Client<'_>, json: bool, limit: usize) -> anyhow::Result<()> {
    let flows: Vec<FlowView> = c.call(Method::GET, &format!("/v1/flows?limit={limit}"), None).await?;
    if json {
        return print_json(&flows);
    }
    print!("{}", table::render(&HEADER, &flows.iter().map(row).collect::<Vec<_>>()));
    Ok(())
}

/// A flow's cells; MIRRORED is `rule 2 (grpc 13 INTERNAL)`, `, ended` after it when its
/// limit was reached.
fn row(f: &FlowView) -> Vec<String> {
    let mirrored = match (f.rule_id, f.status) {
        (Some(r), Some(s)) => {
            let on = trigger_text(f.trigger.as_deref(), s, None);
            format!("rule {r} ({on}){}", if f.mirror_ended { ", ended" } else { "" })
        }
        _ => "-".into(),
    };
    let pods: Vec<&str> = f.pods.iter().map(|p| p.pod.as_str()).collect();
    vec![
        f.lo.clone(),
        f.hi.clone(),
        if pods.is_empty() { "-".into() } else { pods.join(",") },
        format!("{}/{}", f.forward.packets, f.forward.bytes),
        format!("{}/{}", f.reverse.packets, f.reverse.bytes),
        f.nat.as_ref().map_or("-".into(), |n| format!("{} {}", n.lo, n.hi)),
        mirrored,
        f.mirrored_packets.to_string(),
        format!("{:.1}s", f.idle_ms as f64 / 1000.0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_names_rule_and_trigger() {
        let f: FlowView = serde_json::from_value(serde_json::json!({
            "lo": "198.18.1.2:50051", "hi": "198.18.2.2:40000", "forward": {"packets": 1, "bytes": 10},
            "reverse": {"packets": 2, "bytes": 20}, "rule_id": 1, "status": 13, "trigger": "grpc-status",
            "mirrored_packets": 3, "mirror_ended": true, "idle_ms": 1234
        }))
        .unwrap();
        let cells = row(&f);
        assert_eq!(cells[2..], ["-", "1/10", "2/20", "-", "rule 1 (grpc 13 INTERNAL), ended", "3", "1.2s"]);
        let unmarked = FlowView { rule_id: None, ..f };
        assert_eq!(row(&unmarked)[6], "-");
    }
}
