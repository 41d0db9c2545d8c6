//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The floor contender stands in for the operator in a load's floor run: the
// same claims, created and released by the same contenders at the same
// concurrency, decided by a stand-in that sends only what the API makes
// necessary. What buildlock spends above it is the operator's own.

// floorOperator decides the claims of one namespace with only the requests
// the API makes necessary: it watches the claims (any operator must), and
// writes each claim's verdict into its status once, creates a lock's grant
// Lease naming its first claim (the first grant's compare-and-swap), and,
// when a holder's claim is deleted, updates the Lease to name the lock's
// waiter (a compare-and-swap on the Lease it wrote) and writes the waiter's
// status. It knows the verdicts ahead: a target's first claim holds, its
// second waits, the others are superseded, which is how the operator ends
// every load the floor runs stand for. It reads nothing else, records no
// Event, keeps no token floor, retries nothing, and never writes a claim
// twice. Its writes run on as many workers as the operator's reconciles
// (-bench.workers), each lock's in order.
type floorOperator struct {
	c       client.WithWatch // counted by count
	count   *counter
	ns      string
	queue   chan *floorLock // locks with work to do, each on the queue or a worker at most once
	qmu     sync.Mutex      // guards stopped and sends on queue
	stopped bool            // the run is over: events still arriving are dropped
	wg      sync.WaitGroup
	mu      sync.Mutex
	locks   map[string]*floorLock
	holders map[string]*floorLock // holder's claim name → its lock
	failed  error                 // the first failed write
	// fail cancels the run's context with the first failed write, so that
	// nothing waits for a verdict that will not come.
	fail context.CancelCauseFunc
}

// floorLock is what the floor operator knows of one lock. Its work runs as
// the operator's reconciles of a lock do: one worker at a time, while the
// other workers serve other locks.
type floorLock struct {
	target  string
	mu      sync.Mutex // guards the fields up to queued
	claims  int
	holder  string
	pending []func(context.Context) error
	queued  bool // on the queue or on a worker, which runs pending in order
	// The lock's work alone touches these, one item at a time.
	lease  *coordinationv1.Lease
	waiter *buildlockv1.BuildLock // as last written
}

// startFloorOperator starts the floor operator's workers for ns. Its first
// failed write cancels ctx, through fail.
func (b *bench) startFloorOperator(ctx context.Context, fail context.CancelCauseFunc, ns string, workers int) (*floorOperator, error) {
	count := newCounter()
	c, err := client.NewWithWatch(count.wrap(b.cfg), client.Options{Scheme: b.c.Scheme()})
	if err != nil {
		return nil, err
	}
	return runFloorOperator(ctx, fail, c, count, ns, workers), nil
}

// runFloorOperator starts the floor operator's workers with c, whose
// requests count counts.
func runFloorOperator(ctx context.Context, fail context.CancelCauseFunc, c client.WithWatch, count *counter, ns string, workers int) *floorOperator {
	f := &floorOperator{c: c, count: count, ns: ns, queue: make(chan *floorLock, 1<<16),
		locks: map[string]*floorLock{}, holders: map[string]*floorLock{}, fail: fail}
	for range workers {
		f.wg.Go(func() {
			for l := range f.queue {
				f.work(ctx, l)
			}
		})
	}
	return f
}

// work runs l's pending items in order, until none is left.
func (f *floorOperator) work(ctx context.Context, l *floorLock) {
	for {
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.queued = false
			l.mu.Unlock()
			return
		}
		item := l.pending[0]
		l.pending = l.pending[1:]
		l.mu.Unlock()
		if err := item(ctx); err != nil {
			f.mu.Lock()
			if f.failed == nil {
				f.failed = err
				f.fail(err)
			}
			f.mu.Unlock()
		}
	}
}

// stop waits for the work queued so far and returns the first write that
// failed. The watch may still deliver events (the harness's cleanup): they
// are dropped.
func (f *floorOperator) stop() error {
	f.qmu.Lock()
	f.stopped = true
	close(f.queue)
	f.qmu.Unlock()
	f.wg.Wait()
	return f.err()
}

// enqueue adds item to l's work, and queues l unless it is queued or
// running already; nothing once the run is over.
func (f *floorOperator) enqueue(l *floorLock, item func(context.Context) error) {
	l.mu.Lock()
	l.pending = append(l.pending, item)
	queued := l.queued
	l.queued = true
	l.mu.Unlock()
	if queued {
		return
	}
	f.qmu.Lock()
	defer f.qmu.Unlock()
	if !f.stopped {
		f.queue <- l
	}
}

