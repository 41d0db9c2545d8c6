package controller

import (
	"context"
	"fmt"
	"sync"

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
	lease  *coordinationv1.Lease // nil when the lock has no Lease (never granted, or cleaned up)
	// floor is the namespace's token floor, read only when lease is nil.
	floor int64
	pods  map[string]arbiter.PodState
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
	err := reader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: leaseName(lock.Target)}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading grant Lease for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return &lease, nil
}

// podMemo remembers the state of each pod the controller read live, with the
// resourceVersion it read: while the pod's metadata in the cache shows that
// same resourceVersion, the pod has not changed, and the state stands
// without another read. So a reconcile reads live only the pods that changed
// since (the one that finished), never every waiter's pod of a long queue.
type podMemo struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]podSeen
}

type podSeen struct {
	uid             types.UID
	resourceVersion string
	running         bool // Pending, Running or Unknown (false: Succeeded or Failed)
}

// maxPodMemo bounds the memo; past it, the memo starts over (and the next
// reconciles read their pods live again).
const maxPodMemo = 100_000

func (m *podMemo) get(key types.NamespacedName) (podSeen, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seen[key]
	return s, ok
}

func (m *podMemo) put(key types.NamespacedName, s podSeen) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil || len(m.seen) >= maxPodMemo {
		m.seen = map[types.NamespacedName]podSeen{}
	}
	m.seen[key] = s
}

func (m *podMemo) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.seen, key)
}

// observePods returns what is known of the pod of every claim that can
// still change and has a podRef: the state from known (this reconcile's
// earlier observation), else from the memo while the cache shows the pod
// unchanged since it was read, else read live. A pod counts as gone only
// when the API server says so (NotFound, or another UID); any other error
// leaves it unknown, which the arbiter treats as alive, and is returned so
// that the lock is decided again.
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
		if s, ok := r.rememberedPod(ctx, bl); ok {
			states[bl.Name] = s
			continue
		}
		toRead = append(toRead, bl)
	}
	// Read the changed pods at once rather than one round trip after
	// another, a few at a time: a burst of new claims on one target must not
	// become a burst of requests.
	reads := make([]read, len(toRead))
	slots := make(chan struct{}, maxConcurrentPodReads)
	var wg sync.WaitGroup
	for i, bl := range toRead {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			s, err := r.readPodState(ctx, bl)
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

// rememberedPod returns the state of the claim's pod from the memo, if the
// cache shows the very object (UID and resourceVersion) that was read live.
func (r *LockReconciler) rememberedPod(ctx context.Context, bl *buildlockv1.BuildLock) (arbiter.PodState, bool) {
	key := types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.PodRef.Name}
	seen, ok := r.pods.get(key)
	if !ok {
		return arbiter.PodUnknown, false
	}
	meta := podMetadata()
	if err := r.Client.Get(ctx, key, meta); err != nil || meta.UID != seen.uid || meta.ResourceVersion != seen.resourceVersion {
		return arbiter.PodUnknown, false
	}
	return podState(bl, seen.uid, seen.running), true
}

// readPodState reads the claim's pod live and remembers what it read.
func (r *LockReconciler) readPodState(ctx context.Context, bl *buildlockv1.BuildLock) (arbiter.PodState, error) {
	key := types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.PodRef.Name}
	var pod corev1.Pod
	err := r.APIReader.Get(ctx, key, &pod)
	switch {
	case apierrors.IsNotFound(err):
		r.pods.forget(key)
		return arbiter.PodGone, nil
	case err != nil:
		return arbiter.PodUnknown, fmt.Errorf("reading pod %s/%s of BuildLock %s: %w", bl.Namespace, bl.Spec.PodRef.Name, bl.Name, err)
	}
	running := pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
	r.pods.put(key, podSeen{uid: pod.UID, resourceVersion: pod.ResourceVersion, running: running})
	return podState(bl, pod.UID, running), nil
}

// podState is what a pod with uid, running or not, means for claim bl: gone
// when it is another pod than the one the claim names.
func podState(bl *buildlockv1.BuildLock, uid types.UID, running bool) arbiter.PodState {
	switch {
	case bl.Spec.PodRef.UID != "" && string(uid) != bl.Spec.PodRef.UID:
		return arbiter.PodGone
	case !running:
		return arbiter.PodFinished
	}
	return arbiter.PodAlive
}

// arbiterInputs converts an observation into the arbiter's plain inputs.
func arbiterInputs(obs observation) ([]arbiter.Claim, arbiter.Grant) {
	claims := make([]arbiter.Claim, 0, len(obs.claims))
	for i := range obs.claims {
		claims = append(claims, toArbiterClaim(&obs.claims[i], obs.pods))
	}
	return claims, grantFromLease(obs.lease, obs.floor)
}

func toArbiterClaim(bl *buildlockv1.BuildLock, pods map[string]arbiter.PodState) arbiter.Claim {
	c := arbiter.Claim{
		Name:         bl.Name,
		UID:          string(bl.UID),
		Repo:         bl.Spec.Repo,
		Branch:       bl.Spec.Branch,
		Build:        bl.Spec.Build,
		Created:      bl.CreationTimestamp.Time,
		Phase:        arbiter.Phase(bl.Status.Phase),
		FencingToken: bl.Status.FencingToken,
		Pod:          arbiter.NoPod,
		ExpiresAfter: buildlockv1.DefaultExpiresAfter,
		ForceRelease: bl.Annotations[buildlockv1.ForceReleaseAnnotation],
		Writer:       writerOf(bl),
	}
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
