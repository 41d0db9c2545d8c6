package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// cleanupTimeout bounds the deletion of a claim after its context ended.
const cleanupTimeout = 30 * time.Second

// EventType says what an Event reports.
type EventType string

const (
	// EventCreated means Acquire created the claim.
	EventCreated EventType = "Created"
	// EventAttached means a BuildLock of this claim and this run existed (a
	// retried step); Acquire waits on it instead of creating one.
	EventAttached EventType = "Attached"
	// EventReplaced means a finished BuildLock of the same build, left by
	// another run, had the claim's name: Acquire deleted it (Event.BuildLock)
	// to create its own.
	EventReplaced EventType = "Replaced"
	// EventUpdated means the claim, or its place in the queue, changed while
	// it waited.
	EventUpdated EventType = "Updated"
	// EventNameTaken means a BuildLock that is not this job's, and not in its
	// way (another build's, another pod's, another identity's), has the
	// claim's name (Event.BuildLock): Acquire creates the claim under a
	// fallback name.
	EventNameTaken EventType = "NameTaken"
)

// Event is one observation of the claim while Acquire waits.
type Event struct {
	Type      EventType
	BuildLock *buildlockv1.BuildLock
	// Place is the claim's place in its lock's queue while it is Waiting,
	// nil otherwise.
	Place *Place
}

// Option tunes Acquire and Status.
type Option func(*options)

type options struct {
	observe       func(Event)
	onError       func(error)
	renewInterval time.Duration
	renewDeadline time.Duration
	failIfFrozen  bool
	// confirmWithin is GrantConfirmTimeout, shorter in tests.
	confirmWithin time.Duration
	// watching, if set, is called once Acquire's watches have listed (for
	// tests that must act after that).
	watching func()
}

func newOptions(opts []Option) options {
	o := options{observe: func(Event) {}, onError: func(error) {}, confirmWithin: GrantConfirmTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithObserver calls f with the claim when it is created or attached to, and
// whenever it or its place in the queue changes while it waits. f is called
// from one goroutine at a time, while Acquire runs, and must not block.
func WithObserver(f func(Event)) Option {
	return func(o *options) { o.observe = f }
}

// WithErrorHandler calls f with the errors recovered from: a failed
// renewal, a watch that is retried, policies that cannot be read. f may be
// called from other goroutines.
func WithErrorHandler(f func(error)) Option {
	return func(o *options) { o.onError = f }
}

// WithRenewInterval sets how often a pod-less claim's spec.renewTime is
// bumped. The default is a third of its expiresAfter (each renewal up to
// 10% later, at random, so that holders started together spread out).
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) { o.renewInterval = d }
}

// WithRenewDeadline sets how long a pod-less hold may go without a
// successful renewal before the holder gives it up: Hold.WaitLost then
// returns a *LostError with reason ReasonNotRenewed, while the claim may
// still hold for the rest of its expiresAfter, so that the work done under
// the hold can stop before anyone else can be granted the lock. The
// default is five sixths of its expiresAfter.
func WithRenewDeadline(d time.Duration) Option {
	return func(o *options) { o.renewDeadline = d }
}

