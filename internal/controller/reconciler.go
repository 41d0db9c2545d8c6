// Package controller applies the arbiter's decisions to the cluster. It
// reconciles a lock (a namespace and a target), not a single BuildLock: every
// event about a claim, its pod, its policy or its grant Lease maps to the
// lock it concerns, so the workqueue serializes all work on one lock (and
// serves namespaces in turn, so that a burst in one delays no other). A
// reconcile observes the lock, asks the arbiter once, and applies the
// decision: the grant first, as a compare-and-swap on the lock's Lease, then
// each claim's status, each write conditional on the resourceVersion it was
// computed from.
//
// The grant Lease is written by the operator alone, but anyone with the
// rights to write Leases can delete or edit it. Every create, update and
// delete of a Lease that this manager did not make itself brings its lock
// here at once (leaseHandler); the arbiter restores a record that the
// claims contradict (its rule 11), and the Lease is written again whenever
// it does not carry exactly what the decision and the policy say
// (leaseCurrent). The highest token a manager has seen for each lock
// outlives the Lease (leaseMemory, the arbiter's Grant.Floor), and goes into
// the namespace's token floor when a lock is left without a Lease; a token
// floor Lease that someone deletes or lowers is raised again. A Lease named
// like the grant Lease that buildlock did not create (ownedLease) is never
// taken over: its lock's claims stay Pending (ForeignLease).
//
// # Deciding from the cache, safely
//
// A reconcile reads the lock's claims, its Lease, its policy and its pods
// from the informer cache, and a pod live only when the cache cannot tell
// for sure that it is there. Any of these may be stale. What keeps a stale read from
// doing harm:
//
//   - A decision that changes the grant (a hand-off, a freed lock) is written
//     as an update of the Lease carrying the resourceVersion it was decided
//     from. If the cached Lease was stale, the API server refuses the write
//     (Conflict, or AlreadyExists for a Lease the cache did not have yet),
//     and the lock is decided again at once on live reads: the claims, then
//     the Lease, so that the grant is never older than the claims.
//   - The claims may be older than the Lease instead (two informers, and
//     on live reads the Lease is read after the claims): the Lease may name
//     a holder the claims do not show yet, granted by another manager, and
//     a decision would take that for a holder that was deleted and hand the
//     lock on, through a compare-and-swap that succeeds, since the Lease is
//     current. The holder's pipeline may be deploying already (pkg/lock
//     starts when the Lease names its claim). So a decision that changes the
//     grant while the Lease's holder is missing from the claims reads that
//     one claim live first (holderGone): only NotFound, or another UID,
//     lets it through; a claim never comes back with its UID. On the
//     hand-off of a deleted holder this is one read by name.
//   - A hold that ends by expiry rests on the holder's latest renewal,
//     which a stale claim may lack; the Lease is current, so its
//     compare-and-swap does not catch that. Such a decision reads the
//     holder's claim live by name first (expiryStale), and is taken again
//     on live reads if the cache was behind. The other endings (a deleted
//     claim, a finished pod, a force-release, the maximum hold counted from
//     the grant) rest on facts that never go back.
//   - A decision that starts or ends a hold, or ends a claim, without
//     changing the grant is guarded by no compare-and-swap on the grant (a
//     status write is conditional on its claim only): with a stale Lease it
//     could release a live holder (LockLost), show a second claim Held, or
//     supersede the claim the grant names. Such decisions are taken again on
//     live reads before anything is written (needsLiveConfirmation). They are
//     not on a hand-off's path: a hand-off changes the grant.
//   - Every other status write (a claim that waits, or that keeps its phase)
//     is conditional on the claim's resourceVersion: a stale claim fails the
//     write, and the lock is decided again. A stale grant can at worst make
//     a claim the grant names look Waiting for a moment; its next decision
//     shows it Held.
//   - A pod counts as finished on the cache's word (a pod never leaves
//     Succeeded or Failed), and as gone only on a live read (NotFound, or
//     another UID): the cache may not have seen it yet. A pod that cannot be
//     read counts as alive, and a stale Running is alive too.
//   - The namespace's token floor is read live whenever a Lease must be
//     created: no compare-and-swap would catch a stale floor, and a token
//     must never repeat. The manager's memory of each lock's highest token
//     only grows (it is fed by what the API server returned: Lease events,
//     claims, its own writes), so it is never stale in the harmful
//     direction: a token above it is only ever skipped, never repeated.
//   - A decision that restores a grant record (rule 11) rests on the
//     claims' statuses, which only the operator writes, always after the
//     record, and whose token and acquire time never change once shown:
//     a stale claim can lack a hold, never show one that the record did
//     not grant at its token. With the Lease in the cache, the restore is a
//     compare-and-swap on that Lease like any grant, and a Lease with a
//     later token (a later grant) is never restored to an earlier hold. With
//     no Lease in the cache while a claim shows Held, the lock is decided
//     again on live reads first (claims, then Lease: the record is restored
//     only if it is missing there too), and the Lease is created, which
//     fails if anyone created it meanwhile. A write that undoes an edit
//     (leaseCurrent) is a compare-and-swap on the Lease it read.
//   - spec.requester is a claim's Identity only on claims created at least
//     RequesterSettle after the requester admission policy and its binding,
//     while both exist (admissionPolicies.requestersVerifiedSince): a claim created before
//     may carry a requester its client wrote. A creationTimestamp and a
//     policy's never change, so only a policy deleted a moment ago can be
//     stale in the cache.
package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// conflictRetryDelay is how soon a lock is decided again after a write lost a
// race. Short, because a hand-off may be waiting on it; not zero, so that
// the cache can catch up with the write that won.
const conflictRetryDelay = 20 * time.Millisecond

