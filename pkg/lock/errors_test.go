package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

func TestOutcomeErrorsMatchTheirSentinels(t *testing.T) {
	tests := map[string]struct {
		err      error
		is       []error
		isNot    []error
		contains string
	}{
		"superseded": {
			err:      &SupersededError{Namespace: "ci", Name: "a", SupersededBy: "b", Message: "Build 43 is newer."},
			is:       []error{ErrSuperseded},
			isNot:    []error{ErrEnded, ErrTimeout},
			contains: "BuildLock ci/a was superseded by b: Build 43 is newer.",
		},
		"ended": {
			err:      &EndedError{Namespace: "ci", Name: "a", Phase: buildlockv1.PhaseExpired, Reason: "Expired"},
			is:       []error{ErrEnded},
			isNot:    []error{ErrSuperseded, ErrTimeout},
			contains: "BuildLock ci/a ended Expired (Expired)",
		},
		"timeout is also a deadline": {
			err:      &TimeoutError{Namespace: "ci", Name: "a"},
			is:       []error{ErrTimeout, context.DeadlineExceeded},
			isNot:    []error{ErrSuperseded, ErrEnded, context.Canceled},
			contains: "timed out",
		},
		"another run's claim names it and both runs": {
			err: &ClaimedByAnotherRunError{RunID: "9-2", BuildLock: &buildlockv1.BuildLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "a", Annotations: map[string]string{buildlockv1.RunIDAnnotation: "9-1"}},
				Spec:       buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 9},
				Status:     buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseHeld},
			}},
			is:       []error{ErrClaimedByAnotherRun},
			isNot:    []error{ErrEnded, ErrLost},
			contains: "BuildLock ci/a (build 9 of acme/shop@main on staging, Held) belongs to another run of this build (run 9-1, this is run 9-2)",
		},
		"a lost hold says why": {
			err:      &LostError{Namespace: "ci", Name: "a", Phase: buildlockv1.PhaseReleased, Reason: buildlockv1.ReasonForceReleased, Message: "alice: stuck"},
			is:       []error{ErrLost},
			isNot:    []error{ErrEnded, ErrSuperseded},
			contains: "BuildLock ci/a no longer holds its lock: it is Released (ForceReleased): alice: stuck",
		},
		"a deleted hold": {
			err:      &LostError{Namespace: "ci", Name: "a", Reason: ReasonDeleted},
			is:       []error{ErrLost},
			contains: "no longer holds its lock: it was deleted",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wrapped := fmt.Errorf("deploying: %w", tc.err)
			for _, target := range tc.is {
				if !errors.Is(wrapped, target) {
					t.Errorf("errors.Is(%v, %v) = false", wrapped, target)
				}
			}
			for _, target := range tc.isNot {
				if errors.Is(wrapped, target) {
					t.Errorf("errors.Is(%v, %v) = true", wrapped, target)
				}
			}
			if got := tc.err.Error(); !contains(got, tc.contains) {
				t.Errorf("Error() = %q, want it to contain %q", got, tc.contains)
			}
		})
	}
	var sup *SupersededError
	if !errors.As(fmt.Errorf("x: %w", &SupersededError{SupersededBy: "b"}), &sup) || sup.SupersededBy != "b" {
		t.Error("errors.As does not find the *SupersededError")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestVerdict(t *testing.T) {
	claim := func(phase buildlockv1.Phase) *buildlockv1.BuildLock {
		return &buildlockv1.BuildLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "a"},
			Status:     buildlockv1.BuildLockStatus{Phase: phase, SupersededBy: "b", Reason: "R", Message: "M", FencingToken: 3},
		}
	}
	tests := []struct {
		phase    buildlockv1.Phase
		wantDone bool
		wantErr  error
	}{
		{phase: "", wantDone: false},
		{phase: buildlockv1.PhasePending, wantDone: false},
		{phase: buildlockv1.PhaseWaiting, wantDone: false},
		{phase: buildlockv1.PhaseHeld, wantDone: true},
		{phase: buildlockv1.PhaseSuperseded, wantDone: true, wantErr: ErrSuperseded},
		{phase: buildlockv1.PhaseReleased, wantDone: true, wantErr: ErrEnded},
		{phase: buildlockv1.PhaseExpired, wantDone: true, wantErr: ErrEnded},
	}
	for _, tc := range tests {
		t.Run("phase "+string(tc.phase), func(t *testing.T) {
			done, err := verdict(claim(tc.phase))
			if done != tc.wantDone {
				t.Errorf("done = %v, want %v", done, tc.wantDone)
			}
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestRenewInterval(t *testing.T) {
	bl := &buildlockv1.BuildLock{}
	if got := renewInterval(bl, 0); got != buildlockv1.DefaultExpiresAfter/3 {
		t.Errorf("without expiresAfter: %s", got)
	}
	bl.Spec.ExpiresAfter = &metav1.Duration{Duration: 90e9}
	if got := renewInterval(bl, 0); got != 30e9 {
		t.Errorf("with expiresAfter 90s: %s, want 30s", got)
	}
	if got := renewInterval(bl, 5e9); got != 5e9 {
		t.Errorf("with an override: %s", got)
	}
}
