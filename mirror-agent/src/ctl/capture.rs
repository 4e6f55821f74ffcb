//! `mirrorctl capture`: reads the interface the agent hands copies to (the veth sink's peer,
//! or the sink) and writes pcapng: one interface per pod veth, named `<pod>/<namespace>
//! (<veth>)`, each packet's direction relative to that pod, and a comment with the rule that
//! mirrored it. A copy is told apart by its addresses: sent by a pod (copied where it left the
//! pod) or else received by one; its flow, and so its rule, by its tuple (either direction, or
//! the server-side tuple of a translated connection), asking the agent again when a tuple is
//! new.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper::Method;
use tokio::io::unix::AsyncFd;

use crate::api::client::Client;
use crate::capture::packet::{self, Tuple};
use crate::capture::socket::{PacketSocket, SNAPLEN};
use crate::capture::{Direction, PcapNgOut};
use crate::views::{FlowView, PodView, RuleView, StatusView};

/// What to capture.
#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {
    /// The pcapng file to write; `-` for stdout (`| tshark -r -` or `-i -`).
    #[arg(short = 'w', long = "write")]
    pub write: PathBuf,
    /// Stop after this long (e.g. 30s, 5m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Stop after writing this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Only packets of this pod (`namespace/name`, `name`, or its veth; `name/namespace` too).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only packets of flows this rule mirrored.
    #[arg(long)]
    pub rule: Option<u32>,
    /// Keep at most this many bytes of each packet (mirrored payload is sensitive).
    #[arg(long)]
    pub snaplen: Option<u32>,
    /// Fill in IPv4, TCP and UDP checksums left to offload (a pod's own packets are copied
    /// before any device computed them); `--fix-checksums false` writes them as copied.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fix_checksums: bool,
}

fn parse_duration(v: &str) -> Result<Duration, String> {
    mirror_bpf::rule::syntax::parse_duration(v)
}

/// How often the agent may be asked again about a tuple it did not know when asked first.
const REFRESH: Duration = Duration::from_millis(250);

/// What the agent knows: pods, flows, rules.
struct Known {
    pods: Vec<PodView>,
    flows: Vec<FlowView>,
    rules: BTreeMap<u32, String>,
    /// The latest drops' events: the dropped packets' (client, server, reason, location).
    drops: Vec<(String, String, String, String)>,
    at: Option<Instant>,
}

impl Known {
    async fn refresh(&mut self, c: &Client<'_>) -> anyhow::Result<()> {
        self.pods = c.call(Method::GET, "/v1/pods", None).await?;
        self.flows = c.call(Method::GET, "/v1/flows", None).await?;
        let rules: Vec<RuleView> = c.call(Method::GET, "/v1/rules", None).await?;
        self.rules = rules.into_iter().map(|r| (r.id, r.rule)).collect();
        let events: Vec<crate::views::EventView> = c.call(Method::GET, "/v1/events?limit=1000", None).await?;
        self.drops = events
            .into_iter()
            .filter_map(|e| {
                let d = e.drop?;
                Some((e.client_side.client, e.client_side.server, d.reason, d.location))
            })
            .collect();
        self.at = Some(Instant::now());
        Ok(())
    }

    fn pod_of(&self, ip: std::net::IpAddr) -> Option<&PodView> {
        let ip = ip.to_string();
        self.pods.iter().find(|p| p.addresses.contains(&ip))
    }

    /// The reason and location of the drop of a packet of `t`, the latest such event's.
    fn drop_of(&self, t: &Tuple) -> Option<(&str, &str)> {
        let (a, b) = (t.src.to_string(), t.dst.to_string());
        self.drops
            .iter()
            .rev()
            .find(|(c, s, _, _)| (*c == a && *s == b) || (*c == b && *s == a))
            .map(|(_, _, r, l)| (r.as_str(), l.as_str()))
    }

    fn flow_of(&self, t: &Tuple) -> Option<&FlowView> {
        let (a, b) = (t.src.to_string(), t.dst.to_string());
        let is = |lo: &str, hi: &str| (lo == a && hi == b) || (lo == b && hi == a);
        self.flows.iter().find(|f| is(&f.lo, &f.hi) || f.nat.as_ref().is_some_and(|n| is(&n.lo, &n.hi)))
    }
}

/// Where a copy belongs.
struct Place {
    /// Its pod and which way it went, relative to that pod.
    pod: Option<(PodView, Direction)>,
    /// The rule that mirrored its flow, and what triggered (`a 500`, `grpc 13 INTERNAL`).
    rule: Option<(u32, Option<String>)>,
}

fn matches_pod(p: &PodView, want: &str) -> bool {
    p.is_named(want) || p.interface == want
}

