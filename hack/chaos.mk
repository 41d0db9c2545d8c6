# hack/chaos.mk: the chaos test of test/chaos (see docs/reliability.md).
# Included from the Makefile, whose variables it uses (GO_TEST_FLAGS, the
# envtest target, KUBEBUILDER_ASSETS). To try it alone:
#   make -f Makefile -f hack/chaos.mk chaos DURATION=1m
# `make test` runs the short version (about 50 s) as part of `go test ./...`.

# How long the workload and the faults run in `make chaos`.
DURATION ?= 5m
# The seed of the workload and the fault schedule: random unless given, and
# printed, so that a failing run can be repeated with SEED=<n>. Set once here
# (not with ?=, which would draw a new one at every use).
ifeq ($(origin SEED),undefined)
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# The go test timeout of a long run: DURATION plus the restart check over 500
# locks and the start of the API server.
CHAOS_TIMEOUT ?= 30m
# More test flags, e.g. CHAOS_FLAGS='-chaos.targets=40 -chaos.faults=0.05'.
CHAOS_FLAGS ?=
# BREAK is how `make chaos-broken` breaks the operator: cas (grant Lease
# updates overwrite instead of compare-and-swap) or decide (the waiting claim
# is shown Held next to the holder).
BREAK ?= cas
CHAOS_BROKEN_OUT ?= $(or $(TMPDIR),/tmp)/buildlock-chaos-broken.out

##@ Reliability

.PHONY: chaos
chaos: envtest ## Run the chaos test for DURATION (5m) with SEED (random, printed): restarts, split brain, a zombie, API faults, clock skew; zero violations expected.
	@echo "chaos: DURATION=$(DURATION) SEED=$(SEED) (repeat with: make chaos DURATION=$(DURATION) SEED=$(SEED))"
	go test $(GO_TEST_FLAGS) ./test/chaos -run '^TestChaos$$' -count=1 -v -timeout $(CHAOS_TIMEOUT) \
		-chaos.duration=$(DURATION) -chaos.seed=$(SEED) $(CHAOS_FLAGS)

.PHONY: chaos-short
chaos-short: envtest ## Run the chaos package as `make test` does (the 20 s chaos run and its checks, the checker's own tests, the pod-read regression test).
	@echo "chaos-short: SEED=$(SEED)"
	go test $(GO_TEST_FLAGS) ./test/chaos -count=1 -v -chaos.seed=$(SEED) $(CHAOS_FLAGS)

.PHONY: chaos-broken
chaos-broken: envtest ## Run the short chaos test against an operator broken on purpose (BREAK=cas|decide): it passes only if the checker reports violations.
	@echo "chaos-broken: BREAK=$(BREAK) SEED=$(SEED)"
	@if go test ./test/chaos -run '^TestChaos$$' -count=1 -v -chaos.seed=$(SEED) -chaos.break=$(BREAK) $(CHAOS_FLAGS) > $(CHAOS_BROKEN_OUT) 2>&1; then \
		cat $(CHAOS_BROKEN_OUT); echo "chaos-broken: the checker found NO violation in an operator broken with BREAK=$(BREAK)"; exit 1; \
	fi; if ! grep -q 'VIOLATION' $(CHAOS_BROKEN_OUT); then \
		cat $(CHAOS_BROKEN_OUT); echo "chaos-broken: the run failed, but not with a violation"; exit 1; \
	fi; grep -m 3 -A 12 'VIOLATION' $(CHAOS_BROKEN_OUT); grep 'violations:' $(CHAOS_BROKEN_OUT); \
	echo "chaos-broken: the checker caught the broken operator (full output in $(CHAOS_BROKEN_OUT))"
