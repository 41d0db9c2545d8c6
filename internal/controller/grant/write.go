package grant

import (
	"context"
	"fmt"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// Write records grant in the lock's Lease as a compare-and-swap: an update
// carries the resourceVersion of read, the Lease the decision was computed
// from, and a create (read is nil) fails if another writer created the Lease
// first. Either way a concurrent writer makes this call fail with a
// Conflict or AlreadyExists error, and the caller decides again. The Lease
// carries e, the lock's enforcement, in the same write; its renewTime says
// when it was last written (the idle Lease's retention counts from it).
func Write(ctx context.Context, c client.Client, mem *Memory, lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *Enforcement, now time.Time) (*coordinationv1.Lease, error) {
	lease, err := desiredLease(lock, read, grant, e)
	if err != nil {
		return nil, err
	}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if err := compareAndSwap(ctx, c, lease, read != nil); err != nil {
		return nil, fmt.Errorf("writing grant Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	mem.Wrote(lease)
	mem.Granted(lease, now)
	return lease, nil
}

// ReservedTokens is how many tokens one raise of a namespace's token floor
// reserves: a grant whose token is above the floor raises it to that token
// plus ReservedTokens-1 first, so the namespace's leading lock writes the
// floor once per ReservedTokens grants (and a new Lease, whose first token
// is above the floor, once).
const ReservedTokens = 100

// FloorRead is a namespace's token floor as a live read returned it
// (ReadTokenFloor): its token, and its Lease (nil: there is none).
type FloorRead struct {
	Token int64
	Lease *coordinationv1.Lease
}

// Reserve makes the namespace's token floor at least token before a grant
// Lease carries it. So every token a lock issues is at most its
// namespace's floor, and a lock left without a record (a person deleted
// its Lease, and the claims that showed its tokens went before any
// manager wrote it again, with the managers restarting meanwhile: no
// memory) starts above every token it issued. Nothing is read or written
// when this manager has seen the floor hold token. Otherwise the raise is
// a compare-and-swap on the floor as read: first on read, the live read
// the decision was taken on (nil: none; ignored when this manager has
// raised the floor since), then, after a lost race with another lock's
// raise (a Conflict, or AlreadyExists for two creates), on a new live read
// through live.
func Reserve(ctx context.Context, c client.Client, live client.Reader, mem *Memory, namespace string, token int64, read *FloorRead) error {
	known := mem.Floor(namespace)
	if token <= 0 || token <= known {
		return nil
	}
	if read != nil && read.Token < known {
		// This manager raised the floor since: that read would only lose.
		read = nil
	}
	return retry.OnError(retry.DefaultRetry, lostRaise, func() error {
		floor, lease := int64(0), (*coordinationv1.Lease)(nil)
		if read != nil {
			floor, lease, read = read.Token, read.Lease, nil
		} else {
			var err error
			if floor, lease, err = ReadTokenFloor(ctx, live, namespace); err != nil {
				return err
			}
		}
		if token <= floor {
			mem.Observe(lease)
			return nil
		}
		return RaiseTokenFloor(ctx, c, mem, namespace, lease, floor, min(token+ReservedTokens-1, math.MaxInt32))
	})
}

// lostRaise reports whether a raise of the token floor lost a race with
// another writer's: the floor is read again and the raise tried again.
func lostRaise(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}

// RaiseTokenFloor makes the namespace's token floor at least token, as a
// compare-and-swap on what ReadTokenFloor returned (read, floor).
func RaiseTokenFloor(ctx context.Context, c client.Client, mem *Memory, namespace string, read *coordinationv1.Lease, floor, token int64) error {
	if token <= floor && read != nil {
		return nil
	}
	if token > math.MaxInt32 {
		return fmt.Errorf("token floor %d of namespace %q does not fit a Lease", token, namespace)
	}
	lease := &coordinationv1.Lease{}
	if read != nil {
		lease = read.DeepCopy()
	} else {
		lease.Namespace, lease.Name = namespace, TokenFloorLease
		lease.Labels = map[string]string{ManagedByLabel: ManagedByValue}
	}
	lease.Spec.LeaseTransitions = ptr.To(int32(max(floor, token)))
	if lease.Labels[ManagedByLabel] != ManagedByValue {
		// So that the cache, and the watch that restores a deleted floor,
		// see it.
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[ManagedByLabel] = ManagedByValue
	}
	if err := compareAndSwap(ctx, c, lease, read != nil); err != nil {
		return fmt.Errorf("raising the token floor of namespace %q to %d: %w", namespace, token, err)
	}
	mem.Wrote(lease)
	return nil
}

// compareAndSwap writes a Lease that was read (an update carrying the
// resourceVersion read, which fails with a Conflict if another writer came
// first) or that was not there (a create, which fails with AlreadyExists).
func compareAndSwap(ctx context.Context, c client.Client, lease *coordinationv1.Lease, read bool) error {
	if read {
		return c.Update(ctx, lease)
	}
	return c.Create(ctx, lease)
}
