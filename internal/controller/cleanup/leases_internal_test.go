package cleanup

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// TestAnIdleLeaseIsKeptWhileTheAPIServerShowsAClaim: the claims cache shows
// no claim of the lock (it is behind: a claim was created a moment ago), its
// Lease has not been written for longer than the retention, and the API
// server has the claim. The Lease stays: its deletion rests on the lock
// having no claims, which only the API server can tell (make chaos
// DURATION=10m SEED=69436560, 2026-12-03: grant-record-kept, a grant Lease
// deleted while its lock had four claims).
func TestAnIdleLeaseIsKeptWhileTheAPIServerShowsAClaim(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, buildlockv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 12, 3, 17, 38, 41, 0, time.UTC)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "chaos-0", Name: buildlockv1.GrantLeaseName("env-4"), UID: "lease-uid"},
		Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(8703)),
			RenewTime: &metav1.MicroTime{Time: now.Add(-time.Hour)}},
	}
	claim := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "chaos-0", Name: "acme-web-release-1-340"},
		Spec:       buildlockv1.BuildLockSpec{Target: "env-4", Repo: "acme/web", Branch: "release-1", Build: 340},
	}
	byTarget := func(o client.Object) []string { return []string{o.(*buildlockv1.BuildLock).Spec.Target} }
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lease.DeepCopy()).
		WithIndex(&buildlockv1.BuildLock{}, buildlockv1.TargetField, byTarget).Build()
	live := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lease.DeepCopy(), claim).
		WithIndex(&buildlockv1.BuildLock{}, buildlockv1.TargetField, byTarget).Build()
	r := &IdleLeases{Client: cached, APIReader: live, Memory: grant.NewMemory(), Clock: clocktesting.NewFakePassiveClock(now), Retention: time.Minute}
	req := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "chaos-0", Name: "env-4"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := cached.Get(context.Background(), client.ObjectKeyFromObject(lease), &coordinationv1.Lease{}); err != nil {
		t.Errorf("the grant Lease of a lock with a claim was deleted: %v", err)
	}
	// Without the claim, it goes (after the floor is raised to its token).
	if err := live.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := cached.Get(context.Background(), client.ObjectKeyFromObject(lease), &coordinationv1.Lease{}); err == nil {
		t.Error("the idle grant Lease of a lock without claims was kept")
	}
}
