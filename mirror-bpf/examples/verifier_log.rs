//! Loads the classifier with libbpf's messages (the verifier's log on failure) on stderr.
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use mirror_bpf::skel::classifier::ClassifierSkelBuilder;

fn main() {
    // The verifier's log comes at warning level.
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, |_, msg: String| eprint!("{msg}"))));
    let b = ClassifierSkelBuilder::default();
    let storage = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = b.open(storage).expect("open");
    let only = std::env::args().nth(1);
    for mut p in open.open_object_mut().progs_mut() {
        let keep = only.as_deref().is_none_or(|o| p.name().to_string_lossy() == o);
        p.set_autoload(keep);
    }
    match open.load() {
        Ok(_) => eprintln!("loaded"),
        Err(e) => eprintln!("failed: {e}"),
    }
}
