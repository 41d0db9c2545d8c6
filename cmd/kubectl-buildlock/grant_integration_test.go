package main

// Issue 31, breaks 1 and 2, with the built plugin and the operator: a
// waiter's command never runs on a grant Lease that someone other than the
// operator wrote, and a holder's command stops when its grant moves,
// whoever moved it. The edits are made as a person with break-glass
// credentials would make them (the admin of the test cluster is in
// system:masters, which buildlock's admission policy on its Leases lets
// through).

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// editLease changes the Lease ns/name as `kubectl edit` would (retrying
// on a conflict with the operator's writes); create makes it if need be.
func (f *fixture) editLease(name string, create bool, change func(*coordinationv1.Lease)) {
	f.t.Helper()
	ctx := context.Background()
	for {
		l := &coordinationv1.Lease{}
		err := admin.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: name}, l)
		switch {
		case apierrors.IsNotFound(err) && create:
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}
			change(l)
			err = admin.Create(ctx, l)
		case err == nil:
			change(l)
			err = admin.Update(ctx, l)
		}
		if !apierrors.IsConflict(err) {
			must(f.t, err)
			return
		}
	}
}

// TestAWaitersCommandNeverRunsOnAnEditedGrant is break 1: H's command runs
// holding staging, W's waits; someone names W's claim in the grant Lease,
// with H's token. On main, W printed "Held staging with fencing token 1"
// and ran its command beside H's. Now W keeps waiting, H's command is
// stopped (its grant named another claim, exit 5), and W runs once the
// operator grants it, with a token above the holder's.
func TestAWaitersCommandNeverRunsOnAnEditedGrant(t *testing.T) {
	f := newFixture(t)
	hEnv, hCmd := f.helper("holder", time.Minute, 0)
	h := f.plugin(hEnv, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1", "--grace-period", "1s"}, hCmd...)...)
	f.started("holder")
	wEnv, wCmd := f.helper("waiter", time.Second, 0)
	w := f.plugin(wEnv, append([]string{"acquire", "--target", "staging", "--repo", "acme/web", "--branch", "main", "--build", "1"}, wCmd...)...)
	waiter := f.waitForPhase("acme-web-main-1-staging", buildlockv1.PhaseWaiting)
	time.Sleep(time.Second) // W's plugin watches (it would refuse the edit either way: it never saw itself granted)

	f.editLease(buildlockv1.GrantLeaseName("staging"), false, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptrTo(buildlockv1.GrantHolderIdentity(waiter.Name, waiter.UID))
	})
	time.Sleep(3 * time.Second)
	holder, _ := f.helperRun("holder")
	if run, ran := f.helperRun("waiter"); ran && run.token == holder.token {
		t.Errorf("the waiter's command ran with the holder's token %s after the edit; its stderr:\n%s", run.token, w.stderr)
	}
	if code := h.wait(t, 30*time.Second); code != exitEnded {
		t.Fatalf("the holder's acquire exited %d, want %d; stderr:\n%s", code, exitEnded, h.stderr)
	}
	for _, want := range []string{"names BuildLock acme-web-main-1-staging", "Stopping"} {
		if !strings.Contains(h.stderr.String(), want) {
			t.Errorf("the holder's stderr does not say %q:\n%s", want, h.stderr)
		}
	}
	if holder, _ = f.helperRun("holder"); holder.end != 0 {
		t.Error("the holder's command ran to its end")
	}
	if code := w.wait(t, time.Minute); code != exitOK {
		t.Fatalf("the waiter's acquire exited %d, want 0; stderr:\n%s", code, w.stderr)
	}
	// The next token is above the holder's; after somebody else wrote the
	// grant Lease the operator takes it above the namespace's token floor
	// too (internal/controller's tokens_test), so not necessarily the next
	// number.
	run, _ := f.helperRun("waiter")
	if got, err := strconv.ParseInt(run.token, 10, 64); err != nil || got <= mustParseInt(t, holder.token) {
		t.Errorf("the waiter ran with token %q, want one above the holder's %s; stderr:\n%s", run.token, holder.token, w.stderr)
	}
}

// TestAForeignLeaseNamingTheClaimRunsNothing is break 2: a user creates
// the Lease buildlock-prod before any claim, and the claim waits Pending
// (ForeignLease); the user then edits that Lease to name the claim with
// leaseTransitions 1, while the namespace's token floor is 200. On main the
// plugin printed "Held prod with fencing token 1" and ran the deploy. Now
// it waits until the Lease is gone and the operator grants it, above the
// floor.
func TestAForeignLeaseNamingTheClaimRunsNothing(t *testing.T) {
	f := newFixture(t)
	f.editLease(buildlockv1.TokenFloorLeaseName, true, func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{buildlockv1.ManagedByLabel: buildlockv1.ManagedByValue}
		l.Spec.LeaseTransitions = ptrTo(int32(200))
	})
	foreign := buildlockv1.GrantLeaseName("prod")
	f.editLease(foreign, true, func(*coordinationv1.Lease) {})
	env, cmd := f.helper("deploy", time.Second, 0)
	p := f.plugin(env, append([]string{"acquire", "--target", "prod", "--repo", "acme/shop", "--branch", "main", "--build", "1"}, cmd...)...)
	name := "acme-shop-main-1-prod"
	var bl *buildlockv1.BuildLock
	f.eventually(30*time.Second, "the claim waits for the foreign Lease", func() bool {
		bl = f.get(name)
		return bl != nil && bl.Status.Reason == buildlockv1.ReasonForeignLease
	})

	f.editLease(foreign, false, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptrTo(buildlockv1.GrantHolderIdentity(bl.Name, bl.UID))
		l.Spec.LeaseTransitions = ptrTo(int32(1))
	})
	time.Sleep(3 * time.Second)
	if run, ran := f.helperRun("deploy"); ran {
		t.Errorf("the command ran, with token %s, on a Lease buildlock did not create; stderr:\n%s", run.token, p.stderr)
	}

	must(t, admin.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: foreign}}))
	// The operator looks again on any event of the lock's claims.
	bl = f.get(name)
	bl.Annotations["example.com/poke"] = "1"
	must(t, admin.Update(context.Background(), bl))
	if code := p.wait(t, time.Minute); code != exitOK {
		t.Fatalf("acquire exited %d, want 0; stderr:\n%s", code, p.stderr)
	}
	run, _ := f.helperRun("deploy")
	if token, err := strconv.ParseInt(run.token, 10, 64); err != nil || token <= 200 {
		t.Errorf("the command ran with token %s, want one above the namespace's floor 200; stderr:\n%s", run.token, p.stderr)
	}
}

// mustParseInt parses a fencing token a helper command printed.
func mustParseInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("fencing token %q: %v", s, err)
	}
	return n
}