// LockReconciler reconciles one lock per request: the request's Namespace is
// the claims' namespace and its Name is the target.
type LockReconciler struct {
	// Client reads claims and policies from the cache and writes Leases,
	// statuses and deletions.
	Client client.Client
	// APIReader reads live from the API server: the grant Lease, pods, and
	// the claims before a grant changes.
	APIReader client.Reader
	// Recorder emits events on BuildLocks.
	Recorder events.EventRecorder
	// Clock tells the time; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// MaxHold bounds every hold of a lock whose policy sets no maxHold
	// (--max-hold); zero means no bound.
	MaxHold time.Duration
	// GrantRetention is how long a grant record remembers the builds that
	// held, and how long the Lease of a lock without claims is kept.
	GrantRetention time.Duration
	// MaxTimestampSkew and MaxBuildJump go into every lock's arbiter.Policy
	// (--max-timestamp-skew, --max-build-jump).
	MaxTimestampSkew time.Duration
	MaxBuildJump     int64
	// RequesterSettle: see DefaultRequesterSettle.
	RequesterSettle time.Duration
	// FinishedTTL is how long a terminal claim is kept; zero keeps it.
	FinishedTTL time.Duration
	// Decide is the arbiter; a field so that tests can break it on purpose.
	Decide func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision
	// Metrics receives what happened; nil records nothing.
	Metrics *Metrics
	// Admission knows which admission policies are installed; nil: none.
	Admission *admissionPolicies

	// memory is what this manager remembers of the Leases (see leaseMemory).
	memory *leaseMemory
}

// foreignLeaseRecheck is how soon a lock whose grant Lease name is taken by
// someone else's Lease is looked at again: the cache holds only buildlock's
// Leases, so no event says when that one goes.
const foreignLeaseRecheck = time.Minute

