//! Attaches the empty program (or, with `--floor` first, the floor program: parse and one per-CPU
//! flow-table update) on TCX at ingress and egress of the interfaces named, and keeps them
//! attached until stdin closes: the baselines the classifier's run time is compared with under
//! the same traffic.
use std::io::Read;
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use mirror_bpf::attach::attach_tcx;
use mirror_bpf::skel::baseline::BaselineSkelBuilder;

fn main() {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    let floor = names.first().is_some_and(|n| n == "--floor");
    if floor {
        names.remove(0);
    }
    if names.is_empty() {
        eprintln!("usage: empty_tcx [--floor] IFACE...");
        std::process::exit(2);
    }
    let storage = Box::leak(Box::new(MaybeUninit::uninit()));
    let skel = BaselineSkelBuilder::default().open(storage).and_then(|o| o.load()).expect("load");
    let mut links = Vec::new();
    let (ingress, egress) = if floor {
        (&skel.progs.tcx_floor_ingress, &skel.progs.tcx_floor_egress)
    } else {
        (&skel.progs.tcx_empty_ingress, &skel.progs.tcx_empty_egress)
    };
    for name in &names {
        let ifindex = mirror_bpf::testing::ifindex(name);
        links.push(attach_tcx(ingress, ifindex, false).expect("attach ingress"));
        links.push(attach_tcx(egress, ifindex, true).expect("attach egress"));
    }
    println!("attached");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(links);
}
