//! The kernel's drop reasons: their names, read from the running kernel's BTF (`enum
//! skb_drop_reason`: `SKB_DROP_REASON_NETFILTER_DROP` is `netfilter_drop`), since their values
//! change across kernels; the set a `drop=` rule names; and where they sit among the rule maps'
//! pseudo-statuses (reason `r` is `DROP_REASON_BASE + r`, above the HTTP statuses).
//!
//! Not drops, and never counted nor triggered on ([`EXCLUDED`]): `not_dropped_yet` and
//! `consumed` (a packet used up, not dropped), `not_specified`, the reason of a plain
//! `kfree_skb()`, which the kernel still calls on paths that free a packet normally, and
//! `queue_purge`, a queue emptied as its socket closes or its device goes away (a packet that
//! had arrived, unread; not the network's loss) (the data path leaves out the same four,
//! `include/drop.h`).

use std::fmt;
use std::sync::OnceLock;

use crate::shared::types;

/// The first pseudo-status of drop reasons in the rule maps: reason `r` is `DROP_REASON_BASE + r`.
pub const DROP_REASON_BASE: u16 = types::mirror_limits::DROP_REASON_BASE.0 as u16;
/// Reasons a rule may name: the core's, 0 to `DROP_REASONS - 1` (a subsystem's reason, with
/// high bits set, is counted apart and never triggers).
pub const DROP_REASONS: u16 = types::mirror_limits::DROP_REASONS.0 as u16;
const _: () = assert!(DROP_REASON_BASE > super::syntax::STATUS_MAX, "above the statuses");
const _: () = assert!(
    DROP_REASON_BASE as u32 + DROP_REASONS as u32 == types::mirror_limits::RULE_STATUS_SLOTS.0,
    "status_rules holds every reason"
);

/// The frees that are not drops, by name: never counted, never a trigger.
pub const EXCLUDED: [&str; 4] = ["not_dropped_yet", "consumed", "not_specified", "queue_purge"];

/// Every reason of the running kernel with its name, by value (core reasons below
/// [`DROP_REASONS`]); empty when the kernel has no BTF or no drop reasons (before 5.17).
pub fn reasons() -> &'static [(u16, String)] {
    static REASONS: OnceLock<Vec<(u16, String)>> = OnceLock::new();
    REASONS.get_or_init(|| {
        let Ok(btf) = libbpf_rs::btf::Btf::from_vmlinux() else { return Vec::new() };
        let Some(e) = btf.type_by_name::<libbpf_rs::btf::types::Enum<'_>>("skb_drop_reason") else {
            return Vec::new();
        };
        let mut out: Vec<(u16, String)> = e
            .iter()
            .filter_map(|m| {
                let name = m.name?.to_str()?;
                let name = name.strip_prefix("SKB_DROP_REASON_").or_else(|| name.strip_prefix("SKB_"))?;
                let v = u16::try_from(m.value).ok().filter(|v| *v < DROP_REASONS)?;
                (name != "MAX").then(|| (v, name.to_ascii_lowercase()))
            })
            .collect();
        out.sort();
        out.dedup_by_key(|(v, _)| *v);
        out
    })
}

/// The name of reason `r` on this kernel (`netfilter_drop`).
pub fn reason_name(r: u16) -> Option<&'static str> {
    reasons().iter().find(|(v, _)| *v == r).map(|(_, n)| n.as_str())
}

/// A reason as events and metrics write it: its name, else its number.
pub fn reason_text(r: u16) -> String {
    reason_name(r).map_or_else(|| r.to_string(), str::to_string)
}

/// Drop reasons a rule matches, one bit per reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DropReasons(pub [u64; 4]);
const _: () = assert!(DROP_REASONS as usize == 4 * 64, "one bit per reason");

impl DropReasons {
    /// Every real drop reason of the running kernel (`drop` alone).
    pub fn all() -> DropReasons {
        reasons().iter().filter(|(_, n)| !EXCLUDED.contains(&n.as_str())).map(|(v, _)| *v).collect()
    }

