package lock

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The two writes this package makes to an existing claim. Both are guarded
// by the claim's UID, so that a write meant for one claim never lands on a
// newer claim of the same name (a claim is deleted and created again under
// its name by re-runs and retries).

// patchClaim applies the JSON merge patch to bl with bl's UID in it: the API
// server refuses the patch (409 Conflict) when the BuildLock of that name is
// another object.
func patchClaim(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock, patch map[string]any) error {
	metadata, _ := patch["metadata"].(map[string]any)
	if metadata == nil {
		metadata = map[string]any{}
		patch["metadata"] = metadata
	}
	metadata["uid"] = bl.UID
	data, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encoding a patch of BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	if err := c.Patch(ctx, objectKey(bl), client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("patching BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	return nil
}

// deleteClaim deletes bl if it is still the same object (its UID) and, with
// sameVersion, still the version that was read (its resourceVersion). gone
// says the claim was already gone (or, without sameVersion, replaced by
// another object of its name). With sameVersion, a claim that changed since
// it was read gives a Conflict error: read it again and decide again.
func deleteClaim(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock, sameVersion bool) (gone bool, err error) {
	preconditions := client.Preconditions{UID: &bl.UID}
	if sameVersion {
		preconditions.ResourceVersion = &bl.ResourceVersion
	}
	err = c.Delete(ctx, objectKey(bl), preconditions)
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err) && !sameVersion:
		return true, nil
	}
	return false, fmt.Errorf("deleting BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
}

// objectKey is a BuildLock with only bl's namespace and name, to write to.
func objectKey(bl *buildlockv1.BuildLock) *buildlockv1.BuildLock {
	return &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: bl.Name}}
}
