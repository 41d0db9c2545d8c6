package examples

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hostileValues are branch names, commit messages and build ids an attacker
// may choose (git check-ref-format accepts the first one as a branch). Each
// creates the marker file if a shell ever evaluates it as code.
func hostileValues(marker string) map[string]string {
	return map[string]string{
		"command substitution with IFS": "fix$(touch${IFS}" + marker + ")",
		"backticks":                     "fix`touch " + marker + "`",
		"quotes and a semicolon":        `a'b"c'; touch ` + marker + `; echo '`,
		"double quote breaking out":     `x"; touch ` + marker + ` #`,
		"newline":                       "main\ntouch " + marker,
		"IFS and variables":             "${IFS}$HOME;touch${IFS}" + marker,
		"an option":                     "--target=production",
	}
}

// withHostileValues runs a pipeline in a parallel subtest for each hostile
// value, made with a marker file of the subtest's own. It checks that
// nothing ran the value, that the pipeline acquired and deployed to staging
// and then production, and lets check look at the stubs' calls and the
// output.
func withHostileValues(t *testing.T, run func(t *testing.T, s *stubs, value string) string, check func(t *testing.T, calls []call, out, value string)) {
	t.Helper()
	for name := range hostileValues("") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "PWNED")
			value := hostileValues(marker)[name]
			s := newStubs(t)
			out := run(t, s, value)
			assertNotRun(t, marker, out)
			calls := s.calls(t)
			if n := len(acquires(calls)); n != 2 {
				t.Fatalf("got %d acquire calls, want 2 (staging, production); output:\n%s", n, out)
			}
			check(t, calls, out, value)
			assertDeployed(t, calls, out, "staging", "production")
		})
	}
}