// +kubebuilder:rbac:groups=buildlock.io,resources=buildlocks,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlocks/status,verbs=update
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlockpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=buildlock.io,resources=buildlockpolicies/status,verbs=update
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicybindings,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile decides one lock and applies the decision; a request named
// tokenFloorLease restores its namespace's token floor instead.
func (r *LockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name == tokenFloorLease {
		return r.retryOnRace(ctx, r.restoreTokenFloor(ctx, req.Namespace))
	}
	lock := arbiter.Lock{Namespace: req.Namespace, Target: req.Name}
	log := logf.FromContext(ctx).WithValues("target", lock.Target)
	ctx = logf.IntoContext(ctx, log)
	// The API stores times in microseconds; deciding on the same precision
	// keeps a decision's fixed point across a round trip.
	now := r.Clock.Now().Truncate(time.Microsecond)

	policy, err := r.lockPolicy(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Decide from the cache; the package comment says why that is safe:
	// a decision that changes the grant is a compare-and-swap on the Lease
	// it was computed from, and one that ends or starts a hold or ends a
	// claim without changing the grant is confirmed on live reads first.
	obs, err := r.observe(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	obs, decision, err := r.decideConfirmed(ctx, lock, obs, now, policy.arbiter)
	if err != nil {
		return r.retryOnRace(ctx, err)
	}
	var lease *coordinationv1.Lease
	if obs.foreign == nil {
		obs, decision, lease, err = r.applyGrant(ctx, lock, obs, decision, policy, now)
		if err != nil {
			r.Metrics.observeGrantWriteError(err)
			return r.retryOnRace(ctx, err)
		}
	}
	if obs.foreign != nil {
		return r.refuseForeignLease(ctx, lock, obs, now)
	}
	if !leaseCurrent(lock, lease, decision.Grant, policy.enforce) {
		// The Lease carries exactly the grant and the policy's enforcement:
		// an edit by someone else is undone (a compare-and-swap on what was
		// read), and an enforced lock always has a Lease (a free lock then
		// refuses every pipeline write).
		if lease, err = writeGrant(ctx, r.Client, r.memory, lock, lease, decision.Grant, policy.enforce, now); err != nil {
			return r.retryOnRace(ctx, err)
		}
	}
	r.rememberTokens(lock, obs, decision)
	if lease == nil {
		if err := r.keepTokenFloor(ctx, lock, obs); err != nil {
			return r.retryOnRace(ctx, err)
		}
	}
	if err := r.syncEnforcement(ctx, lock, &policy); err != nil {
		return r.retryOnRace(ctx, err)
	}

	if err := r.applyStatuses(ctx, obs, decision, now); err != nil {
		return r.retryOnRace(ctx, err)
	}
	r.Metrics.observeDecision(lock, obs, decision, now)
	if err := r.updatePolicyStatus(ctx, policy); err != nil {
		return r.retryOnRace(ctx, err)
	}

	next, err := r.deleteFinished(ctx, obs.claims, now)
	if err != nil {
		return r.retryOnRace(ctx, err)
	}
	if len(obs.claims) == 0 && policy.enforce == nil {
		// A lock nobody claims keeps its Lease for GrantRetention after its
		// last write, then lets it go (keeping the token floor).
		due, err := deleteIdleLease(ctx, r.Client, r.APIReader, r.memory, lease, r.GrantRetention, now)
		if err != nil {
			return r.retryOnRace(ctx, err)
		}
		next = earliest(next, due)
	}
	if obs.podErr != nil {
		// The decision was safe (an unknown pod counts as alive), but a pod
		// that ended may be hiding behind the error: look again, with the
		// workqueue's backoff.
		return ctrl.Result{}, obs.podErr
	}
	return ctrl.Result{RequeueAfter: untilEarliest(now, decision.NextLook, next)}, nil
}

// applyGrant writes the grant of a decision that changes it: a
// compare-and-swap on the Lease the decision was computed from. When the
// cache was behind the Lease, it decides again on live reads at once (rather
// than after a requeue, for a hand-off waits; see decideLive) and tries once
// more. It returns the observation and decision that stand, and the Lease as
// it is after the write.
func (r *LockReconciler) applyGrant(ctx context.Context, lock arbiter.Lock, obs observation, d arbiter.Decision, policy lockPolicy, now time.Time) (observation, arbiter.Decision, *coordinationv1.Lease, error) {
	if !d.GrantChanged {
		return obs, d, obs.lease, nil
	}
	lease, err := writeGrant(ctx, r.Client, r.memory, lock, obs.lease, d.Grant, policy.enforce, now)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		if obs, d, err = r.decideLive(ctx, lock, obs, now, policy.arbiter); err != nil || obs.foreign != nil {
			return obs, d, nil, err
		}
		lease = obs.lease
		if d.GrantChanged {
			lease, err = writeGrant(ctx, r.Client, r.memory, lock, obs.lease, d.Grant, policy.enforce, now)
		}
	}
	if err == nil && d.GrantChanged {
		log := logf.FromContext(ctx)
		log.V(1).Info("Recorded grant", "holder", d.Grant.Holder, "fencingToken", d.Grant.Token)
		if d.Repair != "" {
			// Someone deleted or edited the record: say so, once per repair.
			log.Info("Restored the grant record from the claims", "repair", d.Repair, "holder", d.Grant.Holder, "fencingToken", d.Grant.Token)
			r.Metrics.observeRepair(d.Repair)
		}
	}
	return obs, d, lease, err
}

// rememberTokens remembers the highest token the lock shows: its Lease's,
// its claims', and the decision's grant (written by now).
func (r *LockReconciler) rememberTokens(lock arbiter.Lock, obs observation, d arbiter.Decision) {
	highest := d.Grant.Token
	if obs.lease != nil && obs.lease.Spec.LeaseTransitions != nil {
		highest = max(highest, int64(*obs.lease.Spec.LeaseTransitions))
	}
	for i := range obs.claims {
		highest = max(highest, obs.claims[i].Status.FencingToken)
	}
	r.memory.observeToken(lock, highest)
}

// keepTokenFloor is for a lock left without a Lease (none was written, or
// someone deleted it while nothing was to be recorded): the namespace's
// token floor keeps the highest token this manager saw for it, so that a
// Lease created later never repeats a token; once the lock has no claims
// either, the manager forgets it. The floor was read live when the Lease
// was found missing; it is written only when it is lower.
func (r *LockReconciler) keepTokenFloor(ctx context.Context, lock arbiter.Lock, obs observation) error {
	if remembered := r.memory.highest(lock); remembered > obs.floor {
		floor, read, err := readTokenFloor(ctx, r.APIReader, lock.Namespace)
		if err != nil {
			return err
		}
		if err := raiseTokenFloor(ctx, r.Client, r.memory, lock.Namespace, read, floor, remembered); err != nil {
			return err
		}
	}
	if len(obs.claims) == 0 {
		r.memory.forget(lock)
	}
	return nil
}

// restoreTokenFloor raises the namespace's token floor Lease back to the
// highest floor this manager saw, after someone deleted or lowered it.
func (r *LockReconciler) restoreTokenFloor(ctx context.Context, namespace string) error {
	want := r.memory.floor(namespace)
	if want <= 0 {
		return nil
	}
	floor, read, err := readTokenFloor(ctx, r.APIReader, namespace)
	if err != nil || (read != nil && floor >= want) {
		return err
	}
	logf.FromContext(ctx).Info("Restoring the token floor", "namespace", namespace, "floor", want, "found", floor)
	return raiseTokenFloor(ctx, r.Client, r.memory, namespace, read, floor, want)
}

// refuseForeignLease is the decision for a lock whose grant Lease name is
// taken by a Lease buildlock did not create: nothing is granted, ended or
// written to that Lease; every claim still Pending says why, and the lock
// is looked at again in foreignLeaseRecheck (a create of the Lease would
// fail with AlreadyExists, so the lock must not be retried at once).
func (r *LockReconciler) refuseForeignLease(ctx context.Context, lock arbiter.Lock, obs observation, now time.Time) (ctrl.Result, error) {
	foreign := obs.foreign
	message := fmt.Sprintf("Lease %s/%s exists but was not created by buildlock (it has no label %s=%s): the lock of target %s "+
		"cannot be granted while it is there, and buildlock never takes it over. Delete that Lease, or claim another "+
		"target; until then this claim stays Pending.", foreign.Namespace, foreign.Name, managedByLabel, managedByValue, lock.Target)
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
	if err := r.applyStatuses(ctx, obs, d, now); err != nil {
		return r.retryOnRace(ctx, err)
	}
	logf.FromContext(ctx).V(1).Info("Not granting: the grant Lease's name is taken by a Lease of someone else's", "lease", foreign.Name)
	return ctrl.Result{RequeueAfter: foreignLeaseRecheck}, nil
}

// observe gathers one lock from the cache: its claims, its grant Lease, and
// what is known of its claims' pods (read live only when a pod changed since
// it was last read). Only a lock without a Lease reads something live on
// every reconcile: the namespace's token floor, which a new Lease's first
// token must be above.
func (r *LockReconciler) observe(ctx context.Context, lock arbiter.Lock) (observation, error) {
	claims, err := listClaims(ctx, r.Client, lock)
	if err != nil {
		return observation{}, err
	}
	return r.observeGrantAndPods(ctx, r.Client, lock, claims, nil)
}

// observeLive re-reads the lock's claims from the API server, and then the
// Lease. The grant must never be older than the claims it is decided with:
// a grant read before the claims would make a hold granted meanwhile (by
// another manager) look lost, and release a live holder with a status write
// that no compare-and-swap stops, since that decision changes no grant. The
// pods already observed are kept.
func (r *LockReconciler) observeLive(ctx context.Context, lock arbiter.Lock, cached observation) (observation, error) {
	claims, err := listClaims(ctx, r.APIReader, lock)
	if err != nil {
		return observation{}, err
	}
	return r.observeGrantAndPods(ctx, r.APIReader, lock, claims, cached.pods)
}

// observeGrantAndPods reads the Lease through reader (after the claims: see
// observeLive) and the claims' pods, at once.
func (r *LockReconciler) observeGrantAndPods(ctx context.Context, reader client.Reader, lock arbiter.Lock, claims []buildlockv1.BuildLock, knownPods map[string]arbiter.PodState) (observation, error) {
	var (
		obs      = observation{claims: claims}
		leaseErr error
		wg       sync.WaitGroup
	)
	wg.Go(func() {
		obs.lease, leaseErr = getLease(ctx, reader, lock)
		switch {
		case leaseErr != nil:
		case obs.lease != nil && !ownedLease(obs.lease):
			// Someone else's Lease has the grant Lease's name (only a live
			// read sees it: the cache holds buildlock's alone).
			obs.foreign, obs.lease = obs.lease, nil
		case obs.lease == nil:
			// A lock without a Lease issues tokens above the floor that
			// the namespace's deleted Leases left: read live, since no
			// compare-and-swap would catch a stale one.
			obs.floor, _, leaseErr = readTokenFloor(ctx, r.APIReader, lock.Namespace)
		}
	})
	obs.verifiedSince = r.Admission.requestersVerifiedSince(r.RequesterSettle)
	obs.pods, obs.podErr = r.observePods(ctx, claims, knownPods)
	wg.Wait()
	if leaseErr != nil {
		return observation{}, leaseErr
	}
	return obs, nil
}

// decideConfirmed decides the lock on the cached observation, and again on
// live reads (decideLive) when the decision is one that no compare-and-swap
// guards (needsLiveConfirmation) or that moves the grant off a holder the
// cached claims do not show (holderGone).
func (r *LockReconciler) decideConfirmed(ctx context.Context, lock arbiter.Lock, obs observation, now time.Time, policy arbiter.Policy) (observation, arbiter.Decision, error) {
	decision := r.decide(lock, obs, now, policy)
	// A record restored from the claims (rule 11) rests on their statuses,
	// which may be staler than the Lease (a holder deleted a moment ago
	// still shown Held), and so does one about to be restored while the
	// Lease is missing from the cache: decide it again on live reads.
	confirm := needsLiveConfirmation(decision) || decision.Repair != "" || (obs.lease == nil && showsHeld(obs.claims))
	if !confirm && decision.GrantChanged {
		gone, err := r.holderGone(ctx, lock, obs)
		if err != nil {
			return obs, decision, err
		}
		confirm = !gone
	}
	if !confirm {
		stale, err := r.expiryStale(ctx, lock, obs, decision)
		if err != nil {
			return obs, decision, err
		}
		confirm = stale
	}
	if !confirm {
		return obs, decision, nil
	}
	return r.decideLive(ctx, lock, obs, now, policy)
}

// decideLive observes the lock live (the claims, then the Lease) and decides
// again. A decision that changes the grant although the Lease names a
// holder the claims do not show must find that holder gone (holderGone):
// another manager may have created it and granted it the lock between the
// two reads. If it is not gone, decideLive returns a Conflict, so that the
// lock is decided again shortly.
func (r *LockReconciler) decideLive(ctx context.Context, lock arbiter.Lock, cached observation, now time.Time, policy arbiter.Policy) (observation, arbiter.Decision, error) {
	obs, err := r.observeLive(ctx, lock, cached)
	if err != nil || obs.foreign != nil {
		return obs, arbiter.Decision{}, err
	}
	decision := r.decide(lock, obs, now, policy)
	if decision.GrantChanged {
		gone, err := r.holderGone(ctx, lock, obs)
		if err != nil {
			return obs, decision, err
		}
		if !gone {
			return obs, decision, apierrors.NewConflict(coordinationv1.Resource("leases"), buildlockv1.GrantLeaseName(lock.Target),
				fmt.Errorf("the grant names BuildLock %s, which the claims listed before it do not show", *obs.lease.Spec.HolderIdentity))
		}
	}
	return obs, decision, nil
}

// holderGone reports whether the claim the observed Lease names as holder
// is gone (deleted, or replaced by another of its name): true at once when
// the Lease names none, or names one of the observed claims (the decision
// accounted for it); else it reads that claim live. A decision that frees
// or moves a grant because its holder is missing must not rest on claims
// older than the Lease: another manager may have granted the lock to a
// claim they do not show yet, whose pipeline may be deploying already (it
// starts when the Lease names it). The compare-and-swap on the Lease does
// not catch that, since the Lease itself is current; a claim that is gone
// never comes back with its UID, so a live NotFound settles it. One read by
// name: its cost does not grow with the namespace.
func (r *LockReconciler) holderGone(ctx context.Context, lock arbiter.Lock, obs observation) (bool, error) {
	if obs.lease == nil || obs.lease.Spec.HolderIdentity == nil {
		return true, nil
	}
	name, uid := buildlockv1.ParseGrantHolder(*obs.lease.Spec.HolderIdentity)
	if name == "" {
		return true, nil // a free lock written by hand or by another tool
	}
	for i := range obs.claims {
		if obs.claims[i].Name == name {
			if obs.claims[i].UID == uid {
				return true, nil
			}
			break
		}
	}
	var bl buildlockv1.BuildLock
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: name}, &bl)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading BuildLock %s/%s, which the grant of target %q names: %w", lock.Namespace, name, lock.Target, err)
	}
	return bl.UID != uid, nil
}

