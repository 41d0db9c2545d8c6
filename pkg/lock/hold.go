package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
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

	c          client.WithWatch
	onError    func(error)
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
	if _, err := deleteClaim(ctx, h.c, h.BuildLock, false); err != nil {
		return err
	}
	h.isReleased = true
	return nil
}

// WaitLost watches the held claim until it stops holding the lock: it is
// deleted (by anyone), or the operator ends the claim (Released, for
// example force-released or LockLost; Expired). It then returns a *LostError
// (ErrLost) saying why; when ctx ends first, ctx's cause. A holder that
// deploys for a while runs it alongside, and stops deploying when it
// returns: the lock may already be someone else's.
func (h *Hold) WaitLost(ctx context.Context) error {
	return watchClaims(ctx, h.c, h.Namespace, byName(h.Name), h.onError, func(store cache.Store) (bool, error) {
		bl := claimIn(store, h.BuildLock)
		switch {
		case bl == nil:
			return true, &LostError{Namespace: h.Namespace, Name: h.Name, Reason: ReasonDeleted}
		case bl.Status.Phase.IsTerminal():
			// A hold ends only with its claim (Released, Expired): a
			// claim is never Held and then Waiting again. A claim that
			// still shows Waiting or Pending holds by its grant Lease,
			// and its status is on its way.
			return true, &LostError{Namespace: h.Namespace, Name: h.Name, Phase: bl.Status.Phase, Reason: bl.Status.Reason, Message: bl.Status.Message}
		}
		return false, nil
	})
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

// ExpiresAfter is how long bl's pod-less hold lasts without renewal: its
// spec.expiresAfter, else the API's default.
func ExpiresAfter(bl *buildlockv1.BuildLock) time.Duration {
	if bl.Spec.ExpiresAfter != nil && bl.Spec.ExpiresAfter.Duration > 0 {
		return bl.Spec.ExpiresAfter.Duration
	}
	return buildlockv1.DefaultExpiresAfter
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
			renewCtx, cancelRenew := context.WithTimeout(ctx, interval)
			err := Renew(renewCtx, c, bl)
			cancelRenew()
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

// Renew sets bl's spec.renewTime to now, so that its pod-less hold lasts
// another spec.expiresAfter. The patch carries bl's UID, so that it never
// renews another claim of the same name. c needs patch on buildlocks.
func Renew(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock) error {
	return patchClaim(ctx, c, bl, map[string]any{
		"spec": map[string]any{"renewTime": buildlockv1.NewTimestamp(time.Now())},
	})
}
