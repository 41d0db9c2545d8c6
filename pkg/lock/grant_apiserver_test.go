package lock

// Issue 31, breaks 1 and 2, against the real API server: a waiter takes
// only a grant that the operator made, and a holder stops when its grant
// moves, whoever moved it. The tests play the operator (its Leases carry
// its label) and the person who edits Leases.

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// withConfirmWithin shortens GrantConfirmTimeout.
func withConfirmWithin(d time.Duration) Option {
	return func(o *options) { o.confirmWithin = d }
}

// holdResult is what an AcquireHold run in the background returned.
type holdResult struct {
	h   *Hold
	err error
}

// acquireInBackground runs AcquireHold and returns its claim once it
// exists and AcquireHold's watches have listed (what the test does next
// comes to them as events), and where its result will come.
func acquireInBackground(ctx context.Context, t *testing.T, c client.WithWatch, claim Claim, opts ...Option) (*buildlockv1.BuildLock, <-chan holdResult) {
	t.Helper()
	done := make(chan holdResult, 1)
	watching := make(chan struct{})
	opts = append(opts, func(o *options) { o.watching = func() { close(watching) } })
	go func() {
		h, err := AcquireHold(ctx, c, claim, opts...)
		done <- holdResult{h, err}
	}()
	select {
	case <-watching:
	case r := <-done:
		t.Fatalf("AcquireHold returned %v, %v before it watched", r.h, r.err)
	}
	bl := &buildlockv1.BuildLock{}
	bl.Namespace, bl.Name = claim.Namespace, Name(claim)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(bl), bl) == nil })
	return bl, done
}

// operatorGrant writes target's grant Lease as the operator does (its
// label, holder and token; holder nil: free), creating it if need be.
func operatorGrant(t *testing.T, c client.Client, ns, target string, holder *buildlockv1.BuildLock, token int64) {
	t.Helper()
	writeLease(t, c, ns, buildlockv1.GrantLeaseName(target), func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{buildlockv1.ManagedByLabel: buildlockv1.ManagedByValue, "buildlock.io/target": target}
		l.Spec.HolderIdentity = nil
		if holder != nil {
			l.Spec.HolderIdentity = ptr.To(buildlockv1.GrantHolderIdentity(holder.Name, holder.UID))
		}
		l.Spec.LeaseTransitions = ptr.To(int32(token))
	})
}

// writeLease creates or updates the Lease ns/name, changed by change:
// as a person with the rights to write Leases would.
func writeLease(t *testing.T, c client.Client, ns, name string, change func(*coordinationv1.Lease)) {
	t.Helper()
	ctx := context.Background()
	for {
		l := &coordinationv1.Lease{}
		err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, l)
		switch {
		case apierrors.IsNotFound(err):
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			change(l)
			err = c.Create(ctx, l)
		case err == nil:
			change(l)
			err = c.Update(ctx, l)
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			must(t, err)
			return
		}
	}
}

// naming makes a Lease name bl with token, leaving its labels as they are.
func naming(bl *buildlockv1.BuildLock, token int64) func(*coordinationv1.Lease) {
	return func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To(buildlockv1.GrantHolderIdentity(bl.Name, bl.UID))
		l.Spec.LeaseTransitions = ptr.To(int32(token))
	}
}

// stillWaits fails the test if AcquireHold returned within d.
func stillWaits(t *testing.T, done <-chan holdResult, d time.Duration, after string) {
	t.Helper()
	select {
	case r := <-done:
		if r.h != nil {
			t.Errorf("after %s, AcquireHold returned a hold with fencing token %d", after, r.h.Token)
			return
		}
		t.Errorf("after %s, AcquireHold returned %v", after, r.err)
	case <-time.After(d):
	}
}

// wantLost checks that lost reports a LostError with reason within 10s.
func wantLost(t *testing.T, lost <-chan error, reason string) {
	t.Helper()
	select {
	case err := <-lost:
		var l *LostError
		if !errors.As(err, &l) || l.Reason != reason {
			t.Errorf("WaitLost() = %v, want a LostError with reason %s", err, reason)
		}
		t.Logf("WaitLost: %v", err)
	case <-time.After(10 * time.Second):
		t.Errorf("WaitLost() did not return within 10s; want a LostError with reason %s", reason)
	}
}

// TestAWaiterTakesNoEditedGrantAndTheHolderStops is break 1 of issue 31:
// H holds with token 7 and W waits; someone who may write Leases names W
// in the grant Lease, with H's token. W's Acquire must not take that for
// a grant (on main it returned a hold with token 7 beside H), and H must
// stop (the grant names another claim, whoever edited it), even though
// the operator puts H back at once. W holds by the operator's next grant.
func TestAWaiterTakesNoEditedGrantAndTheHolderStops(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	hClaim := Claim{Namespace: ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 41, RunID: "run-h"}
	hBL, hDone := acquireInBackground(ctx, t, c, hClaim)
	operatorGrant(t, c, ns, "staging", hBL, 7)
	setStatus(t, c, hBL, held(7))
	r := <-hDone
	must(t, r.err)
	h := r.h
	defer func() { _ = h.Release(context.WithoutCancel(ctx)) }()
	if h.Token != 7 {
		t.Fatalf("H holds with token %d, want 7", h.Token)
	}
	holderLost := make(chan error, 1)
	go func() { holderLost <- h.WaitLost(ctx) }()

	wClaim := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 8, RunID: "run-w"}
	wBL, wDone := acquireInBackground(ctx, t, c, wClaim)
	setStatus(t, c, wBL, buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseWaiting, Reason: buildlockv1.ReasonWaitingForHolder})

	// A person names W, with H's token, as `kubectl edit lease` would.
	writeLease(t, c, ns, buildlockv1.GrantLeaseName("staging"), naming(wBL, 7))
	stillWaits(t, wDone, 2*time.Second, "an edit that names it with the holder's token")
	wantLost(t, holderLost, ReasonGrantMoved)

	// The operator puts H back; then H's hold ends and the operator grants W.
	operatorGrant(t, c, ns, "staging", hBL, 7)
	stillWaits(t, wDone, 500*time.Millisecond, "the edit was undone")
	must(t, h.Release(ctx))
	operatorGrant(t, c, ns, "staging", wBL, 8)
	select {
	case r := <-wDone:
		must(t, r.err)
		if r.h.Token != 8 {
			t.Errorf("W holds with token %d, want 8", r.h.Token)
		}
		must(t, r.h.Release(ctx))
	case <-ctx.Done():
		t.Fatal("W does not hold after the operator's grant")
	}
}

