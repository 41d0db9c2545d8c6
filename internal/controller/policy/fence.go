package policy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// The policy controller proves each enforced lock's fence, beside the lock
// reconciler and never on a hand-off's path: after every change of the
// lock's grant Lease, binding, policy or consent, and every
// fenceProbeInterval, it sends a server-side dry-run create of a Lease into
// the target namespace as buildlockv1.EnforcementProbeUser. buildlock-enforce
// judges that user as a pipeline that never holds, and its refusal spells
// out the grant admission enforces (probeMessagePrefix). The policy's
// Enforced condition says Enforcing only once a probe was refused with the
// lock's current grant; a probe that is admitted says the fence is not in
// effect yet, and one refused with an older grant for longer than
// fenceStaleAfter says the fence is frozen.
const (
	// fenceProbeInterval is how often a fence is probed when nothing about
	// its lock changes.
	fenceProbeInterval = time.Minute
	// fenceStaleAfter is how long admission may enforce an older grant than
	// the lock's before the fence counts as frozen: the API server's
	// informer normally catches up within milliseconds.
	fenceStaleAfter = 5 * time.Second
	// fenceRetryFirst is the first delay of the quick retries of a probe that
	// was admitted or saw an older grant; each retry doubles it, up to
	// fenceStaleAfter.
	fenceRetryFirst = 100 * time.Millisecond
	// probeLeasePrefix is the generateName of the probe's (dry-run) Lease.
	probeLeasePrefix = "buildlock-probe-"
	// probeMessagePrefix starts buildlock-enforce's refusal of the probe:
	// "buildlock-probe;token=…;holder=…;writer-pod=…;accounts=…;writer-user=…".
	probeMessagePrefix = "buildlock-probe;"
	// paramMissingMessage is the API server's refusal by a binding with
	// parameterNotFoundAction Deny whose parameter it cannot find.
	paramMissingMessage = "no params found for policy binding"
)

// +kubebuilder:rbac:groups="",resources=users,verbs=impersonate,resourceNames=buildlock:enforcement-probe

// fenceState is what the controller remembers of one enforced lock between
// probes.
type fenceState struct {
	// staleSince is when a probe first saw admission enforce another grant
	// than the lock's; zero while they agree.
	staleSince time.Time
	// retries counts the quick retries since the last settled probe.
	retries int
}

// prober probes enforced locks' fences and works out their Enforced
// condition (fence), remembering each lock's quick retries and staleness
// between probes.
type prober struct {
	// client reads from the cache.
	client client.Client
	// apiReader reads live: the grant Lease, before a fence is called
	// frozen.
	apiReader client.Reader
	// probe impersonates buildlockv1.EnforcementProbeUser; it only sends
	// dry-run creates.
	probe     client.Client
	clock     clock.PassiveClock
	admission *admission.Policies
	metrics   *fenceMetrics

	mu    sync.Mutex
	locks map[arbiter.Lock]*fenceState
}

// probeResult is what one probe write learned.
type probeResult int

const (
	// probeAdmitted: the write was admitted, nothing fences the target.
	probeAdmitted probeResult = iota
	// probeRefused: the lock's binding refused it; the fence says with
	// which grant.
	probeRefused
	// probeParamMissing: the lock's binding refused it because the API
	// server finds no grant Lease.
	probeParamMissing
	// probeFailed: refused by something else, or not sent.
	probeFailed
)

// String is the result as the probes metric labels it.
func (r probeResult) String() string {
	return [...]string{"admitted", "refused", "paramMissing", "failed"}[r]
}

// readProbe classifies the answer err to a probe write into the target of
// lock, and parses the grant a refusal names. It has no receiver, to
// facilitate testing.
func readProbe(lock arbiter.Lock, err error) (probeResult, grant.Fence) {
	if err == nil {
		return probeAdmitted, grant.Fence{}
	}
	msg := err.Error()
	if !strings.Contains(msg, "binding '"+bindingName(lock)+"'") {
		return probeFailed, grant.Fence{}
	}
	// A binding that cannot find its parameter fails as a configuration
	// error (Invalid); a validation refuses with its reason (Forbidden).
	if apierrors.IsInvalid(err) && strings.Contains(msg, paramMissingMessage) {
		return probeParamMissing, grant.Fence{}
	}
	if !apierrors.IsForbidden(err) {
		return probeFailed, grant.Fence{}
	}
	i := strings.Index(msg, probeMessagePrefix)
	if i < 0 {
		return probeFailed, grant.Fence{}
	}
	// writer-user comes last: a user name may hold any character.
	var f grant.Fence
	dests := []*string{&f.Token, &f.Holder, &f.WriterPod, &f.Accounts, &f.Repositories, &f.WriterRun, &f.WriterUser}
	fields := strings.SplitN(msg[i+len(probeMessagePrefix):], ";", len(dests))
	for j, dest := range dests {
		if j >= len(fields) {
			return probeFailed, grant.Fence{}
		}
		_, value, ok := strings.Cut(fields[j], "=")
		if !ok {
			return probeFailed, grant.Fence{}
		}
		*dest = value
	}
	return probeRefused, f
}

