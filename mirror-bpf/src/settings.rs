//! The classifier's runtime settings (a single-entry map read per packet), the timing groups
//! they switch, and how copies are delivered to the mirror interface.

use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::{Context, Result};
use crate::shared::{bytes_of, read_plain, types, ZERO};
use crate::skel::classifier::ClassifierSkel;

/// `BPF_F_INGRESS`, the flag of `bpf_clone_redirect` that delivers to the interface's receive path.
pub(crate) const BPF_F_INGRESS: u32 = 1;

/// How a copy reaches the mirror interface (`mirror.deliver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MirrorDelivery {
    /// Transmitted by the interface (`bpf_clone_redirect` without flags, `mirred egress
    /// mirror`): a capture on it sees the copy going out, one on its veth peer coming in.
    /// What transmitting costs depends on the interface: a dummy frees the copy, a veth hands
    /// it to its peer's receive path, an ifb hands it back to the interface it came from.
    #[default]
    Egress,
    /// Received by the interface, as if from the wire (`BPF_F_INGRESS`; the clone method
    /// only): no transmit path and, for a veth, no crossing to the peer. A capture on it sees
    /// the copy coming in. The copy is addressed to another host (its Ethernet destination is
    /// not the interface's), so the node's IP stack drops it at once.
    Ingress,
}

impl MirrorDelivery {
    /// Its value of the classifier's `mirror_deliver`: the flags of `bpf_clone_redirect`.
    pub(crate) fn flags(self) -> u32 {
        match self {
            MirrorDelivery::Egress => 0,
            MirrorDelivery::Ingress => BPF_F_INGRESS,
        }
    }

    /// The delivery of the classifier's `mirror_deliver` value.
    pub(crate) fn from_flags(flags: u32) -> Self {
        if flags & BPF_F_INGRESS != 0 {
            MirrorDelivery::Ingress
        } else {
            MirrorDelivery::Egress
        }
    }
}

/// Groups of timing measurements that can be switched at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingGroup {
    /// HTTP response times (the `latency>` rules need them).
    Http,
    /// TCP handshake times.
    Handshake,
    /// DNS answer times and response codes, on the DNS ports, whether or not a rule is a DNS
    /// rule (with a `dns=` or a `noresponse>` rule, DNS is followed anyway).
    Dns,
}

impl TimingGroup {
    /// Every group.
    pub const ALL: [TimingGroup; 3] = [TimingGroup::Http, TimingGroup::Handshake, TimingGroup::Dns];

    /// Its bit in the `timing` mask of the settings.
    pub(crate) fn bit(self) -> u32 {
        match self {
            TimingGroup::Http => types::timing_group::TIMING_HTTP.0,
            TimingGroup::Handshake => types::timing_group::TIMING_HANDSHAKE.0,
            TimingGroup::Dns => types::timing_group::TIMING_DNS.0,
        }
    }

    /// Whether the group is on in a data path loaded without an earlier one's settings, and
    /// `latency.<name>`'s default.
    pub const fn on_by_default(self) -> bool {
        match self {
            TimingGroup::Http | TimingGroup::Handshake | TimingGroup::Dns => true,
        }
    }

    /// The `timing` bits of the groups on by default.
    pub(crate) fn default_bits() -> u32 {
        Self::ALL.into_iter().filter(|g| g.on_by_default()).fold(0, |bits, g| bits | g.bit())
    }

    /// Its name: `http`, `handshake`, `dns`.
    pub fn name(self) -> &'static str {
        match self {
            TimingGroup::Http => "http",
            TimingGroup::Handshake => "handshake",
            TimingGroup::Dns => "dns",
        }
    }

    /// The group of that name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// The DNS server port of the classifier's settings unless configured.
pub const DNS_PORT: u16 = 53;
/// The server ports DNS is followed on unless configured (`dns.ports`).
pub const DNS_PORTS: [u16; 1] = [DNS_PORT];
/// Most DNS ports the settings hold.
pub const DNS_PORTS_MAX: usize = types::mirror_limits::DNS_PORTS_MAX.0 as usize;

