package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// The fence prober proves each enforced lock's fence, beside the lock
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

// fenceProber is the controller that probes enforced locks' fences and
// owns their policies' Enforced condition. Its requests are locks, named
// like the lock reconciler's (namespace, target).
type fenceProber struct {
	// client reads from the cache and writes the policies' status.
	client client.Client
	// reader reads live: the grant Lease, before a fence is called frozen.
	reader client.Reader
	// probe impersonates buildlockv1.EnforcementProbeUser; it only sends
	// dry-run creates.
	probe client.Client
	// namespaces are the claims namespaces the manager watches; all when
	// empty. A namespace's consent label may name any other.
	namespaces []string
	clock      clock.PassiveClock
	policies   *admissionPolicies
	metrics    *fenceMetrics

	mu    sync.Mutex
	locks map[arbiter.Lock]*fenceState
}

// fenceState is what the prober remembers of one lock between probes.
type fenceState struct {
	// staleSince is when a probe first saw admission enforce another grant
	// than the lock's; zero while they agree.
	staleSince time.Time
	// retries counts the quick retries since the last settled probe.
	retries int
}

// grantFence is what of a grant Lease a fence enforces: the fields of
// buildlock-enforce's refusal of the probe.
type grantFence struct {
	token, holder, writerPod, accounts, repositories, writerRun, writerUser string
}

// fenceOf is the fence that lease asks for.
func fenceOf(lease *coordinationv1.Lease) grantFence {
	f := grantFence{
		token:     "0",
		holder:    ptr.Deref(lease.Spec.HolderIdentity, ""),
		writerPod: lease.Annotations[writerPodAnnotation],
		accounts:  lease.Annotations[serviceAccountsAnnotation],
		// As buildlock-enforce reads it: absent is every repository.
		repositories: cmp.Or(lease.Annotations[repositoriesAnnotation], "*"),
		writerRun:    lease.Annotations[writerRunAnnotation],
		writerUser:   lease.Annotations[writerUserAnnotation],
	}
	if lease.Spec.LeaseTransitions != nil {
		f.token = fmt.Sprint(*lease.Spec.LeaseTransitions)
	}
	return f
}

// probeResult is what one probe write learned.
type probeResult int

const (
	// probeAdmitted: the write was admitted, nothing fences the target.
	probeAdmitted probeResult = iota
	// probeRefused: the lock's binding refused it; fence says with which
	// grant.
	probeRefused
	// probeParamMissing: the lock's binding refused it because the API
	// server finds no grant Lease.
	probeParamMissing
	// probeFailed: refused by something else, or not sent.
	probeFailed
)

// readProbe classifies the answer err to a probe write into the target of
// lock, and parses the grant a refusal names. It has no receiver, to
// facilitate testing.
func readProbe(lock arbiter.Lock, err error) (probeResult, grantFence) {
	if err == nil {
		return probeAdmitted, grantFence{}
	}
	msg := err.Error()
	if !strings.Contains(msg, "binding '"+bindingName(lock)+"'") {
		return probeFailed, grantFence{}
	}
	// A binding that cannot find its parameter fails as a configuration
	// error (Invalid); a validation refuses with its reason (Forbidden).
	if apierrors.IsInvalid(err) && strings.Contains(msg, paramMissingMessage) {
		return probeParamMissing, grantFence{}
	}
	if !apierrors.IsForbidden(err) {
		return probeFailed, grantFence{}
	}
	i := strings.Index(msg, probeMessagePrefix)
	if i < 0 {
		return probeFailed, grantFence{}
	}
	// writer-user comes last: a user name may hold any character.
	var f grantFence
	dests := []*string{&f.token, &f.holder, &f.writerPod, &f.accounts, &f.repositories, &f.writerRun, &f.writerUser}
	fields := strings.SplitN(msg[i+len(probeMessagePrefix):], ";", len(dests))
	for j, dest := range dests {
		if j >= len(fields) {
			return probeFailed, grantFence{}
		}
		_, value, ok := strings.Cut(fields[j], "=")
		if !ok {
			return probeFailed, grantFence{}
		}
		*dest = value
	}
	return probeRefused, f
}

