//go:build bench

package bench

import (
	"context"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// These run without an API server: go test -tags bench -run '^TestCleanup' .

var buildlocks = schema.GroupResource{Group: buildlockv1.GroupVersion.Group, Resource: "buildlocks"}

// benchWithClaims is a bench whose API holds n claims in ns, and whose
// delete collections answer with what deleteAllOf says.
func benchWithClaims(t *testing.T, n int, deleteAllOf func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error) *bench {
	t.Helper()
	objs := make([]client.Object, n)
	for i := range objs {
		objs[i] = blClaim("ns", fmt.Sprintf("c-%d", i), "staging", "acme/app", int64(i+1), "")
	}
	inner := fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithObjects(objs...).Build()
	return &bench{ctx: context.Background(), c: interceptor.NewClient(inner, interceptor.Funcs{DeleteAllOf: deleteAllOf})}
}

func claimsLeft(t *testing.T, b *bench) int {
	t.Helper()
	var list buildlockv1.BuildLockList
	if err := b.c.List(context.Background(), &list, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// The memory step of a slow machine's run failed with "the server was unable
// to return a response in the time allotted … delete buildlocks": the API
// server answers a long delete collection with a timeout and goes on
// deleting. The cleanup sends it again and waits until the claims are gone.
func TestCleanupRetriesADeleteCollectionThatTimedOut(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"timeout", apierrors.NewTimeoutError("the server was unable to return a response in the time allotted, but may still be processing the request (delete buildlocks.buildlock.io)", 0)},
		{"server timeout", apierrors.NewServerTimeout(buildlocks, "deletecollection", 1)},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			b := benchWithClaims(t, 5, func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
				calls++
				if calls == 1 {
					// The server deletes some of them, then the request times out.
					_ = cl.Delete(ctx, blClaim("ns", "c-0", "staging", "acme/app", 1, ""))
					return c.err
				}
				return cl.DeleteAllOf(ctx, obj, opts...)
			})
			if err := b.deleteAllIn("ns", &buildlockv1.BuildLock{}, &buildlockv1.BuildLockList{}); err != nil {
				t.Fatalf("the cleanup failed: %v", err)
			}
			if calls != 2 {
				t.Errorf("%d delete collections, want 2", calls)
			}
			if n := claimsLeft(t, b); n != 0 {
				t.Errorf("%d claims left", n)
			}
		})
	}
}

// A delete collection the server accepted is waited for until nothing is
// left, so that the next step does not run beside it.
func TestCleanupWaitsUntilTheObjectsAreGone(t *testing.T) {
	base := fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithObjects(
		blClaim("ns", "c-0", "staging", "acme/app", 1, ""), blClaim("ns", "c-1", "staging", "acme/app", 2, "")).Build()
	lists := 0
	b := &bench{ctx: context.Background(), c: interceptor.NewClient(base, interceptor.Funcs{
		DeleteAllOf: func(context.Context, client.WithWatch, client.Object, ...client.DeleteAllOfOption) error {
			return nil // accepted; the deletion goes on in the server
		},
		List: func(ctx context.Context, _ client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			lists++
			if lists == 3 { // the server is done
				if err := base.DeleteAllOf(ctx, &buildlockv1.BuildLock{}, client.InNamespace("ns")); err != nil {
					return err
				}
			}
			return base.List(ctx, list, opts...)
		},
	})}
	if err := b.deleteAllIn("ns", &buildlockv1.BuildLock{}, &buildlockv1.BuildLockList{}); err != nil {
		t.Fatal(err)
	}
	if lists != 3 {
		t.Errorf("%d lists, want 3: the cleanup returned before the claims were gone", lists)
	}
}

// An error no retry fixes fails the step at once, saying what it cleaned up.
func TestCleanupFailsAtOnceOnAnErrorThatRetryingCannotFix(t *testing.T) {
	calls := 0
	b := benchWithClaims(t, 1, func(context.Context, client.WithWatch, client.Object, ...client.DeleteAllOfOption) error {
		calls++
		return apierrors.NewForbidden(buildlocks, "", fmt.Errorf("no"))
	})
	err := b.deleteAllIn("ns", &buildlockv1.BuildLock{}, &buildlockv1.BuildLockList{})
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("err %v after %d calls, want Forbidden after 1", err, calls)
	}
}

// A delete of one object that is already gone is done.
func TestCleanupTakesNotFoundForDone(t *testing.T) {
	b := benchWithClaims(t, 0, nil)
	if err := b.deleteObject(blClaim("ns", "gone", "staging", "acme/app", 1, "")); err != nil {
		t.Fatal(err)
	}
}
