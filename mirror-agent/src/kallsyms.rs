//! Kernel addresses named by `/proc/kallsyms` (`nf_hook_slow+0x8c`): where the kernel dropped a
//! packet. The file is scanned for each address not named before (drop triggers are rate-limited,
//! and few places drop), and the answers kept, at most [`CACHED`] of them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::sync::Mutex;

/// Addresses whose names are kept.
const CACHED: usize = 1024;

static NAMES: Mutex<Option<HashMap<u64, String>>> = Mutex::new(None);

/// `addr` as `symbol+0xoffset` (`[module]` after it for a module's), else `0x...` (addresses
/// hidden by `kptr_restrict`, or no kallsyms).
pub fn name(addr: u64) -> String {
    if let Some(n) = NAMES.lock().ok().and_then(|m| m.as_ref().and_then(|m| m.get(&addr).cloned())) {
        return n;
    }
    let n = std::fs::File::open("/proc/kallsyms")
        .ok()
        .and_then(|f| nearest(BufReader::new(f), addr))
        .unwrap_or_else(|| format!("{addr:#x}"));
    if let Ok(mut m) = NAMES.lock() {
        let m = m.get_or_insert_with(HashMap::new);
        if m.len() >= CACHED {
            m.clear();
        }
        m.insert(addr, n.clone());
    }
    n
}

/// The text symbol at or below `addr` in a kallsyms listing, with the offset.
fn nearest(r: impl BufRead, addr: u64) -> Option<String> {
    let mut best: Option<(u64, String)> = None;
    for line in r.lines().map_while(Result::ok) {
        let mut it = line.split_ascii_whitespace();
        let (Some(a), Some(kind), Some(sym)) = (it.next(), it.next(), it.next()) else { continue };
        if !matches!(kind, "t" | "T") {
            continue;
        }
        let Ok(a) = u64::from_str_radix(a, 16) else { continue };
        if a == 0 || a > addr || best.as_ref().is_some_and(|(b, _)| *b >= a) {
            continue;
        }
        let module = it.next().map(|m| format!(" {m}")).unwrap_or_default();
        best = Some((a, format!("{sym}+{:#x}{module}", addr - a)));
    }
    best.map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_symbol_below_names_an_address() {
        let listing = "ffffffff81000000 T _text\nffffffff81100000 t nf_hook_slow\nffffffff81100100 T \
                       other\nffffffffc0001000 t nft_do_chain\t[nf_tables]\n0000000000000000 T hidden\n";
        assert_eq!(nearest(listing.as_bytes(), 0xffffffff8110008c).as_deref(), Some("nf_hook_slow+0x8c"));
        assert_eq!(
            nearest(listing.as_bytes(), 0xffffffffc0001010).as_deref(),
            Some("nft_do_chain+0x10 [nf_tables]")
        );
        assert_eq!(nearest(listing.as_bytes(), 0x10), None);
    }
}
