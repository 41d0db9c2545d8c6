package main

// Integration tests of issue 22: a re-run after a failed deploy, a rollback
// on purpose, a second workflow, and the audit status shows.

import (
	"strconv"
	"strings"
	"testing"
)

// githubRun is a GitHub Actions run of build number of acme/shop@main, in
// workflow (a path under .github/workflows), attempt attempt.
func githubRun(workflow string, number, attempt int) map[string]string {
	env := github(attempt)
	env["GITHUB_RUN_NUMBER"] = itoa(number)
	env["GITHUB_RUN_ID"] = itoa(9000 + number)
	env["GITHUB_WORKFLOW_REF"] = "acme/shop/.github/workflows/" + workflow + "@refs/heads/main"
	return env
}

// TestARerunAfterAFailedDeployDeploys: build 500's deploy fails; GitHub's
// "Re-run failed jobs" keeps the run number and takes the lock again.
func TestARerunAfterAFailedDeployDeploys(t *testing.T) {
	f := newFixture(t)
	env, cmd := f.helper("first", 0, 1)
	for k, v := range githubRun("deploy.yml", 500, 1) {
		env[k] = v
	}
	if code, p := f.run(env, append([]string{"acquire", "--target", "staging"}, cmd...)...); code != 1 {
		t.Fatalf("the failing deploy exited %d, want its command's 1; stderr:\n%s", code, p.stderr)
	}
	env, cmd = f.helper("rerun", 0, 0)
	for k, v := range githubRun("deploy.yml", 500, 2) {
		env[k] = v
	}
	code, p := f.run(env, append([]string{"acquire", "--target", "staging"}, cmd...)...)
	if code != exitOK {
		t.Fatalf("the re-run exited %d, want 0; stderr:\n%s", code, p.stderr)
	}
	if r, ran := f.helperRun("rerun"); !ran || r.token != "2" {
		t.Errorf("the re-run's deploy ran %v with token %q, want token 2", ran, r.token)
	}
}

// TestARollbackDeploysOnPurposeAndIsRecorded: after build 42 deployed,
// build 41 is refused (and told how to roll back), needs a reason to roll
// back, deploys with --rollback, and status shows the rollback after its
// claim is gone.
func TestARollbackDeploysOnPurposeAndIsRecorded(t *testing.T) {
	f := newFixture(t)
	build := func(n string, extra ...string) []string {
		return append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", n}, extra...)
	}
	env, cmd := f.helper("deploy-42", 0, 0)
	if code, p := f.run(env, append(build("42"), cmd...)...); code != exitOK {
		t.Fatalf("build 42 exited %d; stderr:\n%s", code, p.stderr)
	}
	env, cmd = f.helper("deploy-41", 0, 0)
	code, p := f.run(env, append(build("41"), cmd...)...)
	if code != exitSuperseded || !strings.Contains(p.stderr.String(), "Build 42 of acme/shop@main already deployed") ||
		!strings.Contains(p.stderr.String(), "kubectl buildlock acquire --rollback") || strings.Contains(p.stderr.String(), "A newer build will deploy") {
		t.Fatalf("build 41 without --rollback exited %d, want %d with what deployed and how to roll back; stderr:\n%s", code, exitSuperseded, p.stderr)
	}
	if code, p := f.run(env, append(build("41", "--rollback"), cmd...)...); code != exitUsage || !strings.Contains(p.stderr.String(), "--rollback needs --reason") {
		t.Errorf("--rollback without --reason exited %d, want %d; stderr:\n%s", code, exitUsage, p.stderr)
	}
	env, cmd = f.helper("rollback-41", 0, 0)
	code, p = f.run(env, append(build("41", "--name", "shop-41-rollback", "--rollback", "--reason", "INC-7: 42 breaks checkout"), cmd...)...)
	if code != exitOK {
		t.Fatalf("the rollback exited %d; stderr:\n%s", code, p.stderr)
	}
	if r, ran := f.helperRun("rollback-41"); !ran || r.token != "2" {
		t.Errorf("the rollback's deploy ran %v with token %q, want token 2", ran, r.token)
	}
	if f.get("shop-41-rollback") != nil {
		t.Error("the rollback's claim was not released")
	}
	code, p = f.run(nil, "status", "--target", "staging")
	if out := p.stdout.String(); code != exitOK || !strings.Contains(out, "Rollback") || !strings.Contains(out, "shop-41-rollback") ||
		!strings.Contains(out, "acme/shop@main #41 (from #42)") || !strings.Contains(out, `"INC-7: 42 breaks checkout"`) {
		t.Errorf("status exited %d without the rollback:\n%s\n%s", code, out, p.stderr)
	}
}

// TestASecondWorkflowIsALineOfItsOwn: run 12 of hotfix.yml deploys after
// run 500 of deploy.yml on the same repository and branch.
func TestASecondWorkflowIsALineOfItsOwn(t *testing.T) {
	f := newFixture(t)
	for _, run := range []struct {
		workflow string
		number   int
	}{{"deploy.yml", 500}, {"hotfix.yml", 12}} {
		env, cmd := f.helper(run.workflow, 0, 0)
		for k, v := range githubRun(run.workflow, run.number, 1) {
			env[k] = v
		}
		if code, p := f.run(env, append([]string{"acquire", "--target", "staging"}, cmd...)...); code != exitOK {
			t.Fatalf("run %d of %s exited %d; stderr:\n%s", run.number, run.workflow, code, p.stderr)
		}
	}
	env, cmd := f.helper("deploy-499", 0, 0)
	for k, v := range githubRun("deploy.yml", 499, 1) {
		env[k] = v
	}
	code, p := f.run(env, append([]string{"acquire", "--target", "staging", "--name", "deploy-499"}, cmd...)...)
	if code != exitSuperseded || !strings.Contains(p.stderr.String(), "(workflow acme/shop/.github/workflows/deploy.yml) already deployed") {
		t.Errorf("an older run of deploy.yml exited %d; stderr:\n%s", code, p.stderr)
	}
	if bl := f.get("deploy-499"); bl == nil || bl.Spec.Workflow != "acme/shop/.github/workflows/deploy.yml" {
		t.Errorf("the claim's workflow is not the GitHub workflow: %+v", bl)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
