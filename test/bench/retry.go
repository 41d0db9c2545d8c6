//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// cleanupLimit bounds one cleanup, retries and wait included: a delete of
// 10,000 claims on a slow machine takes minutes, not hours.
const cleanupLimit = 10 * time.Minute

// cleanup runs call, a cleanup request of the harness (a delete), until the
// API server accepts it, and then waits until gone reports that what it
// deletes is gone (gone may be nil: nothing to wait for). A slow API server
// answers a long delete with a timeout while it goes on deleting, throttles,
// or loses a connection: those are retried with a backoff, and a NotFound is
// what a delete wants. Any other error fails the step, with what it was
// cleaning up.
func (b *bench) cleanup(what string, call func(context.Context) error, gone func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(b.ctx, cleanupLimit)
	defer cancel()
	var last error
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 5 * time.Second}
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		last = call(ctx)
		switch {
		case last == nil, apierrors.IsNotFound(last):
			return true, nil
		case transient(last):
			return false, nil
		}
		return false, last
	})
	if err != nil {
		if last != nil && !errors.Is(err, last) {
			err = fmt.Errorf("%w (last error: %w)", err, last)
		}
		return fmt.Errorf("cleaning up %s: %w", what, err)
	}
	if gone == nil {
		return nil
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		done, err := gone(ctx)
		if err != nil && transient(err) {
			return false, nil
		}
		return done, err
	})
	if err != nil {
		return fmt.Errorf("waiting until %s is gone: %w", what, err)
	}
	return nil
}

// transient reports whether err is one a slow or busy API server gives
// while the request may still take effect or succeed when sent again.
func transient(err error) bool {
	var netErr net.Error
	switch {
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &netErr):
		return true
	}
	return false
}

// deleteObject deletes one object the harness made, retrying what a slow API
// server answers (see cleanup), without waiting for it to be gone.
func (b *bench) deleteObject(obj client.Object, opts ...client.DeleteOption) error {
	return b.cleanup(fmt.Sprintf("%T %s/%s", obj, obj.GetNamespace(), obj.GetName()),
		func(ctx context.Context) error { return b.c.Delete(ctx, obj, opts...) }, nil)
}

// deleteAllIn deletes every object of example's kind in ns (a delete
// collection) and waits until none is left, so that what follows runs on a
// quiet API server: a delete collection that times out goes on in the
// server, and is sent again until it is done.
func (b *bench) deleteAllIn(ns string, example client.Object, list client.ObjectList, opts ...client.DeleteAllOfOption) error {
	opts = append(opts, client.InNamespace(ns))
	return b.cleanup(fmt.Sprintf("every %T of namespace %s", example, ns),
		func(ctx context.Context) error { return b.c.DeleteAllOf(ctx, example, opts...) },
		func(ctx context.Context) (bool, error) {
			if err := b.c.List(ctx, list, client.InNamespace(ns), client.Limit(1)); err != nil {
				return false, err
			}
			return meta.LenList(list) == 0, nil
		})
}

// deleteClaimsAndLeases empties ns of BuildLocks and Leases: what a floor
// run leaves, which the operator must not find when it starts again.
func (b *bench) deleteClaimsAndLeases(ns string) error {
	if err := b.deleteAllIn(ns, &buildlockv1.BuildLock{}, &buildlockv1.BuildLockList{}); err != nil {
		return err
	}
	return b.deleteAllIn(ns, &coordinationv1.Lease{}, &coordinationv1.LeaseList{})
}

// deletePods empties ns of pods, at once (no kubelet runs to end them).
func (b *bench) deletePods(ns string) error {
	return b.deleteAllIn(ns, &corev1.Pod{}, &corev1.PodList{}, client.GracePeriodSeconds(0))
}