/// Runs the capture until its count, its duration, or SIGINT/SIGTERM.
pub async fn run(c: &Client<'_>, args: CaptureArgs) -> anyhow::Result<()> {
    let status: StatusView = c.call(Method::GET, "/v1/status", None).await?;
    let m = &status.mirror;
    let (Some(iface), Some(delivery)) = (m.copies_to.clone(), m.delivery.clone()) else {
        anyhow::bail!("the agent hands copies to no interface (mirror interface {} absent)", m.interface);
    };
    // Copies are received by the sink's peer (or an ifb), or sent out of a dummy.
    let want_outgoing = delivery != "ingress";
    let mut known =
        Known { pods: Vec::new(), flows: Vec::new(), rules: BTreeMap::new(), drops: Vec::new(), at: None };
    known.refresh(c).await?;
    check(&args, &known)?;
    let sock = PacketSocket::open(&iface).with_context(|| format!("capturing on {iface}"))?;
    // SAFETY: the socket owns its descriptor and keeps it open, unchanged, while registered.
    let mut sock = unsafe { AsyncFd::register(sock)? };
    let snaplen = args.snaplen.unwrap_or(SNAPLEN).min(SNAPLEN);
    let out: Box<dyn Write> = if args.write.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        let f = std::fs::File::create(&args.write)
            .with_context(|| format!("creating {}", args.write.display()))?;
        Box::new(std::io::BufWriter::new(f))
    };
    let to_stdout = args.write.as_os_str() == "-";
    let mut out = PcapNgOut::new(out, snaplen)?;
    eprintln!(
        "mirrorctl: capturing copies {} {iface}",
        if want_outgoing { "sent out of" } else { "received by" }
    );

    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (mut written, mut fixed, mut replayed) = (0u64, 0u64, 0u64);
    let mut asked = std::collections::HashSet::new();
    let done = |written: u64| args.count.is_some_and(|n| written >= n);
    'outer: while !done(written) {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let mut ready = tokio::select! {
            r = sock.readable_mut() => r?,
            _ = sleep => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        loop {
            let Some(mut frame) = ready.get_inner_mut().recv()? else {
                ready.clear_ready();
                break;
            };
            if frame.outgoing != want_outgoing {
                continue;
            }
            let tuple = packet::tuple(&frame.data);
            let mut place = place(&known, tuple.as_ref());
            let unknown = tuple.filter(|_| place.rule.is_none() || place.pod.is_none());
            // A tuple not seen before: its flow was marked before it was copied, so the agent
            // knows it now. Asked again about the same one no more often than REFRESH.
            let new = unknown.is_some_and(|t| asked.insert(mirror_bpf::FlowKey::new(t.src, t.dst, t.proto)));
            if new || (unknown.is_some() && known.at.is_none_or(|at| at.elapsed() >= REFRESH)) {
                known.refresh(c).await?;
                place = self::place(&known, tuple.as_ref());
            }
            if !wanted(&args, &place) {
                continue;
            }
            if args.fix_checksums && frame.csum_not_ready && packet::fix_checksums(&mut frame.data) {
                fixed += 1;
            }
            let (id, direction) = interface_of(&mut out, &iface, &place)?;
            let is_replay = frame.data.get(6..12) == Some(&mirror_bpf::replay::REPLAY_MAC[..]);
            if is_replay {
                replayed += 1;
            }
            let mut comment = packet_comment(&known, place.rule, is_replay);
            if frame.data.get(6..12) == Some(&mirror_bpf::event::DROP_MAC[..]) {
                // Its event was read before the copy was written: known, or known now.
                let t = tuple.as_ref();
                if t.and_then(|t| known.drop_of(t)).is_none() {
                    known.refresh(c).await?;
                }
                comment = drop_comment(t.and_then(|t| known.drop_of(t)), &comment);
            }
            let cut = frame.data.len().min(snaplen as usize);
            out.packet(id, frame.time, &frame.data[..cut], frame.orig_len, direction, &comment)?;
            written += 1;
            if to_stdout {
                out.flush()?;
            }
            if done(written) {
                break 'outer;
            }
        }
    }
    out.flush()?;
    let drops = sock.get_ref().drops();
    eprintln!(
        "mirrorctl: {written} packets written to {} ({replayed} replayed requests, {fixed} checksums filled in, \
         {drops} dropped by the kernel)",
        if to_stdout { "stdout".into() } else { args.write.display().to_string() }
    );
    Ok(())
}

/// Refuses a `--pod` or `--rule` the agent does not know, and `--snaplen 0`.
fn check(args: &CaptureArgs, known: &Known) -> anyhow::Result<()> {
    if let Some(want) = &args.pod {
        if !known.pods.iter().any(|p| matches_pod(p, want)) {
            let names: Vec<String> = known.pods.iter().map(PodView::label).collect();
            anyhow::bail!("--pod {want}: no such pod behind an attached veth (pods: {})", names.join(", "));
        }
    }
    if let Some(r) = args.rule {
        if !known.rules.contains_key(&r) {
            anyhow::bail!("--rule {r}: no such rule (see mirrorctl rules list)");
        }
    }
    if args.snaplen == Some(0) {
        anyhow::bail!("--snaplen 0 would keep nothing of a packet");
    }
    Ok(())
}

