package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Hold is a held lock.
type Hold struct {
	// Namespace, Name and UID identify the holding BuildLock.
	Namespace, Name string
	UID             types.UID
	// Token is the hold's fencing token.
	Token int64
	// BuildLock is the claim as it was last seen when it came to hold the
	// lock: its status may still say Waiting or Pending when the grant
	// Lease named it first.
	BuildLock *buildlockv1.BuildLock

	c       client.WithWatch
	onError func(error)
	renewer *renewer // nil for a claim with a pod
	proof   *proof
	// byLease: the hold was learned from the grant Lease before the
	// claim's status said Held, which it must then say within
	// confirmWithin of grantedAt.
	byLease       bool
	grantedAt     time.Time
	confirmWithin time.Duration
	mu            sync.Mutex
	done          bool // released or detached
}

// Release ends the hold: it stops renewing the claim and deletes it (only
// this claim: the delete is conditional on its UID), and removes its
// proof. A claim that is already gone counts as released. Release may be
// called more than once.
func (h *Hold) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return nil
	}
	h.renewer.stop()
	if _, err := deleteClaim(ctx, h.c, h.BuildLock, false); err != nil {
		return err
	}
	h.proof.remove()
	h.done = true
	return nil
}

// Detach leaves the hold to the job's later steps: it stops renewing the
// claim (a pod-less one then expires expiresAfter after its last renewal,
// unless it is released) and marks it as handed over, so that no later
// Acquire of this run takes it again; ReleaseBuild in the same job still
// releases it. Call it when the process ends while the claim should hold
// (`kubectl buildlock acquire` without a command).
func (h *Hold) Detach() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return nil
	}
	h.renewer.stop()
	h.done = true
	return h.proof.handOver()
}

// ReasonNotRenewed is LostError.Reason when no renewal of a pod-less hold
// succeeded within its renew deadline (WithRenewDeadline): the claim may
// still hold for a moment, but the holder must stop before it expires.
const ReasonNotRenewed = "NotRenewed"

// WaitLost watches the held claim, and its lock's grant Lease, until the
// claim stops holding the lock:
//   - it is deleted (by anyone), or the operator ends it (Released, for
//     example force-released or LockLost; Expired);
//   - the grant Lease stops naming it: it names another claim, or nobody,
//     or it is deleted, whoever changed it (ReasonGrantMoved). The
//     operator moves the grant only to end the hold, and undoes anyone
//     else's change, but a holder cannot tell the two apart, and another
//     claim's client may already take the change for its grant: the
//     holder stops;
//   - a hold learned from the grant Lease was not confirmed by the claim's
//     status (Held with the same token) within GrantConfirmTimeout
//     (ReasonNotConfirmed);
//   - (a pod-less claim) no renewal succeeded within the renew deadline
//     (ReasonNotRenewed).
//
// It then returns a *LostError (ErrLost) saying why; when ctx ends first,
// ctx's cause. A holder that deploys for a while runs it alongside, and
// stops deploying when it returns: the lock may already be someone else's.
// A client that may not read Leases follows the claim's status alone.
func (h *Hold) WaitLost(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if h.renewer != nil {
		go func() {
			select {
			case <-h.renewer.lapsed:
				cancel(&LostError{Namespace: h.Namespace, Name: h.Name, Reason: ReasonNotRenewed,
					Message: fmt.Sprintf("No renewal of the claim succeeded for %s; it expires %s after the last one, so the holder stops now.",
						h.renewer.deadline, ExpiresAfter(h.BuildLock))})
			case <-ctx.Done():
			}
		}()
	}
	claim := claimsFeed(byName(h.Name))
	grants := newGrantSeen()
	grants.hold(buildlockv1.GrantHolderIdentity(h.Name, h.UID))
	lease := grantFeed(h.c, h.Namespace, h.BuildLock.Spec.Target, grants, h.onError)
	lease.alongside = nil // the floor matters only to a claim that waits
	w := newWatcher(h.c, h.Namespace, h.onError, claim, lease)

	confirmed := !h.byLease
	if !confirmed {
		timer := time.AfterFunc(time.Until(h.grantedAt.Add(h.confirmWithin)), w.kick)
		defer timer.Stop()
	}
	lost := func(reason, message string) error {
		return &LostError{Namespace: h.Namespace, Name: h.Name, Reason: reason, Message: message}
	}
	return w.run(ctx, func() (bool, error) {
		bl := claimIn(claim.store, h.BuildLock)
		switch {
		case bl == nil:
			return true, lost(ReasonDeleted, "")
		case bl.Status.Phase.IsTerminal():
			// A hold ends only with its claim (Released, Expired): a
			// claim is never Held and then Waiting again.
			return true, &LostError{Namespace: h.Namespace, Name: h.Name, Phase: bl.Status.Phase, Reason: bl.Status.Reason, Message: bl.Status.Message}
		case bl.Status.Phase == buildlockv1.PhaseHeld && bl.Status.FencingToken != h.Token:
			return true, lost(ReasonNotConfirmed, fmt.Sprintf("Its status says Held with fencing token %d, not %d: the grant it took is not the operator's.",
				bl.Status.FencingToken, h.Token))
		case bl.Status.Phase == buildlockv1.PhaseHeld:
			confirmed = true
		}
		if why := grants.moved(); why != "" && lease.active() {
			return true, lost(ReasonGrantMoved, capitalize(why)+"; whoever changed it, this hold stops.")
		}
		if !confirmed && !time.Now().Before(h.grantedAt.Add(h.confirmWithin)) {
			// A claim that still shows Waiting or Pending holds by its
			// grant Lease while its status is on its way, but not for ever.
			return true, lost(ReasonNotConfirmed, fmt.Sprintf("The grant Lease named it with fencing token %d, and its status did not say Held within %s: the grant was not the operator's.",
				h.Token, h.confirmWithin))
		}
		return false, nil
	})
}

