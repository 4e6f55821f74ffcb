//! Compiles every `src/bpf/<name>.bpf.c` into `$OUT_DIR/<name>.skel.rs`.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["classifier", "tracing", "baseline"];

/// `MIRROR_BPF_PROFILE_STOP`: a profiling build for the benchmark's ladder, whose HTTP/1 program
/// stops at a stage (config.h). It follows no message: never a build to run.
fn profile_stop() -> u32 {
    match env::var("MIRROR_BPF_PROFILE_STOP").as_deref() {
        Err(_) | Ok("") => 0,
        Ok(stop) => {
            let n = match stop {
                "dispatch" => 1,
                "segment" => 2,
                other => panic!("MIRROR_BPF_PROFILE_STOP={other}: expected dispatch or segment"),
            };
            println!(
                "cargo:warning=a profiling build (MIRROR_BPF_PROFILE_STOP={stop}): it follows no message"
            );
            n
        }
    }
}

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let stop = format!("-DMIRROR_PROFILE_STOP={}", profile_stop());
    for name in PROGRAMS {
        let src = format!("src/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            // v3: atomic fetch-and-add with a result, used by the per-flow mirror budget.
            .clang_args(["-mcpu=v3", "-Wall", "-Werror", "-Isrc/bpf/include", stop.as_str()])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src}: {e:#}"));
    }
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-env-changed=MIRROR_BPF_PROFILE_STOP");
}
