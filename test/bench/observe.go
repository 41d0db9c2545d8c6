//go:build bench

package bench

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// watchNamespace watches the objects of list's kind in ns and calls on with
// every event and the instant it arrived, until ctx ends. The first watch is
// open when it returns, so nothing written afterwards is missed; a watch the
// server closes is reopened from the last version seen.
func watchNamespace(ctx context.Context, c client.WithWatch, list client.ObjectList, ns string, on func(watch.EventType, client.Object, time.Time)) error {
	open := func(rv string) (watch.Interface, error) {
		return c.Watch(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{
			ResourceVersion: rv, AllowWatchBookmarks: true,
		}})
	}
	w, err := open("")
	if err != nil {
		return fmt.Errorf("watching %T in %s: %w", list, ns, err)
	}
	go func() {
		rv := ""
		for {
			for ev := range w.ResultChan() {
				at := time.Now()
				if ev.Type == watch.Error {
					break
				}
				obj := ev.Object.(client.Object)
				if m, err := meta.Accessor(obj); err == nil {
					rv = m.GetResourceVersion()
				}
				if ev.Type != watch.Bookmark {
					on(ev.Type, obj, at)
				}
			}
			w.Stop()
			for ctx.Err() == nil {
				if w, err = open(rv); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return nil
}

// claimTracker follows the BuildLocks of a namespace as a contender sees
// them through its watch: each claim's phase, and when each phase was first
// observed. It also follows the grant Leases, as pkg/lock does: when a
// Lease first named each claim with a fencing token.
type claimTracker struct {
	mu      sync.Mutex
	phase   map[string]buildlockv1.Phase
	seen    map[string]map[buildlockv1.Phase]time.Time
	granted map[string]time.Time // claim name → when a grant Lease first named it
	changed chan struct{}
}

func trackClaims(ctx context.Context, c client.WithWatch, ns string) (*claimTracker, error) {
	t := &claimTracker{
		phase:   map[string]buildlockv1.Phase{},
		seen:    map[string]map[buildlockv1.Phase]time.Time{},
		granted: map[string]time.Time{},
		changed: make(chan struct{}),
	}
	if err := watchNamespace(ctx, c, &coordinationv1.LeaseList{}, ns, t.onLease); err != nil {
		return nil, err
	}
	return t, watchNamespace(ctx, c, &buildlockv1.BuildLockList{}, ns, t.on)
}

// onLease records the claim a grant Lease names, the way pkg/lock reads a
// grant: holderIdentity "name/uid" with a fencing token (leaseTransitions).
func (t *claimTracker) onLease(typ watch.EventType, obj client.Object, at time.Time) {
	lease := obj.(*coordinationv1.Lease)
	if typ == watch.Deleted || lease.Spec.HolderIdentity == nil || lease.Spec.LeaseTransitions == nil || *lease.Spec.LeaseTransitions == 0 {
		return
	}
	name, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "/")
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.granted[name]; !ok {
		t.granted[name] = at
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// waitGranted waits until a grant Lease has named claim name and returns
// when it first did.
func (t *claimTracker) waitGranted(ctx context.Context, name string) (time.Time, error) {
	var at time.Time
	err := t.waitUntil(ctx, func(map[string]buildlockv1.Phase) bool {
		var ok bool
		at, ok = t.granted[name]
		return ok
	})
	if err != nil {
		return at, fmt.Errorf("waiting for a grant Lease to name BuildLock %s: %w", name, err)
	}
	return at, nil
}

func (t *claimTracker) on(typ watch.EventType, obj client.Object, at time.Time) {
	bl := obj.(*buildlockv1.BuildLock)
	t.mu.Lock()
	defer t.mu.Unlock()
	if typ == watch.Deleted {
		delete(t.phase, bl.Name)
	} else {
		p := bl.Status.Phase
		if p == "" {
			p = buildlockv1.PhasePending
		}
		t.phase[bl.Name] = p
		if t.seen[bl.Name] == nil {
			t.seen[bl.Name] = map[buildlockv1.Phase]time.Time{}
		}
		if _, ok := t.seen[bl.Name][p]; !ok {
			t.seen[bl.Name][p] = at
		}
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// waitPhase waits until claim name has been seen in phase and returns when
// it was first seen so.
func (t *claimTracker) waitPhase(ctx context.Context, name string, phase buildlockv1.Phase) (time.Time, error) {
	var at time.Time
	err := t.waitUntil(ctx, func(map[string]buildlockv1.Phase) bool {
		var ok bool
		at, ok = t.seen[name][phase]
		return ok
	})
	if err != nil {
		return at, fmt.Errorf("waiting for BuildLock %s to be %s (is %q): %w", name, phase, t.phaseOf(name), err)
	}
	return at, nil
}

func (t *claimTracker) phaseOf(name string) buildlockv1.Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.phase[name]
}

// phases returns a copy of every claim's current phase.
func (t *claimTracker) phases() map[string]buildlockv1.Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.phase)
}

// waitUntil waits until cond, called under the tracker's lock with the
// current phases, holds.
func (t *claimTracker) waitUntil(ctx context.Context, cond func(map[string]buildlockv1.Phase) bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, waitLimit)
		defer cancel()
	}
	for {
		t.mu.Lock()
		ok, ch := cond(t.phase), t.changed
		t.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// countPhases counts the claims in each phase.
func countPhases(phases map[string]buildlockv1.Phase) map[buildlockv1.Phase]int {
	n := map[buildlockv1.Phase]int{}
	for _, p := range phases {
		n[p]++
	}
	return n
}
