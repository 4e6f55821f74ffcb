# The two commands of a fresh machine (as root): `make demo` and `make test`.
# Both install what is missing first (scripts/install-deps.sh).

export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps build test demo bench bench-traffic bench-mirror bench-quick lint image image-source

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets --release

# Every test: unit tests, BPF_PROG_TEST_RUN tests and end-to-end tests in network namespaces.
# Needs root; with CI=true a test that lacks a privilege fails instead of skipping.
test: deps
	$(CARGO) test --workspace --release

# Builds the agent, then the demo, which runs it from the same target directory: creates a
# namespace topology with a service that answers some 500s, mirrors the triggered flows and
# shows them, then cleans up.
demo: deps
	$(CARGO) build --release -p mirror-agent --bins
	$(CARGO) run --release -p mirror-e2e --bin demo

# Data-path cost per packet (BPF_PROG_TEST_RUN), results in bench/RESULTS-datapath.md.
bench: deps
	$(CARGO) run --release -p mirror-bench -- datapath --out bench/RESULTS-datapath.md

# Overhead on real traffic (iperf3, sockperf, HTTP) with no agent, the agent, a static tc
# mirror and tcpdump, in network namespaces; results in bench/RESULTS.md (about 30 minutes).
bench-traffic: deps
	$(CARGO) run --release -p mirror-bench -- traffic --out bench/RESULTS.md

# What one copied packet costs per sink kind and way of copying (clone to a sink's egress or
# ingress, act_mirred): BPF_PROG_TEST_RUN, real traffic, perf, captures; results in
# bench/RESULTS-mirror-path.md (about 12 minutes).
bench-mirror: deps
	$(CARGO) run --release -p mirror-bench -- mirror-path --out bench/RESULTS-mirror-path.md

# Both benchmarks in their quick mode: a smoke test of the runners (about 2 minutes).
bench-quick: deps
	$(CARGO) run --release -p mirror-bench -- datapath --quick
	$(CARGO) run --release -p mirror-bench -- traffic --quick

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The node image from the binaries built here (quick): the local base image first (made once
# per machine by debootstrap, no registry needed), then docker/Dockerfile's runtime-prebuilt
# target; tagged as deploy/kustomization.yaml names it.
IMAGE ?= localhost/mirror-agent:dev
PODMAN ?= podman --runtime runc --cgroup-manager cgroupfs
image: deps
	$(CARGO) build --release -p mirror-agent --bins
	scripts/base-image.sh localhost/mirror-base:bookworm
	mkdir -p docker/prebuilt
	strip -o docker/prebuilt/mirror-agent $${CARGO_TARGET_DIR:-target}/release/mirror-agent
	strip -o docker/prebuilt/mirrorctl $${CARGO_TARGET_DIR:-target}/release/mirrorctl
	$(PODMAN) build -f docker/Dockerfile --target runtime-prebuilt \
		--build-arg RUNTIME_IMAGE=localhost/mirror-base:bookworm -t $(IMAGE) .

# The same image built from source in the builder stage, on public base images.
image-source:
	$(PODMAN) build -f docker/Dockerfile -t $(IMAGE) .
