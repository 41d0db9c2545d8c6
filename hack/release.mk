# hack/release.mk: what a v* tag publishes, built by one make target each
# (each writes a folder of its own under dist/), and `make release-rehearsal`,
# which builds all of it offline, pushes it to an in-process registry, signs
# and verifies it, and installs it as a user would. The release workflow
# (.github/workflows/release.yml) runs the same targets with
# REGISTRY=ghcr.io/buildlock after `.ci/run` passed.
# Included from the Makefile, whose variables it uses (LOCALBIN, HELM,
# KUBECTL, KUSTOMIZE, KREW, KREW_VALIDATE, ACTIONLINT, SOURCE_DATE_EPOCH).

GORELEASER_VERSION ?= v2.15.1
GORELEASER ?= $(LOCALBIN)/goreleaser-$(GORELEASER_VERSION)
KO_VERSION ?= v0.18.1
KO ?= $(LOCALBIN)/ko-$(KO_VERSION)

# The release: charts/buildlock/Chart.yaml's version, which test/release
# holds every other version reference to; the workflow refuses a tag that
# is not v$(RELEASE_VERSION).
RELEASE_VERSION ?= $(shell sed -n 's/^version: *//p' charts/buildlock/Chart.yaml)
RELEASE_TAG ?= v$(RELEASE_VERSION)
# Where the images and the chart go: REGISTRY/buildlock (the manager),
# REGISTRY/kubectl-buildlock (the plugin), oci://REGISTRY/charts/buildlock.
REGISTRY ?= ghcr.io/buildlock
# Extra flags of `helm push` (--plain-http for the rehearsal's registry).
HELM_PUSH_FLAGS ?=
# The images' bases, pinned by digest in the Dockerfiles that Dependabot
# updates: the manager's is the Dockerfile's final stage.
MANAGER_BASE ?= $(shell sed -n 's/^FROM \([^ ]*distroless[^ ]*\)$$/\1/p' Dockerfile)
PLUGIN_BASE ?= $(shell sed -n 's/^FROM \([^ ]*\)$$/\1/p' hack/images/plugin-base.Dockerfile)
# GoReleaser's flags: by default the rehearsal's (no signing, SBOMs or
# publishing, and a tag that need not exist yet); the workflow publishes.
GORELEASER_FLAGS ?= --skip=validate,publish,announce,sign,sbom
GORELEASER_CONFIG ?= .goreleaser.yaml
# The plugin's platforms the rehearsal builds archives for: all (what a tag
# publishes; the release workflow's rehearsal) or linux (amd64 and arm64,
# the images' platforms, which the rehearsal builds anyway: .ci/run's, to
# stay within CI's time; the other four are cross-compiles of the same code).
REHEARSAL_PLATFORMS ?= all
IMAGE_LABELS = --image-label=org.opencontainers.image.source=https://github.com/buildlock/buildlock \
	--image-label=org.opencontainers.image.licenses=Apache-2.0 \
	--image-label=org.opencontainers.image.version=$(RELEASE_TAG)

##@ Release

.PHONY: release-archives
release-archives: $(GORELEASER) ## dist/goreleaser: the plugin's archives for every platform, checksums.txt, the krew manifest (GoReleaser).
	GORELEASER_CURRENT_TAG=$(RELEASE_TAG) $(GORELEASER) release --clean --config=$(GORELEASER_CONFIG) $(GORELEASER_FLAGS)

# ko-build builds and pushes image $(1) of .ko.yaml's build $(2) on base $(3)
# (both platforms, with an SPDX SBOM), and writes its reference by digest to
# dist/images/$(1).ref (ko's first line: the index; the platforms' images
# follow) and its SBOMs to dist/images/$(1).sbom/.
define ko-build
	rm -rf dist/images/$(1).ref dist/images/$(1).sbom; mkdir -p dist/images/$(1).sbom
	RELEASE_TAG=$(RELEASE_TAG) SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) KO_DATA_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
	KO_DEFAULTBASEIMAGE=$(3) KO_DOCKER_REPO=$(REGISTRY)/$(1) \
		$(KO) build --bare --tags=$(RELEASE_VERSION) --sbom=spdx --sbom-dir=dist/images/$(1).sbom \
		$(IMAGE_LABELS) --image-label=org.opencontainers.image.title=$(1) \
		--image-refs=dist/images/$(1).ref $(2)
