package lock

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// A feed is one informer of a watch: the objects of one kind in the
// watch's namespace that a field selector picks.
type feed struct {
	kind     string // for messages: "BuildLocks", "Leases"
	selector fields.Selector
	example  runtime.Object
	newList  func() client.ObjectList
	// optional, if set, makes a feed that may not be read (Forbidden,
	// Unauthorized) a feed that is dropped: the watch goes on without it,
	// and the error goes to onError once, after optional, which says what
	// the watch does without. A required feed that may not be read ends the
	// watch.
	optional string
	// listMode makes the informer list and then watch, rather than stream
	// its first list on a watch (client-go's WatchListClient): a list says
	// the resourceVersion of its snapshot, which listed then receives.
	listMode bool
	// alongside, if set, runs once, on a goroutine of its own, after the
	// first list (and listed): a read that the list may call for. kick
	// makes the watcher decide again when it is done; ctx ends with the
	// watch.
	alongside func(ctx context.Context, kick func())
	// observe, if set, is called with every version of an object the feed
	// delivers, in order (deleted: the object is gone; initial: it comes
	// from the first list), before the watch decides again: a decision sees
	// the latest state only, observe sees each state.
	observe func(obj runtime.Object, deleted, initial bool)
	// listed, if set, is called when the first list has been delivered,
	// with its resourceVersion ("" unless listMode).
	listed func(resourceVersion string)
	listRV string // the first list's resourceVersion, once listed

	mu      sync.Mutex
	store   cache.Store
	synced  cache.DoneChecker
	stop    context.CancelCauseFunc
	dropped chan struct{} // closed when an optional feed is dropped
	drop    sync.Once
}

// claimsFeed is the BuildLocks of the namespace that selector picks (one
// claim by metadata.name, or a lock's claims by spec.target, a selectable
// field of the CRD).
func claimsFeed(selector fields.Selector) *feed {
	return &feed{kind: "BuildLocks", selector: selector, example: &buildlockv1.BuildLock{},
		newList: func() client.ObjectList { return &buildlockv1.BuildLockList{} }}
}

// active reports whether the feed still runs (it was not dropped).
func (f *feed) active() bool {
	select {
	case <-f.dropped:
		return false
	default:
		return true
	}
}

// watcher runs feeds and decides on what they show. Each feed is an
// informer (client-go's cache.NewInformerWithOptions, as `kubectl wait`'s
// UntilWithSync uses one): it lists, watches from there, and lists again
// when its watch falls too far behind (410 Gone), with client-go's
// backoff. decide runs once every feed has synced, and again after every
// change a feed delivers and every kick, so it decides on the latest
// state, never on one event. Nothing polls: a feed's sync and every event
// wake the watcher at once (cache.DoneChecker, not
// cache.WaitForCacheSync, which looks every 100 ms).
//
// Failed lists and watches go to onError while the informers retry them;
// those that retrying cannot fix (Forbidden, Unauthorized, no such kind)
// end the watch with that error, or drop an optional feed.
type watcher struct {
	c         client.WithWatch
	namespace string
	onError   func(error)
	feeds     []*feed
	wake      chan struct{}
}

func newWatcher(c client.WithWatch, namespace string, onError func(error), feeds ...*feed) *watcher {
	return &watcher{c: c, namespace: namespace, onError: onError, feeds: feeds, wake: make(chan struct{}, 1)}
}

// kick makes the watcher decide again (once its feeds have synced). It
// never blocks, and may be called from any goroutine.
func (w *watcher) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run runs the feeds until decide says done or fails, and returns decide's
// error; when ctx ends first, its cause. The feeds' informers have stopped
// when it returns.
func (w *watcher) run(ctx context.Context, decide func() (bool, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait() // the informers have stopped when run returns
	}()
	for _, f := range w.feeds {
		w.start(ctx, cancel, f, &wg)
	}
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-w.wake:
		}
		if !w.synced() {
			continue
		}
		if done, err := decide(); done || err != nil {
			return err
		}
	}
}

