//! Request filters on rules (`method=`, `path=`, `host=`), alone, together, scoped to a port
//! and with `latency>`, against a real server (asyncio: 500 under `/api/` and `/web/`, 200
//! elsewhere, `?delay_ms=N` late) reached under several Host names on one address, with GET and
//! POST requests. Each rule alone, on a fresh set of connections: the flows it marks must be
//! exactly the connections whose request matches it by the client's own record (precision and
//! recall 1.0), the mirror what the client's capture says, and the filtered-out counter the
//! matching responses whose request the filter turned down. Bad filters are refused with the
//! token named.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::panic::{self, AssertUnwindSafe};
use std::thread;
use std::time::{Duration, Instant};

use mirror_bpf::testing::require_root;
use mirror_bpf::types::stat_idx;
use mirror_bpf::{FlowKey, RuleId, TriggerKind};
use mirror_e2e::oracles::oracle::Expected;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::testbed::{Events, Testbed};
use mirror_e2e::workload::raw::{self, Conn};

/// The asyncio server's port.
const PORT: u16 = 8080;

/// A port no server listens on.
const OTHER_PORT: u16 = 9090;

/// One request as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ask<'a> {
    method: &'a str,
    target: &'a str,
    host: &'a str,
}

/// A request and what came of it, by the client's record.
#[derive(Debug, Clone, Copy)]
struct Answered {
    ask: Ask<'static>,
    status: u16,
    took: Duration,
}

/// A rule and, independently of the classifier, which answered requests it must mark on
/// (`cond`: the trigger's own condition, status and time; `filter`: the request filter).
struct Case {
    rule: String,
    cond: fn(u16, Duration) -> bool,
    filter: fn(&Ask) -> bool,
    /// Whether it covers the server's port.
    here: bool,
}

impl Case {
    fn matches(&self, a: &Answered) -> bool {
        self.here && (self.cond)(a.status, a.took) && (self.filter)(&a.ask)
    }

    /// The trigger's condition held but the filter turned the request down.
    fn turned_down(&self, a: &Answered) -> bool {
        self.here && (self.cond)(a.status, a.took) && !(self.filter)(&a.ask)
    }
}

/// The name in a Host header, without its port.
fn host_name(host: &str) -> &str {
    host.split(':').next().unwrap_or("")
}

fn is_shop(host: &str) -> bool {
    host_name(host).eq_ignore_ascii_case("shop.example")
}

fn status_500(status: u16, _: Duration) -> bool {
    status == 500
}

fn slow(_: u16, took: Duration) -> bool {
    took >= SLOW
}

fn slow_500(status: u16, took: Duration) -> bool {
    status == 500 && took >= SLOW
}

/// The `latency>` of the rules here.
const SLOW: Duration = Duration::from_millis(200);

/// Each case alone, then scoped to the server's port, then to another port.
fn with_ports(rule: &str, cond: fn(u16, Duration) -> bool, filter: fn(&Ask) -> bool) -> Vec<Case> {
    [(String::new(), true), (format!("port={PORT} "), true), (format!("port={OTHER_PORT} "), false)]
        .into_iter()
        .map(|(port, here)| Case { rule: format!("{port}{rule}"), cond, filter, here })
        .collect()
}

/// The Host names: the shop in two spellings (case, a port), another site, and a name that
/// only begins like the shop's.
const HOSTS: [&str; 4] = ["shop.example", "SHOP.Example:8080", "blog.example", "shop.example.org"];

