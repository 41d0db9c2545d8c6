// Package chaos tests the operator's one promise, at most one build holds a
// lock at any moment and every live newest build (or the first in its queue)
// eventually gets it, the way coordination systems are tested: a seeded
// random workload and injected faults against a real control plane, while an
// independent [Checker] reads the cluster's own history through watches and
// judges every event.
//
// The faults: managers killed, restarted, run two at a time, frozen as
// zombies, fed API errors and skewed clocks; the control plane's own (an API
// server SIGKILLed and restarted, etcd killed and restarted on its data,
// compactions that make watches fail with 410 Gone, two API servers on one
// etcd); and partitions between a manager and its API server (slow,
// blackholed, healed), with leader election on and off. The workload sends
// what pipelines and people send: times written by hand, renewals and
// timestamps far in the future, long hostile force-release reasons, re-runs
// of a build, late older builds, and policies that choose and change each
// lock's ordering (NewestWins, Queue, Fifo). Beside it, CI jobs deploy
// through the plugin's real binary (some SIGKILLed while their command
// runs) and through pkg/lock, matrix jobs share a run id (jobs_test.go), and
// people delete and edit grant Leases, withdraw and give consent, create a
// Lease of their own under a grant Lease's name and delete claims a
// finalizer keeps, while pipelines try to change consent and one floods a
// lock with lines (people_test.go); and a person adds and removes deploy
// windows that open and close during the run, and overrides claims
// through them, while a pipeline's override is refused (windows_test.go).
//
// The checker (checker.go, ledger.go, orderings.go, relist.go, settle.go,
// people.go, activities.go, windows.go)
// imports the API types and the Kubernetes libraries only, never the
// operator's code: it states the rules again, in its own words, so that a
// bug in the operator cannot hide in a shared helper. The one exception is
// internal/window, the pure function of a policy's windows, with which
// windows.go judges whether the operator applied it. checker_test.go proves
// that it reports broken histories; TestCheckerIsIndependent keeps it
// independent.
//
// TestChaos (chaos_test.go) runs a short version by default (about a
// minute, part of `make test`, with every kind of fault once); `make chaos
// DURATION=10m SEED=n` runs longer, with 500 concurrent pkg/lock pipelines
// (load_test.go). TestSoak (`make soak`) runs the workload for a long time
// against bin/manager as a process and watches its heap, goroutines and
// connections. See docs/reliability.md for what is run, what is checked,
// and the figures.
package chaos
