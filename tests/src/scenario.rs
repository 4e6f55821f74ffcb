//! The scenarios several tests share, run with different attach modes, mirror methods, ways
//! of handing the copies to the sink and IP families.

use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};

use crate::oracles::oracle::Expected;
use crate::topology::testbed::{Recording, Testbed};
use crate::workload::client::{self, url};

/// nginx's port.
pub const HTTP: u16 = 80;

/// python's port.
pub const ALT: u16 = 8080;

/// The client pod, then the server pod.
pub const PODS: [&str; 2] = ["client", "server"];

/// The outcome of a scenario, for further checks.
pub struct Outcome {
    /// The testbed, still attached.
    pub bed: Testbed,
    /// What was captured.
    pub rec: Recording,
    /// What the mirror had to carry.
    pub expected: Expected,
}

/// Rule `status=500`; from the client pod to nginx in the server pod: `/foo /bar /foo` on one
/// connection (mirrored from the 500 on, both directions), then `/foo /foo` on another (never
/// mirrored). Checks the mirror against the client's capture, the classifier's counters, flow
/// table and trigger event.
pub fn keepalive_pod_to_pod(mode: AttachMode, method: MirrorMethod, v6: bool) -> Outcome {
    keepalive_pod_to_pod_via(mode, method, v6, MirrorDelivery::Egress)
}

/// [`keepalive_pod_to_pod`] with the copies handed to the sink as `delivery` says (see
/// [`Testbed::mirror_to_sink_via`]); the capture reads the sink's peer either way.
pub fn keepalive_pod_to_pod_via(
    mode: AttachMode,
    method: MirrorMethod,
    v6: bool,
    delivery: MirrorDelivery,
) -> Outcome {
    let bed = Testbed::builder(&PODS)
        .nginx("server", HTTP)
        .mirror_via(delivery)
        .rule("status=500")
        .attach(mode, method)
        .build();
    let rule = bed.rule_ids()[0];
    let events = bed.events();

    let server = bed.pod("server").addr(v6);
    let client = &bed.pod("client").ns;
    let rec = bed.record("client", || {
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 500, 200]);
        let urls = ["/foo", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client, &urls), [200, 200]);
    });

    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1, "one connection triggered");
    assert_eq!(expected.untriggered().count(), 1, "one connection only saw 200s");
    let t = &expected.triggered[0];
    // A whole request/response at least: the 500, /foo, its 200, and the close.
    assert!(t.packets >= 4, "{t:?}");
    let ev = events.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].key, ev[0].rule_id, ev[0].status), (t.flow, rule, 500));
    assert_eq!((ev[0].method.as_deref(), ev[0].target.as_deref()), (Some("GET"), Some("/bar")));
    Outcome { bed, rec, expected }
}

/// Rule `status=500`, copies handed to the sink as `delivery` says; from the client pod to
/// python in the server pod, on one connection: `/ok`, then a 500 with a 1 MiB body. Checks
/// the mirror against the client's capture (see [`Testbed::check`]) and that more than the
/// body's bytes were mirrored.
pub fn large_500_response(delivery: MirrorDelivery, v6: bool) -> Outcome {
    const BODY: u32 = 1 << 20;
    let bed = Testbed::builder(&PODS).python("server", ALT).mirror_via(delivery).rule("status=500").build();

    let server = bed.pod("server").addr(v6);
    let rec = bed.record("client", || {
        let urls = [url(server, ALT, "/ok"), url(server, ALT, &format!("/fail?bytes={BODY}"))];
        assert_eq!(client::get_keepalive(&bed.pod("client").ns, &urls), [200, 500]);
    });
    let expected = bed.check(&rec, |status, _| status == 500);
    assert_eq!(expected.triggered.len(), 1);
    let mirrored: u32 = rec.mirror.packets.iter().map(|p| p.len).sum();
    assert!(mirrored > BODY, "{mirrored} bytes mirrored");
    Outcome { bed, rec, expected }
}
