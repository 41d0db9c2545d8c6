package tekton

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/yaml"
)

const sampleFile = "tekton/task/buildlock-deploy/0.1/samples/taskrun.yaml"

// placeholder is the image default of the Task in the repository, which
// hack/tekton-pin.sh replaces with the release's image.
const placeholder = "ghcr.io/buildlock/kubectl-buildlock:unreleased@sha256:0000000000000000000000000000000000000000000000000000000000000000"

// pin runs hack/tekton-pin.sh ref on the Task text task.
func pin(t *testing.T, ref, task string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "hack", "tekton-pin.sh"), ref)
	cmd.Stdin = strings.NewReader(task)
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestTheReleasedTaskPinsItsImageByDigest: the Task that the release
// attaches is the repository's with the image param defaulting to the
// release's plugin image by digest, and nothing else changed; the webhook
// would admit it. The repository's own default is the placeholder.
func TestTheReleasedTaskPinsItsImageByDigest(t *testing.T) {
	source, err := os.ReadFile(filepath.Join(root, taskFile))
	if err != nil {
		t.Fatal(err)
	}
	imageDefault := func(task *v1.Task) string {
		for _, p := range task.Spec.Params {
			if p.Name == "image" && p.Default != nil {
				return p.Default.StringVal
			}
		}
		return ""
	}
	if got := imageDefault(loadTask(t)); got != placeholder {
		t.Errorf("the repository's Task defaults its image to %q, want the placeholder the release replaces, %s", got, placeholder)
	}

	ref := "ghcr.io/buildlock/kubectl-buildlock:0.2.0@sha256:" + strings.Repeat("ab", 32)
	pinned, code := pin(t, ref, string(source))
	if code != 0 {
		t.Fatalf("hack/tekton-pin.sh exited %d", code)
	}
	var task v1.Task
	if err := yaml.UnmarshalStrict([]byte(pinned), &task); err != nil {
		t.Fatal(err)
	}
	task.SetDefaults(context.Background())
	if err := task.Validate(context.Background()); err != nil {
		t.Errorf("the pinned Task: %v", err)
	}
	if got := imageDefault(&task); got != ref {
		t.Errorf("the pinned Task defaults its image to %q, want %s", got, ref)
	}
	if want := strings.Replace(string(source), placeholder, ref, 1); pinned != want {
		t.Errorf("hack/tekton-pin.sh changed more than the image default")
	}

	if _, code := pin(t, "ghcr.io/buildlock/kubectl-buildlock:0.2.0", string(source)); code != 2 {
		t.Errorf("a reference without a digest: exit %d, want 2", code)
	}
	if _, code := pin(t, ref, pinned); code != 1 {
		t.Errorf("a Task without the placeholder: exit %d, want 1", code)
	}
}

// TestTheSampleTaskRunIsValid: the webhook would admit the sample TaskRun,
// which runs the catalog Task with every param it requires.
func TestTheSampleTaskRunIsValid(t *testing.T) {
	run := load(t, sampleFile, &v1.TaskRun{})
	if err := run.Validate(context.Background()); err != nil {
		t.Errorf("%s: %v", sampleFile, err)
	}
	task := loadTask(t)
	given := map[string]bool{}
	for _, p := range run.Spec.Params {
		given[p.Name] = true
	}
	for _, p := range task.Spec.Params {
		if p.Default == nil && !given[p.Name] {
			t.Errorf("the sample does not give the param %s, which has no default", p.Name)
		}
	}
}
