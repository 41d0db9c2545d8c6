package v1alpha1

import (
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The grant record of a lock is a coordination.k8s.io/v1 Lease in the
// claims' namespace, written only by the operator, in one compare-and-swap
// per grant: it is the lock's truth, and every BuildLock status is derived
// from it. Clients may read it (the pipeline role grants get, list and watch
// on Leases) to learn of a grant one write before the holder's status says
// Held. What a reader may rely on:
//   - its name is GrantLeaseName(target);
//   - spec.holderIdentity is GrantHolderIdentity(name, uid) of the holding
//     BuildLock while the lock is held, and unset while it is free;
//   - spec.leaseTransitions is the fencing token of the latest grant, and
//     spec.acquireTime when that grant was made.
//
// Everything else on the Lease (its annotations) is the operator's own. A
// change to the Lease that the operator did not make, or its deletion, is
// undone at once from the claims' statuses (docs/api.md, "The grant
// record"); a Lease of that name that buildlock did not create is never
// taken over (reason ForeignLease).

// GrantLeaseName is the name of the grant Lease of target. Targets are
// DNS-1123 labels of at most 63 characters, so the name is always a valid
// object name.
func GrantLeaseName(target string) string {
	return "buildlock-" + target
}

// GrantHolderIdentity is the grant Lease's spec.holderIdentity while the
// BuildLock name (with uid) holds the lock: the UID tells a claim from a
// newer one of the same name.
func GrantHolderIdentity(name string, uid types.UID) string {
	return name + "/" + string(uid)
}

// ParseGrantHolder splits a grant Lease's spec.holderIdentity into the
// holding BuildLock's name and UID.
func ParseGrantHolder(identity string) (name string, uid types.UID) {
	name, u, _ := strings.Cut(identity, "/")
	return name, types.UID(u)
}

// GrantToken is the fencing token a grant Lease records (its
// spec.leaseTransitions): the token of the latest grant of the lock, 0 when
// the Lease records none. The namespace's token floor Lease records the
// highest token of the grant Leases deleted there the same way.
func GrantToken(lease *coordinationv1.Lease) int64 {
	if lease == nil || lease.Spec.LeaseTransitions == nil {
		return 0
	}
	return int64(*lease.Spec.LeaseTransitions)
}
