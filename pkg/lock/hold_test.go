package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// TestTheRenewer: a renewer of an attached claim renews at once; one of a
// claim that is gone (deleted, or another object of its name) stops by
// itself; one whose renewals fail reports them and, at its deadline,
// lapses, so that the holder stops before the claim can expire.
func TestTheRenewer(t *testing.T) {
	bl := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1}.BuildLock()
	bl.UID = "uid-1"
	gvr := schema.GroupResource{Group: buildlockv1.GroupVersion.Group, Resource: "buildlocks"}
	for name, tc := range map[string]struct {
		err       error
		wantStop  bool
		wantLapse bool
	}{
		"renewals that succeed":            {},
		"a deleted claim":                  {err: apierrors.NewNotFound(gvr, bl.Name), wantStop: true},
		"another claim of the name":        {err: apierrors.NewConflict(gvr, bl.Name, errors.New("the UID precondition failed")), wantStop: true},
		"renewals that fail (no right to)": {err: apierrors.NewForbidden(gvr, bl.Name, errors.New("no patch")), wantLapse: true},
		"renewals that fail (unreachable)": {err: errors.New("dial tcp: connection refused"), wantLapse: true},
	} {
		t.Run(name, func(t *testing.T) {
			var patches atomic.Int32
			c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithObjects(bl.DeepCopy()).Build(), interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					patches.Add(1)
					if tc.err != nil {
						return tc.err
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
			})
			var reported atomic.Int32
			deadline := time.Hour
			if tc.wantLapse {
				deadline = 200 * time.Millisecond
			}
			r := startRenewer(c, bl, 10*time.Millisecond, deadline, true, func(error) { reported.Add(1) })
			defer r.stop()
			waitFor(t, func() bool { return patches.Load() > 0 })
			switch {
			case tc.wantStop:
				<-r.done
			case tc.wantLapse:
				<-r.lapsed
				if reported.Load() == 0 {
					t.Error("no failed renewal was reported")
				}
			default:
				waitFor(t, func() bool { return patches.Load() >= 3 })
				if reported.Load() != 0 {
					t.Errorf("%d renewals reported as failed", reported.Load())
				}
			}
			select {
			case <-r.lapsed:
				if !tc.wantLapse {
					t.Error("the renewer lapsed")
				}
			default:
			}
		})
	}
	var nilRenewer *renewer
	nilRenewer.stop() // a claim with a pod has none
}
