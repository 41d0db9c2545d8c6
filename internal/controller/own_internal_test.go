package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// TestOwnStatusesAreAFresherVersionOfListedClaimsOnly: a claim this manager
// wrote since the cache's version is decided as written; the cache's word
// stands once it shows the write or a later version, or the write is older
// than grant.OwnWriteKept; and a claim the cache does not list is never brought
// back.
func TestOwnStatusesAreAFresherVersionOfListedClaimsOnly(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	claim := func(uid, rv string, phase buildlockv1.Phase) buildlockv1.BuildLock {
		return buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid), ResourceVersion: rv},
			Status: buildlockv1.BuildLockStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name    string
		written buildlockv1.BuildLock
		cached  []buildlockv1.BuildLock
		at      time.Duration
		want    []buildlockv1.Phase
	}{
		{"the cache is a version behind", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("a", "5", buildlockv1.PhaseWaiting), claim("b", "10", buildlockv1.PhaseWaiting)}, time.Millisecond,
			[]buildlockv1.Phase{buildlockv1.PhaseWaiting, buildlockv1.PhaseHeld}},
		{"the cache shows the write", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("b", "20", buildlockv1.PhaseHeld)}, time.Millisecond, []buildlockv1.Phase{buildlockv1.PhaseHeld}},
		{"the cache shows a later version (the pipeline's renewal)", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("b", "30", buildlockv1.PhaseReleased)}, time.Millisecond, []buildlockv1.Phase{buildlockv1.PhaseReleased}},
		{"the claim is gone from the cache", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("a", "5", buildlockv1.PhaseWaiting)}, time.Millisecond, []buildlockv1.Phase{buildlockv1.PhaseWaiting}},
		{"the write is older than it is kept", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("b", "10", buildlockv1.PhaseWaiting)}, grant.OwnWriteKept + time.Millisecond, []buildlockv1.Phase{buildlockv1.PhaseWaiting}},
		{"resourceVersions that do not compare", claim("b", "20", buildlockv1.PhaseHeld),
			[]buildlockv1.BuildLock{claim("b", "y10", buildlockv1.PhaseWaiting)}, time.Millisecond, []buildlockv1.Phase{buildlockv1.PhaseWaiting}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own := newOwnStatuses()
			own.wrote(&tc.written, t0)
			for round := range 2 {
				claims := make([]buildlockv1.BuildLock, len(tc.cached))
				for i := range tc.cached {
					tc.cached[i].DeepCopyInto(&claims[i])
				}
				own.fresher(claims, t0.Add(tc.at))
				if len(claims) != len(tc.want) {
					t.Fatalf("round %d: %d claims, want %d", round, len(claims), len(tc.want))
				}
				for i := range claims {
					if claims[i].Status.Phase != tc.want[i] {
						t.Errorf("round %d: claim %s is %s, want %s", round, claims[i].Name, claims[i].Status.Phase, tc.want[i])
					}
				}
			}
		})
	}
	t.Run("writes of claims that went are swept", func(t *testing.T) {
		own := newOwnStatuses()
		gone := claim("gone", "1", buildlockv1.PhaseHeld)
		own.wrote(&gone, t0)
		later := claim("b", "2", buildlockv1.PhaseHeld)
		own.wrote(&later, t0.Add(2*grant.OwnWriteKept))
		if _, kept := own.written["gone"]; kept {
			t.Error("the write of a claim that went is still kept")
		}
	})
}
