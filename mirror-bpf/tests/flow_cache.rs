//! The flow cache in front of the flow table, under BPF_PROG_TEST_RUN: what user space shows
//! stays exact while the counts sit in a CPU's cache slot, after the slot's periodic write-back,
//! and when two flows take turns in one slot. Needs root (fails without it in CI).

use libbpf_rs::{MapCore, MapFlags};
use mirror_bpf::testing::{self, consts::*, packet::*, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::{self, mirror_limits as L};
use mirror_bpf::{Datapath, DatapathOptions, FlowKey};

type Dp = Datapath<'static>;

/// Keeps this thread on one CPU, so that every run uses that CPU's slots.
fn pin_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity(0) applies to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

fn load() -> Option<Dp> {
    testing::require_root().then(|| {
        pin_to_one_cpu();
        testing::load(&DatapathOptions::default())
    })
}

fn key(cport: u16) -> FlowKey {
    FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), cport),
        std::net::SocketAddr::new(V4_SERVER.into(), PORT_HTTP),
        6,
    )
}

/// A data segment of the flow of `cport` (its payload is not HTTP).
fn segment(cport: u16) -> Vec<u8> {
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER)
        .tcp(cport, PORT_HTTP, tcp_flags::ACK)
        .payload(&[0x16; 40])
        .build()
}

/// Runs `frame` `n` times through the ingress program.
fn send(dp: &Dp, frame: &[u8], n: u32) {
    let (ret, _, _) =
        testing::run_repeat(&dp.skel().progs.tc_ingress_mirror, frame, SkbContext::default(), n);
    assert_eq!(ret, VERDICT_CONTINUE);
}

/// (forward packets, forward bytes) of the flow of `cport`, as user space shows it.
fn shown(dp: &Dp, cport: u16) -> (u64, u64) {
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(cport)).expect("the flow is shown");
    (f.forward.packets, f.forward.bytes)
}

/// Forward packets of the flow of `cport` in flow_table alone (summed over CPUs).
fn in_table(dp: &Dp, cport: u16) -> u64 {
    let raw = key(cport).to_raw();
    let per_cpu = dp.skel().maps.flow_table.lookup_percpu(testing::key_bytes(&raw), MapFlags::ANY).unwrap();
    per_cpu.map_or(0, |v| {
        v.iter()
            .map(|b| {
                let mut t = types::flow_traffic::default();
                plain::copy_from_bytes(&mut t, b).unwrap();
                t.dir[0].packets
            })
            .sum()
    })
}

/// The index in flow_cache of the slot holding the flow of `cport`, if one does.
fn slot_of(dp: &Dp, cport: u16) -> Option<Vec<u8>> {
    let raw = key(cport).to_raw();
    let want = testing::key_bytes(&raw);
    dp.skel()
        .maps
        .flow_cache
        .lookup_batch(L::FLOW_CACHE_SLOTS.0, MapFlags::ANY, MapFlags::ANY)
        .unwrap()
        .find(|(_, v)| v[..want.len()] == *want)
        .map(|(k, _)| k)
}

#[test]
fn counts_in_the_cache_are_shown_exact_and_written_back() {
    let Some(dp) = load() else { return };
    let frame = segment(41000);
    let len = frame.len() as u64;
    send(&dp, &frame, 10);
    assert!(slot_of(&dp, 41000).is_some(), "the flow holds a cache slot");
    assert_eq!(in_table(&dp, 41000), 0, "ten packets stay in the cache slot");
    assert_eq!(shown(&dp, 41000), (10, 10 * len), "user space adds the slot to the table");
    // The write-back after FLOW_CACHE_WRITEBACK packets of a direction.
    let n = L::FLOW_CACHE_WRITEBACK.0 + 5;
    send(&dp, &frame, n);
    assert_eq!(in_table(&dp, 41000), u64::from(L::FLOW_CACHE_WRITEBACK.0), "written back once");
    assert_eq!(shown(&dp, 41000), (10 + u64::from(n), (10 + u64::from(n)) * len));
}

#[test]
fn two_flows_sharing_a_slot_both_stay_exact() {
    let Some(dp) = load() else { return };
    let first: u16 = 20000;
    send(&dp, &segment(first), 1);
    let slot = slot_of(&dp, first).expect("the first flow holds a slot");
    // Another flow whose packets land in the same slot: found by trying client ports.
    let other = (first + 1..first + 40000)
        .find(|&port| {
            send(&dp, &segment(port), 1);
            let v = dp.skel().maps.flow_cache.lookup(&slot, MapFlags::ANY).unwrap().unwrap();
            let raw = key(port).to_raw();
            v[..std::mem::size_of::<types::flow_key>()] == *testing::key_bytes(&raw)
        })
        .expect("a flow sharing the slot among 40,000 ports");
    // The first flow's packet was written back when the other took the slot.
    assert_eq!(in_table(&dp, first), 1);
    for _ in 0..50 {
        send(&dp, &segment(first), 3);
        send(&dp, &segment(other), 2);
    }
    let len = segment(first).len() as u64;
    assert_eq!(shown(&dp, first), (151, 151 * len), "the first flow, exact");
    assert_eq!(shown(&dp, other), (101, 101 * len), "the other flow, exact");
    let created = dp.counters().unwrap().get(types::stat_idx::STAT_FLOWS_CREATED);
    assert_eq!(created, u64::from(other - first) + 1, "each flow created once, whatever the turns");
}

/// After a write-back, a direction's next ACKs are not taken for its handshake's last one, even
/// when that ACK carried data (so the SYN's time was never used).
#[test]
fn a_write_back_does_not_make_a_second_handshake() {
    let Some(dp) = load() else { return };
    let cport = 43000;
    let to_server = |flags| PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(cport, PORT_HTTP, flags);
    let syn = to_server(tcp_flags::SYN).build();
    let synack = PacketBuilder::ipv4(V4_SERVER, V4_CLIENT)
        .tcp(PORT_HTTP, cport, tcp_flags::SYN | tcp_flags::ACK)
        .build();
    send(&dp, &syn, 1);
    send(&dp, &synack, 1);
    // The handshake completed by a segment with data: no pure ACK measured it. With the SYN,
    // these make the direction's count reach the write-back, which starts it again at 0.
    send(&dp, &segment(cport), L::FLOW_CACHE_WRITEBACK.0 - 1);
    assert_eq!(in_table(&dp, cport), u64::from(L::FLOW_CACHE_WRITEBACK.0), "written back");
    let ack = to_server(tcp_flags::ACK).build();
    send(&dp, &ack, 2);
    let f = dp.flows().unwrap().into_iter().find(|f| f.key == key(cport)).expect("the flow");
    assert_eq!(f.handshake, None, "no handshake measured from an ACK after a thousand packets");
}
