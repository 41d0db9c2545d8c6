package examples

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/buildlock/buildlock/pkg/lock"
)

// actionWorkflow is a one-job workflow that uses the action at ref with
// with, then prints the action's outputs in a step that always runs.
func actionWorkflow(ref string, with map[string]any) ghWorkflow {
	return ghWorkflow{Jobs: map[string]ghJob{"deploy": {Steps: []ghStep{
		{ID: "lock", Uses: "buildlock/buildlock@" + ref, With: with},
		{
			Name: "outputs", If: "always()", Shell: "bash",
			Env: map[string]string{
				"OUTCOME":   "${{ steps.lock.outputs.outcome }}",
				"EXIT_CODE": "${{ steps.lock.outputs.exit-code }}",
				"TOKEN":     "${{ steps.lock.outputs.fencing-token }}",
			},
			Run: `echo "outputs: outcome=$OUTCOME exit-code=$EXIT_CODE fencing-token=$TOKEN"`,
		},
	}}}}
}

// runAction runs actionWorkflow with a fake release of v0.2.0 and returns
// the run and the stubs' calls.
func runAction(t *testing.T, ref string, with map[string]any, env ...string) (*ghRun, []call) {
	t.Helper()
	return runActionWith(t, fakeRelease(t, "v0.2.0"), ref, with, env...)
}

func runActionWith(t *testing.T, releases, ref string, with map[string]any, env ...string) (*ghRun, []call) {
	t.Helper()
	s := newStubs(t)
	r := newGHRun(t, s, defaultGHEvent(), append([]string{"STUB_RELEASES=" + releases}, env...)...)
	r.runWorkflow(actionWorkflow(ref, with))
	return r, s.calls(t)
}

func assertContains(t *testing.T, output string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(output, w) {
			t.Errorf("the output lacks %q:\n%s", w, output)
		}
	}
}

// TestActionInstallsTheReleaseOfItsTag: used at v0.2.0, the action
// downloads that release's tarball for the runner's platform and its
// checksums.txt, and runs the plugin from it.
func TestActionInstallsTheReleaseOfItsTag(t *testing.T) {
	base := "https://github.com/buildlock/buildlock/releases/download/v0.2.0/"
	for platform, file := range map[[2]string]string{
		{"Linux", "X64"}:   "kubectl-buildlock_v0.2.0_linux_amd64.tar.gz",
		{"Linux", "ARM64"}: "kubectl-buildlock_v0.2.0_linux_arm64.tar.gz",
		{"macOS", "ARM64"}: "kubectl-buildlock_v0.2.0_darwin_arm64.tar.gz",
	} {
		t.Run(platform[0]+"/"+platform[1], func(t *testing.T) {
			s := newStubs(t)
			r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"))
			r.platform = platform
			r.runWorkflow(actionWorkflow("v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"}))
			out := r.output.String()
			calls := s.calls(t)
			var urls []string
			for _, c := range named(calls, stubCurl) {
				urls = append(urls, c.Args[len(c.Args)-1])
			}
			if want := []string{base + file, base + "checksums.txt"}; !slices.Equal(urls, want) {
				t.Errorf("downloaded %q, want %q", urls, want)
			}
			acq := acquires(calls)
			if len(acq) != 1 || r.status["deploy"] != jobPassed {
				t.Fatalf("job %s with %d acquire calls, want passed with 1; output:\n%s", r.status["deploy"], len(acq), out)
			}
			assertDeployed(t, calls, out, "staging")
			assertContains(t, out, "outputs: outcome=held exit-code=0 ")
		})
	}
}

// TestActionRefusesATamperedRelease: a tarball that does not match
// checksums.txt is never run.
func TestActionRefusesATamperedRelease(t *testing.T) {
	for name, tamper := range map[string]func(sums string) string{
		"another checksum": func(sums string) string { return strings.Replace(sums, sums[:8], "00000000", 1) },
		"no line for it":   func(string) string { return "" },
	} {
		t.Run(name, func(t *testing.T) {
			releases := fakeRelease(t, "v0.2.0")
			path := filepath.Join(releases, "v0.2.0", "checksums.txt")
			sums, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(tamper(string(sums))), 0o644); err != nil {
				t.Fatal(err)
			}
			r, calls := runActionWith(t, releases, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"})
			out := r.output.String()
			if n := len(named(calls, stubPlugin)); n != 0 || r.status["deploy"] != jobFailed {
				t.Errorf("job %s and the plugin ran %d times, want failed and 0; output:\n%s", r.status["deploy"], n, out)
			}
			assertContains(t, out, "does not match the release's checksums.txt")
		})
	}
}