// Acquire creates the claim's BuildLock (or attaches to this job's own,
// so that a retried step is idempotent) and watches it until the
// operator's verdict:
//   - Held: it returns a release function, which deletes the claim, and the
//     hold's fencing token;
//   - Superseded: an error matching ErrSuperseded (*SupersededError);
//   - Released or Expired, or deleted: ErrEnded (*EndedError);
//   - ctx's deadline: ErrTimeout (*TimeoutError), after deleting the claim;
//   - ctx canceled: ctx's error, after deleting the claim.
//
// A claim is reused only by the job that created it (see Claim.StateDir).
// A BuildLock of the same build by another run of it, or by another job
// that computes the same run id, is never shared: while it is in the
// running, and made by the same identity (its spec.requester), Acquire
// fails with ErrClaimedByAnotherRun (*ClaimedByAnotherRunError); a
// finished one is deleted and replaced. A claim of another identity, or of
// another build, under the claim's name does not stand in the way: the
// claim is then created under a name of its own that nobody can predict.
//
// The claim holds as soon as its lock's grant Lease names it, one write
// before its status says Held (see buildlockv1.GrantLeaseName); the
// returned Hold's BuildLock may then still show Waiting or Pending.
//
// c needs get, list, create, watch, patch and delete on buildlocks in
// claim.Namespace, and get, list and watch on leases there (without them
// Acquire learns of the grant from the status alone), and a scheme that
// knows buildlock.io/v1alpha1 and coordination.k8s.io/v1 (see NewClient).
// A pod-less claim is renewed from its grant until release is called (or
// the process ends); while it waits it is not renewed (it has no expiry of
// its own then).
func Acquire(ctx context.Context, c client.WithWatch, claim Claim, opts ...Option) (release func(context.Context) error, token int64, err error) {
	h, err := AcquireHold(ctx, c, claim, opts...)
	if err != nil {
		return nil, 0, err
	}
	return h.Release, h.Token, nil
}

// AcquireHold is Acquire returning the Hold, for callers that want the
// BuildLock's name (which may be a fallback name) and UID, to watch the
// hold while they use it (Hold.WaitLost), or to leave it to a later step
// (Hold.Detach).
func AcquireHold(ctx context.Context, c client.WithWatch, claim Claim, opts ...Option) (*Hold, error) {
	o := newOptions(opts)
	if claim.RunID == "" {
		claim.RunID = NewRunID()
	}
	if err := claim.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	p, err := openProof(claim)
	var busy *errProofBusy
	switch {
	case errors.As(err, &busy):
		return nil, &ClaimedByAnotherRunError{RunID: claim.RunID, Busy: busy.Error()}
	case err != nil:
		// Without a proof on disk the claim cannot be re-attached to after
		// this process ends, which is safe.
		o.onError(fmt.Errorf("keeping the claim's proof in memory only: %w", err))
		p = &proof{}
	}
	// The watch of the lock starts first, and lists while the claim is
	// created.
	w := newWaiter(c, claim, &o)
	watchCtx, stopWatching := context.WithCancelCause(ctx)
	defer stopWatching(nil)
	watched := make(chan error, 1)
	go func() { watched <- w.wait(watchCtx) }()

	bl, attached, err := createOrAttach(ctx, c, claim, p, o)
	if err != nil {
		stopWatching(nil)
		<-watched //nolint:errcheck // the watch only stopped: the create's error is the one to return
		p.close()
		return nil, err
	}
	if attached {
		o.observe(Event{Type: EventAttached, BuildLock: bl.DeepCopy()})
	} else {
		o.observe(Event{Type: EventCreated, BuildLock: bl.DeepCopy()})
	}
	w.claimed(bl)
	err = <-watched
	if err == nil {
		if err := p.flush(); err != nil {
			o.onError(err)
		}
		// Renewed from the grant on: a waiting or pending claim has no
		// expiry of its own (a hold counts from its grant), so renewing it
		// would cost the API server a status write per renewal for nothing.
		// A claim attached to may have been left by a process that died:
		// renew it at once rather than after a whole interval.
		var r *renewer
		if bl.Spec.PodRef == nil {
			r = startRenewer(c, bl, renewInterval(bl, o.renewInterval), renewDeadline(bl, o.renewDeadline), attached, o.onError)
		}
		return &Hold{
			Namespace: w.last.Namespace, Name: w.last.Name, UID: w.last.UID,
			Token: w.token, BuildLock: w.last,
			c: c, onError: o.onError, renewer: r, proof: p,
			byLease: w.byLease && !w.statusOK, grantedAt: w.grantAt, confirmWithin: o.confirmWithin,
		}, nil
	}
	if errors.Is(err, ErrSuperseded) || errors.Is(err, ErrEnded) {
		// The operator ended the claim; it keeps it (for `kubectl get`) until
		// its finished-TTL, and a retry of this job finds the same verdict.
		p.close()
		return nil, err
	}

	// Timed out, canceled or unable to watch: withdraw the claim, so that it
	// does not hold the lock with nobody to use it.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, cleanupErr := deleteClaim(cleanupCtx, c, bl, false)
	if cleanupErr == nil {
		p.remove()
	} else {
		p.close()
	}
	var frozen *FrozenError
	switch {
	case errors.As(err, &frozen):
		frozen.CleanupErr = cleanupErr
		return nil, frozen
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
	return nil, errors.Join(err, cleanupErr)
}

// createOrAttach attaches to the claim that p proves to be this job's, or
// creates one: under Name(claim), or under a fallback name when that one is
// taken by a claim that is not in the way (another build's, another pod's
// of this build, another identity's).
func createOrAttach(ctx context.Context, c client.Client, claim Claim, p *proof, o options) (bl *buildlockv1.BuildLock, attached bool, err error) {
	if bl, err := provenClaim(ctx, c, claim, p); bl != nil || err != nil {
		return bl, bl != nil, err
	}
	n := &namer{c: c, claim: claim, p: p, o: o}
	names := []string{Name(claim)}
	if claim.Name == "" {
		// A fallback name is random: a second one is needed only when the
		// first was taken in the meantime, which it practically never is.
		names = append(names, fallbackName(claim), fallbackName(claim))
	}
	for i, name := range names {
		bl, attached, err = n.claimName(ctx, name)
		if !errors.Is(err, errNameInUse) {
			return bl, attached, err
		}
		if i == 0 && bl != nil {
			o.observe(Event{Type: EventNameTaken, BuildLock: bl})
		}
	}
	return nil, false, fmt.Errorf("%w: BuildLocks %v in %s exist for other builds, pods or identities; set another name",
		ErrNameTaken, names, claim.Namespace)
}

// provenClaim returns the claim that p names and proves to be this job's,
// nil when there is none. A claim that the job's acquire handed over to its
// later steps (Hold.Detach) is not attached to again, unless it names this
// run's pod: the job's later steps hold it, and a second acquire that
// computes the same run id in the same directory may be another job.
func provenClaim(ctx context.Context, c client.Client, claim Claim, p *proof) (*buildlockv1.BuildLock, error) {
	if p.state.Name == "" || claim.Name != "" && p.state.Name != claim.Name {
		return nil, nil
	}
	existing := &buildlockv1.BuildLock{}
	err := c.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: p.state.Name}, existing)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading BuildLock %s/%s: %w", claim.Namespace, p.state.Name, err)
	case !p.proves(existing) || !sameClaim(existing, claim) || existing.DeletionTimestamp != nil:
		return nil, nil
	case p.state.HandedOver && !claim.ownsByPod(existing):
		return nil, &ClaimedByAnotherRunError{BuildLock: existing, RunID: claim.RunID, HandedOver: true}
	}
	return existing, nil
}

