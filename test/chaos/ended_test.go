package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/testenv"
)

// TestExpiredHoldEndsExpired: a pod-less hold expires, the manager records
// the next grant in the Lease, and its Expired status write is then lost:
// the manager dies right after the Lease write, or the write conflicts with
// a renewal that came just too late. The next decision sees a claim shown
// Held that the grant no longer names. The claim did expire, and must be
// reported Expired (reason Expired), not Released/LockLost, which tells the
// pipeline that something else took the lock.
//
// Regression test for bug 3 of docs/reliability.md: the chaos runs showed
// 7 of 61 expired pod-less holds ending LockLost. The fix records the
// previous holder's ending in the grant's compare-and-swap (the Lease's
// buildlock.io/ended annotation, arbiter.Grant.Ended). The same scenarios
// with the recorded ending dropped (the operator before the fix) end
// LockLost, which shows that they reach the path the fix changed.
func TestExpiredHoldEndsExpired(t *testing.T) {
	cfg, c := regressionTest(t)

	for _, tc := range []struct {
		name string
		// lateRenewal: the Expired write conflicts with a renewal sent
		// right after the grant moved on; else it is refused, and the
		// manager replaced by another.
		lateRenewal bool
		// withoutEnding drops the grant's recorded ending, as the operator
		// did before the fix.
		withoutEnding bool
		phase         buildlockv1.Phase
		reason        string
	}{
		{name: "the manager dies after the grant", phase: buildlockv1.PhaseExpired, reason: buildlockv1.ReasonExpired},
		{name: "a renewal just too late conflicts with the Expired write", lateRenewal: true, phase: buildlockv1.PhaseExpired, reason: buildlockv1.ReasonExpired},
		{name: "the manager dies after the grant, before the fix", withoutEnding: true, phase: buildlockv1.PhaseReleased, reason: buildlockv1.ReasonLockLost},
		{name: "a late renewal, before the fix", lateRenewal: true, withoutEnding: true, phase: buildlockv1.PhaseReleased, reason: buildlockv1.ReasonLockLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ns := testNamespace(ctx, t, c, "ended")
			clock := &warpClock{}
			var decide func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision
			if tc.withoutEnding {
				decide = func(l arbiter.Lock, claims []arbiter.Claim, g arbiter.Grant, now time.Time, p arbiter.Policy) arbiter.Decision {
					g.Ended = arbiter.Ending{}
					d := arbiter.Decide(l, claims, g, now, p)
					d.Grant.Ended = arbiter.Ending{}
					return d
				}
			}

			// The first manager loses the expired holder's Expired write:
			// it is refused (not sent) in the first case; in the second,
			// the pipeline renews right after the grant moved, so that the
			// write conflicts.
			var armed, lost atomic.Bool
			funcs := interceptor.Funcs{
				Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					err := cl.Update(ctx, obj, opts...)
					if l, ok := obj.(*coordinationv1.Lease); ok && err == nil && tc.lateRenewal && armed.Load() && l.Spec.HolderIdentity != nil {
						renewLate(t, c, ns, "nopod-1", clock.Now())
					}
					return err
				},
				SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
					bl, ok := obj.(*buildlockv1.BuildLock)
					expiring := ok && armed.Load() && bl.Name == "nopod-1" && bl.Status.Phase == buildlockv1.PhaseExpired
					if expiring && !tc.lateRenewal {
						lost.Store(true)
						return apierrors.NewInternalError(errors.New("lost by the test: the manager dies now"))
					}
					err := cl.SubResource(sub).Update(ctx, obj, opts...)
					if expiring && apierrors.IsConflict(err) {
						lost.Store(true)
					}
					return err
				},
			}
			first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, Clock: skewClock{base: clock},
				NewClient: testenv.InterceptClient(funcs), Decide: decide})
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					_ = first.Stop()
				}
			}()

			create(t, c, ns, "nopod-1", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1,
				ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}})
			waitPhase(t, c, ns, "nopod-1", buildlockv1.PhaseHeld, 15*time.Second)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-7"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
			if err := c.Create(ctx, pod); err != nil {
				t.Fatal(err)
			}
			create(t, c, ns, "web-7", buildlockv1.BuildLockSpec{Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, PodRef: &buildlockv1.PodReference{Name: "web-7"}})
			waitPhase(t, c, ns, "web-7", buildlockv1.PhaseWaiting, 15*time.Second)

			// Time passes beyond the hold; the next decision expires it.
			armed.Store(true)
			clock.advance(11 * time.Second)
			nudge(t, c, ns, "web-7")
			deadline := time.Now().Add(15 * time.Second)
			for !lost.Load() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if !lost.Load() {
				t.Fatalf("the expired holder's Expired write was never lost")
			}
			if !tc.lateRenewal {
				// The manager dies; another one takes over.
				stopped = true
				_ = first.Stop()
				second, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, Clock: skewClock{base: clock}, Decide: decide})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = second.Stop() }()
			}
			waitPhase(t, c, ns, "web-7", buildlockv1.PhaseHeld, 15*time.Second)
			bl := waitTerminal(t, c, ns, "nopod-1", 15*time.Second)
			if bl.Status.Phase != tc.phase || bl.Status.Reason != tc.reason {
				t.Errorf("the expired holder ended %s/%s (%s); want %s/%s", bl.Status.Phase, bl.Status.Reason, bl.Status.Message, tc.phase, tc.reason)
			}
		})
	}
}

func create(t *testing.T, c client.Client, ns, name string, spec buildlockv1.BuildLockSpec) {
	t.Helper()
	if err := c.Create(context.Background(), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
}

// renewLate bumps the claim's renewTime, as its pipeline does a moment too
// late.
func renewLate(t *testing.T, c client.Client, ns, name string, at time.Time) {
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": buildlockv1.NewTimestamp(at.Truncate(time.Microsecond))}})
	if err := c.Patch(context.Background(), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Errorf("renewing %s late: %v", name, err)
	}
}

// nudge changes a claim's annotations so that its lock is decided now.
func nudge(t *testing.T, c client.Client, ns, name string) {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test.buildlock.io/nudge":%q}}}`, time.Now().Format(time.RFC3339Nano))
	if err := c.Patch(context.Background(), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

func waitTerminal(t *testing.T, c client.Client, ns, name string, bound time.Duration) *buildlockv1.BuildLock {
	t.Helper()
	deadline := time.Now().Add(bound)
	var bl buildlockv1.BuildLock
	for time.Now().Before(deadline) {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &bl); err == nil && bl.Status.Phase.IsTerminal() {
			return &bl
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s/%s is %q (%s), not terminal after %s", ns, name, bl.Status.Phase, bl.Status.Reason, bound)
	return nil
}
