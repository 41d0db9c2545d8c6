package chaos

import (
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// These tests feed the checker synthetic histories: a correct hand-off must
// pass, and each way of breaking the promise must be reported. They are the
// committed proof that the chaos test can fail; TestChaos with -chaos.break
// shows the same against the real API server.

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

const ns = "chaos-0"

// history builds a synthetic event stream for lock chaos-0/env-0.
type history struct {
	t      *testing.T
	now    time.Time
	ledger *Ledger
	c      *Checker
	rv     int
	claims map[string]*buildlockv1.BuildLock
	lease  *coordinationv1.Lease
}

func newHistory(t *testing.T) *history {
	h := &history{t: t, now: t0, ledger: NewLedger(), claims: map[string]*buildlockv1.BuildLock{}}
	h.c = NewChecker(h.ledger, 5*time.Second, time.Second, func() time.Time { return h.now })
	return h
}

func (h *history) nextRV() string { h.rv++; return strconv.Itoa(h.rv) }

// create: the workload creates a claim; pod "" makes it pod-less.
func (h *history) create(name, repo string, build int64, pod string) *buildlockv1.BuildLock {
	spec := buildlockv1.BuildLockSpec{Target: "env-0", Repo: repo, Branch: "main", Build: build,
		Timestamp: buildlockv1.NewTimestamp(h.now), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
	if pod != "" {
		spec.PodRef = &buildlockv1.PodReference{Name: pod}
		spec.ExpiresAfter = nil
		h.ledger.PodCreated(ns, pod, types.UID("pod-"+pod))
	}
	h.ledger.WroteSpec(ns, name, spec)
	bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
		ResourceVersion: h.nextRV(), CreationTimestamp: metav1.NewTime(h.now)}, Spec: spec}
	h.claims[name] = bl
	h.c.ObserveClaim(watch.Added, bl.DeepCopy())
	return bl
}

// status: somebody writes a claim's status.
func (h *history) status(name string, phase buildlockv1.Phase, reason string, token int64, by string) {
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Status.Phase, bl.Status.Reason, bl.Status.SupersededBy = phase, reason, by
	if token != 0 {
		bl.Status.FencingToken = token
	}
	if phase == buildlockv1.PhaseHeld {
		bl.Status.AcquiredAt = &metav1.MicroTime{Time: h.now}
	}
	if isTerminal(phase) && bl.Status.FinishedAt == nil {
		bl.Status.FinishedAt = &metav1.MicroTime{Time: h.now}
	}
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// grant: somebody writes the Lease.
func (h *history) grant(holder string, token int32) {
	if h.lease == nil {
		h.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + "env-0"}}
	}
	h.lease.ResourceVersion = h.nextRV()
	h.lease.Spec.HolderIdentity = nil
	if holder != "" {
		h.lease.Spec.HolderIdentity = ptr.To(holder + "/uid-" + holder)
		h.lease.Spec.AcquireTime = &metav1.MicroTime{Time: h.now}
	}
	h.lease.Spec.LeaseTransitions = ptr.To(token)
	h.c.ObserveLease(watch.Modified, h.lease.DeepCopy())
}

func (h *history) deleteClaim(name string, byOwner bool) {
	if byOwner {
		h.ledger.RequestDelete(ns, name)
	}
	h.c.ObserveClaim(watch.Deleted, h.claims[name].DeepCopy())
}

// expect asserts the rules broken, in order ("" for none).
func (h *history) expect(rules ...string) {
	h.t.Helper()
	var got []string
	for _, v := range h.c.Violations() {
		got = append(got, v.Rule)
	}
	if strings.Join(got, ",") != strings.Join(rules, ",") {
		h.t.Errorf("violations: got %v, want %v", h.c.Violations(), rules)
	}
}

// handOff is a correct history: A holds, B waits, A's pod finishes, the
// grant moves to B, A's end is written, then B's hold.
func handOff(h *history) {
	h.create("a", "acme/shop", 41, "pod-a")
	h.create("b", "acme/web", 7, "pod-b")
	h.grant("a", 1)
	h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
	h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
	h.ledger.PodFinishing(ns, "pod-a", true)
	h.grant("b", 2)
	h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
	h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
}

