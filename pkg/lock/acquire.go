package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// defaultExpiresAfter is the API's default for spec.expiresAfter.
const defaultExpiresAfter = time.Hour

// cleanupTimeout bounds the deletion of a claim after its context ended.
const cleanupTimeout = 30 * time.Second

// Watch retries: a watch that fails is reopened after a backoff that doubles
// from minBackoff to maxBackoff; after maxWatchFailures failures in a row
// without any event, Acquire gives up.
const (
	minBackoff       = 200 * time.Millisecond
	maxBackoff       = 5 * time.Second
	maxWatchFailures = 8
	// healthyWatch is how long a watch must stay open to count as working.
	healthyWatch = 10 * time.Second
)

// EventType says what an Event reports.
type EventType string

const (
	// EventCreated means Acquire created the claim.
	EventCreated EventType = "Created"
	// EventAttached means a BuildLock with the claim's name and spec existed (a
	// retried step); Acquire waits on it instead of creating one.
	EventAttached EventType = "Attached"
	// EventUpdated means the claim changed while it waited (usually its status).
	EventUpdated EventType = "Updated"
)

// Event is one observation of the claim while Acquire waits.
type Event struct {
	Type      EventType
	BuildLock *buildlockv1.BuildLock
}

// Option tunes Acquire.
type Option func(*options)

type options struct {
	observe       func(Event)
	onError       func(error)
	renewInterval time.Duration
}

// WithObserver calls f with the claim when it is created or attached to, and
// with every version of it seen while waiting. f runs on Acquire's
// goroutine and must not block.
func WithObserver(f func(Event)) Option {
	return func(o *options) { o.observe = f }
}

// WithErrorHandler calls f with the errors Acquire recovers from: a failed
// renewal, a watch that had to be reopened. f may be called from the renewal
// goroutine.
func WithErrorHandler(f func(error)) Option {
	return func(o *options) { o.onError = f }
}

// WithRenewInterval sets how often a pod-less claim's spec.renewTime is
// bumped. The default is a third of its spec.expiresAfter.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) { o.renewInterval = d }
}

// Acquire creates the claim's BuildLock (or attaches to an identical one, so
// that a retried step is idempotent) and watches it until the operator's
// verdict:
//   - Held: it returns a release function, which deletes the claim, and the
//     hold's fencing token;
//   - Superseded: an error matching ErrSuperseded (*SupersededError);
//   - Released or Expired, or deleted: ErrEnded (*EndedError);
//   - ctx's deadline: ErrTimeout (*TimeoutError), after deleting the claim;
//   - ctx canceled: ctx's error, after deleting the claim.
//
// c needs get, create, watch, patch and delete on buildlocks in
// claim.Namespace, and a scheme that knows buildlock.io/v1alpha1. A pod-less
// claim is renewed until release is called (or the process ends).
func Acquire(ctx context.Context, c client.WithWatch, claim Claim, opts ...Option) (release func(context.Context) error, token int64, err error) {
	h, err := AcquireHold(ctx, c, claim, opts...)
	if err != nil {
		return nil, 0, err
	}
	return h.Release, h.Token, nil
}

// Hold is a held lock.
type Hold struct {
	// Namespace, Name and UID identify the holding BuildLock.
	Namespace, Name string
	UID             types.UID
	// Token is the hold's fencing token.
	Token int64
	// BuildLock is the claim as it was when it became Held.
	BuildLock *buildlockv1.BuildLock

	c          client.Client
	stopRenew  func()
	mu         sync.Mutex
	isReleased bool
}

// Release ends the hold: it stops renewing the claim and deletes it (only
// this claim: the delete is conditional on its UID). A claim that is already
// gone counts as released. Release may be called more than once.
func (h *Hold) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.isReleased {
		return nil
	}
	h.stopRenew()
	if err := deleteClaim(ctx, h.c, h.BuildLock); err != nil {
		return err
	}
	h.isReleased = true
	return nil
}

