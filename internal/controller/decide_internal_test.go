package controller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// TestADecisionOnLiveReadsIsNeverOlderThanThem: a reconcile that reads the
// lock live (its cached decision rested on what the cache cannot tell)
// decides at the time the live reads came back, not at the time it started.
// Found by the chaos run of seed 1 under a loaded machine: a reconcile
// whose live reads waited ten seconds on a killed API server granted a
// pod-less claim with an acquire time ten seconds old, and clamped the
// renewal its pipeline had sent meanwhile to that instant, so the hold
// expired six seconds after it was granted instead of eleven after the
// renewal.
func TestADecisionOnLiveReadsIsNeverOlderThanThem(t *testing.T) {
	started := time.Date(2026, 12, 3, 17, 3, 4, 0, time.UTC)
	answered := started.Add(10 * time.Second)
	renewed := started.Add(9 * time.Second)
	claim := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "app-89", UID: "uid-89", CreationTimestamp: metav1.NewTime(started.Add(-time.Minute))},
		Spec: buildlockv1.BuildLockSpec{Target: "staging", Repo: "beta/app", Branch: "main", Build: 89,
			ExpiresAfter: &metav1.Duration{Duration: 11 * time.Second}, RenewTime: buildlockv1.NewTimestamp(renewed)},
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(claim).
		WithIndex(&buildlockv1.BuildLock{}, buildlockv1.TargetField, func(o client.Object) []string {
			return []string{o.(*buildlockv1.BuildLock).Spec.Target}
		}).Build()
	mem := grant.NewMemory()
	d := decider{
		observer: observer{cache: c, apiReader: c, memory: mem, deleted: newDeletions(), own: newOwnStatuses()},
		memory:   mem,
		arbiter:  arbiter.Decide,
		clock:    clocktesting.NewFakePassiveClock(answered),
	}
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	_, decision, at, err := d.decideLive(context.Background(), lock, observation{}, started)
	if err != nil {
		t.Fatal(err)
	}
	if !at.Equal(answered) {
		t.Errorf("decided at %s, want when the live reads came back, %s", at.Format(time.TimeOnly), answered.Format(time.TimeOnly))
	}
	if decision.Grant.Holder != claim.Name || !decision.Grant.AcquiredAt.Equal(answered) {
		t.Errorf("granted %q at %s; want %q granted at %s", decision.Grant.Holder, decision.Grant.AcquiredAt.Format(time.TimeOnly),
			claim.Name, answered.Format(time.TimeOnly))
	}
}