// synced reports whether every feed that still runs has synced.
func (w *watcher) synced() bool {
	for _, f := range w.feeds {
		if f.active() && !cache.IsDone(f.synced) {
			return false
		}
	}
	return true
}

// start runs f's informer until ctx ends or f is dropped. fail ends the
// whole watch.
func (w *watcher) start(ctx context.Context, fail context.CancelCauseFunc, f *feed, wg *sync.WaitGroup) {
	fctx, stop := context.WithCancelCause(ctx)
	f.stop, f.dropped = stop, make(chan struct{})
	report := func(what string, err error) {
		if err == nil || fctx.Err() != nil {
			return
		}
		err = fmt.Errorf("%s %s (%s) in namespace %s: %w", what, f.kind, f.selector, w.namespace, err)
		if !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			w.onError(err)
			return
		}
		if f.optional == "" {
			fail(err)
			return
		}
		f.drop.Do(func() {
			w.onError(fmt.Errorf("%s: %w", f.optional, err))
			close(f.dropped)
			stop(err)
			w.kick()
		})
	}
	var lw cache.ListerWatcher = &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := f.newList()
			opts.FieldSelector = f.selector.String()
			if opts.ResourceVersion == "0" {
				// "0" may be served from a cache older than the claim this
				// process just created; read what is current.
				opts.ResourceVersion = ""
			}
			err := w.c.List(ctx, list, &client.ListOptions{Namespace: w.namespace, Raw: &opts})
			report("listing", err)
			if err == nil {
				f.mu.Lock()
				if f.listRV == "" {
					f.listRV = list.GetResourceVersion()
				}
				f.mu.Unlock()
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = f.selector.String()
			wi, err := w.c.Watch(ctx, f.newList(), &client.ListOptions{Namespace: w.namespace, Raw: &opts})
			report("watching", err)
			return wi, err
		},
	}
	changed := func(obj any, deleted, initial bool) {
		if f.observe != nil {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if o, ok := obj.(runtime.Object); ok {
				f.observe(o, deleted, initial)
			}
		}
		w.kick()
	}
	// The informer's queue (client-go's RealFIFO, in order) reports its
	// sync only once the first list's objects are in the store and their
	// handlers have run.
	if f.listMode {
		lw = listThenWatch{lw.(*cache.ListWatch)}
	}
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw, ObjectType: f.example,
		Handler: cache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    func(obj any, initial bool) { changed(obj, false, initial) },
			UpdateFunc: func(_, obj any) { changed(obj, false, false) },
			DeleteFunc: func(obj any) { changed(obj, true, false) },
		},
	})
	f.store, f.synced = store, informer.HasSyncedChecker()
	wg.Go(func() { informer.RunWithContext(fctx) })
	wg.Go(func() {
		select {
		case <-f.synced.Done():
			if f.listed != nil {
				f.mu.Lock()
				rv := f.listRV
				f.mu.Unlock()
				f.listed(rv)
			}
			if f.alongside != nil {
				wg.Go(func() { f.alongside(fctx, w.kick) })
			}
			w.kick()
		case <-fctx.Done():
		}
	})
}

// listThenWatch is a ListWatch that the reflector lists and then
// watches (client-go's way to tell a reflector that a lister-watcher does
// not support streaming lists).
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported says so to the reflector.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// watchClaims watches the BuildLocks of namespace that selector picks
// until changed says done or fails; see watcher.
func watchClaims(ctx context.Context, c client.WithWatch, namespace string, selector fields.Selector,
	onError func(error), changed func(cache.Store) (bool, error)) error {
	claims := claimsFeed(selector)
	return newWatcher(c, namespace, onError, claims).run(ctx, func() (bool, error) { return changed(claims.store) })
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

// byName selects one object by name.
func byName(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}

// byTarget selects the claims on one target.
func byTarget(target string) fields.Selector {
	return fields.OneTermEqualSelector(buildlockv1.TargetField, target)
}