// AcquireHold is Acquire returning the Hold, for callers that want the
// BuildLock's name (which may be the fallback name) and UID.
func AcquireHold(ctx context.Context, c client.WithWatch, claim Claim, opts ...Option) (*Hold, error) {
	o := options{observe: func(Event) {}, onError: func(error) {}}
	for _, opt := range opts {
		opt(&o)
	}
	if err := claim.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	bl, attached, err := createOrAttach(ctx, c, claim)
	if err != nil {
		return nil, err
	}
	if attached {
		o.observe(Event{Type: EventAttached, BuildLock: bl.DeepCopy()})
	} else {
		o.observe(Event{Type: EventCreated, BuildLock: bl.DeepCopy()})
	}

	stopRenew := func() {}
	if bl.Spec.PodRef == nil {
		// A claim attached to may have been left by a process that died: renew
		// it at once rather than after a whole interval.
		stopRenew = startRenewer(c, bl, renewInterval(bl, o.renewInterval), attached, o.onError)
	}

	w := &waiter{c: c, o: &o, uid: bl.UID, last: bl, rv: bl.ResourceVersion}
	err = w.run(ctx)
	if err == nil {
		return &Hold{
			Namespace: w.last.Namespace, Name: w.last.Name, UID: w.last.UID,
			Token: w.last.Status.FencingToken, BuildLock: w.last,
			c: c, stopRenew: stopRenew,
		}, nil
	}
	stopRenew()
	if errors.Is(err, ErrSuperseded) || errors.Is(err, ErrEnded) {
		// The operator ended the claim; it keeps it (for `kubectl get`) until
		// its finished-TTL.
		return nil, err
	}

	// Timed out, canceled or unable to watch: withdraw the claim, so that it
	// does not hold the lock with nobody to use it.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	cleanupErr := deleteClaim(cleanupCtx, c, bl)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, &TimeoutError{
			Namespace: bl.Namespace, Name: bl.Name, Waited: time.Since(start),
			Phase: w.last.Status.Phase, Message: w.last.Status.Message, CleanupErr: cleanupErr,
		}
	case ctx.Err() != nil:
		err = fmt.Errorf("stopped waiting for BuildLock %s/%s: %w", bl.Namespace, bl.Name, ctx.Err())
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
	default:
		err = fmt.Errorf("waiting for BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	if cleanupErr != nil {
		return nil, errors.Join(err, cleanupErr)
	}
	return nil, err
}

// createOrAttach creates the claim's BuildLock under Name(claim), or under
// its fallback name when that one is taken by a claim with another spec. A
// BuildLock with the claim's spec is attached to instead.
func createOrAttach(ctx context.Context, c client.Client, claim Claim) (bl *buildlockv1.BuildLock, attached bool, err error) {
	names := []string{Name(claim)}
	if claim.Name == "" {
		if fb := fallbackName(claim); fb != names[0] {
			names = append(names, fb)
		}
	}
	for _, name := range names {
		// A BuildLock seen as existing may be deleted before it can be read:
		// then the name is free again, and creating is tried once more.
		for range 3 {
			bl = claim.BuildLock()
			bl.Name = name
			err := c.Create(ctx, bl)
			if err == nil {
				return bl, false, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return nil, false, fmt.Errorf("creating BuildLock %s/%s: %w", claim.Namespace, name, err)
			}
			existing := &buildlockv1.BuildLock{}
			err = c.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, existing)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, false, fmt.Errorf("reading existing BuildLock %s/%s: %w", claim.Namespace, name, err)
			}
			if existing.DeletionTimestamp == nil && sameClaim(existing, claim) {
				return existing, true, nil
			}
			break
		}
	}
	return nil, false, fmt.Errorf("%w: BuildLocks %v in %s exist for other builds or pods; set an explicit name",
		ErrNameTaken, names, claim.Namespace)
}

// verdict says whether bl's status decides Acquire: nil when it holds, the
// outcome's error when it ended, and done false while it is Pending or
// Waiting.
func verdict(bl *buildlockv1.BuildLock) (done bool, outcome error) {
	s := bl.Status
	switch s.Phase {
	case buildlockv1.PhaseHeld:
		return true, nil
	case buildlockv1.PhaseSuperseded:
		return true, &SupersededError{Namespace: bl.Namespace, Name: bl.Name, SupersededBy: s.SupersededBy, Reason: s.Reason, Message: s.Message}
	case buildlockv1.PhaseReleased, buildlockv1.PhaseExpired:
		return true, &EndedError{Namespace: bl.Namespace, Name: bl.Name, Phase: s.Phase, Reason: s.Reason, Message: s.Message}
	}
	return false, nil
}

// waiter watches one claim until its verdict.
type waiter struct {
	c    client.WithWatch
	o    *options
	uid  types.UID
	last *buildlockv1.BuildLock // the latest version seen
	rv   string                 // where the next watch resumes
}

// errResync says the watch's resourceVersion is too old: read the claim
// again and watch from there.
var errResync = errors.New("watch resource version expired")

