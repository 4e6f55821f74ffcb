#!/usr/bin/env bash
# Makes the local runtime base image without a registry: a minimal Debian bookworm root file
# system (debootstrap --variant=minbase, plus the one library the agent links that minbase
# lacks: libelf1), trimmed of documentation, imported into podman as the tag given (default
# localhost/mirror-base:bookworm). Cached: the root file system tarball is kept under
# /var/cache/mirror-agent/ and the image is imported again only when podman lacks it, so only
# the first run on a machine takes the few minutes debootstrap needs. Run as root.
set -euo pipefail

TAG="${1:-localhost/mirror-base:bookworm}"
CACHE="${MIRROR_IMAGE_CACHE:-/var/cache/mirror-agent}"
TARBALL="$CACHE/base-bookworm-minbase.tar"
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)

if "${PODMAN[@]}" image exists "$TAG"; then
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/base.lock"
flock 9
if ! "${PODMAN[@]}" image exists "$TAG"; then
    if [ ! -s "$TARBALL" ]; then
        root="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
        trap 'rm -rf "$root"' EXIT
        echo "debootstrap: bookworm minbase into $root (once per machine)"
        debootstrap --variant=minbase --include=libelf1 bookworm "$root" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
        rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
            "$root"/usr/share/locale/* "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/*
        tar -C "$root" --numeric-owner -cf "$TARBALL.tmp" .
        mv "$TARBALL.tmp" "$TARBALL"
    fi
    "${PODMAN[@]}" import --change 'CMD ["/bin/sh"]' "$TARBALL" "$TAG" >/dev/null
fi
echo "base image $TAG ready"
