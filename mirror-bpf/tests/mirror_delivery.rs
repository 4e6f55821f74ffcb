//! How a copy reaches the mirror interface (BPF_PROG_TEST_RUN in a private netns, packet
//! sockets on both ends of a veth sink): transmitted by the sink (its peer receives it), or
//! received directly by the sink or by its peer; never handed to the node's IP stack as its
//! own. A replay the agent writes to the sink goes the same way. Needs root (fails without it
//! in CI).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags};
use mirror_bpf::testing::{self, consts::*, fixtures, packet::*, SkbContext, VERDICT_CONTINUE};
use mirror_bpf::types::stat_idx as S;
use mirror_bpf::{AttachMode, Datapath, DatapathOptions, MirrorDelivery, MirrorMethod};

type Dp = Datapath<'static>;

/// `sll_pkttype` of what a packet socket saw.
const PACKET_OTHERHOST: u8 = 3;
const PACKET_OUTGOING: u8 = 4;

/// A packet socket on one interface, non-blocking.
struct Tap(OwnedFd);

impl Tap {
    fn on(dev: &str) -> Tap {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket call; the fd is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, proto.into()) };
        assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a new socket we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = testing::ifindex(dev) as i32;
        // SAFETY: sll is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "binding a packet socket to {dev}: {}", std::io::Error::last_os_error());
        Tap(fd)
    }

    /// Every frame received within `wait`, with its packet type.
    fn read(&self, wait: Duration) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            let mut buf = vec![0u8; 65536];
            // SAFETY: an all-zero sockaddr_ll is valid for the kernel to fill.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buf and sll are valid for the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n > 0 {
                buf.truncate(n as usize);
                out.push((sll.sll_pkttype, buf));
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        out
    }
}

/// A private netns with a veth sink `mir0` (peer `mir1`, both up, no IPv6 of their own), the
/// classifier loaded with a rule, and a marked flow; returns the flow's next packet.
fn marked_flow(dp: &mut Dp, cport: u16) -> Vec<u8> {
    testing::enter_private_netns();
    testing::sh("sysctl -qw net.ipv6.conf.default.disable_ipv6=1");
    testing::sh("ip link add mir0 type veth peer name mir1 && ip link set mir1 up && ip link set mir0 up");
    dp.add_rule("status=500".parse().unwrap()).unwrap();
    run(dp, &fixtures::v4_response(PORT_HTTP, cport, RESP_500));
    assert!(dp.mark(&flow_key(cport)).unwrap().is_some(), "the flow is marked");
    PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(cport, PORT_HTTP, tcp_flags::ACK).build()
}

fn flow_key(cport: u16) -> mirror_bpf::FlowKey {
    mirror_bpf::FlowKey::new(
        std::net::SocketAddr::new(V4_CLIENT.into(), cport),
        std::net::SocketAddr::new(V4_SERVER.into(), PORT_HTTP),
        6,
    )
}

fn run(dp: &Dp, frame: &[u8]) -> mirror_bpf::Counters {
    let before = dp.counters().unwrap();
    let (ret, out) = testing::run(&dp.skel().progs.tc_ingress_mirror, frame, SkbContext::default());
    assert_eq!((ret, out.as_slice()), (VERDICT_CONTINUE, frame), "the packet passes untouched");
    dp.counters().unwrap().since(&before)
}

fn load() -> Option<Dp> {
    testing::require_root().then(|| testing::load(&DatapathOptions::default()))
}

#[test]
fn each_delivery_reaches_the_interface_it_names_and_only_it() {
    let Some(mut dp) = load() else { return };
    let ack = marked_flow(&mut dp, 51000);
    let (mir0, mir1) = (testing::ifindex("mir0"), testing::ifindex("mir1"));
    let cases = [
        // Sent out of the sink: seen going out there, coming in on its peer.
        ("egress of mir0", mir0, MirrorDelivery::Egress, Some(PACKET_OUTGOING), Some(PACKET_OTHERHOST)),
        // Received by the sink: there only, as from the wire, for another host.
        ("ingress of mir0", mir0, MirrorDelivery::Ingress, Some(PACKET_OTHERHOST), None),
        // Received by the peer without crossing the veth: what a capture on the peer saw before.
        ("ingress of mir1", mir1, MirrorDelivery::Ingress, None, Some(PACKET_OTHERHOST)),
    ];
    for (what, ifindex, delivery, on_mir0, on_mir1) in cases {
        dp.set_mirror_target(ifindex, delivery).unwrap();
        assert_eq!(dp.mirror_delivery(), delivery);
        let (tap0, tap1) = (Tap::on("mir0"), Tap::on("mir1"));
        let d = run(&dp, &ack);
        assert_eq!((d.get(S::STAT_MIRRORED_PACKETS), d.get(S::STAT_MIRROR_ERRORS)), (1, 0), "{what}");
        for (tap, expect, dev) in [(&tap0, on_mir0, "mir0"), (&tap1, on_mir1, "mir1")] {
            let seen = tap.read(Duration::from_millis(200));
            match expect {
                Some(kind) => {
                    assert_eq!(seen.len(), 1, "{what}: {dev} saw {} frames", seen.len());
                    assert_eq!(seen[0].0, kind, "{what}: packet type on {dev}");
                    assert_eq!(seen[0].1, ack, "{what}: the copy on {dev} is the packet");
                }
                None => assert!(seen.is_empty(), "{what}: {dev} saw {} frames", seen.len()),
            }
        }
    }
}

