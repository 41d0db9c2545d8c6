//go:build bench

package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// requestCost is what one kind of request costs the API server and etcd:
// CPU time per request, and the request's median latency, over n requests
// sent one after another with no operator running.
type requestCost struct {
	what            string
	n               int
	apiserver, etcd time.Duration // CPU per request
	latency         time.Duration // p50
}

// requestCosts measures the requests a lock is made of, each kind n times
// in turn against an idle API server (no manager runs): what limits the
// scale and mass hand-off rows, where the API server's CPU is the bound.
func (b *bench) requestCosts(n int) ([]requestCost, error) {
	ns := b.namespace("cost")
	now := metav1.NewMicroTime(time.Now())
	message := heldMessage(7)
	heldStatus := operatorStatus(7)
	claims := make([]*buildlockv1.BuildLock, n)
	cms := make([]*corev1.ConfigMap, n)
	leases := make([]*coordinationv1.Lease, n)
	kinds := []struct {
		what string
		op   func(i int) error
	}{
		{"create configmaps", func(i int) error {
			cms[i] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm-%d", i)},
				Data: map[string]string{"repo": "acme/app", "branch": "main", "build": "42"}}
			return b.c.Create(b.ctx, cms[i])
		}},
		{"update configmaps", func(i int) error { cms[i].Data["waiting"] = "acme/web@main#8"; return b.c.Update(b.ctx, cms[i]) }},
		{"delete configmaps", func(i int) error { return b.c.Delete(b.ctx, cms[i]) }},
		{"create leases", func(i int) error {
			leases[i] = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("buildlock-t%d", i),
				Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": fmt.Sprintf("t%d", i)}}}
			return b.c.Create(b.ctx, leases[i])
		}},
		{"update leases", func(i int) error {
			leases[i].Spec.HolderIdentity = ptrTo("c-0/0f8e0c4e-2a4b-4c1e-9d1a-7c3e2b1a0f9e")
			leases[i].Spec.LeaseTransitions, leases[i].Spec.AcquireTime, leases[i].Spec.RenewTime = ptrTo(int32(7)), &now, &now
			return b.c.Update(b.ctx, leases[i])
		}},
		{"create buildlocks", func(i int) error {
			claims[i] = blClaim(ns, fmt.Sprintf("c-%d", i), fmt.Sprintf("t%d", i), "acme/app", 42, "")
			return b.c.Create(b.ctx, claims[i])
		}},
		{"update buildlocks/status", func(i int) error {
			claims[i].Status = heldStatus
			return b.c.Status().Update(b.ctx, claims[i])
		}},
		{"update buildlocks/status (phase and reason only)", func(i int) error {
			claims[i].Status = buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseWaiting, Reason: buildlockv1.ReasonWaitingForHolder}
			return b.c.Status().Update(b.ctx, claims[i])
		}},
		{"delete buildlocks", func(i int) error { return b.c.Delete(b.ctx, claims[i]) }},
		{"create events", func(i int) error {
			return b.c.Create(b.ctx, &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("c-%d.%d", i, now.UnixNano())},
				EventTime:  now, ReportingController: "buildlock", ReportingInstance: "buildlock-manager",
				Action: "Held", Reason: buildlockv1.ReasonAcquired, Type: corev1.EventTypeNormal, Note: message,
				Regarding: corev1.ObjectReference{Kind: "BuildLock", APIVersion: buildlockv1.GroupVersion.String(), Namespace: ns, Name: fmt.Sprintf("c-%d", i)},
			})
		}},
	}
	var out []requestCost
	for _, k := range kinds {
		lat := make([]time.Duration, 0, n)
		cpu0 := cpuSeconds()
		for i := range n {
			t0 := time.Now()
			if err := k.op(i); err != nil {
				return out, fmt.Errorf("%s: %w", k.what, err)
			}
			lat = append(lat, time.Since(t0))
		}
		used := cpuSince(cpu0, time.Now())
		perOp := func(proc string) time.Duration {
			return time.Duration(used.secs[proc] / float64(n) * float64(time.Second))
		}
		out = append(out, requestCost{what: k.what, n: n, apiserver: perOp("kube-apiserver"), etcd: perOp("etcd"), latency: median(lat)})
	}
	return out, nil
}

// heldMessage is the message of a hold with token, as the operator writes
// it.
func heldMessage(token int64) string {
	return fmt.Sprintf("Holding staging with fencing token %d; deploy now and delete this BuildLock when done.", token)
}

// operatorStatus is a Held status of the operator's size and shape, with
// token.
func operatorStatus(token int64) buildlockv1.BuildLockStatus {
	now := metav1.NewMicroTime(time.Now())
	return buildlockv1.BuildLockStatus{
		Phase: buildlockv1.PhaseHeld, Reason: buildlockv1.ReasonAcquired, Message: heldMessage(token),
		Holder: "c-0", FencingToken: token, AcquiredAt: &now, ObservedGeneration: 1,
		Conditions: []metav1.Condition{{Type: buildlockv1.ConditionAcquired, Status: metav1.ConditionTrue, Reason: buildlockv1.ReasonAcquired,
			Message: heldMessage(token), ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}},
	}
}

// statusProfileWindow is how long the API server is profiled while it
// serves nothing but status writes.
const statusProfileWindow = 10 * time.Second

// statusWriteProfile profiles the API server while 8 writers update the
// statuses of claims, with a status of the operator's size
// (operatorStatus), for statusProfileWindow: where a status write's CPU goes (decoding,
// schema coercion and pruning, validation and CEL rules, managed fields,
// storage). It returns the profile's top, cumulative, within the update
// handler.
func (b *bench) statusWriteProfile() (string, error) {
	const writers, claims = 8, 64
	ns := b.namespace("status-profile")
	list := make([]*buildlockv1.BuildLock, claims)
	for i := range list {
		list[i] = blClaim(ns, fmt.Sprintf("c-%d", i), fmt.Sprintf("t%d", i), "acme/app", 42, "")
		if err := b.c.Create(b.ctx, list[i]); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	profiled := make(chan string, 1)
	go func() {
		defer cancel()
		profiled <- b.apiserverProfile("apiserver-status", fmt.Sprintf("%d writers updating BuildLock statuses for %s", writers, statusProfileWindow),
			statusProfileWindow, "-cum", "-nodecount=60", "-focus=UpdateResource")
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				bl := list[(w+k*writers)%claims]
				bl.Status = operatorStatus(int64(k + 1))
				if err := b.c.Status().Update(ctx, bl); err != nil && ctx.Err() == nil {
					// A lost race with another writer of the same claim: read it again.
					_ = b.c.Get(ctx, client.ObjectKeyFromObject(bl), bl)
				}
			}
		})
	}
	wg.Wait()
	return <-profiled, nil
}

func ptrTo[T any](v T) *T { return &v }
