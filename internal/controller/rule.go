package controller

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// # Deciding from the cache, safely
//
// A reconcile decides from the informer cache, and anything it reads there
// may be stale: the claims and the grant Lease come from two informers that
// list and watch apart, so either may be seconds behind the other (after a
// re-list, a partition, or with two managers deciding at once). One rule
// keeps a stale read from doing harm:
//
//	A write may rest only on what a compare-and-swap guards, or on facts
//	that never go back.
//
// Two compare-and-swaps guard a decision's writes. The grant's is an update
// of the Lease carrying the resourceVersion the decision was computed from
// (or a create, which fails if the Lease exists): it proves the Lease
// current, not the claims. A claim's status write carries that claim's
// resourceVersion: it proves that claim current, not the Lease, and it comes
// after the grant's. Facts that never go back: a claim that is gone never
// comes back with its UID (so one this manager's informer saw deleted is
// gone for good); a pod never leaves Succeeded or Failed; a claim
// that ended never changes phase; what a claim's status shows of its hold
// (token, acquire time) never changes, and is written only after the grant;
// a force-release, once set, ends the hold it names; a creationTimestamp
// never changes.
//
// liveReadsFor applies the rule to one decision: it says what of the lock
// the decision rests on that neither guards, and so what to read live before
// anything is written. What each kind of decision rests on:
//
//   - Granting a free lock rests on the Lease, which its compare-and-swap
//     guards: nothing to read.
//   - Handing the lock on or freeing it, after its holder's pod finished,
//     it was force-released, it is being deleted, or it exceeded its
//     maximum hold (counted from the grant's acquire time, on the Lease),
//     rests on the Lease and on facts: nothing to read.
//   - Handing on or freeing a lock whose Lease names a holder the claims do
//     not show rests on that holder being gone. The claims may be older
//     than the Lease (another manager granted the lock to a claim this cache
//     has not seen yet, whose pipeline may be deploying already: pkg/lock
//     starts when the Lease names its claim), and the Lease is current, so
//     its compare-and-swap does not catch that. Read that claim by name:
//     NotFound or another UID is a fact; else decide again on live reads.
//     A holder this manager's informer saw deleted is that fact already:
//     nothing to read (the claim-deleted hand-off's path).
//   - Expiry (a pod-less hold past its expiresAfter since its latest
//     renewal) rests on the holder's renewals, which a stale claim may lack,
//     and neither compare-and-swap covers them: the Lease is current, and
//     the holder's status write comes after the grant moved. Read the
//     holder by name: if the API server's is newer, decide again on live
//     reads. (Recording the renewals in the grant Lease would not spare the
//     read: a renewal the cache has not seen was not recorded by anyone.)
//   - Starting or ending a hold, or ending a claim (a supersession, a
//     release), without changing the grant rests on the Lease, which no
//     compare-and-swap guards then: with a stale Lease it could release a
//     live holder (LockLost), show a second claim Held, or supersede the
//     claim the grant names. Decide again on live reads first. This is not
//     on a hand-off's path: a hand-off changes the grant.
//   - Restoring a grant record (the arbiter's rule 11: a repair) rests on
//     the claims' statuses, which may be staler than the Lease: a holder
//     deleted a moment ago, whose hold the record has ended, can still show
//     Held in the cache, and would be restored with its token. So does a
//     decision while the Lease is missing from the cache and a claim shows
//     Held (the Lease may exist, and be ahead of the claims). Decide again
//     on live reads first; the restore is then a compare-and-swap like any
//     grant (a create fails if anyone created the Lease meanwhile).
//   - Keeping a claim waiting, or as it is, rests on that claim, which its
//     status write guards; a stale Lease can at worst show the claim that
//     the grant names Waiting for a moment, which its next decision shows
//     Held. Nothing to read.
//
// Deciding again on live reads lists the claims and then reads the Lease,
// so that the grant is never older than the claims it is decided with: a
// grant read first would make a hold granted meanwhile look lost, and
// release a live holder by a status write that no compare-and-swap stops.
// Read in that order, the claims may still lack a holder granted between
// the two reads, so the holder's read (above) applies to a live decision
// too, and nothing else does.
//
// A reconcile that closely follows this manager's own writes decides on
// them: a claim or grant Lease that this manager wrote since the version its
// cache shows is taken as the write returned it (ownStatuses,
// grant.Memory.Fresher). That is a later version than the cache's, never a
// claim the cache no longer lists, and every write resting on it is still
// a compare-and-swap; without it the decision after a grant would see the
// new holder still Waiting and decide again on live reads.
//
// The reads the decision does not name follow the same rule where they are
// made: a pod counts as finished on the cache's word and as gone only on a
// live read (observer.pods); the namespace's token floor is read live
// whenever a Lease may be created (grant.ReadTokenFloor), and through the
// reader of the Lease for a version of it that this manager did not write
// (observer.noteLockFloor: the cache's floor comes from the same watch as
// that version, in etcd's order, so it is never older than what the
// version could have lowered); the manager's memory of tokens only grows
// (grant.Memory); a claim's spec.requester is
// its identity only on claims created well after the policy that stamps it
// (admission.Policies.RequestersVerifiedSince).