// expiryStale reports whether the decision ends a hold by expiry
// (ReasonExpired: a pod-less hold past its expiresAfter since its latest
// renewal) on a cached claim that is older than the API server's: a renewal
// the cache has not seen yet moves the hold's end, and neither the grant's
// compare-and-swap (the Lease is current) nor the claim's conditional status
// write (it comes after the grant moved) would catch it. It reads each such
// claim live by name; the other endings rest on what never goes back (a
// deleted claim, a finished pod, a force-release, the grant's acquire
// time), so they need no read.
func (r *LockReconciler) expiryStale(ctx context.Context, lock arbiter.Lock, obs observation, d arbiter.Decision) (bool, error) {
	for _, v := range d.Verdicts {
		if v.From != arbiter.Held || v.Phase != arbiter.Expired || v.Reason != arbiter.ReasonExpired {
			continue
		}
		i := slices.IndexFunc(obs.claims, func(bl buildlockv1.BuildLock) bool { return bl.Name == v.Name })
		if i < 0 {
			return true, nil
		}
		var live buildlockv1.BuildLock
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: v.Name}, &live)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, fmt.Errorf("reading BuildLock %s/%s, whose hold expires, live: %w", lock.Namespace, v.Name, err)
		case live.ResourceVersion != obs.claims[i].ResourceVersion:
			return true, nil
		}
	}
	return false, nil
}

