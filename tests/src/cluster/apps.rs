//! The image of the workloads the cluster tests run ([`APPS_IMAGE`]): CoreDNS and the gRPC
//! stack (static Go binaries), and an HTTP server and client in perl, the client's record of
//! each answer in its log (read with `kubectl logs`).

use std::path::Path;
use std::process::Command;

use crate::cluster::control_plane::binaries;
use crate::cluster::podman::{self, run_ok, BASE_IMAGE};

/// The image with the test's programs: CoreDNS, the gRPC stack, the HTTP server and clients.
pub const APPS_IMAGE: &str = "localhost/mirror-e2e-apps:1";
/// An HTTP/1.1 server in perl (the base image has perl, not python): every request on a
/// kept-alive connection answered (until a `Connection: close`), `/fail...` with 500, anything
/// else with 200.
const HTTP_SERVER: &str = r#"use IO::Socket::INET;
$SIG{CHLD} = 'IGNORE';
my $port = $ARGV[0] || 8080;
my $s = IO::Socket::INET->new(LocalPort => $port, Listen => 128, ReuseAddr => 1) or die "listen: $!";
print "listening on $port\n";
while (1) {
    my $c = $s->accept or next;
    if (fork() == 0) {
        $c->autoflush(1);
        while (my $line = <$c>) {
            my ($path) = $line =~ m{^[A-Z]+ (\S+) HTTP} or last;
            my $close = 0;
            while (my $h = <$c>) { last if $h =~ /^\r?\n$/; $close = 1 if $h =~ /^Connection:\s*close/i }
            my ($code, $body) = $path =~ m{^/fail} ? (500, "failed\n") : (200, "ok\n");
            my $reason = $code == 500 ? "Internal Server Error" : "OK";
            print $c "HTTP/1.1 $code $reason\r\nContent-Type: text/plain\r\nContent-Length: "
                . length($body) . "\r\n\r\n$body";
            last if $close;
        }
        exit 0;
    }
    close $c;
}
"#;

/// An HTTP/1.1 client in perl: forever, one request per connection to `HOST PORT`, paths in
/// turn from the rest of the arguments; prints `http CLIENTPORT STATUS PATH` per answer (its
/// record, read with `kubectl logs`), `http-error WHAT` when a request fails.
const HTTP_CLIENT: &str = r#"use IO::Socket::INET;
$| = 1;
my ($host, $port, @paths) = @ARGV;
my $i = 0;
while (1) {
    my $path = $paths[$i++ % @paths];
    my $c = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => "tcp");
    if (!$c) { print "http-error connect $!\n"; select(undef, undef, undef, 0.5); next; }
    my $lport = $c->sockport;
    print $c "GET $path HTTP/1.1\r\nHost: $host\r\nConnection: close\r\n\r\n";
    my $status = <$c>;
    my ($code) = defined $status ? $status =~ m{^HTTP/1\.\d (\d{3})} : ();
    1 while <$c>;
    close $c;
    if ($code) { print "http $lport $code $path\n" } else { print "http-error read $lport\n" }
    select(undef, undef, undef, 0.3);
}
"#;

/// Builds [`APPS_IMAGE`]: the base image with CoreDNS and the gRPC stack (static Go binaries)
/// and the perl HTTP server and client; FROM and COPY only (no `RUN`: podman cannot run a
/// container to build on a host without CAP_SYS_RESOURCE).
#[track_caller]
pub fn build_apps_image(grpc_stack: &Path) {
    let ctx = tempfile::Builder::new().prefix("mirror-apps").tempdir().expect("a temp dir");
    let c = ctx.path();
    std::fs::copy(binaries().join("coredns"), c.join("coredns")).expect("copying coredns");
    std::fs::copy(grpc_stack, c.join("grpc-stack")).expect("copying the gRPC stack");
    std::fs::write(c.join("http-server.pl"), HTTP_SERVER).expect("writing the server");
    std::fs::write(c.join("http-client.pl"), HTTP_CLIENT).expect("writing the client");
    std::fs::write(
        c.join("Containerfile"),
        format!(
            "FROM {BASE_IMAGE}\nCOPY coredns grpc-stack /usr/local/bin/\nCOPY http-server.pl http-client.pl /usr/local/lib/\n"
        ),
    )
    .expect("writing the Containerfile");
    run_ok(Command::new(podman::repo_root().join("scripts/base-image.sh")).arg(BASE_IMAGE));
    run_ok(
        podman::podman().args(["build", "-q", "-t", APPS_IMAGE, "-f"]).arg(c.join("Containerfile")).arg(c),
    );
}
