// Package chaos tests the operator's one promise, at most one build holds a
// lock at any moment and every live newest build eventually gets it, the way
// coordination systems are tested: a seeded random workload and injected
// faults (kills, restarts, split brain, a zombie manager, API errors, clock
// skew) against a real API server, while an independent [Checker] reads the
// cluster's own history through a watch and judges every event.
//
// The checker (checker.go) imports the API types and the Kubernetes
// libraries only, never the operator's code: it states the rules again, in
// its own words, so that a bug in the operator cannot hide in a shared
// helper. checker_test.go proves that it reports broken histories.
//
// TestChaos (chaos_test.go) runs a short version by default (about a minute,
// part of `make test`); `make chaos DURATION=5m SEED=n` runs longer. See
// docs/reliability.md for what is run, what is checked, and the figures.
package chaos