// needsLiveConfirmation reports whether a decision taken on the cache must
// be taken again on live reads before it is applied: it starts or ends a
// hold, or ends a claim, without changing the grant. No compare-and-swap
// guards such a decision (statuses are conditional on the claim only, not on
// the grant), so a stale grant in the cache could otherwise release a live
// holder or end a claim the grant names.
func needsLiveConfirmation(d arbiter.Decision) bool {
	if d.GrantChanged {
		return false
	}
	for _, v := range d.Verdicts {
		if v.Reason == "" {
			continue
		}
		if (v.From == arbiter.Held) != (v.Phase == arbiter.Held) || (v.Phase.IsTerminal() && !v.From.IsTerminal()) {
			return true
		}
	}
	return false
}

// showsHeld reports whether a claim that has not ended shows Held.
func showsHeld(claims []buildlockv1.BuildLock) bool {
	return slices.ContainsFunc(claims, func(bl buildlockv1.BuildLock) bool { return bl.Status.Phase == buildlockv1.PhaseHeld })
}

func (r *LockReconciler) decide(lock arbiter.Lock, obs observation, now time.Time, policy arbiter.Policy) arbiter.Decision {
	claims, grant := arbiterInputs(obs, r.memory.highest(lock))
	r.Admission.unverify(claims)
	decide := r.Decide
	if decide == nil {
		decide = arbiter.Decide
	}
	return decide(lock, claims, grant, now, policy)
}

