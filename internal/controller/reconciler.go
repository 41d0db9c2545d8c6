// Package controller is the lock reconciler, and the one wiring of the
// operator's manager (NewManager), which cmd/manager, the tests, `make run`
// and `make demo` share.
//
// The lock reconciler reconciles a lock (a namespace and a target), not a
// single BuildLock: every event about a claim, its pod, its policy or its
// grant Lease maps to the lock it concerns (events.go), so the workqueue
// serializes all work on one lock, and serves namespaces in turn, so that a
// burst in one delays no other (queue.go). A reconcile observes the lock
// from the cache (observer, observe.go); decides once, and again on live
// reads where the stale-read rule asks (decider, decide.go; the rule, stated
// once, in rule.go); writes the grant as a compare-and-swap on the lock's
// Lease (granter, apply.go); then each claim's status, each write
// conditional on the resourceVersion it was computed from (statusWriter,
// status.go); and looks again when the decision says, or at the next edge
// of the policy's deploy windows (policy.Windows), whichever comes first:
// a freeze is looked for, not polled for.
//
// The side jobs are controllers of their own, beside it, so that none waits
// for a decision or stops one when it fails: the policy controller (package
// policy: the policies' Ready and Enforced conditions, the enforcement
// binding, the fence probe) and the two garbage collections (package
// cleanup: finished claims; idle Leases with the token floor). The grant's
// compare-and-swap carries what enforcement needs (package grant, which
// they all share).
//
// The grant Lease is written by the operator alone, but anyone with the
// rights to write Leases can delete or edit it. Every create, update and
// delete of a Lease that this manager did not make itself brings its lock
// here at once (leaseEvents); the arbiter restores a record that the claims
// contradict (its rule 11), and the Lease is written again whenever it does
// not carry exactly what the decision and the policy say (grant.Current).
// The highest token a manager has seen for each lock outlives the Lease
// (grant.Memory, the arbiter's Grant.Floor); and a version of the Lease
// this manager did not write (an edit, or any version found after a start)
// sends the lock's next token above the namespace's token floor, which
// holds every token issued before it (observer.noteLockFloor, the
// arbiter's Grant.Reserved). A Lease named like the grant Lease that
// buildlock did not create (grant.Owned) is never taken over, nor written
// in a loop: its lock's claims stay Pending (ForeignLease), and the lock
// reads it live until it goes.
package controller

