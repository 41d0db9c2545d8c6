package cleanup

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// IdleLeases deletes the grant Lease of a lock that has no claims and
// enforces nothing, once it has not been written for Retention, first
// raising the namespace's token floor to its token, so that a later Lease of
// the target never issues a token again: a new Lease is only created after
// a live read found none, which follows the delete, which follows the
// floor's raise. It keeps the token floor for a lock left without a Lease
// otherwise (someone deleted it), and restores a floor that someone deleted
// or lowered. Its requests are locks, and one per namespace named
// grant.TokenFloorLease (no target has a dot) for the floor.
//
// It runs beside the lock reconciler, which may write the same Lease at
// the same time: each write is conditional (a delete on the Lease it
// judged, a floor on the floor it read), the floor only rises, and the
// lock reconciler reads the floor live before it creates a Lease.
type IdleLeases struct {
	// Client reads Leases and claims from the cache and writes Leases.
	Client client.Client
	// APIReader reads the token floor live.
	APIReader client.Reader
	// Memory is what the manager remembers of the Leases; the lock
	// reconciler's Lease watch keeps it.
	Memory *grant.Memory
	// Clock tells the time; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// Retention is how long after its last write the Lease of a lock
	// without claims is kept.
	Retention time.Duration
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;delete

// Reconcile looks at one lock's Lease, or at a namespace's token floor.
func (r *IdleLeases) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name == grant.TokenFloorLease {
		return retryOnRace(r.restoreTokenFloor(ctx, req.Namespace))
	}
	lock := arbiter.Lock{Namespace: req.Namespace, Target: req.Name}
	lease, err := grant.Get(ctx, r.Client, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	if lease != nil && (lease.Spec.HolderIdentity != nil || grant.Enforced(lease)) {
		return ctrl.Result{}, nil // its release, or the end of its enforcement, writes it again
	}
	claimed, err := r.claimed(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	if lease == nil {
		return retryOnRace(r.keepTokenFloor(ctx, lock, claimed))
	}
	if claimed {
		return ctrl.Result{}, nil // the deletion of its last claim brings it back
	}
	now := r.Clock.Now()
	if due := grant.LastWritten(lease).Add(r.Retention); now.Before(due) {
		return ctrl.Result{RequeueAfter: due.Sub(now)}, nil
	}
	// The deletion rests on the lock having no claims, which a claims cache
	// behind the API server cannot tell (a claim created a moment ago): ask
	// the API server before deleting.
	if claimed, err = r.claimedIn(ctx, r.APIReader, lock); err != nil || claimed {
		return ctrl.Result{}, err
	}
	return retryOnRace(r.deleteIdle(ctx, lease))
}

// claimed reports whether the lock has claims, in the cache.
func (r *IdleLeases) claimed(ctx context.Context, lock arbiter.Lock) (bool, error) {
	return r.claimedIn(ctx, r.Client, lock)
}

// claimedIn reports whether the lock has claims, as reader shows them (the
// target is a selectable field of BuildLocks, so a live list asks for that
// target's claims alone).
func (r *IdleLeases) claimedIn(ctx context.Context, reader client.Reader, lock arbiter.Lock) (bool, error) {
	var list buildlockv1.BuildLockList
	if err := reader.List(ctx, &list, client.InNamespace(lock.Namespace), client.MatchingFields{buildlockv1.TargetField: lock.Target}); err != nil {
		return false, fmt.Errorf("listing BuildLocks for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return len(list.Items) > 0, nil
}

// deleteIdle raises the namespace's floor to the Lease's token, then
// deletes the Lease, conditional on it being unchanged.
func (r *IdleLeases) deleteIdle(ctx context.Context, lease *coordinationv1.Lease) error {
	floor, read, err := grant.ReadTokenFloor(ctx, r.APIReader, lease.Namespace)
	if err != nil {
		return err
	}
	if err := grant.RaiseTokenFloor(ctx, r.Client, r.Memory, lease.Namespace, read, floor, buildlockv1.GrantToken(lease)); err != nil {
		return err
	}
	err = r.Client.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting idle grant Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	logf.FromContext(ctx).Info("Deleted idle grant Lease", "lease", lease.Name, "fencingToken", buildlockv1.GrantToken(lease), "grantRetention", r.Retention)
	return nil
}

// keepTokenFloor is for a lock left without a Lease (someone deleted it
// while nothing was to be recorded): the namespace's token floor keeps the
// highest token this manager saw for it, so that a Lease created later
// never repeats a token; once the lock has no claims either, the manager
// forgets it. The floor is read live, and written only when it is lower.
func (r *IdleLeases) keepTokenFloor(ctx context.Context, lock arbiter.Lock, claimed bool) error {
	remembered := r.Memory.Highest(lock)
	if remembered <= 0 {
		return nil
	}
	floor, read, err := grant.ReadTokenFloor(ctx, r.APIReader, lock.Namespace)
	if err != nil {
		return err
	}
	if remembered > floor {
		if err := grant.RaiseTokenFloor(ctx, r.Client, r.Memory, lock.Namespace, read, floor, remembered); err != nil {
			return err
		}
		floor = remembered
	}
	if !claimed {
		r.Memory.ForgetUpTo(lock, floor)
	}
	return nil
}

// restoreTokenFloor raises the namespace's token floor Lease back to the
// highest floor this manager saw, after someone deleted or lowered it.
func (r *IdleLeases) restoreTokenFloor(ctx context.Context, namespace string) error {
	want := r.Memory.Floor(namespace)
	if want <= 0 {
		return nil
	}
	floor, read, err := grant.ReadTokenFloor(ctx, r.APIReader, namespace)
	if err != nil || (read != nil && floor >= want) {
		return err
	}
	logf.FromContext(ctx).Info("Restoring the token floor", "namespace", namespace, "floor", want, "found", floor)
	return grant.RaiseTokenFloor(ctx, r.Client, r.Memory, namespace, read, floor, want)
}

// SetupWithManager registers the controller with mgr. Its requests come
// from the Leases the cache holds (buildlock's): a grant Lease that is
// listed at the start, created or written without a holder (it may be idle
// now) or deleted; a token floor that someone else than this manager wrote
// or deleted; and from every deleted claim (its lock may be idle now).
func (r *IdleLeases) SetupWithManager(mgr ctrl.Manager) error {
	free := func(obj client.Object) bool {
		lease, ok := obj.(*coordinationv1.Lease)
		return ok && lease.Spec.HolderIdentity == nil
	}
	enqueue := func(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if obj.GetName() == grant.TokenFloorLease {
			q.Add(lockRequest(obj.GetNamespace(), grant.TokenFloorLease))
		} else if target, ok := grant.TargetOf(obj); ok {
			q.Add(lockRequest(obj.GetNamespace(), target))
		}
	}
	leases := handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.Object.GetName() != grant.TokenFloorLease && free(e.Object) {
				enqueue(e.Object, q)
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			floor := e.ObjectNew.GetName() == grant.TokenFloorLease
			if floor && !r.Memory.Own(e.ObjectNew) || !floor && free(e.ObjectNew) {
				enqueue(e.ObjectNew, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
	}
	claimGone := handler.Funcs{
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if bl, ok := e.Object.(*buildlockv1.BuildLock); ok {
				q.Add(lockRequest(bl.Namespace, bl.Spec.Target))
			}
		},
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("buildlock-idle-leases").
		Watches(&coordinationv1.Lease{}, leases).
		Watches(&buildlockv1.BuildLock{}, claimGone).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(r.SkipNameValidation)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the idle Leases' controller: %w", err)
	}
	return nil
}