/// Checks a list of DNS server ports: 1 to [`DNS_PORTS_MAX`] of them, each 1-65535, none twice;
/// the error says why not.
pub fn check_dns_ports(ports: &[u16]) -> std::result::Result<(), String> {
    if ports.is_empty() {
        return Err(format!("none: give 1 to {DNS_PORTS_MAX} ports (53 unless configured)"));
    }
    if ports.len() > DNS_PORTS_MAX {
        return Err(format!("{} ports, more than the {DNS_PORTS_MAX} the classifier follows", ports.len()));
    }
    if ports.contains(&0) {
        return Err("port 0: each port is 1-65535".into());
    }
    if let Some((i, p)) = ports.iter().enumerate().find(|(i, p)| ports[..*i].contains(p)) {
        return Err(format!("port {p} given twice (at {i})"));
    }
    Ok(())
}

/// Sets the ports DNS is followed on (checked by [`check_dns_ports`]): in order, the unused
/// entries 0.
pub(crate) fn set_dns_ports(s: &mut types::settings, ports: &[u16]) {
    s.dns_ports = [0; DNS_PORTS_MAX];
    for (slot, port) in s.dns_ports.iter_mut().zip(ports) {
        *slot = *port;
    }
}

/// The settings in `map` (all zero if unset).
pub(crate) fn read(map: &MapMut<'_>) -> Result<types::settings> {
    let v = map.lookup(&ZERO, MapFlags::ANY).context(|| "reading settings".into())?;
    Ok(v.map(|b| read_plain(&b)).unwrap_or_default())
}

/// Changes the settings in `map` with `f`.
pub(crate) fn update(map: &MapMut<'_>, f: impl FnOnce(&mut types::settings)) -> Result<()> {
    let mut s = read(map)?;
    f(&mut s);
    map.update(&ZERO, bytes_of(&s), MapFlags::ANY).context(|| "writing settings".into())
}

/// Switches timing `group` on or off in the settings of `map`.
pub(crate) fn set_timing(map: &MapMut<'_>, group: TimingGroup, on: bool) -> Result<()> {
    update(map, |s| if on { s.timing |= group.bit() } else { s.timing &= !group.bit() })
}

/// Whether timing `group` is on in the settings of `map`.
pub(crate) fn timing(map: &MapMut<'_>, group: TimingGroup) -> Result<bool> {
    Ok(read(map)?.timing & group.bit() != 0)
}

/// How the classifier hands copies to the mirror interface (`mirror_deliver` in its `.data`;
/// the default when unreadable).
pub(crate) fn mirror_deliver(skel: &ClassifierSkel<'_>) -> MirrorDelivery {
    skel.maps
        .data_data
        .as_deref()
        .map_or_else(MirrorDelivery::default, |d| MirrorDelivery::from_flags(d.mirror_deliver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_ports_are_checked_and_padded() {
        assert_eq!(check_dns_ports(&DNS_PORTS), Ok(()));
        assert_eq!(check_dns_ports(&[53, 5353, 1, 2, 3, 4, 5, 65535]), Ok(()));
        let bad = |p: &[u16]| check_dns_ports(p).unwrap_err();
        assert!(bad(&[]).starts_with("none"), "{}", bad(&[]));
        assert_eq!(bad(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), "9 ports, more than the 8 the classifier follows");
        assert_eq!(bad(&[53, 0]), "port 0: each port is 1-65535");
        assert_eq!(bad(&[53, 5353, 53]), "port 53 given twice (at 2)");
        let mut s = types::settings { dns_ports: [1; DNS_PORTS_MAX], ..Default::default() };
        set_dns_ports(&mut s, &[53, 5353]);
        assert_eq!(s.dns_ports, [53, 5353, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn timing_groups_have_their_bits_and_names() {
        assert_eq!(TimingGroup::Dns.bit(), types::timing_group::TIMING_DNS.0);
        assert_eq!(TimingGroup::from_name("dns"), Some(TimingGroup::Dns));
        assert_eq!(TimingGroup::default_bits(), 0b111, "all on by default");
    }
}
