package controller

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// decideFunc is the arbiter's signature (arbiter.Decide).
type decideFunc func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision

// decider asks the arbiter, once per observation, and makes every decision
// taken on the cache safe to write (liveReadsFor).
type decider struct {
	observer observer
	// memory is what this manager remembers of the Leases: the highest
	// token of each lock makes the grant's Floor.
	memory *grant.Memory
	// admission knows which admission policies are installed; nil: none.
	admission *admission.Policies
	// arbiter decides; a field so that tests can break it on purpose.
	arbiter decideFunc
}

// decide asks the arbiter for the decision on obs.
func (d decider) decide(lock arbiter.Lock, obs observation, now time.Time) arbiter.Decision {
	claims, g := arbiterInputs(obs, d.memory.Highest(lock), d.memory.LockFloor(lock))
	d.admission.Unverify(claims)
	return d.arbiter(lock, claims, g, now, obs.policy.Arbiter)
}

// decideSafely decides the lock on obs, and again on live reads when the
// stale-read rule says the decision does not rest on what the cache can
// tell (liveReadsFor). It returns the observation and decision that stand.
func (d decider) decideSafely(ctx context.Context, lock arbiter.Lock, obs observation, now time.Time) (observation, arbiter.Decision, error) {
	decision := d.decide(lock, obs, now)
	stale, err := confirm(ctx, d.observer.apiReader, lock, liveReadsFor(obs, decision))
	if err != nil || !stale {
		return obs, decision, err
	}
	return d.decideLive(ctx, lock, obs, now)
}

// decideLive observes the lock live (the claims, then the Lease) and decides
// again. A decision that still rests on a claim the live reads could miss
// (a holder granted between them: liveReadsFor) returns a Conflict, so that
// the lock is decided again shortly.
func (d decider) decideLive(ctx context.Context, lock arbiter.Lock, cached observation, now time.Time) (observation, arbiter.Decision, error) {
	obs, err := d.observer.live(ctx, lock, cached)
	if err != nil || obs.foreign != nil {
		return obs, arbiter.Decision{}, err
	}
	decision := d.decide(lock, obs, now)
	stale, err := confirm(ctx, d.observer.apiReader, lock, liveReadsFor(obs, decision))
	if err == nil && stale {
		err = apierrors.NewConflict(coordinationv1.Resource("leases"), buildlockv1.GrantLeaseName(lock.Target),
			fmt.Errorf("the grant names BuildLock %s, which the claims listed before it do not show", *obs.lease.Spec.HolderIdentity))
	}
	return obs, decision, err
}
