package controller

import (
	"context"
	"slices"
	"strings"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// leaseMemory is what a manager remembers of the grant Leases while it
// runs: the highest fencing token it has seen for each lock and each
// namespace's token floor, so that a Lease a person deletes or edits never
// makes a token repeat (they are the arbiter's Grant.Floor, and what a
// deleted floor Lease is restored to); and the resourceVersion of its own
// last write of each Lease, so that the Lease watch passes on everybody
// else's writes and not its own.
//
// A nil memory remembers nothing. Entries go with what they describe: a lock's token once the lock has no
// Lease and no claim and the namespace's floor holds it, a write once its
// Lease is deleted. So the memory does not grow with throw-away targets.
type leaseMemory struct {
	mu     sync.Mutex
	tokens map[arbiter.Lock]int64
	floors map[string]int64
	// written holds the resourceVersions of this manager's latest writes
	// of each Lease (a few: the watch may deliver one after the next write).
	written map[types.NamespacedName][]string
}

// ownWritesKept is how many of its latest writes of one Lease a manager
// recognizes as its own.
const ownWritesKept = 4

func newLeaseMemory() *leaseMemory {
	return &leaseMemory{tokens: map[arbiter.Lock]int64{}, floors: map[string]int64{}, written: map[types.NamespacedName][]string{}}
}

// observe remembers the token of a grant Lease or of a token floor Lease
// (whatever its state, even a deleted one's last).
func (m *leaseMemory) observe(lease *coordinationv1.Lease) {
	if m == nil {
		return
	}
	if lease.Spec.LeaseTransitions == nil {
		return
	}
	token := int64(*lease.Spec.LeaseTransitions)
	m.mu.Lock()
	defer m.mu.Unlock()
	if lease.Name == tokenFloorLease {
		m.floors[lease.Namespace] = max(m.floors[lease.Namespace], token)
		return
	}
	if target, ok := leaseTarget(lease); ok {
		lock := arbiter.Lock{Namespace: lease.Namespace, Target: target}
		m.tokens[lock] = max(m.tokens[lock], token)
	}
}

// observeToken remembers that token was seen for lock.
func (m *leaseMemory) observeToken(lock arbiter.Lock, token int64) {
	if m == nil {
		return
	}
	if token <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tokens[lock] = max(m.tokens[lock], token)
}

// highest is the highest token seen for lock (0 if none).
func (m *leaseMemory) highest(lock arbiter.Lock) int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tokens[lock]
}

// floor is the highest token floor seen in namespace (0 if none).
func (m *leaseMemory) floor(namespace string) int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.floors[namespace]
}

// forget drops what is remembered of lock, once the namespace's floor
// holds its token.
func (m *leaseMemory) forget(lock arbiter.Lock) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.tokens, lock)
}

// wrote records this manager's write of lease (its resourceVersion after
// the write), and remembers its token.
func (m *leaseMemory) wrote(lease *coordinationv1.Lease) {
	if m == nil {
		return
	}
	m.observe(lease)
	m.mu.Lock()
	defer m.mu.Unlock()
	key := client.ObjectKeyFromObject(lease)
	recent := append(m.written[key], lease.ResourceVersion)
	m.written[key] = recent[max(0, len(recent)-ownWritesKept):]
}

// own reports whether lease is as this manager last wrote it.
func (m *leaseMemory) own(lease client.Object) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.written[client.ObjectKeyFromObject(lease)], lease.GetResourceVersion())
}

// deleted forgets this manager's write of a Lease that is gone.
func (m *leaseMemory) deleted(lease client.Object) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.written, client.ObjectKeyFromObject(lease))
}

// leaseTarget is the target whose grant Lease this is, by its name
// (buildlock-<target>): the name is what every reader goes by, whatever
// its labels say.
func leaseTarget(lease client.Object) (string, bool) {
	target, ok := strings.CutPrefix(lease.GetName(), buildlockv1.GrantLeaseName(""))
	return target, ok && target != ""
}

// leaseHandler maps the events of buildlock's Leases (the cache holds no
// others) to the requests that must follow them, and remembers their
// tokens: the Leases the cache lists when it starts (so that the Leases of
// locks nobody claims any more are cleaned up after a restart too), and
// every create, update and delete that this manager did not make, so that
// a grant Lease that was deleted or edited is restored at once and a token
// floor Lease that was deleted or lowered is raised again (the request
// named tokenFloorLease: no target has a dot). This manager's own writes
// need no new decision: the claims' events that led to them brought their
// lock here already.
func (r *LockReconciler) leaseHandler() handler.Funcs {
	mem := r.memory
	enqueue := func(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if obj.GetName() == tokenFloorLease {
			q.Add(lockRequest(obj.GetNamespace(), tokenFloorLease))
		} else if target, ok := leaseTarget(obj); ok {
			q.Add(lockRequest(obj.GetNamespace(), target))
		}
	}
	observe := func(obj client.Object) {
		if lease, ok := obj.(*coordinationv1.Lease); ok {
			mem.observe(lease)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.Object)
			if e.Object.GetName() == tokenFloorLease || mem.own(e.Object) {
				return
			}
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.ObjectOld)
			observe(e.ObjectNew)
			if !mem.own(e.ObjectNew) {
				enqueue(e.ObjectNew, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.Object)
			mem.deleted(e.Object)
			enqueue(e.Object, q)
		},
	}
}