func (f *floorOperator) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// watch decides every claim created in the namespace from now on as it
// arrives, and hands a lock over when its holder's claim is deleted.
func (f *floorOperator) watch(ctx context.Context) error {
	return watchNamespace(ctx, f.c, &buildlockv1.BuildLockList{}, f.ns, func(typ watch.EventType, obj client.Object, _ time.Time) {
		bl := obj.(*buildlockv1.BuildLock)
		switch {
		case typ == watch.Added && bl.Status.Phase == "":
			f.decide(bl)
		case typ == watch.Deleted:
			f.handOver(bl.Name)
		}
	})
}

// lockOf returns the floor operator's lock of target.
func (f *floorOperator) lockOf(target string) *floorLock {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.locks[target]
	if l == nil {
		l = &floorLock{target: target}
		f.locks[target] = l
	}
	return l
}

// decide queues the one write of a new claim's verdict, and the grant's
// Lease for a lock's first claim.
func (f *floorOperator) decide(bl *buildlockv1.BuildLock) {
	l := f.lockOf(bl.Spec.Target)
	l.mu.Lock()
	n := l.claims
	l.claims++
	if n == 0 {
		l.holder = bl.Name
		f.mu.Lock()
		f.holders[bl.Name] = l
		f.mu.Unlock()
	}
	holder := l.holder
	l.mu.Unlock()
	f.enqueue(l, func(ctx context.Context) error {
		now := time.Now()
		if n == 0 {
			return f.grant(ctx, l, bl, now)
		}
		updated := bl.DeepCopy()
		updated.Status = floorSuperseded(bl, holder, now)
		if n == 1 {
			updated.Status = floorWaiting(bl, holder, now)
		}
		if err := f.c.Status().Update(ctx, updated); err != nil {
			return fmt.Errorf("floor: writing the status of %s: %w", bl.Name, err)
		}
		if n == 1 {
			l.waiter = updated
		}
		return nil
	})
}

// grant creates or updates l's Lease to name bl, then writes bl's Held
// status. It runs as l's work.
func (f *floorOperator) grant(ctx context.Context, l *floorLock, bl *buildlockv1.BuildLock, now time.Time) error {
	token := int32(1)
	if l.lease == nil {
		l.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: buildlockv1.GrantLeaseName(l.target),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": l.target}}}
	} else {
		token = *l.lease.Spec.LeaseTransitions + 1
	}
	l.lease.Spec.HolderIdentity = ptrTo(buildlockv1.GrantHolderIdentity(bl.Name, bl.UID))
	l.lease.Spec.LeaseTransitions = ptrTo(token)
	l.lease.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	var err error
	if l.lease.ResourceVersion == "" {
		err = f.c.Create(ctx, l.lease)
	} else {
		err = f.c.Update(ctx, l.lease)
	}
	if err != nil {
		return fmt.Errorf("floor: writing the grant Lease of %s: %w", l.target, err)
	}
	updated := bl.DeepCopy()
	updated.Status = floorHeld(bl, l.target, int64(token), now)
	if err := f.c.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("floor: writing the status of %s: %w", bl.Name, err)
	}
	return nil
}

// handOver queues the hand-off of the lock whose holder's claim name was
// deleted: the Lease names its waiter, then the waiter's status says Held.
func (f *floorOperator) handOver(name string) {
	f.mu.Lock()
	l := f.holders[name]
	delete(f.holders, name)
	f.mu.Unlock()
	if l == nil {
		return
	}
	f.enqueue(l, func(ctx context.Context) error {
		next := l.waiter
		if next == nil {
			return nil // nobody waits: the lock stays free
		}
		l.waiter = nil
		l.mu.Lock()
		l.holder = next.Name
		l.mu.Unlock()
		f.mu.Lock()
		f.holders[next.Name] = l
		f.mu.Unlock()
		return f.grant(ctx, l, next, time.Now())
	})
}

// decideListed decides the claims of ns that exist now, as an operator's
// cold start does: one list, then each lock's grant and verdicts (its first
// claim by name holds, the second waits, the others are superseded) as one
// unit of work on the workers.
func (f *floorOperator) decideListed(ctx context.Context) error {
	var list buildlockv1.BuildLockList
	if err := f.c.List(ctx, &list, client.InNamespace(f.ns)); err != nil {
		return fmt.Errorf("floor: listing the claims: %w", err)
	}
	byTarget := map[string][]*buildlockv1.BuildLock{}
	var targets []string
	for i := range list.Items {
		bl := &list.Items[i]
		if byTarget[bl.Spec.Target] == nil {
			targets = append(targets, bl.Spec.Target)
		}
		byTarget[bl.Spec.Target] = append(byTarget[bl.Spec.Target], bl)
	}
	for _, target := range targets {
		claims := byTarget[target]
		slices.SortFunc(claims, func(a, b *buildlockv1.BuildLock) int { return cmpNames(a.Name, b.Name) })
		l := f.lockOf(target)
		l.mu.Lock()
		l.holder, l.claims = claims[0].Name, len(claims)
		l.mu.Unlock()
		f.enqueue(l, func(ctx context.Context) error {
			now := time.Now()
			if err := f.grant(ctx, l, claims[0], now); err != nil {
				return err
			}
			for i, bl := range claims[1:] {
				updated := bl.DeepCopy()
				updated.Status = floorSuperseded(bl, claims[0].Name, now)
				if i == 0 {
					updated.Status = floorWaiting(bl, claims[0].Name, now)
				}
				if err := f.c.Status().Update(ctx, updated); err != nil {
					return fmt.Errorf("floor: writing the status of %s: %w", bl.Name, err)
				}
			}
			return nil
		})
	}
	return nil
}

