//! What Wireshark's dissectors (tshark) make of a capture: per TCP segment, the HTTP/2 frames
//! it completes, the header fields they decode and the gRPC messages found, so that a test can
//! check that a consumer of the mirror reads it as HTTP/2 and gRPC.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;

use mirror_bpf::FlowKey;

use crate::capture::pcap::PacketId;
use crate::oracles::h2_oracle::{frame, Fields, LateDirection, UNKNOWN};

/// One TCP segment as tshark dissected it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dissected {
    /// `frame.protocols`, e.g. `eth:ethertype:ip:tcp:http2:grpc:protobuf`.
    pub protocols: String,
    /// HTTP/2 frames it completes: (type, stream).
    pub frames: Vec<(u8, u32)>,
    /// Header fields decoded in them, in order (`<unknown>` names where HPACK state lacked).
    pub fields: Fields,
    /// Lengths of the gRPC messages found.
    pub grpc: Vec<u32>,
}

impl Dissected {
    /// Whether it was dissected as gRPC.
    pub fn is_grpc(&self) -> bool {
        self.protocols.split(':').any(|p| p == "grpc")
    }
}

/// How tshark is told what the traffic is.
#[derive(Debug, Clone, Default)]
pub struct Decode {
    /// Server ports whose TCP is HTTP/2 from any segment on (`-d tcp.port==P,http2`): what a
    /// mirror that starts mid-connection needs. Ports not named are left to tshark's own
    /// guesses (HTTP on 80 and 8080 follows an `Upgrade: h2c`).
    pub http2_ports: Vec<u16>,
    /// Server ports whose streams are taken for gRPC when their headers could not be read
    /// (Wireshark's `http2_fake_headers`: `content-type: application/grpc` and a `:path` for
    /// every stream, both ways; tshark then lists these among the stream's fields).
    pub grpc_ports: Vec<u16>,
    /// Leave gRPC undissected (`--disable-protocol grpc`). On a capture that starts
    /// mid-connection, tshark 4.0's gRPC dissector fails an assertion on a stream whose
    /// `content-type` and `:path` it could not decode ("Dissector bug, protocol GRPC") and
    /// the rest of that segment goes undissected: HTTP/2 alone is read whole.
    pub no_grpc: bool,
}

/// Whether tshark is there.
pub fn available() -> bool {
    Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Fields asked for, in this order.
const FIELDS: [&str; 16] = [
    "frame.protocols",
    "ip.src",
    "ipv6.src",
    "ip.dst",
    "ipv6.dst",
    "tcp.srcport",
    "tcp.dstport",
    "tcp.seq_raw",
    "tcp.ack_raw",
    "tcp.flags",
    "tcp.len",
    "http2.type",
    "http2.streamid",
    "http2.header.name",
    "http2.header.value",
    "grpc.message_length",
];

/// Separates a field's occurrences: header values hold commas.
const AGGREGATOR: char = '\x1f';

/// Dissects `pcap` as `decode` says: each TCP segment by its identity (the first time it
/// passed, when it was retransmitted).
#[track_caller]
pub fn dissect(pcap: &Path, decode: &Decode) -> BTreeMap<PacketId, Dissected> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(pcap).args(["-n", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
    cmd.arg("-E").arg(format!("aggregator={AGGREGATOR}"));
    for p in &decode.http2_ports {
        cmd.args(["-d", &format!("tcp.port=={p},http2")]);
    }
    for p in &decode.grpc_ports {
        for dir in ["IN", "OUT"] {
            for (name, value) in [("content-type", "application/grpc"), (":path", "/unknown")] {
                cmd.args([
                    "-o",
                    &format!(
                        "uat:http2_fake_headers:\"{p}\",\"0\",\"{dir}\",\"{name}\",\"{value}\",\"TRUE\""
                    ),
                ]);
            }
        }
    }
    if decode.no_grpc {
        cmd.args(["--disable-protocol", "grpc"]);
    }
    cmd.args(["-Y", "tcp"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("running tshark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tshark on {}: {}", pcap.display(), String::from_utf8_lossy(&out.stderr));
    let mut packets = BTreeMap::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), FIELDS.len(), "tshark printed {line:?}");
        let list = |i: usize| -> Vec<&str> {
            if f[i].is_empty() {
                Vec::new()
            } else {
                f[i].split(AGGREGATOR).collect()
            }
        };
        let num = |i: usize| -> u64 {
            let v = f[i];
            v.strip_prefix("0x")
                .map_or_else(|| v.parse(), |h| u64::from_str_radix(h, 16))
                .unwrap_or_else(|_| panic!("{} in {line:?}", FIELDS[i]))
        };
        let ip = |v4: usize, v6: usize| -> IpAddr {
            let v = if f[v4].is_empty() { f[v6] } else { f[v4] };
            // Tunnels list several; the innermost is last.
            v.rsplit(AGGREGATOR).next().unwrap().parse().unwrap_or_else(|_| panic!("address in {line:?}"))
        };
        let id = PacketId {
            src: SocketAddr::new(ip(1, 2), num(5) as u16),
            dst: SocketAddr::new(ip(3, 4), num(6) as u16),
            seq: num(7) as u32,
            ack: num(8) as u32,
            flags: num(9) as u8,
            len: num(10) as u32,
        };
        let types = list(11);
        let streams = list(12);
        let names = list(13);
        let values = list(14);
        let d = Dissected {
            protocols: f[0].to_string(),
            frames: types
                .iter()
                .zip(streams.iter().chain(std::iter::repeat(&"0")))
                .map(|(t, s)| (t.parse().unwrap_or(255), s.parse().unwrap_or(0)))
                .collect(),
            fields: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), values.get(i).unwrap_or(&"").to_string()))
                .collect(),
            grpc: list(15).iter().filter_map(|l| l.parse().ok()).collect(),
        };
        // A retransmission is the same segment again: the first dissection is the one.
        packets.entry(id).or_insert(d);
    }
    packets
}

