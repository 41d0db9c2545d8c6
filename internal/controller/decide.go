package controller

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

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
	// clock tells the time of a decision taken on live reads.
	clock clock.PassiveClock
}

// now is the instant a decision is taken at, in the API's precision
// (microseconds), so that a decision's fixed point survives a round trip.
func (d decider) now() time.Time { return d.clock.Now().Truncate(time.Microsecond) }

// decide asks the arbiter for the decision on obs.
func (d decider) decide(lock arbiter.Lock, obs observation, now time.Time) arbiter.Decision {
	claims, g := arbiterInputs(obs, d.memory.Highest(lock), d.memory.LockFloor(lock))
	d.admission.Unverify(claims)
	return d.arbiter(lock, claims, g, now, obs.policy.Arbiter)
}

// decideSafely decides the lock on obs at now, and again on live reads when
// the stale-read rule says the decision does not rest on what the cache can
// tell (liveReadsFor). It returns the observation and decision that stand,
// and the instant that decision was taken at.
func (d decider) decideSafely(ctx context.Context, lock arbiter.Lock, obs observation, now time.Time) (observation, arbiter.Decision, time.Time, error) {
	decision := d.decide(lock, obs, now)
	stale, err := confirm(ctx, d.observer.apiReader, lock, liveReadsFor(obs, decision))
	if err != nil || !stale {
		return obs, decision, now, err
	}
	return d.decideLive(ctx, lock, obs, now)
}

// decideLive observes the lock live (the claims, then the Lease) and decides
// again, at the time the live reads came back: a decision is never older
// than what it saw (live reads can take seconds while an API server is
// down, and a grant dated before them would shorten its hold, and clamp a
// renewal sent meanwhile to that earlier instant). A decision that still
// rests on a claim the live reads could miss (a holder granted between
// them: liveReadsFor) returns a Conflict, so that the lock is decided again
// shortly. It returns the instant it decided at (before, on an error).
func (d decider) decideLive(ctx context.Context, lock arbiter.Lock, cached observation, before time.Time) (observation, arbiter.Decision, time.Time, error) {
	obs, err := d.observer.live(ctx, lock, cached)
	if err != nil || obs.foreign != nil {
		return obs, arbiter.Decision{}, before, err
	}
	now := d.now()
	freezeAt(&obs, now)
	decision := d.decide(lock, obs, now)
	stale, err := confirm(ctx, d.observer.apiReader, lock, liveReadsFor(obs, decision))
	if err == nil && stale {
		err = apierrors.NewConflict(coordinationv1.Resource("leases"), buildlockv1.GrantLeaseName(lock.Target),
			fmt.Errorf("the grant names BuildLock %s, which the claims listed before it do not show", *obs.lease.Spec.HolderIdentity))
	}
	return obs, decision, now, err
}
