//! HTTP response time, latency rules and TCP handshake time on real traffic: a python server
//! answering after a known delay, curl from a pod.

use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_bpf::HistKind;
use mirror_e2e::scenario::PODS;
use mirror_e2e::topology::testbed::Testbed;
use mirror_e2e::workload::client::{self, url};

/// python's port.
const PY: u16 = 8080;

fn bed() -> Testbed {
    Testbed::builder(&PODS).python("server", PY).no_mirror().build()
}

#[test]
fn a_50ms_server_is_measured_at_50ms_once_per_request() {
    if !require_root() {
        return;
    }
    let bed = bed();
    let server = bed.pod("server").addr(false);
    let urls: Vec<String> = (0..20).map(|_| url(server, PY, "/status/200?delay_ms=50")).collect();
    assert!(client::get_keepalive(&bed.pod("client").ns, &urls).iter().all(|s| *s == 200));

    let h = bed.histogram(HistKind::HttpResponse, Some(2)).expect("a 2xx histogram");
    // Each request crosses two attached veths but is timed once.
    assert_eq!(h.count, 20);
    let p50 = h.quantile(0.5).unwrap().as_secs_f64();
    assert!((p50 - 0.050).abs() <= 0.005, "p50 {:.2} ms", p50 * 1e3);
    let flows = bed.dp.flows().unwrap();
    let f = flows.iter().find(|f| f.http_timed > 0).expect("the flow keeps its times");
    assert_eq!(f.http_timed, 20);
    assert!(f.http_time_mean.unwrap() >= Duration::from_millis(50));
}

#[test]
fn a_latency_rule_mirrors_only_the_slow_connections() {
    if !require_root() {
        return;
    }
    let mut bed = bed();
    bed.mirror_to_sink();
    bed.add_rule("latency>30ms");
    let server = bed.pod("server").addr(false);
    // The slow answers carry 203 so that the oracle can tell them from the fast 200s.
    let rec = bed.record("client", || {
        let urls = [
            url(server, PY, "/status/200"),
            url(server, PY, "/status/203?delay_ms=50"),
            url(server, PY, "/status/200?delay_ms=5"),
            url(server, PY, "/status/203?delay_ms=60"),
        ];
        assert_eq!(client::get_each(&bed.pod("client").ns, &urls), [200, 203, 200, 203]);
    });
    let expected = bed.check(&rec, |status, _| status == 203);
    assert_eq!((expected.triggered.len(), expected.untriggered().count()), (2, 2));
}

#[test]
fn handshake_time_is_positive_and_below_a_request_response_exchange() {
    if !require_root() {
        return;
    }
    let bed = bed();
    let server = bed.pod("server").addr(false);
    let urls: Vec<String> = (0..10).map(|_| url(server, PY, "/status/200")).collect();
    client::get_each(&bed.pod("client").ns, &urls);
    let hs = bed.histogram(HistKind::TcpHandshake, None).expect("a handshake histogram");
    // One per connection, measured once although each crosses two attached veths.
    assert_eq!(hs.count, 10);
    let handshake = hs.quantile(0.5).unwrap();
    let exchange = bed.histogram(HistKind::HttpResponse, Some(2)).unwrap().quantile(0.5).unwrap();
    assert!(
        handshake > Duration::ZERO && handshake < exchange,
        "handshake {handshake:?}, exchange {exchange:?}"
    );
}
