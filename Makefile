# lbd — build, test and benchmark. Run `make help` for the targets.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
export GOFLAGS := -buildvcs=false

BUF       := go run github.com/bufbuild/buf/cmd/buf@v1.75.0
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT := go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/lbd-dev/lbd/daemon/lbd.Version=$(VERSION) -X github.com/lbd-dev/lbd/lbctl.Version=$(VERSION)
# Release tools, built from the Go module proxy at these versions into a cache that
# survives between runs (make release-tools); the tests find them through these variables.
TOOLS_DIR ?= $(HOME)/.cache/lbd/tools
HELM_VERSION := v3.22.0
GORELEASER_VERSION := v2.15.1
export HELM := $(TOOLS_DIR)/helm-$(HELM_VERSION)/helm
export GORELEASER := $(TOOLS_DIR)/goreleaser-$(GORELEASER_VERSION)/goreleaser
DEBIAN_PACKAGES := clang llvm libbpf-dev bpftool iproute2 ethtool tshark tcpdump bird2 frr \
	nftables iperf3 netcat-openbsd iputils-ping curl git make python3 systemd strace man-db prometheus

.PHONY: help deps build release-tools package check-package k8s-testbin etcd-testbin docs check-docs generate check-generated test integration bench demo demo-down lint check clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

deps: ## install the Debian packages and Go modules the build and tests need (root)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
		if [ -n "$$missing" ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		fi; \
	else echo "deps: not root or no apt-get; skipping Debian packages (privileged tests will skip)"; fi
	go mod download

build: ## build bin/lbd, bin/lbctl and bin/lbd-k8s-adapter
	go build -ldflags "$(LDFLAGS)" -o bin/lbd ./cmd/lbd
	go build -ldflags "$(LDFLAGS)" -o bin/lbctl ./cmd/lbctl
	go build -ldflags "$(LDFLAGS)" -o bin/lbd-k8s-adapter ./cmd/lbd-k8s-adapter

release-tools: $(HELM) $(GORELEASER) ## build helm and goreleaser (cached in ~/.cache/lbd/tools)

$(HELM):
	GOBIN=$(dir $@) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(GORELEASER):
	GOBIN=$(dir $@) go install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)

package: $(GORELEASER) ## build the release (binaries, tarballs, .deb packages) as a snapshot into dist/
	$(GORELEASER) release --snapshot --clean

check-package: $(GORELEASER) ## build the .deb packages for this machine and check them installed in a throwaway root
	go test -count=1 -v -timeout 30m ./examples/packaging/...

k8s-testbin: ## build kube-apiserver, etcd and kubectl for the adapter's and manifests' tests (cached in ~/.cache/lbd)
	cmd/lbd-k8s-adapter/testbin/build.sh

etcd-testbin: ## build the etcd server and etcdctl that the fleet store's tests run (cached in ~/.cache/lbd)
	internal/etcdtest/testbin/build.sh

generate: ## regenerate protobuf and bpf2go output (committed) with the pinned toolchain
	$(BUF) generate
	go generate ./bpf/... ./internal/xdpgen/...

check-generated: generate ## fail if generated code differs from what is committed
	@git diff --exit-code --stat -- proto bpf internal/xdpgen || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto bpf internal/xdpgen)" || { git status --porcelain -- proto bpf internal/xdpgen; echo "generate left untracked files"; exit 1; }

docs: ## regenerate docs/reference (configuration and API references) from the Go code and the proto files
	@img=$$(mktemp --suffix=.binpb) && trap 'rm -f "$$img"' EXIT && \
		$(BUF) build -o "$$img" && \
		go run ./daemon/config/docgen -image "$$img" -out docs/reference

check-docs: docs ## fail if docs/reference differs from what is committed
	@git diff --exit-code --stat -- docs/reference || { echo "docs/reference is stale: run 'make docs' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- docs/reference)" || { git status --porcelain -- docs/reference; echo "docs/reference has uncommitted files: run 'make docs' and commit"; exit 1; }

lint: ## gofmt, go vet, staticcheck, buf lint and buf breaking against main
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	go vet ./...
	$(STATICCHECK) ./...
	$(BUF) lint
	@if git rev-parse --verify -q main >/dev/null; then $(BUF) breaking --against '.git#branch=main'; fi

# GoBGP races with itself when two speakers share a process (its tests start two), so
# the BGP packages run without the race detector.
NORACE_PKGS := ./daemon/bgp/... ./daemon/advertise/...
test: ## unit, BPF and in-process tests (privileged ones skip unless root)
	go test -race -count=1 $$(go list ./... | grep -v -e /daemon/bgp -e /daemon/advertise -e /integration -e /examples/packaging)
	go test -count=1 $(NORACE_PKGS)

integration: build ## end-to-end tests in network namespaces (root)
	LBD_BIN_DIR=$(CURDIR)/bin go test -count=1 -v -timeout 20m ./integration/...

bench: build ## benchmarks, 5 runs each, summarized by benchstat
	LBD_BIN_DIR=$(CURDIR)/bin go test -run '^$$' -bench . -benchmem -count 5 -timeout 60m ./... | tee bench.txt
	$(BENCHSTAT) bench.txt

check: deps check-generated check-docs lint k8s-testbin etcd-testbin release-tools test integration check-package ## everything CI runs: the README's test command

demo: deps build ## install what is needed; build; LB and backend nodes in namespaces with traffic
	./examples/demo-netns.sh up

demo-down: ## stop the demo and remove what it created
	./examples/demo-netns.sh down

clean: ## remove build output
	rm -rf bin bench.txt
