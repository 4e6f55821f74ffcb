//! The mirror sink: the link mirrored packets are copied to, its whole life. Created when asked
//! (dummy, a veth pair whose peer is where captures read, or auto: dummy where the kernel has
//! the type, else a veth pair), brought up with a large MTU, the data path pointed at it
//! ([`Sink::start`]); recreated if it disappears, brought up again if set down (when we created
//! it), the data path pointed at it again ([`Sink::follow`]); removed at exit only if we created
//! it ([`Sink::remove`]). Where and how copies are handed to it (its transmit, its receive path,
//! or its veth peer's) depends on its kind: see [`deliver_for`].

use std::sync::Mutex;

use futures::TryStreamExt;
use mirror_bpf::MirrorDelivery;
use netlink_packet_route::link::{LinkAttribute, LinkInfo};
use rtnetlink::{Handle, LinkDummy, LinkGeneve, LinkGre, LinkUnspec, LinkVeth, LinkVxlan};

use crate::api::AgentInfo;
use crate::config::{DeliverCfg, MethodCfg, Mirror, SinkCreate};
use crate::engine::Engine;
use crate::links::LinkEvent;
use crate::views::MirrorView;

/// The mirror sink.
pub struct Sink {
    cfg: Mirror,
    handle: Handle,
    /// Whether we created it (and so may remove it).
    pub created: bool,
}

/// The peer of a veth sink.
pub fn veth_peer(name: &str) -> String {
    format!("{name}p")
}

/// Where and how the copies go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The interface the copies are handed to (the sink, or its veth peer).
    pub ifindex: u32,
    /// Its name.
    pub name: String,
    /// Transmitted by it, or received by it.
    pub delivery: MirrorDelivery,
    /// The sink's link kind ("dummy", "veth", ...), when the kernel says.
    pub kind: Option<String>,
}

/// How copies are handed to a sink of link kind `kind` ("veth", "dummy", "ifb", ...; `None`:
/// unknown). With `auto`, the cheapest way that leaves captures where they read:
///
/// - a veth pair the agent creates is read on its peer: the copy is received by the peer
///   directly (`bpf_clone_redirect` with `BPF_F_INGRESS`), without the veth's transmit path,
///   and captures there see what they saw (about a quarter less CPU per copy, see docs/benchmarks.md);
/// - an ifb hands what it is sent back to the interface it came from (its job is to return
///   redirected packets), so copies would re-enter the node: it receives them instead;
/// - anything else (a dummy, whose transmit just frees the copy after the captures; a link of
///   the operator's, whose capture point is unknown) transmits them, and the mirred method
///   only ever does.
pub fn deliver_for(cfg: &Mirror, kind: Option<&str>) -> DeliverCfg {
    match cfg.deliver {
        DeliverCfg::Auto if cfg.method == MethodCfg::Mirred => DeliverCfg::Egress,
        DeliverCfg::Auto => match kind {
            Some("veth") if matches!(cfg.create, SinkCreate::Veth | SinkCreate::Auto) => {
                DeliverCfg::PeerIngress
            }
            Some("ifb") => DeliverCfg::Ingress,
            _ => DeliverCfg::Egress,
        },
        d => d,
    }
}

/// Disables IPv6 on a link we created: otherwise it sends its own router solicitations and
/// MLD reports, and captures on the sink see them among the mirrored packets. Where /proc/sys
/// is read-only (a container, even in the node's network namespace), the link gets no IPv6
/// address instead (address generation mode "none", over netlink): with no link-local address
/// it sends nothing either.
async fn quiet_ipv6(handle: &Handle, name: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    match std::fs::write(&path, "1") {
        Ok(()) => {}
        // No IPv6 in this kernel: nothing to silence.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            use netlink_packet_route::link::{AfSpecInet6, AfSpecUnspec, In6AddrGenMode};
            let msg = LinkUnspec::new_with_name(name)
                .append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(vec![
                    AfSpecInet6::AddrGenMode(In6AddrGenMode::None),
                ])]))
                .build();
            if let Err(e2) = handle.link().set(msg).execute().await {
                tracing::warn!(
                    %path,
                    error = %e,
                    netlink = %e2,
                    "IPv6 left on: captures will see the sink's own packets"
                );
            }
        }
    }
}

