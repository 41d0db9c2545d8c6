package chaos

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// TestStaleClaimsCacheKeepsHolder: a manager whose claims cache has not yet
// seen the holder, while its Lease cache has the grant that names it (the
// two informers list and watch separately: after a 410 Gone one may
// re-list seconds after the other), must not free the lock or give it to
// another claim. The Lease compare-and-swap cannot stop that decision: the
// Lease it was computed from is current; only the claims are stale.
//
// Found by the chaos runs after the operator began deciding from the cache
// (main's 96ad842): a live pod-less holder Released/LockLost 8–18 s before
// its expiry, the Lease freed or handed to a claim already Superseded, seen
// in 4 of 5 short runs (no-preemption). Regression test for bug 5 of
// docs/reliability.md, fixed in 88a20d8 (holderGone: a decision that moves
// the grant off a holder the claims do not show reads that claim live
// first); it failed before that commit.
func TestStaleClaimsCacheKeepsHolder(t *testing.T) {
	cfg, c := regressionTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := testNamespace(ctx, t, c, "stale")

	// The first manager grants the lock to a pod-less claim with a long
	// hold, and goes.
	first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
	if err != nil {
		t.Fatal(err)
	}
	create(t, c, ns, "holder", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1,
		ExpiresAfter: &metav1.Duration{Duration: time.Minute}})
	waitPhase(t, c, ns, "holder", buildlockv1.PhaseHeld, 15*time.Second)
	_ = first.Stop()

	// The second manager's cached lists of claims do not have the holder
	// yet (its claims informer is behind its Lease informer); its live
	// reads are as they are.
	var stale atomic.Bool
	stale.Store(true)
	hide := interceptor.Funcs{List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if err := cl.List(ctx, list, opts...); err != nil {
			return err
		}
		if bls, ok := list.(*buildlockv1.BuildLockList); ok && stale.Load() {
			kept := bls.Items[:0]
			for _, bl := range bls.Items {
				if bl.Name != "holder" {
					kept = append(kept, bl)
				}
			}
			bls.Items = kept
		}
		return nil
	}}
	second, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, NewClient: testenv.InterceptClient(hide)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()
	// A waiter arrives, so that the lock is decided now.
	create(t, c, ns, "waiter", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/web", Branch: "main", Build: 7,
		ExpiresAfter: &metav1.Duration{Duration: time.Minute}})
	time.Sleep(3 * time.Second)
	stale.Store(false)
	nudge(t, c, ns, "waiter")
	time.Sleep(2 * time.Second)

	var lease coordinationv1.Lease
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: LeasePrefix + "staging"}, &lease); err != nil {
		t.Fatal(err)
	}
	var bl buildlockv1.BuildLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "holder"}, &bl); err != nil {
		t.Fatal(err)
	}
	if want := holderIdentity(bl.Name, bl.UID); lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != want {
		t.Errorf("the Lease names %v, not the live holder %s", ptrString(lease.Spec.HolderIdentity), want)
	}
	if bl.Status.Phase != buildlockv1.PhaseHeld {
		t.Errorf("the live holder ended %s/%s (%s) 58 s before its expiry", bl.Status.Phase, bl.Status.Reason, bl.Status.Message)
	}
}

func ptrString(s *string) string {
	if s == nil {
		return "nobody"
	}
	return *s
}

