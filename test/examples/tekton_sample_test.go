package examples

import (
	"slices"
	"strings"
	"testing"
)

// tektonSample is the catalog Task's sample TaskRun.
const tektonSample = "tekton/task/buildlock-deploy/0.1/samples/taskrun.yaml"

// TestTektonSampleTaskRunDeploys runs the sample TaskRun against the catalog
// Task: it takes staging's lock for build 42 of acme/shop@main and deploys
// with the fencing token, with the Task's default image.
func TestTektonSampleTaskRunDeploys(t *testing.T) {
	var run struct {
		tektonObject
		Spec struct {
			ServiceAccountName string `json:"serviceAccountName"`
			Workspaces         []struct {
				Name     string   `json:"name"`
				EmptyDir struct{} `json:"emptyDir"`
			} `json:"workspaces"`
			TaskRef struct {
				Name string `json:"name"`
			} `json:"taskRef"`
			Params []struct {
				Name  string `json:"name"`
				Value any    `json:"value"`
			} `json:"params"`
		} `json:"spec"`
	}
	readYAML(t, tektonSample, &run)
	var task tektonTask
	readYAML(t, tektonCatalogTask, &task)
	if run.Kind != "TaskRun" || run.Spec.TaskRef.Name != task.Metadata.Name {
		t.Fatalf("%s is a %s of %q, want a TaskRun of %s", tektonSample, run.Kind, run.Spec.TaskRef.Name, task.Metadata.Name)
	}
	given := map[string]any{}
	for _, p := range run.Spec.Params {
		given[p.Name] = p.Value
	}
	if _, ok := given["image"]; ok {
		t.Errorf("the sample sets the image param; it shows the Task's pinned default")
	}
	s := newStubs(t)
	source := t.TempDir()
	s.deployScript(t, source)
	var out strings.Builder
	results, ok := runTektonTask(t, s, task, run.Metadata.Name, "", given, source, nil, &out)
	calls := s.calls(t)
	if !ok || results["fencing-token"] != stubToken+"\n" {
		t.Fatalf("the TaskRun failed (results %v); output:\n%s", results, out.String())
	}
	acq := acquires(calls)
	if len(acq) != 1 {
		t.Fatalf("%d acquire calls; output:\n%s", len(acq), out.String())
	}
	for flag, want := range map[string]string{"--target": "staging", "--repo": "acme/shop", "--branch": "main", "--build": "42"} {
		if got, _ := acq[0].flag(flag); got != want {
			t.Errorf("acquire %s %q, want %q", flag, got, want)
		}
	}
	deploys := named(calls, stubDeploy)
	if len(deploys) != 1 || !slices.Equal(deploys[0].Args, []string{"staging"}) || deploys[0].Env["BUILDLOCK_FENCING_TOKEN"] != stubToken {
		t.Errorf("./deploy.sh ran as %+v, want once with staging and the token; output:\n%s", deploys, out.String())
	}
}
