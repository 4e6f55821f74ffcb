//! glibc's getaddrinfo as a client, reading a resolv.conf of the test's bound over
//! /etc/resolv.conf in a mount namespace of its own.

use super::*;

/// A resolv.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvConf {
    /// Its `nameserver` lines.
    pub nameservers: Vec<IpAddr>,
    /// Its `search` list (none: no `search` line).
    pub search: Vec<String>,
    /// `options ndots:`.
    pub ndots: u8,
}

impl ResolvConf {
    /// One nameserver, no search list, `ndots:1`.
    pub fn plain(nameserver: IpAddr) -> ResolvConf {
        ResolvConf { nameservers: vec![nameserver], search: Vec::new(), ndots: 1 }
    }

    /// What the kubelet writes for a pod of namespace `namespace` (with the cluster's DNS
    /// Service at `nameserver`): the search list `<namespace>.svc.cluster.local
    /// svc.cluster.local cluster.local`, `ndots:5`.
    pub fn kubelet(namespace: &str, nameserver: IpAddr) -> ResolvConf {
        let search =
            [format!("{namespace}.svc.cluster.local"), "svc.cluster.local".into(), "cluster.local".into()];
        ResolvConf { nameservers: vec![nameserver], search: search.into(), ndots: 5 }
    }

    /// The names glibc asks, in order, for `name`: as given first when it has at least `ndots`
    /// dots, then with each domain of the search list, then as given last if not yet asked; an
    /// absolute name (a final dot) alone. Lower case, without the final dot. A lookup stops at
    /// the first found.
    pub fn candidates(&self, name: &str) -> Vec<String> {
        let bare = name.trim_end_matches('.').to_ascii_lowercase();
        if name.ends_with('.') {
            return vec![bare];
        }
        let first = bare.matches('.').count() >= usize::from(self.ndots);
        let mut names: Vec<String> =
            self.search.iter().map(|d| format!("{bare}.{}", d.to_ascii_lowercase())).collect();
        if first {
            names.insert(0, bare);
        } else {
            names.push(bare);
        }
        names
    }

    /// Its text. One try of at most 2 s per query, as the tests' dig makes.
    pub fn text(&self) -> String {
        let mut s: String = self.nameservers.iter().map(|n| format!("nameserver {n}\n")).collect();
        if !self.search.is_empty() {
            s += &format!("search {}\n", self.search.join(" "));
        }
        s + &format!("options ndots:{} timeout:2 attempts:1\n", self.ndots)
    }
}

/// What one getaddrinfo call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name asked.
    pub name: String,
    /// Its addresses, or getaddrinfo's error (`EAI_NONAME` is -2, `EAI_AGAIN` -3).
    pub result: Result<Vec<IpAddr>, i32>,
}

/// glibc's getaddrinfo (python's `socket.getaddrinfo`, any family: A and AAAA asked at once, on
/// one socket) of each of `names` in turn, from `ns`, reading `conf` as its resolv.conf (bound
/// over /etc/resolv.conf in a mount namespace of the process's own). Files go to `dir`.
#[track_caller]
pub fn getaddrinfo(ns: &Netns, conf: &ResolvConf, names: &[&str], dir: &Path) -> Vec<Resolved> {
    let script = dir.join("getaddrinfo.py");
    std::fs::write(&script, GETADDRINFO).unwrap_or_else(|e| panic!("writing {}: {e}", script.display()));
    let mut cmd = with_resolv_conf(ns, conf, dir, Path::new("python3"));
    cmd.arg(&script).args(names);
    let out = cmd.output().expect("running getaddrinfo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "getaddrinfo {names:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let resolved: Vec<Resolved> = stdout
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            let (name, kind) = (f.next().unwrap_or_default().to_string(), f.next());
            let result = match kind {
                Some("ok") => {
                    Ok(f.map(|a| a.parse().unwrap_or_else(|_| panic!("getaddrinfo printed {l:?}"))).collect())
                }
                Some("error") => {
                    Err(f.next().and_then(|e| e.parse().ok()).unwrap_or_else(|| panic!("{l:?}")))
                }
                _ => panic!("getaddrinfo printed {l:?}"),
            };
            Resolved { name, result }
        })
        .collect();
    assert_eq!(resolved.len(), names.len(), "getaddrinfo {names:?}: {stdout}");
    resolved
}

/// A command that runs `program` in `ns` reading `conf` (written to `dir`) as its
/// /etc/resolv.conf: bound over it in a mount namespace of the process's own. Its arguments
/// follow.
pub fn with_resolv_conf(ns: &Netns, conf: &ResolvConf, dir: &Path, program: &Path) -> Command {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let resolv = dir.join(format!("resolv-{}-{n}.conf", ns.name()));
    std::fs::write(&resolv, conf.text()).unwrap_or_else(|e| panic!("writing {}: {e}", resolv.display()));
    let mut cmd = ns.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"]);
    cmd.arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#);
    cmd.arg(&resolv).arg(program);
    cmd
}

/// `getaddrinfo.py NAME...`: prints `NAME ok ADDR...` or `NAME error EAI` for each.
const GETADDRINFO: &str = r#"import socket, sys
for name in sys.argv[1:]:
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
        print(name, "ok", *sorted({a[4][0] for a in found}), flush=True)
    except socket.gaierror as e:
        print(name, "error", e.errno, flush=True)
"#;
