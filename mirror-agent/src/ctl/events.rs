//! `mirrorctl events [-f]`: the recent trigger events, and with `-f` the next ones as they
//! come (long polls of `GET /v1/events?after=SEQ&wait=S`). A listing with HTTP/2 requests or
//! DNS queries (and a followed one) ends with a PROTOCOL column: each request's stream and
//! `:authority`, each DNS message's id.

use hyper::Method;

use super::table;
use crate::api::client::Client;
use crate::api::text::{request_text, trigger_text};
use crate::views::EventView;

/// How long one poll of `-f` waits for events (below the API's request timeout).
const FOLLOW_WAIT_S: u64 = 25;

/// The table's columns (the README's sample shows them; a test keeps the two in step).
pub const HEADER: [&str; 9] = [
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

/// The column after the others when some request is HTTP/2 or DNS.
const PROTOCOL: &str = "PROTOCOL";

/// The request's protocol: `h2 stream 5, authority greeter.example`, `http/1.x`, `dns id 6699`,
/// or `-`.
fn protocol(e: &EventView) -> String {
    match e.proto.as_deref() {
        Some("http2") => {
            let mut parts = vec![e.stream.map_or("h2".into(), |id| format!("h2 stream {id}"))];
            parts.extend(e.authority.as_ref().map(|a| format!("authority {a}")));
            parts.join(", ")
        }
        Some("http1") => "http/1.x".into(),
        Some("dns") => e.id.map_or("dns".into(), |id| format!("dns id {id}")),
        _ => "-".into(),
    }
}

/// The columns, with PROTOCOL or without.
fn header(protocol: bool) -> Vec<&'static str> {
    HEADER.iter().copied().chain(protocol.then_some(PROTOCOL)).collect()
}

/// An event's cells, with its protocol or without.
fn row(e: &EventView, with_protocol: bool) -> Vec<String> {
    let c = &e.client_side;
    // A DNS question is named by its response even when its query was not seen: said after it.
    let request = match (request_text(e), e.request_missing.as_deref()) {
        (Some(r), Some(why)) => format!("{r} ({why})"),
        (Some(r), None) => r,
        (None, why) => why.map_or("-".into(), |why| format!("({why})")),
    };
    vec![
        e.time.clone(),
        e.pod.clone().unwrap_or_else(|| e.interface.clone()),
        format!("{} -> {}", c.client, c.server),
        if e.nat { format!("{} -> {}", e.server_side.client, e.server_side.server) } else { "-".into() },
        e.rule_id.to_string(),
        request,
        trigger_text(Some(&e.kind), e.status, e.by.as_deref()),
        e.response_ms.or(e.after_request_ms).map_or("-".into(), |ms| format!("{ms:.1}ms")),
        c.community_id.clone(),
    ]
    .into_iter()
    .chain(with_protocol.then(|| protocol(e)))
    .collect()
}