func (w *waiter) run(ctx context.Context) error {
	if done, outcome := verdict(w.last); done {
		return outcome
	}
	failures := 0
	backoff := minBackoff
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		began := time.Now()
		done, progressed, err := w.watchOnce(ctx)
		// A watch that stayed open a while worked, even if the claim did
		// not change and the server sent no bookmark.
		progressed = progressed || time.Since(began) > healthyWatch
		if done {
			return err
		}
		if errors.Is(err, errResync) {
			if done, err = w.resync(ctx); done {
				return err
			}
			// Read afresh: watch again from the version read.
			progressed = progressed || err == nil
		}
		if progressed {
			failures, backoff = 0, minBackoff
		}
		if err == nil && progressed {
			continue
		}
		if err == nil {
			err = errors.New("the watch closed without an event")
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		failures++
		if failures >= maxWatchFailures {
			return fmt.Errorf("giving up after %d failed watches: %w", failures, err)
		}
		w.o.onError(fmt.Errorf("watching BuildLock %s/%s, retrying in %s: %w", w.last.Namespace, w.last.Name, backoff, err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// watchOnce watches the claim from w.rv until a verdict (done), the watch's
// end, or an error. progressed says whether any event arrived.
func (w *waiter) watchOnce(ctx context.Context) (done, progressed bool, err error) {
	wi, err := w.c.Watch(ctx, &buildlockv1.BuildLockList{},
		client.InNamespace(w.last.Namespace),
		client.MatchingFields{"metadata.name": w.last.Name},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: w.rv, AllowWatchBookmarks: true}})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return false, false, errResync
		}
		return false, false, err
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, progressed, ctx.Err()
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return false, progressed, nil
			}
			progressed = true
			switch ev.Type {
			case watch.Added, watch.Modified:
				bl, isClaim := ev.Object.(*buildlockv1.BuildLock)
				if !isClaim {
					return false, progressed, fmt.Errorf("unexpected object %T in the watch", ev.Object)
				}
				if bl.UID != w.uid {
					return true, progressed, w.deleted()
				}
				w.rv, w.last = bl.ResourceVersion, bl
				w.o.observe(Event{Type: EventUpdated, BuildLock: bl.DeepCopy()})
				if done, outcome := verdict(bl); done {
					return true, progressed, outcome
				}
			case watch.Deleted:
				return true, progressed, w.deleted()
			case watch.Bookmark:
				if m, err := metaAccessor(ev.Object); err == nil {
					w.rv = m.GetResourceVersion()
				}
			case watch.Error:
				status := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
					return false, progressed, errResync
				}
				return false, false, status
			}
		}
	}
}

// resync reads the claim again after its watch fell too far behind.
func (w *waiter) resync(ctx context.Context) (done bool, err error) {
	bl := &buildlockv1.BuildLock{}
	err = w.c.Get(ctx, types.NamespacedName{Namespace: w.last.Namespace, Name: w.last.Name}, bl)
	switch {
	case apierrors.IsNotFound(err):
		return true, w.deleted()
	case err != nil:
		return false, fmt.Errorf("reading BuildLock %s/%s: %w", w.last.Namespace, w.last.Name, err)
	case bl.UID != w.uid:
		return true, w.deleted()
	}
	w.rv, w.last = bl.ResourceVersion, bl
	w.o.observe(Event{Type: EventUpdated, BuildLock: bl.DeepCopy()})
	return verdict(bl)
}

func (w *waiter) deleted() error {
	return &EndedError{Namespace: w.last.Namespace, Name: w.last.Name, Reason: ReasonDeleted,
		Message: "The BuildLock was deleted while it waited for the lock."}
}

func metaAccessor(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// deleteClaim deletes bl if it is still the same object (its UID). A claim
// that is gone, or was replaced, counts as deleted.
func deleteClaim(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock) error {
	uid := bl.UID
	target := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: bl.Name}}
	err := c.Delete(ctx, target, client.Preconditions{UID: &uid})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("deleting BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
}

// renewInterval is how often a pod-less claim is renewed: override when
// positive, else a third of its expiresAfter, so that two renewals can fail
// before the hold expires.
func renewInterval(bl *buildlockv1.BuildLock, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	expiresAfter := defaultExpiresAfter
	if bl.Spec.ExpiresAfter != nil && bl.Spec.ExpiresAfter.Duration > 0 {
		expiresAfter = bl.Spec.ExpiresAfter.Duration
	}
	return expiresAfter / 3
}

// startRenewer bumps bl's spec.renewTime every interval (and at once when
// immediately is set) until stop is called or the claim is gone. stop waits
// for an ongoing renewal to finish.
func startRenewer(c client.Client, bl *buildlockv1.BuildLock, interval time.Duration, immediately bool, onError func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		first := make(chan struct{}, 1)
		if immediately {
			first <- struct{}{}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-first:
			case <-ticker.C:
			}
			err := renew(ctx, c, bl, interval)
			switch {
			case err == nil:
			case apierrors.IsNotFound(err):
				return
			case ctx.Err() == nil:
				onError(err)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// renew sets bl's spec.renewTime to now with a merge patch that carries the
// claim's UID, so that it never renews another claim of the same name.
func renew(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": bl.UID},
		"spec":     map[string]any{"renewTime": metav1.NewMicroTime(time.Now())},
	})
	if err != nil {
		return fmt.Errorf("encoding the renewal of BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	target := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: bl.Name}}
	if err := c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("renewing BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	return nil
}
