package controller

import (
	"sync"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// handOffPriority is the priority of a request whose decision may hand a
// lock over, expire a hold or free a lock (an event of a claim shown Held,
// or of its pod; an edit of a grant Lease by someone else; a look again at
// a deadline or after a lost race). Such a request is served before every
// other, so that a hand-off never waits behind newcomers, a burst or a cold
// start. Any other request has priority zero.
const handOffPriority = 1

// newFairQueue returns the controller's workqueue: client-go's rate-limited,
// delaying queue (one worker per lock at a time, retries with backoff), whose
// pending locks are served hand-offs first (handOffPriority), then
// round-robin by namespace instead of first in, first out. A burst of
// thousands of claims in one namespace then delays a hand-off not at all,
// and a new claim in another namespace by at most one reconcile per busy
// namespace, not by the whole burst.
func newFairQueue(name string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	order := newRoundRobin()
	queue := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[reconcile.Request]{
		Name:  name,
		Queue: order,
	})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[reconcile.Request]{
		Name:  name,
		Queue: queue,
	})
	return &fairQueue{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(rateLimiter, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
			Name:          name,
			DelayingQueue: delaying,
		}),
		order: order,
	}
}

// fairQueue is the workqueue with controller-runtime's priority interface:
// the controller passes a reconcile's Result.Priority through it, and the
// event handlers (enqueueLocks) their requests' priorities.
type fairQueue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	order *roundRobin
}

var _ priorityqueue.PriorityQueue[reconcile.Request] = &fairQueue{}

// AddWithOpts adds items as o says; a positive priority puts them ahead of
// every request of priority zero when they enter the queue (at once, or
// after o.After or the rate limiter's delay), or at once if they are
// pending already.
func (q *fairQueue) AddWithOpts(o priorityqueue.AddOpts, items ...reconcile.Request) {
	for _, item := range items {
		if o.Priority != nil && *o.Priority > 0 {
			q.order.hurry(item)
		}
		switch {
		case o.RateLimited:
			q.AddRateLimited(item)
		case o.After > 0:
			q.AddAfter(item, o.After)
		default:
			q.Add(item)
		}
	}
}

// GetWithPriority is Get; the priority it reports is always zero (the
// controller only passes it back to AddWithOpts when the reconcile sets
// none).
func (q *fairQueue) GetWithPriority() (reconcile.Request, int, bool) {
	item, shutdown := q.Get()
	return item, 0, shutdown
}

// roundRobin is a workqueue.Queue: the hurried requests first, first in,
// first out; then a first-in, first-out list of requests per namespace, and
// the namespaces with pending requests served in turn. The workqueue calls
// Touch, Push, Len and Pop under its own lock, and never pushes a request
// that is already pending; hurry is called from outside, under the queue's
// own mutex.
type roundRobin struct {
	first   []reconcile.Request // the hurried requests, in the order they were pushed
	pending map[string][]reconcile.Request
	turns   []string // namespaces with pending requests, in the order they are served
	next    int      // index in turns of the namespace served next
	n       int

	mu      sync.Mutex
	hurried map[reconcile.Request]bool // requests to serve first when next pushed or touched
}

func newRoundRobin() *roundRobin {
	return &roundRobin{pending: map[string][]reconcile.Request{}, hurried: map[reconcile.Request]bool{}}
}

var _ workqueue.Queue[reconcile.Request] = &roundRobin{}

// hurry marks req to be served first from the next time it is pushed or
// touched.
func (q *roundRobin) hurry(req reconcile.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.hurried[req] = true
}

// takeHurried reports whether req is marked to be served first, and clears
// the mark.
func (q *roundRobin) takeHurried(req reconcile.Request) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.hurried[req] {
		return false
	}
	delete(q.hurried, req)
	return true
}

// Touch moves a pending request that is hurried to the end of the hurried
// ones, and keeps any other where it is.
func (q *roundRobin) Touch(req reconcile.Request) {
	if !q.takeHurried(req) {
		return
	}
	ns := req.Namespace
	list := q.pending[ns]
	for i := range list {
		if list[i] != req {
			continue
		}
		q.pending[ns] = append(list[:i], list[i+1:]...)
		if len(q.pending[ns]) == 0 {
			delete(q.pending, ns)
			q.dropTurn(ns)
		}
		q.first = append(q.first, req)
		return
	}
	// Already among the hurried ones: it keeps its place.
}

// dropTurn removes ns, which has no pending request left, from the turns.
func (q *roundRobin) dropTurn(ns string) {
	for i, other := range q.turns {
		if other == ns {
			q.turns = append(q.turns[:i], q.turns[i+1:]...)
			if i < q.next {
				q.next--
			}
			return
		}
	}
}

// Push appends a hurried request to the hurried ones, and any other to its
// namespace's list; a namespace with nothing pending takes its turn after
// every namespace that has.
func (q *roundRobin) Push(req reconcile.Request) {
	q.n++
	if q.takeHurried(req) {
		q.first = append(q.first, req)
		return
	}
	ns := req.Namespace
	if len(q.pending[ns]) == 0 {
		// Served after the namespaces already waiting: insert it just
		// before the one served next, which is the end of this round.
		q.turns = append(q.turns, "")
		copy(q.turns[q.next+1:], q.turns[q.next:])
		q.turns[q.next] = ns
		q.next++
	}
	q.pending[ns] = append(q.pending[ns], req)
}

// Len is how many requests are pending.
func (q *roundRobin) Len() int { return q.n }

// Pop returns the oldest hurried request, or else the oldest request of the
// namespace whose turn it is. The workqueue calls it only when Len is
// positive.
func (q *roundRobin) Pop() reconcile.Request {
	if len(q.first) > 0 {
		req := q.first[0]
		q.first[0] = reconcile.Request{}
		q.first = q.first[1:]
		q.n--
		return req
	}
	if q.next >= len(q.turns) {
		q.next = 0
	}
	ns := q.turns[q.next]
	list := q.pending[ns]
	req := list[0]
	q.n--
	if len(list) == 1 {
		delete(q.pending, ns)
		q.turns = append(q.turns[:q.next], q.turns[q.next+1:]...)
		return req
	}
	list[0] = reconcile.Request{}
	q.pending[ns] = list[1:]
	q.next++
	return req
}