// TestAWaiterTakesNoGrantFromALeaseBuildlockDidNotCreate is break 2 of
// issue 31: a user creates the Lease buildlock-prod before any claim (the
// operator keeps the claim Pending, ForeignLease), then edits it to name
// the claim with token 1 while the namespace's token floor is 200. On main
// Acquire returned a hold with token 1. A forger who adds buildlock's
// label (possible only without its admission policy, or with break-glass
// credentials) still cannot go below the floor. The claim holds when the
// foreign Lease is gone and the operator's grants it, above the floor.
func TestAWaiterTakesNoGrantFromALeaseBuildlockDidNotCreate(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	writeLease(t, c, ns, buildlockv1.TokenFloorLeaseName, func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{buildlockv1.ManagedByLabel: buildlockv1.ManagedByValue}
		l.Spec.LeaseTransitions = ptr.To(int32(200))
	})
	leaseName := buildlockv1.GrantLeaseName("prod")
	writeLease(t, c, ns, leaseName, func(*coordinationv1.Lease) {}) // an empty Lease of the user's

	claim := Claim{Namespace: ns, Target: "prod", Repo: "acme/shop", Branch: "main", Build: 5, RunID: "run-1"}
	bl, done := acquireInBackground(ctx, t, c, claim)
	setStatus(t, c, bl, buildlockv1.BuildLockStatus{Phase: buildlockv1.PhasePending, Reason: buildlockv1.ReasonForeignLease})

	writeLease(t, c, ns, leaseName, naming(bl, 1))
	stillWaits(t, done, 2*time.Second, "the foreign Lease names it with token 1")
	writeLease(t, c, ns, leaseName, func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{buildlockv1.ManagedByLabel: buildlockv1.ManagedByValue}
	})
	stillWaits(t, done, time.Second, "the foreign Lease, given buildlock's label, names it with token 1")
	writeLease(t, c, ns, leaseName, naming(bl, 150))
	stillWaits(t, done, time.Second, "the foreign Lease, given buildlock's label, names it with token 150, below the floor")

	must(t, c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leaseName}}))
	operatorGrant(t, c, ns, "prod", bl, 201)
	select {
	case r := <-done:
		must(t, r.err)
		if r.h.Token != 201 {
			t.Errorf("holds with token %d, want 201", r.h.Token)
		}
		must(t, r.h.Release(ctx))
	case <-ctx.Done():
		t.Fatal("the claim does not hold after the operator's grant")
	}
}

// TestAHoldByTheLeaseLastsWhileTheOperatorConfirmsIt: a hold learned from
// the grant Lease ends when the claim's status does not say Held with its
// token within the bound, or says Held with another; and a hold ends when
// its grant Lease is deleted, whoever deleted it.
func TestAHoldByTheLeaseLastsWhileTheOperatorConfirmsIt(t *testing.T) {
	for name, tc := range map[string]struct {
		after  func(t *testing.T, c client.Client, bl *buildlockv1.BuildLock)
		reason string
	}{
		"the status never says Held": {reason: ReasonNotConfirmed, after: func(*testing.T, client.Client, *buildlockv1.BuildLock) {}},
		"the status says Held with another token": {reason: ReasonNotConfirmed, after: func(t *testing.T, c client.Client, bl *buildlockv1.BuildLock) {
			setStatus(t, c, bl, held(3))
		}},
		"the grant Lease is deleted": {reason: ReasonGrantMoved, after: func(t *testing.T, c client.Client, bl *buildlockv1.BuildLock) {
			setStatus(t, c, bl, held(1))
			time.Sleep(time.Second) // confirmed: the hold stands
			must(t, c.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: buildlockv1.GrantLeaseName("staging")}}))
		}},
	} {
		t.Run(name, func(t *testing.T) {
			c, ns := apiServer(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: "run-1"}
			bl, done := acquireInBackground(ctx, t, c, claim, withConfirmWithin(500*time.Millisecond))
			operatorGrant(t, c, ns, "staging", bl, 1)
			r := <-done
			must(t, r.err)
			defer func() { _ = r.h.Release(context.WithoutCancel(ctx)) }()
			lost := make(chan error, 1)
			go func() { lost <- r.h.WaitLost(ctx) }()
			tc.after(t, c, bl)
			wantLost(t, lost, tc.reason)
		})
	}
}
