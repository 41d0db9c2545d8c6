package controller

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// maxMessageLength bounds a status message: a status write that is refused
// must never be what stops a decision. The arbiter's messages are
// far shorter (it quotes free text only up to MaxQuotedLength); this is the
// last line of defense.
const maxMessageLength = 4096

// maxEventNoteLength is the API's bound on an event's note.
const maxEventNoteLength = 1024

// statusWriter writes a decision's verdicts into the claims' statuses, and
// their Events.
type statusWriter struct {
	client client.Client
	// own remembers each write until the cache shows it.
	own      *ownStatuses
	recorder events.EventRecorder
	// metrics receives what happened; nil records nothing.
	metrics *Metrics
}

// apply writes every claim whose status the decision changes, in the
// decision's order: claims that stop holding first, the new holder last, so
// that no two claims show Held at once. Each write carries the
// resourceVersion of the object the decision was computed from. A write the
// API server refuses as invalid is written again without its message; if
// even that is refused, the claim is skipped, unless it stops holding (then,
// as on any other failure, the rest waits and the lock is decided again).
func (w statusWriter) apply(ctx context.Context, obs observation, d arbiter.Decision, now time.Time) error {
	log := logf.FromContext(ctx)
	byName := make(map[string]*buildlockv1.BuildLock, len(obs.claims))
	for i := range obs.claims {
		byName[obs.claims[i].Name] = &obs.claims[i]
	}
	for _, v := range d.Verdicts {
		bl, found := byName[v.Name]
		if !found {
			continue
		}
		if v.Warning != "" {
			w.recorder.Eventf(bl, nil, "Warning", "MaxHoldApproaching", "Hold", "%s", truncate(v.Warning, maxEventNoteLength))
		}
		status, changed := desiredStatus(bl, v, d, now)
		if !changed {
			continue
		}
		updated := bl.DeepCopy()
		updated.Status = status
		err := w.client.Status().Update(ctx, updated)
		if apierrors.IsInvalid(err) {
			log.Error(err, "Status refused as invalid; writing it without its message", "buildLock", bl.Name, "phase", v.Phase)
			updated.Status = fallbackStatus(status)
			err = w.client.Status().Update(ctx, updated)
		}
		if err != nil {
			if apierrors.IsInvalid(err) && !stopsHolding(v) {
				log.Error(err, "Status refused as invalid; leaving this claim and applying the rest", "buildLock", bl.Name, "phase", v.Phase)
				continue
			}
			return fmt.Errorf("writing status of BuildLock %s/%s (%s): %w", bl.Namespace, bl.Name, v.Phase, err)
		}
		w.own.wrote(updated, now)
		log.Info("Updated claim", "buildLock", bl.Name, "from", v.From, "phase", v.Phase, "reason", v.Reason, "fencingToken", status.FencingToken)
		if v.From != v.Phase {
			if recordsEvent(v.Phase) {
				w.recorder.Eventf(bl, nil, eventType(v.Phase), eventReason(bl, v.Phase), string(v.Phase), "%s", truncate(v.Message, maxEventNoteLength))
			}
			if v.Overridden {
				// The override's audit: who let which build through which freeze, and why.
				log.Info("Granted through a freeze by an override", "buildLock", bl.Name, "overriddenBy", bl.Annotations[buildlockv1.OverriddenByAnnotation],
					"reason", bl.Annotations[buildlockv1.OverrideAnnotation])
				w.recorder.Eventf(bl, nil, "Warning", buildlockv1.ReasonOverridden, "Override", "%s", truncate(v.Message, maxEventNoteLength))
			}
			w.metrics.observeTransition(bl, v, now)
			if v.Phase == arbiter.Held && bl.Spec.Rollback != nil {
				w.metrics.observeRollback(verifiedRequester(bl, obs.verifiedSince))
			}
		}
	}
	return nil
}

// stopsHolding reports whether the verdict ends a claim shown Held: until
// that is written, no other claim may be shown Held.
func stopsHolding(v arbiter.Verdict) bool {
	return v.From == arbiter.Held && v.Phase != arbiter.Held
}

func eventType(p arbiter.Phase) string {
	if p == arbiter.Expired {
		return "Warning"
	}
	return "Normal"
}

// recordsEvent says whether a transition to phase p is recorded as an Event:
// the start and the end of a hold (and a waiter's end), the history of who
// deployed when. A claim that starts waiting or is superseded gets its
// status only, which says the same words for as long as the claim exists
// (an Event would cost the API server one more write on every new build,
// for a record that lives no longer).
func recordsEvent(p arbiter.Phase) bool {
	return p == arbiter.Held || p == arbiter.Released || p == arbiter.Expired
}

// eventReason names claim bl's transition to p for `kubectl get events`:
// Acquired (RolledBack for a rollback), Released or Expired.
func eventReason(bl *buildlockv1.BuildLock, p arbiter.Phase) string {
	switch {
	case p == arbiter.Held && bl.Spec.Rollback != nil:
		return eventRolledBack
	case p == arbiter.Held:
		return buildlockv1.ReasonAcquired
	}
	return string(p)
}

// eventRolledBack is the reason of the event of a rollback's grant: its
// note says which build of which line, with the rollback's reason.
const eventRolledBack = "RolledBack"

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
			Message:            conditionMessage(bl.Status, c.typ, c.status, st),
			ObservedGeneration: bl.Generation,
			LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
		})
	}
	return st, !equality.Semantic.DeepEqual(st, bl.Status)
}

// conditionMessage is the message of condition typ with status in the new
// status st, given the claim's current status. A condition carries no
// message: status.message says it once, and every status write sends the
// whole status, so a sentence said three times costs every write three
// times. A condition that an earlier version wrote with the message keeps
// it for as long as the verdict stays as it was, so that an upgrade
// rewrites no claim whose verdict did not change.
func conditionMessage(current buildlockv1.BuildLockStatus, typ string, status metav1.ConditionStatus, st buildlockv1.BuildLockStatus) string {
	old := meta.FindStatusCondition(current.Conditions, typ)
	if old != nil && old.Status == status && old.Reason == st.Reason && current.Message == st.Message {
		return old.Message
	}
	return ""
}

// fallbackStatus is status with every free text replaced by a fixed
// sentence, for when the API server refused status as invalid: the verdict
// is recorded even if its message cannot be.
func fallbackStatus(status buildlockv1.BuildLockStatus) buildlockv1.BuildLockStatus {
	st := *status.DeepCopy()
	st.Message = "The operator's message for this claim was refused by the API server; the phase and reason stand."
	for i := range st.Conditions {
		st.Conditions[i].Message = ""
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
