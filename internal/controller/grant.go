package controller

import (
	"context"
	"fmt"
	"math"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// Labels on the grant Leases, so that people and the cache can find them.
const (
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "buildlock"
	targetLabel    = "buildlock.io/target"
)

// leaseName is the name of the grant Lease of a target. Targets are DNS-1123
// labels (at most 63 characters), so the name is always a valid object name.
func leaseName(target string) string {
	return "buildlock-" + target
}

// writeGrant records grant in the lock's Lease as a compare-and-swap: an
// update carries the resourceVersion the decision was computed from, and a
// create fails if another writer created the Lease first. Either way a
// concurrent writer makes this call fail with a Conflict or AlreadyExists
// error, and the caller decides again. The Lease is never deleted, so the
// fencing token (leaseTransitions) never goes back.
func writeGrant(ctx context.Context, c client.Client, lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if read != nil {
		lease = read.DeepCopy()
	} else {
		lease.Namespace = lock.Namespace
		lease.Name = leaseName(lock.Target)
	}
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[managedByLabel] = managedByValue
	lease.Labels[targetLabel] = lock.Target

	if grant.Token > math.MaxInt32 {
		return nil, fmt.Errorf("fencing token %d of target %q does not fit the Lease's leaseTransitions", grant.Token, lock.Target)
	}
	lease.Spec.LeaseTransitions = ptr.To(int32(grant.Token))
	lease.Spec.HolderIdentity = nil
	lease.Spec.AcquireTime = nil
	lease.Spec.RenewTime = nil
	if grant.Holder != "" {
		lease.Spec.HolderIdentity = ptr.To(holderIdentity(grant.Holder, grant.HolderUID))
		lease.Spec.AcquireTime = &metav1.MicroTime{Time: grant.AcquiredAt}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: grant.AcquiredAt}
	}

	var err error
	if read == nil {
		err = c.Create(ctx, lease)
	} else {
		err = c.Update(ctx, lease)
	}
	if err != nil {
		return nil, fmt.Errorf("writing grant Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	return lease, nil
}
