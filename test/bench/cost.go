//go:build bench

package bench

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	message := "Holding staging with fencing token 7; deploy now and delete this BuildLock when done."
	heldStatus := buildlockv1.BuildLockStatus{
		Phase: buildlockv1.PhaseHeld, Reason: buildlockv1.ReasonAcquired, Message: message,
		Holder: "c-0", FencingToken: 7, AcquiredAt: &now, ObservedGeneration: 1,
		Conditions: []metav1.Condition{{Type: buildlockv1.ConditionAcquired, Status: metav1.ConditionTrue, Reason: buildlockv1.ReasonAcquired,
			Message: message, ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}},
	}
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

func ptrTo[T any](v T) *T { return &v }