#[test]
fn a_copy_received_by_the_sink_is_not_routed_by_the_node() {
    let Some(mut dp) = load() else { return };
    let ack = marked_flow(&mut dp, 51100);
    // The node would forward the packet's destination out of `fw0`, were it addressed to it.
    testing::sh(
        "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
         && ip link add fw0 type veth peer name fw1 \
         && ip link set fw0 up && ip link set fw1 up && ip route add 198.18.0.0/15 dev fw0",
    );
    for (dev, delivery) in [("mir0", MirrorDelivery::Ingress), ("mir1", MirrorDelivery::Ingress)] {
        dp.set_mirror_target(testing::ifindex(dev), delivery).unwrap();
        let tx_before = testing::link_packets("fw0").1;
        for _ in 0..10 {
            assert_eq!(run(&dp, &ack).get(S::STAT_MIRRORED_PACKETS), 1);
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(testing::link_packets("fw0").1, tx_before, "copies received by {dev} were routed");
    }
}

#[test]
fn the_mirred_method_refuses_ingress_delivery() {
    let Some(mut dp) = load() else { return };
    marked_flow(&mut dp, 51200);
    testing::sh("ip link add pa type veth peer name pb && ip link set pa up && ip link set pb up");
    dp.set_mirror_target(testing::ifindex("mir1"), MirrorDelivery::Ingress).unwrap();
    let e = dp.attach(testing::ifindex("pa"), AttachMode::Tc, MirrorMethod::Mirred).unwrap_err();
    assert!(e.to_string().contains("egress only"), "{e}");
    // Egress is what act_mirred does.
    dp.set_mirror_target(testing::ifindex("mir0"), MirrorDelivery::Egress).unwrap();
    let att = dp.attach(testing::ifindex("pa"), AttachMode::Tc, MirrorMethod::Mirred).unwrap();
    dp.detach(att).unwrap();
}

/// Writes `frame` out of `dev` from a packet socket whose frames carry `mark` (what the agent
/// does with a replay).
fn write_marked(dev: &str, frame: &[u8], mark: u32) -> std::io::Result<()> {
    // SAFETY: plain socket call; the fd is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a new socket we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: mark is a u32 of the size given.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MARK, (&mark as *const u32).cast(), 4)
    };
    assert_eq!(rc, 0, "SO_MARK: {}", std::io::Error::last_os_error());
    // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = testing::ifindex(dev) as i32;
    // SAFETY: frame and sll are valid for the sizes given.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A replay the agent writes to the sink (the request behind a noresponse mark) carries the
/// replay mark: the replay program on the sink's egress hands it on exactly as it hands on its
/// own replays and as copies go, within the node-wide budget. A frame without the mark is left
/// alone.
#[test]
fn a_replay_written_by_the_agent_goes_where_copies_go() {
    use mirror_bpf::replay::{AGENT_MARK, REPLAY_MAC};
    let Some(mut dp) = load() else { return };
    let mut frame = fixtures::v4_request(51300, PORT_HTTP, REQ_GET_BAR);
    frame[6..12].copy_from_slice(&REPLAY_MAC);
    marked_flow(&mut dp, 51301);
    let (mir0, mir1) = (testing::ifindex("mir0"), testing::ifindex("mir1"));
    let hook = dp.attach_replay(mir0).expect("attaching the replay program");
    let cases = [
        ("egress of mir0", mir0, MirrorDelivery::Egress, Some(PACKET_OUTGOING), Some(PACKET_OTHERHOST)),
        ("ingress of mir0", mir0, MirrorDelivery::Ingress, Some(PACKET_OTHERHOST), None),
        ("ingress of mir1", mir1, MirrorDelivery::Ingress, None, Some(PACKET_OTHERHOST)),
    ];
    let outgoing = (Some(PACKET_OUTGOING), Some(PACKET_OTHERHOST));
    for (what, ifindex, delivery, on_mir0, on_mir1) in cases {
        dp.set_mirror_target(ifindex, delivery).unwrap();
        for (mark, (on_mir0, on_mir1)) in [(AGENT_MARK, (on_mir0, on_mir1)), (AGENT_MARK + 1, outgoing)] {
            let (tap0, tap1) = (Tap::on("mir0"), Tap::on("mir1"));
            let before = dp.counters().unwrap();
            write_marked("mir0", &frame, mark).expect("writing to the sink");
            for (tap, expect, dev) in [(&tap0, on_mir0, "mir0"), (&tap1, on_mir1, "mir1")] {
                let seen = tap.read(Duration::from_millis(200));
                let seen: Vec<_> = seen.iter().map(|(kind, f)| (*kind, f == &frame)).collect();
                assert_eq!(
                    seen,
                    expect.map(|k| (k, true)).into_iter().collect::<Vec<_>>(),
                    "{what}, mark {mark:#x}, on {dev}"
                );
            }
            // Counted by the agent, not here.
            let d = dp.counters().unwrap().since(&before);
            assert_eq!((d.get(S::STAT_REPLAYED), d.get(S::STAT_REPLAY_FAILED)), (0, 0), "{what}: {d:?}");
        }
    }
    // Within the node-wide budget: at 1 copy a second (each CPU's bucket starts with a tenth of a
    // second of its share, less than one copy) every one is refused, counted there, and the
    // writer told (ENOBUFS); at 100,000 none is.
    let write = || write_marked("mir0", &frame, AGENT_MARK).err().and_then(|e| e.raw_os_error());
    for (pps, refused) in [(1, Some(libc::ENOBUFS)), (100_000, None)] {
        dp.set_budget(mirror_bpf::Budget { packets_per_second: pps, bytes_per_second: 0 }).unwrap();
        let (tap1, before) = (Tap::on("mir1"), dp.budget_refused().unwrap().packets);
        assert_eq!([write(), write(), write()], [refused; 3], "{pps} a second");
        let seen = tap1.read(Duration::from_millis(200)).len();
        let counted = dp.budget_refused().unwrap().packets - before;
        assert_eq!((seen, counted), if refused.is_some() { (0, 3) } else { (3, 0) }, "{pps} a second");
    }
    dp.detach_replay(hook).unwrap();
}

/// Two CPUs triggering one connection at once: only the trigger holding the connection's claim
/// replays the request behind it and marks the flow, so the replay on the mirror is always the
/// marking trigger's. A trigger that finds the claim held (here by the test, as another CPU's
/// run holds it while it replays) sends nothing to the mirror and marks nothing. Once the claim
/// is let go, the next trigger replays its own request ahead of its copy, and leaves no claim.
#[test]
fn a_trigger_that_finds_its_connection_claimed_replays_nothing() {
    let Some(mut dp) = load() else { return };
    marked_flow(&mut dp, 51400);
    let mir0 = testing::ifindex("mir0");
    dp.set_mirror_target(mir0, MirrorDelivery::Egress).unwrap();
    let hook = dp.attach_replay(mir0).expect("attaching the replay program");
    let (cport, a, b): (u16, &[u8], &[u8]) = (51401, b"GET /a HTTP/1.1\r\n\r\n", b"GET /b HTTP/1.1\r\n\r\n");
    let to_server = |seq: u32, text: &[u8]| {
        let tcp =
            PacketBuilder::ipv4(V4_CLIENT, V4_SERVER).tcp(cport, PORT_HTTP, tcp_flags::ACK | tcp_flags::PSH);
        tcp.seq(seq).payload(text).build()
    };
    let to_client = |seq: u32| {
        let tcp =
            PacketBuilder::ipv4(V4_SERVER, V4_CLIENT).tcp(PORT_HTTP, cport, tcp_flags::ACK | tcp_flags::PSH);
        tcp.seq(seq).payload(RESP_500).build()
    };
    let key = flow_key(cport).to_raw();
    let claims = &dp.skel().maps.trigger_claims;
    let unclaimed = || claims.keys().count() == 0;

    // Held: the 500 to /a neither replays, nor marks, nor reports.
    run(&dp, &to_server(1000, a));
    claims.update(testing::key_bytes(&key), &0u64.to_ne_bytes(), MapFlags::NO_EXIST).unwrap();
    let tap = Tap::on("mir1");
    let d = run(&dp, &to_client(5000));
    assert_eq!(
        (d.get(S::STAT_TRIGGERS), d.get(S::STAT_REPLAYED), d.get(S::STAT_MIRRORED_PACKETS)),
        (0, 0, 0),
        "{d:?}"
    );
    assert!(dp.mark(&flow_key(cport)).unwrap().is_none(), "marked by the trigger that lost");
    assert_eq!(tap.read(Duration::from_millis(200)).len(), 0, "the mirror got a copy");

    // Let go: the 500 to /b replays /b ahead of its own copy, marks the flow, frees its claim.
    claims.delete(testing::key_bytes(&key)).unwrap();
    run(&dp, &to_server(1000 + a.len() as u32, b));
    let answer = to_client(5000 + RESP_500.len() as u32);
    let d = run(&dp, &answer);
    assert_eq!(
        (d.get(S::STAT_TRIGGERS), d.get(S::STAT_REPLAYED), d.get(S::STAT_MIRRORED_PACKETS)),
        (1, 1, 1),
        "{d:?}"
    );
    assert!(dp.mark(&flow_key(cport)).unwrap().is_some(), "the flow is marked");
    let seen: Vec<Vec<u8>> = tap.read(Duration::from_millis(200)).into_iter().map(|(_, f)| f).collect();
    assert_eq!(seen.len(), 2, "the replay and the copy: {seen:?}");
    assert!(seen[0].ends_with(b), "the replay is /b's segment: {:?}", String::from_utf8_lossy(&seen[0]));
    assert_eq!(seen[1], answer, "then the 500 itself");
    assert!(unclaimed(), "a claim was left behind");
    dp.detach_replay(hook).unwrap();
}
