package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/controller/grant"
	"github.com/buildlock/buildlock/internal/controller/policy"
)

// podRefField indexes BuildLocks by spec.podRef.name, to map pod events to
// the locks they concern. (They are indexed by buildlockv1.TargetField too,
// a selectable field of the CRD, so that one MatchingFields lists a lock's
// claims from the cache and from the API server alike.)
const podRefField = "spec.podRef.name"

// maxConcurrentPodReads bounds the live pod reads of one reconcile.
const maxConcurrentPodReads = 8

// observation is what one reconcile saw of one lock: its policy, its
// claims, its grant record, and what is known of each claim's pod.
type observation struct {
	// policy is how the lock is arbitrated, read from the cache once per
	// reconcile.
	policy policy.Applied
	claims []buildlockv1.BuildLock
	lease  *coordinationv1.Lease // nil when the lock has no Lease (never granted, cleaned up, or deleted)
	// foreign is set when the Lease named like the lock's grant Lease is
	// not buildlock's (grant.Owned): lease is then nil, and the lock cannot
	// be granted.
	foreign *coordinationv1.Lease
	// floor is the namespace's token floor, read live only when lease is
	// nil; floorRead is that read (its Lease, nil if there is none), from
	// which the grant's reservation starts (grant.Reserve). A Lease that
	// this manager did not write has the floor noted in the memory
	// instead (observer.noteLockFloor).
	floor     int64
	floorRead *grant.FloorRead
	// verifiedSince is when claims' spec.requester became the API
	// server's word (zero: it is not; see admission.Policies.RequestersVerifiedSince).
	verifiedSince time.Time
	pods          map[string]arbiter.PodState
	// podErr is the first error reading a pod: that pod is unknown (alive to
	// the arbiter), and the lock must be looked at again once it can be read.
	podErr error
	// live says the claims and the Lease were read from the API server, in
	// that order (observer.live), not from the cache.
	live bool
	// holderDeleted says this manager's informer saw the claim the Lease
	// names as holder (its UID) deleted: a fact (see liveReadsFor).
	holderDeleted bool
}

// observer gathers one lock's observation.
type observer struct {
	// cache reads the claims, the Lease, the policy and the pods from the
	// manager's cache.
	cache client.Reader
	// apiReader reads live from the API server.
	apiReader client.Reader
	// admission knows which admission policies are installed; nil: none.
	admission *admission.Policies
	// requesterSettle: see Options.RequesterSettle.
	requesterSettle time.Duration
	// defaults is how a lock is arbitrated where its policy is silent.
	defaults arbiter.Policy
	// deleted are the claims this manager's informer saw deleted.
	deleted *deletions
	// memory holds this manager's latest grant writes, which the cache
	// may not show yet (grant.Memory.Fresher).
	memory *grant.Memory
	// own holds this manager's latest status writes, which the cache may
	// not show yet.
	own *ownStatuses
}

// deletionMemory is how many deleted claims a manager remembers: a hand-off
// follows its holder's deletion by a reconcile, so the latest thousands are
// all that a decision can ask about.
const deletionMemory = 20000

// deletions are the UIDs of the claims this manager's informer saw deleted,
// the latest deletionMemory of them. A claim that is gone never comes back
// with its UID, so a grant that names one needs no live read to know that
// its holder is gone (liveReadsFor).
type deletions struct {
	mu    sync.Mutex
	seen  map[types.UID]bool
	order []types.UID // ring of the UIDs in seen, oldest at next
	next  int
}

func newDeletions() *deletions { return &deletions{seen: map[types.UID]bool{}} }

// add remembers that the claim with uid was deleted, forgetting the oldest
// beyond deletionMemory.
func (d *deletions) add(uid types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if uid == "" || d.seen[uid] {
		return
	}
	if len(d.order) < deletionMemory {
		d.order = append(d.order, uid)
	} else {
		delete(d.seen, d.order[d.next])
		d.order[d.next] = uid
		d.next = (d.next + 1) % deletionMemory
	}
	d.seen[uid] = true
}

