//! The CRI v1 messages (`runtime.v1`) from the published `api.proto` (proto/cri-api/, pinned),
//! compiled in Rust: protox parses it (no `protoc` on the build machine), prost-build writes
//! the messages to `$OUT_DIR/runtime.v1.rs`, which `src/pods/cri_api.rs` includes. The client
//! calls the service through tonic's generic `Grpc` (src/pods/cri.rs), so no service code is
//! generated.

fn main() {
    let proto = "proto/cri-api/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile([proto], ["proto/cri-api"]).unwrap_or_else(|e| panic!("{proto}: {e}"));
    // The file's comments stay in the file: some are indented text, which rustdoc would take
    // for Rust code to test.
    prost_build::Config::new()
        .disable_comments(["."])
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the CRI messages from {proto}: {e}"));
}