// capitalize makes s a sentence's start.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// Context returns a context that is canceled when the hold is lost (see
// WaitLost), with the *LostError as its cause, or when parent ends. Run the
// work that needs the lock under it, and stop when it is done:
//
//	ctx, stop := hold.Context(ctx)
//	defer stop()
//	err := deploy(ctx) // context.Cause(ctx) says why it was stopped
func (h *Hold) Context(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		if err := h.WaitLost(ctx); errors.Is(err, ErrLost) {
			cancel(err)
		} else if err != nil && ctx.Err() == nil {
			h.onError(fmt.Errorf("watching BuildLock %s/%s while it holds: %w", h.Namespace, h.Name, err))
		}
	}()
	return ctx, func() { cancel(nil) }
}

// renewInterval is how often a pod-less claim is renewed: override when
// positive, else a third of its expiresAfter, so that two renewals can fail
// before the hold expires.
func renewInterval(bl *buildlockv1.BuildLock, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return ExpiresAfter(bl) / 3
}

// renewDeadline is how long a pod-less hold may go without a successful
// renewal: override when positive, else five sixths of its expiresAfter.
func renewDeadline(bl *buildlockv1.BuildLock, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return ExpiresAfter(bl) * 5 / 6
}

// ExpiresAfter is how long bl's pod-less hold lasts without renewal: its
// spec.expiresAfter, else the API's default.
func ExpiresAfter(bl *buildlockv1.BuildLock) time.Duration {
	if bl.Spec.ExpiresAfter != nil && bl.Spec.ExpiresAfter.Duration > 0 {
		return bl.Spec.ExpiresAfter.Duration
	}
	return buildlockv1.DefaultExpiresAfter
}

// renewJitter spreads renewals: each comes up to this fraction of the
// interval later than the interval, so that holders that started together
// do not renew together.
const renewJitter = 0.1

// renewer bumps a pod-less claim's spec.renewTime.
type renewer struct {
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
	deadline time.Duration
	// lapsed is closed when no renewal succeeded for deadline.
	lapsed chan struct{}
}

// startRenewer renews bl every interval, up to renewJitter later at random
// (wait.JitterUntil; at once first when immediately is set), retrying a
// failed renewal a few times with backoff, until stop is called or the
// claim is gone. When no renewal succeeds for deadline (counted from now,
// the claim's creation or its attachment), it closes lapsed.
func startRenewer(c client.Client, bl *buildlockv1.BuildLock, interval, deadline time.Duration, immediately bool, onError func(error)) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	r := &renewer{cancel: cancel, done: make(chan struct{}), deadline: deadline, lapsed: make(chan struct{})}
	var lapseOnce sync.Once // a hold that lapsed stays lapsed: the holder has stopped
	lapse := time.AfterFunc(deadline, func() { lapseOnce.Do(func() { close(r.lapsed) }) })
	backoff := wait.Backoff{Duration: min(time.Second, interval/8), Factor: 2, Jitter: renewJitter, Steps: 4, Cap: interval / 4}
	skip := !immediately // JitterUntil runs its function at once
	go func() {
		defer close(r.done)
		defer lapse.Stop()
		wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
			if skip {
				skip = false
				return
			}
			var last error
			err := retry.OnError(backoff, func(err error) bool { return ctx.Err() == nil && !gone(err) }, func() error {
				renewCtx, cancelRenew := context.WithTimeout(ctx, interval/2)
				defer cancelRenew()
				last = Renew(renewCtx, c, bl)
				return last
			})
			switch {
			case err == nil:
				lapse.Reset(deadline)
			case gone(err):
				cancel() // the claim was deleted or replaced: nothing to renew
			case ctx.Err() == nil:
				onError(last)
			}
		}, interval, renewJitter, true)
	}()
	return r
}

// gone reports whether a renewal failed because the claim is gone: deleted
// (NotFound), or another object has its name (the UID precondition's
// Conflict).
func gone(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}

// stop stops renewing, waiting for an ongoing renewal to finish. A nil
// renewer (a claim with a pod) does nothing.
func (r *renewer) stop() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

// Renew sets bl's spec.renewTime to now, so that its pod-less hold lasts
// another spec.expiresAfter. The patch carries bl's UID, so that it never
// renews another claim of the same name. c needs patch on buildlocks.
func Renew(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock) error {
	return patchClaim(ctx, c, bl, map[string]any{
		"spec": map[string]any{"renewTime": buildlockv1.NewTimestamp(time.Now())},
	})
}
