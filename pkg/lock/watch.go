package lock

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// watchClaims watches the BuildLocks of namespace that selector picks (one
// claim by metadata.name, or a lock's claims by spec.target, a selectable
// field of the CRD) until changed says done or fails. It is client-go's
// UntilWithSync, as `kubectl wait` uses it: an informer that lists, watches
// from there, and lists again when its watch falls too far behind (410
// Gone), with client-go's backoff. changed is called with the informer's
// store once it has synced and after every change, so it decides on the
// latest state, never on one event.
//
// Failed lists and watches go to onError while the informer retries them;
// those that retrying cannot fix (Forbidden, Unauthorized, no BuildLock CRD)
// end the watch with that error. When ctx ends, watchClaims returns its
// cause.
func watchClaims(ctx context.Context, c client.WithWatch, namespace string, selector fields.Selector,
	onError func(error), changed func(cache.Store) (bool, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	report := func(what string, err error) {
		if err == nil || ctx.Err() != nil {
			return
		}
		err = fmt.Errorf("%s BuildLocks (%s) in namespace %s: %w", what, selector, namespace, err)
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			cancel(err)
			return
		}
		onError(err)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector.String()
			if opts.ResourceVersion == "0" {
				// "0" may be served from a cache older than the claim this
				// process just created; read what is current.
				opts.ResourceVersion = ""
			}
			list := &buildlockv1.BuildLockList{}
			err := c.List(ctx, list, &client.ListOptions{Namespace: namespace, Raw: &opts})
			report("listing", err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector.String()
			w, err := c.Watch(ctx, &buildlockv1.BuildLockList{}, &client.ListOptions{Namespace: namespace, Raw: &opts})
			report("watching", err)
			return w, err
		},
	}

	var (
		store  cache.Store
		result error
	)
	decide := func() (bool, error) {
		done, err := changed(store)
		if err != nil {
			result = err
		}
		return done || err != nil, nil
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &buildlockv1.BuildLock{},
		func(s cache.Store) (bool, error) {
			store = s
			return decide()
		},
		func(watch.Event) (bool, error) { return decide() })
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
		return fmt.Errorf("watching BuildLocks (%s) in namespace %s: %w", selector, namespace, err)
	}
	return result
}

// claimIn returns the BuildLock named like bl in store if it is still bl
// (the same UID), nil when it is gone or was replaced.
func claimIn(store cache.Store, bl *buildlockv1.BuildLock) *buildlockv1.BuildLock {
	obj, exists, err := store.GetByKey(bl.Namespace + "/" + bl.Name)
	if err != nil || !exists {
		return nil
	}
	current, ok := obj.(*buildlockv1.BuildLock)
	if !ok || current.UID != bl.UID {
		return nil
	}
	return current
}

// byName selects one BuildLock by name.
func byName(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}

// byTarget selects the claims on one target.
func byTarget(target string) fields.Selector {
	return fields.OneTermEqualSelector("spec.target", target)
}
