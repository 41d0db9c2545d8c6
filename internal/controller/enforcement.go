package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Enforcement is carried by the grant Lease itself (the parameter of the
// buildlock-enforce ValidatingAdmissionPolicy), so that admission can never
// be ahead of the grant, and by one ValidatingAdmissionPolicyBinding per
// enforced lock that points the policy at that Lease for the target
// namespace, when that namespace consents.
const (
	// enforcePolicyName is the ValidatingAdmissionPolicy the chart installs
	// (config/enforcement/enforce.yaml).
	enforcePolicyName = "buildlock-enforce"
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
	writerRunAnnotation  = "buildlock.io/writer-run"
	// claimsNamespaceLabel on a binding names the lock's namespace.
	claimsNamespaceLabel = "buildlock.io/claims-namespace"
	// namespaceNameLabel is the label Kubernetes sets on every namespace.
	namespaceNameLabel = "kubernetes.io/metadata.name"
)

// enforcement is what a lock's policy asks of the API server: nil when it
// enforces nothing.
type enforcement struct {
	// serviceAccounts is serviceAccountsAnnotation's value.
	serviceAccounts string
	// repositories is repositoriesAnnotation's value.
	repositories string
}

// enforcementOf returns the policy's enforcement, or nil.
func enforcementOf(p *buildlockv1.BuildLockPolicy) *enforcement {
	if p == nil || p.Spec.Enforce == nil {
		return nil
	}
	return &enforcement{serviceAccounts: setOrAll(p.Spec.Enforce.ServiceAccounts), repositories: setOrAll(p.Spec.Enforce.Repositories)}
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

// writerOf is who may write into an enforced target while claim bl holds
// it: its pod, when it has one (by UID: an enforced target requires
// podRef.uid); else its requester's pod, when the requester's token was
// bound to one; else its requester (and its CI run, if its token named
// one).
func writerOf(bl *buildlockv1.BuildLock) arbiter.Writer {
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
func setEnforcement(lease *coordinationv1.Lease, e *enforcement) {
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
	lease.Annotations[repositoriesAnnotation] = e.repositories
	lease.Labels[enforcedLabel] = "true"
}

// enforcementCurrent reports whether the Lease carries exactly e.
func enforcementCurrent(lease *coordinationv1.Lease, e *enforcement) bool {
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

// bindingName is the name of the lock's ValidatingAdmissionPolicyBinding:
// cluster-scoped, so it names both the claims namespace and the target.
func bindingName(lock arbiter.Lock) string {
	return "buildlock-enforce." + lock.Namespace + "." + lock.Target
}

// desiredBinding is the binding that applies buildlock-enforce, with the
// lock's Lease as its parameter, to writes into the target namespace when it
// consents (buildlock.io/locked-by=<claims namespace>): without the label
// the binding matches nothing, and two claims namespaces can never both
// fence one target. While the Lease is missing (deleted by hand; the lock
// reconciler recreates it), the binding refuses every write it matches,
// whoever sends it: the fence fails closed, and the consent label stays the
// break-glass (an update that removes it is not matched).
func desiredBinding(lock arbiter.Lock) *admissionv1.ValidatingAdmissionPolicyBinding {
	return &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name: bindingName(lock),
			Labels: map[string]string{
				managedByLabel:       managedByValue,
				claimsNamespaceLabel: lock.Namespace,
				targetLabel:          lock.Target,
			},
		},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: enforcePolicyName,
			ParamRef: &admissionv1.ParamRef{
				Name:                    buildlockv1.GrantLeaseName(lock.Target),
				Namespace:               lock.Namespace,
				ParameterNotFoundAction: ptr.To(admissionv1.DenyAction),
			},
			// With the API server's defaults spelled out, so that a binding
			// read back compares equal and is not written again.
			MatchResources: &admissionv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
					namespaceNameLabel:        lock.Target,
					buildlockv1.LockedByLabel: lock.Namespace,
				}},
				ObjectSelector: &metav1.LabelSelector{},
				MatchPolicy:    ptr.To(admissionv1.Equivalent),
			},
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
}

// syncBinding creates, updates or deletes the lock's binding so that it
// exists exactly while e is set. It reads the binding from the cache.
func (r *LockReconciler) syncBinding(ctx context.Context, lock arbiter.Lock, e *enforcement) error {
	var current admissionv1.ValidatingAdmissionPolicyBinding
	err := r.Client.Get(ctx, types.NamespacedName{Name: bindingName(lock)}, &current)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading ValidatingAdmissionPolicyBinding %s: %w", bindingName(lock), err)
	}
	err = nil
	want := desiredBinding(lock)
	switch {
	case e == nil && exists:
		err = r.Client.Delete(ctx, &current, client.Preconditions{UID: &current.UID, ResourceVersion: &current.ResourceVersion})
		if apierrors.IsNotFound(err) {
			err = nil
		}
	case e == nil:
	case !exists:
		err = r.Client.Create(ctx, want)
	case !equality.Semantic.DeepEqual(current.Spec, want.Spec) || !equality.Semantic.DeepEqual(current.Labels, want.Labels):
		updated := current.DeepCopy()
		updated.Spec, updated.Labels = want.Spec, want.Labels
		err = r.Client.Update(ctx, updated)
	}
	if err != nil {
		return fmt.Errorf("writing ValidatingAdmissionPolicyBinding %s: %w", bindingName(lock), err)
	}
	return nil
}

// consentCondition is the Enforced condition as far as the target namespace
// decides it: False with the reason when the namespace does not exist or
// does not consent to this lock, nil when it consents (then only a probe
// can say whether the fence is in effect). labels are the namespace's, nil
// when it does not exist. It has no receiver, to facilitate testing.
func consentCondition(lock arbiter.Lock, labels map[string]string, exists bool, generation int64) *metav1.Condition {
	c := &metav1.Condition{Type: buildlockv1.ConditionEnforced, Status: metav1.ConditionFalse, ObservedGeneration: generation}
	switch owner, labeled := labels[buildlockv1.LockedByLabel]; {
	case !exists:
		c.Reason = buildlockv1.ReasonConsentMissing
		c.Message = fmt.Sprintf("Namespace %s does not exist; once it does, label it %s=%s to consent, and pipeline writes into it will be fenced.",
			lock.Target, buildlockv1.LockedByLabel, lock.Namespace)
	case !labeled:
		c.Reason = buildlockv1.ReasonConsentMissing
		c.Message = fmt.Sprintf("The policy asks for enforcement, but namespace %s does not consent: label it %s=%s. Nothing is enforced.",
			lock.Target, buildlockv1.LockedByLabel, lock.Namespace)
	case owner != lock.Namespace:
		c.Reason = buildlockv1.ReasonConflict
		c.Message = fmt.Sprintf("Namespace %s consents to the lock of namespace %s (label %s=%s), not this one: this policy enforces nothing.",
			lock.Target, owner, buildlockv1.LockedByLabel, owner)
	default:
		return nil
	}
	return c
}

// syncEnforcement keeps the lock's binding in line with its policy. The
// policy's Enforced condition is the fence prober's (fence.go).
func (r *LockReconciler) syncEnforcement(ctx context.Context, lock arbiter.Lock, p *lockPolicy) error {
	return r.syncBinding(ctx, lock, p.enforce)
}