/// The table of `events`: PROTOCOL only when some request is HTTP/2 or DNS.
fn render(events: &[EventView]) -> String {
    let more = events.iter().any(|e| matches!(e.proto.as_deref(), Some("http2" | "dns")));
    table::render(&header(more), &events.iter().map(|e| row(e, more)).collect::<Vec<_>>())
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
            print!("{}", render(&first));
        }
        return Ok(());
    }
    // Followed: one line per event as it comes, the columns of the table without alignment
    // across lines (JSON lines with -o json).
    let print = |e: &EventView| -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(e)?);
        } else {
            println!("{}", row(e, true).join("  "));
        }
        Ok(())
    };
    if !json {
        println!("{}", header(true).join("  "));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::TupleView;

    fn event(kind: &str, status: u16) -> EventView {
        let t = TupleView {
            client: "198.18.0.2:40000".into(),
            server: "198.18.0.3:50051".into(),
            community_id: "1:x".into(),
        };
        EventView {
            seq: 1,
            time: "2025-01-01T00:00:00.000Z".into(),
            interface: "vethserver".into(),
            ifindex: 3,
            pod: Some("shop/greeter-0".into()),
            labels: Default::default(),
            hook: "ingress".into(),
            client_side: t.clone(),
            server_side: t,
            nat: false,
            rule_id: 2,
            rule: String::new(),
            kind: kind.into(),
            by: Some("server".into()),
            status,
            status_name: None,
            proto: Some("http1".into()),
            stream: None,
            authority: None,
            method: Some("GET".into()),
            target: Some("/bar".into()),
            response_ms: Some(1.5),
            after_request_ms: None,
            request_missing: None,
            request: None,
            ..EventView::default()
        }
    }

    fn grpc() -> EventView {
        EventView {
            status_name: Some("INTERNAL".into()),
            proto: Some("http2".into()),
            stream: Some(5),
            authority: Some("greeter.example".into()),
            method: Some("POST".into()),
            target: Some("/helloworld.Greeter/SayHello".into()),
            ..event("grpc-status", 13)
        }
    }

    #[test]
    fn http1_listings_keep_their_columns() {
        let text = render(&[event("status", 500), event("reset", 0)]);
        let head = text.lines().next().unwrap();
        assert!(head.ends_with("COMMUNITY ID") && !head.contains(PROTOCOL), "{text}");
        for want in ["GET /bar", " 500 ", "reset by server", "1.5ms", "shop/greeter-0"] {
            assert!(text.contains(want), "{want:?} missing: {text}");
        }
    }

    #[test]
    fn grpc_and_http2_requests_are_shown() {
        let text = render(&[event("status", 500), grpc()]);
        assert!(text.lines().next().unwrap().ends_with(PROTOCOL), "{text}");
        let line = text.lines().find(|l| l.contains("SayHello")).unwrap();
        for want in [
            "POST /helloworld.Greeter/SayHello",
            "grpc 13 INTERNAL",
            "h2 stream 5, authority greeter.example",
        ] {
            assert!(line.contains(want), "{want:?} missing: {text}");
        }
        assert!(text.lines().nth(1).unwrap().trim_end().ends_with("http/1.x"), "{text}");
        let unnamed = EventView { status: 40, stream: None, authority: None, ..grpc() };
        assert_eq!(
            row(&unnamed, true)[6..],
            ["grpc 40".to_string(), "1.5ms".into(), "1:x".into(), "h2".into()]
        );
    }

    fn dns() -> EventView {
        EventView {
            kind: "dns".into(),
            status: 3,
            proto: Some("dns".into()),
            method: None,
            target: None,
            rcode: Some(3),
            rcode_name: Some("NXDOMAIN".into()),
            qname: Some("web.shop.svc.cluster.local".into()),
            qtype: Some(28),
            qtype_name: Some("AAAA".into()),
            id: Some(6699),
            response_ms: Some(1.2),
            ..event("dns", 3)
        }
    }

    #[test]
    fn dns_queries_are_shown() {
        let text = render(&[event("status", 500), dns()]);
        assert!(text.lines().next().unwrap().ends_with(PROTOCOL), "{text}");
        let line = text.lines().find(|l| l.contains("svc.cluster.local")).unwrap();
        for want in ["AAAA web.shop.svc.cluster.local", "dns NXDOMAIN", "1.2ms", "dns id 6699"] {
            assert!(line.contains(want), "{want:?} missing: {text}");
        }
        // The query was not seen: the response's question, and why no query is named.
        let unseen = EventView { response_ms: None, request_missing: Some("none pending".into()), ..dns() };
        assert_eq!(
            row(&unseen, true)[5..8],
            ["AAAA web.shop.svc.cluster.local (none pending)".to_string(), "dns NXDOMAIN".into(), "-".into()]
        );
        let json = serde_json::to_value(dns()).unwrap();
        assert_eq!(
            (&json["kind"], &json["proto"], &json["rcode"], &json["rcode_name"], &json["id"]),
            (
                &serde_json::json!("dns"),
                &serde_json::json!("dns"),
                &serde_json::json!(3),
                &serde_json::json!("NXDOMAIN"),
                &serde_json::json!(6699)
            )
        );
        assert_eq!(
            (&json["qname"], &json["qtype"], &json["qtype_name"]),
            (
                &serde_json::json!("web.shop.svc.cluster.local"),
                &serde_json::json!(28),
                &serde_json::json!("AAAA")
            )
        );
        assert!(json.get("method").is_some_and(|m| m.is_null()));
        assert_eq!(serde_json::from_value::<EventView>(json).unwrap(), dns());
    }

    #[test]
    fn json_carries_the_new_fields_and_reads_old_events() {
        let json = serde_json::to_value(grpc()).unwrap();
        assert_eq!(
            (&json["kind"], &json["status"], &json["status_name"], &json["stream"], &json["authority"]),
            (
                &serde_json::json!("grpc-status"),
                &serde_json::json!(13),
                &serde_json::json!("INTERNAL"),
                &serde_json::json!(5),
                &serde_json::json!("greeter.example")
            )
        );
        // HTTP/1.x events carry no HTTP/2 fields, and events without them still read.
        let mut old = serde_json::to_value(event("status", 500)).unwrap();
        assert!(old.get("stream").is_none() && old.get("status_name").is_none());
        let dns_keys = ["rcode", "rcode_name", "qname", "qtype", "qtype_name", "id"];
        assert!(dns_keys.iter().all(|k| old.get(k).is_none()), "{old}");
        old.as_object_mut().unwrap().remove("proto");
        let back: EventView = serde_json::from_value(old).unwrap();
        assert_eq!((back.proto, back.stream), (None, None));
    }
}
