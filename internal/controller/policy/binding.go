package policy

import (
	"context"
	"fmt"

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
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// An enforced lock has one ValidatingAdmissionPolicyBinding that points the
// buildlock-enforce policy at the lock's grant Lease (which carries the
// enforcement: see grant.Enforcement) for the target namespace, when that
// namespace consents.
const (
	// enforcePolicyName is the ValidatingAdmissionPolicy the chart installs
	// (config/enforcement/enforce.yaml).
	enforcePolicyName = "buildlock-enforce"
	// claimsNamespaceLabel on a binding names the lock's namespace.
	claimsNamespaceLabel = "buildlock.io/claims-namespace"
	// namespaceNameLabel is the label Kubernetes sets on every namespace.
	namespaceNameLabel = "kubernetes.io/metadata.name"
)

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
				grant.ManagedByLabel: grant.ManagedByValue,
				claimsNamespaceLabel: lock.Namespace,
				grant.TargetLabel:    lock.Target,
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

// syncBinding creates, updates or deletes the lock's binding, read from the
// cache through c, so that it exists exactly while e is set. It creates it only once
// the grant Lease carries e (the lock reconciler writes it): a binding
// without its Lease refuses every write into the target, and the lock
// reconciler creates the Lease of an enforced lock at once.
func syncBinding(ctx context.Context, c client.Client, lock arbiter.Lock, lease *coordinationv1.Lease, e *grant.Enforcement) error {
	var current admissionv1.ValidatingAdmissionPolicyBinding
	err := c.Get(ctx, types.NamespacedName{Name: bindingName(lock)}, &current)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading ValidatingAdmissionPolicyBinding %s: %w", bindingName(lock), err)
	}
	err = nil
	want := desiredBinding(lock)
	switch {
	case e == nil && exists:
		err = c.Delete(ctx, &current, client.Preconditions{UID: &current.UID, ResourceVersion: &current.ResourceVersion})
		if apierrors.IsNotFound(err) {
			err = nil
		}
	case e == nil:
	case !exists && (lease == nil || !grant.EnforcementCurrent(lease, e)):
		// The Lease's write brings the lock back here.
	case !exists:
		err = c.Create(ctx, want)
	case !equality.Semantic.DeepEqual(current.Spec, want.Spec) || !equality.Semantic.DeepEqual(current.Labels, want.Labels):
		updated := current.DeepCopy()
		updated.Spec, updated.Labels = want.Spec, want.Labels
		err = c.Update(ctx, updated)
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
