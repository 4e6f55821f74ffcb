//! The README's sample outputs against the real ones, so that they cannot drift: its tour run
//! as written (python's http.server in a pod namespace behind `veth-tour`, the installed
//! configuration's settings, a rule for 404s, a page that is not there), then the agent's start
//! line, `mirrorctl status` and `mirrorctl events` compared with the README's blocks line by
//! line, in their shape: numbers, times and Community IDs may differ; words, columns and their
//! order may not. A sample line `...` stands for any number of lines, a line ending in `...`
//! for the rest of its line. The names this test's environment gives (namespace, socket,
//! configuration file) are put back to the README's before comparing.

mod common;

use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::proc::{wait_until, Proc};
use mirror_e2e::topology::netns::Netns;

use common::{bins, pods, METRICS};

const README: &str = include_str!("../../README.md");

/// The README's fenced blocks, without their fences.
fn blocks() -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in README.lines() {
        match (open.as_mut(), line.starts_with("```")) {
            (None, true) => open = Some(Vec::new()),
            (Some(_), true) => out.push(open.take().expect("open").join("\n")),
            (Some(b), false) => b.push(line),
            (None, false) => {}
        }
    }
    out
}

/// The one block whose first line passes `first`.
#[track_caller]
fn block(what: &str, first: impl Fn(&str) -> bool) -> String {
    let found: Vec<String> = blocks().into_iter().filter(|b| first(b.lines().next().unwrap_or(""))).collect();
    assert_eq!(found.len(), 1, "the README has {} blocks of {what}", found.len());
    found.into_iter().next().expect("one")
}

/// The sample of `mirrorctl events`.
fn events_sample() -> String {
    block("mirrorctl events output", |l| l.starts_with("TIME "))
}

/// The sample of `mirrorctl status`.
fn status_sample() -> String {
    block("mirrorctl status output", |l| l.starts_with("mirror-agent ") && l.contains("attach mode"))
}

/// The sample of the agent's line once up.
fn log_sample() -> String {
    block("the agent's start line", |l| l.contains(" INFO mirror_agent::startup: "))
}

/// A line's cells: split at runs of two spaces or more (tables align with them).
fn cells(line: &str) -> Vec<&str> {
    line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()
}

/// A cell in its shape: each run of digits a `#`, sizes in MiB, a Community ID one token.
fn shape(cell: &str) -> String {
    let words: Vec<String> = cell
        .split(' ')
        .map(|w| {
            let id = w.strip_prefix("1:").is_some_and(|b| b.len() == 28 && b.ends_with('='));
            if id {
                return "1:<community id>".to_string();
            }
            let (mut out, mut digits) = (String::new(), false);
            for c in w.chars() {
                if !c.is_ascii_digit() {
                    out.push(c);
                } else if !digits {
                    out.push('#');
                }
                digits = c.is_ascii_digit();
            }
            out.replace("GiB", "MiB").replace("KiB", "MiB")
        })
        .collect();
    words.join(" ")
}

/// A line in its shape.
fn line_shape(line: &str) -> String {
    cells(line).iter().map(|c| shape(c)).collect::<Vec<_>>().join(" | ")
}

/// Whether `real` shows `sample`'s lines, in order.
fn check(sample: &str, real: &str) -> Result<(), String> {
    let real: Vec<String> = real.lines().filter(|l| !l.trim().is_empty()).map(line_shape).collect();
    let mut at = 0;
    let mut skipping = false;
    for s in sample.lines().filter(|l| !l.trim().is_empty()) {
        if s.trim() == "..." {
            skipping = true;
            continue;
        }
        let (want, prefix) = match s.trim_end().strip_suffix("...") {
            Some(head) => (line_shape(head), true),
            None => (line_shape(s), false),
        };
        let fits = |r: &String| if prefix { r.starts_with(&want) } else { *r == want };
        let found = if skipping {
            real[at..].iter().position(fits).map(|i| at + i)
        } else {
            fits_at(&real, at, fits)
        };
        match found {
            Some(i) => at = i + 1,
            None => {
                return Err(format!(
                    "the README shows\n  {s}\nwhich the real output does not{}, in the shape\n  {want}\nafter:\n{}",
                    if skipping { " (anywhere further)" } else { " (next)" },
                    real[at..].iter().take(5).map(|r| format!("  {r}")).collect::<Vec<_>>().join("\n")
                ))
            }
        }
        skipping = false;
    }
    Ok(())
}

fn fits_at(real: &[String], at: usize, fits: impl Fn(&String) -> bool) -> Option<usize> {
    real.get(at).filter(|r| fits(r)).map(|_| at)
}

