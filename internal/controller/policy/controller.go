// Package policy is the policy controller. For each lock with a
// BuildLockPolicy it reports whether the operator applies the policy (the
// Ready condition) and whether the API server verifies who is who (the
// IdentityVerified condition: the identity admission policies), keeps the
// lock's enforcement binding in line with it, proves the fence the binding
// sets up (the Enforced condition, by a probe: fence.go) and audits who can
// get around it (the Bypassable condition and status.bypasses: audit.go),
// in one status write when any of them changed. It also says how a lock is
// arbitrated under its policy (For), which the lock reconciler reads.
//
// It never decides a lock and is never on a hand-off's path: the lock
// reconciler writes the grant Lease, which carries the enforcement in the
// grant's own compare-and-swap, whatever this controller does; a failure
// here (a binding or a status that cannot be written, a probe that fails)
// stops nothing there, and the reverse.
package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/controller/grant"
	"github.com/buildlock/buildlock/internal/window"
)

// conflictRetryDelay is how soon a policy whose status write lost a race
// (someone changed the policy) is looked at again.
const conflictRetryDelay = 20 * time.Millisecond

// workers is how many locks the controller looks at at once: it only reads
// the cache, writes a binding or a status now and then, and probes.
const workers = 2

// +kubebuilder:rbac:groups=buildlock.io,resources=buildlockpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlockpolicies/status,verbs=update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicybindings,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Reconciler is the policy controller. Its requests are locks, named like
// the lock reconciler's (the claims' namespace, and the target), which is
// also the name of the lock's BuildLockPolicy.
type Reconciler struct {
	// Client reads from the cache and writes bindings and policies' status.
	Client client.Client
	// APIReader reads live: the grant Lease, before a fence is called frozen.
	APIReader client.Reader
	// Namespaces are the claims namespaces the manager watches; all when
	// empty. A namespace's consent label may name any other.
	Namespaces []string
	// Clock tells the time; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// Admission knows which admission policies are installed; nil: none.
	Admission *admission.Policies
	// Defaults is how a lock is arbitrated where its policy is silent (the
	// operator's flags), which the Ready condition's message names.
	Defaults arbiter.Policy
	// Registry receives the fence metrics.
	Registry prometheus.Registerer
	// Recorder records the Events of freezes beginning and ending.
	Recorder events.EventRecorder
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool

	// prober probes the fences, and remembers what it saw of each lock.
	prober *prober
	// auditor audits the fences, and remembers its last audit of each lock.
	auditor *auditor
}

