# buildlock — see README.md. The two commands a newcomer needs: `make run`, `make test`.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
export PATH := $(LOCALBIN):$(PATH)

## Tool versions (pinned; each is built from the Go module proxy into ./bin).
K8S_VERSION ?= 1.37.2
CONTROLLER_TOOLS_VERSION ?= v0.23.0
HELM_VERSION ?= v3.22.0
GOLANGCI_LINT_VERSION ?= v2.15.0
HELM_DOCS_VERSION ?= v1.14.2
# Prometheus's Go module versions are v0.3XX.Y for Prometheus 3.XX.Y.
PROMETHEUS_VERSION ?= v0.316.0
KREW_VERSION ?= v0.4.3
KUSTOMIZE_VERSION ?= v5.8.2

ENVTEST_DIR ?= $(LOCALBIN)/k8s/$(K8S_VERSION)
KUBE_APISERVER ?= $(ENVTEST_DIR)/kube-apiserver
ETCD ?= $(ENVTEST_DIR)/etcd
KUBECTL ?= $(ENVTEST_DIR)/kubectl
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
# helm is built as Helm's release Makefile builds it (see $(HELM) below); the
# suffix keeps a plain `go install` build of the same version from being reused.
HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)-release
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
PROMTOOL ?= $(LOCALBIN)/promtool-$(PROMETHEUS_VERSION)
HELM_DOCS ?= $(LOCALBIN)/helm-docs-$(HELM_DOCS_VERSION)
# krew, and its manifest validator: `make release-rehearsal` validates the
# release's krew manifest (GoReleaser's) and installs the plugin with them.
KREW ?= $(LOCALBIN)/krew-$(KREW_VERSION)
KREW_VALIDATE ?= $(LOCALBIN)/validate-krew-manifest-$(KREW_VERSION)
# kustomize sets the image of the installer without Helm (make installer).
KUSTOMIZE ?= $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)

export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)
# envtest waits 20 s by default for etcd and kube-apiserver to be ready; on a
# loaded 2-core machine a kube-apiserver took up to 3 minutes (the chaos
# run's restarts at a load average of 60, 2026-12-03): a slow start is no
# broken setup.
export KUBEBUILDER_CONTROLPLANE_START_TIMEOUT ?= 3m

K8S_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=v$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION)))

GO_TEST_FLAGS ?= -race
FUZZTIME ?= 60s
# Each fuzz target stops after FUZZTIME; the timeout only bounds a hang.
FUZZ_TIMEOUT ?= 60m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC manifests from the Go types and markers.
	$(CONTROLLER_GEN) rbac:roleName=buildlock-manager crd paths="./api/..." paths="./internal/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## go fmt.
	go fmt ./...

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: test
# `make test` runs every Go test package in two groups, one after the
# other, each under an explicit `go test -timeout` (a bound on each package
# of the group), two packages at a time (-p 2: one per core of the 2-core
# machines we and CI use). Each timeout is two to three times the slowest
# package of its group on a loaded 2-core machine, so that a busy machine
# fails no CI run, while a hung test still ends, with every goroutine's
# stack, long before CI's 90 minutes (go's default of 10 minutes applied
# before: test/chart, 156 s on a quiet machine, hit it under load; issue
# 32). Measured with -race on 2026-12-03, load average 20-60 from other
# work (docs/runs/2026-12-03-make-test-loaded.md): the slow packages up to
# 8.6 minutes (test/chart 515 s, test/examples 505 s, internal/arbiter
# 468 s, test/chaos 148 s and its short run alone up to 560 s), the quick
# ones up to 46 s (pkg/lock). A package that outgrows its group fails with
# "panic: test timed out after": measure it again (go test -json gives
# each package's Elapsed), and raise the timeout or move the package, with
# the measurement, in the same change.
TEST_GROUPS := quick slow
TEST_PKGS_slow := ./cmd/kubectl-buildlock ./internal/arbiter ./internal/controller ./internal/window \
	./test/chaos ./test/chart ./test/docs ./test/examples
TEST_PKGS_quick = $(filter-out $(TEST_PKGS_slow),$(patsubst $(CURDIR)/%,./%,$(shell go list -f '{{.Dir}}' ./...)))
TEST_TIMEOUT_quick ?= 5m
TEST_TIMEOUT_slow ?= 30m
TEST_PARALLEL ?= 2

# go-test-group runs group $(1)'s packages, and notes the group in $$failed
# if they fail, so that every group runs and the recipe fails at the end.
define go-test-group
echo "+ go test $(GO_TEST_FLAGS) -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT_$(1)) -coverprofile cover-$(1).out $(TEST_PKGS_$(1))"; \
CHAOS_SEED=$${CHAOS_SEED:-1} KREW=$(KREW) KREW_VALIDATE=$(KREW_VALIDATE) \
	go test $(GO_TEST_FLAGS) -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT_$(1)) -coverprofile cover-$(1).out $(TEST_PKGS_$(1)) || failed="$$failed $(1)";
endef

# The short chaos run in `make test` uses a fixed workload seed (CHAOS_SEED,
# default 1) so that CI repeats the same program of operations and faults;
# `make chaos` draws a new seed each time to explore. The groups' coverage
# profiles are merged into cover.out.
test: manifests generate fmt vet envtest $(KREW) $(KREW_VALIDATE) ## Build missing tools, regenerate, and run every test with -race against a real API server.
	@failed=; rm -f cover-*.out; $(foreach g,$(TEST_GROUPS),$(call go-test-group,$(g))) \
	if ls cover-*.out > /dev/null 2>&1; then \
		{ head -n 1 "$$(ls cover-*.out | head -n 1)"; tail -q -n +2 cover-*.out; } > cover.out; rm -f cover-*.out; fi; \
	if [ -n "$$failed" ]; then echo "make test: go test failed in group(s):$$failed"; exit 1; fi