// errNameInUse says a name holds a claim that is not in the way.
var errNameInUse = errors.New("name in use")

// namer creates one claim, trying names.
type namer struct {
	c     client.Client
	claim Claim
	p     *proof
	o     options
	me    *string // the caller's user name, once asked; "" when unknown
}

// claimName creates the claim's BuildLock under name, with a new secret in
// p. When one exists: it is this run's pod's (attached to); another
// build's, or another identity's (errNameInUse, with the claim in the way:
// try another name); or
// another run's of this build, or another job's of this run id, by this
// identity: refused while it is in the running, deleted (if it is still
// the version read) and created again once it finished.
func (n *namer) claimName(ctx context.Context, name string) (*buildlockv1.BuildLock, bool, error) {
	c, claim := n.c, n.claim
	// The name can change hands between each step; a few rounds settle it.
	for range 5 {
		// The secret is written before the claim exists, so that a process
		// that dies right after creating it can still prove it is its own.
		n.p.renew(name)
		if err := n.p.writeSyncing(); err != nil {
			n.o.onError(err)
		}
		bl := claim.BuildLock()
		bl.Name = name
		if bl.Annotations == nil {
			bl.Annotations = map[string]string{}
		}
		bl.Annotations[buildlockv1.RunProofAnnotation] = n.p.annotation()
		err := c.Create(ctx, bl)
		if err == nil {
			// The UID narrows the proof (proof.proves), in memory: the file
			// proves the claim by its secret and name alone, and writing it
			// again would delay the grant by a sync.
			n.p.state.UID = bl.UID
			return bl, false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("creating BuildLock %s/%s: %w", claim.Namespace, name, err)
		}
		existing := &buildlockv1.BuildLock{}
		err = c.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, existing)
		switch {
		case apierrors.IsNotFound(err):
			continue // deleted since: the name is free again
		case err != nil:
			return nil, false, fmt.Errorf("reading existing BuildLock %s/%s: %w", claim.Namespace, name, err)
		case !sameClaim(existing, claim):
			return existing, false, errNameInUse
		case claim.ownsByPod(existing) && existing.DeletionTimestamp == nil:
			n.p.state = proofState{} // the pod's claim, not this secret's
			return existing, true, nil
		case existing.DeletionTimestamp != nil:
			return existing, false, errNameInUse // on its way out, held back by a finalizer
		case !existing.Status.Phase.IsTerminal() && !n.sameIdentity(ctx, existing):
			return existing, false, errNameInUse
		case !existing.Status.Phase.IsTerminal():
			return nil, false, &ClaimedByAnotherRunError{BuildLock: existing, RunID: claim.RunID}
		}
		// Another run's finished claim: replace it, unless it changed since it
		// was read; where this identity may not delete it, take another name.
		switch _, err := deleteClaim(ctx, c, existing, true); {
		case apierrors.IsForbidden(err):
			return existing, false, errNameInUse
		case err != nil && !apierrors.IsConflict(err):
			return nil, false, err
		case err == nil:
			n.o.observe(Event{Type: EventReplaced, BuildLock: existing})
		}
	}
	return nil, false, fmt.Errorf("BuildLock %s/%s kept changing while this run tried to claim its name", claim.Namespace, name)
}

