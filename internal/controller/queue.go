package controller

import (
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// newFairQueue returns the controller's workqueue: client-go's rate-limited,
// delaying queue (one worker per lock at a time, retries with backoff), whose
// pending locks are served round-robin by namespace instead of first in,
// first out. A burst of thousands of claims in one namespace then delays a
// hand-off in another namespace by at most one reconcile per busy
// namespace, not by the whole burst.
func newFairQueue(name string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	queue := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[reconcile.Request]{
		Name:  name,
		Queue: &roundRobin{pending: map[string][]reconcile.Request{}},
	})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[reconcile.Request]{
		Name:  name,
		Queue: queue,
	})
	return workqueue.NewTypedRateLimitingQueueWithConfig(rateLimiter, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
		Name:          name,
		DelayingQueue: delaying,
	})
}

// roundRobin is a workqueue.Queue: a first-in, first-out list of requests per
// namespace, and the namespaces with pending requests served in turn. The
// workqueue calls it under its own lock, and never pushes a request that is
// already pending.
type roundRobin struct {
	pending map[string][]reconcile.Request
	turns   []string // namespaces with pending requests, in the order they are served
	next    int      // index in turns of the namespace served next
	n       int
}

var _ workqueue.Queue[reconcile.Request] = &roundRobin{}

// Touch keeps a request that is added again where it is.
func (q *roundRobin) Touch(reconcile.Request) {}

// Push appends a request to its namespace's list; a namespace with nothing
// pending takes its turn after every namespace that has.
func (q *roundRobin) Push(req reconcile.Request) {
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
	q.n++
}

// Len is how many requests are pending.
func (q *roundRobin) Len() int { return q.n }

// Pop returns the oldest request of the namespace whose turn it is. The
// workqueue calls it only when Len is positive.
func (q *roundRobin) Pop() reconcile.Request {
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