// applyStatuses writes every claim whose status the decision changes, in the
// decision's order: claims that stop holding first, the new holder last, so
// that no two claims show Held at once. Each write carries the
// resourceVersion of the object the decision was computed from. A write the
// API server refuses as invalid is written again without its message; if
// even that is refused, the claim is skipped, unless it stops holding (then,
// as on any other failure, the rest waits and the lock is decided again).
func (r *LockReconciler) applyStatuses(ctx context.Context, obs observation, d arbiter.Decision, now time.Time) error {
	log := logf.FromContext(ctx)
	byName := make(map[string]*buildlockv1.BuildLock, len(obs.claims))
	for i := range obs.claims {
		byName[obs.claims[i].Name] = &obs.claims[i]
	}
	for _, v := range d.Verdicts {
		bl, found := byName[v.Name]
		if !found {
			continue
		}
		if v.Warning != "" {
			r.Recorder.Eventf(bl, nil, "Warning", "MaxHoldApproaching", "Hold", "%s", truncate(v.Warning, maxEventNoteLength))
		}
		status, changed := desiredStatus(bl, v, d, now)
		if !changed {
			continue
		}
		updated := bl.DeepCopy()
		updated.Status = status
		err := r.Client.Status().Update(ctx, updated)
		if apierrors.IsInvalid(err) {
			log.Error(err, "Status refused as invalid; writing it without its message", "buildLock", bl.Name, "phase", v.Phase)
			updated.Status = fallbackStatus(status)
			err = r.Client.Status().Update(ctx, updated)
		}
		if err != nil {
			if apierrors.IsInvalid(err) && !stopsHolding(v) {
				log.Error(err, "Status refused as invalid; leaving this claim and applying the rest", "buildLock", bl.Name, "phase", v.Phase)
				continue
			}
			return fmt.Errorf("writing status of BuildLock %s/%s (%s): %w", bl.Namespace, bl.Name, v.Phase, err)
		}
		log.Info("Updated claim", "buildLock", bl.Name, "from", v.From, "phase", v.Phase, "reason", v.Reason, "fencingToken", status.FencingToken)
		if v.From != v.Phase {
			if recordsEvent(v.Phase) {
				r.Recorder.Eventf(bl, nil, eventType(v.Phase), eventReason(bl, v.Phase), string(v.Phase), "%s", truncate(v.Message, maxEventNoteLength))
			}
			r.Metrics.observeTransition(bl, v, now)
			if v.Phase == arbiter.Held && bl.Spec.Rollback != nil {
				r.Metrics.observeRollback(verifiedRequester(bl, obs.verifiedSince))
			}
		}
	}
	return nil
}

