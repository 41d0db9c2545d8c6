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
)

// targetField indexes BuildLocks by spec.target. The same name is a
// selectable field of the CRD, so one MatchingFields works against both the
// cache and the API server.
const targetField = "spec.target"

// podRefField indexes BuildLocks by spec.podRef.name, to map pod events to
// the locks they concern.
const podRefField = "spec.podRef.name"

// maxConcurrentPodReads bounds the live pod reads of one reconcile.
const maxConcurrentPodReads = 8

// observation is what one reconcile saw of one lock: the claims, the grant
// record, and what is known of each claim's pod.
type observation struct {
	claims []buildlockv1.BuildLock
	lease  *coordinationv1.Lease // nil when the lock has no Lease (never granted, cleaned up, or deleted)
	// foreign is set when the Lease named like the lock's grant Lease is
	// not buildlock's (ownedLease): lease is then nil, and the lock cannot
	// be granted.
	foreign *coordinationv1.Lease
	// floor is the namespace's token floor, read only when lease is nil.
	floor int64
	// verifiedSince is when claims' spec.requester became the API
	// server's word (zero: it is not; see admissionPolicies.requestersVerifiedSince).
	verifiedSince time.Time
	pods          map[string]arbiter.PodState
	// podErr is the first error reading a pod: that pod is unknown (alive to
	// the arbiter), and the lock must be looked at again once it can be read.
	podErr error
}

// listClaims lists the BuildLocks of one lock through reader (the cache, or
// the API server when the read must be live).
func listClaims(ctx context.Context, reader client.Reader, lock arbiter.Lock) ([]buildlockv1.BuildLock, error) {
	var list buildlockv1.BuildLockList
	if err := reader.List(ctx, &list, client.InNamespace(lock.Namespace), client.MatchingFields{targetField: lock.Target}); err != nil {
		return nil, fmt.Errorf("listing BuildLocks for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return list.Items, nil
}

// getLease reads the lock's grant record live; nil when it does not exist.
func getLease(ctx context.Context, reader client.Reader, lock arbiter.Lock) (*coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := reader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: buildlockv1.GrantLeaseName(lock.Target)}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading grant Lease for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return &lease, nil
}

// observePods returns what is known of the pod of every claim that can
// still change and has a podRef: the state from known (this reconcile's
// earlier observation), else from the cache when it is certain there (a
// pod of the claim's UID, running or finished: a pod never leaves
// Succeeded or Failed, and a stale Running counts as alive anyway), else
// read live: a pod counts as gone only when the API server says so
// (NotFound, or another UID). Any other error leaves it unknown, which the
// arbiter treats as alive, and is returned so that the lock is decided
// again.
func (r *LockReconciler) observePods(ctx context.Context, claims []buildlockv1.BuildLock, known map[string]arbiter.PodState) (map[string]arbiter.PodState, error) {
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
		if s, ok := r.cachedPodState(ctx, bl); ok {
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
			s, err := readPodState(ctx, r.APIReader, bl)
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
func (r *LockReconciler) cachedPodState(ctx context.Context, bl *buildlockv1.BuildLock) (arbiter.PodState, bool) {
	var pod corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.PodRef.Name}, &pod); err != nil {
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

// verifiedRequester is the claim's spec.requester's user name when the API
// server vouches for it (the claim was created after verifiedSince,
// non-zero), else "".
func verifiedRequester(bl *buildlockv1.BuildLock, verifiedSince time.Time) string {
	if r := bl.Spec.Requester; r != nil && !verifiedSince.IsZero() && bl.CreationTimestamp.After(verifiedSince) {
		return r.Username
	}
	return ""
}

// arbiterInputs converts an observation into the arbiter's plain inputs;
// remembered is the highest token this manager has seen for the lock, which
// with the namespace's floor makes the grant's Floor.
func arbiterInputs(obs observation, remembered int64) ([]arbiter.Claim, arbiter.Grant) {
	claims := make([]arbiter.Claim, 0, len(obs.claims))
	for i := range obs.claims {
		claims = append(claims, toArbiterClaim(&obs.claims[i], obs.pods, obs.verifiedSince))
	}
	grant := grantFromLease(obs.lease)
	grant.Floor = max(obs.floor, remembered)
	return claims, grant
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
		// Verified only with the policies that stamp it (admissionPolicies.unverify).
		ForceReleasedBy: bl.Annotations[buildlockv1.ForceReleasedByAnnotation],
		Writer:          writerOf(bl),
		Deleting:        bl.DeletionTimestamp != nil,
	}
	if bl.Status.AcquiredAt != nil {
		c.AcquiredAt = bl.Status.AcquiredAt.Time
	}
	if r := bl.Spec.Rollback; r != nil {
		c.Rollback, c.RollbackReason = true, r.Reason
	}
	c.Identity = verifiedRequester(bl, verifiedSince)
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