/// Connections of one request each (every host, GET and POST, every target), and two
/// keep-alive connections whose second request is the one that may match.
fn connections(targets: &[&'static str]) -> Vec<Vec<Ask<'static>>> {
    let mut conns = Vec::new();
    for host in HOSTS {
        for method in ["GET", "POST"] {
            for target in targets {
                conns.push(vec![Ask { method, target, host }]);
            }
        }
    }
    let ask = |method, target, host| Ask { method, target, host };
    conns.push(vec![
        ask("GET", "/web/checkout", "shop.example"),
        ask("POST", "/api/checkout", "shop.example"),
    ]);
    conns.push(vec![ask("GET", "/index", "shop.example"), ask("POST", "/api/checkout", "shop.example")]);
    conns
}

/// Runs every connection at once from the client pod (a thread each), each request answered
/// before the next; returns each connection's address and answers.
fn run(bed: &Testbed, server: SocketAddr, conns: &[Vec<Ask<'static>>]) -> Vec<(SocketAddr, Vec<Answered>)> {
    let ns = &bed.pod("client").ns;
    thread::scope(|s| {
        let threads: Vec<_> = conns
            .iter()
            .map(|asks| {
                s.spawn(move || {
                    let _inside = ns.enter();
                    let mut c = Conn::open(server);
                    let answered = asks
                        .iter()
                        .map(|&ask| {
                            let start = Instant::now();
                            let r = c.round(&raw::request(ask.method, ask.target, ask.host));
                            let took = start.elapsed();
                            let [r] = &r[..] else { panic!("{ask:?}: {r:?}") };
                            Answered { ask, status: r.status, took }
                        })
                        .collect();
                    (c.local(), answered)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    })
}

/// Each case alone on a fresh set of connections to `targets`: the rule added, the traffic
/// recorded and checked, the rule removed. Every case runs; the failures are reported together.
fn check_cases(cases: &[Case], targets: &[&'static str]) {
    let mut bed = Testbed::builder(&PODS).asyncio_server("server", PORT).build();
    bed.replay_to_sink();
    // Some fifty connections opened at once: tcpdump must lose none of their packets.
    bed.capture_buffer_kib(65536);
    let server = SocketAddr::new(bed.pod("server").addr(false), PORT);
    let conns = connections(targets);
    let events = bed.events();
    let mut failures = Vec::new();
    for case in cases {
        let rule = match bed.try_add_rule(&case.rule) {
            Ok(rule) => rule,
            Err(e) => {
                eprintln!("{:<62} refused: {e}", case.rule);
                failures.push(format!("{}: refused: {e}", case.rule));
                continue;
            }
        };
        let checked =
            panic::catch_unwind(AssertUnwindSafe(|| check_case(&bed, &events, case, rule, server, &conns)));
        bed.remove_rule(rule);
        if let Err(e) = checked {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(format!("{}: {}", case.rule, why.unwrap_or_default()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// One case on a fresh set of connections, its rule `rule` installed alone.
fn check_case(
    bed: &Testbed,
    events: &Events,
    case: &Case,
    rule: RuleId,
    server: SocketAddr,
    conns: &[Vec<Ask<'static>>],
) {
    let since = bed.snapshot();
    let mut record = Vec::new();
    let rec = bed.record("client", || record = run(bed, server, conns));

    // What must be marked, by the client's own record.
    let flow = |local| FlowKey::new(local, server, 6);
    let must: BTreeSet<FlowKey> =
        record.iter().filter(|(_, a)| a.iter().any(|a| case.matches(a))).map(|(l, _)| flow(*l)).collect();
    let turned_down = record.iter().flat_map(|(_, a)| a).filter(|a| case.turned_down(a)).count() as u64;
    let ours: BTreeSet<FlowKey> = record.iter().map(|(l, _)| flow(*l)).collect();
    let marked: BTreeSet<FlowKey> = bed
        .dp
        .flows()
        .expect("reading flows")
        .into_iter()
        .filter(|f| ours.contains(&f.key) && f.mark.is_some_and(|m| m.rule_id == rule))
        .map(|f| f.key)
        .collect();
    let hit = marked.intersection(&must).count() as f64;
    let precision = if marked.is_empty() { 1.0 } else { hit / marked.len() as f64 };
    let recall = if must.is_empty() { 1.0 } else { hit / must.len() as f64 };
    let c = bed.snapshot().counters.since(&since.counters);
    eprintln!(
        "{:<62} {} connections, {} to mark, {} marked: precision {precision:.3}, recall {recall:.3}; \
             filtered out {} (expected {turned_down})",
        case.rule,
        conns.len(),
        must.len(),
        marked.len(),
        c.get(stat_idx::STAT_FILTERED_OUT)
    );
    let describe = |keys: &BTreeSet<FlowKey>| -> Vec<&Vec<Answered>> {
        record.iter().filter(|(l, _)| keys.contains(&flow(*l))).map(|(_, a)| a).collect()
    };
    assert!(
        marked == must,
        "{}: marked but not to be: {:?}; to be marked but not: {:?}",
        case.rule,
        describe(&marked.difference(&must).copied().collect()),
        describe(&must.difference(&marked).copied().collect())
    );
    assert_eq!(c.get(stat_idx::STAT_FILTERED_OUT), turned_down, "{}: {c:?}", case.rule);

    // The mirror against the client's capture, read with the same conditions.
    let ts = |i: usize| rec.reference.packets[i].ts_ns;
    let expected = Expected::from_responses(&rec.reference, |conv, r| {
        let Some(q) = conv.request_of(r) else { return false };
        let host = q.host.as_deref().expect("every request has a Host header");
        let ask = Ask { method: &q.method, target: &q.target, host };
        let took = Duration::from_nanos(ts(r.packet) - ts(q.packet));
        case.here && (case.cond)(r.status, took) && (case.filter)(&ask)
    });
    let expected = bed.check_since(&rec, expected, &since);
    assert_eq!(expected.triggered.iter().map(|t| t.flow).collect::<BTreeSet<_>>(), must, "{}", case.rule);

    // One event per marked flow, naming the request that matched.
    let events = events.take();
    assert_eq!(events.len(), must.len(), "{}: {events:?}", case.rule);
    for ev in &events {
        let (_, answered) = record.iter().find(|(l, _)| flow(*l) == ev.key).expect("an event of ours");
        let first = answered.iter().find(|a| case.matches(a)).expect("a matching request");
        assert_eq!((ev.rule_id, ev.kind), (rule, TriggerKind::Status), "{ev:?}");
        assert_eq!(
            (ev.method.as_deref(), ev.target.as_deref(), ev.status),
            (Some(first.ask.method), Some(first.ask.target), first.status),
            "{}",
            case.rule
        );
    }
}

/// `method=`, `path=`, `host=` and all three on `status=500`, each alone, scoped to the
/// server's port and to another.
#[test]
fn filters_on_status_rules() {
    if !require_root() {
        return;
    }
    let api: fn(&Ask) -> bool = |a| a.target.starts_with("/api/");
    let post: fn(&Ask) -> bool = |a| a.method == "POST";
    let shop: fn(&Ask) -> bool = |a| is_shop(a.host);
    let all: fn(&Ask) -> bool =
        |a| a.method == "POST" && a.target.starts_with("/api/checkout") && is_shop(a.host);
    let cases: Vec<Case> = [
        ("status=500 path=/api/", api),
        ("status=500 method=POST", post),
        ("status=500 host=shop.example", shop),
        ("status=500 method=POST path=/api/checkout host=shop.example", all),
    ]
    .into_iter()
    .flat_map(|(rule, filter)| with_ports(rule, status_500, filter))
    .collect();
    let targets = ["/api/checkout", "/api/cart?id=3", "/web/checkout", "/web/api/x", "/index", "/apix"];
    check_cases(&cases, &targets);
}

/// Filters on `latency>` rules: a path answered after 300 ms or after 10 ms, under the
/// filtered prefix or not, each alone, scoped to the server's port and to another.
#[test]
fn filters_on_latency_rules() {
    if !require_root() {
        return;
    }
    let slow_path: fn(&Ask) -> bool = |a| a.target.starts_with("/slow");
    let post_api: fn(&Ask) -> bool = |a| a.method == "POST" && a.target.starts_with("/api/");
    let shop: fn(&Ask) -> bool = |a| is_shop(a.host);
    let cases: Vec<Case> = [
        ("latency>200ms path=/slow", slow as fn(u16, Duration) -> bool, slow_path),
        ("status=500 latency>200ms method=POST path=/api/", slow_500, post_api),
        ("latency>200ms host=shop.example", slow, shop),
    ]
    .into_iter()
    .flat_map(|(rule, cond, filter)| with_ports(rule, cond, filter))
    .collect();
    let targets = [
        "/slow?delay_ms=300",
        "/slower?delay_ms=300",
        "/slow?delay_ms=10",
        "/other?delay_ms=300",
        "/api/x?delay_ms=300",
        "/api/x?delay_ms=10",
        "/web/x?delay_ms=300",
    ];
    check_cases(&cases, &targets);
}

/// Bad filters and triggers are refused, the error naming the token; nothing is added.
#[test]
fn bad_rules_are_refused_naming_the_token() {
    if !require_root() {
        return;
    }
    let mut bed = Testbed::builder(&PODS).detached().build();
    for (rule, token) in [
        ("status=500 method=FOO", "method=FOO"),
        ("status=500 method=GET,FOO", "method=GET,FOO"),
        ("status=500 path=api", "path=api"),
        ("status=500 host=shop.example:8080", "host=shop.example:8080"),
        ("noresponse>0s", "noresponse>0s"),
        ("noresponse>soon path=/api/", "noresponse>soon"),
        ("reset status=500", "reset"),
        ("latency>0 path=/slow", "latency>0"),
    ] {
        match bed.try_add_rule(rule) {
            Err(mirror_bpf::Error::Rule(e)) => {
                assert_eq!(e.token, token, "{rule}: {e}");
                assert!(e.to_string().contains(&format!("'{token}'")), "{rule}: {e}");
                eprintln!("{rule:<40} {e}");
            }
            other => panic!("{rule}: {other:?}"),
        }
    }
    assert!(bed.dp.rules().expect("reading rules").is_empty(), "nothing was added");
    bed.add_rule("reset method=GET path=/api/ host=shop.example");
    bed.add_rule("noresponse>1s method=POST");
    assert_eq!(bed.dp.rules().expect("reading rules").len(), 2);
}
