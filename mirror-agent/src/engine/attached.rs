//! The links the classifier is attached to, by ifindex. Every change to the set (a link
//! attached, renamed, detached or lost) is published on a watch channel as the list of
//! [`InterfaceView`]s, which the rest of the agent follows without asking the engine (the
//! pods behind the veths are resolved from it); the channel closes when the engine stops.

use std::collections::BTreeMap;

use tokio::sync::watch;

use mirror_bpf::{AttachMode, Attachment, MirrorMethod};

use crate::views::InterfaceView;

/// A link we are attached to.
pub(super) struct Attached {
    pub(super) name: String,
    pub(super) att: Attachment,
}

impl Attached {
    /// The link as the API shows it.
    pub(super) fn view(&self, ifindex: u32) -> InterfaceView {
        InterfaceView {
            name: self.name.clone(),
            ifindex,
            mode: if self.att.mode == AttachMode::Tcx { "tcx" } else { "tc" }.into(),
            method: if self.att.method == MirrorMethod::Mirred { "mirred" } else { "clone" }.into(),
            directions: vec!["ingress".into(), "egress".into()],
        }
    }
}

/// The attached links, and the channel their list is published on.
pub(super) struct AttachedLinks {
    links: BTreeMap<u32, Attached>,
    tx: watch::Sender<Vec<InterfaceView>>,
}

impl AttachedLinks {
    /// None yet; changes go to `tx`.
    pub(super) fn new(tx: watch::Sender<Vec<InterfaceView>>) -> Self {
        Self { links: BTreeMap::new(), tx }
    }

    /// The link on `ifindex`.
    pub(super) fn get(&self, ifindex: u32) -> Option<&Attached> {
        self.links.get(&ifindex)
    }

    /// Each link, by ifindex.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Attached)> {
        self.links.iter().map(|(i, a)| (*i, a))
    }

    /// The links as the API shows them.
    pub(super) fn views(&self) -> Vec<InterfaceView> {
        self.tx.borrow().clone()
    }

    /// Names the link on `ifindex` `name` (it may have been renamed); `None` when it is not
    /// attached.
    pub(super) fn rename(&mut self, ifindex: u32, name: &str) -> Option<InterfaceView> {
        let a = self.links.get_mut(&ifindex)?;
        let renamed = a.name != name;
        if renamed {
            a.name = name.to_owned();
        }
        let view = a.view(ifindex);
        if renamed {
            self.publish();
        }
        Some(view)
    }

    /// Adds a link just attached.
    pub(super) fn insert(&mut self, ifindex: u32, a: Attached) {
        self.links.insert(ifindex, a);
        self.publish();
    }

    /// Takes the link on `ifindex` out of the set.
    pub(super) fn remove(&mut self, ifindex: u32) -> Option<Attached> {
        let a = self.links.remove(&ifindex);
        self.publish();
        a
    }

    /// Takes every link out of the set.
    pub(super) fn take_all(&mut self) -> BTreeMap<u32, Attached> {
        let all = std::mem::take(&mut self.links);
        self.publish();
        all
    }

    /// Hands each link to `again`, which attaches it anew, and keeps what it gives back
    /// (`None`: the link is lost). The set is published once, after all of them.
    pub(super) fn reattach(&mut self, mut again: impl FnMut(u32, Attached) -> Option<Attached>) {
        for (ifindex, a) in std::mem::take(&mut self.links) {
            if let Some(a) = again(ifindex, a) {
                self.links.insert(ifindex, a);
            }
        }
        self.publish();
    }

    /// Sends the list, when it differs from the one sent last.
    fn publish(&self) {
        let now: Vec<InterfaceView> = self.iter().map(|(i, a)| a.view(i)).collect();
        self.tx.send_if_modified(|sent| {
            let changed = *sent != now;
            if changed {
                *sent = now;
            }
            changed
        });
    }
}
