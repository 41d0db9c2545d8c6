# hack/release.mk: the release that a v* tag makes
# (.github/workflows/release.yml), and its checks without the network.
# Included from the Makefile, whose variables it uses (LOCALBIN, VERSION,
# SOURCE_DATE_EPOCH, ACTIONLINT, KREW, KREW_VALIDATE).

GORELEASER_VERSION ?= v2.15.1
GORELEASER ?= $(LOCALBIN)/goreleaser-$(GORELEASER_VERSION)

##@ Release

.PHONY: image
image: ## Build the manager's image for linux/amd64 and linux/arm64 without Docker, as an OCI layout in dist/image (hack/image).
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) go run ./hack/image -version $(VERSION) -out dist/image

.PHONY: snapshot
snapshot: $(GORELEASER) ## Build the plugin's release for every platform into dist/ with GoReleaser, without signing, SBOMs or publishing.
	$(GORELEASER) release --snapshot --clean --skip=sign,sbom,publish

.PHONY: lint-release
lint-release: $(ACTIONLINT) $(GORELEASER) $(KREW) $(KREW_VALIDATE) ## actionlint the workflows, goreleaser check, and a snapshot of this platform's archive that krew installs from .krew.yaml.
	$(ACTIONLINT) .github/workflows/*.yml
	$(GORELEASER) check
	GORELEASER=$(GORELEASER) KREW=$(KREW) KREW_VALIDATE=$(KREW_VALIDATE) go test ./test/release -count=1

# `make lint` checks the release too (its GoReleaser build is too heavy for
# `make test`, which runs test/release without it).
lint: lint-release

# go install names the binary goreleaser (the module path ends in /v2).
$(GORELEASER):
	@set -e; mkdir -p $(LOCALBIN); tmp=$$(mktemp -d); \
	echo "Installing github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)"; \
	GOBIN=$$tmp go install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION); \
	mv $$tmp/goreleaser $@; rm -rf $$tmp
