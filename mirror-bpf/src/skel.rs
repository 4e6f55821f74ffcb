//! Generated skeletons, one per `src/bpf/<name>.bpf.c`.

#![allow(missing_docs, clippy::all, non_camel_case_types, non_snake_case, non_upper_case_globals)]

/// The classifier attached to container veths.
pub mod classifier {
    include!(concat!(env!("OUT_DIR"), "/classifier.skel.rs"));
}
/// Tracing programs: kernel stack latency and network-stack CPU cost.
pub mod tracing {
    include!(concat!(env!("OUT_DIR"), "/tracing.skel.rs"));
}
/// An empty tc program, the baseline of every per-packet cost.
pub mod baseline {
    include!(concat!(env!("OUT_DIR"), "/baseline.skel.rs"));
}
