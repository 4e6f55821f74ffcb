//! Loads the classifier with libbpf's messages (the verifier's log on failure) on stderr.
//! `cargo run --example verifier_log [PROGRAM]`: only that program. With
//! `MIRROR_VERIFIER_STATS=1` the verifier's statistics of each program loaded are printed too
//! (instructions processed, states, stack depth of each function), also on success.
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use mirror_bpf::skel::classifier::ClassifierSkelBuilder;

fn main() {
    // The verifier's log comes at warning level.
    let stats = std::env::var_os("MIRROR_VERIFIER_STATS").is_some();
    let level = if stats { libbpf_rs::PrintLevel::Debug } else { libbpf_rs::PrintLevel::Warn };
    libbpf_rs::set_print(Some((level, |_, msg: String| eprint!("{msg}"))));
    let b = ClassifierSkelBuilder::default();
    let storage = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = b.open(storage).expect("open");
    let only = std::env::args().nth(1);
    for mut p in open.open_object_mut().progs_mut() {
        let keep = only.as_deref().is_none_or(|o| p.name().to_string_lossy() == o);
        p.set_autoload(keep);
        if stats {
            // BPF_LOG_STATS: the verifier's totals, printed by libbpf at debug level.
            p.set_log_level(4);
        }
    }
    match open.load() {
        Ok(_) => eprintln!("loaded"),
        Err(e) => eprintln!("failed: {e}"),
    }
}
