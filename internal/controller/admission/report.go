package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// identityPolicies are the admission policies of config/identity, which
// every installation has, in name order: each is installed when the API server has it
// (the mutating policy, the validating one, or both, of that name) and its
// binding.
var identityPolicies = []struct {
	name                 string
	mutating, validating bool
}{
	{name: "buildlock-claim-identity", validating: true},
	{name: "buildlock-consent", validating: true},
	{name: forceReleasePolicyName, mutating: true, validating: true},
	{name: "buildlock-freezes", validating: true},
	{name: "buildlock-grant-leases", validating: true},
	{name: overridePolicyName, mutating: true, validating: true},
	{name: requesterPolicyName, mutating: true},
}

// IdentityPolicies returns the names of the identity admission policies
// (config/identity), in name order.
func IdentityPolicies() []string {
	names := make([]string, 0, len(identityPolicies))
	for _, p := range identityPolicies {
		names = append(names, p.name)
	}
	return names
}

// identityPolicyInstalled reports whether the identity policy p is in
// place: its policies and their bindings.
func (a *Policies) identityPolicyInstalled(name string, mutating, validating bool) bool {
	return (!mutating || a.Installed(mutatingPolicyKind, name) && a.Installed(mutatingBindingKind, name)) &&
		(!validating || a.Installed(ValidatingPolicy, name) && a.Installed(validatingBindingKind, name))
}

// MissingIdentity returns the names of the identity admission policies
// (config/identity) that the API server lacks, a policy or its binding, in
// name order; none when it has them all. While any is missing, some of
// what a client writes is nobody's word but the client's, and every
// feature that needs a verified identity fails closed.
func (a *Policies) MissingIdentity() []string {
	var missing []string
	for _, p := range identityPolicies {
		if !a.identityPolicyInstalled(p.name, p.mutating, p.validating) {
			missing = append(missing, p.name)
		}
	}
	return missing
}

// ServesMutating reports whether the cluster serves
// MutatingAdmissionPolicies (admissionregistration.k8s.io/v1): without
// them no stamp is ever verified.
func (a *Policies) ServesMutating() bool { return a != nil && a.mutating }

// IdentityMessage says, in a sentence or two for a condition or a log,
// which identity policies are missing and what fails closed for it; "" when
// none is.
func (a *Policies) IdentityMessage() string {
	missing := a.MissingIdentity()
	if len(missing) == 0 {
		return ""
	}
	why := "install them: the chart's identity.enabled (the default), or config/identity"
	if !a.ServesMutating() {
		why = "the API server serves no MutatingAdmissionPolicies (admissionregistration.k8s.io/v1, Kubernetes 1.36 or newer), " +
			"so nothing can stamp who made a claim, a force-release or an override"
	}
	return fmt.Sprintf("The API server lacks buildlock's identity admission policies %s (%s). Until it has them, "+
		"what clients write about who they are is nobody's word but theirs, and every feature that needs a verified "+
		"identity fails closed: no freeze overrides, no rollbacks under PeopleOnly, no line of its own for any identity.",
		strings.Join(missing, ", "), why)
}

var identityPolicyInstalledDesc = prometheus.NewDesc("buildlock_identity_policy_installed",
	"1 while the API server has the identity admission policy (config/identity) and its binding, 0 while it lacks either: "+
		"then every feature that needs a verified identity fails closed.",
	[]string{"policy"}, nil)

// identityCollector exports buildlock_identity_policy_installed, read from
// the caches at each scrape.
type identityCollector struct{ a *Policies }

// Describe sends the gauge's description.
func (c identityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- identityPolicyInstalledDesc }

// Collect sends one sample per identity policy.
func (c identityCollector) Collect(ch chan<- prometheus.Metric) {
	missing := c.a.MissingIdentity()
	for _, p := range identityPolicies {
		v := 1.0
		if slices.Contains(missing, p.name) {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(identityPolicyInstalledDesc, prometheus.GaugeValue, v, p.name)
	}
}

// Report registers buildlock_identity_policy_installed with reg, and adds
// to mgr a runnable that logs, at start and whenever it changes, which
// identity policies the API server lacks. Every replica reports: each
// verifies, or not, by what its own caches say.
func (a *Policies) Report(mgr ctrl.Manager, reg prometheus.Registerer) error {
	if err := reg.Register(identityCollector{a}); err != nil {
		return fmt.Errorf("registering the identity policies' metric: %w", err)
	}
	r := &reporter{a: a, log: mgr.GetLogger().WithName("admission"), changed: make(chan struct{}, 1)}
	notify := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.notify() },
		UpdateFunc: func(any, any) { r.notify() },
		DeleteFunc: func(any) { r.notify() },
	}
	kinds := []string{ValidatingPolicy}
	if a.mutating {
		kinds = append(kinds, mutatingPolicyKind, mutatingBindingKind)
	}
	for _, kind := range kinds {
		if err := r.watch(mgr.GetCache(), kind, notify); err != nil {
			return err
		}
	}
	if a.bindingsCache != nil {
		if err := r.watch(a.bindingsCache, validatingBindingKind, notify); err != nil {
			return err
		}
	}
	return mgr.Add(r)
}

// reporter logs which identity policies the API server lacks.
type reporter struct {
	a       *Policies
	log     logr.Logger
	changed chan struct{}
}

// watch notifies the reporter of every change of an admission object of
// kind in c.
func (r *reporter) watch(c cache.Cache, kind string, h toolscache.ResourceEventHandler) error {
	informer, err := c.GetInformer(context.Background(), admissionMetadata(kind), cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("watching %ss: %w", kind, err)
	}
	if _, err := informer.AddEventHandler(h); err != nil {
		return fmt.Errorf("watching %ss: %w", kind, err)
	}
	return nil
}

// notify wakes the reporter up, without waiting.
func (r *reporter) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is false: every replica reports what it verifies.
func (r *reporter) NeedLeaderElection() bool { return false }

// Start logs what is missing once the caches have synced (the manager
// starts it after them), and again whenever that changes, until ctx ends.
func (r *reporter) Start(ctx context.Context) error {
	var last []string
	first := true
	for {
		if missing := r.a.MissingIdentity(); first || !slices.Equal(missing, last) {
			if len(missing) > 0 {
				r.log.Info("Identity admission policies missing: every feature that needs a verified identity fails closed",
					"missing", missing, "servesMutatingAdmissionPolicies", r.a.mutating, "why", r.a.IdentityMessage())
			} else if !first {
				r.log.Info("Identity admission policies installed: the API server verifies who claims")
			}
			last, first = missing, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.changed:
		}
	}
}