import (
	"context"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// conflictRetryDelay is how soon a lock is decided again after a write lost a
// race. Short, because a hand-off may be waiting on it; not zero, so that
// the cache can catch up with the write that won.
const conflictRetryDelay = 20 * time.Millisecond

// foreignLeaseRecheck is how soon a lock whose grant Lease name is taken by
// someone else's Lease is looked at again: the cache holds only buildlock's
// Leases, so no event says when that one goes, and a create of the grant
// Lease would fail with AlreadyExists, so the lock must not be retried at
// once. Until that Lease is gone, each look (this one, or an event of the
// lock's claims) reads it live, and writes no Lease (grant.Memory.Foreign).
const foreignLeaseRecheck = time.Minute

// lockReconciler reconciles one lock per request: the request's Namespace is
// the claims' namespace and its Name is the target.
type lockReconciler struct {
	// clock tells the time; tests and chaos runs skew it.
	clock    clock.PassiveClock
	observer observer
	decider  decider
	granter  granter
	statuses statusWriter
	// metrics receives what happened; nil records nothing.
	metrics *Metrics
}

// +kubebuilder:rbac:groups=buildlock.io,resources=buildlocks,verbs=get;list;watch
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlocks/status,verbs=update
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlockpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile decides one lock and applies the decision: observe, decide,
// grant, statuses, and when to look again.
func (r *lockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := arbiter.Lock{Namespace: req.Namespace, Target: req.Name}
	ctx = logf.IntoContext(ctx, logf.FromContext(ctx).WithValues("target", lock.Target))
	// The API stores times in microseconds; deciding on the same precision
	// keeps a decision's fixed point across a round trip.
	now := r.clock.Now().Truncate(time.Microsecond)

	obs, err := r.observer.cached(ctx, lock, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	edge := freezeAt(&obs, now)
	var d arbiter.Decision
	decidedAt := now
	if obs.foreign == nil {
		obs, d, decidedAt, err = r.decider.decideSafely(ctx, lock, obs, now)
	}
	if err == nil && obs.foreign == nil {
		obs, d, decidedAt, err = r.granter.apply(ctx, lock, obs, d, decidedAt)
	}
	if decidedAt != now {
		// Decided again on live reads, later: the rest goes by that
		// decision's time.
		now, edge = decidedAt, freezeAt(&obs, decidedAt)
	}
	if err == nil && obs.foreign != nil {
		return r.refuseForeignLease(ctx, lock, obs, now)
	}
	if err == nil {
		err = r.statuses.apply(ctx, obs, d, now)
	}
	if err != nil {
		return r.retryOnRace(ctx, err)
	}
	r.metrics.observeDecision(lock, obs, d, now)
	if obs.podErr != nil {
		// The decision was safe (an unknown pod counts as alive), but a pod
		// that ended may be hiding behind the error: look again, with the
		// workqueue's backoff.
		return ctrl.Result{}, obs.podErr
	}
	// A look again is at a deadline (an expiry, a maximum hold) or at the
	// windows' next edge, not polled for: first.
	return ctrl.Result{RequeueAfter: requeueDelay(now, earliest(d.NextLook, edge)), Priority: ptr.To(handOffPriority)}, nil
}

// freezeAt tells the observation's policy whether its windows freeze the
// target at now (the arbiter's Policy.Freeze, and the grant Lease's freeze
// for enforcement), and returns when that may change next (zero: never).
func freezeAt(obs *observation, now time.Time) time.Time {
	windows := obs.policy.Windows
	s, freeze := windows.At(now)
	obs.policy.Arbiter.Freeze = freeze
	if freeze.Frozen {
		obs.policy.Enforce = obs.policy.Enforce.WithFreeze(freeze.Describe())
	}
	return windows.Edge(s)
}

// earliest is the earlier of two instants, ignoring zero ones.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// refuseForeignLease applies the decision for a lock whose grant Lease name
// is taken by a Lease buildlock did not create (foreignLeaseDecision), and
// looks at the lock again in foreignLeaseRecheck.
func (r *lockReconciler) refuseForeignLease(ctx context.Context, lock arbiter.Lock, obs observation, now time.Time) (ctrl.Result, error) {
	if err := r.statuses.apply(ctx, obs, foreignLeaseDecision(lock, obs), now); err != nil {
		return r.retryOnRace(ctx, err)
	}
	logf.FromContext(ctx).V(1).Info("Not granting: the grant Lease's name is taken by a Lease of someone else's", "lease", obs.foreign.Name)
	return ctrl.Result{RequeueAfter: foreignLeaseRecheck}, nil
}

// retryOnRace turns a lost race (lostRace) into a quick re-decision; other
// errors go back to the workqueue's backoff.
func (r *lockReconciler) retryOnRace(ctx context.Context, err error) (ctrl.Result, error) {
	if lostRace(err) {
		logf.FromContext(ctx).V(1).Info("Lost a write race; deciding again", "error", err.Error())
		return ctrl.Result{RequeueAfter: conflictRetryDelay, Priority: ptr.To(handOffPriority)}, nil
	}
	return ctrl.Result{}, err
}

// requeueDelay is how long from now to at, or zero (no requeue) when at is
// zero.
func requeueDelay(now, at time.Time) time.Duration {
	if at.IsZero() {
		return 0
	}
	if d := at.Sub(now); d > 0 {
		return d
	}
	return time.Millisecond
}