endef

.PHONY: release-images
release-images: $(KO) ## dist/images: build and push the manager's and the plugin's images (linux/amd64, arm64) with their SBOMs to REGISTRY (ko).
	$(call ko-build,buildlock,./cmd/manager,$(MANAGER_BASE))
	$(call ko-build,kubectl-buildlock,./cmd/kubectl-buildlock,$(PLUGIN_BASE))

.PHONY: release-chart
release-chart: $(HELM) ## dist/chart: package the chart and push it to oci://REGISTRY/charts.
	rm -rf dist/chart; mkdir -p dist/chart
	$(HELM) package charts/buildlock --destination dist/chart
	$(HELM) push dist/chart/buildlock-$(RELEASE_VERSION).tgz oci://$(REGISTRY)/charts $(HELM_PUSH_FLAGS)

.PHONY: release-installer
release-installer: $(KUSTOMIZE) ## dist/install: install.yaml, config/default with the release's image in REGISTRY.
	$(MAKE) --no-print-directory installer IMG=$(REGISTRY)/buildlock:$(RELEASE_VERSION) INSTALLER=dist/install/install.yaml

.PHONY: release-tekton
release-tekton: ## dist/tekton: the Tekton Task with the plugin's image by the digest release-images pushed.
	@test -s dist/images/kubectl-buildlock.ref || { echo "no dist/images/kubectl-buildlock.ref: run make release-images first"; exit 1; }
	rm -rf dist/tekton; mkdir -p dist/tekton
	hack/tekton-pin.sh "$(REGISTRY)/kubectl-buildlock:$(RELEASE_VERSION)@$$(sed -n '1s/.*@//p' dist/images/kubectl-buildlock.ref)" \
		< tekton/task/buildlock-deploy/0.1/buildlock-deploy.yaml > dist/tekton/buildlock-deploy.yaml

# The archives come last: GoReleaser attaches the other targets' files to
# the GitHub release.
.PHONY: release
release: release-images release-chart release-installer release-tekton release-archives ## Build and push everything a tag publishes, to REGISTRY (the workflow's; see release-rehearsal).

# The rehearsal is a Go module of its own (test/rehearsal), so that the
# sigstore libraries it signs with stay out of the operator's go.mod. It
# builds with -race, as `make test` does, so that the two share the Go build
# cache of client-go and controller-runtime.
REHEARSAL_TIMEOUT ?= 40m
.PHONY: release-rehearsal
release-rehearsal: envtest $(GORELEASER) $(KO) $(HELM) $(KUSTOMIZE) $(KREW) $(KREW_VALIDATE) ## Build the release offline into an in-process registry, sign and verify it, install it with helm, kubectl and krew on a local control plane, and run a claim through each.
	cd test/rehearsal && GORELEASER=$(GORELEASER) KO=$(KO) HELM=$(HELM) KUSTOMIZE=$(KUSTOMIZE) KREW=$(KREW) KREW_VALIDATE=$(KREW_VALIDATE) \
		KUBECTL=$(KUBECTL) RELEASE_VERSION=$(RELEASE_VERSION) REHEARSAL_PLATFORMS=$(REHEARSAL_PLATFORMS) \
		go test -race -count=1 -v -timeout $(REHEARSAL_TIMEOUT) -run '^TestRehearsal$$' .

.PHONY: lint-release
lint-release: $(ACTIONLINT) $(GORELEASER) ## actionlint the workflows and goreleaser check.
	$(ACTIONLINT) .github/workflows/*.yml
	$(GORELEASER) check

# `make lint` checks the release configuration too, and `make test` runs
# actionlint on the workflows (test/release).
lint: lint-release
test: $(ACTIONLINT)
test: export ACTIONLINT := $(ACTIONLINT)

# go install names the binary goreleaser (the module path ends in /v2).
$(GORELEASER):
	@set -e; mkdir -p $(LOCALBIN); tmp=$$(mktemp -d); \
	echo "Installing github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)"; \
	GOBIN=$$tmp go install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION); \
	mv $$tmp/goreleaser $@; rm -rf $$tmp

$(KO):
	$(call go-install-tool,$@,github.com/google/ko,$(KO_VERSION))

# print-VAR prints a variable as make computes it (test/release reads the
# release's version and the images' bases with it).
print-%:
	@echo '$($*)'
