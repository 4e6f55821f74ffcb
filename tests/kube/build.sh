#!/usr/bin/env bash
# Builds the tests' Kubernetes once and caches it: kube-apiserver, kubectl and the node's
# components (kubelet, kube-proxy, kube-scheduler, kube-controller-manager), all the same
# version so there is no skew, from the Kubernetes Go module (its staging modules replaced by
# their published versions, go.mod); etcd from its server module; CoreDNS, the cluster's DNS,
# from its own module at a pinned version (its dependencies are not the control plane's, so it
# is built apart). Prints the directory holding the binaries. Cold: about 15 minutes on 2 cores
# (the node's components about 3 of them, CoreDNS about 2); cached: instant.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for go in go /usr/local/go/bin/go; do
    if command -v "$go" >/dev/null && "$go" version | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
        GO="$go"
        break
    fi
done
: "${GO:?kube-apiserver v1.37 needs Go 1.26 or newer (none on PATH nor in /usr/local/go)}"
version="$(sed -n 's#^\tk8s.io/kubernetes \(v[0-9.]*\)$#\1#p' "$here/go.mod")"
key="$(cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$0" | sha256sum | cut -c1-16)"
out="${MIRROR_E2E_CACHE:-/var/cache/mirror-e2e}/kube-$version-$key"
COREDNS_VERSION=v1.15.0
bins=(kube-apiserver kubectl kubelet kube-proxy kube-scheduler kube-controller-manager etcd coredns)
missing=0
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
if ((missing)); then
    mkdir -p "$out.tmp"
    cd "$here"
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=$(cut -d. -f1 <<<"${version#v}")"
    ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$version")"
    for cmd in kube-apiserver kubectl kubelet kube-proxy kube-scheduler kube-controller-manager; do
        "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
    done
    "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" ./etcd >&2
    # Outside this module: CoreDNS's own go.mod decides its dependencies.
    (cd / && GOBIN="$out.tmp" GOFLAGS=-mod=mod "$GO" install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@$COREDNS_VERSION") >&2
    rm -rf "$out"
    mv "$out.tmp" "$out"
fi
echo "$out"
