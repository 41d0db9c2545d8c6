# hack/examples.mk: checks of the pipeline examples and building blocks
# (examples/, action.yml, vars/buildlock.groovy, tekton/task). Included from
# the Makefile, whose variables it uses (LOCALBIN, GOLANGCI_LINT,
# go-install-tool).
#
# shellcheck, groovy (with a JRE) and busybox (the shell of the plugin's
# image, which the GitLab component's job runs on) are not built from the Go
# module proxy: install them with your package manager (apt-get install
# shellcheck groovy busybox); .ci/run does so when they are missing.

ACTIONLINT_VERSION ?= v1.7.12
ACTIONLINT ?= $(LOCALBIN)/actionlint-$(ACTIONLINT_VERSION)

##@ Pipeline examples

.PHONY: lint-examples
lint-examples: $(ACTIONLINT) $(GOLANGCI_LINT) ## Run the examples' tests with actionlint, shellcheck, groovy and busybox required, and validate the Tekton Task with Tekton's own types.
	ACTIONLINT=$(ACTIONLINT) REQUIRE_TOOLS=1 go test ./test/examples/ -count=1 -timeout $(TEST_TIMEOUT_slow)
	cd test/examples/tekton && go vet ./... && $(GOLANGCI_LINT) run ./... && go test ./... -count=1 -timeout $(TEST_TIMEOUT_quick)

$(ACTIONLINT):
	$(call go-install-tool,$@,github.com/rhysd/actionlint/cmd/actionlint,$(ACTIONLINT_VERSION))
