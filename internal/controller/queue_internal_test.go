package controller

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func request(ns string, k int) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("target-%d", k)}}
}

// TestABurstInOneNamespaceDoesNotDelayAnother is the case of the issue: 4,000
// claims in one namespace queue 2,000 locks; a hand-off in another namespace
// must come next, not after all of them.
func TestABurstInOneNamespaceDoesNotDelayAnother(t *testing.T) {
	q := newFairQueue("test", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	for k := range 2000 {
		q.Add(request("busy", k))
	}
	q.Add(request("quiet", 0))
	for pops := 1; ; pops++ {
		req, _ := q.Get()
		q.Done(req)
		if req.Namespace == "quiet" {
			if pops > 2 {
				t.Fatalf("the quiet namespace's lock came after %d others", pops-1)
			}
			return
		}
	}
}

// TestAHandOffComesFirst: a cold start or a burst queues 2,000 locks in the
// hand-off's own namespace; the hand-off's lock comes next, whether it was
// added with handOffPriority (an event of a holder), or was pending already
// when it was (the holder's pod ended), or comes back from a look again at a
// deadline; and the locks pending before keep their order.
func TestAHandOffComesFirst(t *testing.T) {
	for name, add := range map[string]func(q *fairQueue, req reconcile.Request){
		"added with priority": func(q *fairQueue, req reconcile.Request) {
			q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handOffPriority)}, req)
		},
		"pending already, then added with priority": func(q *fairQueue, req reconcile.Request) {
			q.Add(req)
			q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handOffPriority)}, req)
		},
		"a look again at a deadline": func(q *fairQueue, req reconcile.Request) {
			q.AddWithOpts(priorityqueue.AddOpts{After: time.Millisecond, Priority: ptr.To(handOffPriority)}, req)
			for q.Len() < 1001 {
				time.Sleep(time.Millisecond)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			q := newFairQueue("test", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]()).(*fairQueue)
			defer q.ShutDown()
			for k := range 1000 {
				q.Add(request("busy", k))
			}
			handOff := request("busy", 1000)
			add(q, handOff)
			for k := 1001; k < 2001; k++ {
				q.Add(request("busy", k))
			}
			if got, _, _ := q.GetWithPriority(); got != handOff {
				t.Fatalf("got %v first, want the hand-off's %v", got, handOff)
			}
			for k := range 2001 {
				if k == 1000 {
					continue
				}
				if got, _ := q.Get(); got != request("busy", k) {
					t.Fatalf("got %v, want %v", got, request("busy", k))
				}
			}
		})
	}
}

// TestRoundRobinProperties pushes and pops at random: nothing is lost or
// duplicated, each namespace's requests come in the order they were pushed,
// and a namespace with pending requests waits at most one turn of every
// other namespace.
func TestRoundRobinProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		q := newRoundRobin()
		pushed := map[string][]reconcile.Request{}
		popped := map[string]int{}
		waited := map[string]int{} // pops since the namespace was last served while pending
		bound := map[string]int{}  // the most namespaces pending during that wait
		seq := 0
		for range 500 {
			if q.Len() == 0 || r.IntN(3) > 0 {
				ns := fmt.Sprintf("ns-%d", r.IntN(6))
				req := request(ns, seq)
				seq++
				q.Push(req)
				pushed[ns] = append(pushed[ns], req)
				continue
			}
			pending := 0
			for ns, reqs := range pushed {
				if popped[ns] < len(reqs) {
					pending++
					waited[ns]++
				}
			}
			for ns := range waited {
				bound[ns] = max(bound[ns], pending)
			}
			req := q.Pop()
			ns := req.Namespace
			if want := pushed[ns][popped[ns]]; req != want {
				t.Fatalf("round %d: popped %v, want %v (first in, first out)", round, req, want)
			}
			popped[ns]++
			waited[ns], bound[ns] = 0, 0
			for other, n := range waited {
				if n > bound[other] {
					t.Fatalf("round %d: %s waited %d pops with at most %d namespaces pending", round, other, n, bound[other])
				}
			}
		}
		total := 0
		for ns, reqs := range pushed {
			total += len(reqs) - popped[ns]
		}
		if q.Len() != total {
			t.Fatalf("round %d: Len %d, want %d", round, q.Len(), total)
		}
	}
}
