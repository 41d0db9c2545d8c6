// Package admission tells which of buildlock's admission policies
// (config/identity and config/enforcement) the API server has, and since
// when, from the manager's caches of their metadata: the lock reconciler
// takes a claim's spec.requester and a force-release's or an override's
// stamp as the API server's word only while the policies that stamp them
// are installed, and the policy controller says nothing is enforced while
// buildlock-enforce is missing. It also reports, in the manager's log and
// metrics, which identity policies are missing (report.go).
package admission

import (
	"context"
	"fmt"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// Admission policies (config/identity) that the operator relies on when
// they are installed.
const (
	// forceReleasePolicyName names the mutating and the validating
	// admission policies that stamp and guard
	// buildlockv1.ForceReleasedByAnnotation.
	forceReleasePolicyName = "buildlock-force-release"
	// requesterPolicyName names the MutatingAdmissionPolicy that stamps
	// every new BuildLock's spec.requester with the identity that creates
	// it, and its binding (config/identity/requester.yaml).
	requesterPolicyName = "buildlock-requester"
	// overridePolicyName names the mutating and the validating admission
	// policies that stamp and guard buildlockv1.OverriddenByAnnotation.
	overridePolicyName = "buildlock-override"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;mutatingadmissionpolicies;mutatingadmissionpolicybindings,verbs=get;list;watch

// The kinds of admission objects whose presence the operator watches.
const (
	// ValidatingPolicy is the kind of ValidatingAdmissionPolicies.
	ValidatingPolicy      = "ValidatingAdmissionPolicy"
	validatingBindingKind = "ValidatingAdmissionPolicyBinding"
	mutatingPolicyKind    = "MutatingAdmissionPolicy"
	mutatingBindingKind   = "MutatingAdmissionPolicyBinding"
)

// policyLabel is on every object of config/identity, config/enforcement
// and config/lease-informer, whoever installs them (Helm and kustomize keep
// it): the cache of validating bindings holds only those, and the
// operator's own bindings of buildlock-enforce, which the manager's main
// cache holds, carry other labels.
var policyLabel = labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "buildlock"})

// Policies knows which admission policies the API server has, by name and
// creation time, from the cache's metadata informers of
// ValidatingAdmissionPolicies, MutatingAdmissionPolicies and their bindings.
// A nil *Policies knows of none.
type Policies struct {
	cache client.Reader
	// bindings reads bindingsCache: the metadata of the validating
	// bindings of config/ (policyLabel).
	bindings      client.Reader
	bindingsCache cache.Cache
	// mutating says the cluster serves MutatingAdmissionPolicies; where it
	// does not, nothing they would stamp is ever verified.
	mutating bool
}

// Watch registers the informers of admission policies' metadata with mgr's
// cache (the mutating ones only where the cluster serves them), adds a
// cache of the validating bindings of config/ to mgr, and returns what they
// tell.
func Watch(mgr ctrl.Manager) (*Policies, error) {
	a := &Policies{cache: mgr.GetCache()}
	kinds := []string{ValidatingPolicy}
	if _, err := mgr.GetRESTMapper().RESTMapping(admissionv1.SchemeGroupVersion.WithKind(mutatingPolicyKind).GroupKind(),
		admissionv1.SchemeGroupVersion.Version); err == nil {
		a.mutating = true
		kinds = append(kinds, mutatingPolicyKind, mutatingBindingKind)
	}
	for _, kind := range kinds {
		if _, err := mgr.GetCache().GetInformer(context.Background(), admissionMetadata(kind), cache.BlockUntilSynced(false)); err != nil {
			return nil, fmt.Errorf("registering the informer of %ss: %w", kind, err)
		}
	}
	bindings, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{admissionMetadata(validatingBindingKind): {Label: policyLabel}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of validating admission policy bindings: %w", err)
	}
	if _, err := bindings.GetInformer(context.Background(), admissionMetadata(validatingBindingKind), cache.BlockUntilSynced(false)); err != nil {
		return nil, fmt.Errorf("registering the informer of %ss: %w", validatingBindingKind, err)
	}
	// As a runnable with a cache, it starts, and syncs, with the manager's
	// own cache: before any controller reads it.
	if err := mgr.Add(cacheRunnable{bindings}); err != nil {
		return nil, fmt.Errorf("adding the cache of validating admission policy bindings: %w", err)
	}
	a.bindings, a.bindingsCache = bindings, bindings
	return a, nil
}

