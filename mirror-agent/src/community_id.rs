//! Community ID flow hashing, version 1 (<https://github.com/corelight/community-id-spec>):
//! the flow identifier Zeek, Suricata and others put in their logs, so that a trigger can be
//! found in them. `1:` and the base64 of the SHA-1 of: seed (2 bytes, big-endian), the two
//! addresses, the protocol, a zero byte and the two ports (big-endian), the endpoint that
//! compares lower (address, then port) first.

use std::net::{IpAddr, SocketAddr};

use base64::Engine as _;
use sha1::{Digest, Sha1};

/// The Community ID v1 of a TCP/UDP/SCTP flow between `a` and `b` (either order), seed 0.
pub fn v1(a: SocketAddr, b: SocketAddr, proto: u8) -> String {
    v1_seeded(a, b, proto, 0)
}

/// The Community ID v1 with a seed.
pub fn v1_seeded(a: SocketAddr, b: SocketAddr, proto: u8, seed: u16) -> String {
    let bytes = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let (ea, eb) = ((bytes(a.ip()), a.port()), (bytes(b.ip()), b.port()));
    let (lo, hi) = if ea <= eb { (ea, eb) } else { (eb, ea) };
    let mut h = Sha1::new();
    h.update(seed.to_be_bytes());
    h.update(&lo.0);
    h.update(&hi.0);
    h.update([proto, 0]);
    h.update(lo.1.to_be_bytes());
    h.update(hi.1.to_be_bytes());
    format!("1:{}", base64::engine::general_purpose::STANDARD.encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The specification's example (its README), and values of the reference implementation
    /// (the `communityid` Python package, 1.5.0).
    #[test]
    fn known_vectors() {
        assert_eq!(
            v1(ep("128.232.110.120:34855"), ep("66.35.250.204:80"), 6),
            "1:LQU9qZlK+B5F3KDmev6m5PMibrg="
        );
        // Either direction gives the same identifier.
        assert_eq!(
            v1(ep("66.35.250.204:80"), ep("128.232.110.120:34855"), 6),
            "1:LQU9qZlK+B5F3KDmev6m5PMibrg="
        );
        assert_eq!(
            v1_seeded(ep("128.232.110.120:34855"), ep("66.35.250.204:80"), 6, 1),
            "1:3V71V58M3Ksw/yuFALMcW0LAHvc="
        );
        assert_eq!(
            v1(ep("[fe80::260:97ff:fe07:69ea]:2"), ep("[fe80::200:86ff:fe05:80da]:1"), 17),
            "1:Bg+27ziOf/SLCvpTsxkf1IpJvJ8="
        );
        assert_eq!(v1(ep("198.18.0.3:80"), ep("198.18.0.2:40000"), 6), "1:4HKG0z5Ebct/yByeXzcTCZuekE4=");
    }
}
