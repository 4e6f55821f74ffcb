//! Link discovery from rtnetlink: the links present at start, then every link that appears,
//! changes (renamed, brought up) or vanishes. Event-driven: no polling window.

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

/// Reports link events on `tx` until it is closed. Subscribes before listing the existing
/// links, so that a link created meanwhile is reported (maybe twice, never zero times).
pub async fn watch(tx: mpsc::Sender<LinkEvent>) -> anyhow::Result<()> {
    let (mut conn, handle, mut messages) = rtnetlink::new_connection()?;
    conn.socket_mut().socket_mut().bind(&SocketAddr::new(0, RTMGRP_LINK))?;
    tokio::spawn(conn);

    let mut existing = handle.link().get().execute();
    while let Some(msg) = existing.next().await {
        let msg = msg?;
        if let Some(name) = name_of(&msg) {
            let up = msg.header.flags.contains(LinkFlags::Up);
            let ev = LinkEvent::Present { ifindex: msg.header.index, name, up, at: Instant::now() };
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
    }
    if tx.send(LinkEvent::Synced).await.is_err() {
        return Ok(());
    }

    while let Some((msg, _)) = messages.next().await {
        let at = Instant::now();
        let ev = match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                let up = m.header.flags.contains(LinkFlags::Up);
                name_of(&m).map(|name| LinkEvent::Present { ifindex: m.header.index, name, up, at })
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) => {
                Some(LinkEvent::Gone { ifindex: m.header.index, name: name_of(&m).unwrap_or_default() })
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