// fence works out the Enforced condition of an enforced lock, probing its
// fence when everything else is in place, and when to look again. lease is
// the lock's grant Lease from the cache (nil: none). A nil condition keeps
// the current one: admission was seen behind the grant, but not yet for
// fenceStaleAfter.
func (p *prober) fence(ctx context.Context, lock arbiter.Lock, gen int64, e *grant.Enforcement, lease *coordinationv1.Lease) (*metav1.Condition, time.Duration, error) {
	c, err := p.unprobed(ctx, lock, gen, e, lease)
	if err != nil || c != nil {
		return c, fenceProbeInterval, err
	}
	probeErr := p.send(ctx, lock)
	result, seen := readProbe(lock, probeErr)
	p.metrics.observeProbe(result.String())
	switch result {
	case probeAdmitted:
		return enforcedCondition(gen, metav1.ConditionFalse, buildlockv1.ReasonNotYetEnforced,
			"The API server still admits a pipeline's write into namespace %s: a new binding or consent takes effect "+
				"within about a second.", lock.Target), p.retry(lock, fenceStaleAfter), nil
	case probeParamMissing:
		return p.settle(lock, enforcedCondition(gen, metav1.ConditionTrue, buildlockv1.ReasonGrantLeaseMissing,
			"The API server finds no grant Lease %s/%s: it refuses every write into namespace %s, from anyone, until the "+
				"operator has recreated it.", lock.Namespace, buildlockv1.GrantLeaseName(lock.Target), lock.Target)), fenceProbeInterval, nil
	case probeFailed:
		if probeErr != nil && !apierrors.IsForbidden(probeErr) && !apierrors.IsInvalid(probeErr) {
			return nil, 0, fmt.Errorf("probing the fence of target %q of %q: %w", lock.Target, lock.Namespace, probeErr)
		}
		// RBAC just installed may take a moment: retry, backing off. The
		// API server's answer is quoted up to maxQuotedProbeError
		// characters.
		return enforcedCondition(gen, metav1.ConditionUnknown, buildlockv1.ReasonProbeFailed,
			"The operator could not probe the fence of namespace %s, so nothing says the API server enforces it: %.*s",
			lock.Target, maxQuotedProbeError, probeErr.Error()), p.retry(lock, fenceProbeInterval), nil
	}
	return p.judge(ctx, lock, gen, lease, seen)
}

// maxQuotedProbeError bounds what an Enforced condition's message quotes of
// the API server's answer to a probe, in characters: far below the API's
// bound on a condition's message.
const maxQuotedProbeError = 1024

// unprobed returns the lock's Enforced condition when no probe is needed to
// tell it (the target does not consent, the policies are not installed, the
// lock reconciler has not written the Lease yet, or the binding is not in
// place), else nil.
func (p *prober) unprobed(ctx context.Context, lock arbiter.Lock, gen int64, e *grant.Enforcement, lease *coordinationv1.Lease) (*metav1.Condition, error) {
	ns := namespaceMetadata()
	err := p.client.Get(ctx, types.NamespacedName{Name: lock.Target}, ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading namespace %s: %w", lock.Target, err)
	}
	if c := consentCondition(lock, ns.Labels, err == nil, gen); c != nil {
		return p.settle(lock, c), nil
	}
	if !p.admission.Installed(admission.ValidatingPolicy, enforcePolicyName) {
		return p.settle(lock, enforcedCondition(gen, metav1.ConditionFalse, buildlockv1.ReasonPoliciesNotInstalled,
			"The ValidatingAdmissionPolicy %s is not installed (the chart's enforcement.enabled, or config/enforcement): nothing is enforced.",
			enforcePolicyName)), nil
	}
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	err = p.client.Get(ctx, types.NamespacedName{Name: bindingName(lock)}, &binding)
	bound := err == nil && equality.Semantic.DeepEqual(binding.Spec, desiredBinding(lock).Spec)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading ValidatingAdmissionPolicyBinding %s: %w", bindingName(lock), err)
	}
	if lease == nil {
		if c, err := p.foreignLease(ctx, lock, gen); c != nil || err != nil {
			return c, err
		}
	}
	if !bound || (lease != nil && !grant.EnforcementCurrent(lease, e)) {
		// The binding's or the Lease's write brings the lock back here.
		return p.settle(lock, enforcedCondition(gen, metav1.ConditionFalse, buildlockv1.ReasonNotYetEnforced,
			"The operator is still writing the binding %s and the grant Lease of %s: nothing is enforced yet.",
			bindingName(lock), lock.Target)), nil
	}
	return nil, nil
}

