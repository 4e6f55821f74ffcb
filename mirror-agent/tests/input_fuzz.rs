//! Input fuzzing, bounded in time: rules, configurations and API requests built from the
//! grammar's own tokens, mangled, and from arbitrary text. Nothing panics; each bad input gets
//! an error that says what and where (a rule error points at a token inside the text, a
//! configuration error names a key, the API answers 4xx with a JSON `error`), and each good
//! rule reads back as itself. The API cases run against one agent, which must still answer at
//! the end. `MIRROR_INPUT_FUZZ_CASES` sets the cases per property (default 256).

mod common;

use std::io::{Read, Write};
use std::path::Path;

use mirror_agent::config::Config;
use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::topology::netns::Netns;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};

use common::bins;

fn cases() -> u32 {
    std::env::var("MIRROR_INPUT_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Rule-like text: the grammar's tokens with values of every kind, in any order and number.
fn rule_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        "[0-9]{1,4}",
        "[0-9]xx",
        "[0-9]{3}-[0-9]{3}",
        "[0-9]{1,12}[kmg]?",
        "[0-9]{1,6}(ms|s|m|h|us|d)?",
        "[a-z]{0,4}",
        "-?[0-9]{1,20}",
        ".{0,6}",
    ];
    let key = prop_oneof![
        Just("status="),
        Just("port="),
        Just("packets="),
        Just("bytes="),
        Just("duration="),
        Just("latency>"),
        Just("latency="),
        Just("colour="),
        Just(""),
    ];
    let token = (key, value).prop_map(|(k, v)| format!("{k}{v}"));
    prop_oneof![
        4 => prop::collection::vec(token, 0..6).prop_map(|t| t.join(" ")),
        1 => ".{0,40}",
    ]
}