// Reconcile probes one lock's fence and writes its policy's Enforced
// condition when it changed.
func (p *fenceProber) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := arbiter.Lock{Namespace: req.Namespace, Target: req.Name}
	if len(p.namespaces) > 0 && !slices.Contains(p.namespaces, lock.Namespace) {
		return ctrl.Result{}, nil
	}
	var policy buildlockv1.BuildLockPolicy
	if err := p.client.Get(ctx, req.NamespacedName, &policy); apierrors.IsNotFound(err) {
		p.forget(lock)
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading the BuildLockPolicy of target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	e := enforcementOf(&policy)
	var (
		cond  *metav1.Condition
		after time.Duration
		err   error
	)
	if e == nil {
		p.forget(lock)
	} else if cond, after, err = p.fence(ctx, lock, &policy, e); err != nil {
		return ctrl.Result{}, err
	} else if cond == nil {
		return ctrl.Result{RequeueAfter: after}, nil // wait and see
	}
	if cond != nil {
		p.metrics.set(lock, cond.Reason)
	}
	if err := p.writeCondition(ctx, &policy, cond); apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// fence works out the Enforced condition of an enforced lock, probing its
// fence when everything else is in place, and when to look again. A nil
// condition keeps the current one: admission was seen behind the grant,
// but not yet for fenceStaleAfter.
func (p *fenceProber) fence(ctx context.Context, lock arbiter.Lock, policy *buildlockv1.BuildLockPolicy, e *enforcement) (*metav1.Condition, time.Duration, error) {
	lease, c, err := p.unprobed(ctx, lock, policy.Generation, e)
	if err != nil || c != nil {
		return c, fenceProbeInterval, err
	}
	probeErr := p.send(ctx, lock)
	result, seen := readProbe(lock, probeErr)
	p.metrics.observeProbe(result)
	gen := policy.Generation
	switch result {
	case probeAdmitted:
		return enforced(gen, metav1.ConditionFalse, buildlockv1.ReasonNotYetEnforced,
			"The API server still admits a pipeline's write into namespace %s: a new binding or consent takes effect "+
				"within about a second.", lock.Target), p.retry(lock, fenceStaleAfter), nil
	case probeParamMissing:
		return p.settle(lock, enforced(gen, metav1.ConditionTrue, buildlockv1.ReasonGrantLeaseMissing,
			"The API server finds no grant Lease %s/%s: it refuses every write into namespace %s, from anyone, until the "+
				"operator has recreated it.", lock.Namespace, buildlockv1.GrantLeaseName(lock.Target), lock.Target)), fenceProbeInterval, nil
	case probeFailed:
		if probeErr != nil && !apierrors.IsForbidden(probeErr) && !apierrors.IsInvalid(probeErr) {
			return nil, 0, fmt.Errorf("probing the fence of target %q of %q: %w", lock.Target, lock.Namespace, probeErr)
		}
		// RBAC just installed may take a moment: retry, backing off.
		return enforced(gen, metav1.ConditionUnknown, buildlockv1.ReasonProbeFailed,
			"The operator could not probe the fence of namespace %s, so nothing says the API server enforces it: %s",
			lock.Target, truncate(probeErr.Error(), maxEventNoteLength)), p.retry(lock, fenceProbeInterval), nil
	}
	return p.judge(ctx, lock, gen, lease, seen)
}

// unprobed returns the lock's Enforced condition when no probe is needed to
// tell it (the target does not consent, the policies are not installed, the
// lock reconciler has not written the binding or the Lease yet), else nil
// and the grant Lease the probe is to be judged against.
func (p *fenceProber) unprobed(ctx context.Context, lock arbiter.Lock, gen int64, e *enforcement) (*coordinationv1.Lease, *metav1.Condition, error) {
	ns := namespaceMetadata()
	err := p.client.Get(ctx, types.NamespacedName{Name: lock.Target}, ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("reading namespace %s: %w", lock.Target, err)
	}
	if c := consentCondition(lock, ns.Labels, err == nil, gen); c != nil {
		return nil, p.settle(lock, c), nil
	}
	if !p.policies.installed(validatingPolicyKind, enforcePolicyName) {
		return nil, p.settle(lock, enforced(gen, metav1.ConditionFalse, buildlockv1.ReasonPoliciesNotInstalled,
			"The ValidatingAdmissionPolicy %s is not installed (the chart's enforcement.enabled, or config/enforcement): nothing is enforced.",
			enforcePolicyName)), nil
	}
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	err = p.client.Get(ctx, types.NamespacedName{Name: bindingName(lock)}, &binding)
	bound := err == nil && equality.Semantic.DeepEqual(binding.Spec, desiredBinding(lock).Spec)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("reading ValidatingAdmissionPolicyBinding %s: %w", bindingName(lock), err)
	}
	lease, err := getLease(ctx, p.client, lock)
	if err != nil {
		return nil, nil, err
	}
	if !bound || (lease != nil && !enforcementCurrent(lease, e)) {
		// The lock reconciler has not caught up with the policy yet; its
		// writes bring the lock back here.
		return nil, p.settle(lock, enforced(gen, metav1.ConditionFalse, buildlockv1.ReasonNotYetEnforced,
			"The operator is still writing the binding %s and the grant Lease of %s: nothing is enforced yet.",
			bindingName(lock), lock.Target)), nil
	}
	return lease, nil, nil
}

