package grant

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Enforcement is carried by the grant Lease itself, the parameter of the
// buildlock-enforce ValidatingAdmissionPolicy (config/enforcement), in the
// grant's own compare-and-swap, so that admission can never be ahead of the
// grant.
const (
	// enforcedLabel on a grant Lease marks an enforced lock, for the
	// buildlock-claims policy, which lets pipelines touch only their own
	// claims in a namespace with an enforced lock.
	enforcedLabel = "buildlock.io/enforced"
	// serviceAccountsAnnotation on an enforced grant Lease lists the
	// claims namespace's pipeline service accounts ("*": all of them).
	serviceAccountsAnnotation = "buildlock.io/enforced-service-accounts"
	// repositoriesAnnotation on an enforced grant Lease lists the
	// repositories whose CI identities are pipelines ("*": every one; so
	// does its absence, on a Lease an older operator wrote).
	repositoriesAnnotation = "buildlock.io/enforced-repositories"
	// writerPodAnnotation and writerUserAnnotation record the holder's
	// Writer (arbiter.Grant.Writer) in the grant's compare-and-swap.
	writerPodAnnotation  = "buildlock.io/writer-pod-uid"
	writerUserAnnotation = "buildlock.io/writer-username"
	// frozenAnnotation on an enforced grant Lease says, while the target is
	// frozen, until when and why ("until 2026-12-28T08:00:00+01:00 (holiday
	// freeze)"), for buildlock-enforce's refusal message. It changes at the
	// windows' edges only, so it costs a Lease write there and never one on
	// a hand-off's path.
	writerRunAnnotation = "buildlock.io/writer-run"
	// frozenAnnotation on an enforced grant Lease says, while the target is
	// frozen, until when and why ("until 2026-12-28T08:00:00+01:00 (holiday
	// freeze)"), for buildlock-enforce's refusal message. It changes at the
	// windows' edges only, so it costs a Lease write there and never one on
	// a hand-off's path.
	frozenAnnotation = "buildlock.io/frozen"
)

// Enforcement is what a lock's policy asks of the API server: nil when it
// enforces nothing.
type Enforcement struct {
	// serviceAccounts is serviceAccountsAnnotation's value.
	serviceAccounts string
	// repositories is repositoriesAnnotation's value.
	repositories string
	// frozen is frozenAnnotation's value; empty while the target is open.
	frozen string
}

// WithFreeze is e, for a target frozen as described ("until … (why)"; empty:
// open). It leaves e itself as it is.
func (e *Enforcement) WithFreeze(description string) *Enforcement {
	if e == nil {
		return nil
	}
	out := *e
	out.frozen = description
	return &out
}

// EnforcementOf returns the policy's enforcement (nil: no policy, or one
// that enforces nothing).
func EnforcementOf(p *buildlockv1.BuildLockPolicy) *Enforcement {
	if p == nil || p.Spec.Enforce == nil {
		return nil
	}
	return &Enforcement{serviceAccounts: setOrAll(p.Spec.Enforce.ServiceAccounts), repositories: setOrAll(p.Spec.Enforce.Repositories)}
}

// setOrAll is names sorted and joined by commas, or "*" (all) when there
// are none.
func setOrAll(names []string) string {
	if len(names) == 0 {
		return "*"
	}
	names = slices.Clone(names)
	slices.Sort(names)
	return strings.Join(slices.Compact(names), ",")
}

// WriterOf is who may write into an enforced target while claim bl holds
// it: its pod, when it has one (by UID: an enforced target requires
// podRef.uid); else its requester's pod, when the requester's token was
// bound to one; else its requester (and its CI run, if its token named
// one).
func WriterOf(bl *buildlockv1.BuildLock) arbiter.Writer {
	switch r := bl.Spec.Requester; {
	case bl.Spec.PodRef != nil:
		return arbiter.Writer{PodUID: bl.Spec.PodRef.UID}
	case r == nil:
		return arbiter.Writer{}
	case r.PodUID != "":
		return arbiter.Writer{PodUID: r.PodUID}
	default:
		return arbiter.Writer{Username: r.Username, Run: r.Run}
	}
}

// setEnforcement writes the lock's enforcement onto the Lease: the
// pipelines' annotations and the enforced label, or none of them.
func setEnforcement(lease *coordinationv1.Lease, e *Enforcement) {
	delete(lease.Annotations, frozenAnnotation)
	if e == nil {
		delete(lease.Annotations, serviceAccountsAnnotation)
		delete(lease.Annotations, repositoriesAnnotation)
		delete(lease.Labels, enforcedLabel)
		return
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[serviceAccountsAnnotation] = e.serviceAccounts
	if e.frozen != "" {
		lease.Annotations[frozenAnnotation] = e.frozen
	}
	lease.Annotations[repositoriesAnnotation] = e.repositories
	lease.Labels[enforcedLabel] = "true"
}

// EnforcementCurrent reports whether the Lease (nil: none) carries exactly
// e's fence (not its freeze, which the lock reconciler keeps).
func EnforcementCurrent(lease *coordinationv1.Lease, e *Enforcement) bool {
	if lease == nil {
		return e == nil
	}
	accounts, annotated := lease.Annotations[serviceAccountsAnnotation]
	repositories, listed := lease.Annotations[repositoriesAnnotation]
	_, labeled := lease.Labels[enforcedLabel]
	if e == nil {
		return !annotated && !listed && !labeled
	}
	return labeled && accounts == e.serviceAccounts && listed && repositories == e.repositories
}

// Enforced reports whether the Lease carries an enforcement (its enforced
// label).
func Enforced(lease *coordinationv1.Lease) bool {
	_, labeled := lease.GetLabels()[enforcedLabel]
	return labeled
}

// Fence is what of a grant Lease the buildlock-enforce policy enforces, as
// its refusal of the fence probe spells it out, field by field.
type Fence struct {
	Token, Holder, WriterPod, Accounts, Repositories, WriterRun, WriterUser string
}

// FenceOf is the fence that lease asks admission for.
func FenceOf(lease *coordinationv1.Lease) Fence {
	return Fence{
		Token:     strconv.FormatInt(buildlockv1.GrantToken(lease), 10),
		Holder:    ptr.Deref(lease.Spec.HolderIdentity, ""),
		WriterPod: lease.Annotations[writerPodAnnotation],
		Accounts:  lease.Annotations[serviceAccountsAnnotation],
		// As buildlock-enforce reads it: absent is every repository.
		Repositories: cmp.Or(lease.Annotations[repositoriesAnnotation], "*"),
		WriterRun:    lease.Annotations[writerRunAnnotation],
		WriterUser:   lease.Annotations[writerUserAnnotation],
	}
}