// sameIdentity reports whether bl may have been created by the caller: its
// spec.requester (stamped by the API server's buildlock-requester policy)
// is the caller's user name, or either is unknown. A claim of another
// identity is never another run of this build: it is in the way of
// nothing, whatever name it took.
func (n *namer) sameIdentity(ctx context.Context, bl *buildlockv1.BuildLock) bool {
	r := bl.Spec.Requester
	if r == nil || r.Username == "" {
		return true
	}
	if n.me == nil {
		me := whoAmI(ctx, n.c)
		n.me = &me
	}
	return *n.me == "" || *n.me == r.Username
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

// waiter follows one claim, and its place among its lock's claims, until
// its verdict. Its watch starts before the claim is created (see wait).
type waiter struct {
	o      *options
	claims *feed      // the lock's claims
	grants *grantSeen // what the grant Lease showed
	lease  *feed      // the grant Lease; nil without one
	w      *watcher

	mu sync.Mutex
	bl *buildlockv1.BuildLock // the claim as created or attached to; nil until then
	// seen holds the UIDs of the claims the watch has shown, so that a
	// claim missing from the store is known to be deleted only once it
	// was there (the watch may show it after its create returns).
	seen map[types.UID]bool

	last     *buildlockv1.BuildLock // the latest version seen
	place    *Place                 // the latest place seen
	token    int64                  // the hold's token, once held
	byLease  bool                   // held by the grant Lease, before the status said so
	grantAt  time.Time              // when the hold was learned
	statusOK bool                   // the status said Held with the token
}

// newWaiter prepares the watch of claim's lock: its claims and its grant
// Lease (with the namespace's token floor read before the Lease is first
// listed), so that it can start before the claim is created.
func newWaiter(c client.WithWatch, claim Claim, o *options) *waiter {
	w := &waiter{o: o, grants: newGrantSeen(), seen: map[types.UID]bool{}}
	w.claims = claimsFeed(byTarget(claim.Target))
	w.claims.observe = func(obj runtime.Object, deleted, _ bool) {
		if bl, ok := obj.(*buildlockv1.BuildLock); ok && !deleted {
			w.mu.Lock()
			w.seen[bl.UID] = true
			w.mu.Unlock()
		}
	}
	w.lease = grantFeed(c, claim.Namespace, claim.Target, w.grants, o.onError)
	w.w = newWatcher(c, claim.Namespace, o.onError, w.claims, w.lease)
	return w
}

// claimed gives the waiter its claim, created or attached to.
func (w *waiter) claimed(bl *buildlockv1.BuildLock) {
	w.mu.Lock()
	w.bl, w.last = bl, bl
	w.mu.Unlock()
	w.w.kick()
}

// wait watches the claim, with its lock's other claims, and the lock's
// grant Lease until the verdict, and returns the hold's fencing token when
// it holds. The watch starts before the claim is created (run it while
// createOrAttach runs, and hand it the claim with claimed), so that the
// claim's first verdict, and the grant Lease's first version that names
// it, come as events on watches that are already open: nothing is listed
// after the create, and nothing polls.
//
// The claim holds as soon as the grant Lease names it and the client can
// tell that the operator wrote it (grantSeen.grant): the operator writes
// the grant first and the holder's status after it, so the Lease says so
// one write earlier than the status. Every other verdict comes from the
// claim's status. A client that may not read Leases learns of its grant
// from the status alone, and says so once through the error handler.
func (w *waiter) wait(ctx context.Context) error {
	return w.w.run(ctx, w.decide)
}

// decide decides on the lock's claims and grant Lease as the watch has
// them.
func (w *waiter) decide() (bool, error) {
	if w.o.watching != nil {
		w.o.watching()
		w.o.watching = nil
	}
	w.mu.Lock()
	mine, seen := w.bl, w.seen
	w.mu.Unlock()
	if mine == nil {
		return false, nil // not created yet
	}
	bl := claimIn(w.claims.store, mine)
	if bl == nil {
		w.mu.Lock()
		deleted := seen[mine.UID]
		w.mu.Unlock()
		if !deleted {
			return false, nil // created, not shown by the watch yet
		}
		return true, &EndedError{Namespace: mine.Namespace, Name: mine.Name, Reason: ReasonDeleted,
			Message: "The BuildLock was deleted while it waited for the lock."}
	}
	claims := claimsIn(w.claims.store)
	var place *Place
	if bl.Status.Phase == buildlockv1.PhaseWaiting {
		place = placeOf(claims, bl)
	}
	if bl.ResourceVersion != w.last.ResourceVersion || !samePlace(place, w.place) {
		w.last, w.place = bl, place
		w.o.observe(Event{Type: EventUpdated, BuildLock: bl.DeepCopy(), Place: place})
	}
	if err := frozenVerdict(bl); err != nil && w.o.failIfFrozen {
		return true, err
	}
	if done, err := verdict(bl); done {
		if err == nil {
			w.token, w.statusOK, w.grantAt = bl.Status.FencingToken, true, time.Now()
		}
		return true, err
	}
	if !w.lease.active() {
		return false, nil
	}
	var others int64
	for _, c := range claims {
		if c.UID != bl.UID {
			others = max(others, c.Status.FencingToken)
		}
	}
	if token, ok := w.grants.grant(buildlockv1.GrantHolderIdentity(bl.Name, bl.UID), others); ok {
		w.token, w.byLease, w.grantAt = token, true, time.Now()
		return true, nil
	}
	return false, nil
}

// claimsIn lists the BuildLocks of a store.
func claimsIn(store cache.Store) []*buildlockv1.BuildLock {
	var claims []*buildlockv1.BuildLock
	for _, obj := range store.List() {
		if bl, ok := obj.(*buildlockv1.BuildLock); ok {
			claims = append(claims, bl)
		}
	}
	return claims
}

func samePlace(a, b *Place) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}
