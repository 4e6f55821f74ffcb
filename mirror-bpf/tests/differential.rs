//! Differential fuzzing of the classifier: random and mutated frames (see
//! `mirror_bpf::testing::fuzz`) through BPF_PROG_TEST_RUN and through the reference parser and
//! trigger decision (`mirror_bpf::testing::reference`) must agree on every frame: the verdict
//! (always "continue", the frame untouched), what the parse stage concluded (TCP, other,
//! malformed, from the counters), the flow key (read back from the flow table) and whether the
//! segment triggers the rule `status=500` (counters). Each frame is decided on a fresh flow.
//!
//! `MIRROR_FUZZ_PACKETS` frames (default 20,000; `make reliability` runs 1,000,000), from
//! `MIRROR_FUZZ_SEED` (default: the time; printed, so that a failure can be replayed).

use libbpf_rs::{MapCore, MapFlags};
use mirror_bpf::testing::fixtures::Parsed;
use mirror_bpf::testing::fuzz::{self, Rng};
use mirror_bpf::testing::reference::{self, Verdict};
use mirror_bpf::testing::rig::{self, Rig};
use mirror_bpf::testing::{self, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx as S;

/// The endpoint of the key that stands for "TCP, but not under the reference's key".
const UNSPECIFIED: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

fn env_u64(var: &str) -> Option<u64> {
    std::env::var(var).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{var}={v}: not a number")))
}

fn hex(frame: &[u8]) -> String {
    frame.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the classifier concluded, from the counters and the flow table.
fn observed(rig: &Rig, delta: &mirror_bpf::Counters, expected: &Verdict) -> Verdict {
    let parsed = if delta.get(S::STAT_MALFORMED) == 1 {
        Parsed::Malformed
    } else if delta.get(S::STAT_NON_TCP) == 1 {
        Parsed::Other
    } else {
        match (&expected.parsed, delta.get(S::STAT_FLOWS_CREATED)) {
            // The flow the reference names exists: the classifier parsed the same key.
            (Parsed::Tcp(key), 1) if flow_exists(rig, key) => Parsed::Tcp(*key),
            // A TCP segment under another key, or no fresh flow: shown as an impossible key.
            _ => Parsed::Tcp(mirror_bpf::FlowKey::new(UNSPECIFIED, UNSPECIFIED, 0)),
        }
    };
    let triggered = delta.get(S::STAT_TRIGGERS);
    Verdict { parsed, triggers: Some(triggered == 1) }
}

fn flow_exists(rig: &Rig, key: &mirror_bpf::FlowKey) -> bool {
    let raw = key.to_raw();
    let bytes = mirror_bpf::testing::key_bytes(&raw);
    rig.dp.skel().maps.flow_table.lookup_percpu(bytes, MapFlags::ANY).ok().flatten().is_some()
}

fn forget(rig: &Rig, key: &mirror_bpf::FlowKey) {
    testing::forget_flow(&rig.dp, &key.to_raw());
}

#[test]
fn classifier_agrees_with_the_reference() {
    if !testing::require_root() {
        return;
    }
    let packets = env_u64("MIRROR_FUZZ_PACKETS").unwrap_or(20_000);
    let seed = env_u64("MIRROR_FUZZ_SEED").unwrap_or_else(mirror_bpf::flow::monotonic_ns);
    println!("differential fuzzing: {packets} frames, MIRROR_FUZZ_SEED={seed}");
    testing::enter_private_netns();
    let mut rig = Rig::new(1, rig::mirror_veth());
    // DNS not followed: UDP is "other", to port 53 too, as the reference states.
    rig.follow_no_dns();
    let mut rng = Rng::new(seed);
    let mut disagreements = Vec::new();
    let mut disagreed = 0u64;
    let (mut refused, mut refused_n) = (Vec::new(), 0u64);
    let (mut tcp, mut other, mut malformed, mut triggers, mut unstated) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for n in 0..packets {
        let frame = fuzz::frame(&mut rng);
        let expected = reference::decide(&frame);
        let before = rig.counters();
        let (verdict, out) = match testing::try_run_repeat(rig.prog(), &frame, rig.ctx, 1) {
            Ok((verdict, out, _)) => (verdict, out),
            Err(e) => {
                if refused.len() < 5 {
                    refused.push(format!("{e}: {}", hex(&frame)));
                }
                refused_n += 1;
                continue;
            }
        };
        let delta = rig.counters().since(&before);
        let mut got = observed(&rig, &delta, &expected);
        if expected.triggers.is_none() {
            unstated += 1;
            got.triggers = None;
        }
        match expected.parsed {
            Parsed::Tcp(key) => {
                tcp += 1;
                forget(&rig, &key);
            }
            Parsed::Other => other += 1,
            Parsed::Malformed => malformed += 1,
            Parsed::Udp(_) => unreachable!("the reference follows no UDP"),
        }
        if expected.triggers == Some(true) {
            triggers += 1;
        }
        if n % 256 == 0 {
            rig.drain_events();
        }
        let wrong = verdict != VERDICT_CONTINUE || out != frame || got != expected;
        disagreed += u64::from(wrong);
        if wrong && disagreements.len() < 20 {
            disagreements.push(format!(
                "frame {n}: verdict {verdict:#x}, frame untouched {}: classifier {got:?}, reference {expected:?}\n  {}",
                out == frame,
                hex(&frame)
            ));
        }
    }
    println!(
        "{packets} frames: {tcp} TCP, {other} other, {malformed} malformed; {triggers} triggers \
         expected; trigger not stated for {unstated}; {disagreed} disagreements"
    );
    println!("refused by BPF_PROG_TEST_RUN: {refused_n} {refused:#?}");
    assert!(disagreements.is_empty(), "seed {seed}:\n{}", disagreements.join("\n"));
}
