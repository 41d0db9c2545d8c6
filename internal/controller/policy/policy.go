package policy

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// Applied is how one lock is arbitrated: what its BuildLockPolicy (if any)
// says, with the operator's flags where the policy is silent, and the Ready
// condition the policy's status must show.
type Applied struct {
	// Arbiter is the policy the arbiter decides the lock under.
	Arbiter arbiter.Policy
	// Enforce is what the policy asks the API server to enforce (nil:
	// nothing): the grant Lease carries it, and the policy controller binds
	// buildlock-enforce to that Lease.
	Enforce *grant.Enforcement
	// Object is the lock's BuildLockPolicy, nil when it has none.
	Object *buildlockv1.BuildLockPolicy
	// Ready is the Ready condition Object's status must have.
	Ready metav1.Condition
	// Windows are the policy's deploy windows; nil when it has none.
	Windows *Windows
}

// Read reads the lock's BuildLockPolicy through reader (the cache) and
// returns how the lock is arbitrated under it (For).
func Read(ctx context.Context, reader client.Reader, lock arbiter.Lock, defaults arbiter.Policy) (Applied, error) {
	var obj buildlockv1.BuildLockPolicy
	err := reader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Target}, &obj)
	switch {
	case apierrors.IsNotFound(err):
		return For(nil, lock, defaults), nil
	case err != nil:
		return Applied{}, fmt.Errorf("reading the BuildLockPolicy of target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return For(&obj, lock, defaults), nil
}

// For is how lock is arbitrated under obj (nil: no policy), with the
// operator's flags (defaults: --max-hold, --grant-retention,
// --max-timestamp-skew, --max-build-jump, on NewestWins) where the policy is
// silent. A policy the operator cannot apply leaves the lock on NewestWins,
// and says why in its Ready condition. It has no receiver, to facilitate
// testing.
func For(obj *buildlockv1.BuildLockPolicy, lock arbiter.Lock, defaults arbiter.Policy) Applied {
	maxHold := defaults.MaxHold
	p := Applied{Arbiter: defaults}
	if obj == nil {
		return p
	}
	p.Object = obj
	p.Enforce = grant.EnforcementOf(obj)
	p.Ready = metav1.Condition{Type: buildlockv1.ConditionReady, ObservedGeneration: obj.Generation}
	windows, windowsErr := windowsOf(obj)
	p.Windows = windows
	ordering, ok := orderings[obj.Spec.Ordering]
	if !ok {
		p.Ready.Status, p.Ready.Reason = metav1.ConditionFalse, buildlockv1.ReasonInvalidPolicy
		p.Ready.Message = fmt.Sprintf("spec.ordering %q is not an ordering this operator knows (NewestWins, Queue or Fifo); "+
			"target %s follows NewestWins until the policy is fixed.", obj.Spec.Ordering, lock.Target)
		return p
	}
	p.Arbiter.Ordering = ordering
	rollbacks, ok := rollbackPolicies[obj.Spec.Rollbacks]
	if !ok {
		// Fail closed: an operator that does not know the value allows no
		// rollback, rather than every one.
		p.Arbiter.Rollbacks = arbiter.RollbacksNobody
		p.Ready.Status, p.Ready.Reason = metav1.ConditionFalse, buildlockv1.ReasonInvalidPolicy
		p.Ready.Message = fmt.Sprintf("spec.rollbacks %q is not a value this operator knows (Anyone, PeopleOnly or Nobody); "+
			"target %s allows no rollbacks until the policy is fixed.", obj.Spec.Rollbacks, lock.Target)
		return p
	}
	p.Arbiter.Rollbacks = rollbacks
	// An unknown value fails closed too.
	p.Arbiter.RefuseReruns = obj.Spec.Reruns != "" && obj.Spec.Reruns != buildlockv1.RerunsAllowed
	if obj.Spec.MaxHold != nil {
		p.Arbiter.MaxHold = obj.Spec.MaxHold.Duration
	}
	limit := "no maximum hold"
	switch {
	case obj.Spec.MaxHold != nil:
		limit = "a maximum hold of " + obj.Spec.MaxHold.Duration.String()
	case maxHold > 0:
		limit = "the operator's maximum hold of " + maxHold.String()
	}
	if windowsErr != nil {
		// Fail closed: a window the operator cannot evaluate freezes the
		// target until the policy is fixed.
		p.Ready.Status, p.Ready.Reason = metav1.ConditionFalse, buildlockv1.ReasonInvalidPolicy
		p.Ready.Message = fmt.Sprintf("%s: target %s is frozen until the policy is fixed.", windowsErr, lock.Target)
		return p
	}
	p.Ready.Status, p.Ready.Reason = metav1.ConditionTrue, buildlockv1.ReasonApplied
	reruns := "re-runs of the build that held last are allowed"
	if p.Arbiter.RefuseReruns {
		reruns = "re-runs are refused"
	}
	p.Ready.Message = fmt.Sprintf("BuildLocks for target %s follow the ordering %s, with %s; %s, and rollbacks are allowed for %s.",
		lock.Target, ordering, limit, reruns, rollbackWho[p.Arbiter.Rollbacks])
	if windows != nil {
		p.Ready.Message += fmt.Sprintf(" Its %d deploy windows are in effect.", len(obj.Spec.Windows))
	}
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
