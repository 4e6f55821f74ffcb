//! CoreDNS, the resolver Kubernetes runs, as a resolver of the DNS tests: the build the cluster
//! tests run as the cluster's DNS (its Go module, `tests/kube/build.sh`), configured with a Corefile that answers as the resolver's table says
//! ([`crate::workload::dns`]): zone files for `test` (the names of [`GOOD_ZONE`], a wildcard
//! under it), `cluster.local` ([`CLUSTER_GOOD`]) and `example`, authoritative, so any other
//! name in them is NXDOMAIN; [`FAIL_ZONE`] and [`REFUSED_ZONE`] forwarded to the upstream on the
//! pod's loopback, whose SERVFAIL and REFUSED CoreDNS passes on. No cache, as with dnsmasq.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::topology::netns::Pod;
use crate::workload::dns::{CLUSTER_GOOD, FAIL_ZONE, GOOD_A, GOOD_AAAA, GOOD_ZONE, REFUSED_ZONE};
use crate::workload::servers;

/// CoreDNS's binary: the one the cluster tests run as the cluster's DNS, built from its Go
/// module with Kubernetes (`tests/kube/build.sh`) once per machine; `None` without a Go
/// toolchain.
pub fn binary() -> Option<PathBuf> {
    servers::go_toolchain()?;
    Some(crate::cluster::control_plane::binaries().join("coredns"))
}

/// The zones CoreDNS is authoritative for, each with its records (relative names, `@` the
/// apex) beyond the SOA.
fn zones() -> Vec<(&'static str, Vec<String>)> {
    let good = GOOD_ZONE.strip_suffix(".test").expect("the good zone is under test");
    let cluster = CLUSTER_GOOD.strip_suffix(".cluster.local").expect("a name of cluster.local");
    let records = |name: &str| [format!("{name} 30 IN A {GOOD_A}"), format!("{name} 30 IN AAAA {GOOD_AAAA}")];
    vec![
        ("test", [records(good), records(&format!("*.{good}"))].concat()),
        ("cluster.local", records(cluster).to_vec()),
        ("example", Vec::new()),
    ]
}

/// The command that runs CoreDNS `binary` in `pod`, on port 53 of its two addresses, its
/// forwarded zones sent to `upstream`; the Corefile and zone files written to `dir`.
pub fn command(binary: &Path, pod: &Pod, upstream: SocketAddr, dir: &Path) -> Command {
    let dir = dir.join(format!("coredns-{}", pod.ns.name()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let corefile = corefile(pod.v4, pod.v6, upstream, &dir);
    let path = dir.join("Corefile");
    std::fs::write(&path, corefile).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let mut cmd = pod.ns.command(&binary.to_string_lossy());
    cmd.current_dir(&dir).arg("-conf").arg(&path).args(["-dns.port", "53"]);
    cmd
}

/// The Corefile (and its zone files, written to `dir`).
fn corefile(v4: Ipv4Addr, v6: Ipv6Addr, upstream: SocketAddr, dir: &Path) -> String {
    let block = |zones: &str, plugin: String| {
        format!("{zones} {{\n    bind {v4} {v6}\n    errors\n    {plugin}\n}}\n")
    };
    let mut text = String::new();
    for (zone, records) in zones() {
        let soa = format!("@ 30 IN SOA ns.{zone}. hostmaster.{zone}. 1 7200 1800 86400 30");
        let db = format!(
            "$ORIGIN {zone}.\n{soa}\n{}",
            records.iter().map(|r| format!("{r}\n")).collect::<String>()
        );
        let file = dir.join(format!("{zone}.db"));
        std::fs::write(&file, db).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
        text += &block(zone, format!("file {}", file.display()));
    }
    text + &block(&format!("{FAIL_ZONE} {REFUSED_ZONE}"), format!("forward . {upstream}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corefile_answers_the_resolver_s_table() {
        let dir = tempfile::tempdir().unwrap();
        let upstream: SocketAddr = "127.0.0.1:5353".parse().unwrap();
        let text =
            corefile("198.18.2.2".parse().unwrap(), "2001:2::2".parse().unwrap(), upstream, dir.path());
        assert!(text.contains("fail.test refused.test {\n    bind 198.18.2.2 2001:2::2\n"), "{text}");
        assert!(text.contains("forward . 127.0.0.1:5353"), "{text}");
        let test = std::fs::read_to_string(dir.path().join("test.db")).unwrap();
        assert!(test.contains(&format!("*.good 30 IN AAAA {GOOD_AAAA}\n")), "{test}");
        let cluster = std::fs::read_to_string(dir.path().join("cluster.local.db")).unwrap();
        assert!(cluster.contains("kube-dns.kube-system.svc 30 IN A 198.18.250.10\n"), "{cluster}");
    }
}