#[test]
fn rules_parse_or_fail_pointing_at_a_token() {
    let mut runner = TestRunner::new(PropConfig {
        cases: cases() * 4,
        failure_persistence: None,
        ..PropConfig::default()
    });
    runner
        .run(&rule_text(), |text| {
            match mirror_agent::rules::parse(&text) {
                Ok(rule) => {
                    // The canonical text reads back as the same rule.
                    let again = mirror_agent::rules::parse(&rule.to_string());
                    prop_assert_eq!(again.as_ref().ok(), Some(&rule), "{} -> {}", text, rule);
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(!e.reason.is_empty(), "no reason for {:?}", text);
                    prop_assert!(e.offset <= text.len(), "offset {} past {:?}", e.offset, text);
                    prop_assert!(
                        text.get(e.offset..).is_some_and(|rest| rest.starts_with(e.token.trim()))
                            || e.token.is_empty()
                            || text.trim().is_empty(),
                        "{:?}: the error's token is not at its offset: {}",
                        text,
                        msg
                    );
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Configuration-like YAML: the known sections and keys with values of every kind.
fn config_text() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("interfaces:\n  include"),
        Just("interfaces:\n  exclude"),
        Just("attach:\n  mode"),
        Just("attach:\n  expedite_rcu"),
        Just("mirror:\n  interface"),
        Just("mirror:\n  create"),
        Just("mirror:\n  method"),
        Just("mirror:\n  deliver"),
        Just("mirror:\n  mtu"),
        Just("api:\n  max_connections"),
        Just("api:\n  header_timeout"),
        Just("flows:\n  max"),
        Just("flows:\n  marks_max"),
        Just("latency:\n  stack_sample"),
        Just("log:\n  format"),
        Just("keep_attached"),
        Just("rules"),
        Just("colour"),
    ];
    let value = prop_oneof![
        Just("auto".to_string()),
        Just("tc".to_string()),
        Just("true".to_string()),
        Just("[]".to_string()),
        Just("~".to_string()),
        Just("[\"veth*\", 1]".to_string()),
        Just("{a: b}".to_string()),
        "-?[0-9]{1,12}",
        "[0-9]{1,5}(ms|s|m|h)",
        "\"[a-z0-9*.]{0,20}\"",
        "\\[\"(status=[0-9]{3}|port=[0-9]{1,6}|[a-z]{1,5})\"\\]",
        "[ -~]{0,12}",
    ];
    prop_oneof![
        4 => prop::collection::vec((key, value).prop_map(|(k, v)| format!("{k}: {v}\n")), 0..4)
            .prop_map(|l| l.concat()),
        1 => "[ -~\n\t]{0,80}",
    ]
}

#[test]
fn configs_parse_or_fail_naming_the_key() {
    let mut runner = TestRunner::new(PropConfig {
        cases: cases() * 4,
        failure_persistence: None,
        ..PropConfig::default()
    });
    runner
        .run(&config_text(), |text| {
            if let Err(e) = Config::parse(&text) {
                prop_assert!(!e.path.is_empty() && !e.reason.is_empty(), "{:?}: {:?}", text, e);
            }
            Ok(())
        })
        .unwrap();
}

/// One request on its own connection: the status, the body, or `None` if the connection
/// closed without an answer.
fn request(socket: &Path, head: &str, body: &[u8]) -> Option<(u16, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connecting to the agent");
    s.set_read_timeout(Some(std::time::Duration::from_secs(15))).unwrap();
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.get(9..12)?.parse().ok()?;
    Some((status, reply.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string()))
}

#[test]
fn api_answers_every_request_with_a_status_and_bad_ones_with_an_error() {
    if !require_root() {
        return;
    }
    let node = Netns::new("apifuzz");
    let env = AgentEnv::new(&bins(), &node, &AgentConfig::default());
    let agent = env.start(&[]);
    let socket = env.socket();
    let method = prop_oneof![Just("GET"), Just("POST"), Just("DELETE"), Just("PUT"), Just("PATCH")];
    let path = prop_oneof![
        Just("/v1/rules".to_string()),
        "/v1/rules/[0-9a-z%-]{0,12}",
        "/v1/flows\\?(limit=[0-9a-z-]{0,8}|[a-z]{1,6}=[0-9]{1,3})",
        Just("/v1/status".to_string()),
        "/v1/latency/groups/[a-z]{0,8}",
        "/[a-z/%.]{0,16}",
    ];
    let body = prop_oneof![
        rule_text().prop_map(|r| serde_json::json!({ "rule": r }).to_string()),
        Just("{\"enabled\": true}".to_string()),
        "\\{\"[a-z]{1,6}\": (1|\"x\"|null|\\[\\])\\}",
        "[ -~]{0,40}",
    ];
    let mut runner =
        TestRunner::new(PropConfig { cases: cases(), failure_persistence: None, ..PropConfig::default() });
    let added = std::cell::Cell::new(0u32);
    runner
        .run(&(method, path, body), |(method, path, body)| {
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let answer = request(&socket, &head, body.as_bytes());
            let Some((status, reply)) = answer else {
                return Err(TestCaseError::fail(format!("no answer to {method} {path} {body:?}")));
            };
            prop_assert!((200..500).contains(&status), "{} {} {:?}: {} {}", method, path, body, status, reply);
            if status == 201 {
                added.set(added.get() + 1);
            }
            // Errors from the API's own handlers say what was wrong, as JSON.
            if status == 400 && path.starts_with("/v1/rules") && method == "POST" && body.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(&reply)
                    .map_err(|e| TestCaseError::fail(format!("400 body is not JSON ({e}): {reply}")))?;
                prop_assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{}", reply);
            }
            Ok(())
        })
        .unwrap();
    // Still serving, and it says so.
    let (status, _) =
        request(&socket, "GET /v1/status HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n", b"")
            .expect("the agent stopped answering");
    assert_eq!(status, 200);
    println!("API fuzzing: {} requests, {} rules added", cases(), added.get());
    agent.terminate();
}
