//! Compiles every `src/bpf/<name>.bpf.c` into `$OUT_DIR/<name>.skel.rs`.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["classifier", "tracing", "baseline"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    for name in PROGRAMS {
        let src = format!("src/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            // v3: atomic fetch-and-add with a result, used by the per-flow mirror budget.
            .clang_args(["-mcpu=v3", "-Wall", "-Werror", "-Isrc/bpf/include"])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src}: {e:#}"));
    }
    println!("cargo:rerun-if-changed=src/bpf");
}
