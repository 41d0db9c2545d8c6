# hack/bench.mk: `make bench` measures buildlock side by side with the API
# server's floors (the floor contender: the same loads with only the
# requests the API makes necessary) and with what teams use instead
# (client-go leader election on a Lease, and the client-side ConfigMap
# protocol), and writes docs/benchmarks.md and its plot. The Makefile
# includes it and provides the variables and envtest rules it uses. The
# harness (test/bench) is a Go module of its own (its plotting libraries stay
# out of the root go.mod; a replace builds it against this checkout) and
# builds only with the `bench` tag, so `make test` never runs it.

# Where the run leaves its manager binary, logs, profiles and kubeconfig
# (BENCH_DIR=... keeps them out of a bin/ shared with other checkouts).
BENCH_DIR ?= $(LOCALBIN)/bench
# Extra flags for the harness, e.g. BENCH_FLAGS=-bench.quick for a short try.
BENCH_FLAGS ?=

##@ Benchmarks

.PHONY: bench
bench: envtest ## Benchmark hand-offs, acquires, scale, API cost and memory against the floors and peers; writes docs/benchmarks.md (about 20 minutes).
	@mkdir -p $(BENCH_DIR)
	go build -o $(BENCH_DIR)/manager ./cmd/manager
	go build -o $(BENCH_DIR)/kubectl-buildlock ./cmd/kubectl-buildlock
	go test -run '^$$' -bench BenchmarkDecide -benchmem -timeout 10m ./internal/arbiter/ | tee $(BENCH_DIR)/decide.txt
	cd test/bench && go test -tags bench -run '^TestBench$$' -timeout 60m -v . -args \
		-bench.work=$(BENCH_DIR) -bench.manager=$(BENCH_DIR)/manager -bench.plugin=$(BENCH_DIR)/kubectl-buildlock \
		-bench.decide=$(BENCH_DIR)/decide.txt $(BENCH_FLAGS)

# The soak's plot (test/bench/soakplot, in this module for its plotting
# libraries) is tested with `make test`.
.PHONY: test-soakplot
test-soakplot: ## Test the soak's plot (test/bench/soakplot) on a small CSV.
	cd test/bench && go test ./soakplot -count=1 -timeout $(TEST_TIMEOUT_quick)

test: test-soakplot
