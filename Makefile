# The two commands of a fresh machine (as root): `make demo` and `make test`.
# Both install what is missing first (scripts/install-deps.sh).

export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps build install test demo bench bench-traffic bench-mirror bench-churn bench-drops bench-quick reliability lint image image-source

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets --release

# mirror-agent and mirrorctl into $(PREFIX)/bin (default /usr/local/bin, on the PATH), the
# example configuration into /etc/mirror-agent/agent.yaml unless one is there, and a systemd
# unit for hosts without Kubernetes (not enabled: `systemctl enable --now mirror-agent`).
PREFIX ?= /usr/local
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
install: deps
	$(CARGO) build --release -p mirror-agent --bins
	install -D -m 0755 $(TARGET_DIR)/release/mirror-agent $(DESTDIR)$(PREFIX)/bin/mirror-agent
	install -D -m 0755 $(TARGET_DIR)/release/mirrorctl $(DESTDIR)$(PREFIX)/bin/mirrorctl
	test -e $(DESTDIR)/etc/mirror-agent/agent.yaml || install -D -m 0644 config/agent.yaml $(DESTDIR)/etc/mirror-agent/agent.yaml
	sed 's|@PREFIX@|$(PREFIX)|g' config/mirror-agent.service > $(TARGET_DIR)/mirror-agent.service
	install -D -m 0644 $(TARGET_DIR)/mirror-agent.service $(DESTDIR)$(PREFIX)/lib/systemd/system/mirror-agent.service

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

# Attach latency in a burst of 50 new veths under a running agent (TCX with expedited and
# normal RCU grace periods, tc) and where one attach's time goes; results in
# bench/RESULTS-churn.md (about 2 minutes).
bench-churn: deps
	$(CARGO) run --release -p mirror-bench -- churn --out bench/RESULTS-churn.md

# The kernel's drops under the agent: the lateness of a dropped packet's copy on the sink and
# what a flood of 100,000 drops costs (agent CPU, the drop program's ns per run); results in
# bench/RESULTS-drops.md (about 30 seconds).
bench-drops: deps
	$(CARGO) run --release -p mirror-bench -- drops --out bench/RESULTS-drops.md

# The benchmarks in their quick mode: a smoke test of the runners (about 3 minutes).
bench-quick: deps
	$(CARGO) run --release -p mirror-bench -- datapath --quick
	$(CARGO) run --release -p mirror-bench -- traffic --quick
	$(CARGO) run --release -p mirror-bench -- churn --quick
	$(CARGO) run --release -p mirror-bench -- drops --quick

# The reliability suite in its long form (`make test` runs the short one): differential
# fuzzing of the classifier over MIRROR_FUZZ_PACKETS frames (default 1,000,000; seed
# MIRROR_FUZZ_SEED), a burst of MIRROR_BURST_VETHS veths (default 50) and MIRROR_CHURN_VETHS
# veths churned (default 500) under the agent, MIRROR_FAULT_ROUNDS rounds (default 5) of
# faults injected under HTTP and iperf3 load, and a flood of MIRROR_FLOOD_FLOWS new flows
# (default 300,000). Needs root.
MIRROR_FUZZ_PACKETS ?= 1000000
MIRROR_BURST_VETHS ?= 50
MIRROR_CHURN_VETHS ?= 500
MIRROR_FAULT_ROUNDS ?= 5
MIRROR_FLOOD_FLOWS ?= 300000
reliability: deps
	MIRROR_FUZZ_PACKETS=$(MIRROR_FUZZ_PACKETS) $(CARGO) test --release -p mirror-bpf --test differential -- --nocapture
	MIRROR_BURST_VETHS=$(MIRROR_BURST_VETHS) MIRROR_CHURN_VETHS=$(MIRROR_CHURN_VETHS) \
		$(CARGO) test --release -p mirror-agent --test churn -- --nocapture --test-threads=1
	MIRROR_INPUT_FUZZ_CASES=4096 $(CARGO) test --release -p mirror-agent --test input_fuzz -- --nocapture
	MIRROR_FAULT_ROUNDS=$(MIRROR_FAULT_ROUNDS) $(CARGO) test --release -p mirror-agent --test faults -- --nocapture
	MIRROR_FLOOD_FLOWS=$(MIRROR_FLOOD_FLOWS) $(CARGO) test --release -p mirror-agent --test flood -- --nocapture

# Style and lints, as CI checks them before the tests: rustfmt, clang-format over the BPF C
# (.clang-format; vmlinux.h is generated) and clippy with warnings as errors. Clippy in the
# release profile, as `make test` builds: the build scripts' outputs (libbpf, the BPF objects and
# skeletons) are shared, not built twice.
BPF_C := $(filter-out %/vmlinux.h,$(wildcard mirror-bpf/src/bpf/*.bpf.c mirror-bpf/src/bpf/include/*.h))
lint: deps
	$(CARGO) fmt --all --check
	clang-format --dry-run --Werror $(BPF_C)
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings

# The node image from the binaries built here (quick): the local base image first (made once
# per machine by debootstrap, no registry needed), then docker/Dockerfile's runtime-prebuilt
# target; tagged as deploy/kustomization.yaml names it.
# A rebuild moves the tag to the new image and leaves the one it replaces untagged (<none> in
# podman images): that one is removed once the build has succeeded, if it differs from the new
# one and has no other tag left; podman rmi refuses it while a container uses it, and it stays.
IMAGE ?= localhost/mirror-agent:dev
PODMAN ?= podman --runtime runc --cgroup-manager cgroupfs
image: deps
	$(CARGO) build --release -p mirror-agent --bins
	scripts/base-image.sh localhost/mirror-base:bookworm
	mkdir -p docker/prebuilt
	strip -o docker/prebuilt/mirror-agent $${CARGO_TARGET_DIR:-target}/release/mirror-agent
	strip -o docker/prebuilt/mirrorctl $${CARGO_TARGET_DIR:-target}/release/mirrorctl
	old=$$($(PODMAN) image inspect --format '{{.ID}}' $(IMAGE) 2>/dev/null) || old=; \
	$(PODMAN) build -f docker/Dockerfile --target runtime-prebuilt \
		--build-arg RUNTIME_IMAGE=localhost/mirror-base:bookworm -t $(IMAGE) . || exit 1; \
	new=$$($(PODMAN) image inspect --format '{{.ID}}' $(IMAGE)) || exit 1; \
	if [ -n "$$old" ] && [ "$$old" != "$$new" ] && \
		[ "$$($(PODMAN) image inspect --format '{{len .RepoTags}}' $$old 2>/dev/null)" = 0 ]; then \
		$(PODMAN) rmi $$old >/dev/null 2>&1 || echo "kept the previous image $$old: podman rmi refused it" >&2; \
	fi

# The same image built from source in the builder stage, on public base images.
image-source:
	$(PODMAN) build -f docker/Dockerfile -t $(IMAGE) .
