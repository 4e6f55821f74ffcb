#!/usr/bin/env bash
# Builds the tests' control plane once and caches it: kube-apiserver and kubectl (the same
# version, so no skew) from the Kubernetes Go module (its staging modules replaced by their
# published versions, go.mod) and etcd from its server module. Prints the directory holding the
# binaries. Cold: about 10 minutes; cached: instant.
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
if [[ ! -x "$out/kube-apiserver" || ! -x "$out/kubectl" || ! -x "$out/etcd" ]]; then
    mkdir -p "$out.tmp"
    cd "$here"
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=$(cut -d. -f1 <<<"${version#v}")"
    ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$version")"
    "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
    "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp/kubectl" k8s.io/kubernetes/cmd/kubectl >&2
    "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" ./etcd >&2
    rm -rf "$out"
    mv "$out.tmp" "$out"
fi
echo "$out"
