package lock

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PipelineRunGVK is the kind of a Tekton PipelineRun, read by
// PipelineRunBuild without Tekton's Go types.
var PipelineRunGVK = schema.GroupVersionKind{Group: "tekton.dev", Version: "v1", Kind: "PipelineRun"}

// PipelineRunBuild returns the build number of the Tekton PipelineRun name
// in namespace: its creation time, in seconds since 1970-01-01 UTC. Tekton
// numbers no builds; a PipelineRun created later is a newer build, and the
// API server, not the client, stamps the time. Two PipelineRuns created in
// the same second get the same number, and the later one counts as a re-run
// of the earlier. c needs get on pipelineruns.tekton.dev.
func PipelineRunBuild(ctx context.Context, c client.Reader, namespace, name string) (int64, error) {
	pr := &unstructured.Unstructured{}
	pr.SetGroupVersionKind(PipelineRunGVK)
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pr); err != nil {
		return 0, fmt.Errorf("reading PipelineRun %s/%s: %w", namespace, name, err)
	}
	created := pr.GetCreationTimestamp()
	if created.IsZero() {
		return 0, fmt.Errorf("PipelineRun %s/%s has no creationTimestamp", namespace, name)
	}
	return created.Unix(), nil
}
