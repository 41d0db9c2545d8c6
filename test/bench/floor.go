//go:build bench

package bench

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// floorRun is the floor of the real kinds, measured in one run: a BuildLock's
// create until a watcher sees it (the floor of an acquire), its delete until
// a watcher sees it, and a grant Lease's update until a watcher sees it. The
// two-hop floor is the physical limit of any central arbiter's hand-off: the
// release reaches the arbiter (a delete and a watch delivery), and the
// arbiter's grant reaches the next holder (a Lease update and a watch
// delivery). Sample i of twoHop is cycle i's delete plus its Lease update.
type floorRun struct {
	create, del, lease, twoHop []time.Duration
}

// seenEvent is one watch event as the floor's watcher saw it.
type seenEvent struct {
	typ watch.EventType
	obj client.Object
	at  time.Time
}

// twoHopFloor measures floorRun. Each claim names a pod that does not exist,
// so that the operator settles it at once (Released) and its delete, when
// the operator is idle again, costs the operator no write: the hops are
// measured as a contender sees them, with the operator watching but not
// competing. The Lease carries buildlock's label, so that the operator's
// informer receives it as it receives a grant Lease.
func (b *bench) twoHopFloor(n int) (floorRun, error) {
	var r floorRun
	ns := b.namespace("floor-two-hop")
	events := make(chan seenEvent, 1024)
	on := func(typ watch.EventType, obj client.Object, at time.Time) { events <- seenEvent{typ, obj, at} }
	if err := watchNamespace(b.ctx, b.c, &buildlockv1.BuildLockList{}, ns, on); err != nil {
		return r, err
	}
	if err := watchNamespace(b.ctx, b.c, &coordinationv1.LeaseList{}, ns, on); err != nil {
		return r, err
	}
	await := func(what string, match func(seenEvent) bool) (time.Time, error) {
		timeout := time.After(waitLimit)
		for {
			select {
			case ev := <-events:
				if match(ev) {
					return ev.at, nil
				}
			case <-timeout:
				return time.Time{}, fmt.Errorf("floor: no watch event for %s within %s", what, waitLimit)
			}
		}
	}
	claimEvent := func(typ watch.EventType, name string, terminal bool) func(seenEvent) bool {
		return func(ev seenEvent) bool {
			bl, ok := ev.obj.(*buildlockv1.BuildLock)
			return ok && ev.typ == typ && bl.Name == name && (!terminal || bl.Status.Phase.IsTerminal())
		}
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor",
		Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock"}}}
	if err := b.c.Create(b.ctx, lease); err != nil {
		return r, fmt.Errorf("creating the floor's Lease: %w", err)
	}
	for i := range warmup + n {
		name := fmt.Sprintf("c-%d", i)
		t0 := time.Now()
		if err := b.c.Create(b.ctx, blClaim(ns, name, "floor", "acme/floor", int64(i+1), "gone")); err != nil {
			return r, err
		}
		created, err := await("create "+name, claimEvent(watch.Added, name, false))
		if err != nil {
			return r, err
		}
		if _, err := await("the operator's verdict on "+name, claimEvent(watch.Modified, name, true)); err != nil {
			return r, err
		}
		b.ops.quiesce(quietFor, quietMax)

		t1 := time.Now()
		if err := b.c.Delete(b.ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			return r, err
		}
		deleted, err := await("delete "+name, claimEvent(watch.Deleted, name, false))
		if err != nil {
			return r, err
		}
		b.ops.quiesce(quietFor, quietMax)

		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		t2 := time.Now()
		if err := b.c.Update(b.ctx, lease); err != nil {
			return r, fmt.Errorf("updating the floor's Lease: %w", err)
		}
		rv := lease.ResourceVersion
		updated, err := await("the Lease update", func(ev seenEvent) bool {
			return ev.typ == watch.Modified && ev.obj.GetName() == lease.Name && ev.obj.GetResourceVersion() == rv
		})
		if err != nil {
			return r, err
		}
		if i >= warmup {
			r.create = append(r.create, created.Sub(t0))
			r.del = append(r.del, deleted.Sub(t1))
			r.lease = append(r.lease, updated.Sub(t2))
			r.twoHop = append(r.twoHop, deleted.Sub(t1)+updated.Sub(t2))
		}
	}
	return r, nil
}
