//! Link discovery from rtnetlink: the links present at start, then every link that appears,
//! changes (renamed, brought up) or vanishes. Event-driven: no polling window.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

use futures::StreamExt;
use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{AsyncSocket, SocketAddr};
use rtnetlink::constants::RTMGRP_LINK;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A change of the links of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link exists (new, or changed: renamed, brought up or down).
    Present {
        /// Its index.
        ifindex: u32,
        /// Its current name.
        name: String,
        /// Whether it is up (administratively).
        up: bool,
        /// When the agent received the event (for attach latency).
        at: Instant,
    },
    /// A link was deleted.
    Gone {
        /// Its index.
        ifindex: u32,
        /// Its last name.
        name: String,
    },
    /// Every link present at start has been reported.
    Synced,
}

fn name_of(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None })
}

/// The netlink socket's receive buffer: room for the events of a burst of links (each new veth
/// pair sends several), beyond `rmem_max` as root. Past it the kernel drops events, and the
/// links are listed again (see `watch`).
const RECEIVE_BUFFER: libc::c_int = 8 << 20;

/// Reports link events on `tx` until it is closed. Subscribes before listing the existing
/// links, so that a link created meanwhile is reported (maybe twice, never zero times). When
/// the socket's buffer overran (events were lost), lists the links again: each present one is
/// reported, and each known one that is no longer there is reported gone.
pub async fn watch(tx: mpsc::Sender<LinkEvent>) -> anyhow::Result<()> {
    let (mut conn, handle, mut messages) = rtnetlink::new_connection()?;
    let socket = conn.socket_mut().socket_mut();
    socket.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
    grow_buffer(socket.as_raw_fd());
    tokio::spawn(conn);

    let mut known = BTreeMap::new();
    if !relist(&handle, &tx, &mut known).await? || tx.send(LinkEvent::Synced).await.is_err() {
        return Ok(());
    }
    while let Some((msg, _)) = messages.next().await {
        let at = Instant::now();
        let ev = match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                let up = m.header.flags.contains(LinkFlags::Up);
                name_of(&m).map(|name| {
                    known.insert(m.header.index, name.clone());
                    LinkEvent::Present { ifindex: m.header.index, name, up, at }
                })
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) => {
                known.remove(&m.header.index);
                Some(LinkEvent::Gone { ifindex: m.header.index, name: name_of(&m).unwrap_or_default() })
            }
            NetlinkPayload::Overrun(_) => {
                tracing::warn!(
                    "link events were lost (the netlink socket's buffer overran): listing the links again"
                );
                match relist(&handle, &tx, &mut known).await {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    // The next overrun lists them again.
                    Err(e) => tracing::warn!(error = format!("{e:#}"), "link events may be missing"),
                }
                None
            }
            _ => None,
        };
        if let Some(ev) = ev {
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
    }
    anyhow::bail!("the rtnetlink event stream ended")
}

/// Lists the links present and reports each; reports gone each link of `known` (the links
/// reported before) that is not among them; `known` then holds the links present. A list that
/// fails or does not end (its answer lost to an overrun too) is tried again, up to LIST_TRIES
/// times. Returns false when the receiver is gone.
async fn relist(
    handle: &rtnetlink::Handle,
    tx: &mpsc::Sender<LinkEvent>,
    known: &mut BTreeMap<u32, String>,
) -> anyhow::Result<bool> {
    let mut tries = 1;
    let links = loop {
        let error = match tokio::time::timeout(LIST_TIMEOUT, list(handle)).await {
            Ok(Ok(links)) => break links,
            Ok(Err(e)) => e,
            Err(_) => anyhow::anyhow!("no complete answer in {LIST_TIMEOUT:?}"),
        };
        if tries == LIST_TRIES {
            return Err(error.context("listing the links"));
        }
        tracing::warn!(error = format!("{error:#}"), "listing the links: trying again");
        tries += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let mut present = BTreeMap::new();
    for (ifindex, name, up) in links {
        present.insert(ifindex, name.clone());
        if tx.send(LinkEvent::Present { ifindex, name, up, at: Instant::now() }).await.is_err() {
            return Ok(false);
        }
    }
    for (ifindex, name) in std::mem::replace(known, present) {
        if !known.contains_key(&ifindex) && tx.send(LinkEvent::Gone { ifindex, name }).await.is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How long a list of the links may take, and how many times it is tried.
const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
const LIST_TRIES: u32 = 5;

/// The links present: index, name, whether up.
async fn list(handle: &rtnetlink::Handle) -> anyhow::Result<Vec<(u32, String, bool)>> {
    let mut links = Vec::new();
    let mut existing = handle.link().get().execute();
    while let Some(msg) = existing.next().await {
        let msg = msg?;
        if let Some(name) = name_of(&msg) {
            links.push((msg.header.index, name, msg.header.flags.contains(LinkFlags::Up)));
        }
    }
    Ok(links)
}

/// Enlarges the receive buffer of the netlink socket `fd` to RECEIVE_BUFFER: forced when root
/// may, else as far as `rmem_max` allows; the default is kept when neither works (said in the
/// log).
fn grow_buffer(fd: std::os::fd::RawFd) {
    let size = RECEIVE_BUFFER;
    let set = |opt| {
        // SAFETY: `size` outlives the call, and its length is given.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_RCVBUFFORCE) != 0 && set(libc::SO_RCVBUF) != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "the link events' socket keeps its default buffer: a burst of links may overrun it"
        );
    }
}
