package tekton

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/yaml"
)

// root is the repository, from this package's directory.
const root = "../../.."

const (
	taskFile     = "tekton/task/buildlock-deploy/0.1/buildlock-deploy.yaml"
	pipelineFile = "examples/tekton/pipeline.yaml"
)

// load reads rel strictly into obj (a field Tekton does not know fails) and
// sets Tekton's defaults, as its webhook does.
func load[T interface{ SetDefaults(context.Context) }](t *testing.T, rel string, obj T) T {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	obj.SetDefaults(context.Background())
	return obj
}

func loadTask(t *testing.T) *v1.Task { return load(t, taskFile, &v1.Task{}) }

func loadPipeline(t *testing.T) *v1.Pipeline { return load(t, pipelineFile, &v1.Pipeline{}) }

// TestValidate: the webhook would admit the Task and the Pipeline.
func TestValidate(t *testing.T) {
	if err := loadTask(t).Validate(context.Background()); err != nil {
		t.Errorf("%s: %v", taskFile, err)
	}
	if err := loadPipeline(t).Validate(context.Background()); err != nil {
		t.Errorf("%s: %v", pipelineFile, err)
	}
}

// TestPipelineParamsMatchTheTask: each pipeline task gives the catalog Task
// every param it requires, with the declared type, and no other.
func TestPipelineParamsMatchTheTask(t *testing.T) {
	task := loadTask(t)
	specs := map[string]v1.ParamSpec{}
	for _, ps := range task.Spec.Params {
		specs[ps.Name] = ps
	}
	for _, pt := range loadPipeline(t).Spec.Tasks {
		if pt.TaskRef == nil || pt.TaskRef.Name != task.Name {
			t.Errorf("pipeline task %s: want taskRef %s", pt.Name, task.Name)
			continue
		}
		given := map[string]bool{}
		for _, p := range pt.Params {
			given[p.Name] = true
			spec, ok := specs[p.Name]
			switch {
			case !ok:
				t.Errorf("pipeline task %s: Task %s has no param %s", pt.Name, task.Name, p.Name)
			case string(p.Value.Type) != string(spec.Type):
				t.Errorf("pipeline task %s: param %s is a %s, the Task declares a %s", pt.Name, p.Name, p.Value.Type, spec.Type)
			}
		}
		for name, spec := range specs {
			if spec.Default == nil && !given[name] {
				t.Errorf("pipeline task %s: the Task's param %s has no default and is not given", pt.Name, name)
			}
		}
	}
}

// TestCatalogMetadata: the Task carries what the Tekton catalog and Artifact
// Hub read, and its version is its directory's.
func TestCatalogMetadata(t *testing.T) {
	task := loadTask(t)
	dir := filepath.Base(filepath.Dir(taskFile))
	if v := task.Labels["app.kubernetes.io/version"]; v != dir {
		t.Errorf("label app.kubernetes.io/version is %q, want %q (its directory)", v, dir)
	}
	if name := strings.TrimSuffix(filepath.Base(taskFile), ".yaml"); task.Name != name {
		t.Errorf("the Task is named %q, its file %q", task.Name, name)
	}
	a := task.Annotations
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(a["tekton.dev/pipelines.minVersion"]) {
		t.Errorf("tekton.dev/pipelines.minVersion %q is not a version", a["tekton.dev/pipelines.minVersion"])
	}
	// The catalog's categories (tektoncd/hub config.yaml) that fit.
	if c := a["tekton.dev/categories"]; !slices.Contains([]string{"Deployment", "Automation", "CLI"}, c) {
		t.Errorf("tekton.dev/categories %q is not one of the catalog's", c)
	}
	for _, key := range []string{"tekton.dev/tags", "tekton.dev/displayName", "tekton.dev/platforms"} {
		if a[key] == "" {
			t.Errorf("annotation %s is missing", key)
		}
	}
	if task.Spec.Description == "" {
		t.Error("the Task has no description")
	}
	if _, err := os.Stat(filepath.Join(root, filepath.Dir(taskFile), "README.md")); err != nil {
		t.Errorf("the catalog wants a README.md next to the Task: %v", err)
	}
}