// has reports whether the claim with uid was seen deleted.
func (d *deletions) has(uid types.UID) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[uid]
}

// cached gathers one lock from the cache at now: its policy, its claims
// and its grant Lease (each as this manager last wrote it, when the cache
// does not show that write yet), and what is known of its claims' pods (read live
// only when the cache cannot tell for sure that a pod is there). Only a
// lock without a Lease reads something live on every reconcile: the
// namespace's token floor, which a new Lease's first token must be above;
// or, when a Lease of somebody else's took its grant Lease's name, that
// Lease, which the cache does not hold.
func (o observer) cached(ctx context.Context, lock arbiter.Lock, now time.Time) (observation, error) {
	applied, err := policy.Read(ctx, o.cache, lock, o.defaults)
	if err != nil {
		return observation{}, err
	}
	claims, err := listClaims(ctx, o.cache, lock)
	if err != nil {
		return observation{}, err
	}
	o.own.fresher(claims, now)
	return o.leaseAndPods(ctx, cachedLeases{o.cache, o.memory, now}, false, lock, applied, claims, nil)
}

// cachedLeases reads through the cache, and a grant Lease as this
// manager's memory knows it when that is fresher (grant.Memory.Fresher):
// a decision rests on the Lease's compare-and-swap either way, and one on
// the version before this manager's own write would only lose it.
type cachedLeases struct {
	client.Reader
	memory *grant.Memory
	now    time.Time
}

// Get reads obj through the cache; a grant Lease this manager wrote since
// the cache's version is the written one.
func (c cachedLeases) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := c.Reader.Get(ctx, key, obj, opts...)
	lease, isLease := obj.(*coordinationv1.Lease)
	if !isLease || err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	var cached *coordinationv1.Lease
	if err == nil {
		cached = lease
	}
	fresher := c.memory.Fresher(key, cached, c.now)
	if fresher == nil || fresher == cached {
		return err
	}
	fresher.DeepCopyInto(lease)
	return nil
}

// live observes the lock again from the API server: the claims, and then
// the Lease (the order the stale-read rule relies on: see liveReadsFor).
// The policy and the pods already observed are kept.
func (o observer) live(ctx context.Context, lock arbiter.Lock, cached observation) (observation, error) {
	claims, err := listClaims(ctx, o.apiReader, lock)
	if err != nil {
		return observation{}, err
	}
	obs, err := o.leaseAndPods(ctx, o.apiReader, true, lock, cached.policy, claims, cached.pods)
	obs.live = true
	return obs, err
}

// leaseAndPods reads the Lease through reader (live says it is the API
// server's), and the claims' pods, at once.
func (o observer) leaseAndPods(ctx context.Context, reader client.Reader, live bool, lock arbiter.Lock, applied policy.Applied, claims []buildlockv1.BuildLock, knownPods map[string]arbiter.PodState) (observation, error) {
	var (
		obs      = observation{policy: applied, claims: claims}
		leaseErr error
		wg       sync.WaitGroup
	)
	wg.Go(func() {
		obs.lease, leaseErr = grant.Get(ctx, reader, lock)
		if leaseErr == nil && obs.lease == nil && !live && o.memory.Foreign(lock) != nil {
			// The cache holds buildlock's Leases alone: whether the Lease
			// of somebody else's found under the grant Lease's name is still
			// there, only a live read tells (not a create that would fail).
			reader, live = o.apiReader, true
			obs.lease, leaseErr = grant.Get(ctx, reader, lock)
		}
		if obs.lease != nil && obs.lease.Spec.HolderIdentity != nil {
			_, uid := buildlockv1.ParseGrantHolder(*obs.lease.Spec.HolderIdentity)
			obs.holderDeleted = o.deleted.has(uid)
		}
		switch {
		case leaseErr != nil:
		case obs.lease != nil && !grant.Owned(obs.lease):
			// Someone else's Lease has the grant Lease's name (only a live
			// read sees it: the cache holds buildlock's alone).
			obs.foreign, obs.lease = obs.lease, nil
			o.memory.NoteForeign(lock, obs.foreign)
		case obs.lease == nil:
			if live {
				o.memory.NoteForeign(lock, nil)
			}
			// A lock without a Lease issues tokens above the namespace's
			// token floor, which holds every token issued there
			// (grant.Reserve), and goes on above it once it has one.
			var floorLease *coordinationv1.Lease
			obs.floor, floorLease, leaseErr = grant.ReadTokenFloor(ctx, o.apiReader, lock.Namespace)
			obs.floorRead = &grant.FloorRead{Token: obs.floor, Lease: floorLease}
			if leaseErr == nil {
				o.memory.NoteLockFloor(lock, "", obs.floor)
			}
		default:
			if live {
				o.memory.NoteForeign(lock, nil)
			}
			leaseErr = o.noteLockFloor(ctx, reader, lock, obs.lease)
		}
	})
	obs.verifiedSince = o.admission.RequestersVerifiedSince(o.requesterSettle)
	obs.pods, obs.podErr = o.pods(ctx, claims, knownPods)
	wg.Wait()
	if leaseErr != nil {
		return observation{}, leaseErr
	}
	return obs, nil
}