#[test]
fn the_readme_samples_are_there_and_the_events_columns_are_the_tools() {
    let header = events_sample().lines().next().expect("a header").to_string();
    assert_eq!(cells(&header), mirror_agent::ctl::events::HEADER, "the README's events columns");
    assert!(status_sample().lines().count() > 5);
    assert_eq!(log_sample().lines().count(), 1);
    // The matcher tells a drift: a column renamed, a line gone, numbers aside.
    let real = "A  B\n12  x\n";
    assert_eq!(check("A  B\n7  x", real), Ok(()));
    assert!(check("A  C\n7  x", real).is_err());
    assert!(check("A  B\n7  y", real).is_err());
    assert!(check("A  B\n...\nB", real).is_err());
    assert_eq!(check("...\n12  x", real), Ok(()));
    assert_eq!(check("A  ...", real), Ok(()));
    assert_eq!(shape("2.5 GiB, 12 ms"), shape("150.9 MiB, 7 ms"));
    assert_eq!(shape("1:gdO1KgZ1hkcFNK3MwWgiI4HtDA4="), shape("1:Q6yhAIGTaaRfBt5PrfPGJBv7Egc="));
}

#[test]
fn the_readme_tour_prints_what_the_readme_shows() {
    if !require_root() {
        return;
    }
    // The tour's pod, its veth and web server, in a node namespace of the test's own.
    let node = Netns::new("node");
    let pod = Netns::new("tour");
    node.sh(&format!("ip link add veth-tour type veth peer name eth0 netns {}", pod.name()));
    node.sh("ip addr add 198.18.0.1/24 dev veth-tour && ip link set veth-tour up");
    pod.sh("ip addr add 198.18.0.2/24 dev eth0 && ip link set eth0 up");
    let www = tempfile::tempdir().expect("a temp dir");
    let mut python = pod.command("python3");
    python.args(["-m", "http.server", "80", "--bind", "198.18.0.2"]).current_dir(www.path());
    let _server = Proc::spawn("python3 -m http.server", &mut python);
    let listening = wait_until(Duration::from_secs(10), || pod.sh("ss -Htln").contains("198.18.0.2:80"));
    assert!(listening, "http.server does not listen");

    // The installed configuration's settings that show (rules, metrics); a veth sink on
    // every kernel (`auto` takes a dummy where the kernel has the type); info as installed.
    let cfg = AgentConfig {
        rules: vec!["status=500".into()],
        metrics: METRICS.into(),
        log: Some("info".into()),
        ..AgentConfig::default()
    };
    let env = AgentEnv::new(&bins(), &node, &cfg);
    let agent = env.start(&[]);
    let (ns, socket, config) =
        (pod.name().to_string(), env.socket().display().to_string(), env.config_path().display().to_string());
    let as_in_readme = |text: &str| {
        text.replace(&ns, "tour")
            .replace(&socket, "/run/mirror-agent/api.sock")
            .replace(&config, "/etc/mirror-agent/agent.yaml")
    };
    let up = wait_until(Duration::from_secs(10), || agent.output().contains(" up in "));
    assert!(up, "no line once up: {}", agent.output());
    let named = wait_until(Duration::from_secs(10), || pods(&env).iter().any(|p| p.name == ns));
    assert!(named, "the pod behind veth-tour is not named: {:?}", pods(&env));

    // 1. The line once up, and the status.
    let log = as_in_readme(&agent.output());
    if let Err(e) = check(&log_sample(), &log) {
        panic!("the agent's start line: {e}\n\nthe agent said:\n{log}");
    }
    let status = as_in_readme(&env.ctl_ok(&["status"]));
    if let Err(e) = check(&status_sample(), &status) {
        panic!("mirrorctl status: {e}\n\nmirrorctl status said:\n{status}");
    }

    // 2. and 3. The rule, the 404, the event.
    assert_eq!(env.ctl_ok(&["rules", "add", "status=404", "packets=1000", "duration=30s"]).trim(), "2");
    let mut curl = node.command("curl");
    curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://198.18.0.2/missing"]);
    let out = curl.output().expect("running curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404");
    let mut events = String::new();
    let seen = wait_until(Duration::from_secs(5), || {
        events = env.ctl_ok(&["events"]);
        events.starts_with("TIME ")
    });
    assert!(seen, "no event: {events}\n{}", agent.output());
    let events = as_in_readme(&events);
    if let Err(e) = check(&events_sample(), &events) {
        panic!("mirrorctl events: {e}\n\nmirrorctl events said:\n{events}");
    }
    agent.terminate();
}