// TestStaleRenewalKeepsHolder: a manager whose cached claims show the
// holder without its latest renewal (its claims informer behind its Lease
// informer) must not expire the hold: the renewal extends it, and the Lease
// compare-and-swap cannot stop the decision, since the Lease is current.
//
// Bug 6 of docs/reliability.md, seen in the soak (seed 3220109581): two
// renewing pod-less holders ended Expired 8–10 s before their earliest
// expiry. Fixed in 6820caa: an expiry is confirmed on the holder's claim as
// the API server has it (expiryStale in internal/controller).
func TestStaleRenewalKeepsHolder(t *testing.T) {
	cfg, c := regressionTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := testNamespace(ctx, t, c, "renew")
	clock := &warpClock{}

	// The first manager grants a pod-less hold of 10 s, records a renewal
	// sent 8 s in, and goes.
	first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, Clock: skewClock{base: clock}})
	if err != nil {
		t.Fatal(err)
	}
	create(t, c, ns, "holder", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1,
		ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}})
	waitPhase(t, c, ns, "holder", buildlockv1.PhaseHeld, 15*time.Second)
	var before buildlockv1.BuildLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "holder"}, &before); err != nil {
		t.Fatal(err)
	}
	clock.advance(8 * time.Second)
	renewLate(t, c, ns, "holder", clock.Now())
	deadline := time.Now().Add(15 * time.Second)
	for {
		var bl buildlockv1.BuildLock
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "holder"}, &bl); err == nil && bl.Status.RenewedAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal was never recorded")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = first.Stop()

	// The second manager's cached lists of claims show the holder as it
	// was before the renewal.
	var stale atomic.Bool
	stale.Store(true)
	old := func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if err := cl.List(ctx, list, opts...); err != nil {
			return err
		}
		if bls, ok := list.(*buildlockv1.BuildLockList); ok && stale.Load() {
			for i := range bls.Items {
				if bls.Items[i].Name == "holder" {
					bls.Items[i] = *before.DeepCopy()
				}
			}
		}
		return nil
	}
	second, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, Clock: skewClock{base: clock},
		NewClient: testenv.InterceptClient(interceptor.Funcs{List: old})})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()
	// 3 s later the hold would have ended without the renewal; with it, it
	// has 5 s to go. A waiter arrives, so that the lock is decided now.
	clock.advance(3 * time.Second)
	create(t, c, ns, "waiter", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/web", Branch: "main", Build: 7,
		ExpiresAfter: &metav1.Duration{Duration: time.Minute}})
	time.Sleep(3 * time.Second)
	stale.Store(false)

	var bl buildlockv1.BuildLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "holder"}, &bl); err != nil {
		t.Fatal(err)
	}
	if bl.Status.Phase != buildlockv1.PhaseHeld {
		t.Errorf("the renewed holder ended %s/%s (%s) before its renewed expiry", bl.Status.Phase, bl.Status.Reason, bl.Status.Message)
	}
}

// TestStaleClaimsCacheDoesNotRestoreAnEndedHold: a manager whose cached
// claims still show a holder that its owner deleted (its claims informer
// behind) must not write that holder's grant back into the Lease another
// manager freed. Rule 11 restores a grant record that someone else changed
// from the claims, and here the claims are stale: the Lease's token did not
// change when it was freed, so the compare-and-swap cannot catch it.
//
// Bug 7 of docs/reliability.md (fixed in edbfc08), seen in the short chaos
// runs of issue 21 (seed 1, twice in four runs): the grant Lease named a
// claim deleted a second or two before, with its token, for a few hundred
// milliseconds; with enforcement on, the Lease admits that claim's pod
// again.
func TestStaleClaimsCacheDoesNotRestoreAnEndedHold(t *testing.T) {
	cfg, c := regressionTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := testNamespace(ctx, t, c, "restore")

	// The second manager's cached lists of claims keep the holder as it
	// was last seen, while stale.
	var stale atomic.Bool
	var held atomic.Pointer[buildlockv1.BuildLock]
	keep := func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if err := cl.List(ctx, list, opts...); err != nil {
			return err
		}
		bls, ok := list.(*buildlockv1.BuildLockList)
		if h := held.Load(); ok && stale.Load() && h != nil && !slices.ContainsFunc(bls.Items, func(bl buildlockv1.BuildLock) bool { return bl.UID == h.UID }) {
			bls.Items = append(bls.Items, *h.DeepCopy())
		}
		return nil
	}
	first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	second, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, NewClient: testenv.InterceptClient(interceptor.Funcs{List: keep})})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()

	create(t, c, ns, "holder", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1,
		ExpiresAfter: &metav1.Duration{Duration: time.Minute}})
	waitPhase(t, c, ns, "holder", buildlockv1.PhaseHeld, 15*time.Second)
	var bl buildlockv1.BuildLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "holder"}, &bl); err != nil {
		t.Fatal(err)
	}
	held.Store(bl.DeepCopy())
	stale.Store(true)
	// The owner releases it: the first manager frees the lock; the second
	// sees that write, with the holder still in its cache.
	if err := c.Delete(ctx, &bl); err != nil {
		t.Fatal(err)
	}
	identity := holderIdentity(bl.Name, bl.UID)
	freed := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var lease coordinationv1.Lease
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: LeasePrefix + "staging"}, &lease); err != nil {
			continue
		}
		names := lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == identity
		if !names {
			freed = true
		}
		if names && freed {
			t.Fatalf("the grant Lease (rv %s) names %s again, with token %d, after it was freed: the claim was deleted",
				lease.ResourceVersion, identity, ptr.Deref(lease.Spec.LeaseTransitions, 0))
		}
	}
	if !freed {
		t.Errorf("the grant Lease still names %s 5 s after its claim was deleted", identity)
	}
}
