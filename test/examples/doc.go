// Package examples tests the pipeline examples (examples/) and the building
// blocks people reuse (the GitHub composite action action.yml, the Jenkins
// step vars/buildlock.groovy and the Tekton catalog Task) by running their
// scripts the way each CI system runs them, against a stub kubectl-buildlock
// that records what it receives:
//
//   - untrusted values (branch names, commit messages, build ids) reach the
//     plugin intact and never run as code;
//   - a superseded build (the plugin exits 3) stops the rest of the pipeline
//     and says why;
//   - every embedded script passes shellcheck, and the GitHub workflow
//     actionlint, when those tools are on PATH ($REQUIRE_TOOLS=1, as in
//     `make lint-examples`, makes a missing tool a failure).
//
// The CI systems are emulated, not run: each helper (tekton_test.go,
// github_test.go, gitlab_test.go, jenkins_test.go) reads the format and
// reproduces the few rules that decide what runs, with which environment, and
// what stops a pipeline. Each rule is documented where it is reproduced.
package examples