// judge compares the grant a refused probe saw with the lock's grant Lease
// (from the cache): Enforcing when they agree; when they do not for
// fenceStaleAfter, and the API server's own Lease still disagrees,
// FenceFrozen; until then nil, to look again shortly.
func (p *fenceProber) judge(ctx context.Context, lock arbiter.Lock, gen int64, lease *coordinationv1.Lease, seen grantFence) (*metav1.Condition, time.Duration, error) {
	if lease != nil && seen == fenceOf(lease) {
		return p.settle(lock, enforcing(lock, gen)), fenceProbeInterval, nil
	}
	// One of the two is behind.
	now := p.clock.Now()
	if since := p.stale(lock, now); now.Sub(since) < fenceStaleAfter {
		return nil, p.retry(lock, fenceStaleAfter), nil
	}
	lease, err := getLease(ctx, p.reader, lock)
	if err != nil {
		return nil, 0, err
	}
	if lease != nil && seen == fenceOf(lease) {
		return p.settle(lock, enforcing(lock, gen)), fenceProbeInterval, nil
	}
	want := grantFence{token: "none", holder: "none"}
	if lease != nil {
		want = fenceOf(lease)
	}
	logf.FromContext(ctx).Info("Fence frozen: admission enforces an old grant", "target", lock.Target,
		"enforcedToken", seen.token, "enforcedHolder", seen.holder, "fencingToken", want.token, "holder", want.holder)
	return enforced(gen, metav1.ConditionFalse, buildlockv1.ReasonFenceFrozen,
		"The API server enforces an old grant of %s (fencing token %s, holder %q) instead of the lock's (fencing token %s, "+
			"holder %q), for more than %s: its informer of Lease parameters has stopped, as it does when enforcement's admission "+
			"policies are removed and installed again. Restart every kube-apiserver; until then hand-offs do not move the fence.",
		lock.Target, seen.token, seen.holder, want.token, want.holder, fenceStaleAfter), fenceProbeInterval, nil
}

// send is the probe write: a server-side dry-run create of a Lease in the
// target namespace, as buildlockv1.EnforcementProbeUser.
func (p *fenceProber) send(ctx context.Context, lock arbiter.Lock) error {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Target, GenerateName: probeLeasePrefix}}
	return p.probe.Create(ctx, lease, client.DryRunAll)
}

// enforced is an Enforced condition.
func enforced(generation int64, status metav1.ConditionStatus, reason, format string, args ...any) *metav1.Condition {
	return &metav1.Condition{
		Type: buildlockv1.ConditionEnforced, Status: status, Reason: reason, ObservedGeneration: generation,
		Message: fmt.Sprintf(format, args...),
	}
}

// enforcing is the condition of a fence in effect. It names no token: a
// hand-off must not cost a status write on the policy.
func enforcing(lock arbiter.Lock, generation int64) *metav1.Condition {
	return enforced(generation, metav1.ConditionTrue, buildlockv1.ReasonEnforcing,
		"Writes into namespace %s by pipeline service accounts of %s are admitted only from the holder of its lock: "+
			"the API server refuses them, with the current grant.", lock.Target, lock.Namespace)
}