.PHONY: fuzz
fuzz: ## Fuzz every parser and the arbiter, FUZZTIME each.
	go test ./internal/arbiter -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime $(FUZZTIME) -timeout $(FUZZ_TIMEOUT)
	go test ./internal/window -run '^$$' -fuzz '^FuzzCalendar$$' -fuzztime $(FUZZTIME) -timeout $(FUZZ_TIMEOUT)
	go test ./pkg/lock -run '^$$' -fuzz '^FuzzName$$' -fuzztime $(FUZZTIME) -timeout $(FUZZ_TIMEOUT)
	go test ./pkg/lock -run '^$$' -fuzz '^FuzzDetectCI$$' -fuzztime $(FUZZTIME) -timeout $(FUZZ_TIMEOUT)
	go test ./cmd/kubectl-buildlock -run '^$$' -fuzz '^FuzzParseAcquire$$' -fuzztime $(FUZZTIME) -timeout $(FUZZ_TIMEOUT)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint with .golangci.yml.
	$(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: manifests generate verify-chart verify-tracked ## Fail when generated files (or the chart's copies of them) are stale, or git tracks a build output.
	@if [ -n "$$(git status --porcelain -- api config charts)" ]; then \
		echo "Generated files are stale; run 'make manifests generate' and commit:"; \
		git status --porcelain -- api config charts; git --no-pager diff -- api config charts | head -50; exit 1; fi

# Build outputs (bin/, dist/, /manager) are ignored; this catches one that was
# added anyway: an executable, or any file over 1 MiB.
.PHONY: verify-tracked
verify-tracked: ## Fail when git tracks an executable or a file over 1 MiB.
	hack/check-tracked.sh

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build bin/manager and bin/kubectl-buildlock.
	go build -o $(LOCALBIN)/manager ./cmd/manager
	go build -o $(LOCALBIN)/kubectl-buildlock ./cmd/kubectl-buildlock

# The release's images and archives are dated by the commit (reproducible).
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct)

##@ Tools

.PHONY: envtest
envtest: $(KUBE_APISERVER) $(ETCD) $(KUBECTL) ## Build the kube-apiserver, etcd and kubectl the tests run against.

# setup-envtest cannot download binaries here, so the control plane is built
# from the Go module proxy: hack/k8s pins k8s.io/kubernetes with its staging
# modules, hack/etcd pins etcd's server.
$(KUBE_APISERVER):
	@mkdir -p $(ENVTEST_DIR)
	cd hack/k8s && CGO_ENABLED=0 go build -trimpath -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(KUBECTL):
	@mkdir -p $(ENVTEST_DIR)
	cd hack/k8s && CGO_ENABLED=0 go build -trimpath -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

$(ETCD):
	@mkdir -p $(ENVTEST_DIR)
	cd hack/etcd && CGO_ENABLED=0 go build -trimpath -o $@ go.etcd.io/etcd/server/v3

$(CONTROLLER_GEN):
	$(call go-install-tool,$@,sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

# Helm's own Makefile sets its version and its default Kubernetes version with
# -ldflags, the latter from the minor of its k8s.io/client-go (v0.37 is
# Kubernetes 1.37). Without them a `go install` build reports Kubernetes
# v1.20, so `helm template` and `helm lint` fail a chart's kubeVersion unless
# --kube-version is passed. Read from Helm's go.mod only when helm is built.
HELM_K8S_MINOR = $(shell go mod download -json helm.sh/helm/v3@$(HELM_VERSION) | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$$/\1/p' \
	| xargs sed -n 's|^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*|\1|p')
HELM_LDFLAGS = -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))

$(HELM):
	$(if $(HELM_K8S_MINOR),,$(error cannot read the version of k8s.io/client-go from helm $(HELM_VERSION)'s go.mod))
	$(call go-install-tool,$@,helm.sh/helm/v3/cmd/helm,$(HELM_VERSION),-ldflags '$(HELM_LDFLAGS)')

$(HELM_DOCS):
	$(call go-install-tool,$@,github.com/norwoodj/helm-docs/cmd/helm-docs,$(HELM_DOCS_VERSION))

$(PROMTOOL):
	$(call go-install-tool,$@,github.com/prometheus/prometheus/cmd/promtool,$(PROMETHEUS_VERSION))

$(GOLANGCI_LINT):
	$(call go-install-tool,$@,github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

$(KREW):
	$(call go-install-tool,$@,sigs.k8s.io/krew/cmd/krew,$(KREW_VERSION))

$(KREW_VALIDATE):
	$(call go-install-tool,$@,sigs.k8s.io/krew/cmd/validate-krew-manifest,$(KREW_VERSION))

# go install names the binary kustomize (the module path ends in /v5).
$(KUSTOMIZE):
	@set -e; mkdir -p $(LOCALBIN); tmp=$$(mktemp -d); \
	echo "Installing sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)"; \
	GOBIN=$$tmp go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION); \
	mv $$tmp/kustomize $@; rm -rf $$tmp

# go-install-tool installs package $(2) at version $(3) as the versioned file
# $(1), with the go install flags $(4) if any.
define go-install-tool
@set -e; mkdir -p $(LOCALBIN); tmp=$$(mktemp -d); \
echo "Installing $(2)@$(3)"; \
GOBIN=$$tmp go install $(4) $(2)@$(3); \
mv $$tmp/$$(basename $(2)) $(1); rm -rf $$tmp
endef

include hack/install.mk hack/chaos.mk hack/bench.mk hack/examples.mk hack/release.mk