func TestCheckerAcceptsACorrectHistory(t *testing.T) {
	h := newHistory(t)
	handOff(h)
	h.create("c", "acme/shop", 40, "pod-c")
	h.status("c", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "a")
	h.now = h.now.Add(6 * time.Second)
	h.deleteClaim("a", false) // the finished TTL, 6s after it finished
	h.deleteClaim("b", true)  // its owner
	h.grant("", 2)
	h.c.CheckGrantsCoverHolds()
	h.expect()
}

// renew: the workload bumps a claim's renewTime.
func (h *history) renew(name string) {
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Spec.RenewTime = buildlockv1.NewTimestamp(h.now)
	h.ledger.WroteSpec(ns, name, bl.Spec)
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// A pod-less hold expires; its pipeline renews just too late, after a
// manager decided the expiry and moved the grant but before it wrote the
// end: the next decision can only say LockLost. The hold did expire.
func TestCheckerAcceptsAnExpiryDecidedBeforeALateRenewal(t *testing.T) {
	h := newHistory(t)
	h.create("a", "acme/shop", 41, "")
	h.create("b", "acme/shop", 42, "")
	h.grant("a", 1)
	h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
	h.now = h.now.Add(10500 * time.Millisecond)
	h.renew("a") // half a second late
	h.grant("b", 2)
	h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
	h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
	h.expect()
}

func TestCheckerReports(t *testing.T) {
	cases := map[string]struct {
		history func(h *history)
		rules   []string
	}{
		"two claims shown Held at once (the old holder's end was never written)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.grant("a", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
				h.grant("b", 2)
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
			},
			rules: []string{"one-holder"},
		},
		"two grants with the same fencing token (the compare-and-swap patched out)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.grant("a", 1)
				h.grant("b", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
			},
			rules: []string{"fencing-token-increases", "fencing-token-increases", "one-holder"},
		},
		"a fencing token reused after a hand-off": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.grant("a", 3)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 3, "")
				h.ledger.PodFinishing(ns, "pod-a", true)
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 3, "")
			},
			rules: []string{"fencing-token-increases", "grant-before-hold"},
		},
		"a terminal claim held again (a stale write accepted)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/shop", 42, "pod-b")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "b")
				h.grant("a", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
			},
			rules: []string{"terminal-is-terminal"},
		},
		"Waiting straight to Expired, which the API's phases do not allow": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.grant("a", 1)
				h.now = h.now.Add(11 * time.Second)
				h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonExpired, 0, "")
			},
			rules: []string{"legal-transition"},
		},
		"a spec written by someone other than the workload": {
			history: func(h *history) {
				bl := h.create("a", "acme/shop", 41, "pod-a")
				bl.Spec.Build = 99
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			},
			rules: []string{"spec-by-owner-only"},
		},
		"a claim deleted by nobody entitled to": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.deleteClaim("a", false)
			},
			rules: []string{"no-lost-claims"},
		},
		"a finished claim deleted before its TTL": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/shop", 42, "pod-b")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "b")
				h.now = h.now.Add(2 * time.Second)
				h.deleteClaim("a", false)
			},
			rules: []string{"no-lost-claims"},
		},
		"a newer build superseded by an older one": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/shop", 42, "pod-b")
				h.status("b", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "a")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a pod-less hold expired early": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.grant("a", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
				h.now = h.now.Add(5 * time.Second)
				h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonExpired, 0, "")
			},
			rules: []string{"expiry"},
		},
		"a claim released as PodGone while its pod runs (unknown taken for dead)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodGone, 0, "")
			},
			rules: []string{"released-for-a-reason"},
		},
		"a live holder pre-empted (LockLost while its pod runs)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.grant("a", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
				h.grant("b", 2)
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
			},
			rules: []string{"no-preemption"},
		},
		"a pod-less holder's lock lost before its expiry": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.grant("a", 1)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
				h.now = h.now.Add(8 * time.Second)
				h.renew("a") // in time
				h.now = h.now.Add(3 * time.Second)
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
			},
			rules: []string{"no-preemption"},
		},
		"the grant Lease deleted": {
			history: func(h *history) {
				h.grant("", 4)
				h.c.ObserveLease(watch.Deleted, h.lease.DeepCopy())
			},
			rules: []string{"grant-record-kept"},
		},
		"a hold never recorded in the Lease": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
			},
			rules: []string{"grant-before-hold"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			tc.history(h)
			h.c.CheckGrantsCoverHolds()
			h.expect(tc.rules...)
			for _, v := range h.c.Violations() {
				if len(h.c.Around(v, 5, 5)) == 0 {
					t.Errorf("no history around %s", v)
				}
			}
		})
	}
}