// assertNotRun fails the test when the marker file exists.
func assertNotRun(t *testing.T, marker, output string) {
	t.Helper()
	_, err := os.Stat(marker)
	if err == nil {
		t.Errorf("a hostile value ran as code (%s exists); output:\n%s", marker, output)
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// assertFlags fails the test unless every call passes each flag with want.
func assertFlags(t *testing.T, calls []call, want string, flags ...string) {
	t.Helper()
	for _, c := range calls {
		for _, f := range flags {
			if got, _ := c.flag(f); got != want {
				t.Errorf("%s %q: %s is %q, want %q", c.Name, c.Args, f, got, want)
				break
			}
		}
	}
}

// assertEnv fails the test unless the call had each variable set to want.
func assertEnv(t *testing.T, c call, want string, vars ...string) {
	t.Helper()
	for _, v := range vars {
		if c.Env[v] != want {
			t.Errorf("%s got %s=%q, want %q", c.Name, v, c.Env[v], want)
		}
	}
}

// envIntact returns a check for withHostileValues: every plugin call has
// pluginVars, and every deploy deployVars, set to the hostile value.
func envIntact(pluginVars []string, deployVars ...string) func(t *testing.T, calls []call, _, value string) {
	return func(t *testing.T, calls []call, _, value string) {
		t.Helper()
		for _, c := range named(calls, stubPlugin) {
			assertEnv(t, c, value, pluginVars...)
		}
		for _, d := range named(calls, stubDeploy) {
			assertEnv(t, d, value, deployVars...)
		}
	}
}

// assertDeployed fails the test unless ./deploy.sh ran once per target, in
// order, with the target as its argument and the fencing token and target in
// its environment.
func assertDeployed(t *testing.T, calls []call, output string, targets ...string) {
	t.Helper()
	deploys := named(calls, stubDeploy)
	if len(deploys) != len(targets) {
		t.Fatalf("./deploy.sh ran %d times, want %d (%v); output:\n%s", len(deploys), len(targets), targets, output)
	}
	for i, d := range deploys {
		if !slices.Equal(d.Args, []string{targets[i]}) || d.Env["BUILDLOCK_FENCING_TOKEN"] != stubToken || d.Env["BUILDLOCK_TARGET"] != targets[i] {
			t.Errorf("./deploy.sh %q ran with BUILDLOCK_FENCING_TOKEN=%q BUILDLOCK_TARGET=%q, want %s with token %s",
				d.Args, d.Env["BUILDLOCK_FENCING_TOKEN"], d.Env["BUILDLOCK_TARGET"], targets[i], stubToken)
		}
	}
}

// TestTektonPassesParamsAsData runs the example Pipeline with hostile repo,
// branch and build params: no step may run them, and the plugin must receive
// each intact.
func TestTektonPassesParamsAsData(t *testing.T) {
	p, tasks := tektonExample(t)
	for _, task := range tasks {
		for _, step := range task.Spec.Steps {
			if strings.Contains(step.Script, "$(params.") {
				t.Errorf("Task %s step %s: a $(params.x) in a script is pasted in as code; pass it through env", task.Metadata.Name, step.Name)
			}
		}
	}
	withHostileValues(t, func(t *testing.T, s *stubs, value string) string {
		params := map[string]any{"repo": value, "branch": value, "build": value}
		return runTektonPipeline(t, s, p, tasks, params, nil).output.String()
	}, func(t *testing.T, calls []call, _, value string) {
		assertFlags(t, named(calls, stubPlugin), value, "--repo", "--branch", "--build")
	})
}

// TestGitHubPassesValuesAsData runs the example workflow for a push whose
// repository, branch, run number and commit message are hostile: the plugin
// must read them intact from its environment, and the deploy script get the
// commit message intact in CHANGE_CAUSE.
func TestGitHubPassesValuesAsData(t *testing.T) {
	w := githubExample(t)
	withHostileValues(t, func(t *testing.T, s *stubs, value string) string {
		event := ghEvent{repository: value, refName: value, headRef: value, runNumber: value, commitMessage: value}
		r := newGHRun(t, s, event, "STUB_RELEASES="+fakeRelease(t, "v0.2.0"))
		r.runWorkflow(w)
		return r.output.String()
	}, envIntact([]string{"GITHUB_REPOSITORY", "GITHUB_REF_NAME", "GITHUB_RUN_NUMBER"}, "CHANGE_CAUSE"))
}

// TestNoExpressionInGitHubScripts: a ${{ }} in a run: (or in the action's
// command input, which is script text too) is pasted in as code.
func TestNoExpressionInGitHubScripts(t *testing.T) {
	check := func(where string, steps []ghStep) {
		for i, s := range steps {
			texts := []string{s.Run}
			if strings.HasPrefix(s.Uses, "buildlock/buildlock@") {
				texts = append(texts, fmt.Sprint(s.With["command"]))
			}
			for _, text := range texts {
				if strings.Contains(text, "${{") {
					t.Errorf("%s step %d (%s): a ${{ }} in script text runs its value as code; pass it through env", where, i, s.Name)
				}
			}
		}
	}
	for name, job := range githubExample(t).Jobs {
		check("examples/github-actions/deploy.yaml job "+name, job.Steps)
	}
	var a ghAction
	readYAML(t, "action.yml", &a)
	check("action.yml", a.Runs.Steps)
}

// TestGitLabPassesValuesAsData runs the example pipeline with hostile
// predefined variables: the plugin must read them intact from its
// environment, and the deploy script get the commit title intact.
func TestGitLabPassesValuesAsData(t *testing.T) {
	p := gitlabExample(t)
	withHostileValues(t, func(t *testing.T, s *stubs, value string) string {
		vars := gitlabPredefined()
		for _, v := range []string{"CI_PROJECT_PATH", "CI_COMMIT_REF_NAME", "CI_COMMIT_BRANCH", "CI_PIPELINE_IID", "CI_COMMIT_TITLE", "CI_COMMIT_MESSAGE"} {
			vars[v] = value
		}
		return runGitLab(t, s, p, vars, nil).output.String()
	}, envIntact([]string{"CI_PROJECT_PATH", "CI_COMMIT_REF_NAME", "CI_PIPELINE_IID"}, "CHANGE_CAUSE"))
}

// TestJenkinsPassesValuesAsData runs the example Jenkinsfile with hostile
// job name, branch, build number and change title: the plugin must read them
// intact from its environment, and the deploy script get the title intact.
func TestJenkinsPassesValuesAsData(t *testing.T) {
	requireTool(t, "groovy")
	withHostileValues(t, func(t *testing.T, s *stubs, value string) string {
		vars := map[string]string{}
		for _, v := range []string{"JOB_NAME", "BRANCH_NAME", "GIT_BRANCH", "BUILD_NUMBER", "CHANGE_TITLE"} {
			vars[v] = value
		}
		return runJenkins(t, s, vars).output
	}, envIntact([]string{"JOB_NAME", "BRANCH_NAME", "BUILD_NUMBER"}, "CHANGE_TITLE"))
}
