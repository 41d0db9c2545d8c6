package controller

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// granter writes a decision's grant: the one write that moves the lock.
type granter struct {
	// client writes the Lease.
	client client.Client
	// live reads the namespace's token floor before a grant above it
	// (grant.Reserve).
	live client.Reader
	// memory is what this manager remembers of the Leases.
	memory *grant.Memory
	// decider decides again, on live reads, when a write lost a race.
	decider decider
	// metrics receives what happened; nil records nothing.
	metrics *Metrics
}

// apply writes the grant of decision d, taken on obs: when d changes it, as
// a compare-and-swap on the Lease d was computed from (on a lost race it
// decides again on live reads at once, rather than after a requeue, for a
// hand-off waits, and tries once more); and whenever the Lease does not
// carry exactly the grant and the policy's enforcement (someone else's edit
// is undone, as a compare-and-swap on what was read, and an enforced lock
// always has a Lease: a free lock then refuses every pipeline write). It
// returns the observation and decision that stand; a lock whose Lease name
// someone else's Lease takes (obs.foreign) is not written. It also
// returns the instant the decision that stands was taken at (later than
// now when a lost race made it decide again).
func (g granter) apply(ctx context.Context, lock arbiter.Lock, obs observation, d arbiter.Decision, now time.Time) (observation, arbiter.Decision, time.Time, error) {
	lease := obs.lease
	if d.GrantChanged {
		var err error
		if obs, d, lease, now, err = g.writeChange(ctx, lock, obs, d, now); err != nil {
			if !lostRace(err) {
				g.metrics.observeGrantWriteError()
			}
			return obs, d, now, err
		}
		if obs.foreign != nil {
			return obs, d, now, nil
		}
	}
	if !grant.Current(lock, lease, d.Grant, obs.policy.Enforce) {
		if err := g.reserve(ctx, lock, obs, d.Grant); err != nil {
			return obs, d, now, err
		}
		if _, err := grant.Write(ctx, g.client, g.memory, lock, lease, d.Grant, obs.policy.Enforce, now); err != nil {
			if lease == nil && apierrors.IsAlreadyExists(err) {
				// The create of an enforced lock's Lease, which the cache
				// did not show: it may be somebody else's, which no retry
				// would ever create.
				if obs.foreign, err = g.foreignLease(ctx, lock); obs.foreign != nil || err != nil {
					return obs, d, now, err
				}
			}
			return obs, d, now, err
		}
	}
	g.rememberTokens(lock, obs, d)
	return obs, d, now, nil
}

// writeChange writes the grant of d, which changes it, and returns the
// observation and decision that stand, the Lease after the write, and the
// instant the decision that stands was taken at.
func (g granter) writeChange(ctx context.Context, lock arbiter.Lock, obs observation, d arbiter.Decision, now time.Time) (observation, arbiter.Decision, *coordinationv1.Lease, time.Time, error) {
	if err := g.reserve(ctx, lock, obs, d.Grant); err != nil {
		return obs, d, nil, now, err
	}
	lease, err := grant.Write(ctx, g.client, g.memory, lock, obs.lease, d.Grant, obs.policy.Enforce, now)
	if lostRace(err) {
		if obs, d, now, err = g.decider.decideLive(ctx, lock, obs, now); err != nil || obs.foreign != nil {
			return obs, d, nil, now, err
		}
		lease = obs.lease
		if d.GrantChanged {
			if err := g.reserve(ctx, lock, obs, d.Grant); err != nil {
				return obs, d, nil, now, err
			}
			lease, err = grant.Write(ctx, g.client, g.memory, lock, obs.lease, d.Grant, obs.policy.Enforce, now)
		}
	}
	if err == nil && d.GrantChanged {
		log := logf.FromContext(ctx)
		log.V(1).Info("Recorded grant", "holder", d.Grant.Holder, "fencingToken", d.Grant.Token)
		if d.Repair != "" {
			// Someone deleted or edited the record: say so, once per repair.
			log.Info("Restored the grant record from the claims", "repair", d.Repair, "holder", d.Grant.Holder, "fencingToken", d.Grant.Token)
			g.metrics.observeRepair(d.Repair)
		}
	}
	return obs, d, lease, now, err
}

// reserve makes the namespace's token floor hold the token of grant before
// the Lease carries it (grant.Reserve), starting from the floor obs read.
func (g granter) reserve(ctx context.Context, lock arbiter.Lock, obs observation, gr arbiter.Grant) error {
	if err := grant.Reserve(ctx, g.client, g.live, g.memory, lock.Namespace, gr.Token, obs.floorRead); err != nil {
		return fmt.Errorf("reserving token %d of lock %s/%s: %w", gr.Token, lock.Namespace, lock.Target, err)
	}
	return nil
}

// foreignLease reads the lock's grant Lease live after a create of it
// failed with AlreadyExists, and returns it if it is somebody else's
// (remembered, so that the lock reads it again rather than writing), else
// the AlreadyExists of a lost race.
func (g granter) foreignLease(ctx context.Context, lock arbiter.Lock) (*coordinationv1.Lease, error) {
	lease, err := grant.Get(ctx, g.live, lock)
	if err != nil {
		return nil, err
	}
	if lease == nil || grant.Owned(lease) {
		return nil, apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), buildlockv1.GrantLeaseName(lock.Target))
	}
	g.memory.NoteForeign(lock, lease)
	return lease, nil
}

// rememberTokens remembers the highest token the lock shows: its Lease's,
// its claims', and the decision's grant (written by now).
func (g granter) rememberTokens(lock arbiter.Lock, obs observation, d arbiter.Decision) {
	highest := max(d.Grant.Token, buildlockv1.GrantToken(obs.lease))
	for i := range obs.claims {
		highest = max(highest, obs.claims[i].Status.FencingToken)
	}
	g.memory.ObserveToken(lock, highest)
}

// lostRace reports whether err is a write that lost a race with another
// writer: a Conflict (including a delete precondition that no longer
// holds), AlreadyExists, or NotFound for an update of a Lease deleted
// meanwhile (the idle Lease's collection, or a person).
func lostRace(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}

// foreignLeaseDecision is the decision for a lock whose grant Lease name is
// taken by a Lease buildlock did not create: nothing is granted, ended or
// written to that Lease; every claim still Pending says why. It has no
// receiver, to facilitate testing.
func foreignLeaseDecision(lock arbiter.Lock, obs observation) arbiter.Decision {
	message := fmt.Sprintf("%s: the lock of target %s cannot be granted while it is there, and buildlock never takes it over. "+
		"Delete that Lease, or claim another target; until then this claim stays Pending.", grant.ForeignLeaseProblem(obs.foreign), lock.Target)
	var d arbiter.Decision
	for i := range obs.claims {
		bl := &obs.claims[i]
		phase := arbiter.Phase(bl.Status.Phase)
		v := arbiter.Verdict{Name: bl.Name, UID: string(bl.UID), From: phase, Phase: phase}
		if phase == "" || phase == arbiter.Pending {
			v.From, v.Phase, v.Reason, v.Message = arbiter.Pending, arbiter.Pending, buildlockv1.ReasonForeignLease, message
		}
		d.Verdicts = append(d.Verdicts, v)
	}
	return d
}