/// Whether a copy passes `--pod` and `--rule`.
fn wanted(args: &CaptureArgs, place: &Place) -> bool {
    let pod =
        args.pod.as_ref().is_none_or(|want| place.pod.as_ref().is_some_and(|(p, _)| matches_pod(p, want)));
    let rule = args.rule.is_none() || place.rule.as_ref().map(|r| r.0) == args.rule;
    pod && rule
}

/// The pcapng interface of a copy (its pod's veth, else `iface`), declared at its first
/// packet, and the copy's direction relative to that pod.
fn interface_of<W: Write>(
    out: &mut PcapNgOut<W>,
    iface: &str,
    place: &Place,
) -> anyhow::Result<(u32, Direction)> {
    Ok(match &place.pod {
        Some((p, d)) => {
            let (name, desc) = crate::capture::pod_interface(p);
            (out.interface(&name, &desc)?, *d)
        }
        None => (out.interface(iface, "copies not sent or received by a known pod")?, Direction::Unknown),
    })
}

/// A copy's comment: the rule that mirrored it, its text and what triggered; `replayed: ...`
/// first for the request the classifier kept and sent ahead of the trigger.
fn packet_comment(known: &Known, rule: Option<(u32, Option<String>)>, replayed: bool) -> String {
    let rule = rule.as_ref().map(|(r, on)| (*r, known.rules.get(r).map(String::as_str), on.as_deref()));
    crate::capture::comment(rule, replayed)
}

/// A dropped packet's comment: `dropped by the kernel: REASON at LOCATION; ` before the rule's.
fn drop_comment(drop: Option<(&str, &str)>, rule: &str) -> String {
    match drop {
        Some((reason, location)) => format!("dropped by the kernel: {reason} at {location}; {rule}"),
        None => format!("dropped by the kernel (its event is gone); {rule}"),
    }
}

fn place(known: &Known, tuple: Option<&Tuple>) -> Place {
    let Some(t) = tuple else { return Place { pod: None, rule: None } };
    let side = |a: SocketAddr| known.pod_of(a.ip()).cloned();
    let pod = side(t.src)
        .map(|p| (p, Direction::Outbound))
        .or_else(|| side(t.dst).map(|p| (p, Direction::Inbound)));
    let rule = known.flow_of(t).and_then(|f| Some((f.rule_id?, f.status.map(|s| on(f, s)))));
    Place { pod, rule }
}

/// What triggered flow `f` with `status`: `a 500`, `grpc 13 INTERNAL`, `reset`.
fn on(f: &FlowView, status: u16) -> String {
    crate::capture::trigger_on(f.trigger.as_deref(), status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_say_what_triggered() {
        let flow = |trigger: Option<&str>| {
            let f = serde_json::json!({
                "lo": "198.18.1.2:50051", "hi": "198.18.2.2:40000", "forward": {"packets": 1, "bytes": 10},
                "reverse": {"packets": 1, "bytes": 10}, "rule_id": 1, "status": 13, "trigger": trigger,
                "mirrored_packets": 2, "mirror_ended": false, "idle_ms": 0
            });
            serde_json::from_value::<FlowView>(f).unwrap()
        };
        assert_eq!(on(&flow(None), 500), "a 500");
        assert_eq!(on(&flow(Some("status")), 404), "a 404");
        assert_eq!(on(&flow(Some("grpc-status")), 13), "grpc 13 INTERNAL");
        assert_eq!(on(&flow(Some("noresponse")), 0), "noresponse");
    }

    #[test]
    fn comments_name_the_rule_and_a_replay() {
        let known = Known {
            pods: Vec::new(),
            flows: Vec::new(),
            rules: BTreeMap::from([(1, "status=500".to_string())]),
            drops: Vec::new(),
            at: None,
        };
        assert_eq!(
            drop_comment(Some(("netfilter_drop", "nft_do_chain+0x3e8")), "mirrored by rule 1 (drop=netfilter_drop)"),
            "dropped by the kernel: netfilter_drop at nft_do_chain+0x3e8; mirrored by rule 1 (drop=netfilter_drop)"
        );
        assert_eq!(
            packet_comment(&known, Some((1, Some("a 500".into()))), false),
            "mirrored by rule 1 (status=500), on a 500"
        );
        assert_eq!(packet_comment(&known, Some((2, None)), false), "mirrored by rule 2 (deleted since)");
        assert_eq!(
            packet_comment(&known, None, true),
            "replayed: the request before the trigger, kept by the classifier; rule unknown: the agent \
             has no flow with this tuple"
        );
    }
}
