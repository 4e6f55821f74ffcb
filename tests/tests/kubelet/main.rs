//! The product on a real single-node cluster ([`mirror_e2e::cluster::single_node`]): a kubelet
//! runs the DaemonSet that `kubectl apply -k` of an overlay over `deploy/` makes (only what a
//! user overrides: the node's paths, `attach.expedite_rcu`), with the image `make image`
//! builds imported into the node's containerd. Workloads as users run them: two Deployments of
//! an HTTP server answering 500s on `/fail` (`web`, `api`) and one of a gRPC server, each
//! behind a ClusterIP Service, and a client Deployment calling them by their DNS names
//! (CoreDNS). A `MirrorRule` selecting `web`: each of web's 500s from the rule on is on the
//! mirror exactly once, against the client's own record (`kubectl logs`); api's and the gRPC
//! server's flows, and web's 200s, never; the rule's status and the pod's Events as `kubectl`
//! shows them. Under the same capture of the sink: a rolling upgrade of the DaemonSet to a
//! second image tag (the new agent adopts the data path and the same sink: none of web's 500s
//! missed nor mirrored twice), kube-proxy switched from nftables to iptables mode (web's 500s
//! through iptables' NAT, each once), and web's pod rescheduled (a new veth and address: its
//! 500s mirrored once the agent has named it). Then `kubectl delete -k`: nothing of the
//! agent's left on the node (programs on the veths, pins, the sink).

mod install;
mod life;
mod uninstall;
mod verify;
mod workloads;

use std::time::Instant;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::Binaries;
use mirror_e2e::capture::tcpdump::Capture;
use mirror_e2e::cluster::apps::{build_apps_image, APPS_IMAGE};
use mirror_e2e::cluster::containerd;
use mirror_e2e::cluster::control_plane;
use mirror_e2e::cluster::podman::build_prebuilt;
use mirror_e2e::cluster::single_node::Cluster;
use mirror_e2e::workload::h2_stacks::build_grpc_go;
use mirror_e2e::workload::servers::go_toolchain;

use crate::workloads::{http_record, more_500s};

/// The agent's image, as deploy/kustomization.yaml names it.
const AGENT_IMAGE: &str = "localhost/mirror-agent:dev";
/// The tag an upgrade moves the DaemonSet to (the same image tagged anew: a new pod all the same).
const UPGRADE_TAG: &str = "upgrade";
/// The sink the agent makes (a veth pair on this kernel) and the peer that receives the copies.
const SINK_PEER: &str = "mirror0p";

#[test]
fn a_kubelet_runs_the_daemonset_and_its_agent_mirrors_one_services_failures() {
    if !require_root() || !containerd::available() || !control_plane::available() {
        return;
    }
    let t0 = Instant::now();
    let bins = Binaries::locate().expect("the agent's binaries (cargo build --release)");
    let go = go_toolchain().expect("a Go toolchain (scripts/install-deps.sh)");
    let grpc = build_grpc_go(&go);
    build_prebuilt(&bins, AGENT_IMAGE);
    build_apps_image(&grpc);
    let images = t0.elapsed();

    let before = uninstall::HostBefore::now();
    let mut c = Cluster::start();
    eprintln!("cluster up: {:?}", c.timings);
    for image in [AGENT_IMAGE, APPS_IMAGE] {
        c.import_image(image);
    }
    let dns = c.install_dns();
    // The workloads, by DNS name through ClusterIP Services.
    let workloads_up = workloads::start(&c);

    // Installed as a user installs it.
    let overlay = tempfile::Builder::new().prefix("mirror-overlay").tempdir().expect("a temp dir");
    let installed = install::install(&c, overlay.path());

    // The capture of the mirror, then the rule. From there on, every web 500 is mirrored: the
    // record's lines after this point count.
    let pcap = tempfile::Builder::new().prefix("mirror-sink").tempdir().expect("a temp dir");
    let capture = Capture::start(&c.node.node, SINK_PEER, "", &pcap.path().join("sink.pcap"));
    install::rule(&c, &installed.pod);
    let (web_from, api_from) = (http_record(&c, "web").len(), http_record(&c, "api").len());
    more_500s(&c, "before the upgrade", 5);

    // A node's life under the same capture.
    let upgrade = life::upgrade(&c, overlay.path(), &installed.pod, web_from);
    let switch = life::switch_proxy(&mut c, web_from);
    let strict_until = http_record(&c, "web").len();
    let resched = life::reschedule(&c);

    let windows = verify::Windows {
        web_from,
        api_from,
        upgrade: &upgrade,
        switch: &switch,
        strict_until,
        rescheduled_from: resched.from,
        new_web: &resched.new_web,
    };
    let checked = verify::exactly_once(&c, capture, &windows);
    let hits = verify::status_and_events(&c, checked.web_500s, &resched.new_web);

    let uninstall = uninstall::uninstall(&c, overlay.path());
    uninstall::private_mount_refused(&c, overlay.path());

    eprintln!(
        "images {:.1} s; cluster {:.1} s (control plane {:.1} s, containerd {:.1} s, node Ready {:.1} s); CoreDNS {:.1} s; \
         agent rolled out {:.1} s; workloads {:.1} s; upgrade {:.1} s (0 of web's 500s missed); \
         kube-proxy switched to iptables in {:.1} s, {} of web's 500s missed meanwhile, {} through iptables after; \
         web rescheduled in {:.1} s, {} of its 500s before the agent followed it; \
         web 500s mirrored {}, each once; hits {hits}; uninstall {:.1} s; node components {} MiB; total {:.1} s",
        images.as_secs_f64(),
        c.timings.total.as_secs_f64(),
        c.timings.control_plane.as_secs_f64(),
        c.timings.containerd.as_secs_f64(),
        c.timings.node_ready.as_secs_f64(),
        dns.as_secs_f64(),
        installed.rollout.as_secs_f64(),
        workloads_up.as_secs_f64(),
        upgrade.took.as_secs_f64(),
        switch.took.as_secs_f64(),
        checked.missed_at_switch,
        checked.after_switch,
        resched.took.as_secs_f64(),
        checked.missed_at_reschedule,
        checked.web_500s,
        uninstall.as_secs_f64(),
        c.node_memory() >> 20,
        t0.elapsed().as_secs_f64()
    );
    uninstall::torn_down(c, before);
}
