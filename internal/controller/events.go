package controller

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// lockRequest is the request that decides the lock of target in namespace.
func lockRequest(namespace, target string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: target}}
}

// setupLockReconciler registers the lock reconciler with mgr, with workers
// locks decided at once (the workqueue never hands one lock to two
// workers). What brings a lock to it: a change of a claim's spec (a renewal
// bumps the generation) or annotations (a force-release), or its creation
// or deletion (status-only updates are its own writes, which need no new
// decision); any change of a pod a claim references (podRefField); a change
// of the spec of the BuildLockPolicy named after the target; and the events
// of its grant Lease that this manager did not cause (leaseEvents).
func setupLockReconciler(mgr ctrl.Manager, r *lockReconciler, mem *grant.Memory, workers int, skipNameValidation bool) error {
	ctx := context.Background()
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, buildlockv1.TargetField, func(obj client.Object) []string {
		return []string{obj.(*buildlockv1.BuildLock).Spec.Target}
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", buildlockv1.TargetField, err)
	}
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, podRefField, func(obj client.Object) []string {
		if ref := obj.(*buildlockv1.BuildLock).Spec.PodRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", podRefField, err)
	}

	// An event of a claim shown Held, or of its pod, may hand its lock over.
	claimToLock := enqueueLocks(func(_ context.Context, obj client.Object) ([]reconcile.Request, bool) {
		bl := obj.(*buildlockv1.BuildLock)
		return []reconcile.Request{lockRequest(bl.Namespace, bl.Spec.Target)}, bl.Status.Phase == buildlockv1.PhaseHeld
	})
	enqueueDeleted := claimToLock.DeleteFunc
	claimToLock.DeleteFunc = func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		// Before the lock is queued, so that its decision knows.
		r.observer.deleted.add(e.Object.GetUID())
		enqueueDeleted(ctx, e, q)
	}
	podToLocks := enqueueLocks(func(ctx context.Context, pod client.Object) ([]reconcile.Request, bool) {
		var claims buildlockv1.BuildLockList
		if err := mgr.GetClient().List(ctx, &claims, client.InNamespace(pod.GetNamespace()), client.MatchingFields{podRefField: pod.GetName()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing claims of a pod", "pod", pod.GetName(), "namespace", pod.GetNamespace())
			return nil, false
		}
		reqs, handOff := make([]reconcile.Request, 0, len(claims.Items)), false
		for i := range claims.Items {
			if bl := &claims.Items[i]; !bl.Status.Phase.IsTerminal() {
				reqs = append(reqs, lockRequest(bl.Namespace, bl.Spec.Target))
				handOff = handOff || bl.Status.Phase == buildlockv1.PhaseHeld
			}
		}
		return reqs, handOff
	})
	policyToLock := enqueueLocks(func(_ context.Context, obj client.Object) ([]reconcile.Request, bool) {
		return []reconcile.Request{lockRequest(obj.GetNamespace(), obj.GetName())}, false
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("buildlock").
		Watches(&buildlockv1.BuildLock{}, claimToLock, builder.WithPredicates(
			predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.Pod{}, podToLocks).
		Watches(&buildlockv1.BuildLockPolicy{}, policyToLock, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, leaseEvents(mem)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers,
			SkipNameValidation:      ptr.To(skipNameValidation),
			NewQueue:                newFairQueue,
		}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the lock reconciler: %w", err)
	}
	return nil
}

// leaseEvents maps the events of buildlock's Leases (the cache holds no
// others) to the locks that must be decided again, and keeps mem: every
// Lease's token (a token floor's too), whatever the event; and which writes
// were this manager's. A grant Lease that the cache lists when it starts
// brings its lock (so that a restarted manager repairs what changed while
// none ran), and so does every create, update and delete of one that this
// manager did not make, so that a grant Lease that was deleted or edited is
// restored at once. This manager's own writes need no new decision: the
// events that led to them brought their lock here already.
func leaseEvents(mem *grant.Memory) handler.Funcs {
	enqueue := func(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if target, ok := grant.TargetOf(obj); ok {
			// A grant Lease someone else wrote or deleted: restore it first.
			addLocks(q, []reconcile.Request{lockRequest(obj.GetNamespace(), target)}, true)
		}
	}
	observe := func(obj client.Object) {
		if lease, ok := obj.(*coordinationv1.Lease); ok {
			mem.Observe(lease)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.Object)
			if !mem.Own(e.Object) {
				enqueue(e.Object, q)
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.ObjectOld)
			observe(e.ObjectNew)
			if !mem.Own(e.ObjectNew) {
				enqueue(e.ObjectNew, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.Object)
			mem.Deleted(e.Object)
			enqueue(e.Object, q)
		},
	}
}

// enqueueLocks maps an object's events to the locks they concern, as
// handler.EnqueueRequestsFromMapFunc does (an update maps the old object and
// the new), with handOffPriority when locks says that one of the objects
// may hand its locks over.
func enqueueLocks(locks func(context.Context, client.Object) ([]reconcile.Request, bool)) handler.Funcs {
	add := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		var all []reconcile.Request
		handOff := false
		for _, obj := range objs {
			reqs, h := locks(ctx, obj)
			all, handOff = append(all, reqs...), handOff || h
		}
		addLocks(q, all, handOff)
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
	}
}

// addLocks adds reqs to q, with handOffPriority if handOff (q is the
// fairQueue, whose priorities the controller-runtime interface carries).
func addLocks(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []reconcile.Request, handOff bool) {
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !ok || !handOff {
		for _, req := range reqs {
			q.Add(req)
		}
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handOffPriority)}, reqs...)
}
