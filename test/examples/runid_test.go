package examples

import (
	"strings"
	"testing"

	"github.com/buildlock/buildlock/pkg/lock"
)

// runIDs returns, per target, the run ids (as the plugin computes them from
// its environment) of the plugin's acquire and release calls on it.
func runIDs(calls []call) map[string][]string {
	ids := map[string][]string{}
	for _, c := range named(calls, stubPlugin) {
		target, _ := c.flag("--target")
		ids[target] = append(ids[target], c.Args[0]+" "+lock.DetectCI(c.Env).RunID)
	}
	return ids
}

// assertAJobPerTarget fails the test unless each target's acquire and
// release agree on a run id, and the two targets' jobs have different ones.
func assertAJobPerTarget(t *testing.T, calls []call, output string) {
	t.Helper()
	ids := runIDs(calls)
	var seen []string
	for _, target := range []string{"staging", "production"} {
		got := ids[target]
		if len(got) != 2 || got[0][len("acquire "):] != got[1][len("release "):] || got[0][len("acquire "):] == "" {
			t.Errorf("%s: the plugin ran %q, want an acquire and a release of one run id; output:\n%s", target, got, output)
			continue
		}
		seen = append(seen, got[0][len("acquire "):])
	}
	if len(seen) == 2 && seen[0] == seen[1] {
		t.Errorf("the staging and production jobs share the run id %q", seen[0])
	}
}

// TestTektonTaskRunsHaveRunIDsOfTheirOwn: the Task passes its TaskRun's
// name to every step, so that its release step agrees with its acquire
// step on the claim, and two TaskRuns of one PipelineRun do not.
func TestTektonTaskRunsHaveRunIDsOfTheirOwn(t *testing.T) {
	p, tasks := tektonExample(t)
	s := newStubs(t)
	run := runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main", "build": "42"}, nil)
	assertAJobPerTarget(t, s.calls(t), run.output.String())
	for _, c := range named(s.calls(t), stubPlugin) {
		if ci := lock.DetectCI(c.Env); ci.PodUID != tektonPodUID {
			t.Errorf("%s: the pod's UID is %q, want it from the downward API (it proves the claim is this pod's)", c.Args[0], ci.PodUID)
		}
	}
}

// TestJenkinsStagesHaveRunIDsOfTheirOwn: each stage of the example, run
// through the shared-library step, claims under a run id of its own (the
// build tag, the stage, the workspace); the one acquire of each holds while
// the stage's body runs and releases afterwards itself. The stages wait
// for their locks without a deploy executor (assertWaitsWithoutADeployExecutor).
func TestJenkinsStagesHaveRunIDsOfTheirOwn(t *testing.T) {
	s := newStubs(t)
	run := runJenkins(t, s, nil)
	assertWaitsWithoutADeployExecutor(t, s, run)
	ids := runIDs(s.calls(t))
	var seen []string
	for _, target := range []string{"staging", "production"} {
		got := ids[target]
		if len(got) != 1 || !strings.HasPrefix(got[0], "acquire ") || got[0] == "acquire " {
			t.Errorf("%s: the plugin ran %q, want one acquire with a run id; output:\n%s", target, got, run.output)
			continue
		}
		seen = append(seen, got[0])
	}
	if len(seen) == 2 && seen[0][len("acquire "):] == seen[1][len("acquire "):] {
		t.Errorf("the staging and production stages share the run id %q", seen[0])
	}
}