    /// Whether it holds `r`.
    pub fn contains(self, r: u16) -> bool {
        r < DROP_REASONS && self.0[usize::from(r / 64)] & 1 << (r % 64) != 0
    }

    /// Its reasons, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u16> {
        (0..DROP_REASONS).filter(move |r| self.contains(*r))
    }

    /// Whether it holds none.
    pub fn is_empty(self) -> bool {
        self.0 == [0; 4]
    }
}

impl FromIterator<u16> for DropReasons {
    fn from_iter<I: IntoIterator<Item = u16>>(it: I) -> Self {
        let mut set = DropReasons::default();
        for r in it.into_iter().filter(|r| *r < DROP_REASONS) {
            set.0[usize::from(r / 64)] |= 1 << (r % 64);
        }
        set
    }
}

/// `drop` for every reason, else `drop=netfilter_drop,no_socket` (names of this kernel).
impl fmt::Display for DropReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == DropReasons::all() {
            return f.write_str("drop");
        }
        let names: Vec<String> = self.iter().map(reason_text).collect();
        write!(f, "drop={}", names.join(","))
    }
}

/// A `drop=` list: the kernel's reason names, lower case, without `SKB_DROP_REASON_`, comma
/// separated (upper case and the prefix are accepted too); `any`: every real drop (as `drop`).
pub fn parse_reasons(v: &str) -> Result<DropReasons, String> {
    if reasons().is_empty() {
        return Err("this kernel names no drop reasons (its BTF has no enum skb_drop_reason: 5.17+ \
                    with BTF)"
            .into());
    }
    if v.eq_ignore_ascii_case("any") {
        return Ok(DropReasons::all());
    }
    let mut set = DropReasons::default();
    for item in v.split(',') {
        let name = item.trim().to_ascii_lowercase();
        let name = name.strip_prefix("skb_drop_reason_").unwrap_or(&name);
        if EXCLUDED.contains(&name) {
            return Err(format!(
                "'{item}' is not a drop: {} are normal frees, never triggers",
                EXCLUDED.join(", ")
            ));
        }
        let Some((r, _)) = reasons().iter().find(|(_, n)| n == name) else {
            let known: Vec<&str> =
                reasons().iter().map(|(_, n)| n.as_str()).filter(|n| !EXCLUDED.contains(n)).collect();
            return Err(format!(
                "'{item}' is not a drop reason of this kernel; its reasons: {}",
                known.join(", ")
            ));
        };
        set = set.iter().chain([*r]).collect();
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_come_from_the_kernel() {
        let nf = reasons().iter().find(|(_, n)| n == "netfilter_drop").expect("netfilter_drop").0;
        assert_eq!(reason_name(nf), Some("netfilter_drop"));
        assert!(reason_name(reasons().iter().find(|(_, n)| n == "no_socket").unwrap().0).is_some());
        let all = DropReasons::all();
        assert!(all.contains(nf));
        for name in EXCLUDED {
            let (r, _) = reasons().iter().find(|(_, n)| n == name).expect(name);
            assert!(!all.contains(*r), "{name} is not a drop");
        }
        assert_eq!(all.to_string(), "drop");
    }

    #[test]
    fn lists_are_read_and_written() {
        let set = parse_reasons("no_socket,NETFILTER_DROP,skb_drop_reason_no_socket").unwrap();
        assert_eq!(set.iter().count(), 2);
        let text = set.to_string();
        assert!(text == "drop=no_socket,netfilter_drop" || text == "drop=netfilter_drop,no_socket", "{text}");
        assert_eq!(parse_reasons(text.strip_prefix("drop=").unwrap()).unwrap(), set);
        let e = parse_reasons("consumed").unwrap_err();
        assert!(e.contains("not a drop"), "{e}");
        let e = parse_reasons("nosuch").unwrap_err();
        assert!(e.contains("not a drop reason of this kernel") && e.contains("netfilter_drop"), "{e}");
    }
}