// writeCondition sets (or, for nil, removes) the policy's Enforced
// condition, and writes the status when that changed, conditional on the
// policy read.
func (p *fenceProber) writeCondition(ctx context.Context, policy *buildlockv1.BuildLockPolicy, c *metav1.Condition) error {
	status := policy.Status.DeepCopy()
	var changed bool
	if c == nil {
		changed = meta.RemoveStatusCondition(&status.Conditions, buildlockv1.ConditionEnforced)
	} else {
		c.LastTransitionTime = metav1.NewTime(p.clock.Now())
		changed = meta.SetStatusCondition(&status.Conditions, *c)
	}
	if !changed {
		return nil
	}
	updated := policy.DeepCopy()
	updated.Status = *status
	if err := p.client.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("writing the Enforced condition of BuildLockPolicy %s/%s: %w", policy.Namespace, policy.Name, err)
	}
	if c != nil {
		logf.FromContext(ctx).Info("Enforcement changed", "target", policy.Name, "reason", c.Reason)
	}
	return nil
}

// settle forgets the lock's quick retries and staleness, and returns c.
func (p *fenceProber) settle(lock arbiter.Lock, c *metav1.Condition) *metav1.Condition {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.locks, lock)
	return c
}

// forget drops everything the prober knows of a lock that enforces
// nothing.
func (p *fenceProber) forget(lock arbiter.Lock) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.locks, lock)
	p.metrics.set(lock, "")
}

// state returns the lock's state, creating it. p.mu must be held.
func (p *fenceProber) state(lock arbiter.Lock) *fenceState {
	s := p.locks[lock]
	if s == nil {
		s = &fenceState{}
		p.locks[lock] = s
	}
	return s
}

// retry returns the delay of the lock's next quick retry, at most limit.
func (p *fenceProber) retry(lock arbiter.Lock, limit time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lock)
	d := fenceRetryFirst << min(s.retries, 10)
	s.retries++
	return min(d, limit)
}

// stale records that a probe saw admission behind the lock's grant now,
// and returns since when it has been.
func (p *fenceProber) stale(lock arbiter.Lock, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lock)
	if s.staleSince.IsZero() {
		s.staleSince = now
	}
	return s.staleSince
}

// setupFenceProber registers the fence prober with mgr, and gives r what it
// needs to know of the installed admission policies.
func setupFenceProber(mgr ctrl.Manager, o Options, r *LockReconciler) error {
	policies, err := watchAdmissionPolicies(mgr)
	if err != nil {
		return err
	}
	r.Admission = policies
	probeCfg := rest.CopyConfig(mgr.GetConfig())
	probeCfg.Impersonate = rest.ImpersonationConfig{UserName: buildlockv1.EnforcementProbeUser}
	probe, err := client.New(probeCfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating the enforcement probe's client: %w", err)
	}
	p := &fenceProber{
		client:     mgr.GetClient(),
		reader:     mgr.GetAPIReader(),
		probe:      probe,
		namespaces: o.Namespaces,
		clock:      o.Clock,
		policies:   policies,
		metrics:    newFenceMetrics(o.Registry),
		locks:      map[arbiter.Lock]*fenceState{},
	}
	toLock := func(namespace, target string) []reconcile.Request {
		if namespace == "" || target == "" {
			return nil
		}
		return []reconcile.Request{lockRequest(namespace, target)}
	}
	leaseToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetNamespace(), obj.GetLabels()[targetLabel])
	})
	bindingToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetLabels()[claimsNamespaceLabel], obj.GetLabels()[targetLabel])
	})
	consentToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetLabels()[buildlockv1.LockedByLabel], obj.GetName())
	})
	// The enforce policy coming or going concerns every enforced lock.
	policyToLocks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		if obj.GetName() != enforcePolicyName {
			return nil
		}
		var list buildlockv1.BuildLockPolicyList
		if err := mgr.GetClient().List(ctx, &list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing BuildLockPolicies")
			return nil
		}
		var reqs []reconcile.Request
		for _, bp := range list.Items {
			if bp.Spec.Enforce != nil {
				reqs = append(reqs, lockRequest(bp.Namespace, bp.Name))
			}
		}
		return reqs
	})
	err = ctrl.NewControllerManagedBy(mgr).
		Named("buildlock-fence").
		For(&buildlockv1.BuildLockPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, leaseToLock).
		Watches(&admissionv1.ValidatingAdmissionPolicyBinding{}, bindingToLock).
		WatchesMetadata(&corev1.Namespace{}, consentToLock, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WatchesMetadata(&admissionv1.ValidatingAdmissionPolicy{}, policyToLocks).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: ptr.To(o.SkipNameValidation)}).
		Complete(p)
	if err != nil {
		return fmt.Errorf("setting up the fence prober: %w", err)
	}
	return nil
}