func TestSettleProblems(t *testing.T) {
	now := t0.Add(time.Minute)
	claim := func(name string, phase buildlockv1.Phase, pod string, token int64) buildlockv1.BuildLock {
		bl := buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
			Spec:   buildlockv1.BuildLockSpec{Target: "env-0", Repo: "acme/" + name, Branch: "main", Build: 1},
			Status: buildlockv1.BuildLockStatus{Phase: phase, FencingToken: token}}
		if pod != "" {
			bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod}
		} else {
			bl.Spec.ExpiresAfter = &metav1.Duration{Duration: 10 * time.Second}
			bl.Status.AcquiredAt = &metav1.MicroTime{Time: now.Add(-5 * time.Second)}
		}
		return bl
	}
	lease := func(holder string, token int32) *coordinationv1.Lease {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(token)}}
		if holder != "" {
			l.Spec.HolderIdentity = ptr.To(holder + "/uid-" + holder)
		}
		return l
	}
	pods := map[string]*corev1.Pod{
		"running": {ObjectMeta: metav1.ObjectMeta{Name: "running"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		"done":    {ObjectMeta: metav1.ObjectMeta{Name: "done"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
	}
	cases := map[string]struct {
		claims   []buildlockv1.BuildLock
		lease    *coordinationv1.Lease
		problems int
	}{
		"a live holder and a live waiter are settled": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 3), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseSuperseded, "done", 0)},
			lease:  lease("a", 3),
		},
		"a free lock with only finished claims is settled": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseReleased, "done", 3)},
			lease:  lease("", 3),
		},
		"a Pending claim is not":                  {claims: []buildlockv1.BuildLock{claim("a", "", "running", 0)}, problems: 1},
		"a holder whose pod finished is not":      {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "done", 1)}, lease: lease("a", 1), problems: 1},
		"a holder whose pod is gone is not":       {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "gone", 1)}, lease: lease("a", 1), problems: 1},
		"a waiter behind no holder is not":        {claims: []buildlockv1.BuildLock{claim("b", buildlockv1.PhaseWaiting, "running", 0)}, problems: 1},
		"a holder the Lease does not name is not": {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 2)}, lease: lease("b", 2), problems: 1},
		"a Lease naming a holder nobody shows is not": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseReleased, "done", 2)}, lease: lease("a", 2), problems: 1,
		},
		"two waiters are not": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseWaiting, "", 0)},
			lease:  lease("a", 1), problems: 1,
		},
	}
	expired := claim("a", buildlockv1.PhaseHeld, "", 1)
	expired.Status.AcquiredAt = &metav1.MicroTime{Time: now.Add(-11 * time.Second)}
	cases["a pod-less holder past its expiry is not"] = struct {
		claims   []buildlockv1.BuildLock
		lease    *coordinationv1.Lease
		problems int
	}{claims: []buildlockv1.BuildLock{expired}, lease: lease("a", 1), problems: 1}

	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := SettleProblems(tc.claims, tc.lease, pods, now)
			if len(got) != tc.problems {
				t.Errorf("got problems %q, want %d", got, tc.problems)
			}
		})
	}
}

// TestCheckerIsIndependent keeps the checker from importing the operator's
// code: a bug shared by the operator and its judge would go unseen.
func TestCheckerIsIndependent(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "checker.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") {
			t.Errorf("checker.go imports %s; the checker must depend on the API types and client libraries only", path)
		}
	}
}

func TestHoldsBehindTheGrant(t *testing.T) {
	h := newHistory(t)
	handOff(h)
	if n, ex := h.c.HoldsBehindTheGrant(); n != 0 {
		t.Errorf("a correct hand-off: got %d holds behind the grant: %v", n, ex)
	}

	// c's Held write lands after the grant moved on to d.
	h.create("c", "beta/app", 1, "pod-c")
	h.create("d", "beta/api", 1, "pod-d")
	h.grant("c", 3)
	h.grant("d", 4)
	h.status("b", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
	h.status("c", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 3, "")
	if n, ex := h.c.HoldsBehindTheGrant(); n != 1 {
		t.Errorf("got %d holds behind the grant, want 1: %v", n, ex)
	}
}