// TestActionNeedsAReleaseVersion: used at a branch or a commit, the action
// installs the version input, and without one says what to do.
func TestActionNeedsAReleaseVersion(t *testing.T) {
	r, calls := runAction(t, "main", map[string]any{"target": "staging", "command": "./deploy.sh staging"})
	if r.status["deploy"] != jobFailed || len(named(calls, stubCurl)) != 0 {
		t.Errorf("used at main without a version: job %s, want failed before any download", r.status["deploy"])
	}
	assertContains(t, r.output.String(), "with: version: v0.2.0")

	r, calls = runAction(t, "0123456789abcdef0123456789abcdef01234567", map[string]any{"target": "staging", "command": "./deploy.sh staging", "version": "v0.2.0"})
	if r.status["deploy"] != jobPassed || len(acquires(calls)) != 1 {
		t.Errorf("used at a commit with version v0.2.0: job %s, want passed; output:\n%s", r.status["deploy"], r.output.String())
	}
}

// TestActionTellsTheCommandsExitCodeFromThePlugins: a deploy command that
// exits 3 failed; it was not superseded.
func TestActionTellsTheCommandsExitCodeFromThePlugins(t *testing.T) {
	r, _ := runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"}, "STUB_DEPLOY_EXIT=3")
	out := r.output.String()
	if r.status["deploy"] != jobFailed {
		t.Errorf("job %s, want failed", r.status["deploy"])
	}
	assertContains(t, out, "outputs: outcome=held exit-code=3 ")
	if strings.Contains(out, "superseded") {
		t.Errorf("a command's exit code 3 is reported as superseded:\n%s", out)
	}
}

// TestActionOutcomes: each of the plugin's exit codes fails the step with
// that code and sets the outcome output to its own name.
func TestActionOutcomes(t *testing.T) {
	for code, outcome := range map[string]string{
		"1": "error", "2": "usage", "3": "superseded", "4": "timeout", "5": "ended", "6": "other-run", "7": "frozen",
		"127": "not-started", "130": "interrupted", "143": "interrupted",
	} {
		r, calls := runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"}, "STUB_ACQUIRE=staging="+code)
		out := r.output.String()
		if r.status["deploy"] != jobFailed || len(named(calls, stubDeploy)) != 0 {
			t.Errorf("exit code %s: job %s with %d deploys, want failed without deploying", code, r.status["deploy"], len(named(calls, stubDeploy)))
		}
		assertContains(t, out, "outputs: outcome="+outcome+" exit-code="+code+" ")
	}
}

// TestActionWithoutCommandOutputsTheToken: without a command, the action
// takes the lock, outputs the fencing token and leaves the claim.
func TestActionWithoutCommandOutputsTheToken(t *testing.T) {
	r, calls := runAction(t, "v0.2.0", map[string]any{"target": "staging", "expires-after": "45m"})
	acq := acquires(calls)
	if len(acq) != 1 || len(acq[0].command()) != 0 {
		t.Fatalf("acquire calls %v, want one without a command", acq)
	}
	if v, _ := acq[0].flag("--expires-after"); v != "45m" {
		t.Errorf("--expires-after is %q, want 45m", v)
	}
	assertContains(t, r.output.String(), "outputs: outcome=held exit-code=0 fencing-token="+stubToken)
}

// TestActionRefusesATargetThatIsNoName: the target is echoed into workflow
// commands, so anything but a namespace name is refused before use.
func TestActionRefusesATargetThatIsNoName(t *testing.T) {
	r, calls := runAction(t, "v0.2.0", map[string]any{"target": "staging\n::warning::injected", "command": "./deploy.sh staging"})
	if r.status["deploy"] != jobFailed || len(acquires(calls)) != 0 {
		t.Errorf("job %s, want failed before acquiring", r.status["deploy"])
	}
	assertContains(t, r.output.String(), "The target must be a namespace name")
}

