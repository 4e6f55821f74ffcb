//! Loads the classifier with every protocol and prints what the verifier made of each program.
fn main() {
    let dp = mirror_bpf::testing::load(&mirror_bpf::DatapathOptions {
        only: Some((mirror_bpf::AttachMode::Tcx, mirror_bpf::MirrorMethod::Clone)),
        ..Default::default()
    });
    for p in dp.programs() {
        println!("{:24} {:>8} insns {:>10?}", p.name, p.verified_insns, p.verify_time);
    }
    println!("load {:?}", dp.load_time());
}