// stopsHolding reports whether the verdict ends a claim shown Held: until
// that is written, no other claim may be shown Held.
func stopsHolding(v arbiter.Verdict) bool {
	return v.From == arbiter.Held && v.Phase != arbiter.Held
}

// deleteFinished deletes terminal claims older than FinishedTTL (each delete
// conditional on the object being unchanged) and returns when the next one is
// due, or zero.
func (r *LockReconciler) deleteFinished(ctx context.Context, claims []buildlockv1.BuildLock, now time.Time) (time.Time, error) {
	if r.FinishedTTL <= 0 {
		return time.Time{}, nil
	}
	var next time.Time
	for i := range claims {
		bl := &claims[i]
		if !bl.Status.Phase.IsTerminal() || bl.Status.FinishedAt == nil || bl.DeletionTimestamp != nil {
			continue
		}
		due := bl.Status.FinishedAt.Add(r.FinishedTTL)
		if now.Before(due) {
			next = earliest(next, due)
			continue
		}
		err := r.Client.Delete(ctx, bl, client.Preconditions{UID: &bl.UID, ResourceVersion: &bl.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) {
			return next, fmt.Errorf("deleting finished BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
		}
		logf.FromContext(ctx).Info("Deleted finished claim", "buildLock", bl.Name, "phase", bl.Status.Phase, "finishedTTL", r.FinishedTTL)
	}
	return next, nil
}

// retryOnRace turns a lost race (Conflict, including a delete precondition
// that no longer holds, or AlreadyExists) into a quick re-decision; other errors go back to the
// workqueue's backoff.
func (r *LockReconciler) retryOnRace(ctx context.Context, err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		logf.FromContext(ctx).V(1).Info("Lost a write race; deciding again", "error", err.Error())
		return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
	}
	return ctrl.Result{}, err
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// untilEarliest is how long from now until the earliest non-zero instant, or
// zero (no requeue) when there is none.
func untilEarliest(now time.Time, instants ...time.Time) time.Duration {
	var at time.Time
	for _, t := range instants {
		at = earliest(at, t)
	}
	if at.IsZero() {
		return 0
	}
	if d := at.Sub(now); d > 0 {
		return d
	}
	return time.Millisecond
}

func eventType(p arbiter.Phase) string {
	if p == arbiter.Expired {
		return "Warning"
	}
	return "Normal"
}

// recordsEvent says whether a transition to phase p is recorded as an Event:
// the start and the end of a hold (and a waiter's end), the history of who
// deployed when. A claim that starts waiting or is superseded gets its
// status only, which says the same words for as long as the claim exists
// (an Event would cost the API server one more write on every new build,
// for a record that lives no longer).
func recordsEvent(p arbiter.Phase) bool {
	return p == arbiter.Held || p == arbiter.Released || p == arbiter.Expired
}

// eventReason names claim bl's transition to p for `kubectl get events`:
// Acquired (RolledBack for a rollback), Released or Expired.
func eventReason(bl *buildlockv1.BuildLock, p arbiter.Phase) string {
	switch {
	case p == arbiter.Held && bl.Spec.Rollback != nil:
		return eventRolledBack
	case p == arbiter.Held:
		return buildlockv1.ReasonAcquired
	}
	return string(p)
}

// eventRolledBack is the reason of the event of a rollback's grant: its
// note says which build of which line, with the rollback's reason.
const eventRolledBack = "RolledBack"
