//! The mirror sink: the link mirrored packets are copied to. Created when asked (dummy, or a
//! veth pair whose peer is where captures read), brought up with a large MTU, recreated if it
//! disappears; removed at exit only if we created it.

use futures::TryStreamExt;
use rtnetlink::{Handle, LinkDummy, LinkUnspec, LinkVeth};

use crate::config::{Mirror, SinkCreate};

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

/// Disables IPv6 on a link we created: otherwise it sends its own router solicitations and
/// MLD reports, and captures on the sink see them among the mirrored packets.
fn quiet_ipv6(name: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    match std::fs::write(&path, "1") {
        Ok(()) => {}
        // No IPv6 in this kernel: nothing to silence.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(%path, error = %e, "IPv6 left on: captures will see the sink's own packets"),
    }
}

impl Sink {
    /// A sink as configured; nothing is created yet.
    pub fn new(cfg: Mirror, created: bool) -> anyhow::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Self { cfg, handle, created })
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.cfg.interface
    }

    /// What happens now that the sink has vanished, for the log.
    pub fn vanished(&self) -> &'static str {
        match self.cfg.create {
            SinkCreate::None => {
                "mirror sink vanished: waiting for it to appear again (mirror.create: none, the agent does not create it)"
            }
            SinkCreate::Dummy | SinkCreate::Veth => "mirror sink vanished: recreating",
        }
    }

    /// Whether `name` is the sink or its peer (never to be attached).
    pub fn owns(&self, name: &str) -> bool {
        name == self.cfg.interface
            || (self.cfg.create == SinkCreate::Veth && name == veth_peer(&self.cfg.interface))
    }

    async fn index_of(&self, name: &str) -> anyhow::Result<Option<u32>> {
        let mut links = self.handle.link().get().match_name(name.to_string()).execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(msg.header.index)),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn set_up(&self, name: &str, mtu: Option<u32>) -> anyhow::Result<()> {
        let mut msg = LinkUnspec::new_with_name(name).up();
        if let Some(mtu) = mtu {
            msg = msg.mtu(mtu);
        }
        self.handle.link().set(msg.build()).execute().await?;
        Ok(())
    }

    /// Makes sure the sink exists and is up; returns its ifindex (`None`: absent, not ours to create).
    pub async fn ensure(&mut self) -> anyhow::Result<Option<u32>> {
        let name = self.cfg.interface.clone();
        if let Some(i) = self.index_of(&name).await? {
            self.set_up(&name, None).await?;
            return Ok(Some(i));
        }
        // Created down: brought up once silenced (see quiet_ipv6).
        let msg = match self.cfg.create {
            SinkCreate::None => return Ok(None),
            SinkCreate::Dummy => LinkDummy::new(&name).mtu(self.cfg.mtu).build(),
            SinkCreate::Veth => LinkVeth::new(&name, &veth_peer(&name)).mtu(self.cfg.mtu).build(),
        };
        match self.handle.link().add(msg).execute().await {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e))
                if self.cfg.create == SinkCreate::Dummy && e.raw_code() == -libc::EOPNOTSUPP =>
            {
                anyhow::bail!(
                    "this kernel has no dummy link type (no dummy module): set mirror.create: veth, \
                     or create {name} yourself and set mirror.create: none"
                );
            }
            Err(e) => return Err(anyhow::Error::from(e).context(format!("creating the mirror sink {name}"))),
        }
        let peer = (self.cfg.create == SinkCreate::Veth).then(|| veth_peer(&name));
        for n in std::iter::once(&name).chain(&peer) {
            quiet_ipv6(n);
        }
        self.set_up(&name, None).await?;
        if let Some(peer) = &peer {
            self.set_up(peer, Some(self.cfg.mtu)).await?;
        }
        self.created = true;
        tracing::info!(interface = %name, kind = ?self.cfg.create, mtu = self.cfg.mtu, "mirror sink created");
        self.index_of(&name).await
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
