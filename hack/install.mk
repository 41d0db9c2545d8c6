# hack/install.mk: running, installing, demoing and packaging buildlock.
# Included from the Makefile, whose variables it uses (LOCALBIN, HELM,
# KUBECTL, ENVTEST_DIR, CONTROLLER_GEN, KUBEBUILDER_ASSETS). To try it alone:
#   make -f Makefile -f hack/install.mk <target>

CHART_DIR ?= charts/buildlock
IMG ?= ghcr.io/buildlock/buildlock:dev
CONTAINER_TOOL ?= docker
# Flags for `make run` against a configured cluster. Out of a cluster the
# manager cannot tell its own namespace, so leader election needs one.
RUN_ARGS ?= --leader-election-namespace=default
# LOCAL=1 makes `make run` use a local control plane even when a cluster is
# configured.
LOCAL ?=

##@ Run

# The local control plane is built and then run, not `go run`: `go run` exits 1
# after Ctrl-C even when the program shut down cleanly.
# On the local control plane, localcluster serves the operator's metrics
# over plain HTTP (127.0.0.1:8080, or a free port) and prints where; Ctrl-C
# stops it cleanly, also when its output is piped (`make run 2>&1 | tee log`).
.PHONY: run
run: manifests generate fmt vet ## Run the operator: on a throwaway local control plane when no cluster is configured (or LOCAL=1), else against the configured cluster.
	@if [ "$(LOCAL)" = 1 ] || { [ -z "$$KUBECONFIG" ] && [ ! -f "$$HOME/.kube/config" ]; }; then \
		echo "No cluster configured (no \$$KUBECONFIG, no ~/.kube/config) or LOCAL=1: starting a local control plane."; \
		$(MAKE) --no-print-directory envtest; \
		go build -o $(LOCALBIN)/localcluster ./hack/localcluster && $(LOCALBIN)/localcluster; \
	else \
		echo "Running the manager against the configured cluster (CRDs: make install; LOCAL=1 for a local control plane)."; \
		go run ./cmd/manager $(RUN_ARGS); \
	fi

.PHONY: demo
demo: envtest ## Play the narrated hand-off scenario on a local control plane; exits non-zero if a step's state is not observed.
	go run ./hack/demo

##@ Deployment

# install and uninstall use the kubectl `make envtest` builds; KUBECTL=kubectl
# uses yours.

.PHONY: install
install: manifests $(KUBECTL) ## Install the CRDs into the configured cluster.
	$(KUBECTL) apply --server-side -f config/crd/bases

.PHONY: uninstall
uninstall: manifests $(KUBECTL) ## Delete the CRDs, and with them every BuildLock, from the configured cluster.
	$(KUBECTL) delete --ignore-not-found -f config/crd/bases

# The installer without Helm is config/default with the manager's image set
# to IMG by `kustomize edit set image`, on a copy of config/ so that nothing
# committed changes.
INSTALLER ?= dist/install/install.yaml

.PHONY: installer
installer: $(KUSTOMIZE) ## Write INSTALLER: config/default (kustomize) with the manager's image IMG.
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cp -R config "$$tmp/"; \
	(cd "$$tmp/config/default" && $(KUSTOMIZE) edit set image ghcr.io/buildlock/buildlock=$(IMG)); \
	mkdir -p $(dir $(INSTALLER)); $(KUSTOMIZE) build "$$tmp/config/default" > $(INSTALLER)

.PHONY: deploy
deploy: manifests $(KUBECTL) ## Install buildlock without Helm (config/default, image IMG) into the configured cluster.
	$(MAKE) --no-print-directory installer INSTALLER=dist/deploy/install.yaml
	$(KUBECTL) apply --server-side -f dist/deploy/install.yaml

.PHONY: undeploy
undeploy: $(KUBECTL) ## Delete what make deploy installed, the CRDs included, and with them every BuildLock.
	$(MAKE) --no-print-directory installer INSTALLER=dist/deploy/install.yaml
	$(KUBECTL) delete --ignore-not-found -f dist/deploy/install.yaml

.PHONY: build-installer
build-installer: manifests installer ## Write dist/install/install.yaml: what make deploy installs, image IMG, for kubectl apply --server-side -f.
	@echo "Wrote $(INSTALLER) (image $(IMG)); install it with: kubectl apply --server-side -f $(INSTALLER)"

.PHONY: docker-build
docker-build: ## Build the manager image IMG with CONTAINER_TOOL (docker).
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the manager image IMG.
	$(CONTAINER_TOOL) push $(IMG)

##@ Helm chart

# The roles of config/rbac whose rules the chart renders from its copies in
# files/rbac: written once, in config/rbac (role.yaml generated from the
# controller's RBAC markers, the others by hand).
CHART_RBAC_FILES := role.yaml leader_election_role.yaml metrics_auth_role.yaml metrics_reader_role.yaml pipeline_role.yaml view_role.yaml