// TestActionGivesEachJobOfARunItsOwnRunID: the jobs of one GitHub run
// share GITHUB_RUN_ID and GITHUB_RUN_ATTEMPT; the action tells the plugin
// which job this is (its check run id, else its matrix index, unless the
// workflow set BUILDLOCK_JOB), and the job's later steps (its release
// --mine) agree on it.
func TestActionGivesEachJobOfARunItsOwnRunID(t *testing.T) {
	for _, tc := range []struct {
		name               string
		jobIndex, checkRun int
		jobEnv             map[string]string
		want               string
	}{
		{name: "the first matrix entry, without a check run id", want: "5005-1/deploy/0"},
		{name: "the second matrix entry", jobIndex: 1, want: "5005-1/deploy/1"},
		{name: "a job's check run id", jobIndex: 1, checkRun: 51725241954, want: "5005-1/deploy/51725241954"},
		{name: "the workflow's own BUILDLOCK_JOB", checkRun: 51725241954, jobEnv: map[string]string{"BUILDLOCK_JOB": "eu"}, want: "5005-1/deploy/eu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStubs(t)
			r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"))
			r.jobIndex, r.checkRunID = tc.jobIndex, tc.checkRun
			w := ghWorkflow{Jobs: map[string]ghJob{"deploy": {Env: tc.jobEnv, Steps: []ghStep{
				{ID: "lock", Uses: "buildlock/buildlock@v0.2.0", With: map[string]any{"target": "staging"}},
				{Name: "release", If: "always()", Shell: "bash", Run: "kubectl-buildlock release --target staging --mine"},
			}}}}
			r.runWorkflow(w)
			var runs []string
			for _, c := range named(s.calls(t), stubPlugin) {
				runs = append(runs, c.Args[0]+" "+lock.DetectCI(c.Env).RunID)
			}
			if want := []string{"acquire " + tc.want, "release " + tc.want}; !slices.Equal(runs, want) || r.status["deploy"] != jobPassed {
				t.Errorf("job %s, the plugin ran %q, want %q; output:\n%s", r.status["deploy"], runs, want, r.output.String())
			}
		})
	}
}

// TestActionRefusesABuildlockJobThatCouldWriteToGitHubEnv: BUILDLOCK_JOB is
// written to GITHUB_ENV, so a value with a newline would add a variable of
// its own: the action refuses anything but a plain name.
func TestActionRefusesABuildlockJobThatCouldWriteToGitHubEnv(t *testing.T) {
	s := newStubs(t)
	r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"))
	w := actionWorkflow("v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"})
	job := w.Jobs["deploy"]
	job.Env = map[string]string{"BUILDLOCK_JOB": "eu\nBASH_ENV=/tmp/evil"}
	w.Jobs["deploy"] = job
	r.runWorkflow(w)
	if r.status["deploy"] != jobFailed || len(acquires(s.calls(t))) != 0 {
		t.Errorf("job %s, want failed before acquiring; output:\n%s", r.status["deploy"], r.output.String())
	}
	assertContains(t, r.output.String(), "BUILDLOCK_JOB must be letters, digits")
}

// TestActionFailsIfFrozen: fail-if-frozen passes --fail-if-frozen, and a
// frozen target fails the step with exit code 7, outcome frozen, and an
// error annotation that says what to do; without it, the plugin waits.
func TestActionFailsIfFrozen(t *testing.T) {
	r, calls := runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging", "fail-if-frozen": "true"}, "STUB_ACQUIRE=staging=7")
	acq := acquires(calls)
	if len(acq) != 1 || !slices.Contains(acq[0].Args, "--fail-if-frozen") || r.status["deploy"] != jobFailed {
		t.Fatalf("job %s, acquire calls %v; want failed after one acquire --fail-if-frozen", r.status["deploy"], acq)
	}
	out := r.output.String()
	assertContains(t, out, "outputs: outcome=frozen exit-code=7 ", "::error title=buildlock frozen on staging::", "kubectl buildlock override")

	_, calls = runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"})
	if acq := acquires(calls); len(acq) != 1 || slices.Contains(acq[0].Args, "--fail-if-frozen") {
		t.Errorf("without fail-if-frozen, acquire ran as %v", acq)
	}
	r, calls = runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging", "fail-if-frozen": "maybe"})
	if r.status["deploy"] != jobFailed || len(acquires(calls)) != 0 {
		t.Errorf("fail-if-frozen: maybe: job %s, want failed before acquiring", r.status["deploy"])
	}
	assertContains(t, r.output.String(), "fail-if-frozen must be true or false")
}
