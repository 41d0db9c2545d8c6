package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// TestDesiredStatusSaysTheMessageOnce: the message is status.message alone
// (every status write sends the whole status, and a condition repeating it
// made each write carry the sentence three times), and a claim an earlier
// version decided, with the message in its conditions, is not rewritten
// while its verdict stays as it was.
func TestDesiredStatusSaysTheMessageOnce(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	const message = "Waiting for staging behind the holder shop-41 (build 41 of acme/shop@main)."
	waiting := arbiter.Verdict{Name: "web-7", From: arbiter.Waiting, Phase: arbiter.Waiting, Reason: buildlockv1.ReasonWaitingForHolder,
		Message: message, Holder: "shop-41"}
	// The status an earlier version wrote for that verdict: the same, with
	// the message in both conditions.
	earlier := buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseWaiting, Reason: buildlockv1.ReasonWaitingForHolder, Message: message,
		Holder: "shop-41", ObservedGeneration: 1}
	for _, typ := range []string{buildlockv1.ConditionAcquired, buildlockv1.ConditionDecided} {
		earlier.Conditions = append(earlier.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionFalse,
			Reason: buildlockv1.ReasonWaitingForHolder, Message: message, ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))})
	}
	claim := func(st buildlockv1.BuildLockStatus) *buildlockv1.BuildLock {
		bl := &buildlockv1.BuildLock{Status: st}
		bl.Name, bl.Generation = "web-7", 1
		return bl
	}
	held := arbiter.Verdict{Name: "web-7", From: arbiter.Waiting, Phase: arbiter.Held, Reason: buildlockv1.ReasonAcquired,
		Message: "Holding staging with fencing token 8; deploy now and delete this BuildLock when done.", Holder: "web-7"}
	decision := arbiter.Decision{Grant: arbiter.Grant{Holder: "web-7", Token: 8, AcquiredAt: now}}
	for _, tc := range []struct {
		name        string
		current     buildlockv1.BuildLockStatus
		verdict     arbiter.Verdict
		wantChanged bool
		// wantConditionMessage is what each condition must carry.
		wantConditionMessage string
	}{
		{"a new claim's first verdict", buildlockv1.BuildLockStatus{}, arbiter.Verdict{Name: "web-7", From: arbiter.Pending, Phase: arbiter.Waiting,
			Reason: buildlockv1.ReasonWaitingForHolder, Message: message, Holder: "shop-41"}, true, ""},
		{"an earlier version's status, verdict unchanged", earlier, waiting, false, message},
		{"an earlier version's status, the claim now holds", earlier, held, true, ""},
		{"an earlier version's status, another message", earlier, func() arbiter.Verdict {
			v := waiting
			v.Message = strings.Replace(message, "41", "42", 2)
			return v
		}(), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, changed := desiredStatus(claim(tc.current), tc.verdict, decision, now)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if st.Message != tc.verdict.Message {
				t.Errorf("status.message = %q, want %q", st.Message, tc.verdict.Message)
			}
			if len(st.Conditions) != 2 {
				t.Fatalf("conditions = %+v, want Acquired and Decided", st.Conditions)
			}
			for _, c := range st.Conditions {
				if c.Message != tc.wantConditionMessage {
					t.Errorf("condition %s carries message %q, want %q", c.Type, c.Message, tc.wantConditionMessage)
				}
				if c.Reason != tc.verdict.Reason {
					t.Errorf("condition %s has reason %q, want %q", c.Type, c.Reason, tc.verdict.Reason)
				}
			}
		})
	}
}