impl Sink {
    /// A sink as configured; nothing is created yet.
    pub fn new(cfg: Mirror, created: bool) -> anyhow::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Self { cfg, handle, created })
    }

    /// Makes sure the sink exists (creating it when ours to create), points the data path at
    /// it, and records in the state file whether we created it; returns what the API shows of
    /// it.
    pub async fn start(&mut self, engine: &Engine) -> anyhow::Result<MirrorView> {
        let ifindex = self.ensure().await?;
        let target = self.point_engine_at(engine, ifindex).await?;
        if ifindex.is_none() {
            tracing::warn!(
                interface = self.name(),
                "no mirror interface yet: triggered packets are counted, not copied"
            );
        }
        engine.set_created_sink(self.created).await?;
        let mut mirror = MirrorView {
            interface: self.cfg.interface.clone(),
            ifindex,
            created: self.created,
            copies_to: None,
            delivery: None,
            kind: None,
        };
        mirror.set_target(target.as_ref());
        Ok(mirror)
    }

    /// Follows link event `ev` if it is about the sink or its veth peer: points the data path
    /// at the sink when it appears (again), brings it up again if set down, recreates it if it
    /// vanished, and keeps `info` current. Returns whether the event was the sink's (then the
    /// link is not one to attach to).
    pub async fn follow(&mut self, engine: &Engine, info: &Mutex<AgentInfo>, ev: &LinkEvent) -> bool {
        match ev {
            LinkEvent::Present { ifindex, name, up, .. } => {
                if name == self.name() {
                    self.repoint(engine, info, Some(*ifindex)).await;
                }
                if !self.owns(name) {
                    return false;
                }
                if !up && self.created {
                    // Copies to a link that is down (or to the peer of one) are lost.
                    tracing::warn!(interface = %name, "mirror sink set down: bringing it up again");
                    if let Err(e) = self.bring_up(name).await {
                        tracing::error!(interface = %name, error = format!("{e:#}"), "bringing the sink up");
                    }
                }
                true
            }
            LinkEvent::Gone { name, .. } => {
                if !(self.owns(name) && name == self.name()) {
                    return false;
                }
                tracing::warn!(interface = %name, "{}", self.vanished());
                self.repoint(engine, info, None).await;
                match self.ensure().await {
                    Ok(i) => {
                        self.repoint(engine, info, i).await;
                        info.lock().expect("info lock").mirror.created = self.created;
                        if let Err(e) = engine.set_created_sink(self.created).await {
                            tracing::warn!(error = format!("{e:#}"), "recording the recreated sink");
                        }
                    }
                    Err(e) => tracing::error!(error = format!("{e:#}"), "recreating the mirror sink"),
                }
                true
            }
            LinkEvent::Synced => false,
        }
    }

    /// Points the data path at the sink whose ifindex is `ifindex` (`None`: no sink, copies are
    /// only counted), handing copies to it, or to its peer, the way its kind calls for.
    async fn point_engine_at(&self, engine: &Engine, ifindex: Option<u32>) -> anyhow::Result<Option<Target>> {
        let target = match ifindex {
            Some(i) => Some(self.target(i).await?),
            None => None,
        };
        let (i, delivery) = target.as_ref().map_or((0, MirrorDelivery::Egress), |t| (t.ifindex, t.delivery));
        engine.set_mirror(i, delivery, ifindex.unwrap_or(0)).await?;
        if let Some(t) = &target {
            tracing::debug!(
                interface = self.name(),
                copies_to = %t.name,
                delivery = ?t.delivery,
                "mirror interface set"
            );
        }
        Ok(target)
    }

    /// Points the data path at the sink whose ifindex is `ifindex` unless it already is, and
    /// shows it in `info`.
    async fn repoint(&self, engine: &Engine, info: &Mutex<AgentInfo>, ifindex: Option<u32>) {
        let current = info.lock().expect("info lock").mirror.ifindex;
        if current == ifindex {
            return;
        }
        match self.point_engine_at(engine, ifindex).await {
            Ok(target) => {
                let mut info = info.lock().expect("info lock");
                info.mirror.ifindex = ifindex;
                info.mirror.set_target(target.as_ref());
            }
            Err(e) => tracing::error!(error = format!("{e:#}"), "setting the mirror interface"),
        }
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.cfg.interface
    }

    /// What happens now that the sink has vanished, for the log.
    fn vanished(&self) -> &'static str {
        match self.cfg.create {
            SinkCreate::None => {
                "mirror sink vanished: waiting for it to appear again (mirror.create: none, the agent does not create it)"
            }
            _ => "mirror sink vanished: recreating",
        }
    }

    /// Whether `name` is the sink or its peer (never to be attached).
    pub fn owns(&self, name: &str) -> bool {
        name == self.cfg.interface
            || (matches!(self.cfg.create, SinkCreate::Veth | SinkCreate::Auto)
                && name == veth_peer(&self.cfg.interface))
    }

    async fn index_of(&self, name: &str) -> anyhow::Result<Option<u32>> {
        Ok(self.link(name).await?.map(|(i, _)| i))
    }

    /// The ifindex and kind ("veth", "dummy", ...) of link `name`, if present.
    async fn link(&self, name: &str) -> anyhow::Result<Option<(u32, Option<String>)>> {
        let mut links = self.handle.link().get().match_name(name.to_string()).execute();
        match links.try_next().await {
            Ok(Some(msg)) => {
                let kind = msg.attributes.iter().find_map(|a| match a {
                    LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
                        LinkInfo::Kind(k) => Some(k.to_string()),
                        _ => None,
                    }),
                    _ => None,
                });
                Ok(Some((msg.header.index, kind)))
            }
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Where and how copies go to the sink whose ifindex is `ifindex` (see [`deliver_for`]).
    async fn target(&self, ifindex: u32) -> anyhow::Result<Target> {
        let name = self.cfg.interface.clone();
        let kind = self.link(&name).await?.and_then(|(_, k)| k);
        let deliver = deliver_for(&self.cfg, kind.as_deref());
        let link_kind = kind.clone();
        if kind.as_deref() == Some("ifb") && matches!(deliver, DeliverCfg::Egress | DeliverCfg::Auto) {
            tracing::warn!(
                interface = %name,
                "the sink is an ifb, which sends what it is given back to the interface it came \
                 from: copies sent to it re-enter the node and reach the pods twice (use the clone \
                 method with mirror.deliver: auto or ingress)"
            );
        }
        let (ifindex, name, delivery) = match deliver {
            DeliverCfg::Egress | DeliverCfg::Auto => (ifindex, name, MirrorDelivery::Egress),
            DeliverCfg::Ingress => (ifindex, name, MirrorDelivery::Ingress),
            DeliverCfg::PeerIngress => {
                let peer = veth_peer(&name);
                match self.link(&peer).await? {
                    Some((i, _)) => (i, peer, MirrorDelivery::Ingress),
                    None => {
                        tracing::warn!(
                            interface = %name,
                            %peer,
                            "the sink's veth peer is absent: copies go out of the sink instead"
                        );
                        (ifindex, name, MirrorDelivery::Egress)
                    }
                }
            }
        };
        Ok(Target { ifindex, name, delivery, kind: link_kind })
    }

    async fn set_up(&self, name: &str, mtu: Option<u32>) -> anyhow::Result<()> {
        let mut msg = LinkUnspec::new_with_name(name).up();
        if let Some(mtu) = mtu {
            msg = msg.mtu(mtu);
        }
        self.handle.link().set(msg.build()).execute().await?;
        Ok(())
    }

    /// Brings `name` (the sink or its peer, when we created them) up again after someone set it
    /// down.
    async fn bring_up(&self, name: &str) -> anyhow::Result<()> {
        self.set_up(name, None).await
    }

    /// Makes sure the sink exists and is up; returns its ifindex (`None`: absent, not ours to create).
    async fn ensure(&mut self) -> anyhow::Result<Option<u32>> {
        let name = self.cfg.interface.clone();
        if let Some(i) = self.index_of(&name).await? {
            self.set_up(&name, None).await?;
            return Ok(Some(i));
        }
        // Created down: brought up once silenced (see quiet_ipv6).
        let made = match self.cfg.create {
            SinkCreate::None => return Ok(None),
            SinkCreate::Auto => match self.add(SinkCreate::Dummy).await {
                Err(e) if no_such_kind(&e) => {
                    tracing::debug!(
                        interface = %name,
                        peer = %veth_peer(&name),
                        "expected: mirror.create: auto: this kernel has no dummy link type, creating a veth \
                         pair (capture on the peer)"
                    );
                    self.add(SinkCreate::Veth).await?;
                    SinkCreate::Veth
                }
                Err(e) => return Err(e),
                Ok(()) => SinkCreate::Dummy,
            },
            SinkCreate::Dummy => match self.add(SinkCreate::Dummy).await {
                Err(e) if no_such_kind(&e) => anyhow::bail!(
                    "this kernel has no dummy link type (no dummy module): set mirror.create: auto or \
                     veth, or create {name} yourself and set mirror.create: none"
                ),
                r => r.map(|()| SinkCreate::Dummy)?,
            },
            SinkCreate::Veth => self.add(SinkCreate::Veth).await.map(|()| SinkCreate::Veth)?,
            kind => match self.add(kind).await {
                Err(e) if no_such_kind(&e) => anyhow::bail!(
                    "this kernel has no {k} link type (no {k} module): mirror.create: {k} cannot be used \
                     here{hint}",
                    k = kind.link_kind(),
                    hint = if kind == SinkCreate::Vxlan {
                        ""
                    } else {
                        " (vxlan may be: see docs/operations.md, \"One collector for many nodes\")"
                    },
                ),
                r => r.map(|()| kind)?,
            },
        };
        let peer = (made == SinkCreate::Veth).then(|| veth_peer(&name));
        for n in std::iter::once(&name).chain(&peer) {
            quiet_ipv6(&self.handle, n).await;
        }
        // The peer first: copies may be handed to it as soon as the sink is up.
        if let Some(peer) = &peer {
            self.set_up(peer, Some(self.cfg.mtu)).await?;
        }
        self.set_up(&name, None).await?;
        self.created = true;
        tracing::debug!(
            interface = %name,
            kind = ?made,
            configured = ?self.cfg.create,
            mtu = self.mtu(made),
            remote = ?self.cfg.tunnel.remote.filter(|_| made.is_tunnel()),
            "mirror sink created"
        );
        self.index_of(&name).await
    }

    /// The MTU a sink of kind `kind` gets: the configured one, within what a tunnel's
    /// encapsulated packet can carry.
    fn mtu(&self, kind: SinkCreate) -> u32 {
        if kind.is_tunnel() {
            self.cfg.tunnel.mtu(kind, self.cfg.mtu)
        } else {
            self.cfg.mtu
        }
    }

    /// Adds the sink as a link of kind `kind`, down.
    async fn add(&self, kind: SinkCreate) -> anyhow::Result<()> {
        let name = &self.cfg.interface;
        let mtu = self.mtu(kind);
        let t = &self.cfg.tunnel;
        let msg = match kind {
            SinkCreate::Veth => LinkVeth::new(name, &veth_peer(name)).mtu(mtu).build(),
            SinkCreate::Vxlan => {
                // Copies only go out: no learning, no FDB entries from what comes back.
                let mut b = LinkVxlan::new(name, t.id).port(t.udp_port(kind)).learning(false).mtu(mtu);
                b = match t.remote {
                    Some(std::net::IpAddr::V4(a)) => b.remote(a),
                    Some(std::net::IpAddr::V6(a)) => b.remote6(a),
                    None => anyhow::bail!("mirror.tunnel.remote is not set"),
                };
                b = match t.local {
                    Some(std::net::IpAddr::V4(a)) => b.local(a),
                    Some(std::net::IpAddr::V6(a)) => b.local6(a),
                    None => b,
                };
                b.build()
            }
            SinkCreate::Geneve => {
                let mut b = LinkGeneve::new(name, t.id).mtu(mtu);
                b = match t.remote {
                    Some(std::net::IpAddr::V4(a)) => b.remote(a),
                    Some(std::net::IpAddr::V6(a)) => b.remote6(a),
                    None => anyhow::bail!("mirror.tunnel.remote is not set"),
                };
                b.append_info_data(netlink_packet_route::link::InfoGeneve::Port(t.udp_port(kind))).build()
            }
            SinkCreate::Gretap | SinkCreate::Erspan => {
                use netlink_packet_route::link::{GreIOFlags, InfoGre};
                let Some(std::net::IpAddr::V4(remote)) = t.remote else {
                    anyhow::bail!("mirror.tunnel.remote: {kind:?} needs an IPv4 address")
                };
                let mut b = if kind == SinkCreate::Gretap {
                    LinkGre::new_gretap(name).okey(t.id).oflags(GreIOFlags::Key)
                } else {
                    LinkGre::new_erspan(name).oflags(GreIOFlags::Seq)
                };
                b = b.remote(remote).mtu(mtu);
                if let Some(std::net::IpAddr::V4(a)) = t.local {
                    b = b.local(a);
                }
                let mut msg = b.build();
                if kind == SinkCreate::Erspan {
                    // ERSPAN type II, the session id as its index.
                    for a in &mut msg.attributes {
                        if let LinkAttribute::LinkInfo(infos) = a {
                            for i in infos.iter_mut() {
                                if let LinkInfo::Data(netlink_packet_route::link::InfoData::ErSpan(d)) = i {
                                    d.extend([InfoGre::ErSpanVer(1), InfoGre::ErSpanIndex(t.id)]);
                                }
                            }
                        }
                    }
                }
                msg
            }
            _ => LinkDummy::new(name).mtu(mtu).build(),
        };
        self.handle.link().add(msg).execute().await.map_err(|e| {
            anyhow::Error::from(e).context(format!("creating the mirror sink {name} ({kind:?})"))
        })
    }

    /// Removes the sink if we created it.
    pub async fn remove(&mut self) -> anyhow::Result<()> {
        if !self.created {
            return Ok(());
        }
        if let Some(i) = self.index_of(&self.cfg.interface.clone()).await? {
            self.handle.link().del(i).execute().await?;
            tracing::info!(interface = %self.cfg.interface, "mirror sink removed");
        }
        self.created = false;
        Ok(())
    }
}

