//! `mirrorctl top` in a real terminal (a detached tmux session of its own server) against an
//! agent mirroring real traffic: the screen shows the rules and their triggers, the mirrored flow
//! with its endpoints and pods, the mirror's rate, and the DNS responses by rcode with the client
//! pod's failed lookups (dig's NXDOMAINs from a real resolver), the kernel's drops by pod (a
//! connection to a port nothing listens on, dropped by the server pod's stack); `q` ends it.

mod common;

use std::process::Command;
use std::time::Duration;

use mirror_bpf::testing::require_root;
use mirror_e2e::agent::{AgentConfig, AgentEnv};
use mirror_e2e::cluster::kubelet::{pod_uid, PodProcess, PodSpec};
use mirror_e2e::proc::wait_until;
use mirror_e2e::scenario::{HTTP, PODS};
use mirror_e2e::topology::netns::Topology;
use mirror_e2e::workload::client::{self, url};
use mirror_e2e::workload::dns::{self, Lookup, QType, Rcode, Resolver, ResolverKind, Transport};
use mirror_e2e::workload::servers::Server;

use common::{bins, ATTACH, VETHS};

/// A tmux server of the test's own (`-L`), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("running tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.cmd(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn top_shows_flows_pods_and_rules_and_quits_on_q() {
    if !require_root() {
        return;
    }
    let topo = Topology::without_sink(&PODS);
    let spec = |name: &str, n| PodSpec {
        env_name: Some(name.into()),
        env_namespace: Some("shop".into()),
        uid: pod_uid(n),
        ..PodSpec::default()
    };
    let _client = PodProcess::start(&topo.pod("client").ns, &spec("shopper-0", 1));
    let _server = PodProcess::start(&topo.pod("server").ns, &spec("web-0", 2));
    let cfg =
        AgentConfig { rules: vec!["status=500".into(), "dns=nxdomain".into()], ..AgentConfig::default() };
    let env = AgentEnv::new(&bins(), &topo.node, &cfg);
    let _nginx = Server::nginx(topo.pod("server"), HTTP, env.dir());
    let _resolver = Resolver::start(&ResolverKind::Dnsmasq, topo.pod("server"), env.dir());
    let agent = env.start(&[]);
    agent.wait_attached(&VETHS, ATTACH);

    let tmux = Tmux { socket: format!("me2e-top-{}", std::process::id()) };
    let command = format!("exec {} --socket {} top", bins().ctl.display(), env.socket().display());
    let out = tmux.cmd(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "50", &command]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));

    // Traffic: a 500 on a keep-alive connection that then goes on (mirrored), and a lookup of a
    // name that does not exist, every half second.
    let server = topo.pod("server").addr(false);
    let client_ns = &topo.pod("client").ns;
    let mut screen = String::new();
    let mut port = 30_000;
    let shown = wait_until(Duration::from_secs(15), || {
        let urls = ["/foo", "/bar", "/foo"].map(|p| url(server, HTTP, p));
        assert_eq!(client::get_keepalive(client_ns, &urls), [200, 500, 200]);
        port += 1;
        let lookup = Lookup {
            name: format!("missing-{port}.test"),
            qtype: QType::A,
            server: std::net::SocketAddr::new(server, 53),
            local: std::net::SocketAddr::new(topo.pod("client").addr(false), port),
            transport: Transport::Udp,
        };
        let looked = dns::dig(client_ns, &[lookup], 1, env.dir());
        assert_eq!(looked[0].rcode(), Some(Rcode::NXDOMAIN), "{looked:?}");
        {
            // Refused: the server pod's stack drops the SYN (no_socket).
            let _inside = client_ns.enter();
            let closed = std::net::SocketAddr::new(server, 9);
            assert!(std::net::TcpStream::connect_timeout(&closed, Duration::from_secs(1)).is_err());
        }
        std::thread::sleep(Duration::from_millis(500));
        screen = tmux.screen();
        screen.contains("shop/web-0")
            && screen.contains("shop/shopper-0")
            && screen.contains("rule 1 (500)")
            && screen.contains(&format!("{server}:{HTTP}"))
            && screen.lines().any(|l| l.contains("status=500") && !l.contains(" 0 "))
            && screen.lines().any(|l| l.contains("responses: NOERROR") || l.contains("responses: NXDOMAIN"))
            && screen
                .lines()
                .any(|l| l.contains("shop/shopper-0") && l.contains("NXDOMAIN") && l.contains(".test"))
            && screen.lines().any(|l| l.contains("kernel drops by pod: shop/web-0"))
    });
    assert!(shown, "top does not show the flow, its pods and rule:\n{screen}\n{}", agent.output());
    eprintln!("{screen}");
    assert!(screen.contains("mirror ") && screen.contains("pkt/s"), "{screen}");
    assert!(screen.contains("triggers per rule") && screen.contains("busiest flows"), "{screen}");
    assert!(screen.contains("DNS: responses by rcode, failed lookups by pod"), "{screen}");

    let out = tmux.cmd(&["send-keys", "-t", "top", "q"]);
    assert!(out.status.success());
    let quit = wait_until(Duration::from_secs(3), || !tmux.alive());
    assert!(quit, "top did not exit on q:\n{}", tmux.screen());
    agent.terminate();
}
