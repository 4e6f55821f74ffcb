#!/usr/bin/env bash
# Installs what building, testing, linting and the demo need on Debian/Ubuntu: the BPF toolchain
# and clang-format, the network tools the tests and benchmarks drive (iproute2, iptables,
# nftables, conntrack, tcpdump, tshark, tmux, curl, nginx, python3, iperf3, wrk, sockperf;
# nghttp2's clients, grpcio and h2 for the HTTP/2 test; Python's Prometheus parser and the
# reference Community ID hashing), the Go toolchain and Node.js with npm for the accuracy and
# HTTP/2 tests' server stacks (when no go/node/npm is found already), podman, runc and
# debootstrap for the image, kubernetes-validate for the manifests, containerd, the CNI plugins
# and crictl (built from its Go module) for the real node's tests, dnsmasq and dig for the DNS
# test, the cluster tests' Kubernetes and CoreDNS (in CI), and Rust. Idempotent: only
# what is missing is installed. Run as root.
set -euo pipefail

PACKAGES=(
    build-essential pkg-config clang llvm libelf-dev zlib1g-dev   # libbpf + BPF C
    clang-format                                                   # make lint: the BPF C's style
    ca-certificates                                                # https for rustup
    iproute2 ethtool bpftool linux-perf                            # links, tc, netns, BPF; bench stage profile
    iptables nftables conntrack                                    # kube-proxy-like Service NAT
    tcpdump tshark                                                 # captures on the mirror
    tmux                                                           # mirrorctl top's test (a terminal)
    curl nginx-light python3 iperf3 wrk sockperf                   # servers, clients, load
    openssl                                                        # the test API server's signing key
    nghttp2-client python3-grpcio python3-h2                       # HTTP/2 and gRPC test: nghttp, h2load; grpcio; an h2c server
    python3-pip python3-prometheus-client                          # checks: Community IDs, /metrics parsed
    procps psmisc util-linux coreutils git                         # sysctl, taskset, nsenter, timeout
    kmod                                                           # modprobe br_netfilter, where it is a module
    podman runc debootstrap binutils                               # the image: base, build, run (tests/tests/image.rs)
    python3-venv                                                   # kubernetes-validate (tests/tests/manifests.rs)
    containerd containernetworking-plugins                         # the real node (tests/tests/real_node.rs)
    systemd                                                        # systemd-analyze verify of the unit (mirror-agent/tests/service_unit.rs)
    dnsmasq-base bind9-dnsutils                                    # the DNS test: a resolver, dig (tests/tests/dns/)
)

# The accuracy test builds a Go net/http server and runs a Node http one (it fails without them
# when CI=true). A go or node already installed another way (/usr/local/go, nodesource) is kept.
# The HTTP/2 test builds grpc-go (a Go module, from the Go module proxy) and installs
# @grpc/grpc-js with npm (from the npm registry), each once into its cache (/var/cache/mirror-e2e);
# the DNS test builds a client on Go's resolver (tests/dns/resolver) the same way, and runs the
# cluster tests' CoreDNS (tests/kube/build.sh, below); the recorder's upload test builds its
# S3-compatible server the same way (tests/s3: gofakes3, MIT, with its bbolt backend; about 30 s
# of CPU cold, its four modules from the Go module proxy).
command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || PACKAGES+=(golang-go)
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # tshark asks whether non-root users may capture; root does the capturing here.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "installing Rust (rustup, stable, minimal profile)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
fi

# The reference implementation of Community ID hashing (PyPI `communityid`, pure Python), which
# the events test checks the agent's IDs against; kept out of the system's Python packages.
PYLIB=/usr/local/lib/mirror-tests/python
if ! PYTHONPATH=$PYLIB /usr/bin/python3 -c "import communityid" 2>/dev/null; then
    echo "installing communityid (Python) into $PYLIB"
    /usr/bin/python3 -m pip install -q --target "$PYLIB" communityid==1.5.0
fi

# The manifests' schema check: kubernetes-validate from PyPI in a venv of its own (it ships the
# Kubernetes schemas: offline once installed).
KV=/opt/kubernetes-validate
if [ ! -x "$KV/bin/kubernetes-validate" ]; then
    echo "installing kubernetes-validate into $KV"
    /usr/bin/python3 -m venv "$KV"
    "$KV/bin/pip" install -q kubernetes-validate
fi

# crictl, the kubelet's view of the CRI, which the real node's tests drive containerd with: no
# Debian package has it, so it is built once from its Go module (a minute or two) into
# /usr/local/bin. The version is pinned; cri-tools needs Go 1.24 or later.
CRICTL_VERSION=v1.34.0
if ! crictl --version 2>/dev/null | grep -qx "crictl version $CRICTL_VERSION"; then
    GO="$(command -v go || echo /usr/local/go/bin/go)"
    echo "building crictl $CRICTL_VERSION (sigs.k8s.io/cri-tools) into /usr/local/bin"
    GOBIN=/usr/local/bin GOFLAGS=-mod=mod "$GO" install \
        -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
        "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi

# The cluster tests' Kubernetes (tests/kube/build.sh): kube-apiserver, kubectl, kubelet,
# kube-proxy, kube-scheduler, kube-controller-manager and etcd from their Go modules, and CoreDNS
# from its own, built once into /var/cache/mirror-e2e: cold about 15 minutes on 2 cores (the
# node's components about 3, CoreDNS about 4 with its modules' downloads), cached at once. In CI
# here, before the tests' clock; elsewhere the first cluster test builds them (so `make demo`
# does not wait for them).
if [ "${CI:-}" = true ]; then
    echo "building the cluster tests' Kubernetes (tests/kube/build.sh; cached after the first time)"
    bash "$(dirname "$0")/../tests/kube/build.sh" >/dev/null
fi

# The kernel must expose BTF for CO-RE.
[ -r /sys/kernel/btf/vmlinux ] || { echo "this kernel has no BTF (/sys/kernel/btf/vmlinux)" >&2; exit 1; }
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
echo "dependencies ready"