// Reconcile writes the lock's binding and its policy's status as the policy
// says, each whatever became of the other.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := arbiter.Lock{Namespace: req.Namespace, Target: req.Name}
	if len(r.Namespaces) > 0 && !slices.Contains(r.Namespaces, lock.Namespace) {
		return ctrl.Result{}, nil
	}
	applied, err := Read(ctx, r.Client, lock, r.Defaults)
	if err != nil {
		return ctrl.Result{}, err
	}
	lease, err := grant.Get(ctx, r.Client, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	bindErr := syncBinding(ctx, r.Client, lock, lease, applied.Enforce)
	if applied.Object == nil {
		r.prober.forget(lock)
		r.auditor.forget(lock)
		return ctrl.Result{}, bindErr
	}
	change, after, fenceErr := r.enforcement(ctx, lock, applied, lease)
	now := r.Clock.Now()
	var audit *auditState
	if applied.Enforce != nil {
		a := r.auditor.audit(ctx, lock, applied.Object, now)
		audit = &a
	} else {
		r.auditor.forget(lock)
	}
	state, _ := applied.Windows.At(now)
	r.prober.metrics.setFrozen(lock, applied.Windows != nil, !state.Open)
	statusErr := r.writeStatus(ctx, applied, change, audit, state)
	// The windows' next edge is looked at then: the status shows it, and
	// the freeze's Events are recorded there.
	if edge := applied.Windows.Edge(state); !edge.IsZero() && (after <= 0 || edge.Sub(now) < after) {
		after = max(edge.Sub(now), time.Millisecond)
	}
	if err := errors.Join(bindErr, fenceErr, statusErr); err != nil {
		if apierrors.IsConflict(statusErr) && bindErr == nil && fenceErr == nil {
			return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// enforcedChange is what becomes of the policy's Enforced condition: set to
// c; removed (c nil: the policy enforces nothing); or kept as it is (keep:
// admission was seen behind the grant, but not for long yet).
type enforcedChange struct {
	c    *metav1.Condition
	keep bool
}

// enforcement works out the policy's Enforced condition, probing the fence
// of an enforced lock (fence), records it in the metrics, and says when to
// look again.
func (r *Reconciler) enforcement(ctx context.Context, lock arbiter.Lock, applied Applied, lease *coordinationv1.Lease) (enforcedChange, time.Duration, error) {
	if applied.Enforce == nil {
		r.prober.forget(lock)
		return enforcedChange{}, 0, nil
	}
	c, after, err := r.prober.fence(ctx, lock, applied.Object.Generation, applied.Enforce, lease)
	if err != nil || c == nil {
		return enforcedChange{keep: true}, after, err
	}
	r.prober.metrics.set(lock, c.Reason)
	return enforcedChange{c: c}, after, nil
}

// writeStatus sets the policy's Ready and IdentityVerified conditions, its
// Enforced condition (see enforcedChange), its Bypassable condition and
// bypasses (from audit; removed when nil), and what its windows say at
// state (state, activeWindows, nextChange), and writes the status when any
// changed, conditional on the policy read; a change of state records an
// Event.
func (r *Reconciler) writeStatus(ctx context.Context, applied Applied, change enforcedChange, audit *auditState, state window.State) error {
	policy := applied.Object
	status := policy.Status.DeepCopy()
	now := metav1.NewTime(r.Clock.Now())
	status.ObservedGeneration = policy.Generation
	ready := applied.Ready
	ready.LastTransitionTime = now
	changed := meta.SetStatusCondition(&status.Conditions, ready)
	identity := identityCondition(r.Admission, policy.Generation)
	identity.LastTransitionTime = now
	changed = meta.SetStatusCondition(&status.Conditions, identity) || changed
	if audit == nil {
		changed = meta.RemoveStatusCondition(&status.Conditions, buildlockv1.ConditionBypassable) || changed
		status.Bypasses = nil
	} else {
		bypass := bypassCondition(arbiter.Lock{Namespace: policy.Namespace, Target: policy.Name}, policy.Generation, *audit)
		bypass.LastTransitionTime = now
		changed = meta.SetStatusCondition(&status.Conditions, bypass) || changed
		status.Bypasses = reported(audit.bypasses)
	}
	switch {
	case change.keep:
	case change.c == nil:
		changed = meta.RemoveStatusCondition(&status.Conditions, buildlockv1.ConditionEnforced) || changed
	default:
		c := *change.c
		c.LastTransitionTime = now
		changed = meta.SetStatusCondition(&status.Conditions, c) || changed
	}
	status.State, status.ActiveWindows, status.NextChange = applied.Windows.status(state)
	if !changed && equality.Semantic.DeepEqual(*status, policy.Status) {
		return nil
	}
	updated := policy.DeepCopy()
	updated.Status = *status
	if err := r.Client.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("writing status of BuildLockPolicy %s/%s: %w", policy.Namespace, policy.Name, err)
	}
	r.recordFreeze(ctx, policy, status)
	if change.c != nil && !conditionShown(policy, change.c) {
		logf.FromContext(ctx).Info("Enforcement changed", "target", policy.Name, "reason", change.c.Reason)
	}
	if c := meta.FindStatusCondition(status.Conditions, buildlockv1.ConditionBypassable); c != nil && !conditionShown(policy, c) {
		logf.FromContext(ctx).Info("Fence audited", "target", policy.Name, "bypassable", c.Status, "reason", c.Reason,
			"bypasses", len(status.Bypasses))
	}
	return nil
}

// identityCondition is the IdentityVerified condition: whether the API
// server has every identity admission policy. It has no receiver, to
// facilitate testing.
func identityCondition(a *admission.Policies, generation int64) metav1.Condition {
	c := metav1.Condition{Type: buildlockv1.ConditionIdentityVerified, ObservedGeneration: generation,
		Status: metav1.ConditionTrue, Reason: buildlockv1.ReasonIdentityPoliciesInstalled,
		Message: "The API server has buildlock's identity admission policies: who created a claim, who force-released or " +
			"overrode it, and who froze the target are its word, and only the operator writes the locks' Leases."}
	if msg := a.IdentityMessage(); msg != "" {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, buildlockv1.ReasonIdentityPoliciesMissing, msg
	}
	return c
}

// recordFreeze records an Event, and logs, when the policy's target became
// frozen or open again with the status just written (from one it showed
// before: a policy's first status records none when open).
func (r *Reconciler) recordFreeze(ctx context.Context, policy *buildlockv1.BuildLockPolicy, status *buildlockv1.BuildLockPolicyStatus) {
	was, is := policy.Status.State, status.State
	if was == is || (was == "" && is == buildlockv1.WindowStateOpen) {
		return
	}
	next := "no change within a year"
	if status.NextChange != nil {
		next = status.NextChange.UTC().Format(time.RFC3339)
	}
	reason, note := buildlockv1.ReasonFreezeEnded, fmt.Sprintf("Target %s is open: claims are granted again; next freeze: %s.", policy.Name, next)
	if is == buildlockv1.WindowStateFrozen {
		why := "outside its Allow windows"
		if len(status.ActiveWindows) > 0 && status.ActiveWindows[0].Kind == buildlockv1.WindowDeny {
			a := status.ActiveWindows[0]
			why = fmt.Sprintf("window %s", window.Name(policy.Spec.Windows, int(a.Index)))
			if a.Reason != "" {
				why += fmt.Sprintf(" (%s)", a.Reason)
			}
			if a.FrozenBy != "" {
				why += ", frozen by " + a.FrozenBy
			}
		}
		reason, note = buildlockv1.ReasonFreezeBegan, fmt.Sprintf("Target %s is frozen by %s: no claim is granted but through an override, until %s.", policy.Name, why, next)
	}
	logf.FromContext(ctx).Info("Deploy window changed", "target", policy.Name, "state", is, "nextChange", next)
	if r.Recorder != nil {
		r.Recorder.Eventf(policy, nil, "Normal", reason, "Freeze", "%s", note)
	}
}

// conditionShown reports whether the policy's status already shows c, with
// its status and reason.
func conditionShown(policy *buildlockv1.BuildLockPolicy, c *metav1.Condition) bool {
	shown := meta.FindStatusCondition(policy.Status.Conditions, c.Type)
	return shown != nil && shown.Status == c.Status && shown.Reason == c.Reason
}

// SetupWithManager registers the controller with mgr. Its requests come
// from the policies themselves (a change of their spec, or their
// deletion); from the grant Leases of enforced locks (every change: the
// fence must follow the grant); from the locks' bindings; from namespaces
// whose consent label changes; from buildlock-enforce coming or going,
// which concerns every enforced lock; and from the identity admission
// policies coming or going, which concern every policy. It also reports the
// identity policies in the manager's log and metrics (admission.Report).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	// The informers it reads, registered before the manager starts so that
	// waiting for the cache to sync covers them.
	for _, obj := range []client.Object{&admissionv1.ValidatingAdmissionPolicyBinding{}, namespaceMetadata()} {
		if _, err := mgr.GetCache().GetInformer(context.Background(), obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("registering the informer of %T: %w", obj, err)
		}
	}
	if r.Admission != nil {
		if err := r.Admission.Report(mgr, r.Registry); err != nil {
			return err
		}
	}
	probeCfg := rest.CopyConfig(mgr.GetConfig())
	probeCfg.Impersonate = rest.ImpersonationConfig{UserName: buildlockv1.EnforcementProbeUser}
	probe, err := client.New(probeCfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating the enforcement probe's client: %w", err)
	}
	r.prober = &prober{client: r.Client, apiReader: r.APIReader, probe: probe, clock: r.Clock, admission: r.Admission,
		metrics: newFenceMetrics(r.Registry), locks: map[arbiter.Lock]*fenceState{}}
	r.auditor = &auditor{client: r.Client, apiReader: r.APIReader, admission: r.Admission, locks: map[arbiter.Lock]*auditState{}}
	toLock := func(namespace, target string) []reconcile.Request {
		if namespace == "" || target == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: target}}}
	}
	leaseToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetNamespace(), obj.GetLabels()[grant.TargetLabel])
	})
	// Only the Leases of enforced locks (before or after the change) have a
	// fence to follow; a lock's enforcement starts and stops with its policy.
	enforcedLeases := predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return grant.Enforced(asLease(e.Object)) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return grant.Enforced(asLease(e.ObjectOld)) || grant.Enforced(asLease(e.ObjectNew))
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return grant.Enforced(asLease(e.Object)) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	bindingToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetLabels()[claimsNamespaceLabel], obj.GetLabels()[grant.TargetLabel])
	})
	// A namespace that consents (or stops consenting) to a lock's
	// enforcement changes that lock's Enforced condition; on an update the
	// map sees the old labels and the new.
	consentToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return toLock(obj.GetLabels()[buildlockv1.LockedByLabel], obj.GetName())
	})
	// buildlock-enforce concerns the enforced locks; an identity policy,
	// or its binding, every policy's IdentityVerified condition.
	admissionToLocks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		name := obj.GetName()
		enforce := name == enforcePolicyName
		if !enforce && !slices.Contains(admission.IdentityPolicies(), name) {
			return nil
		}
		var list buildlockv1.BuildLockPolicyList
		if err := mgr.GetClient().List(ctx, &list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing BuildLockPolicies")
			return nil
		}
		var reqs []reconcile.Request
		for _, bp := range list.Items {
			if !enforce || bp.Spec.Enforce != nil {
				reqs = append(reqs, toLock(bp.Namespace, bp.Name)...)
			}
		}
		return reqs
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("buildlock-policy").
		For(&buildlockv1.BuildLockPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, leaseToLock, builder.WithPredicates(enforcedLeases)).
		Watches(&admissionv1.ValidatingAdmissionPolicyBinding{}, bindingToLock).
		WatchesMetadata(&corev1.Namespace{}, consentToLock, builder.WithPredicates(predicate.LabelChangedPredicate{}))
	if r.Admission != nil {
		for _, src := range r.Admission.Sources(mgr, admissionToLocks) {
			b = b.WatchesRawSource(src)
		}
	} else {
		b = b.WatchesMetadata(&admissionv1.ValidatingAdmissionPolicy{}, admissionToLocks)
	}
	err = b.
		WithOptions(controller.Options{MaxConcurrentReconciles: workers, SkipNameValidation: ptr.To(r.SkipNameValidation)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the policy controller: %w", err)
	}
	return nil
}

// asLease is obj as a Lease (an empty one if it is not).
func asLease(obj client.Object) *coordinationv1.Lease {
	if lease, ok := obj.(*coordinationv1.Lease); ok {
		return lease
	}
	return &coordinationv1.Lease{}
}
