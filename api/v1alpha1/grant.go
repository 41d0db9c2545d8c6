package v1alpha1

import (
	"strings"
	"time"

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

// The label that marks the operator's Leases (the grant Leases and the
// token floor) and the name of the namespace's token floor. The default
// install's admission policy buildlock-grant-leases lets only the operator
// write a Lease that carries this label, or give or take it: a Lease with
// it was written by the operator (or a cluster's break-glass credentials).
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "buildlock"
	// TokenFloorLeaseName names the Lease, one per namespace, whose
	// spec.leaseTransitions is at least every fencing token issued in the
	// namespace. A grant Lease created later starts above it. No target's
	// grant Lease can have this name (it has a dot).
	TokenFloorLeaseName = "buildlock.token-floor"
)

// OperatorLease reports whether lease carries the label of the operator's
// Leases (ManagedByLabel). What that proves depends on the install: with
// the admission policy buildlock-grant-leases, that the operator wrote
// it; without, nothing.
func OperatorLease(lease *coordinationv1.Lease) bool {
	return lease != nil && lease.Labels[ManagedByLabel] == ManagedByValue
}

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

// +kubebuilder:object:generate=false

// AuditEntry is one entry of a grant Lease's AuditAnnotation: a notable
// event of the lock, kept after its claim is gone.
type AuditEntry struct {
	// Kind is AuditForceRelease, AuditRollback or AuditOverride.
	Kind string `json:"kind"`
	// At is when the operator recorded it.
	At time.Time `json:"at"`
	// Name is the BuildLock concerned; Repo, Branch, Workflow and Build its
	// build; Token the fencing token of its hold.
	Name     string `json:"name"`
	Repo     string `json:"repo"`
	Branch   string `json:"branch"`
	Workflow string `json:"workflow,omitempty"`
	Build    int64  `json:"build"`
	Token    int64  `json:"token,omitempty"`
	// By is who did it, as the API server verified them (a force-release's
	// buildlock.io/force-released-by, a claim's spec.requester); empty when
	// nothing verified it.
	By string `json:"by,omitempty"`
	// Reason is why: the force-release annotation's "who: why", or the
	// rollback's spec.rollback.reason (cut to MaxQuotedLength characters);
	// for an override, the rule a person's claim was exempt from
	// (LineOwnedByOther or BuildJumpTooLarge).
	Reason string `json:"reason,omitempty"`
	// From is, for a rollback, the build of its line it rolled back from;
	// for an override, the build of its line the memory had.
	From int64 `json:"from,omitempty"`
	// Owner is, for an override of LineOwnedByOther, the service account
	// that owned the line.
	Owner string `json:"owner,omitempty"`
}

// The kinds of AuditEntry.
const (
	// AuditForceRelease: a person ended a hold (ReasonForceReleased).
	AuditForceRelease = "ForceRelease"
	// AuditRollback: a rollback (spec.rollback) was granted the lock.
	AuditRollback = "Rollback"
	// AuditOverride: a person's claim was granted the lock where a
	// pipeline's would have been refused (the line belonged to another
	// service account, or its build jumped too far).
	AuditOverride = "Override"
)

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
