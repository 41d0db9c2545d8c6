# hack/chaos.mk: the chaos test and the soak of test/chaos (see
# docs/reliability.md). Included from the Makefile, whose variables it uses
# (GO_TEST_FLAGS, the envtest target, KUBEBUILDER_ASSETS, LOCALBIN). To try
# it alone:
#   make -f Makefile -f hack/chaos.mk chaos DURATION=1m
# `make test` runs the short version (about a minute) in its chaos group.

# How long the workload and the faults run in `make chaos` (and `make soak`,
# where it defaults to 30m).
DURATION ?= 10m
# The seed of the workload and the fault schedule: random unless given, and
# printed, so that a failing run can be repeated with SEED=<n>. Set once here
# (not with ?=, which would draw a new one at every use).
ifeq ($(origin SEED),undefined)
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# The go test timeout of a long run: DURATION plus the load run, the restart
# check over 500 locks and the start of the control plane.
CHAOS_TIMEOUT ?= 60m
# More test flags, e.g. CHAOS_FLAGS='-chaos.targets=40 -chaos.faults=0.05'.
CHAOS_FLAGS ?=
# The go test flags of the long runs (`make chaos`): none, so that they
# measure the operator users run; the race detector slows the in-process
# managers several times (issue 26), and the checker's own tests and the
# short run in `make test` keep -race. CHAOS_GO_FLAGS=-race for a long run
# under the race detector.
CHAOS_GO_FLAGS ?=
# BREAK is how `make chaos-broken` breaks the operator (one or more of):
#   cas          grant Lease updates overwrite instead of compare-and-swap
#   decide       the waiting claim is shown Held next to the holder
#   renew-clock  a renewal counts from the client's renewTime (its clock)
#   rollback     the grant record forgets which builds of each line held
#   queue        locks whose policy says Queue are decided as NewestWins
#   token-restart  a lock whose grant Lease is gone forgets its tokens
#   repair       a Lease a person deleted or edited is never written again
#   window       the arbiter is told of no freeze (deploy windows ignored)
#   workflow     lines are keyed without spec.workflow
BREAK ?= cas
CHAOS_BROKEN_OUT ?= $(or $(TMPDIR),/tmp)/buildlock-chaos-broken
# The soak's manager binary, and where its plot and samples go.
SOAK_DURATION ?= $(if $(filter command line environment,$(origin DURATION)),$(DURATION),30m)
SOAK_MANAGER ?= $(LOCALBIN)/manager
SOAK_SVG ?= docs/soak.svg
SOAK_CSV ?= $(or $(TMPDIR),/tmp)/buildlock-soak.csv

##@ Reliability

.PHONY: chaos
chaos: envtest ## Run the chaos test for DURATION (10m) with SEED (random, printed), without the race detector (CHAOS_GO_FLAGS): manager faults, control-plane episodes, partitions, 500 pipelines; zero violations expected.
	@echo "chaos: DURATION=$(DURATION) SEED=$(SEED) (repeat with: make chaos DURATION=$(DURATION) SEED=$(SEED))"
	go test $(CHAOS_GO_FLAGS) ./test/chaos -run '^TestChaos$$' -count=1 -v -timeout $(CHAOS_TIMEOUT) \
		-chaos.duration=$(DURATION) -chaos.seed=$(SEED) $(CHAOS_FLAGS)

.PHONY: chaos-short
chaos-short: envtest ## Run the chaos package as `make test` does (the short chaos run, the checker's own tests, the regression tests).
	@echo "chaos-short: SEED=$(SEED)"
	go test $(GO_TEST_FLAGS) ./test/chaos -count=1 -v -timeout $(TEST_TIMEOUT_slow) -chaos.seed=$(SEED) $(CHAOS_FLAGS)

.PHONY: chaos-broken
chaos-broken: envtest ## Run the short chaos test against an operator broken on purpose (BREAK=cas|decide|renew-clock|rollback|queue|token-restart|repair|window|workflow, or several): it passes only if the checker reports violations (of safety, or of liveness) each time.
	@for b in $(BREAK); do \
		out=$(CHAOS_BROKEN_OUT)-$$b.out; echo "chaos-broken: BREAK=$$b SEED=$(SEED)"; \
		if go test ./test/chaos -run '^TestChaos$$' -count=1 -v -timeout $(TEST_TIMEOUT_slow) -chaos.seed=$(SEED) -chaos.break=$$b $(CHAOS_FLAGS) > $$out 2>&1; then \
			cat $$out; echo "chaos-broken: the checker found NO violation in an operator broken with BREAK=$$b"; exit 1; \
		fi; if ! grep -qE 'VIOLATION|LIVENESS|RESTART' $$out; then \
			cat $$out; echo "chaos-broken: the run failed, but not with a violation"; exit 1; \
		fi; grep -m 3 -A 12 -E 'VIOLATION|LIVENESS|RESTART' $$out; grep 'violations:' $$out; \
		echo "chaos-broken: the checker caught the operator broken with BREAK=$$b (full output in $$out)"; \
	done

.PHONY: soak
soak: envtest ## Run the chaos workload for DURATION (30m) against bin/manager as a process, with control-plane episodes and partitions; sample its heap, goroutines and connections, plot them to docs/soak.svg (gonum/plot, test/bench/soakplot).
	go build -o $(SOAK_MANAGER) ./cmd/manager
	@echo "soak: DURATION=$(SOAK_DURATION) SEED=$(SEED) manager=$(SOAK_MANAGER)"
	go test ./test/chaos -run '^TestSoak$$' -count=1 -v -timeout $(CHAOS_TIMEOUT) -chaos.soak=$(SOAK_DURATION) -chaos.seed=$(SEED) \
		-chaos.soak-manager=$(abspath $(SOAK_MANAGER)) -chaos.soak-csv=$(abspath $(SOAK_CSV)) $(CHAOS_FLAGS)
	cd test/bench && go run ./soakplot -csv $(abspath $(SOAK_CSV)) -out $(abspath $(SOAK_SVG)) \
		-title "bin/manager over a $(SOAK_DURATION) soak (chaos workload, control-plane episodes, partitions)"