// noteLockFloor keeps tokens from going back after an edit of the grant
// Lease that this manager did not see whole (docs/reliability.md, bug 15).
// For a version of the lock's Lease that this manager did not write (a
// person's edit, another manager's write, or any version found before
// this manager wrote one: after a start), it notes the namespace's token
// floor, read through reader (the reader that read lease: live, or the
// cache, whose floor comes from the same watch in etcd's order), in the
// memory, once per version: every token the lock issued before that
// version is at most that floor (grant.Reserve raises it first), however
// the version changed the Lease's token, and the lock's next token goes
// above it (the arbiter's Grant.Reserved). A version this manager wrote
// reads nothing: its memory has every token since the floor it noted. So
// hand-offs read nothing more, and tokens jump above the floor once per
// lock after a start, and once after each write of somebody else's.
func (o observer) noteLockFloor(ctx context.Context, reader client.Reader, lock arbiter.Lock, lease *coordinationv1.Lease) error {
	if o.memory.Own(lease) || o.memory.LockFloorKnown(lock, lease.ResourceVersion) {
		return nil
	}
	floor, _, err := grant.ReadTokenFloor(ctx, reader, lock.Namespace)
	if err != nil {
		return err
	}
	o.memory.NoteLockFloor(lock, lease.ResourceVersion, max(floor, o.memory.Floor(lock.Namespace)))
	return nil
}

// listClaims lists the BuildLocks of one lock through reader (the cache, or
// the API server when the read must be live).
func listClaims(ctx context.Context, reader client.Reader, lock arbiter.Lock) ([]buildlockv1.BuildLock, error) {
	var list buildlockv1.BuildLockList
	if err := reader.List(ctx, &list, client.InNamespace(lock.Namespace), client.MatchingFields{buildlockv1.TargetField: lock.Target}); err != nil {
		return nil, fmt.Errorf("listing BuildLocks for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return list.Items, nil
}

// pods returns what is known of the pod of every claim that can
// still change and has a podRef: the state from known (this reconcile's
// earlier observation), else from the cache when it is certain there (a
// pod of the claim's UID, running or finished: a pod never leaves
// Succeeded or Failed, and a stale Running counts as alive anyway), else
// read live: a pod counts as gone only when the API server says so
// (NotFound, or another UID). Any other error leaves it unknown, which the
// arbiter treats as alive, and is returned so that the lock is decided
// again.
func (o observer) pods(ctx context.Context, claims []buildlockv1.BuildLock, known map[string]arbiter.PodState) (map[string]arbiter.PodState, error) {
	type read struct {
		claim string
		state arbiter.PodState
		err   error
	}
	states := make(map[string]arbiter.PodState, len(claims))
	var toRead []*buildlockv1.BuildLock
	for i := range claims {
		bl := &claims[i]
		if bl.Spec.PodRef == nil || bl.Status.Phase.IsTerminal() {
			continue
		}
		if s, ok := known[bl.Name]; ok && s != arbiter.PodUnknown {
			states[bl.Name] = s
			continue
		}
		if s, ok := o.cachedPodState(ctx, bl); ok {
			states[bl.Name] = s
			continue
		}
		toRead = append(toRead, bl)
	}
	// Read the rest at once rather than one round trip after another, a few
	// at a time: a burst of new claims on one target must not become a
	// burst of requests.
	reads := make([]read, len(toRead))
	slots := make(chan struct{}, maxConcurrentPodReads)
	var wg sync.WaitGroup
	for i, bl := range toRead {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			s, err := readPodState(ctx, o.apiReader, bl)
			reads[i] = read{claim: bl.Name, state: s, err: err}
		})
	}
	wg.Wait()
	var firstErr error
	for _, rd := range reads {
		states[rd.claim] = rd.state
		if rd.err != nil && firstErr == nil {
			firstErr = rd.err
		}
	}
	return states, firstErr
}