// liveReads is what a decision must read live before it is applied
// (liveReadsFor).
type liveReads struct {
	// again: decide again on live reads, the claims and then the Lease.
	again bool
	// holder is the claim the Lease names as its holder, missing from the
	// claims decided with: it must be gone (NotFound, or another UID).
	holder *claimRef
	// expiring are the holders whose hold the decision ends by expiry: each
	// must be on the API server as the decision saw it.
	expiring []claimRef
}

// claimRef names a claim to read live, with what the decision knows of it.
type claimRef struct {
	name            string
	uid             types.UID
	resourceVersion string
}

// liveReadsFor applies the stale-read rule (above) to decision d, taken on
// obs: it returns what must be read live before d is written. It has no
// receiver, to facilitate testing.
func liveReadsFor(obs observation, d arbiter.Decision) liveReads {
	if !obs.live && (!d.GrantChanged && startsOrEnds(d) || d.Repair != "" || obs.lease == nil && showsHeld(obs.claims)) {
		return liveReads{again: true}
	}
	if !d.GrantChanged {
		return liveReads{}
	}
	reads := liveReads{holder: missingHolder(obs)}
	if obs.live {
		return reads
	}
	for _, v := range d.Verdicts {
		if v.From != arbiter.Held || v.Phase != arbiter.Expired || v.Reason != arbiter.ReasonExpired {
			continue
		}
		ref := claimRef{name: v.Name, uid: types.UID(v.UID)}
		if i := slices.IndexFunc(obs.claims, func(bl buildlockv1.BuildLock) bool { return bl.Name == v.Name }); i >= 0 {
			ref.resourceVersion = obs.claims[i].ResourceVersion
		}
		reads.expiring = append(reads.expiring, ref)
	}
	return reads
}

// startsOrEnds reports whether a verdict of d starts or ends a hold, or
// ends a claim.
func startsOrEnds(d arbiter.Decision) bool {
	return slices.ContainsFunc(d.Verdicts, func(v arbiter.Verdict) bool {
		return v.Reason != "" && ((v.From == arbiter.Held) != (v.Phase == arbiter.Held) || v.Phase.IsTerminal() && !v.From.IsTerminal())
	})
}

// showsHeld reports whether a claim shows Held.
func showsHeld(claims []buildlockv1.BuildLock) bool {
	return slices.ContainsFunc(claims, func(bl buildlockv1.BuildLock) bool { return bl.Status.Phase == buildlockv1.PhaseHeld })
}

// missingHolder is the claim the observed Lease names as holder when the
// observed claims do not show it (by name and UID) and this manager did not
// see it deleted, else nil: a holder the claims show was accounted for by
// the decision, and one seen deleted is gone.
func missingHolder(obs observation) *claimRef {
	if obs.lease == nil || obs.lease.Spec.HolderIdentity == nil {
		return nil
	}
	name, uid := buildlockv1.ParseGrantHolder(*obs.lease.Spec.HolderIdentity)
	if name == "" {
		return nil // a free lock written by hand or by another tool
	}
	if obs.holderDeleted || slices.ContainsFunc(obs.claims, func(bl buildlockv1.BuildLock) bool { return bl.Name == name && bl.UID == uid }) {
		return nil
	}
	return &claimRef{name: name, uid: uid}
}

// confirm makes the reads that reads names, through reader (live), for a
// decision on lock, and reports whether the decision is stale: it must be
// taken again on live reads. Each read is one claim by name, so that its
// cost does not grow with the namespace.
func confirm(ctx context.Context, reader client.Reader, lock arbiter.Lock, reads liveReads) (stale bool, err error) {
	if reads.again {
		return true, nil
	}
	if h := reads.holder; h != nil {
		live, err := readClaim(ctx, reader, lock, h.name)
		switch {
		case err != nil:
			return false, fmt.Errorf("reading BuildLock %s/%s, which the grant of target %q names: %w", lock.Namespace, h.name, lock.Target, err)
		case live != nil && live.UID == h.uid:
			return true, nil
		}
	}
	for _, c := range reads.expiring {
		live, err := readClaim(ctx, reader, lock, c.name)
		switch {
		case err != nil:
			return false, fmt.Errorf("reading BuildLock %s/%s, whose hold expires, live: %w", lock.Namespace, c.name, err)
		case live == nil || live.ResourceVersion != c.resourceVersion:
			return true, nil
		}
	}
	return false, nil
}

// readClaim reads the lock's claim named name through reader; nil when it
// does not exist.
func readClaim(ctx context.Context, reader client.Reader, lock arbiter.Lock, name string) (*buildlockv1.BuildLock, error) {
	var bl buildlockv1.BuildLock
	err := reader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: name}, &bl)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &bl, nil
}
