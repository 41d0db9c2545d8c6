package controller

import (
	"context"
	"fmt"
	"slices"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// forceReleasePolicyName names the mutating and the validating admission
// policies that stamp and guard buildlockv1.ForceReleasedByAnnotation.
const forceReleasePolicyName = "buildlock-force-release"

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;mutatingadmissionpolicies,verbs=get;list;watch

// admissionPolicies knows which admission policies the API server has, by
// name, from the cache's metadata informers of ValidatingAdmissionPolicies
// and MutatingAdmissionPolicies. A nil *admissionPolicies knows of none.
type admissionPolicies struct{ cache client.Reader }

// The kinds of admission policies.
const (
	validatingPolicyKind = "ValidatingAdmissionPolicy"
	mutatingPolicyKind   = "MutatingAdmissionPolicy"
)

// watchAdmissionPolicies registers the informers of admission policies'
// metadata with mgr's cache.
func watchAdmissionPolicies(mgr ctrl.Manager) (*admissionPolicies, error) {
	for _, kind := range []string{validatingPolicyKind, mutatingPolicyKind} {
		if _, err := mgr.GetCache().GetInformer(context.Background(), policyMetadata(kind), cache.BlockUntilSynced(false)); err != nil {
			return nil, fmt.Errorf("registering the informer of %ss: %w", kind, err)
		}
	}
	return &admissionPolicies{cache: mgr.GetCache()}, nil
}

// policyMetadata is the type under which admission policies of kind are
// watched: their names say what is installed.
func policyMetadata(kind string) *metav1.PartialObjectMetadata {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind(kind))
	return obj
}

// installed reports whether the cache holds the admission policy of that
// kind and name; when it cannot tell, it says no.
func (a *admissionPolicies) installed(kind, name string) bool {
	if a == nil {
		return false
	}
	// A read from the cache: the context only bounds a wait that an
	// informer registered before the manager started never needs.
	return a.cache.Get(context.Background(), types.NamespacedName{Name: name}, policyMetadata(kind)) == nil
}

// unverify clears claims' ForceReleasedBy unless the policies that stamp
// and guard it (buildlock-force-release) are installed: without them, the
// stamp is anybody's word.
func (a *admissionPolicies) unverify(claims []arbiter.Claim) {
	stamped := slices.ContainsFunc(claims, func(c arbiter.Claim) bool { return c.ForceReleasedBy != "" })
	if !stamped || a.installed(mutatingPolicyKind, forceReleasePolicyName) && a.installed(validatingPolicyKind, forceReleasePolicyName) {
		return
	}
	for i := range claims {
		claims[i].ForceReleasedBy = ""
	}
}
