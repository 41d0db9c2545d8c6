package examples

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Issue 22: each integration takes the rollback input (and its reason, as
// data), and the Tekton Task puts its claim on its pipeline's line.

// assertRollsBack fails the test unless the calls acquired staging once,
// with --rollback and exactly reason (nil: without --rollback).
func assertRollsBack(t *testing.T, calls []call, reason *string, output string) {
	t.Helper()
	acq := acquires(calls)
	if len(acq) == 0 {
		t.Fatalf("nothing acquired; output:\n%s", output)
	}
	first := acq[0]
	rollback := slices.Contains(first.Args[:max(slices.Index(first.Args, "--"), 0)], "--rollback") ||
		slices.Index(first.Args, "--") < 0 && slices.Contains(first.Args, "--rollback")
	got, hasReason := first.flag("--reason")
	switch {
	case reason == nil && (rollback || hasReason):
		t.Errorf("acquired with %q, want no --rollback; output:\n%s", first.Args, output)
	case reason != nil && (!rollback || got != *reason):
		t.Errorf("acquired with %q, want --rollback --reason %q; output:\n%s", first.Args, *reason, output)
	}
}

// rollbackReason is a reason a person types, with what a shell or a CI
// system must not interpret.
func rollbackReason(marker string) string {
	return `INC-7: 42 "breaks" checkout; $(touch ` + marker + `) ${HOME} ` + "`touch " + marker + "`"
}

func TestActionRollsBackOnPurpose(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "PWNED")
	reason := rollbackReason(marker)
	r, calls := runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging", "rollback": "true", "reason": reason})
	assertNotRun(t, marker, r.output.String())
	assertRollsBack(t, calls, &reason, r.output.String())
	assertDeployed(t, calls, r.output.String(), "staging")

	r, calls = runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging"})
	assertRollsBack(t, calls, nil, r.output.String())

	r, calls = runAction(t, "v0.2.0", map[string]any{"target": "staging", "command": "./deploy.sh staging", "rollback": "yes"})
	if r.status["deploy"] != jobFailed || len(acquires(calls)) != 0 {
		t.Errorf("rollback: yes: job %s with %d acquires, want failed before acquiring", r.status["deploy"], len(acquires(calls)))
	}
	assertContains(t, r.output.String(), "rollback must be true or false")
}

func TestGitLabComponentRollsBackOnPurpose(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "PWNED")
	reason := rollbackReason(marker)
	top, err := gitlabInclude(t, map[string]any{"include": []any{map[string]any{
		"component": "gitlab.example.com/platform/buildlock/buildlock@v0.2.0",
		"inputs":    map[string]any{"target": "staging", "image": "deploy", "command": "./deploy.sh staging", "rollback": true, "reason": reason},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	s := newStubs(t)
	run := runGitLab(t, s, gitlabPipelineOf(t, "a rollback with the component", top), gitlabPredefined(), nil)
	out := run.output.String()
	assertNotRun(t, marker, out)
	assertRollsBack(t, s.calls(t), &reason, out)
	assertDeployed(t, s.calls(t), out, "staging")

	s = newStubs(t)
	run = runGitLab(t, s, gitlabComponentExample(t), gitlabPredefined(), nil)
	assertRollsBack(t, s.calls(t), nil, run.output.String())
}

func TestJenkinsStepRollsBackOnPurpose(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "PWNED")
	reason := rollbackReason(marker)
	// The reason comes from a build parameter: an environment variable, data.
	jenkinsfile := rollbackJenkinsfile(t, "rollback: true, reason: env.ROLLBACK_REASON")
	s := newStubs(t)
	run := runJenkinsfile(t, s, jenkinsfile, map[string]string{"ROLLBACK_REASON": reason})
	assertNotRun(t, marker, run.output)
	if run.result != "SUCCESS" {
		t.Fatalf("result %s; output:\n%s", run.result, run.output)
	}
	assertRollsBack(t, s.calls(t), &reason, run.output)
	assertDeployed(t, s.calls(t), run.output, "staging")

	s = newStubs(t)
	run = runJenkins(t, s, nil)
	assertRollsBack(t, s.calls(t), nil, run.output)

	s = newStubs(t)
	run = runJenkinsfile(t, s, rollbackJenkinsfile(t, "rollback: true"), nil)
	if run.result != "FAILURE" || len(acquires(s.calls(t))) != 0 {
		t.Errorf("a rollback without a reason: result %s after %d acquires, want FAILURE before any", run.result, len(acquires(s.calls(t))))
	}
	assertContains(t, run.output, "rollback needs a reason")
}

// rollbackJenkinsfile writes a Jenkinsfile whose one stage rolls back
// staging with the buildlock step given args, and returns its path.
func rollbackJenkinsfile(t *testing.T, args string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Jenkinsfile")
	if err := os.WriteFile(path, []byte(`@Library('buildlock@v0.2.0') _
pipeline {
  agent { label 'deploy' }
  stages {
    stage('Roll back staging') {
      steps {
        buildlock(target: 'staging', `+args+`) {
          sh './deploy.sh staging'
        }
      }
    }
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTektonTaskRollsBackOnPurposeOnItsPipelinesLine(t *testing.T) {
	p, tasks := tektonExample(t)
	marker := filepath.Join(t.TempDir(), "PWNED")
	reason := rollbackReason(marker)
	for i := range p.Spec.Tasks {
		pt := &p.Spec.Tasks[i]
		pt.Params = append(pt.Params, struct {
			Name  string `json:"name"`
			Value any    `json:"value"`
		}{"rollback", "true"}, struct {
			Name  string `json:"name"`
			Value any    `json:"value"`
		}{"reason", "$(params.reason)"})
	}
	p.Spec.Params = append(p.Spec.Params, tektonParamSpec{Name: "reason", Default: ""})
	s := newStubs(t)
	run := runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main", "build": "41", "reason": reason}, nil)
	out := run.output.String()
	assertNotRun(t, marker, out)
	calls := s.calls(t)
	assertRollsBack(t, calls, &reason, out)
	for _, c := range named(calls, stubPlugin) {
		if w := c.Env["BUILDLOCK_WORKFLOW"]; w != "build-and-deploy" {
			t.Errorf("%s ran with BUILDLOCK_WORKFLOW %q, want the pipeline's name build-and-deploy (its pods' tekton.dev/pipeline label)", c.Args[0], w)
		}
	}

	p, tasks = tektonExample(t)
	s = newStubs(t)
	run = runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main", "build": "42"}, nil)
	assertRollsBack(t, s.calls(t), nil, run.output.String())
}
