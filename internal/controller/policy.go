package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// lockPolicy is how one lock is arbitrated: what its BuildLockPolicy (if
// any) says, with the operator's flags where the policy is silent, and the
// Ready condition the policy's status must show.
type lockPolicy struct {
	arbiter arbiter.Policy
	// object is the lock's BuildLockPolicy, nil when it has none.
	object *buildlockv1.BuildLockPolicy
	// ready is the Ready condition object's status must have.
	ready metav1.Condition
	// enforce is what the policy asks the API server to enforce (nil:
	// nothing). Its Enforced condition is the fence prober's.
	enforce *enforcement
}

// lockPolicy reads the lock's BuildLockPolicy from the cache and turns it
// into the arbiter's policy (policyFor).
func (r *LockReconciler) lockPolicy(ctx context.Context, lock arbiter.Lock) (lockPolicy, error) {
	var obj buildlockv1.BuildLockPolicy
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Target}, &obj)
	defaults := arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: r.MaxHold, LineMemory: r.GrantRetention,
		MaxTimestampSkew: r.MaxTimestampSkew, MaxBuildJump: r.MaxBuildJump}
	switch {
	case apierrors.IsNotFound(err):
		return policyFor(nil, lock, defaults), nil
	case err != nil:
		return lockPolicy{}, fmt.Errorf("reading the BuildLockPolicy of target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return policyFor(&obj, lock, defaults), nil
}

// policyFor is how lock is arbitrated under obj (nil: no policy), with the
// operator's flags (defaults: --max-hold, --grant-retention,
// --max-timestamp-skew, --max-build-jump) where the policy is silent. A
// policy the operator cannot apply leaves the lock on NewestWins, and says
// why in its Ready condition. It has no receiver, to facilitate testing.
func policyFor(obj *buildlockv1.BuildLockPolicy, lock arbiter.Lock, defaults arbiter.Policy) lockPolicy {
	maxHold := defaults.MaxHold
	p := lockPolicy{arbiter: defaults}
	if obj == nil {
		return p
	}
	p.object = obj
	p.enforce = enforcementOf(obj)
	p.ready = metav1.Condition{Type: buildlockv1.ConditionReady, ObservedGeneration: obj.Generation}
	ordering, ok := orderings[obj.Spec.Ordering]
	if !ok {
		p.ready.Status, p.ready.Reason = metav1.ConditionFalse, buildlockv1.ReasonInvalidPolicy
		p.ready.Message = fmt.Sprintf("spec.ordering %q is not an ordering this operator knows (NewestWins, Queue or Fifo); "+
			"target %s follows NewestWins until the policy is fixed.", obj.Spec.Ordering, lock.Target)
		return p
	}
	p.arbiter.Ordering = ordering
	rollbacks, ok := rollbackPolicies[obj.Spec.Rollbacks]
	if !ok {
		// Fail closed: an operator that does not know the value allows no
		// rollback, rather than every one.
		p.arbiter.Rollbacks = arbiter.RollbacksNobody
		p.ready.Status, p.ready.Reason = metav1.ConditionFalse, buildlockv1.ReasonInvalidPolicy
		p.ready.Message = fmt.Sprintf("spec.rollbacks %q is not a value this operator knows (Anyone, PeopleOnly or Nobody); "+
			"target %s allows no rollbacks until the policy is fixed.", obj.Spec.Rollbacks, lock.Target)
		return p
	}
	p.arbiter.Rollbacks = rollbacks
	// An unknown value fails closed too.
	p.arbiter.RefuseReruns = obj.Spec.Reruns != "" && obj.Spec.Reruns != buildlockv1.RerunsAllowed
	if obj.Spec.MaxHold != nil {
		p.arbiter.MaxHold = obj.Spec.MaxHold.Duration
	}
	limit := "no maximum hold"
	switch {
	case obj.Spec.MaxHold != nil:
		limit = "a maximum hold of " + obj.Spec.MaxHold.Duration.String()
	case maxHold > 0:
		limit = "the operator's maximum hold of " + maxHold.String()
	}
	p.ready.Status, p.ready.Reason = metav1.ConditionTrue, buildlockv1.ReasonApplied
	reruns := "re-runs of the build that held last are allowed"
	if p.arbiter.RefuseReruns {
		reruns = "re-runs are refused"
	}
	p.ready.Message = fmt.Sprintf("BuildLocks for target %s follow the ordering %s, with %s; %s, and rollbacks are allowed for %s.",
		lock.Target, ordering, limit, reruns, rollbackWho[p.arbiter.Rollbacks])
	return p
}

// rollbackPolicies maps the API's spec.rollbacks to the arbiter's; "" is
// the default.
var rollbackPolicies = map[buildlockv1.Rollbacks]arbiter.Rollbacks{
	"":                              arbiter.Rollbacks(buildlockv1.DefaultRollbacks),
	buildlockv1.RollbacksAnyone:     arbiter.RollbacksAnyone,
	buildlockv1.RollbacksPeopleOnly: arbiter.RollbacksPeopleOnly,
	buildlockv1.RollbacksNobody:     arbiter.RollbacksNobody,
}

// rollbackWho says whom each setting of spec.rollbacks allows rollbacks.
var rollbackWho = map[arbiter.Rollbacks]string{
	arbiter.RollbacksAnyone:     "anyone",
	arbiter.RollbacksPeopleOnly: "people only (verified requesters that are not service accounts)",
	arbiter.RollbacksNobody:     "nobody",
}

// orderings maps the API's orderings to the arbiter's; "" is the default.
var orderings = map[buildlockv1.Ordering]arbiter.Ordering{
	"":                             arbiter.NewestWins,
	buildlockv1.OrderingNewestWins: arbiter.NewestWins,
	buildlockv1.OrderingQueue:      arbiter.Queue,
	buildlockv1.OrderingFifo:       arbiter.Fifo,
}

// updatePolicyStatus writes the policy's Ready condition when it changed,
// conditional on the policy being the one it was computed from. It keeps
// the Enforced condition as it is: the fence prober writes that one.
func (r *LockReconciler) updatePolicyStatus(ctx context.Context, p lockPolicy) error {
	if p.object == nil {
		return nil
	}
	status := *p.object.Status.DeepCopy()
	status.ObservedGeneration = p.object.Generation
	p.ready.LastTransitionTime = metav1.Now()
	changed := meta.SetStatusCondition(&status.Conditions, p.ready)
	if !changed && status.ObservedGeneration == p.object.Status.ObservedGeneration {
		return nil
	}
	updated := p.object.DeepCopy()
	updated.Status = status
	if err := r.Client.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("writing status of BuildLockPolicy %s/%s: %w", p.object.Namespace, p.object.Name, err)
	}
	return nil
}
