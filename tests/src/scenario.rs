//! The scenario most tests share, run with different attach modes, mirror methods and IP
//! families.

use mirror_bpf::{AttachMode, MirrorDelivery, MirrorMethod};

use crate::client::{self, url};
use crate::oracle::Expected;
use crate::testbed::{Recording, Testbed};

/// nginx's port.
pub const HTTP: u16 = 80;

/// The client pod, then the server pod.
pub const PODS: [&str; 2] = ["client", "server"];

/// The outcome of [`keepalive_pod_to_pod`], for further checks.
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
    let mut bed = Testbed::new(&PODS);
    bed.nginx("server", HTTP);
    bed.mirror_to_sink_via(delivery);
    let rule = bed.add_rule("status=500");
    bed.attach(mode, method);
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
