package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The deploy windows of the workload (issue 23): a person (the
// administrator) adds and removes windows on the policies of three targets
// while the workload contends for them:
//   - on a NewestWins target, one-off Deny windows of 6-12 s, which open
//     and close during the run (added 6-8 s before they start, more than
//     the checker's windowLag: a manager that sees them late may grant
//     under the windows before), and overrides of its waiting claims while
//     one is in effect, from the tolerance plus a second after it started
//     to as long before it ends (kubectl buildlock override: a reason and
//     an expiry);
//   - on a Queue target, a recurring Deny window, "*/2 * * * *" for 1m
//     (a window lasts at least a minute, and a schedule fires at most every
//     minute: so the target is frozen every other minute, and a run over a
//     minute boundary sees it open or close);
//   - on a Fifo target, one-off Allow windows only: each in effect when it
//     is added (so that adding it freezes nothing), ending 6-8 s later;
//     the target is frozen from its end until it is removed, 6-9 s later.
//
// A pipeline (the flood's service account) tries to override one of its
// own claims: admission must refuse it (break-glass is for people). At the
// end every window is removed, so that the liveness phase finds every
// target open. Overrides go into the ledger before they are sent.

// windowsActor plays the person who freezes and overrides.
type windowsActor struct {
	h     *harness
	crowd *people
	rng   *rand.Rand
	ops   *counters
	// refused counts what admission refused, as it must; failed the rest.
	refused, failed *counters

	deny, recurring, allow LockKey // zero: no such target
	mu                     sync.Mutex
	windows                map[LockKey][]buildlockv1.Window // what this actor set
	overridden             map[string]bool                  // ns/name of claims it overrode
	seq                    int
	allowUntil             time.Time // when the Allow window is to be removed
}

// newWindowsActor picks its targets among the workload's: the deny target
// is one with no policy of its own (NewestWins, so that an override
// jumps no queue) that is not enforced.
func newWindowsActor(h *harness, crowd *people) *windowsActor {
	a := &windowsActor{h: h, crowd: crowd, rng: rand.New(rand.NewPCG(h.o.seed, 0x77696e646f7773)), ops: newCounters(), refused: newCounters(), failed: newCounters(),
		windows: map[LockKey][]buildlockv1.Window{}, overridden: map[string]bool{}}
	enforced := h.enforcedTargets()
	for i, k := range h.targets {
		switch {
		case i%4 == 0 && !slices.Contains(enforced, k) && a.deny.Target == "":
			a.deny = k
		case i%4 == 1 && a.recurring.Target == "":
			a.recurring = k
		case i%4 == 2 && a.allow.Target == "":
			a.allow = k
		}
	}
	return a
}

// run plays the person until ctx ends, then removes every window it added.
func (a *windowsActor) run(ctx context.Context) {
	defer a.removeAll()
	if a.recurring.Target != "" {
		a.set(ctx, a.recurring, []buildlockv1.Window{{Name: "every-other-minute", Kind: buildlockv1.WindowDeny, Schedule: "*/2 * * * *",
			Duration: &metav1.Duration{Duration: time.Minute}, Reason: "chaos: frozen every other minute"}}, "add recurring Deny window")
	}
	pipelineTried := false
	for ctx.Err() == nil {
		now := a.h.clock.Now()
		if a.deny.Target != "" {
			a.stepDeny(ctx, now)
		}
		if a.allow.Target != "" {
			a.stepAllow(ctx, now)
		}
		if !pipelineTried || a.rng.IntN(10) == 0 {
			pipelineTried = a.pipelineOverride(ctx) || pipelineTried
		}
		select {
		case <-ctx.Done():
		case <-time.After(500*time.Millisecond + time.Duration(a.rng.Int64N(int64(time.Second)))):
		}
	}
}

// stepDeny removes the deny target's one-off windows that ended, adds one
// now and then (starting a moment ahead, a few seconds long), and
// overrides a waiting claim while one is in effect.
func (a *windowsActor) stepDeny(ctx context.Context, now time.Time) {
	ws := a.current(a.deny)
	kept := slices.DeleteFunc(slices.Clone(ws), func(w buildlockv1.Window) bool { return w.End != nil && w.End.Before(now.Add(-time.Second)) })
	if len(kept) < len(ws) {
		a.set(ctx, a.deny, kept, "remove ended Deny window")
		ws = kept
	}
	if len(ws) < 2 && a.rng.IntN(3) == 0 {
		start := now.Add(windowLag + time.Second + time.Duration(a.rng.Int64N(int64(2*time.Second))))
		end := start.Add(6*time.Second + time.Duration(a.rng.Int64N(int64(6*time.Second))))
		a.seq++
		w := buildlockv1.Window{Name: fmt.Sprintf("freeze-%d", a.seq), Kind: buildlockv1.WindowDeny,
			Start: &buildlockv1.Timestamp{Time: start}, End: &buildlockv1.Timestamp{Time: end}, Reason: fmt.Sprintf("chaos freeze %d", a.seq)}
		if a.rng.IntN(2) == 0 {
			// The holder is released: the waiting claims are held back by
			// the freeze alone, and an override lets one through at once.
			w.Holder = buildlockv1.WindowHolderRelease
		}
		a.set(ctx, a.deny, append(slices.Clone(ws), w), "add one-off Deny window")
	}
	// An override of a claim that waits (once per claim: a claim is
	// granted once), while a freeze is in effect that started a while ago
	// and lasts a while yet: a grant within the checker's tolerance of a
	// window's edge is not judged.
	margin := a.h.check.o.Tolerance + time.Second
	if !slices.ContainsFunc(ws, func(w buildlockv1.Window) bool {
		return w.Start.Before(now.Add(-margin)) && w.End.After(now.Add(margin))
	}) {
		return
	}
	claims := a.h.check.Claims(a.deny)
	if slices.ContainsFunc(claims, func(c ClaimRef) bool { return c.Phase == buildlockv1.PhaseHeld }) && a.rng.IntN(3) > 0 {
		return // mostly while nothing holds, so that the override is used at once
	}
	for _, c := range claims {
		if c.Phase != buildlockv1.PhaseWaiting || a.overridden[a.deny.Namespace+"/"+c.Name] {
			continue
		}
		a.overridden[a.deny.Namespace+"/"+c.Name] = true
		a.h.ledger.PersonOverrides(a.deny.Namespace, c.Name)
		err := retry(ctx, func() error {
			return a.annotate(ctx, a.crowd.admin, a.deny.Namespace, c.Name, c.UID, "chaos: hotfix through the freeze", now.Add(30*time.Second))
		})
		a.note(ctx, "override a waiting claim", err)
		return
	}
}

// stepAllow cycles the allow target: an Allow window in effect from when
// it is added until 6-8 s later (then the target is frozen), removed 4-6 s
// after it ended (open again).
func (a *windowsActor) stepAllow(ctx context.Context, now time.Time) {
	ws := a.current(a.allow)
	switch {
	case len(ws) == 0 && a.rng.IntN(3) == 0:
		end := now.Add(windowLag + time.Second + time.Duration(a.rng.Int64N(int64(2*time.Second))))
		a.allowUntil = end.Add(6*time.Second + time.Duration(a.rng.Int64N(int64(3*time.Second))))
		a.set(ctx, a.allow, []buildlockv1.Window{{Name: "open-hours", Kind: buildlockv1.WindowAllow,
			Start: &buildlockv1.Timestamp{Time: now.Add(-time.Minute)}, End: &buildlockv1.Timestamp{Time: end}, Reason: "chaos: open for a moment"}},
			"add one-off Allow window")
	case len(ws) > 0 && now.After(a.allowUntil):
		a.set(ctx, a.allow, nil, "remove Allow window")
	}
}

// pipelineOverride: the flood's service account tries to override one of
// its claims; admission must refuse it. It reports whether it tried.
func (a *windowsActor) pipelineOverride(ctx context.Context) bool {
	p := a.crowd
	if p.dep == nil {
		return false // no admission policies: nothing would refuse it
	}
	claims := a.h.check.Claims(LockKey{Namespace: p.floodNS, Target: p.floodTarget})
	if len(claims) == 0 {
		return false
	}
	c := claims[a.rng.IntN(len(claims))]
	kind := "pipeline overrides its claim"
	err := retry(ctx, func() error {
		return a.annotate(ctx, p.flood, p.floodNS, c.Name, c.UID, "chaos: a pipeline lets itself through", a.h.clock.Now().Add(time.Minute))
	})
	switch r := a.h.classify(ctx, err); {
	case r.class == callDone:
		a.h.check.AddViolation(LockKey{Namespace: p.floodNS, Target: p.floodTarget}, "override-by-people",
			"the pipeline %s overrode its claim %s, and admission let it", floodAccount, c.Name)
		a.ops.add(kind, 1)
	case r.refusedBy("buildlock-override"):
		a.refused.add(kind, 1)
	case r.wrongAuthority("buildlock-override"):
		a.h.t.Errorf("windows: %s was refused by %q, not by the buildlock-override policy (RBAC set up wrong?): %v", kind, r.by, err)
	case r.class != callStopped:
		a.failed.add(kind+"/"+r.why, 1) // the claim went meanwhile (not found, a conflict), or a moment's failure
	}
	return true
}

// annotate sets claim ns/name's override annotations, as `kubectl
// buildlock override` does.
func (a *windowsActor) annotate(ctx context.Context, c client.Client, ns, name string, uid types.UID, reason string, expires time.Time) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid, "annotations": map[string]any{
		buildlockv1.OverrideAnnotation: reason, buildlockv1.OverrideExpiresAnnotation: expires.UTC().Format(time.RFC3339)}}})
	return c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch))
}

