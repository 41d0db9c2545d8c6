package controller

import (
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// maxMessageLength bounds a status message and a condition's message: the
// API refuses a condition message over 32768 bytes, and a status write that
// is refused must never be what stops a decision. The arbiter's messages are
// far shorter (it quotes free text only up to MaxQuotedLength); this is the
// last line of defense.
const maxMessageLength = 4096

// maxEventNoteLength is the API's bound on an event's note.
const maxEventNoteLength = 1024

// desiredStatus is the status a claim must have after decision d, computed
// in memory from its current status. ok is false when the status must not
// change (a terminal claim keeps the picture it ended with).
func desiredStatus(bl *buildlockv1.BuildLock, v arbiter.Verdict, d arbiter.Decision, now time.Time) (status buildlockv1.BuildLockStatus, ok bool) {
	if v.Reason == "" {
		return bl.Status, false
	}
	message := truncate(v.Message, maxMessageLength)
	st := *bl.Status.DeepCopy()
	st.Phase = buildlockv1.Phase(v.Phase)
	st.Reason = v.Reason
	st.Message = message
	st.SupersededBy = v.SupersededBy
	st.Holder = v.Holder
	st.Waiting = v.Waiting
	st.ObservedGeneration = bl.Generation
	st.ExpiresAt = microTime(v.ExpiresAt)
	st.RenewedAt = microTime(v.RenewedAt)
	switch v.Phase {
	case arbiter.Held:
		st.FencingToken = d.Grant.Token
		st.AcquiredAt = &metav1.MicroTime{Time: d.Grant.AcquiredAt}
		st.QueuedAt = nil
	case arbiter.Waiting:
		st.QueuedAt = microTime(v.QueuedAt)
	}
	if v.Phase.IsTerminal() && st.FinishedAt == nil {
		st.FinishedAt = &metav1.MicroTime{Time: now}
	}
	acquired := metav1.ConditionFalse
	if v.Phase == arbiter.Held {
		acquired = metav1.ConditionTrue
	}
	// Decided: the claim holds or has ended, so that one `kubectl wait`
	// returns on either outcome.
	decided := metav1.ConditionFalse
	if v.Phase == arbiter.Held || v.Phase.IsTerminal() {
		decided = metav1.ConditionTrue
	}
	for _, c := range []struct {
		typ    string
		status metav1.ConditionStatus
	}{{buildlockv1.ConditionAcquired, acquired}, {buildlockv1.ConditionDecided, decided}} {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type:               c.typ,
			Status:             c.status,
			Reason:             v.Reason,
			Message:            message,
			ObservedGeneration: bl.Generation,
			LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
		})
	}
	return st, !equality.Semantic.DeepEqual(st, bl.Status)
}

// fallbackStatus is status with every free text replaced by a fixed
// sentence, for when the API server refused status as invalid: the verdict
// is recorded even if its message cannot be.
func fallbackStatus(status buildlockv1.BuildLockStatus) buildlockv1.BuildLockStatus {
	st := *status.DeepCopy()
	st.Message = "The operator's message for this claim was refused by the API server; the phase and reason stand."
	for i := range st.Conditions {
		st.Conditions[i].Message = st.Message
	}
	return st
}

func microTime(t time.Time) *metav1.MicroTime {
	if t.IsZero() {
		return nil
	}
	return &metav1.MicroTime{Time: t}
}

// truncate cuts s to at most n bytes on a rune boundary, marking a cut with
// "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
