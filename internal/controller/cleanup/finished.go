// Package cleanup holds the operator's two garbage collections, each a
// controller of its own beside the lock reconciler, so that neither waits
// for a decision nor stops one when it fails: FinishedClaims deletes the
// claims that ended longer ago than the finished TTL (--finished-ttl), and
// IdleLeases deletes the grant Lease of a lock nobody claims any more after
// the grant retention (--grant-retention), keeping its token in the
// namespace's token floor, which it also restores when someone deletes or
// lowers it.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// FinishedClaims deletes terminal claims FinishedTTL after they ended
// (status.finishedAt), each delete conditional on the claim being the one
// it judged. Its requests are locks (the claims' namespace and the target):
// it looks at a lock whenever one of its claims ends, changes its spec or
// annotations, and when the lock's next finished claim is due.
type FinishedClaims struct {
	// Client reads the claims from the cache and deletes them.
	Client client.Client
	// Clock tells the time; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// FinishedTTL is how long a terminal claim is kept; it must be positive.
	FinishedTTL time.Duration
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// +kubebuilder:rbac:groups=buildlock.io,resources=buildlocks,verbs=get;list;watch;delete

// Reconcile deletes the lock's claims that are due, and returns when the
// next one is.
func (r *FinishedClaims) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var list buildlockv1.BuildLockList
	if err := r.Client.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{buildlockv1.TargetField: req.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing BuildLocks for target %q in %q: %w", req.Name, req.Namespace, err)
	}
	now := r.Clock.Now()
	var (
		next time.Time
		errs []error
		lost bool
	)
	for i := range list.Items {
		bl := &list.Items[i]
		if !bl.Status.Phase.IsTerminal() || bl.Status.FinishedAt == nil || bl.DeletionTimestamp != nil {
			continue
		}
		due := bl.Status.FinishedAt.Add(r.FinishedTTL)
		if now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		err := r.Client.Delete(ctx, bl, client.Preconditions{UID: &bl.UID, ResourceVersion: &bl.ResourceVersion})
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			lost = true // it changed since the cache saw it: judge it again
		case err != nil:
			// The others are deleted all the same.
			errs = append(errs, fmt.Errorf("deleting finished BuildLock %s/%s: %w", bl.Namespace, bl.Name, err))
		default:
			logf.FromContext(ctx).Info("Deleted finished claim", "buildLock", bl.Name, "phase", bl.Status.Phase, "finishedTTL", r.FinishedTTL)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	if lost {
		return ctrl.Result{RequeueAfter: raceRetryDelay}, nil
	}
	if next.IsZero() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: next.Sub(now)}, nil
}

// SetupWithManager registers the controller with mgr. A claim's event
// brings its lock when the claim is terminal (its status just ended it),
// or when its spec or annotations changed: the events that make the lock
// reconciler decide again, after which a finished claim may be due on a
// clock that moved.
func (r *FinishedClaims) SetupWithManager(mgr ctrl.Manager) error {
	claimToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return []reconcile.Request{lockRequest(obj.GetNamespace(), obj.(*buildlockv1.BuildLock).Spec.Target)}
	})
	terminal := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		bl, ok := obj.(*buildlockv1.BuildLock)
		return ok && bl.Status.Phase.IsTerminal()
	})
	noDeletes := predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("buildlock-finished-claims").
		Watches(&buildlockv1.BuildLock{}, claimToLock, builder.WithPredicates(noDeletes,
			predicate.Or(terminal, predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(r.SkipNameValidation)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the finished claims' controller: %w", err)
	}
	return nil
}
