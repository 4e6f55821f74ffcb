//! The rules of the oracle (`status=`, `grpc-status=`, with `path=` and `host=`), the packet each
//! triggers at, and what the mirror must carry from there.

use super::*;

/// What a rule triggers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// A final `:status` in one of these ranges.
    Status(Vec<(u16, u16)>),
    /// A `grpc-status` in the trailers, one of these codes.
    Grpc(BTreeSet<u32>),
}

/// The part of a rule the oracle follows, from the rule's text: `status=500` (`5xx`,
/// `500-504`, lists), `grpc-status=13` or `grpc-status=internal,unavailable`, `path=` (a
/// prefix of `:path`), `host=` (`:authority` without its port, case-insensitive); limits and
/// other words are left to the classifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Rule {
    /// Its text.
    pub text: String,
    /// What triggers.
    pub condition: Condition,
    /// `path=`.
    pub path: Option<String>,
    /// `host=`.
    pub host: Option<String>,
}

impl fmt::Display for H2Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A gRPC code by number or name.
pub fn grpc_code(word: &str) -> Option<u32> {
    word.parse().ok().or_else(|| {
        mirror_bpf::rule::grpc::GRPC_STATUS_NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(word))
            .map(|c| c as u32)
    })
}

impl H2Rule {
    /// Reads a rule's text; panics on a trigger it does not know.
    #[track_caller]
    pub fn parse(text: &str) -> H2Rule {
        let (mut condition, mut path, mut host) = (None, None, None);
        for word in text.split_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            match key {
                "status" => {
                    let ranges = value
                        .split(',')
                        .map(|v| match (v.split_once('-'), v.strip_suffix("xx")) {
                            (Some((lo, hi)), _) => (lo.parse().unwrap(), hi.parse().unwrap()),
                            (None, Some(class)) => {
                                let c: u16 = class.parse().unwrap();
                                (c * 100, c * 100 + 99)
                            }
                            _ => (v.parse().unwrap(), v.parse().unwrap()),
                        })
                        .collect();
                    condition = Some(Condition::Status(ranges));
                }
                "grpc-status" => {
                    let codes = value
                        .split(',')
                        .map(|c| grpc_code(c).unwrap_or_else(|| panic!("{text}: no gRPC code {c}")))
                        .collect();
                    condition = Some(Condition::Grpc(codes));
                }
                "path" => path = Some(value.to_string()),
                "host" => host = Some(value.to_ascii_lowercase()),
                _ => {}
            }
        }
        let condition = condition.unwrap_or_else(|| panic!("{text}: no status or grpc-status"));
        H2Rule { text: text.to_string(), condition, path, host }
    }

    /// What of `b` (a server's header block) it triggers on, `request` being the stream's:
    /// `(kind, code)`.
    pub fn matches(&self, b: &Block, request: Option<&Request>) -> Option<(H2Kind, u32)> {
        self.matches_outcome(
            b.status(),
            b.grpc_status(),
            request.map(|r| (r.path.as_str(), r.authority.as_deref())),
        )
    }

    /// What of a call's outcome (a final `:status`, a `grpc-status` in its trailers) it
    /// triggers on, `request` being the call's `(:path, :authority)` when known: `(kind, code)`.
    pub fn matches_outcome(
        &self,
        status: Option<u16>,
        grpc_status: Option<u32>,
        request: Option<(&str, Option<&str>)>,
    ) -> Option<(H2Kind, u32)> {
        let hit = match &self.condition {
            Condition::Status(ranges) => status
                .filter(|s| *s >= 200 && ranges.iter().any(|(lo, hi)| (lo..=hi).contains(&s)))
                .map(|s| (H2Kind::Status, u32::from(s))),
            Condition::Grpc(codes) => grpc_status.filter(|c| codes.contains(c)).map(|c| (H2Kind::Grpc, c)),
        }?;
        if self.path.is_some() || self.host.is_some() {
            let (path, authority) = request?;
            if self.path.as_ref().is_some_and(|p| !path.starts_with(p.as_str())) {
                return None;
            }
            let authority = authority.map(|a| host_of(a).to_ascii_lowercase());
            if self.host.as_ref().is_some_and(|h| authority.as_deref() != Some(h.as_str())) {
                return None;
            }
        }
        Some(hit)
    }
}

/// `host:port` or `[v6]:port` without the port.
pub fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(authority, |(h, _)| h)
}

/// Which kind of trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum H2Kind {
    /// A `:status`.
    Status,
    /// A `grpc-status`.
    Grpc,
}

/// The first trigger of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Trigger {
    /// The connection.
    pub flow: FlowKey,
    /// Index in the trace of the packet that carried the triggering HEADERS frame's end.
    pub packet: usize,
    /// The stream.
    pub stream: u32,
    /// What triggered.
    pub kind: H2Kind,
    /// The `:status` or `grpc-status`.
    pub code: u32,
    /// Index of the rule (in the list given) that matched first.
    pub rule: usize,
    /// The stream's request, when seen.
    pub request: Option<Request>,
}

/// The first trigger of `c` under `rules`, if any: the first server header block that some
/// rule matches (the lowest-indexed such rule).
pub fn first_trigger(c: &Conversation, rules: &[H2Rule]) -> Option<H2Trigger> {
    let d = c.to_client.as_ref()?;
    d.blocks.iter().find_map(|b| {
        let request = c.requests.get(&b.stream);
        rules.iter().enumerate().find_map(|(i, r)| {
            r.matches(b, request).map(|(kind, code)| H2Trigger {
                flow: c.flow,
                packet: b.packet,
                stream: b.stream,
                kind,
                code,
                rule: i,
                request: request.cloned(),
            })
        })
    })
}

/// What the mirror of a capture must carry, with what the oracle read in it.
pub struct H2Expected {
    /// The packets, and the triggered flows (`status`: the `:status` or gRPC code; `target`:
    /// the `:path`).
    pub expected: Expected,
    /// Each triggered connection's first trigger, in trigger order.
    pub triggers: Vec<H2Trigger>,
    /// The HTTP/2 connections of the capture.
    pub conversations: Vec<Conversation>,
}

impl H2Expected {
    /// Reads `reference` (a capture at an endpoint, from the connections' start) under `rules`.
    pub fn from_reference(reference: &Trace, rules: &[H2Rule]) -> H2Expected {
        let conversations = conversations(reference);
        let mut triggers: Vec<H2Trigger> =
            conversations.iter().filter_map(|c| first_trigger(c, rules)).collect();
        triggers.sort_by_key(|t| t.packet);
        let first = triggers
            .iter()
            .map(|t| {
                let flow = TriggeredFlow {
                    flow: t.flow,
                    status: t.code as u16,
                    packets: 0,
                    crossing: 0,
                    method: t.request.as_ref().map(|r| r.method.clone()),
                    target: t.request.as_ref().map(|r| r.path.clone()),
                };
                (t.flow, (t.packet, flow))
            })
            .collect();
        H2Expected { expected: Expected::from_first(reference, first), triggers, conversations }
    }

    /// The conversation of `flow`.
    pub fn conversation(&self, flow: FlowKey) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.flow == flow)
    }
}

/// The trigger packets of `trace` under `rules`, with the code each reports: what
/// [`crate::oracles::nat_oracle::NatExpected::from_triggers`] takes, for a capture that may
/// hold one direction only (then the rules must not filter on the request).
pub fn trigger_packets(trace: &Trace, rules: &[H2Rule]) -> Vec<(usize, u16)> {
    conversations(trace)
        .iter()
        .filter_map(|c| first_trigger(c, rules))
        .map(|t| (t.packet, t.code as u16))
        .collect()
}