// cmpNames orders c-2 before c-10.
func cmpNames(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// The floor's statuses have the operator's shape and size: phase, reason,
// a message of the operator's length, the names the operator writes, times
// and the two conditions (which carry no message).

func floorHeld(bl *buildlockv1.BuildLock, target string, token int64, now time.Time) buildlockv1.BuildLockStatus {
	at := metav1.NewMicroTime(now)
	return floorStatus(bl, buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, now, buildlockv1.BuildLockStatus{
		Message: fmt.Sprintf("Holding %s with fencing token %d; deploy now and delete this BuildLock when done.", target, token),
		Holder:  bl.Name, FencingToken: token, AcquiredAt: &at,
	})
}

func floorWaiting(bl *buildlockv1.BuildLock, holder string, now time.Time) buildlockv1.BuildLockStatus {
	at := metav1.NewMicroTime(now)
	return floorStatus(bl, buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, now, buildlockv1.BuildLockStatus{
		Message: fmt.Sprintf("Waiting for build 1 of %s@main to release %s.", bl.Spec.Repo, bl.Spec.Target),
		Holder:  holder, Waiting: bl.Name, QueuedAt: &at,
	})
}

func floorSuperseded(bl *buildlockv1.BuildLock, holder string, now time.Time) buildlockv1.BuildLockStatus {
	at := metav1.NewMicroTime(now)
	target := bl.Spec.Target
	return floorStatus(bl, buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, now, buildlockv1.BuildLockStatus{
		Message: fmt.Sprintf("Build %d of %s@main is newer and waits for %s: with the ordering NewestWins one build waits, the newest, "+
			"and this build will not deploy. Stop this pipeline; for every build to deploy in its turn, give %s a BuildLockPolicy "+
			"with the ordering Queue or Fifo.", bl.Spec.Build, bl.Spec.Repo, target, target),
		Holder: holder, SupersededBy: holder, FinishedAt: &at,
	})
}

func floorStatus(bl *buildlockv1.BuildLock, phase buildlockv1.Phase, reason string, now time.Time, st buildlockv1.BuildLockStatus) buildlockv1.BuildLockStatus {
	st.Phase, st.Reason, st.ObservedGeneration = phase, reason, bl.Generation
	acquired, decided := metav1.ConditionFalse, metav1.ConditionTrue
	switch phase {
	case buildlockv1.PhaseHeld:
		acquired = metav1.ConditionTrue
	case buildlockv1.PhaseWaiting:
		decided = metav1.ConditionFalse
	}
	since := metav1.NewTime(now.Truncate(time.Second))
	st.Conditions = []metav1.Condition{
		{Type: buildlockv1.ConditionAcquired, Status: acquired, Reason: reason, ObservedGeneration: bl.Generation, LastTransitionTime: since},
		{Type: buildlockv1.ConditionDecided, Status: decided, Reason: reason, ObservedGeneration: bl.Generation, LastTransitionTime: since},
	}
	return st
}

// floorScale runs the scale load of blScale on the floor operator, in a
// namespace of its own, and leaves nothing behind: the in-process operator
// must be stopped meanwhile (it would decide the claims too), and must not
// find them when it starts again.
func (b *bench) floorScale(targets, contenders int) (scaleResult, error) {
	ns := b.namespace("floor-scale")
	r := scaleResult{row: rowFloorContender, claims: targets * contenders, counts: map[string]int{}}
	ctx, cancel := context.WithCancelCause(b.ctx)
	defer cancel(nil)
	f, err := b.startFloorOperator(ctx, cancel, ns, *flagWorkers)
	if err != nil {
		return r, err
	}
	if err := f.watch(ctx); err != nil {
		return r, errors.Join(err, f.stop())
	}
	err = b.scaleLoad(ctx, ns, targets, contenders, &r, scaleDecider{ops: f.count})
	if failed := f.stop(); failed != nil {
		err = failed // what made the load fail
	}
	return r, errors.Join(err, b.deleteClaimsAndLeases(ns))
}