impl MirrorView {
    /// Shows where copies go (nowhere: `None`).
    fn set_target(&mut self, target: Option<&Target>) {
        self.copies_to = target.map(|t| t.name.clone());
        self.kind = target.and_then(|t| t.kind.clone());
        self.delivery = target.map(|t| {
            match t.delivery {
                MirrorDelivery::Egress => "egress",
                MirrorDelivery::Ingress => "ingress",
            }
            .to_string()
        });
    }
}

/// Whether link creation failed because the kernel lacks the link type (no module).
fn no_such_kind(e: &anyhow::Error) -> bool {
    e.chain().any(|c| match c.downcast_ref::<rtnetlink::Error>() {
        Some(rtnetlink::Error::NetlinkError(m)) => m.raw_code() == -libc::EOPNOTSUPP,
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(create: SinkCreate, method: MethodCfg, deliver: DeliverCfg) -> Mirror {
        Mirror { create, method, deliver, ..Mirror::default() }
    }

    #[test]
    fn auto_delivery_per_sink_kind() {
        use DeliverCfg::*;
        let auto = |create, kind| deliver_for(&cfg(create, MethodCfg::Clone, Auto), kind);
        assert_eq!(auto(SinkCreate::Veth, Some("veth")), PeerIngress);
        // create: auto made a veth pair where the kernel has no dummy type.
        assert_eq!(auto(SinkCreate::Auto, Some("veth")), PeerIngress);
        assert_eq!(auto(SinkCreate::Auto, Some("dummy")), Egress);
        assert_eq!(auto(SinkCreate::Dummy, Some("dummy")), Egress);
        // Captures on an operator's veth may read either end: both still see the copies.
        assert_eq!(auto(SinkCreate::None, Some("veth")), Egress);
        assert_eq!(auto(SinkCreate::None, Some("ifb")), Ingress);
        assert_eq!(auto(SinkCreate::Veth, Some("ifb")), Ingress);
        assert_eq!(auto(SinkCreate::None, None), Egress);
        assert_eq!(auto(SinkCreate::Veth, Some("bridge")), Egress);
        // act_mirred copies to the sink's egress only.
        let mirred = deliver_for(&cfg(SinkCreate::Veth, MethodCfg::Mirred, Auto), Some("veth"));
        assert_eq!(mirred, Egress);
        // What is configured is what is done.
        for d in [Egress, Ingress, PeerIngress] {
            assert_eq!(deliver_for(&cfg(SinkCreate::Veth, MethodCfg::Clone, d), Some("ifb")), d);
        }
    }
}