.PHONY: chart-sync
chart-sync: manifests ## Copy the generated CRDs, the RBAC rules and the admission policies into the chart.
	@mkdir -p $(CHART_DIR)/files/crds $(CHART_DIR)/files/rbac $(CHART_DIR)/files/identity $(CHART_DIR)/files/enforcement $(CHART_DIR)/files/lease-informer
	rm -f $(CHART_DIR)/files/crds/*.yaml $(CHART_DIR)/files/rbac/*.yaml $(CHART_DIR)/files/identity/*.yaml $(CHART_DIR)/files/enforcement/*.yaml $(CHART_DIR)/files/lease-informer/*.yaml
	cp config/crd/bases/*.yaml $(CHART_DIR)/files/crds/
	cp config/identity/*.yaml $(CHART_DIR)/files/identity/
	cp config/enforcement/*.yaml $(CHART_DIR)/files/enforcement/
	cp config/lease-informer/*.yaml $(CHART_DIR)/files/lease-informer/
	cp $(addprefix config/rbac/,$(CHART_RBAC_FILES)) $(CHART_DIR)/files/rbac/

.PHONY: docs-values
docs-values: $(HELM_DOCS) ## Regenerate the values table of docs/install.md from the comments in the chart's values.yaml.
	hack/values-table.sh $(HELM_DOCS) $(CHART_DIR) docs/install.md > docs/install.md.tmp
	mv docs/install.md.tmp docs/install.md

.PHONY: verify-docs
verify-docs: $(HELM_DOCS) ## Fail when the values table of docs/install.md differs from values.yaml's comments.
	@want=$$(mktemp); trap 'rm -f $$want' EXIT; \
	hack/values-table.sh $(HELM_DOCS) $(CHART_DIR) docs/install.md > $$want; \
	diff -u docs/install.md $$want \
		|| { echo "docs/install.md's values table is out of date with $(CHART_DIR)/values.yaml; run 'make docs-values' and commit."; exit 1; }

# bin/helm is the pinned helm under its plain name, for people: with bin/ on
# PATH (export PATH="$PWD/bin:$PATH"), `helm` is the one the tests use.
$(LOCALBIN)/helm: $(HELM)
	ln -sf $(notdir $(HELM)) $@

.PHONY: helm
helm: $(LOCALBIN)/helm ## Build the pinned helm (bin/helm-<version>-release) and link it as bin/helm.

# The targets that build helm link it too.
lint-chart test: $(LOCALBIN)/helm

.PHONY: lint-chart
lint-chart: $(HELM) ## helm lint --strict the chart, its values schema included.
	$(HELM) lint --strict $(CHART_DIR)

.PHONY: verify-chart
verify-chart: manifests $(HELM) $(PROMTOOL) lint-chart verify-docs ## Fail when the chart's CRDs or RBAC rules differ from config/, its values or alerts are wrong, or helm lint complains.
	@diff -ru config/crd/bases $(CHART_DIR)/files/crds \
		&& diff -ru -x Kustomization config/identity $(CHART_DIR)/files/identity \
		&& diff -ru -x Kustomization config/enforcement $(CHART_DIR)/files/enforcement \
		&& diff -ru -x Kustomization config/lease-informer $(CHART_DIR)/files/lease-informer \
		&& for f in $(CHART_RBAC_FILES); do diff -u config/rbac/$$f $(CHART_DIR)/files/rbac/$$f || exit 1; done \
		&& [ "$$(ls $(CHART_DIR)/files/rbac)" = "$$(printf '%s\n' $(sort $(CHART_RBAC_FILES)))" ] \
		|| { echo "The chart is out of date with config/; run 'make chart-sync' and commit."; exit 1; }
	HELM=$(HELM) PROMTOOL=$(PROMTOOL) go test ./test/chart -short -count=1 -timeout $(TEST_TIMEOUT_slow)

.PHONY: test-chart
test-chart: envtest $(HELM) $(PROMTOOL) $(KUSTOMIZE) ## Install the chart (and the kustomize installer) on a local control plane and run the manager under their RBAC.
	HELM=$(HELM) PROMTOOL=$(PROMTOOL) KUBECTL=$(KUBECTL) KUSTOMIZE=$(KUSTOMIZE) go test ./test/chart -count=1 -v -timeout 10m

# `make test` runs ./test/chart too; give it helm and promtool, or the chart
# and alert tests skip, and kustomize for the installer.
test: $(HELM) $(PROMTOOL) $(KUSTOMIZE)
test: export HELM := $(HELM)
test: export PROMTOOL := $(PROMTOOL)
test: export KUSTOMIZE := $(KUSTOMIZE)
