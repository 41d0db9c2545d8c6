package examples

import (
	"errors"
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
	for name := range hostileValues("") {
		t.Run(name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "PWNED")
			value := hostileValues(marker)[name]
			s := newStubs(t)
			run := runTektonPipeline(t, s, p, tasks, map[string]any{"repo": value, "branch": value, "build": value}, nil)
			out := run.output.String()
			assertNotRun(t, marker, out)
			calls := s.calls(t)
			acq := acquires(calls)
			if len(acq) != 2 {
				t.Fatalf("got %d acquire calls, want 2 (staging, production); output:\n%s", len(acq), out)
			}
			assertFlags(t, named(calls, stubPlugin), value, "--repo", "--branch", "--build")
			assertDeployed(t, calls, out, "staging", "production")
		})
	}
}
