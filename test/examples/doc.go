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
//   - every embedded script (and every sh block of docs/pipelines.md) passes
//     shellcheck, and the GitHub workflow actionlint;
//   - the GitHub action installs the release it is used at, and only when it
//     matches the release's checksums.txt.
//
// The CI systems are emulated, not run: each helper (tekton_test.go,
// github_test.go, gitlab_test.go, jenkins_test.go) reads the format and
// reproduces the few rules that decide what runs, with which environment, and
// what stops a pipeline. Each rule is documented where it is reproduced. The
// Jenkins helper runs the Groovy with groovy (testdata/jenkins.groovy).
//
// shellcheck, actionlint ($ACTIONLINT, else on PATH), groovy and busybox
// (the shell of the plugin's image, which the GitLab component runs on) are
// not part of a fresh machine: without one, the tests that need it skip,
// unless $REQUIRE_TOOLS is set (`make lint-examples` sets it, and .ci/run
// installs shellcheck, groovy and busybox). The Tekton Task is also validated with Tekton's own
// types, in the module test/examples/tekton.
package examples