// cachedPodState returns the state of the claim's pod from the cache when
// the cache is certain of it: the pod is there, with the claim's UID (or the
// claim names no UID).
func (o observer) cachedPodState(ctx context.Context, bl *buildlockv1.BuildLock) (arbiter.PodState, bool) {
	var pod corev1.Pod
	if err := o.cache.Get(ctx, types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.PodRef.Name}, &pod); err != nil {
		return arbiter.PodUnknown, false
	}
	if s := podState(bl, &pod); s != arbiter.PodGone {
		return s, true
	}
	return arbiter.PodUnknown, false
}

func readPodState(ctx context.Context, reader client.Reader, bl *buildlockv1.BuildLock) (arbiter.PodState, error) {
	var pod corev1.Pod
	err := reader.Get(ctx, types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.PodRef.Name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return arbiter.PodGone, nil
	case err != nil:
		return arbiter.PodUnknown, fmt.Errorf("reading pod %s/%s of BuildLock %s: %w", bl.Namespace, bl.Spec.PodRef.Name, bl.Name, err)
	}
	return podState(bl, &pod), nil
}

// podState is what pod means for claim bl: gone when it is another pod than
// the one the claim names, finished when it Succeeded or Failed.
func podState(bl *buildlockv1.BuildLock, pod *corev1.Pod) arbiter.PodState {
	switch {
	case bl.Spec.PodRef.UID != "" && string(pod.UID) != bl.Spec.PodRef.UID:
		return arbiter.PodGone
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return arbiter.PodFinished
	}
	return arbiter.PodAlive
}

// verifiedRequester is the claim's spec.requester's user name, and whether
// it is a CI identity, when the API server vouches for it (the claim was
// created after verifiedSince, non-zero), else "".
func verifiedRequester(bl *buildlockv1.BuildLock, verifiedSince time.Time) (identity string, ci bool) {
	if r := bl.Spec.Requester; r != nil && !verifiedSince.IsZero() && bl.CreationTimestamp.After(verifiedSince) {
		return r.Username, r.Repository != ""
	}
	return "", false
}

// arbiterInputs converts an observation into the arbiter's plain inputs;
// remembered is the highest token this manager has seen for the lock (the
// grant's Floor); the namespace's token floor, read when the Lease is
// missing, or noted (lockFloor) when a version of it that this manager did
// not write was found, bounds every token the lock issued before (the
// grant's Reserved).
func arbiterInputs(obs observation, remembered, lockFloor int64) ([]arbiter.Claim, arbiter.Grant) {
	claims := make([]arbiter.Claim, 0, len(obs.claims))
	for i := range obs.claims {
		claims = append(claims, toArbiterClaim(&obs.claims[i], obs.pods, obs.verifiedSince))
	}
	g := grant.FromLease(obs.lease)
	g.Floor, g.Reserved = remembered, max(obs.floor, lockFloor)
	return claims, g
}