/// What [`compare`] looks at besides the HTTP/2 frames.
#[derive(Debug, Clone, Copy)]
pub struct Aspects<'a> {
    /// The header fields.
    pub fields: bool,
    /// The gRPC messages: on connections to these ports, every DATA frame's (tshark was told
    /// they are gRPC); elsewhere those of streams whose content type the reader decoded.
    pub grpc: Option<&'a [u16]>,
}

/// What tshark read of a capture (`dissected`) against what `views` say a reader decodes, per
/// packet of each flow: HTTP/2 frames, and what `aspects` names. Returns what differs, and how
/// many HEADERS frames, resolved fields, unresolved fields and gRPC messages agreed.
pub fn compare(
    dissected: &BTreeMap<PacketId, Dissected>,
    views: &[(FlowKey, Vec<LateDirection>)],
    aspects: Aspects,
) -> (Vec<String>, [usize; 4]) {
    let mut wrong = Vec::new();
    let mut agreed = [0usize; 4];
    for (flow, dirs) in views {
        let grpc_ports = aspects.grpc.unwrap_or_default();
        let told = [flow.lo.port(), flow.hi.port()].iter().any(|p| grpc_ports.contains(p));
        for d in dirs.iter().filter(|d| d.aligned) {
            for (id, frames) in &d.frames {
                let mut got = dissected.get(id).cloned().unwrap_or_default();
                // The frames of a stream (HEADERS, DATA): tshark 4.0 sometimes leaves a
                // connection's last control frames (a SETTINGS ack, a GOAWAY) undecoded in a
                // capture that began mid-connection, depending on how they were segmented.
                let of_streams = |k: u8| k == frame::HEADERS || k == frame::DATA;
                got.frames.retain(|(k, _)| of_streams(*k));
                let want_frames: Vec<(u8, u32)> =
                    frames.iter().filter(|f| of_streams(f.kind)).map(|f| (f.kind, f.stream)).collect();
                let want_fields: Fields = if aspects.fields {
                    frames.iter().flat_map(|f| f.fields.iter().flatten().cloned()).collect()
                } else {
                    Vec::new()
                };
                let want_grpc: Vec<u32> = frames
                    .iter()
                    .filter(|f| aspects.grpc.is_some() && (f.grpc_known || told))
                    .flat_map(|f| f.messages.iter().copied())
                    .collect();
                let mut diff = Vec::new();
                if got.frames != want_frames {
                    diff.push(format!("frames {:?}, expected {want_frames:?}", got.frames));
                }
                if aspects.fields && got.fields != want_fields {
                    diff.push(format!("fields {:?}, expected {want_fields:?}", got.fields));
                }
                if aspects.grpc.is_some() && got.grpc != want_grpc {
                    diff.push(format!("gRPC messages {:?}, expected {want_grpc:?}", got.grpc));
                }
                if diff.is_empty() {
                    agreed[0] += want_frames.iter().filter(|(k, _)| *k == frame::HEADERS).count();
                    agreed[1] += want_fields.iter().filter(|(n, _)| n != UNKNOWN).count();
                    agreed[2] += want_fields.iter().filter(|(n, _)| n == UNKNOWN).count();
                    agreed[3] += want_grpc.len();
                } else {
                    wrong.push(format!("{flow}: {id}: {}", diff.join("; ")));
                }
            }
        }
    }
    (wrong, agreed)
}
