package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// SetupOptions tune the controller's registration with a manager.
type SetupOptions struct {
	// MaxConcurrentReconciles is how many locks are decided at once. The
	// workqueue never hands one lock to two workers.
	MaxConcurrentReconciles int
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// podMetadata is the type under which pods are watched: metadata only, so
// that the cache does not hold full Pod objects of the whole cluster.
func podMetadata() *metav1.PartialObjectMetadata {
	pod := &metav1.PartialObjectMetadata{}
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	return pod
}

// CacheOptions returns the manager's cache settings: only the given
// namespaces (all when empty), and pods reduced to the little that maps
// their events to locks, so that memory does not grow with unrelated pods'
// labels, annotations and managed fields.
func CacheOptions(namespaces []string) cache.Options {
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			podMetadata(): {Transform: stripPodMetadata},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// stripPodMetadata keeps only a pod's identity: the controller reads a
// referenced pod's phase live, and needs the watch only to learn that
// something about the pod changed.
func stripPodMetadata(obj any) (any, error) {
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp,
		},
	}, nil
}

// SetupWithManager registers the indexes and watches of the lock controller:
// BuildLocks map to their lock; pods map to the locks of the claims that
// reference them.
func (r *LockReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts SetupOptions) error {
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, targetField, func(obj client.Object) []string {
		return []string{obj.(*buildlockv1.BuildLock).Spec.Target}
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", targetField, err)
	}
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, podRefField, func(obj client.Object) []string {
		if ref := obj.(*buildlockv1.BuildLock).Spec.PodRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", podRefField, err)
	}

	claimToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		bl := obj.(*buildlockv1.BuildLock)
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.Target}}}
	})
	podToLocks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, pod client.Object) []reconcile.Request {
		var claims buildlockv1.BuildLockList
		if err := mgr.GetClient().List(ctx, &claims, client.InNamespace(pod.GetNamespace()), client.MatchingFields{podRefField: pod.GetName()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing claims of a pod", "pod", pod.GetName(), "namespace", pod.GetNamespace())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(claims.Items))
		for i := range claims.Items {
			if bl := &claims.Items[i]; !bl.Status.Phase.IsTerminal() {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.Target}})
			}
		}
		return reqs
	})

	return ctrl.NewControllerManagedBy(mgr).
		Named("buildlock").
		// Status-only updates are this controller's own writes: they need no
		// new decision. Spec changes (renewTime) bump the generation; a
		// force-release is an annotation.
		Watches(&buildlockv1.BuildLock{}, claimToLock, builder.WithPredicates(
			predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WatchesMetadata(&corev1.Pod{}, podToLocks).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: max(1, opts.MaxConcurrentReconciles),
			SkipNameValidation:      ptr.To(opts.SkipNameValidation),
		}).
		Complete(r)
}