// foreignLease is the Enforced condition of a lock whose grant Lease name
// a Lease of somebody else's takes, read live (the cache holds buildlock's
// Leases alone), else nil: the lock reconciler never takes such a Lease
// over, so nothing is fenced until it goes.
func (p *prober) foreignLease(ctx context.Context, lock arbiter.Lock, gen int64) (*metav1.Condition, error) {
	lease, err := grant.Get(ctx, p.apiReader, lock)
	if err != nil || lease == nil || grant.Owned(lease) {
		return nil, err
	}
	return p.settle(lock, enforcedCondition(gen, metav1.ConditionFalse, buildlockv1.ReasonForeignLease,
		"%s: the lock of target %s cannot be granted, nor namespace %s fenced, while it is there, and buildlock never takes it "+
			"over. Delete that Lease, or use another target name; until then nothing is enforced.",
		grant.ForeignLeaseProblem(lease), lock.Target, lock.Target)), nil
}

// judge compares the grant a refused probe saw with the lock's grant Lease
// (from the cache): Enforcing when they agree; when they do not for
// fenceStaleAfter, and the API server's own Lease still disagrees,
// FenceFrozen; until then nil, to look again shortly.
func (p *prober) judge(ctx context.Context, lock arbiter.Lock, gen int64, lease *coordinationv1.Lease, seen grant.Fence) (*metav1.Condition, time.Duration, error) {
	if lease != nil && seen == grant.FenceOf(lease) {
		return p.settle(lock, enforcing(lock, gen)), fenceProbeInterval, nil
	}
	// One of the two is behind.
	now := p.clock.Now()
	if since := p.stale(lock, now); now.Sub(since) < fenceStaleAfter {
		return nil, p.retry(lock, fenceStaleAfter), nil
	}
	lease, err := grant.Get(ctx, p.apiReader, lock)
	if err != nil {
		return nil, 0, err
	}
	if lease != nil && seen == grant.FenceOf(lease) {
		return p.settle(lock, enforcing(lock, gen)), fenceProbeInterval, nil
	}
	want := grant.Fence{Token: "none", Holder: "none"}
	if lease != nil {
		want = grant.FenceOf(lease)
	}
	logf.FromContext(ctx).Info("Fence frozen: admission enforces an old grant", "target", lock.Target,
		"enforcedToken", seen.Token, "enforcedHolder", seen.Holder, "fencingToken", want.Token, "holder", want.Holder)
	return enforcedCondition(gen, metav1.ConditionFalse, buildlockv1.ReasonFenceFrozen,
		"The API server enforces an old grant of %s (fencing token %s, holder %q) instead of the lock's (fencing token %s, "+
			"holder %q), for more than %s: its informer of Lease parameters has stopped, as it does when enforcement's admission "+
			"policies are removed and installed again. Restart every kube-apiserver; until then hand-offs do not move the fence.",
		lock.Target, seen.Token, seen.Holder, want.Token, want.Holder, fenceStaleAfter), fenceProbeInterval, nil
}

// send is the probe write: a server-side dry-run create of a Lease in the
// target namespace, as buildlockv1.EnforcementProbeUser.
func (p *prober) send(ctx context.Context, lock arbiter.Lock) error {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Target, GenerateName: probeLeasePrefix}}
	return p.probe.Create(ctx, lease, client.DryRunAll)
}

// enforcedCondition is an Enforced condition.
func enforcedCondition(generation int64, status metav1.ConditionStatus, reason, format string, args ...any) *metav1.Condition {
	return &metav1.Condition{
		Type: buildlockv1.ConditionEnforced, Status: status, Reason: reason, ObservedGeneration: generation,
		Message: fmt.Sprintf(format, args...),
	}
}

// enforcing is the condition of a fence in effect. It names no token: a
// hand-off must not cost a status write on the policy.
func enforcing(lock arbiter.Lock, generation int64) *metav1.Condition {
	return enforcedCondition(generation, metav1.ConditionTrue, buildlockv1.ReasonEnforcing,
		"Writes into namespace %s by pipeline service accounts of %s are admitted only from the holder of its lock: "+
			"the API server refuses them, with the current grant.", lock.Target, lock.Namespace)
}

// namespaceMetadata is the type under which namespaces are read: their
// labels say whether a target consents to enforcement.
func namespaceMetadata() *metav1.PartialObjectMetadata {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return ns
}

// settle forgets the lock's quick retries and staleness, and returns c.
func (p *prober) settle(lock arbiter.Lock, c *metav1.Condition) *metav1.Condition {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.locks, lock)
	return c
}

// forget drops everything the controller knows of a lock that enforces
// nothing.
func (p *prober) forget(lock arbiter.Lock) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.locks, lock)
	p.metrics.set(lock, "")
	p.metrics.setFrozen(lock, false, false)
}

// state returns the lock's state, creating it. p.mu must be held.
func (p *prober) state(lock arbiter.Lock) *fenceState {
	s := p.locks[lock]
	if s == nil {
		s = &fenceState{}
		p.locks[lock] = s
	}
	return s
}

// retry returns the delay of the lock's next quick retry, at most limit.
func (p *prober) retry(lock arbiter.Lock, limit time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lock)
	d := fenceRetryFirst << min(s.retries, 10)
	s.retries++
	return min(d, limit)
}

// stale records that a probe saw admission behind the lock's grant now,
// and returns since when it has been.
func (p *prober) stale(lock arbiter.Lock, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lock)
	if s.staleSince.IsZero() {
		s.staleSince = now
	}
	return s.staleSince
}
