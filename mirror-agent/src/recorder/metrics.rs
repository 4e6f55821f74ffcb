//! The recorder's metrics, `mirror_recorder_*`, added to the agent's scrape.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::Stats;

/// The recorder's metrics in `s`'s registry text (OpenMetrics), placed before its `# EOF`.
pub fn append(body: String, s: &Stats) -> String {
    let mut reg = Registry::with_prefix("mirror_recorder");
    let v = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let closed = Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
    for (state, c) in [("complete", &s.complete), ("cut", &s.cut)] {
        closed.get_or_create(&vec![("state".into(), state.into())]).inc_by(v(c));
    }
    reg.register("captures_closed", "Captures closed: whole, or cut (budget, disk, agent stopped)", closed);
    for (name, help, c) in [
        ("captures_opened", "Captures opened, one per trigger", &s.opened),
        (
            "captures_failed",
            "Triggers that got no capture (too many open, the directory unusable)",
            &s.failed,
        ),
        ("captures_deleted", "Captures deleted to keep within the budget (bytes, number, age)", &s.deleted),
        (
            "write_errors",
            "Writes the disk refused: full, read-only, an I/O error (the mirror goes on)",
            &s.write_errors,
        ),
        ("packets", "Copies written to captures", &s.packets),
        ("unclaimed_packets", "Copies of no open capture (their trigger got none)", &s.unclaimed),
        (
            "socket_drops",
            "Copies the kernel dropped from the recorder's socket (it fell behind)",
            &s.socket_drops,
        ),
        ("uploads", "Captures stored in object storage (then deleted from the node)", &s.uploaded),
        ("uploaded_bytes", "Bytes of captures sent to object storage", &s.uploaded_bytes),
        (
            "upload_failures",
            "Attempts to upload a capture that failed (each tried again)",
            &s.upload_failures,
        ),
        (
            "uploads_abandoned",
            "Captures deleted for the budget or their age before they could be uploaded",
            &s.upload_abandoned,
        ),
    ] {
        reg.register(name, help, ConstCounter::new(v(c)));
    }
    for (name, help, c) in [
        ("stored_bytes", "Bytes the captures take on disk", &s.stored_bytes),
        ("stored_captures", "Captures kept on disk", &s.stored),
        ("open_captures", "Captures being written (their flow mirrored)", &s.open),
        ("upload_pending", "Closed captures waiting to be uploaded", &s.upload_pending),
    ] {
        reg.register(name, help, ConstGauge::new(v(c) as i64));
    }
    let mut ours = String::new();
    if encode(&mut ours, &reg).is_err() {
        return body;
    }
    let ours = ours.strip_suffix("# EOF\n").unwrap_or(&ours);
    match body.strip_suffix("# EOF\n") {
        Some(head) => format!("{head}{ours}# EOF\n"),
        None => body + ours,
    }
}
