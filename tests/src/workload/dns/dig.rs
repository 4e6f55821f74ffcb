//! dig as a client: many lookups per process, each a 5-tuple of its own, its record read from
//! its YAML output.

use super::*;

/// One lookup dig makes: a question to a server, from a given local address and port (so that
/// each lookup is a 5-tuple of its own, known beforehand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The name asked (no final dot).
    pub name: String,
    /// Its type.
    pub qtype: QType,
    /// The server (a resolver or a ClusterIP) and its port.
    pub server: SocketAddr,
    /// The client's address and port.
    pub local: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
}

/// The answer dig got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigAnswer {
    /// The message's id.
    pub id: u16,
    /// Its response code.
    pub rcode: Rcode,
}

/// A lookup and what dig made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Looked {
    /// The lookup.
    pub lookup: Lookup,
    /// Its answer; `None` when none came (dig's one try timed out).
    pub answer: Option<DigAnswer>,
}

impl Looked {
    /// The answer's response code, `None` without an answer.
    pub fn rcode(&self) -> Option<Rcode> {
        self.answer.map(|a| a.rcode)
    }
}

/// Runs `lookups` from `ns`, in `clients` dig processes at once (each a share of them, one
/// after another, one try of at most 2 s each); files go to `dir`. Returns every lookup with
/// its answer, in the order given.
#[track_caller]
pub fn dig(ns: &Netns, lookups: &[Lookup], clients: usize, dir: &Path) -> Vec<Looked> {
    let mut sockets: Vec<(u16, bool)> =
        lookups.iter().map(|l| (l.local.port(), l.server.is_ipv6())).collect();
    sockets.sort_unstable();
    sockets.dedup();
    assert_eq!(
        sockets.len(),
        lookups.len(),
        "two lookups share a local port: each must be a 5-tuple of its own"
    );
    // dig applies the transport and the family of its command line to every line of a batch.
    let mut batches: Vec<Vec<&Lookup>> = Vec::new();
    for group in
        [(Transport::Udp, false), (Transport::Udp, true), (Transport::Tcp, false), (Transport::Tcp, true)]
    {
        let of: Vec<&Lookup> =
            lookups.iter().filter(|l| (l.transport, l.server.is_ipv6()) == group).collect();
        if of.is_empty() {
            continue;
        }
        let per = of.len().div_ceil(clients.max(1));
        batches.extend(of.chunks(per).map(<[&Lookup]>::to_vec));
    }
    let answers: Vec<Vec<(u16, DigMessage)>> = thread::scope(|s| {
        let runs: Vec<_> =
            batches.iter().enumerate().map(|(i, b)| s.spawn(move || dig_batch(ns, b, i, dir))).collect();
        runs.into_iter().map(|r| r.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let answers: std::collections::HashMap<(u16, bool), DigMessage> = batches
        .iter()
        .zip(answers)
        .flat_map(|(b, a)| {
            let v6 = b[0].server.is_ipv6();
            a.into_iter().map(move |(port, m)| ((port, v6), m))
        })
        .collect();
    lookups
        .iter()
        .map(|l| {
            let m = answers.get(&(l.local.port(), l.server.is_ipv6()));
            let answer = m.filter(|m| m.question == (l.name.to_ascii_lowercase(), l.qtype)).map(|m| m.answer);
            Looked { lookup: l.clone(), answer }
        })
        .collect()
}

/// A response as dig's YAML output gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DigMessage {
    question: (String, QType),
    answer: DigAnswer,
}

/// One dig process for `lookups` (of one transport and family); the responses it printed,
/// by the local port they came to.
fn dig_batch(ns: &Netns, lookups: &[&Lookup], n: usize, dir: &Path) -> Vec<(u16, DigMessage)> {
    let first = lookups[0];
    let batch: String = lookups
        .iter()
        .map(|l| {
            let local = match l.local {
                SocketAddr::V4(a) => format!("{}#{}", a.ip(), a.port()),
                SocketAddr::V6(a) => format!("{}#{}", a.ip(), a.port()),
            };
            format!("@{} -p {} -b {local} {} {}\n", l.server.ip(), l.server.port(), l.name, l.qtype)
        })
        .collect();
    let file = dir.join(format!("dig-{}-{n}.batch", std::process::id()));
    std::fs::write(&file, batch).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    let mut cmd: Command = ns.command("dig");
    cmd.args([if first.server.is_ipv6() { "-6" } else { "-4" }, "+tries=1", "+time=2", "+yaml"]);
    if first.transport == Transport::Tcp {
        cmd.arg("+tcp");
    }
    cmd.arg("-f").arg(&file);
    let out = cmd.output().expect("running dig");
    let stdout = String::from_utf8_lossy(&out.stdout);
    parse_dig_yaml(&stdout)
}

/// The responses of dig's `+yaml` output (`- type: MESSAGE` items; errors are other items),
/// with the local port each came to.
fn parse_dig_yaml(out: &str) -> Vec<(u16, DigMessage)> {
    let mut found = Vec::new();
    for item in out.split("\n- type: ").map(|i| i.trim_start_matches("- type: ")) {
        if !item.starts_with("MESSAGE") {
            continue;
        }
        let field = |key: &str| {
            item.lines().find_map(|l| {
                l.trim().strip_prefix(key)?.strip_prefix(": ").map(|v| v.trim().trim_matches('"'))
            })
        };
        let question = item
            .lines()
            .skip_while(|l| l.trim() != "QUESTION_SECTION:")
            .nth(1)
            .map(|l| l.trim().trim_start_matches("- ").trim_matches('\''))
            .and_then(|q| {
                let mut parts = q.split_whitespace();
                let name = parts.next()?.trim_end_matches('.').to_ascii_lowercase();
                let qtype = QType::from_name(parts.nth(1)?)?;
                Some((name, qtype))
            });
        let parsed = (|| {
            let port = field("query_port")?.parse().ok()?;
            let id = field("id")?.parse().ok()?;
            let rcode = Rcode::from_name(field("status")?)?;
            Some((port, DigMessage { question: question?, answer: DigAnswer { id, rcode } }))
        })();
        found.push(parsed.unwrap_or_else(|| panic!("dig printed a message that does not parse:\n{item}")));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dig_yaml_is_read() {
        let out = r#"- type: MESSAGE
  message:
    type: RECURSIVE_RESPONSE
    socket_protocol: UDP
    response_address: "198.18.2.2"
    response_port: 53
    query_address: "198.18.1.2"
    query_port: 40002
    response_message_data:
      opcode: QUERY
      status: NXDOMAIN
      id: 22007
      flags: qr rd ra
      QUESTION: 1
      QUESTION_SECTION:
        - 'Missing.test. IN AAAA'
- type: DIG_ERROR
  message: |
    no servers could be reached
"#;
        let m = parse_dig_yaml(out);
        assert_eq!(
            m,
            [(
                40002,
                DigMessage {
                    question: ("missing.test".into(), QType::AAAA),
                    answer: DigAnswer { id: 22007, rcode: Rcode::NXDOMAIN }
                }
            )]
        );
    }
}
