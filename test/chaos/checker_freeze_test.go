package chaos

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// windowPackage is the one package of internal/ the checker may import
// (TestCheckerIsIndependent).
const windowPackage = "github.com/buildlock/buildlock/internal/window"

// setWindows: an administrator sets the lock's policy's windows.
func (h *history) setWindows(ws ...buildlockv1.Window) {
	if h.policy == nil {
		h.policy = &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "env-0"}}
	}
	h.policy.ResourceVersion = h.nextRV()
	h.policy.Spec.Windows = ws
	h.c.ObservePolicy(watch.Modified, h.policy.DeepCopy())
}

// oneOff is a one-off window of kind from t0+from to t0+to.
func oneOff(kind buildlockv1.WindowKind, from, to time.Duration) buildlockv1.Window {
	return buildlockv1.Window{Kind: kind, Start: &buildlockv1.Timestamp{Time: t0.Add(from)}, End: &buildlockv1.Timestamp{Time: t0.Add(to)}}
}

// override: somebody sets claim name's override annotations; byPerson
// says the ledger has it from a person.
func (h *history) override(name string, byPerson bool, expires time.Time) {
	if byPerson {
		h.ledger.PersonOverrides(ns, name)
	}
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Annotations = map[string]string{buildlockv1.OverrideAnnotation: "hotfix", buildlockv1.OverrideExpiresAnnotation: expires.Format(time.RFC3339),
		buildlockv1.OverriddenByAnnotation: "admin"}
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// grantAt: claim a, waiting since t0+1s, is granted at t0+at (a Lease
// version, then its Held status with message); then CheckWindows.
func grantAt(h *history, at time.Duration, message string) {
	h.now = t0.Add(at)
	h.hold("a", 1, func(s *buildlockv1.BuildLockStatus) { s.Message = message })
	h.c.CheckWindows()
}

func waiting(h *history) {
	h.now = t0.Add(time.Second)
	h.create("a", "acme/shop", 41, "pod-a")
	h.status("a", buildlockv1.PhaseWaiting, "Frozen", 0, "")
}

const heldNote = "Holding env-0 with fencing token 1 through its freeze until ..., overridden by \"admin\" (\"hotfix\"); deploy now"

func TestCheckerWindows(t *testing.T) {
	deny := oneOff(buildlockv1.WindowDeny, 10*time.Second, 20*time.Second)
	allow := oneOff(buildlockv1.WindowAllow, 10*time.Second, 20*time.Second)
	for _, tc := range []struct {
		name  string
		run   func(h *history)
		rules []string
	}{
		{"a grant in a Deny window", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 15*time.Second, "Holding")
		}, []string{"window-closed"}},
		{"a grant outside the Deny window", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 25*time.Second, "Holding")
		}, nil},
		{"a grant in a Deny window with a recorded override", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.later(10 * time.Second)
			h.override("a", true, t0.Add(time.Minute))
			grantAt(h, 15*time.Second, heldNote)
		}, nil},
		{"an override nobody in the ledger requested", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.override("a", false, t0.Add(time.Minute))
			grantAt(h, 15*time.Second, heldNote)
		}, []string{"window-closed"}},
		{"an override that expired before the grant", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.override("a", true, t0.Add(12*time.Second))
			grantAt(h, 15*time.Second, heldNote)
		}, []string{"window-closed"}},
		{"an override whose grant does not say so", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.override("a", true, t0.Add(time.Minute))
			grantAt(h, 15*time.Second, "Holding env-0 with fencing token 1; deploy now")
		}, []string{"override-recorded"}},
		{"an override whose Held status comes after the freeze", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.override("a", true, t0.Add(time.Minute))
			h.now = t0.Add(15 * time.Second)
			h.grant("a", 1)
			h.now = t0.Add(25 * time.Second)
			h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "", func(s *buildlockv1.BuildLockStatus) { s.Message = "Holding" })
			h.c.CheckWindows()
		}, nil},
		{"a grant outside every Allow window", func(h *history) {
			h.setWindows(allow)
			waiting(h)
			grantAt(h, 25*time.Second, "Holding")
		}, []string{"window-closed"}},
		{"a grant inside the Allow window", func(h *history) {
			h.setWindows(allow)
			waiting(h)
			grantAt(h, 15*time.Second, "Holding")
		}, nil},
		{"a grant within the tolerance before a Deny window", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 10*time.Second+500*time.Millisecond, "Holding")
		}, nil},
		{"a grant within the tolerance of a Deny window's end", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 20*time.Second-500*time.Millisecond, "Holding")
		}, nil},
		{"a grant just past the tolerance of an Allow window's end", func(h *history) {
			h.setWindows(allow)
			waiting(h)
			grantAt(h, 21*time.Second+100*time.Millisecond, "Holding")
		}, []string{"window-closed"}},
		{"a grant right after the Deny window was removed", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			h.now = t0.Add(15 * time.Second)
			h.setWindows()
			grantAt(h, 15*time.Second+500*time.Millisecond, "Holding")
		}, nil},
		{"a grant right before the Deny window was added", func(h *history) {
			waiting(h)
			h.now = t0.Add(15 * time.Second)
			h.setWindows(deny)
			grantAt(h, 15*time.Second-500*time.Millisecond, "Holding")
		}, nil},
		{"a grant well after the Deny window was added", func(h *history) {
			waiting(h)
			h.now = t0.Add(11 * time.Second)
			h.setWindows(deny)
			grantAt(h, 15*time.Second, "Holding")
		}, []string{"window-closed"}},
		{"a grant after an Allow window ended, which a re-list shows removed (the policy watch was down)", func(h *history) {
			relistedAfterGrant(h, allow)
		}, nil},
		{"a grant after an Allow window ended, which a re-list shows still there", func(h *history) {
			relistedAfterGrant(h, allow, allow)
		}, []string{"window-closed"}},
		{"a grant in a recurring Deny window", func(h *history) {
			h.setWindows(buildlockv1.Window{Kind: buildlockv1.WindowDeny, Schedule: "*/2 * * * *", Duration: &metav1.Duration{Duration: time.Minute}})
			waiting(h)
			grantAt(h, 30*time.Second, "Holding") // t0 is 12:00: frozen 12:00-12:01
		}, []string{"window-closed"}},
		{"a grant between a recurring Deny window's occurrences", func(h *history) {
			h.setWindows(buildlockv1.Window{Kind: buildlockv1.WindowDeny, Schedule: "*/2 * * * *", Duration: &metav1.Duration{Duration: time.Minute}})
			waiting(h)
			grantAt(h, 90*time.Second, "Holding")
		}, nil},
		{"a holder released by a freeze with holder Release", func(h *history) {
			w := deny
			w.Holder = buildlockv1.WindowHolderRelease
			h.setWindows(w)
			waiting(h)
			grantAt(h, 5*time.Second, "Holding")
			h.now = t0.Add(10 * time.Second)
			h.grant("", 1)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonFreezeStarted, 0, "")
		}, nil},
		// The short run of seed 612326126: a manager that saw the freeze
		// released the holder (raising the token, its first write after it
		// started); another, running beside it and not seeing the freeze
		// yet, took that for a hand-off and wrote the holder's end as
		// LockLost.
		{"a holder a freeze released, shown LockLost by a manager that had not seen the freeze", func(h *history) {
			w := deny
			w.Holder = buildlockv1.WindowHolderRelease
			h.setWindows(w)
			waiting(h)
			grantAt(h, 5*time.Second, "Holding")
			h.now = t0.Add(10 * time.Second)
			h.grant("", 100)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
		}, nil},
		{"a holder shown LockLost during a freeze that keeps its holder", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 5*time.Second, "Holding")
			h.now = t0.Add(10 * time.Second)
			h.grant("", 100)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
		}, []string{"no-preemption"}},
		{"a holder released as FreezeStarted without such a window", func(h *history) {
			h.setWindows(deny)
			waiting(h)
			grantAt(h, 5*time.Second, "Holding")
			h.now = t0.Add(10 * time.Second)
			h.grant("", 1)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonFreezeStarted, 0, "")
		}, []string{"released-for-a-reason"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistory(t)
			tc.run(h)
			h.expect(tc.rules...)
		})
	}
}

// relistedAfterGrant: the policy has windows (the checker watched them);
// its watch goes down; claim a is granted at t0+25s; a re-list at t0+40s
// shows the policy with windows relisted, which may have taken effect any
// time after the last policy event watched.
func relistedAfterGrant(h *history, windows buildlockv1.Window, relisted ...buildlockv1.Window) {
	h.setWindows(windows)
	waiting(h)
	h.now = t0.Add(25 * time.Second)
	h.hold("a", 1, func(s *buildlockv1.BuildLockStatus) { s.Message = "Holding" })
	h.now = t0.Add(40 * time.Second)
	p := h.policy.DeepCopy()
	p.ResourceVersion = h.nextRV()
	p.Spec.Windows = relisted
	h.c.RelistPolicies([]buildlockv1.BuildLockPolicy{*p}, p.ResourceVersion)
	h.c.CheckWindows()
}
