package examples

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// assertSaysSuperseded fails the test unless the output tells the reader
// that this build was superseded and will not deploy, and never claims what
// may be false: the plugin's message above says why (a newer build that
// goes instead, a higher one that already deployed, another run of the same
// build), and the integration must not add that a newer build will deploy.
func assertSaysSuperseded(t *testing.T, output string) {
	t.Helper()
	lower := strings.ToLower(output)
	if !strings.Contains(lower, "superseded") || !strings.Contains(lower, "will not deploy") {
		t.Errorf("the output does not say that this build was superseded and will not deploy:\n%s", output)
	}
	if strings.Contains(lower, "newer build will deploy") || strings.Contains(lower, "a newer build deploys") {
		t.Errorf("the output says a newer build will deploy, which the plugin's reason may contradict:\n%s", output)
	}
}

// assertNothingAfter fails the test when anything deployed or took another
// lock after the superseded staging claim.
func assertNothingAfter(t *testing.T, calls []call, output string) {
	t.Helper()
	for _, c := range acquires(calls) {
		if target, _ := c.flag("--target"); target != "staging" {
			t.Errorf("the superseded build went on to claim %s; output:\n%s", target, output)
		}
	}
	if n := len(named(calls, stubDeploy)); n > 0 {
		t.Errorf("the superseded build deployed %d times; output:\n%s", n, output)
	}
}

// assertStagingStoppedProduction fails the test unless the deploy-staging
// job failed (a job that passes or is allowed to fail lets later jobs run)
// and deploy-production was skipped.
func assertStagingStoppedProduction(t *testing.T, status map[string]string, output string) {
	t.Helper()
	if st := status["deploy-production"]; st != jobSkipped {
		t.Errorf("deploy-production %s for a superseded build, want %s; output:\n%s", st, jobSkipped, output)
	}
	if st := status["deploy-staging"]; st != jobFailed {
		t.Errorf("deploy-staging %s for a superseded build, want %s so that no later job runs", st, jobFailed)
	}
}

// TestTektonSupersededStopsPipeline: staging's claim is superseded, so
// production must not run.
func TestTektonSupersededStopsPipeline(t *testing.T) {
	p, tasks := tektonExample(t)
	s := newStubs(t)
	run := runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main", "build": "42"},
		[]string{"STUB_ACQUIRE=staging=3"})
	out := run.output.String()
	assertNothingAfter(t, s.calls(t), out)
	if slices.Contains(run.ran, "deploy-production") {
		t.Errorf("deploy-production ran for a superseded build; output:\n%s", out)
	}
	if run.failed != "deploy-staging" {
		t.Errorf("the failed task is %q, want deploy-staging: a superseded build fails its TaskRun so that no later task starts", run.failed)
	}
	assertSaysSuperseded(t, out)
}

// TestGitLabSupersededStopsPipeline: staging's claim is superseded, so the
// staging job must fail (an allowed failure would let production run) and
// production must not run; with a job of one's own and with the component.
func TestGitLabSupersededStopsPipeline(t *testing.T) {
	for name, example := range map[string]func(*testing.T) gitlabPipeline{"job": gitlabExample, "component": gitlabComponentExample} {
		t.Run(name, func(t *testing.T) {
			s := newStubs(t)
			run := runGitLab(t, s, example(t), gitlabPredefined(), []string{"STUB_ACQUIRE=staging=3"})
			out := run.output.String()
			assertNothingAfter(t, s.calls(t), out)
			assertStagingStoppedProduction(t, run.status, out)
			assertSaysSuperseded(t, out)
		})
	}
}

// TestGitHubSupersededStopsWorkflow: staging's claim is superseded, so the
// staging job fails and deploy-production, which needs it, is skipped.
func TestGitHubSupersededStopsWorkflow(t *testing.T) {
	s := newStubs(t)
	r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"), "STUB_ACQUIRE=staging=3")
	r.runWorkflow(githubExample(t))
	out := r.output.String()
	assertNothingAfter(t, s.calls(t), out)
	assertStagingStoppedProduction(t, r.status, out)
	assertSaysSuperseded(t, out)
	if !strings.Contains(out, "::warning title=buildlock superseded on staging::") {
		t.Errorf("no warning annotation for the superseded build; output:\n%s", out)
	}
}

// TestJenkinsSupersededStopsPipeline: staging's claim is superseded, so the
// staging stage fails without deploying, the production stage is skipped,
// and the build ends NOT_BUILT with a description that says why.
func TestJenkinsSupersededStopsPipeline(t *testing.T) {
	s := newStubs(t)
	run := runJenkins(t, s, nil, "STUB_ACQUIRE=staging=3")
	assertNothingAfter(t, s.calls(t), run.output)
	want := map[string]string{"Build": "passed", "Deploy to staging": "failed", "Deploy to production": "skipped"}
	if !maps.Equal(run.stages, want) {
		t.Errorf("stages %v, want %v; output:\n%s", run.stages, want, run.output)
	}
	if run.result != "NOT_BUILT" || !strings.Contains(run.description, "Superseded on staging") {
		t.Errorf("result %s, description %q; want NOT_BUILT and a description that says it was superseded", run.result, run.description)
	}
	assertSaysSuperseded(t, run.output)
}
