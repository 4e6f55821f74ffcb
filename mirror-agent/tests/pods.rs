//! Pod identity: each attached veth is mapped to the pod behind it, from processes set up in
//! the pod's namespace as the kubelet sets up containers (environment, cgroup path, a mount
//! namespace with the container's hostname and service account files), from the namespace's
//! name when no process is in it, and from the interface's name when the peer is not in a
//! namespace of its own. Shown by `mirrorctl pods`, in status, in flows and in the metrics'
//! histogram labels; a pod that appears while the agent runs is found from its link event.

mod common;

use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::cluster::kubelet::{plug, pod_uid, PodProcess, PodSpec};
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::HTTP;
use mirror_e2e::topology::netns::{Netns, Topology};
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::servers::Server;

use common::{add_rule, bins, find, flows, pods, status, ATTACH, METRICS};

#[test]
fn veths_are_mapped_to_their_pods() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&["client", "server", "bare"]);
    // The server's container says who it is in its environment (downward API) and cgroup.
    let server_proc = PodProcess::start(
        &topo.pod("server").ns,
        &PodSpec {
            env_name: Some("web-0".into()),
            env_namespace: Some("shop".into()),
            hostname_env: Some("web-0".into()),
            uid: pod_uid(1),
            ..PodSpec::default()
        },
    );
    // The client's has a mount namespace of its own with a container's hostname and service
    // account files, and nothing in its environment but what the kubelet always sets.
    let client_proc = PodProcess::start(
        &topo.pod("client").ns,
        &PodSpec {
            container_files: Some(("curl-5c8d".into(), "tools".into())),
            uid: pod_uid(2),
            ..PodSpec::default()
        },
    );
    // Two ends of one veth pair in the node: no pod behind either.
    topo.node.sh("ip link add vethlocala type veth peer name vethlocalb && ip link set vethlocala up");

    let cfg = AgentConfig { metrics: METRICS.into(), ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&["vethclient", "vethserver", "vethbare", "vethlocala", "vethlocalb"], ATTACH);
    let mut listed = Vec::new();
    let resolved = wait_until(Duration::from_secs(5), || {
        listed = pods(&env);
        listed.len() == 5 && find(&listed, "vethclient").source == "hostname"
    });
    assert!(resolved, "{listed:#?}\n{}", agent.output());

    let server = find(&listed, "vethserver");
    assert_eq!(
        (server.name.as_str(), server.namespace.as_deref(), server.source.as_str()),
        ("web-0", Some("shop"), "env")
    );
    assert_eq!(server.uid, Some(pod_uid(1)));
    assert_eq!(server.container.as_deref(), Some(server_proc.container.as_str()));
    assert_eq!(server.pid, Some(server_proc.pid()));
    assert_eq!(server.netns.as_deref(), Some(topo.pod("server").ns.name()));
    assert_eq!(server.peer.as_deref(), Some("eth0"));
    let server_v4 = topo.pod("server").v4.to_string();
    let server_v6 = topo.pod("server").v6.to_string();
    assert!(server.addresses.contains(&server_v4) && server.addresses.contains(&server_v6), "{server:?}");

    let client = find(&listed, "vethclient");
    assert_eq!(
        (client.name.as_str(), client.namespace.as_deref(), client.uid.clone()),
        ("curl-5c8d", Some("tools"), Some(pod_uid(2)))
    );
    assert_eq!(client.pid, Some(client_proc.pid()));

    // No process: the namespace's name.
    let bare = find(&listed, "vethbare");
    assert_eq!((bare.name.as_str(), bare.source.as_str()), (topo.pod("bare").ns.name(), "netns"));
    assert_eq!(bare.addresses, [topo.pod("bare").v4.to_string(), topo.pod("bare").v6.to_string()]);
    // The peer in the node itself: the interface's name.
    for veth in ["vethlocala", "vethlocalb"] {
        let p = find(&listed, veth);
        assert_eq!(
            (p.name.as_str(), p.source.as_str(), p.netns.as_deref()),
            (veth, "interface", None),
            "{p:?}"
        );
    }

    // Shown in status.
    let st = status(&env);
    assert_eq!(st.pods.len(), 5, "{st:?}");
    let table = env.ctl_ok(&["status"]);
    assert!(table.lines().any(|l| l.contains("vethserver") && l.contains("shop/web-0")), "{table}");
    let table = env.ctl_ok(&["pods"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("vethclient") && l.contains("curl-5c8d") && l.contains("hostname")),
        "{table}"
    );

    // Flows name the pods of their endpoints.
    let id = add_rule(&env, "status=500");
    let cns = &topo.pod("client").ns;
    let server_ip = topo.pod("server").addr(false);
    let urls = ["/foo", "/bar"].map(|p| url(server_ip, HTTP, p));
    assert_eq!(client::get_keepalive(cns, &urls), [200, 500]);
    let all = flows(&env);
    let f = all.iter().find(|f| f.rule_id == Some(id)).unwrap_or_else(|| panic!("no mirrored flow: {all:?}"));
    let by_pod =
        |pod: &str| f.pods.iter().find(|p| p.pod == pod).unwrap_or_else(|| panic!("{pod} not in {f:?}"));
    assert_eq!(by_pod("shop/web-0").endpoint, format!("{server_v4}:{HTTP}"));
    assert_eq!(by_pod("shop/web-0").interface, "vethserver");
    assert!(by_pod("tools/curl-5c8d").endpoint.starts_with(&format!("{}:", topo.pod("client").v4)), "{f:?}");
    let table = env.ctl_ok(&["flows"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("tools/curl-5c8d,shop/web-0") && l.contains(&format!("rule {id} (500)"))),
        "{table}"
    );

    // The histograms of each interface carry its pod.
    let metrics = topo.node.sh(&format!("curl -sS --max-time 5 http://{METRICS}/metrics"));
    let labelled = metrics.lines().any(|l| {
        l.starts_with("mirror_http_response_seconds_count{")
            && l.contains("interface=\"vethserver\"")
            && l.contains("pod=\"shop/web-0\"")
    });
    assert!(labelled, "{metrics}");

    // A pod that appears while the agent runs: its container first, then its veth (as the CNI
    // plugin adds it); the link event makes the agent look.
    let late = Netns::new("late");
    let _late_proc = PodProcess::start(
        &late,
        &PodSpec {
            env_name: Some("late-0".into()),
            env_namespace: Some("batch".into()),
            uid: pod_uid(3),
            ..PodSpec::default()
        },
    );
    plug(&topo.node, &late, "vethlate", 40);
    agent.wait_attached(&["vethlate"], ATTACH);
    let found = wait_until(Duration::from_secs(3), || {
        pods(&env).iter().any(|p| p.interface == "vethlate" && p.label() == "batch/late-0")
    });
    assert!(found, "{:#?}", pods(&env));
    // Its address is set after the veth's last link event: found on a later look.
    let addressed =
        wait_until(Duration::from_secs(8), || find(&pods(&env), "vethlate").addresses == ["198.18.40.2"]);
    assert!(addressed, "{:#?}", find(&pods(&env), "vethlate"));
    // And when the veth goes, so does the pod.
    topo.node.sh("ip link del vethlate");
    let gone = wait_until(Duration::from_secs(3), || pods(&env).iter().all(|p| p.interface != "vethlate"));
    assert!(gone, "{:#?}", pods(&env));
    agent.terminate();
}