func (a *windowsActor) current(k LockKey) []buildlockv1.Window {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.windows[k]
}

// set writes lock k's policy's windows (creating the policy if it has
// none): the actor owns the list, so a merge patch of it is enough.
func (a *windowsActor) set(ctx context.Context, k LockKey, ws []buildlockv1.Window, kind string) {
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"windows": ws}})
	c := a.crowd.admin
	err := retry(ctx, func() error {
		err := c.Patch(ctx, &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Target}}, client.RawPatch(types.MergePatchType, patch))
		if apierrors.IsNotFound(err) {
			err = c.Create(ctx, &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Target},
				Spec: buildlockv1.BuildLockPolicySpec{Windows: ws}})
		}
		return err
	})
	a.note(ctx, kind, err)
	if err == nil {
		a.mu.Lock()
		a.windows[k] = ws
		a.mu.Unlock()
	}
}

// removeAll removes every window the actor added (with a context of its
// own: the run's has ended).
func (a *windowsActor) removeAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range []LockKey{a.deny, a.recurring, a.allow} {
		if k.Target != "" && len(a.current(k)) > 0 {
			a.set(ctx, k, nil, "remove windows at the end")
		}
	}
	for k, ws := range a.windows {
		if len(ws) > 0 {
			a.h.t.Errorf("windows: could not remove the windows of %s at the end of the run", k)
		}
	}
}

func (a *windowsActor) note(ctx context.Context, kind string, err error) {
	switch r := a.h.classify(ctx, err); r.class {
	case callDone:
		a.ops.add(kind, 1)
	case callStopped:
	default:
		a.failed.add(kind+"/"+r.why, 1)
	}
}

// figures says what the actor did and what the checker judged.
func (a *windowsActor) figures() string {
	st := a.h.check.WindowStats()
	return fmt.Sprintf("windows (deny %s, recurring %s, allow %s): %s; refused as they must be: %s; failed: %s; checker: %d window changes seen, "+
		"%d grants judged against windows (%d while frozen, %d within the tolerance of an edge), %d through a freeze by an override "+
		"(%d recorded in the Held status, %d not judged: Held not seen while frozen), %d re-grants of a holder not judged",
		a.deny, a.recurring, a.allow, a.ops, a.refused, a.failed, st.Versions, st.Judged, st.Closed, st.Edge, st.Overridden, st.Recorded, st.Unjudged, st.Regrants)
}