// toArbiterClaim is what the arbiter sees of claim bl: its spec, its
// status, what is known of its pod, and its requester as its Identity when
// the claim was created after verifiedSince (non-zero).
func toArbiterClaim(bl *buildlockv1.BuildLock, pods map[string]arbiter.PodState, verifiedSince time.Time) arbiter.Claim {
	c := arbiter.Claim{
		Name:         bl.Name,
		UID:          string(bl.UID),
		Repo:         bl.Spec.Repo,
		Branch:       bl.Spec.Branch,
		Workflow:     bl.Spec.Workflow,
		Build:        bl.Spec.Build,
		Created:      bl.CreationTimestamp.Time,
		Phase:        arbiter.Phase(bl.Status.Phase),
		FencingToken: bl.Status.FencingToken,
		Pod:          arbiter.NoPod,
		ExpiresAfter: buildlockv1.DefaultExpiresAfter,
		ForceRelease: bl.Annotations[buildlockv1.ForceReleaseAnnotation],
		// Verified only with the policies that stamp it (admission.Policies.Unverify).
		ForceReleasedBy: bl.Annotations[buildlockv1.ForceReleasedByAnnotation],
		Writer:          grant.WriterOf(bl),
		Deleting:        bl.DeletionTimestamp != nil,
	}
	if bl.Status.AcquiredAt != nil {
		c.AcquiredAt = bl.Status.AcquiredAt.Time
	}
	if r := bl.Spec.Rollback; r != nil {
		c.Rollback, c.RollbackReason = true, r.Reason
	}
	c.Override = overrideOf(bl)
	c.Identity, c.CIIdentity = verifiedRequester(bl, verifiedSince)
	// A workflow is verified when the verified CI identity's token named it
	// (the claim-identity policy refuses any other spec.workflow).
	c.WorkflowVerified = c.CIIdentity && bl.Spec.Workflow != "" && bl.Spec.Requester.Workflow == bl.Spec.Workflow
	if bl.Spec.Timestamp != nil {
		c.Timestamp = bl.Spec.Timestamp.Time
	}
	if bl.Spec.ExpiresAfter != nil {
		c.ExpiresAfter = bl.Spec.ExpiresAfter.Duration
	}
	if bl.Status.RenewedAt != nil {
		c.RenewedAt = bl.Status.RenewedAt.Time
	}
	// A renewal the status does not account for yet: renewTime is the only
	// spec field that changes, so a generation the status has not observed
	// means a renewal it has not recorded.
	if bl.Spec.RenewTime != nil && (bl.Status.RenewedAt == nil || bl.Generation != bl.Status.ObservedGeneration) {
		c.RenewTime = bl.Spec.RenewTime.Time
	}
	if bl.Status.QueuedAt != nil {
		c.QueuedAt = bl.Status.QueuedAt.Time
	}
	if bl.Spec.PodRef != nil {
		c.Pod = arbiter.PodUnknown
		if s, ok := pods[bl.Name]; ok {
			c.Pod = s
		}
	}
	return c
}

// overrideOf is claim bl's override (its buildlock.io/override
// annotations); the zero Override when it has none. An expiry that is not
// an RFC 3339 time is zero, which voids the override.
func overrideOf(bl *buildlockv1.BuildLock) arbiter.Override {
	reason := bl.Annotations[buildlockv1.OverrideAnnotation]
	if reason == "" {
		return arbiter.Override{}
	}
	// Verified only with the policies that stamp it (admission.Policies.Unverify).
	o := arbiter.Override{Reason: reason, By: bl.Annotations[buildlockv1.OverriddenByAnnotation]}
	if t, err := time.Parse(time.RFC3339, bl.Annotations[buildlockv1.OverrideExpiresAnnotation]); err == nil {
		o.Expires = t
	}
	return o
}
