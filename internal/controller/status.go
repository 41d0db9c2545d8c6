package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// desiredStatus is the status a claim must have after decision d, computed
// in memory from its current status. ok is false when the status must not
// change (a terminal claim keeps the picture it ended with).
func desiredStatus(bl *buildlockv1.BuildLock, v arbiter.Verdict, d arbiter.Decision, now time.Time) (status buildlockv1.BuildLockStatus, ok bool) {
	if v.Reason == "" {
		return bl.Status, false
	}
	st := *bl.Status.DeepCopy()
	st.Phase = buildlockv1.Phase(v.Phase)
	st.Reason = v.Reason
	st.Message = v.Message
	st.SupersededBy = v.SupersededBy
	st.Holder = d.Holder
	st.Waiting = d.Waiting
	st.ObservedGeneration = bl.Generation
	st.ExpiresAt = nil
	if v.Phase == arbiter.Held {
		st.FencingToken = d.Grant.Token
		st.AcquiredAt = &metav1.MicroTime{Time: d.Grant.AcquiredAt}
		if !v.ExpiresAt.IsZero() {
			st.ExpiresAt = &metav1.MicroTime{Time: v.ExpiresAt}
		}
	}
	if v.Phase.IsTerminal() && st.FinishedAt == nil {
		st.FinishedAt = &metav1.MicroTime{Time: now}
	}
	acquired := metav1.ConditionFalse
	if v.Phase == arbiter.Held {
		acquired = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type:               buildlockv1.ConditionAcquired,
		Status:             acquired,
		Reason:             v.Reason,
		Message:            v.Message,
		ObservedGeneration: bl.Generation,
		LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
	})
	return st, !equality.Semantic.DeepEqual(st, bl.Status)
}
