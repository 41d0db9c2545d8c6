package lock

import (
	"context"

	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"

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
// field of the CRD) until changed says done or fails; see watchUntil.
func watchClaims(ctx context.Context, c client.WithWatch, namespace string, selector fields.Selector,
	onError func(error), changed func(cache.Store) (bool, error)) error {
	return watchUntil(ctx, c, namespace, selector, "BuildLocks", &buildlockv1.BuildLock{},
		func() client.ObjectList { return &buildlockv1.BuildLockList{} }, onError, changed)
}

// watchUntil watches the objects of one kind (example, listed as newList
// makes them) in namespace that selector picks, until changed says done or
// fails. It is client-go's UntilWithSync, as `kubectl wait` uses it: an
// informer that lists, watches from there, and lists again when its watch
// falls too far behind (410 Gone), with client-go's backoff. changed is
// called with the informer's store once it has synced and after every
// change, so it decides on the latest state, never on one event.
//
// Failed lists and watches go to onError while the informer retries them;
// those that retrying cannot fix (Forbidden, Unauthorized, no such kind)
// end the watch with that error. When ctx ends, watchUntil returns its
// cause.
func watchUntil(ctx context.Context, c client.WithWatch, namespace string, selector fields.Selector,
	kind string, example runtime.Object, newList func() client.ObjectList,
	onError func(error), changed func(cache.Store) (bool, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	report := func(what string, err error) {
		if err == nil || ctx.Err() != nil {
			return
		}
		err = fmt.Errorf("%s %s (%s) in namespace %s: %w", what, kind, selector, namespace, err)
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
			list := newList()
			err := c.List(ctx, list, &client.ListOptions{Namespace: namespace, Raw: &opts})
			report("listing", err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector.String()
			w, err := c.Watch(ctx, newList(), &client.ListOptions{Namespace: namespace, Raw: &opts})
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
	_, err := watchtools.UntilWithSync(ctx, lw, example,
		func(s cache.Store) (bool, error) {
			store = s
			return decide()
		},
		func(watch.Event) (bool, error) { return decide() })
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
		return fmt.Errorf("watching %s (%s) in namespace %s: %w", kind, selector, namespace, err)
	}
	return result
}

// watchGrant watches the grant Lease of bl's lock until it names bl as its
// holder, and returns the grant's fencing token. The operator writes the
// grant before the holder's status, so this is the earliest a pipeline can
// know that it holds the lock; the grant names the claim by name and UID,
// so a newer claim of the same name is never taken for bl.
func watchGrant(ctx context.Context, c client.WithWatch, bl *buildlockv1.BuildLock, onError func(error)) (token int64, err error) {
	name := buildlockv1.GrantLeaseName(bl.Spec.Target)
	holder := buildlockv1.GrantHolderIdentity(bl.Name, bl.UID)
	err = watchUntil(ctx, c, bl.Namespace, byName(name), "Leases", &coordinationv1.Lease{},
		func() client.ObjectList { return &coordinationv1.LeaseList{} }, onError,
		func(store cache.Store) (bool, error) {
			obj, _, _ := store.GetByKey(bl.Namespace + "/" + name) // an informer's store never fails a lookup
			lease, ok := obj.(*coordinationv1.Lease)
			if !ok || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != holder {
				return false, nil
			}
			token = buildlockv1.GrantToken(lease)
			return token > 0, nil
		})
	return token, err
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
	return fields.OneTermEqualSelector(buildlockv1.TargetField, target)
}
