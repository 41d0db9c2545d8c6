//go:build bench

package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// These run without an API server: go test -tags bench -run '^TestFloor' .

// floorFixture is a fake API holding claims, and the number of writes the
// floor operator sent to it.
type floorFixture struct {
	c      client.WithWatch
	writes atomic.Int64
}

func newFloorFixture(t *testing.T, claims ...*buildlockv1.BuildLock) *floorFixture {
	t.Helper()
	f := &floorFixture{}
	objs := make([]client.Object, len(claims))
	for i, bl := range claims {
		objs[i] = bl
	}
	inner := fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithStatusSubresource(&buildlockv1.BuildLock{}).WithObjects(objs...).Build()
	f.c = interceptor.NewClient(inner, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			f.writes.Add(1)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			f.writes.Add(1)
			return c.Update(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			f.writes.Add(1)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	return f
}

func (f *floorFixture) claim(t *testing.T, name string) *buildlockv1.BuildLock {
	t.Helper()
	var bl buildlockv1.BuildLock
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &bl); err != nil {
		t.Fatal(err)
	}
	return &bl
}

func (f *floorFixture) lease(t *testing.T, target string) *coordinationv1.Lease {
	t.Helper()
	var lease coordinationv1.Lease
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: buildlockv1.GrantLeaseName(target)}, &lease); err != nil {
		t.Fatal(err)
	}
	return &lease
}

func startTestFloor(t *testing.T, f *floorFixture) *floorOperator {
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	return runFloorOperator(ctx, cancel, f.c, newCounter(), "ns", 8)
}

// The floor of a settle and a hand-off: a lock's first claim holds (its
// Lease created with token 1, then its status), the second waits, the
// third is superseded, each with one write; the holder's delete hands the
// lock to the waiter with one Lease update (token 2) and one status.
func TestFloorOperatorSettlesAndHandsOverWithTheNecessaryWritesOnly(t *testing.T) {
	var claims []*buildlockv1.BuildLock
	for k := range 3 {
		claims = append(claims, blClaim("ns", fmt.Sprintf("c-%d", k), "staging", fmt.Sprintf("acme/line-%d", k), 1, ""))
	}
	fx := newFloorFixture(t, claims...)
	f := startTestFloor(t, fx)
	for k := range 3 {
		f.decide(fx.claim(t, fmt.Sprintf("c-%d", k)))
	}
	phases := func(want ...buildlockv1.Phase) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			for k, p := range want {
				if fx.claim(t, fmt.Sprintf("c-%d", k)).Status.Phase != p {
					return false, nil
				}
			}
			return true, nil
		}
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true,
		phases(buildlockv1.PhaseHeld, buildlockv1.PhaseWaiting, buildlockv1.PhaseSuperseded)); err != nil {
		t.Fatalf("the claims never settled: %v", err)
	}
	if got := fx.writes.Load(); got != 4 {
		t.Errorf("settling 3 claims of one lock took %d writes, want 4 (a Lease create, three statuses)", got)
	}
	lease := fx.lease(t, "staging")
	holder := fx.claim(t, "c-0")
	if *lease.Spec.HolderIdentity != buildlockv1.GrantHolderIdentity("c-0", holder.UID) || *lease.Spec.LeaseTransitions != 1 {
		t.Errorf("the grant Lease names %q with token %d, want c-0 with token 1", *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions)
	}
	if holder.Status.FencingToken != 1 || holder.Status.Reason != buildlockv1.ReasonAcquired {
		t.Errorf("the holder's status: %+v", holder.Status)
	}

	f.handOver("c-0")
	f.handOver("c-2") // not a holder: nothing to do
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	if got := fx.writes.Load(); got != 6 {
		t.Errorf("the hand-off took %d writes, want 2 (the Lease update, the waiter's status)", got-4)
	}
	if p := fx.claim(t, "c-1").Status; p.Phase != buildlockv1.PhaseHeld || p.FencingToken != 2 {
		t.Errorf("the waiter after the hand-off: %s with token %d, want Held with token 2", p.Phase, p.FencingToken)
	}
	lease = fx.lease(t, "staging")
	if *lease.Spec.HolderIdentity != buildlockv1.GrantHolderIdentity("c-1", fx.claim(t, "c-1").UID) || *lease.Spec.LeaseTransitions != 2 {
		t.Errorf("the grant Lease names %q with token %d, want c-1 with token 2", *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions)
	}
}

// The cold start's floor: one list, then per lock a Lease create and a status
// per claim: claims + locks writes, every claim decided.
func TestFloorOperatorDecidesAColdStartWithOneWritePerClaimAndPerLock(t *testing.T) {
	const locks = 5
	var claims []*buildlockv1.BuildLock
	for i := range locks * claimsPerLock {
		claims = append(claims, blClaim("ns", fmt.Sprintf("c-%d", i), fmt.Sprintf("t%d", i/claimsPerLock), fmt.Sprintf("acme/line-%d", i%claimsPerLock), 1, ""))
	}
	fx := newFloorFixture(t, claims...)
	f := startTestFloor(t, fx)
	if err := f.decideListed(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := fx.writes.Load(), int64(len(claims)+locks); got != want {
		t.Errorf("%d writes, want %d", got, want)
	}
	for lock := range locks {
		got := map[buildlockv1.Phase]int{}
		for k := range claimsPerLock {
			got[fx.claim(t, fmt.Sprintf("c-%d", lock*claimsPerLock+k)).Status.Phase]++
		}
		want := map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: 1, buildlockv1.PhaseWaiting: 1, buildlockv1.PhaseSuperseded: claimsPerLock - 2}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("lock t%d: %v, want %v", lock, got, want)
		}
		if lease := fx.lease(t, fmt.Sprintf("t%d", lock)); *lease.Spec.LeaseTransitions != 1 {
			t.Errorf("lock t%d: token %d, want 1", lock, *lease.Spec.LeaseTransitions)
		}
	}
}

// A write the API refuses fails the run at once (its context), rather than
// leaving the load waiting for a verdict that will not come.
func TestFloorOperatorFailsTheRunOnARefusedWrite(t *testing.T) {
	fx := newFloorFixture(t) // the claim does not exist: its status write fails
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	f := runFloorOperator(ctx, cancel, fx.c, newCounter(), "ns", 2)
	f.decide(blClaim("ns", "gone", "staging", "acme/app", 1, ""))
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the run's context was not canceled")
	}
	if err := f.stop(); err == nil || context.Cause(ctx) == nil {
		t.Fatalf("stop: %v, cause: %v; want the failed write", err, context.Cause(ctx))
	}
}