// cacheRunnable is a cache the manager starts and waits for with its own.
type cacheRunnable struct{ cache.Cache }

// GetCache makes the manager start the cache among its caches.
func (c cacheRunnable) GetCache() cache.Cache { return c.Cache }

// admissionMetadata is the type under which admission objects of kind are
// watched: their names and creation times say what is installed, and since
// when.
func admissionMetadata(kind string) *metav1.PartialObjectMetadata {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind(kind))
	return obj
}

// created returns when the admission object of that kind and name was
// created, and whether the cache holds it; when it cannot tell, it says it
// is not there. A read from the cache: an object deleted a moment ago may
// still count, for the informer's lag.
func (a *Policies) created(kind, name string) (time.Time, bool) {
	if a == nil || (kind != ValidatingPolicy && kind != validatingBindingKind && !a.mutating) {
		return time.Time{}, false
	}
	reader := a.cache
	if kind == validatingBindingKind {
		if a.bindings == nil {
			return time.Time{}, false
		}
		reader = a.bindings
	}
	obj := admissionMetadata(kind)
	// The context only bounds a wait that an informer registered before
	// the manager started never needs.
	if err := reader.Get(context.Background(), types.NamespacedName{Name: name}, obj); err != nil {
		return time.Time{}, false
	}
	return obj.CreationTimestamp.Time, true
}

// Installed reports whether the cache holds the admission object of that
// kind and name.
func (a *Policies) Installed(kind, name string) bool {
	_, ok := a.created(kind, name)
	return ok
}

// RequestersVerifiedSince returns the instant after which a claim's
// spec.requester is the API server's word: settle after the later of the
// creation of the buildlock-requester MutatingAdmissionPolicy and of its
// binding, while both exist. Zero when either is missing, or the cluster
// has no MutatingAdmissionPolicies: spec.requester is then a client's word,
// and claims have no Identity (arbiter.Claim).
func (a *Policies) RequestersVerifiedSince(settle time.Duration) time.Time {
	policy, ok := a.created(mutatingPolicyKind, requesterPolicyName)
	if !ok {
		return time.Time{}
	}
	binding, ok := a.created(mutatingBindingKind, requesterPolicyName)
	if !ok {
		return time.Time{}
	}
	if binding.After(policy) {
		policy = binding
	}
	return policy.Add(settle)
}

// Unverify clears claims' ForceReleasedBy and Override.By unless the
// policies that stamp and guard them (buildlock-force-release,
// buildlock-override) are installed, with their bindings: without them, a
// stamp is anybody's word.
func (a *Policies) Unverify(claims []arbiter.Claim) {
	if slices.ContainsFunc(claims, func(c arbiter.Claim) bool { return c.ForceReleasedBy != "" }) && !a.guarded(forceReleasePolicyName) {
		for i := range claims {
			claims[i].ForceReleasedBy = ""
		}
	}
	if slices.ContainsFunc(claims, func(c arbiter.Claim) bool { return c.Override.By != "" }) && !a.guarded(overridePolicyName) {
		for i := range claims {
			claims[i].Override.By = ""
		}
	}
}

// guarded reports whether the mutating and the validating admission policy
// named name are both installed, each with its binding.
func (a *Policies) guarded(name string) bool {
	return a.Installed(mutatingPolicyKind, name) && a.Installed(mutatingBindingKind, name) &&
		a.Installed(ValidatingPolicy, name) && a.Installed(validatingBindingKind, name)
}

// Sources are the event sources of every admission object Policies reads,
// for a controller whose work depends on them: h maps each event (an
// object's metadata) to requests.
func (a *Policies) Sources(mgr ctrl.Manager, h handler.EventHandler) []source.Source {
	if a == nil {
		return nil
	}
	kinds := []string{ValidatingPolicy}
	if a.mutating {
		kinds = append(kinds, mutatingPolicyKind, mutatingBindingKind)
	}
	var sources []source.Source
	for _, kind := range kinds {
		sources = append(sources, source.Kind(mgr.GetCache(), client.Object(admissionMetadata(kind)), h))
	}
	if a.bindingsCache != nil {
		sources = append(sources, source.Kind(a.bindingsCache, client.Object(admissionMetadata(validatingBindingKind)), h))
	}
	return sources
}
