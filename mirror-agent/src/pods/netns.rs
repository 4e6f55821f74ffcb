//! Where a host-side veth leads: its peer's index and network namespace (the namespace id the
//! kernel gives the peer's namespace in ours, `IFLA_LINK_NETNSID`), the namespaces of the node
//! (`/proc/*/ns/net` and the named ones under `/run/netns`, each matched to that id with
//! `RTM_GETNSID`), the processes in each, and the peer's name and addresses inside it.
//!
//! Blocking rtnetlink: called from a blocking task, and from a short-lived thread that enters a
//! pod's namespace (a namespace belongs to a thread).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Named namespaces (`ip netns add`, and the CNI plugins of containerd and CRI-O).
pub const NAMED_NETNS: &str = "/run/netns";

/// A blocking rtnetlink socket of the calling thread's namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

impl Rtnl {
    /// Opens one in the calling thread's network namespace.
    pub fn open() -> io::Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Sends one request; returns the messages of its answer (all of them for a dump).
    fn request(&mut self, msg: RouteNetlinkMessage, dump: bool) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq += 1;
        let mut nl = NetlinkMessage::from(msg);
        nl.header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        nl.header.sequence_number = self.seq;
        nl.finalize();
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = m.header.length as usize;
                if len == 0 {
                    break;
                }
                off += len;
                if m.header.sequence_number != self.seq {
                    continue;
                }
                let multipart = m.header.flags & NLM_F_MULTIPART != 0;
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                            None => Ok(out),
                        };
                    }
                    NetlinkPayload::InnerMessage(i) => {
                        out.push(i);
                        if !multipart {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> io::Result<Vec<LinkMessage>> {
        let msgs = self.request(RouteNetlinkMessage::GetLink(LinkMessage::default()), true)?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| if let RouteNetlinkMessage::NewLink(l) = m { Some(l) } else { None })
            .collect())
    }

    /// Every address of the namespace: (ifindex, address).
    pub fn addresses(&mut self) -> io::Result<Vec<(u32, IpAddr)>> {
        let msgs = self.request(RouteNetlinkMessage::GetAddress(AddressMessage::default()), true)?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| if let RouteNetlinkMessage::NewAddress(a) = m { Some(a) } else { None })
            .flat_map(|a| {
                let index = a.header.index;
                a.attributes.into_iter().filter_map(move |attr| match attr {
                    AddressAttribute::Address(ip) => Some((index, ip)),
                    _ => None,
                })
            })
            .collect())
    }

    /// The id this namespace gives the namespace of `file` (an open `ns/net` file), if it gave
    /// it one: the kernel does when a link of one namespace has its peer in the other.
    pub fn nsid_of(&mut self, file: &File) -> io::Result<Option<i32>> {
        let mut msg = NsidMessage::default();
        msg.attributes.push(NsidAttribute::Fd(file.as_raw_fd() as u32));
        let msgs = self.request(RouteNetlinkMessage::GetNsId(msg), false)?;
        Ok(msgs.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewNsId(n) => n.attributes.into_iter().find_map(|a| match a {
                NsidAttribute::Id(id) if id >= 0 => Some(id),
                _ => None,
            }),
            _ => None,
        }))
    }
}

/// What the node's side of a link says about its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerOf {
    /// The peer's index in its namespace (`IFLA_LINK`).
    pub ifindex: u32,
    /// The id of the peer's namespace in ours (`IFLA_LINK_NETNSID`); `None`: the same namespace.
    pub nsid: Option<i32>,
}

/// The peers of the links of the calling thread's namespace that have one, by ifindex.
pub fn peers(rtnl: &mut Rtnl) -> io::Result<BTreeMap<u32, PeerOf>> {
    Ok(rtnl
        .links()?
        .into_iter()
        .filter_map(|l| {
            let link =
                l.attributes
                    .iter()
                    .find_map(|a| if let LinkAttribute::Link(i) = a { Some(*i) } else { None })?;
            let nsid = l.attributes.iter().find_map(|a| {
                if let LinkAttribute::LinkNetNsId(i) = a {
                    Some(*i)
                } else {
                    None
                }
            });
            Some((l.header.index, PeerOf { ifindex: link, nsid }))
        })
        .collect())
}

/// A network namespace of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Its inode (what tells namespaces apart).
    pub ino: u64,
    /// A path that opens it: `/run/netns/NAME`, else `/proc/PID/ns/net`.
    pub path: PathBuf,
    /// Its name under `/run/netns`, if it has one.
    pub name: Option<String>,
    /// The processes in it, lowest pid first.
    pub pids: Vec<u32>,
}

fn ino_of(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The inode of the calling thread's network namespace.
pub fn own_ino() -> io::Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// Every network namespace of the node but `skip` (ours): those with processes in them
/// (`/proc/*/ns/net`), and the named ones (`/run/netns/*`), which may have none.
pub fn namespaces(skip: u64) -> Vec<Namespace> {
    let mut by_ino: BTreeMap<u64, Namespace> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(NAMED_NETNS) {
        for e in dir.flatten() {
            let path = e.path();
            let Some(ino) = ino_of(&path) else { continue };
            by_ino.entry(ino).or_insert_with(|| Namespace {
                ino,
                path,
                name: e.file_name().into_string().ok(),
                pids: Vec::new(),
            });
        }
    }
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    pids.sort_unstable();
    for pid in pids {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        // Kernel threads and processes gone meanwhile have none to read.
        let Some(ino) = ino_of(&path) else { continue };
        by_ino
            .entry(ino)
            .or_insert_with(|| Namespace { ino, path, name: None, pids: Vec::new() })
            .pids
            .push(pid);
    }
    by_ino.remove(&skip);
    by_ino.into_values().collect()
}

/// The link `ifindex` of the namespace at `path`: its name and addresses (link-local IPv6
/// addresses left out: every link has one).
pub fn link_in(path: &Path, ifindex: u32) -> io::Result<(String, Vec<IpAddr>)> {
    let file = File::open(path)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a namespace file we hold open; it only moves this thread, which
            // ends here.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rtnl = Rtnl::open()?;
            let name = rtnl
                .links()?
                .into_iter()
                .find(|l| l.header.index == ifindex)
                .and_then(|l| {
                    l.attributes.into_iter().find_map(|a| {
                        if let LinkAttribute::IfName(n) = a {
                            Some(n)
                        } else {
                            None
                        }
                    })
                })
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no link {ifindex}")))?;
            let addrs = rtnl
                .addresses()?
                .into_iter()
                .filter(|(i, ip)| *i == ifindex && !is_link_local(ip))
                .map(|(_, ip)| ip)
                .collect();
            Ok((name, addrs))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(v4) => v4.is_link_local(),
    }
}
