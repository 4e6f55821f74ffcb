//! `mirrorctl events [-f]`: the recent trigger events, and with `-f` the next ones as they
//! come (long polls of `GET /v1/events?after=SEQ&wait=S`).

use hyper::Method;

use super::client::Client;
use super::table;
use crate::views::EventView;

/// How long one poll of `-f` waits for events (below the API's request timeout).
const FOLLOW_WAIT_S: u64 = 25;

const HEADER: [&str; 9] = [
    "TIME",
    "POD / INTERFACE",
    "CLIENT -> SERVER",
    "SERVER SIDE (NAT)",
    "RULE",
    "REQUEST",
    "TRIGGER",
    "AFTER REQUEST",
    "COMMUNITY ID",
];

/// What triggered: the status, "reset by client|server", or "noresponse".
fn trigger(e: &EventView) -> String {
    match (e.kind.as_str(), &e.by) {
        ("status", _) => e.status.to_string(),
        ("reset", Some(by)) => format!("reset by {by}"),
        (kind, _) => kind.to_string(),
    }
}

fn row(e: &EventView) -> Vec<String> {
    let c = &e.client_side;
    let request = match (&e.method, &e.target) {
        (Some(m), Some(t)) => format!("{m} {t}"),
        _ => "-".into(),
    };
    vec![
        e.time.clone(),
        e.pod.clone().unwrap_or_else(|| e.interface.clone()),
        format!("{} -> {}", c.client, c.server),
        if e.nat { format!("{} -> {}", e.server_side.client, e.server_side.server) } else { "-".into() },
        e.rule_id.to_string(),
        request,
        trigger(e),
        e.response_ms.or(e.after_request_ms).map_or("-".into(), |ms| format!("{ms:.1}ms")),
        c.community_id.clone(),
    ]
}

/// Prints the recent events (at most `limit`), then with `follow` the next ones until
/// interrupted.
pub async fn run(c: &Client<'_>, json: bool, follow: bool, limit: usize) -> anyhow::Result<()> {
    let first: Vec<EventView> = c.call(Method::GET, &format!("/v1/events?limit={limit}"), None).await?;
    if !follow {
        if json {
            println!("{}", serde_json::to_string_pretty(&first)?);
        } else if first.is_empty() {
            println!("no trigger events yet");
        } else {
            print!("{}", table::render(&HEADER, &first.iter().map(row).collect::<Vec<_>>()));
        }
        return Ok(());
    }
    // Followed: one line per event as it comes, the columns of the table without alignment
    // across lines (JSON lines with -o json).
    let print = |e: &EventView| -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(e)?);
        } else {
            println!("{}", row(e).join("  "));
        }
        Ok(())
    };
    if !json {
        println!("{}", HEADER.join("  "));
    }
    let mut last = 0;
    for e in &first {
        print(e)?;
        last = e.seq;
    }
    loop {
        let path = format!("/v1/events?after={last}&limit=1000&wait={FOLLOW_WAIT_S}");
        let next: Vec<EventView> = c.call(Method::GET, &path, None).await?;
        if let Some(e) = next.first() {
            if last > 0 && e.seq > last + 1 {
                eprintln!(
                    "mirrorctl: {} events were overwritten in the agent's ring before they could be shown",
                    e.seq - last - 1
                );
            }
        }
        for e in &next {
            print(e)?;
            last = e.seq;
        }
    }
}
