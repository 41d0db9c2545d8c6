package chaos

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
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

// These tests feed the checker synthetic histories: a correct history must
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
	policy *buildlockv1.BuildLockPolicy
	// floor is the namespace's token floor, which grant raises ahead of
	// the tokens it writes, as the operator does (nil: none yet).
	floor *coordinationv1.Lease
	// unreserved: grant writes no floor (an operator that does not
	// reserve).
	unreserved bool
}

func newHistory(t *testing.T) *history {
	h := &history{t: t, now: t0, claims: map[string]*buildlockv1.BuildLock{}}
	h.ledger = NewLedger(func() time.Time { return h.now })
	h.c = NewChecker(h.ledger, CheckerOptions{TTL: 5 * time.Second, Tolerance: time.Second, Retention: time.Hour,
		PolicyLag: 0, HoldSlack: 10 * time.Second, Now: func() time.Time { return h.now }, RealNow: func() time.Time { return h.now }})
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

// status: somebody writes a claim's status; edit, when given, changes more
// of it.
func (h *history) status(name string, phase buildlockv1.Phase, reason string, token int64, by string, edit ...func(*buildlockv1.BuildLockStatus)) {
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Status.Phase, bl.Status.Reason, bl.Status.SupersededBy = phase, reason, by
	if token != 0 {
		bl.Status.FencingToken = token
	}
	if phase == buildlockv1.PhaseHeld && bl.Status.AcquiredAt == nil {
		bl.Status.AcquiredAt = &metav1.MicroTime{Time: h.now}
		if bl.Spec.PodRef == nil {
			bl.Status.ExpiresAt = &metav1.MicroTime{Time: h.now.Add(expiresAfter(bl.Spec))}
		}
	}
	if phase == buildlockv1.PhaseWaiting && bl.Status.QueuedAt == nil {
		bl.Status.QueuedAt = &metav1.MicroTime{Time: h.now}
	}
	if isTerminal(phase) && bl.Status.FinishedAt == nil {
		bl.Status.FinishedAt = &metav1.MicroTime{Time: h.now}
	}
	for _, f := range edit {
		f(&bl.Status)
	}
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// grant: somebody writes the Lease.
func (h *history) grant(holder string, token int32) {
	h.reserve(token)
	if h.lease == nil {
		h.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + "env-0", CreationTimestamp: metav1.NewTime(h.now),
			UID: types.UID(fmt.Sprintf("lease-%d", h.rv)), Labels: map[string]string{ManagedByLabel: ManagedByValue}}}
	}
	h.lease.ResourceVersion = h.nextRV()
	h.lease.Spec.HolderIdentity = nil
	h.lease.Spec.AcquireTime = nil
	if holder != "" {
		h.lease.Spec.HolderIdentity = ptr.To(holder + "/uid-" + holder)
		h.lease.Spec.AcquireTime = &metav1.MicroTime{Time: h.now}
	}
	h.lease.Spec.RenewTime = &metav1.MicroTime{Time: h.now}
	h.lease.Spec.LeaseTransitions = ptr.To(token)
	h.c.ObserveLease(watch.Modified, h.lease.DeepCopy())
}

// reserve: the operator raises the namespace's token floor to token+99
// before it writes token, unless the floor holds it.
func (h *history) reserve(token int32) {
	if h.unreserved || h.floor != nil && *h.floor.Spec.LeaseTransitions >= token {
		return
	}
	typ := watch.Modified
	if h.floor == nil {
		typ = watch.Added
		h.floor = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, UID: types.UID(fmt.Sprintf("floor-%d", h.rv)),
			Labels: map[string]string{ManagedByLabel: ManagedByValue}}}
	}
	h.floor.ResourceVersion = h.nextRV()
	h.floor.Spec.LeaseTransitions = ptr.To(token + 99)
	h.c.ObserveLease(typ, h.floor.DeepCopy())
}

// personDeletesFloor: a person deletes the namespace's token floor.
func (h *history) personDeletesFloor() {
	l := h.floor.DeepCopy()
	l.ResourceVersion = h.nextRV()
	h.ledger.PersonDeletesLease(l)
	h.c.ObserveLease(watch.Deleted, l)
	h.floor = nil
}

// remember: the operator writes the Lease's line memory: build of repo's
// main held at heldAt (a write of the grant record that changes nothing
// else).
func (h *history) remember(repo string, build int64, heldAt time.Time) {
	if h.lease == nil {
		h.grant("", 0)
	}
	h.lease.ResourceVersion = h.nextRV()
	h.lease.Annotations = map[string]string{LinesAnnotation: fmt.Sprintf(`[{"repo":%q,"branch":"main","build":%d,"heldAt":%q}]`, repo, build, heldAt.Format(time.RFC3339Nano))}
	h.c.ObserveLease(watch.Modified, h.lease.DeepCopy())
}

// personDeletesLease: a person deletes the grant Lease (the operator
// writes it again with grant).
func (h *history) personDeletesLease() {
	l := h.lease.DeepCopy()
	l.ResourceVersion = h.nextRV()
	h.ledger.PersonDeletesLease(l)
	h.c.ObserveLease(watch.Deleted, l)
	h.lease = nil
}

// personEditsLease: a person updates the grant Lease as read, changed by
// edit (its renewTime stays the operator's last).
func (h *history) personEditsLease(edit func(*coordinationv1.Lease)) {
	l := h.lease.DeepCopy()
	l.ResourceVersion = h.nextRV()
	edit(l)
	h.ledger.PersonWritesLease(l)
	h.c.ObserveLease(watch.Modified, l.DeepCopy())
	h.later(10 * time.Millisecond)
}

// deleting: the owner deletes a claim that a finalizer keeps: it stays,
// with a deletionTimestamp.
func (h *history) deleting(name string) {
	bl := h.claims[name]
	h.ledger.RequestDelete(ns, name)
	bl.ResourceVersion = h.nextRV()
	bl.DeletionTimestamp = &metav1.Time{Time: h.now}
	bl.Finalizers = []string{"chaos.buildlock.io/keep"}
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// foreignLease: a person creates a Lease of their own under the grant
// Lease's name.
func (h *history) foreignLease() *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + "env-0", UID: "foreign", ResourceVersion: h.nextRV()},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("deploy-bot"), LeaseTransitions: ptr.To(int32(7))}}
	h.ledger.PersonCreatesForeignLease(ns, l.Name)
	h.c.ObserveLease(watch.Added, l.DeepCopy())
	return l
}

// consent: namespace env-0's consent label changes to value; a person's
// request when byPerson, else a pipeline's.
func (h *history) consent(value string, byPerson bool) {
	if byPerson {
		h.ledger.PersonSetsConsent("env-0", value)
	} else {
		h.ledger.PipelineTriesConsent("env-0", value)
	}
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "env-0", ResourceVersion: h.nextRV()}}
	if value != "" {
		n.Labels = map[string]string{buildlockv1.LockedByLabel: value}
	}
	h.c.ObserveNamespace(watch.Modified, n)
}

// command: a holder's command ran on env-0 from fromMs to toMs after t0.
func command(claim string, token int64, job string, fromMs, toMs int) Activity {
	return Activity{Kind: ActivityCommand, Lock: LockKey{ns, "env-0"}, Claim: claim, Token: token, Job: job,
		Start: t0.Add(time.Duration(fromMs) * time.Millisecond), End: t0.Add(time.Duration(toMs) * time.Millisecond)}
}

// deleteLeaseAround: the last claim b and the idle Lease are deleted, the
// claim first in etcd (lower resourceVersion) when claimFirst; the checker
// sees the Lease's deletion first either way (two watches).
func deleteLeaseAround(h *history, claimFirst bool) {
	handOff(h)
	h.deleteClaim("a", true)
	h.grant("", 2)
	h.later(time.Hour)
	floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, ResourceVersion: h.nextRV()},
		Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(2))}}
	h.c.ObserveLease(watch.Added, floor)
	b, l := h.claims["b"].DeepCopy(), h.lease.DeepCopy()
	if claimFirst {
		b.ResourceVersion, l.ResourceVersion = h.nextRV(), h.nextRV()
	} else {
		l.ResourceVersion, b.ResourceVersion = h.nextRV(), h.nextRV()
	}
	h.ledger.RequestDelete(ns, "b")
	h.c.ObserveLease(watch.Deleted, l)
	h.c.ObserveClaim(watch.Deleted, b)
}

// hold: the grant goes to a claim, then its status shows it Held.
func (h *history) hold(name string, token int32, edit ...func(*buildlockv1.BuildLockStatus)) {
	h.grant(name, token)
	h.status(name, buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, int64(token), "", edit...)
}

// setPolicy: an administrator sets the lock's policy.
func (h *history) setPolicy(ordering buildlockv1.Ordering, maxHold time.Duration) {
	if h.policy == nil {
		h.policy = &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "env-0"}}
	}
	h.policy.ResourceVersion = h.nextRV()
	h.policy.Spec.Ordering = ordering
	h.policy.Spec.MaxHold = nil
	if maxHold > 0 {
		h.policy.Spec.MaxHold = &metav1.Duration{Duration: maxHold}
	}
	h.c.ObservePolicy(watch.Modified, h.policy.DeepCopy())
}

// setReruns: an administrator sets the lock's policy on re-runs and
// rollbacks.
func (h *history) setReruns(reruns buildlockv1.Reruns, rollbacks buildlockv1.Rollbacks) {
	if h.policy == nil {
		h.setPolicy("", 0)
	}
	h.policy.ResourceVersion = h.nextRV()
	h.policy.Spec.Reruns, h.policy.Spec.Rollbacks = reruns, rollbacks
	h.c.ObservePolicy(watch.Modified, h.policy.DeepCopy())
}

// createRollback: requester creates a claim that rolls back (spec.rollback),
// its requester stamped by the API server.
func (h *history) createRollback(name, repo string, build int64, requester string) {
	bl := h.create(name, repo, build, "pod-"+name)
	bl.ResourceVersion = h.nextRV()
	bl.Spec.Rollback = &buildlockv1.Rollback{Reason: "INC-7: checkout broke"}
	bl.Spec.Requester = &buildlockv1.Requester{Username: requester}
	h.ledger.WroteSpec(ns, name, bl.Spec)
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// heldAndEnded: build of repo held with token, and its pod finished.
func heldAndEnded(h *history, name, repo string, build int64, token int32) {
	h.create(name, repo, build, "pod-"+name)
	h.hold(name, token)
	h.later(time.Minute)
	h.ledger.PodFinishing(ns, "pod-"+name, true)
	h.grant("", token)
	h.status(name, buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
}

// createWorkflow: the workload creates a claim of repo's main under
// workflow (an unverified one: the checker's pipelines have none).
func (h *history) createWorkflow(name, repo, workflow string, build int64) {
	bl := h.create(name, repo, build, "pod-"+name)
	bl.ResourceVersion = h.nextRV()
	bl.Spec.Workflow = workflow
	h.ledger.WroteSpec(ns, name, bl.Spec)
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

func (h *history) deleteClaim(name string, byOwner bool) {
	if byOwner {
		h.ledger.RequestDelete(ns, name)
	}
	h.c.ObserveClaim(watch.Deleted, h.claims[name].DeepCopy())
}

// renew: the workload bumps a claim's renewTime to at (now when zero).
func (h *history) renew(name string, at time.Time) {
	if at.IsZero() {
		at = h.now
	}
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Generation++
	bl.Spec.RenewTime = buildlockv1.NewTimestamp(at)
	h.ledger.WroteSpec(ns, name, bl.Spec)
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// later moves the clock on.
func (h *history) later(d time.Duration) { h.now = h.now.Add(d) }

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

// recreatedWhileBlind: a's build held and is in the Lease's line memory;
// b holds. The watches break; meanwhile a is deleted by the TTL, the grant
// Lease is deleted (by a person, or else by the operator) and the operator
// creates it again for b, remembering only b's line. Then the re-lists.
func recreatedWhileBlind(h *history, byPerson bool) {
	handOff(h)
	h.remember("acme/shop", 41, h.now)
	h.later(8 * time.Second)
	if byPerson {
		h.ledger.PersonDeletesLease(h.lease)
	}
	l := h.lease.DeepCopy()
	l.UID, l.ResourceVersion = "lease-again", h.nextRV()
	l.Annotations = map[string]string{LinesAnnotation: fmt.Sprintf(`[{"repo":"acme/web","branch":"main","build":7,"heldAt":%q}]`, h.now.Format(time.RFC3339Nano))}
	h.c.RelistLeases([]coordinationv1.Lease{*l}, l.ResourceVersion)
	b := h.claims["b"].DeepCopy()
	h.c.RelistClaims([]buildlockv1.BuildLock{*b}, l.ResourceVersion)
}

// handOff is a correct history: A holds, B waits, A's pod finishes, the
// grant moves to B, A's end is written, then B's hold.
func handOff(h *history) {
	h.create("a", "acme/shop", 41, "pod-a")
	h.create("b", "acme/web", 7, "pod-b")
	h.hold("a", 1)
	h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
	h.ledger.PodFinishing(ns, "pod-a", true)
	h.grant("b", 2)
	h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
	h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
}

// queueOfThree: under Queue, shop holds; web joins, then api; shop's pod
// finishes and the grant goes to web, the first in the queue.
func queueOfThree(h *history, next string) {
	h.setPolicy(buildlockv1.OrderingQueue, 0)
	h.create("shop", "acme/shop", 41, "pod-shop")
	h.hold("shop", 1)
	h.later(time.Second)
	h.create("web", "acme/web", 7, "pod-web")
	h.status("web", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
	h.later(time.Second)
	h.create("api", "acme/api", 3, "pod-api")
	h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
	h.later(time.Second)
	h.ledger.PodFinishing(ns, "pod-shop", true)
	h.grant(next, 2)
	h.status("shop", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
	h.status(next, buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "", func(s *buildlockv1.BuildLockStatus) { s.QueuedAt = nil })
}

// holdUnderMaxHold: the lock's policy sets a maximum hold of a minute; a
// claim with a pod is granted, its hold stated to end a minute later.
func holdUnderMaxHold(h *history) {
	h.setPolicy(buildlockv1.OrderingNewestWins, time.Minute)
	h.create("a", "acme/shop", 41, "pod-a")
	h.hold("a", 1, func(s *buildlockv1.BuildLockStatus) {
		s.ExpiresAt = &metav1.MicroTime{Time: h.now.Add(time.Minute)}
	})
}

func TestCheckerAccepts(t *testing.T) {
	cases := map[string]func(h *history){
		"a re-run of a build after its first run's claim ended": func(h *history) {
			heldAndEnded(h, "b10", "acme/shop", 10, 1)
			h.create("b10-rerun", "acme/shop", 10, "pod-b10-rerun")
			h.hold("b10-rerun", 2)
		},
		"a rollback the policy allows, and the next build of its line above it": func(h *history) {
			h.setReruns("", buildlockv1.RollbacksPeopleOnly)
			heldAndEnded(h, "b10", "acme/shop", 10, 1)
			h.createRollback("b8", "acme/shop", 8, "alice@example.com")
			h.hold("b8", 2)
			h.later(time.Minute)
			h.ledger.PodFinishing(ns, "pod-b8", true)
			h.grant("", 2)
			h.status("b8", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
			h.create("b9", "acme/shop", 9, "pod-b9")
			h.hold("b9", 3)
		},
		"a re-run a re-list shows Held, its first run's claim gone from the list": func(h *history) {
			h.create("b10", "acme/shop", 10, "")
			h.hold("b10", 1)
			h.create("b10-rerun", "acme/shop", 10, "pod-b10-rerun")
			// The watches break; meanwhile b10 expires and is deleted, and
			// its other run is granted (token 2).
			h.later(15 * time.Second)
			r := h.claims["b10-rerun"].DeepCopy()
			r.ResourceVersion = h.nextRV()
			r.Status.Phase, r.Status.Reason, r.Status.FencingToken = buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2
			r.Status.AcquiredAt = &metav1.MicroTime{Time: h.now}
			h.ledger.RequestDelete(ns, "b10")
			h.c.RelistClaims([]buildlockv1.BuildLock{*r}, r.ResourceVersion)
			l := h.lease.DeepCopy()
			l.ResourceVersion = h.nextRV()
			l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("b10-rerun/uid-b10-rerun"), ptr.To(int32(2))
			h.c.RelistLeases([]coordinationv1.Lease{*l}, l.ResourceVersion)
		},
		// Seed 418858340 (bug 13): while the checker's watch was down, a
		// person deleted the grant Lease and the operator created it again
		// for its holder, its line memory rebuilt from the claims left:
		// the record of a build whose claim is gone went with the old
		// Lease. The re-list shows the new Lease, under another UID.
		"a re-list showing the grant Lease a person deleted and the operator created again": func(h *history) {
			recreatedWhileBlind(h, true)
		},
		// Seed 418858340, chaos-1/env-17: two managers decide at once. One
		// queues build 137 of api's line; the other, whose cache does not
		// show 137 waiting yet, queues build 138 with a place of its own
		// (its write that supersedes 137 loses the compare-and-swap). The
		// next decision gives 138 its line's place, 137's, and supersedes
		// 137.
		"Queue: a newer build queued with a place of its own, then with its line's (split brain)": func(h *history) {
			h.setPolicy(buildlockv1.OrderingQueue, 0)
			h.create("shop", "acme/shop", 41, "pod-shop")
			h.hold("shop", 1)
			h.create("api-137", "acme/api", 137, "pod-api-137")
			h.status("api-137", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			linePlace := h.now
			h.create("api-138", "acme/api", 138, "pod-api-138")
			h.later(400 * time.Millisecond)
			h.status("api-138", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			h.status("api-138", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) {
				s.QueuedAt = &metav1.MicroTime{Time: linePlace}
			})
			h.status("api-137", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "api-138")
		},
		// Issue 31: a claim under a workflow nothing verified is judged by
		// its branch's line without a workflow too, and the new holder of
		// its branch supersedes it under Fifo (the short run of seed 1,
		// after the branch rules).
		"Fifo: a workflow's claim superseded by a higher build of its branch's line": func(h *history) {
			h.setPolicy(buildlockv1.OrderingFifo, 0)
			h.createWorkflow("nightly-2", "acme/web", "nightly", 2)
			h.later(time.Second)
			h.create("web-17", "acme/web", 17, "pod-web-17")
			h.hold("web-17", 1)
			h.status("nightly-2", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "web-17")
		},
		"a workflow's claim superseded by the memory of its branch's line": func(h *history) {
			h.remember("acme/shop", 42, h.now)
			h.createWorkflow("nightly-3", "acme/shop", "nightly", 3)
			h.status("nightly-3", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
		},
		"a build superseded by its branch's build of another workflow that started later": func(h *history) {
			h.createWorkflow("deploy-9", "acme/shop", "deploy", 9)
			h.later(time.Second)
			h.createWorkflow("hotfix-2", "acme/shop", "hotfix", 2)
			h.hold("hotfix-2", 1)
			h.status("deploy-9", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "hotfix-2")
		},
		// Seed 69436560, load-0/load-1 (2026-12-03): the claim watch broke;
		// in the gap build 92 was superseded by its line's build 343, whose
		// hold the retention still counted then; the re-list that showed it
		// came later than the retention after 343's grant.
		"a supersession a re-list found, judged from when the watch last delivered": func(h *history) {
			h.create("b343", "acme/shop", 343, "")
			h.hold("b343", 1)
			h.create("b92", "acme/shop", 92, "")
			h.later(time.Minute - 5*time.Second) // within the retention (an hour, +tolerance) from the grant: see below
			h.c.WatchDown("BuildLock")
			h.later(2 * time.Hour) // the gap: the retention has long passed when the list comes
			b := h.claims["b92"].DeepCopy()
			b.ResourceVersion = h.nextRV()
			b.Status.Phase, b.Status.Reason = buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild
			h.c.RelistClaims([]buildlockv1.BuildLock{*h.claims["b343"], *b}, b.ResourceVersion)
			h.c.WatchUp("BuildLock")
		},
		// Seed 69436560, load-0/load-14 (2026-12-03): build 86 of a line
		// was granted (token 4801), then build 281 (4802) while 86 was
		// ending; the Lease watch delivered 281's grant before the claims'
		// watch delivered 86's Held. 86 was granted first, by its token.
		"a lower token's hold of a line delivered after a higher build's grant": func(h *history) {
			h.create("b86", "acme/shop", 86, "pod-b86")
			h.create("b281", "acme/shop", 281, "pod-b281")
			h.grant("b86", 1)
			h.later(time.Second)
			h.grant("b281", 2)
			h.status("b86", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "", func(st *buildlockv1.BuildLockStatus) {
				st.AcquiredAt = &metav1.MicroTime{Time: h.now.Add(-time.Second)}
			})
		},
		"a second workflow's lower run number": func(h *history) {
			heldAndEnded(h, "deploy-500", "acme/shop", 500, 1)
			bl := h.create("hotfix-12", "acme/shop", 12, "pod-hotfix-12")
			bl.ResourceVersion = h.nextRV()
			bl.Spec.Workflow = "hotfix.yml"
			h.ledger.WroteSpec(ns, "hotfix-12", bl.Spec)
			h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
			h.hold("hotfix-12", 2)
		},
		// The short run of seed 1: web's line waits; web's next build
		// arrives and api's claim too; a manager that has not seen api yet
		// grants web's build; another manager, whose clock is 2 s behind,
		// then places api, at a time earlier than web's line's place.
		"Queue: a grant written before a claim had its place, placed later by a slower clock": func(h *history) {
			h.setPolicy(buildlockv1.OrderingQueue, 0)
			h.create("shop", "acme/shop", 41, "pod-shop")
			h.hold("shop", 1)
			h.create("web-7", "acme/web", 7, "pod-web-7")
			h.status("web-7", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			h.later(time.Second)
			h.create("api", "acme/api", 3, "pod-api")
			h.later(200 * time.Millisecond)
			h.create("web-8", "acme/web", 8, "pod-web-8")
			h.ledger.PodFinishing(ns, "pod-shop", true)
			h.grant("web-8", 2)
			h.status("shop", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
			h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) {
				s.QueuedAt = &metav1.MicroTime{Time: h.now.Add(-2 * time.Second)}
			})
			h.status("web-7", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "web-8")
			h.status("web-8", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
		},
		// Issue 21: what people do around the locks, and how the
		// operator answers.
		"a held lock's grant Lease deleted by a person and written again from the claims, then a hand-off above its token": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 3)
			h.personDeletesLease()
			h.later(100 * time.Millisecond)
			h.grant("a", 3) // the same hold, named again
			h.ledger.PodFinishing(ns, "pod-a", true)
			h.grant("b", 4)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 4, "")
			h.later(time.Minute)
			h.c.CheckHoldDeadlines(h.now)
		},
		"the holder edited to a waiter with the holder's token, the writer and the token by a person, each undone": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 3)
			h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("b/uid-b") })
			h.grant("a", 3)
			h.personEditsLease(func(l *coordinationv1.Lease) {
				l.Annotations = map[string]string{WriterPodAnnotation: "pod-b"}
			})
			h.grant("a", 3)
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(1)) })
			h.grant("a", 3)
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(50)) })
			h.grant("a", 3)
			h.later(time.Minute)
			h.c.CheckHoldDeadlines(h.now)
		},
		// Seen in CI's short run (seed 1): a person freed the Lease while
		// the holder's Held status was still on its way to the cache that
		// showed it waiting; the operator granted it again, with a later
		// token and acquire time, which its status then shows.
		"the holder granted again with a later token after a person freed the Lease": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.hold("a", 3)
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
			h.later(100 * time.Millisecond)
			h.grant("a", 4)
			h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 4, "", func(s *buildlockv1.BuildLockStatus) {
				s.AcquiredAt = &metav1.MicroTime{Time: h.now}
			})
		},
		// The residual of docs/api.md: people delete the grant Lease and
		// the namespace's floor, the holder's claim goes before an operator
		// writes either again, and the managers restart (their memory of
		// tokens gone): the lock's tokens restart.
		"tokens restarting after people deleted both the grant Lease and the token floor": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 22)
			h.personDeletesLease()
			h.personDeletesFloor()
			h.deleteClaim("a", true)
			h.grant("b", 1)
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
		},
		// Bug 15 (issue 31): a person lowers a held lock's token while no
		// manager runs and deletes the holder's claim; the new manager's
		// grant goes above the namespace's floor, which holds the token.
		"a lowered token and a deleted holder, then a grant above the namespace's floor": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 9)
			h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(1)) })
			h.deleteClaim("a", true)
			h.later(2 * time.Second)
			h.grant("b", 109) // the floor (9+99) + 1
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 109, "")
		},
		// Seen in a short run: the operator raised the floor, a person
		// deleted it, the operator deleted the idle Lease.
		"an idle Lease deleted just after a person deleted the floor that held its token": func(h *history) {
			handOff(h)
			h.deleteClaim("a", true)
			h.deleteClaim("b", true)
			h.grant("", 2)
			h.later(time.Hour)
			floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, UID: "floor", ResourceVersion: h.nextRV()},
				Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(2))}}
			h.c.ObserveLease(watch.Added, floor.DeepCopy())
			h.ledger.PersonDeletesLease(floor)
			floor.ResourceVersion = h.nextRV()
			h.c.ObserveLease(watch.Deleted, floor)
			h.c.ObserveLease(watch.Deleted, h.lease.DeepCopy())
		},
		// Seen in a short run: the edit names the waiter, the holder is
		// deleted before the operator undoes it; nothing shows the token
		// any more, and the operator takes the edit for a grant.
		"a person's edit naming the waiter followed, once the holder was deleted": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 3)
			h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("b/uid-b") })
			h.deleteClaim("a", true)
			h.grant("b", 3)
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 3, "")
		},
		"the token floor deleted by a person": func(h *history) {
			floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, UID: "floor", ResourceVersion: h.nextRV()},
				Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(2))}}
			h.c.ObserveLease(watch.Added, floor.DeepCopy())
			h.ledger.PersonDeletesLease(floor)
			floor.ResourceVersion = h.nextRV()
			h.c.ObserveLease(watch.Deleted, floor)
		},
		"a holder deleted while a finalizer keeps it, released Deleted, the waiter granted": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 1)
			h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			h.deleting("a")
			h.c.CheckHoldDeadlines(h.now)
			h.later(time.Second)
			h.grant("b", 2)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonDeleted, 0, "")
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
			h.later(time.Minute)
			h.c.CheckHoldDeadlines(h.now)
			h.deleteClaim("a", true)
		},
		"a flood of other lines, the victim line's memory kept until it ages out": func(h *history) {
			h.grant("", 1)
			h.remember("acme/shop", 42, h.now)
			records := []string{fmt.Sprintf(`{"repo":"acme/shop","branch":"main","build":42,"heldAt":%q}`, h.now.Format(time.RFC3339Nano))}
			for i := range 80 {
				h.later(10 * time.Millisecond)
				if len(records) < 20 { // the flood's share is full: later lines are not remembered
					records = append(records, fmt.Sprintf(`{"repo":"flood/l-%d","branch":"main","build":1,"heldAt":%q,"owner":"system:serviceaccount:chaos-1:flood"}`,
						i, h.now.Format(time.RFC3339Nano)))
				}
				h.lease.ResourceVersion = h.nextRV()
				h.lease.Spec.RenewTime = &metav1.MicroTime{Time: h.now}
				h.lease.Annotations[LinesAnnotation] = "[" + strings.Join(records, ",") + "]"
				h.c.ObserveLease(watch.Modified, h.lease.DeepCopy())
			}
			h.later(2 * time.Hour)
			h.remember("flood/l-80", 1, h.now) // acme/shop's record aged out
		},
		"a Lease of somebody else's, the claim Pending until its owner deleted it": func(h *history) {
			f := h.foreignLease()
			h.create("a", "acme/shop", 41, "pod-a")
			h.status("a", buildlockv1.PhasePending, buildlockv1.ReasonForeignLease, 0, "")
			h.ledger.PersonDeletesLease(f)
			f.ResourceVersion = h.nextRV()
			h.c.ObserveLease(watch.Deleted, f)
			h.hold("a", 1)
		},
		"consent withdrawn and given again by a person": func(h *history) {
			h.c.ObserveInitialNamespaces([]corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "env-0", Labels: map[string]string{buildlockv1.LockedByLabel: "chaos-0"}}}})
			h.consent("", true)
			h.consent("chaos-0", true)
		},
		"a claim superseded because another service account holds its line": func(h *history) {
			a := h.create("a", "acme/shop", 41, "pod-a")
			a.Spec.Requester = &buildlockv1.Requester{Username: "system:serviceaccount:chaos-0:team-a"}
			h.hold("a", 1)
			b := h.create("b", "acme/shop", 42, "pod-b")
			b.Spec.Requester = &buildlockv1.Requester{Username: "system:serviceaccount:chaos-0:team-b"}
			h.status("b", buildlockv1.PhaseSuperseded, buildlockv1.ReasonLineOwnedByOther, 0, "")
		},
		// Seen in a 2-minute run (seed 23): api's line joins just behind
		// shop's; a newer build of shop's line, still Pending, is granted
		// at its line's place (the build it supersedes is no longer
		// Waiting when its Held status comes).
		"Queue: a newer build of the line ahead granted straight from Pending at its line's place": func(h *history) {
			h.setPolicy(buildlockv1.OrderingQueue, 0)
			h.create("web", "acme/web", 7, "pod-web")
			h.hold("web", 1)
			h.create("api", "acme/api", 3, "pod-api")
			h.create("shop-51", "acme/shop", 51, "pod-shop-51")
			place := h.now
			h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) {
				s.QueuedAt = &metav1.MicroTime{Time: place.Add(time.Microsecond)}
			})
			h.status("shop-51", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) { s.QueuedAt = &metav1.MicroTime{Time: place} })
			h.later(time.Second)
			h.create("shop-62", "acme/shop", 62, "pod-shop-62")
			h.ledger.PodFinishing(ns, "pod-web", true)
			h.grant("shop-62", 2)
			h.status("web", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
			h.status("shop-51", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "shop-62")
			h.status("shop-62", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
		},
		"a correct hand-off, a supersession, deletions by the TTL and the owner, and a freed Lease": func(h *history) {
			handOff(h)
			h.create("c", "acme/shop", 40, "pod-c")
			h.status("c", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "a")
			h.later(6 * time.Second)
			h.deleteClaim("a", false) // the finished TTL, 6s after it finished
			h.deleteClaim("b", true)  // its owner
			h.grant("", 2)
		},
		// A pod-less hold expires; its pipeline renews just too late, after
		// a manager decided the expiry and moved the grant but before it
		// wrote the end: the next decision says LockLost. The hold did
		// expire.
		"an expiry decided before a late renewal": func(h *history) {
			h.create("a", "acme/shop", 41, "")
			h.create("b", "acme/shop", 42, "")
			h.hold("a", 1)
			h.later(10500 * time.Millisecond)
			h.renew("a", time.Time{}) // half a second late
			h.grant("b", 2)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
			h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
		},
		"a renewal stamped in year 9999, counted from when it arrived": func(h *history) {
			h.create("a", "acme/shop", 41, "")
			h.hold("a", 1)
			h.later(5 * time.Second)
			h.renew("a", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
			at := h.now
			h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "", func(s *buildlockv1.BuildLockStatus) {
				s.RenewedAt = &metav1.MicroTime{Time: at}
				s.ExpiresAt = &metav1.MicroTime{Time: at.Add(10 * time.Second)}
			})
			h.later(10 * time.Second)
			h.c.CheckHoldDeadlines(h.now)
			h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonExpired, 0, "")
		},
		"a Waiting claim granted whose Held status was never written expires": func(h *history) {
			h.create("a", "acme/shop", 41, "")
			h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			h.grant("a", 1)
			h.later(11 * time.Second)
			h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonExpired, 0, "")
		},
		"a Queue taking turns in the order of the places": func(h *history) { queueOfThree(h, "web") },
		"a newer build of a queued line taking its place": func(h *history) {
			h.setPolicy(buildlockv1.OrderingQueue, 0)
			h.create("shop", "acme/shop", 41, "pod-shop")
			h.hold("shop", 1)
			h.create("web-7", "acme/web", 7, "pod-web-7")
			h.status("web-7", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			place := h.claims["web-7"].Status.QueuedAt.Time
			h.later(time.Second)
			h.create("api", "acme/api", 3, "pod-api")
			h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			h.create("web-8", "acme/web", 8, "pod-web-8")
			h.status("web-8", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) { s.QueuedAt = &metav1.MicroTime{Time: place} })
			h.status("web-7", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "web-8")
			h.ledger.PodFinishing(ns, "pod-shop", true)
			h.grant("web-8", 2)
			h.status("shop", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
			h.status("web-8", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
		},
		"a force-release with a long, hostile reason, quoted in part and escaped": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.hold("a", 1)
			h.ledger.RequestForceRelease(ns, "a")
			h.grant("", 1)
			h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonForceReleased, 0, "", func(s *buildlockv1.BuildLockStatus) {
				s.Message = "Build 41 of acme/shop@main was force-released (" + strconv.Quote("x\n\x1b[31m\u202e"+strings.Repeat("y", 300)) + "…); stop deploying."
			})
		},
		"a hold that exceeded the maximum hold": func(h *history) {
			holdUnderMaxHold(h)
			h.later(time.Minute)
			h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonMaxHoldExceeded, 0, "")
		},
		"an idle Lease deleted after the retention, its token in the floor": func(h *history) {
			handOff(h)
			h.deleteClaim("a", true)
			h.deleteClaim("b", true)
			h.grant("", 2)
			h.later(time.Hour)
			floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, ResourceVersion: h.nextRV()},
				Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(2))}}
			h.c.ObserveLease(watch.Added, floor)
			h.c.ObserveLease(watch.Deleted, h.lease.DeepCopy())
		},
		"an idle Lease deletion seen before the deletion of its last claim, which came first": func(h *history) {
			deleteLeaseAround(h, true)
		},
		"Queue: a claim that arrived after the grant was written, before its Held status": func(h *history) {
			h.setPolicy(buildlockv1.OrderingQueue, 0)
			h.create("g", "acme/shop", 95, "pod-g")
			h.grant("g", 1)
			h.later(time.Second)
			// w started earlier (its timestamp), but was created after the
			// grant: no decision could have placed it ahead of g.
			w := h.create("w", "acme/api", 31, "pod-w")
			w.Spec.Timestamp = buildlockv1.NewTimestamp(t0.Add(-time.Minute))
			h.ledger.WroteSpec(ns, "w", w.Spec)
			h.c.ObserveClaim(watch.Modified, w.DeepCopy())
			h.status("w", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
			h.status("g", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
		},
		"a claim superseded by the line memory of a hold the checker never saw": func(h *history) {
			// Build 42 held and ended while the claim watch was behind;
			// only the Lease remembers it.
			h.grant("", 1)
			h.remember("acme/shop", 42, h.now)
			h.later(time.Second)
			h.create("a", "acme/shop", 41, "pod-a")
			h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
		},
		"a claim superseded by the line memory of a Lease version seen after its status": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
			// The Lease watch is behind the claim watch.
			h.remember("acme/shop", 41, h.now.Add(-time.Second))
		},
		"a re-list showing a claim that held and lost its expired hold while the watch was down": func(h *history) {
			h.create("x", "acme/web", 7, "pod-x")
			h.hold("x", 1)
			h.create("a", "acme/shop", 41, "")
			h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			// The watches break; meanwhile x's pod finishes, a is granted
			// (token 2), its hold expires and is recorded as lost.
			h.ledger.PodFinishing(ns, "pod-x", true)
			h.later(time.Second)
			granted := h.now
			h.later(12 * time.Second)
			x, a := h.claims["x"].DeepCopy(), h.claims["a"].DeepCopy()
			x.ResourceVersion = h.nextRV()
			x.Status.Phase, x.Status.Reason, x.Status.FinishedAt = buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, &metav1.MicroTime{Time: granted}
			a.ResourceVersion = h.nextRV()
			a.Status.Phase, a.Status.Reason, a.Status.FencingToken = buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 2
			a.Status.AcquiredAt, a.Status.FinishedAt = &metav1.MicroTime{Time: granted}, &metav1.MicroTime{Time: h.now}
			l := h.lease.DeepCopy()
			l.ResourceVersion = h.nextRV()
			l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.LeaseTransitions = nil, nil, ptr.To(int32(2))
			h.c.RelistLeases([]coordinationv1.Lease{*l}, l.ResourceVersion)
			h.c.RelistClaims([]buildlockv1.BuildLock{*x, *a}, a.ResourceVersion)
		},
		"a re-list after a missed hand-off and a deletion by the TTL": func(h *history) {
			h.create("a", "acme/shop", 41, "pod-a")
			h.create("b", "acme/web", 7, "pod-b")
			h.hold("a", 1)
			h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
			// The watches break; meanwhile a's pod finishes, b is granted
			// (token 2) and a is deleted by the TTL.
			h.ledger.PodFinishing(ns, "pod-a", true)
			h.later(8 * time.Second)
			b := h.claims["b"].DeepCopy()
			b.ResourceVersion = h.nextRV()
			b.Status.Phase, b.Status.Reason, b.Status.FencingToken = buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2
			b.Status.AcquiredAt = &metav1.MicroTime{Time: h.now}
			h.c.RelistClaims([]buildlockv1.BuildLock{*b}, b.ResourceVersion)
			l := h.lease.DeepCopy()
			l.ResourceVersion = h.nextRV()
			l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("b/uid-b"), ptr.To(int32(2))
			h.c.RelistLeases([]coordinationv1.Lease{*l}, l.ResourceVersion)
		},
	}
	for name, history := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			history(h)
			h.c.CheckGrantsCoverHolds()
			h.c.CheckMemorySupersessions()
			h.c.CheckLeaseDeletions()
			h.c.CheckRestores()
			h.c.CheckForeignLeases()
			h.expect()
		})
	}
}

func TestCheckerReports(t *testing.T) {
	cases := map[string]struct {
		history func(h *history)
		rules   []string
	}{
		// Issue 21.
		"a held lock's grant Lease deleted by a person and never written again": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 3)
				h.personDeletesLease()
				h.c.CheckHoldDeadlines(h.now)
				h.later(11 * time.Second)
				h.c.CheckHoldDeadlines(h.now)
			},
			rules: []string{"grant-record-repaired"},
		},
		"a person's edit of the writer never undone": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 3)
				h.personEditsLease(func(l *coordinationv1.Lease) { l.Annotations = map[string]string{WriterPodAnnotation: "pod-b"} })
				h.later(11 * time.Second)
				h.c.CheckHoldDeadlines(h.now)
			},
			rules: []string{"grant-record-repaired"},
		},
		"tokens restarting after a person deleted the grant Lease": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 3)
				h.personDeletesLease()
				h.ledger.PodFinishing(ns, "pod-a", true)
				h.grant("b", 1) // the floor's value, not above 3
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
			},
			rules: []string{"fencing-token-increases", "fencing-token-increases"},
		},
		"a grant above the namespace's token floor (tokens not reserved)": {
			history: func(h *history) {
				h.unreserved = true
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 1)
			},
			rules: []string{"tokens-reserved"},
		},
		"tokens restarting after a person deleted the token floor alone": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 22)
				h.personDeletesFloor()
				h.deleteClaim("a", true)
				h.grant("b", 1)
			},
			rules: []string{"fencing-token-increases"},
		},
		"the holder's token raised with no person's edit before it": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 3)
				h.later(100 * time.Millisecond)
				h.grant("a", 4)
			},
			rules: []string{"fencing-token-increases"},
		},
		"the holder named again after a person's edit with a token below the highest": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 3)
				h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(50)) })
				h.grant("a", 2)
			},
			rules: []string{"fencing-token-increases"},
		},
		// Bug 15 (issue 31), as make chaos seed 418858340 showed it: the
		// manager that decides after the edit never saw the holder's
		// token, follows the lowered one, and issues it again.
		"a lowered token and a deleted holder, then the holder's token issued again": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 9)
				h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(1)) })
				h.deleteClaim("a", true)
				h.later(2 * time.Second)
				h.grant("b", 9)
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 9, "")
			},
			rules: []string{"fencing-token-increases", "fencing-token-increases"},
		},
		"a lowered token and a deleted holder, then the next token after the lowered one": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 9)
				h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(1)) })
				h.deleteClaim("a", true)
				h.grant("b", 2)
			},
			rules: []string{"fencing-token-increases"},
		},
		"a person's edit naming the waiter followed while the holder still held": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 3)
				h.status("b", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.personEditsLease(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("b/uid-b") })
				h.grant("b", 3)
			},
			rules: []string{"fencing-token-increases"},
		},
		"a grant restored to its holder after the holder was deleted (a stale cache)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1)
				h.deleteClaim("a", true)
				h.grant("", 1)
				h.later(2 * time.Second)
				h.grant("a", 1)
			},
			rules: []string{"grant-record-repaired"},
		},
		"a writer annotation that is not the holder's pod": {
			history: func(h *history) {
				a := h.create("a", "acme/shop", 41, "pod-a")
				a.Spec.PodRef.UID = "6f1c7a2e-5b1d-4c6e-9a0b-2f9d3c4e5a6b"
				h.ledger.WroteSpec(ns, "a", a.Spec)
				h.c.ObserveClaim(watch.Modified, a.DeepCopy())
				h.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + "env-0", UID: "l",
					Annotations: map[string]string{WriterPodAnnotation: "0000dead-5b1d-4c6e-9a0b-2f9d3c4e5a6b"}}}
				h.hold("a", 1)
			},
			rules: []string{"grant-record"},
		},
		"a writer pod kept on the Lease of a holder that has no pod": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + "env-0", UID: "l",
					Annotations: map[string]string{WriterPodAnnotation: "0000dead-5b1d-4c6e-9a0b-2f9d3c4e5a6b"}}}
				h.hold("a", 1)
			},
			rules: []string{"grant-record"},
		},
		"a grant Lease the operator deleted while it named a holder, seen by a re-list": {
			history: func(h *history) { recreatedWhileBlind(h, false) },
			rules:   []string{"grant-record-kept"},
		},
		"a line's memory dropped within the retention": {
			history: func(h *history) {
				h.remember("acme/shop", 42, h.now)
				h.later(time.Minute)
				h.remember("flood/l-1", 1, h.now)
			},
			rules: []string{"line-memory-kept"},
		},
		"a Lease of somebody else's taken over by the operator, and a claim held meanwhile": {
			history: func(h *history) {
				f := h.foreignLease()
				h.create("a", "acme/shop", 41, "pod-a")
				f.ResourceVersion = h.nextRV()
				f.Labels = map[string]string{ManagedByLabel: ManagedByValue}
				f.Spec.HolderIdentity, f.Spec.LeaseTransitions = ptr.To("a/uid-a"), ptr.To(int32(8))
				h.c.ObserveLease(watch.Modified, f.DeepCopy())
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 8, "")
			},
			rules: []string{"foreign-lease-kept", "grant-before-hold", "foreign-lease-kept"},
		},
		"a consent label changed by a pipeline (admission let it through)": {
			history: func(h *history) {
				h.c.ObserveInitialNamespaces([]corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "env-0", Labels: map[string]string{buildlockv1.LockedByLabel: "chaos-0"}}}})
				h.consent("", false)
			},
			rules: []string{"consent-by-people"},
		},
		"a claim being deleted granted the lock": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.deleting("a")
				h.hold("a", 1)
			},
			rules: []string{"deleted-claim-ends"},
		},
		"a holder being deleted that never ends (the finalizer wedges the lock)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 1)
				h.deleting("a")
				h.c.CheckHoldDeadlines(h.now)
				h.later(11 * time.Second)
				h.c.CheckHoldDeadlines(h.now)
			},
			rules: []string{"deleted-claim-ends"},
		},
		"a claim released as Deleted that nobody deleted": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonDeleted, 0, "")
			},
			rules: []string{"released-for-a-reason"},
		},
		"the token floor deleted by nobody who may": {
			history: func(h *history) {
				floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenFloorLease, UID: "floor", ResourceVersion: h.nextRV()},
					Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(2))}}
				h.c.ObserveLease(watch.Added, floor.DeepCopy())
				floor.ResourceVersion = h.nextRV()
				h.c.ObserveLease(watch.Deleted, floor)
			},
			rules: []string{"grant-record-kept"},
		},
		"a claim superseded as LineOwnedByOther with no other owner of its line": {
			history: func(h *history) {
				a := h.create("a", "acme/shop", 41, "pod-a")
				a.Spec.Requester = &buildlockv1.Requester{Username: "system:serviceaccount:chaos-0:team-a"}
				h.hold("a", 1)
				b := h.create("b", "acme/shop", 42, "pod-b")
				b.Spec.Requester = a.Spec.Requester
				h.status("b", buildlockv1.PhaseSuperseded, buildlockv1.ReasonLineOwnedByOther, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a claim superseded as BuildJumpTooLarge by a small step": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 1)
				h.create("b", "acme/shop", 900, "pod-b")
				h.status("b", buildlockv1.PhaseSuperseded, buildlockv1.ReasonBuildJumpTooLarge, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"two claims shown Held at once (the old holder's end was never written)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 1)
				h.hold("b", 2)
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
				h.hold("a", 3)
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
				h.hold("a", 1)
			},
			rules: []string{"terminal-is-terminal"},
		},
		"a holder back to Waiting, which the API's phases do not allow": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.hold("a", 1)
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
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
				h.later(2 * time.Second)
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
		"a claim superseded by one stamped in year 9999 but created before it": {
			history: func(h *history) {
				far := h.create("far", "evil/repo", 1, "pod-far")
				h.later(time.Minute)
				h.create("b", "acme/web", 7, "pod-b")
				// far's timestamp counts as its creation plus 30 s: older.
				far.Spec.Timestamp = buildlockv1.NewTimestamp(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
				h.ledger.WroteSpec(ns, "far", far.Spec)
				h.c.ObserveClaim(watch.Modified, far.DeepCopy())
				h.status("b", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "far")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a pod-less hold expired early": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1)
				h.later(5 * time.Second)
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
		"a claim released as ForceReleased that nobody force-released": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonForceReleased, 0, "")
			},
			rules: []string{"released-for-a-reason"},
		},
		"a live holder pre-empted (LockLost while its pod runs)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 1)
				h.grant("b", 2)
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
				h.status("b", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 2, "")
			},
			rules: []string{"no-preemption"},
		},
		"a pod-less holder's lock lost before its expiry": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1)
				h.later(8 * time.Second)
				h.renew("a", time.Time{}) // in time
				h.later(3 * time.Second)
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 0, "")
			},
			rules: []string{"no-preemption"},
		},
		"a renewal counted from the client's clock (year 9999)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1)
				far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
				h.renew("a", far)
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "", func(s *buildlockv1.BuildLockStatus) {
					s.RenewedAt = &metav1.MicroTime{Time: far}
					s.ExpiresAt = &metav1.MicroTime{Time: far.Add(10 * time.Second)}
				})
			},
			rules: []string{"renewal-observed"},
		},
		"a hold stated to end past its bound": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1, func(s *buildlockv1.BuildLockStatus) {
					s.ExpiresAt = &metav1.MicroTime{Time: h.now.Add(time.Hour)}
				})
			},
			rules: []string{"hold-bounded"},
		},
		"a hold that goes on past its end (a far-future renewal taken at its word)": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "")
				h.hold("a", 1)
				h.renew("a", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
				h.later(12 * time.Second)
				h.c.CheckHoldDeadlines(h.now) // past its end: noticed
				h.later(11 * time.Second)
				h.c.CheckHoldDeadlines(h.now) // and past the slack
			},
			rules: []string{"hold-bounded"},
		},
		"a pod-backed hold that goes on past the maximum hold": {
			history: func(h *history) {
				holdUnderMaxHold(h)
				h.later(62 * time.Second)
				h.c.CheckHoldDeadlines(h.now)
				h.later(11 * time.Second)
				h.c.CheckHoldDeadlines(h.now)
			},
			rules: []string{"hold-bounded"},
		},
		"a maximum hold exceeded early": {
			history: func(h *history) {
				holdUnderMaxHold(h)
				h.later(30 * time.Second)
				h.status("a", buildlockv1.PhaseExpired, buildlockv1.ReasonMaxHoldExceeded, 0, "")
			},
			rules: []string{"expiry"},
		},
		"a rollback: a lower build granted after a higher one of its line held and is gone": {
			history: func(h *history) {
				h.create("b10", "acme/shop", 10, "pod-b10")
				h.hold("b10", 1)
				h.later(time.Minute)
				h.deleteClaim("b10", true)
				h.grant("", 1)
				h.create("b9", "acme/shop", 9, "pod-b9")
				h.hold("b9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a re-run of a build that deployed, granted again under reruns: Refused": {
			history: func(h *history) {
				h.setReruns(buildlockv1.RerunsRefused, "")
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.create("b10-rerun", "acme/shop", 10, "pod-b10-rerun")
				h.hold("b10-rerun", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a re-run granted while the first run's claim goes on": {
			history: func(h *history) {
				// b10 never ended: it still shows Held (two holders), and its
				// build's other run goes too.
				h.create("b10", "acme/shop", 10, "pod-b10")
				h.hold("b10", 1)
				h.create("b10-rerun", "acme/shop", 10, "pod-b10-rerun")
				h.hold("b10-rerun", 2)
			},
			rules: []string{"no-rollback", "one-holder"},
		},
		"a rollback granted under rollbacks: Nobody": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksNobody)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, "alice@example.com")
				h.hold("b9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a pipeline's rollback granted under rollbacks: PeopleOnly": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, "system:serviceaccount:ci:shop")
				h.hold("b9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a claim superseded by a memory of its line that does not exist": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a claim superseded by its branch's build of another workflow that started before it": {
			history: func(h *history) {
				h.createWorkflow("hotfix-2", "acme/shop", "hotfix", 2)
				h.hold("hotfix-2", 1)
				h.later(time.Second)
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a Lease deleted while its lock still had a claim": {
			history: func(h *history) { deleteLeaseAround(h, false) },
			rules:   []string{"grant-record-kept"},
		},
		"a claim superseded by a line memory of a lower build": {
			history: func(h *history) {
				h.remember("acme/shop", 40, h.now)
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a claim superseded by a line memory past the retention": {
			history: func(h *history) {
				h.remember("acme/shop", 42, h.now)
				h.later(2 * time.Hour)
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a Lease whose line memory does not parse": {
			history: func(h *history) {
				h.grant("", 1)
				h.lease.ResourceVersion = h.nextRV()
				h.lease.Annotations = map[string]string{LinesAnnotation: "{not json"}
				h.c.ObserveLease(watch.Modified, h.lease.DeepCopy())
			},
			rules: []string{"grant-record"},
		},
		"Queue order ignored: the later line granted first": {
			history: func(h *history) { queueOfThree(h, "api") },
			rules:   []string{"queue-order", "queue-fairness"},
		},
		"Queue ignored: a line superseded by another": {
			history: func(h *history) {
				h.setPolicy(buildlockv1.OrderingQueue, 0)
				h.create("shop", "acme/shop", 41, "pod-shop")
				h.hold("shop", 1)
				h.create("web", "acme/web", 7, "pod-web")
				h.later(time.Second)
				h.create("api", "acme/api", 3, "pod-api")
				h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.status("web", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "api")
			},
			rules: []string{"superseded-by-newer"},
		},
		"Fifo: a build superseded by another line's": {
			history: func(h *history) {
				h.setPolicy(buildlockv1.OrderingFifo, 0)
				h.create("web", "acme/web", 7, "pod-web")
				h.later(time.Second)
				h.create("api", "acme/api", 3, "pod-api")
				h.status("web", buildlockv1.PhaseSuperseded, buildlockv1.ReasonSupersededByNewerBuild, 0, "api")
			},
			rules: []string{"superseded-by-newer"},
		},
		"a queued claim's place moved (the queue reordered)": {
			history: func(h *history) {
				h.setPolicy(buildlockv1.OrderingQueue, 0)
				h.create("shop", "acme/shop", 41, "pod-shop")
				h.hold("shop", 1)
				h.create("web", "acme/web", 7, "pod-web")
				h.status("web", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
				h.later(time.Second)
				h.status("web", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) {
					s.QueuedAt = &metav1.MicroTime{Time: h.now}
				})
			},
			rules: []string{"queue-place-kept"},
		},
		"a queued claim moved up to the place of another line's": {
			history: func(h *history) {
				h.setPolicy(buildlockv1.OrderingQueue, 0)
				h.create("shop", "acme/shop", 41, "pod-shop")
				h.hold("shop", 1)
				h.create("web", "acme/web", 7, "pod-web")
				h.status("web", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
				webPlace := h.now
				h.later(time.Second)
				h.create("api", "acme/api", 3, "pod-api")
				h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "")
				h.status("api", buildlockv1.PhaseWaiting, buildlockv1.ReasonQueued, 0, "", func(s *buildlockv1.BuildLockStatus) {
					s.QueuedAt = &metav1.MicroTime{Time: webPlace}
				})
			},
			rules: []string{"queue-place-kept"},
		},
		"a force-release reason copied whole into the status": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.ledger.RequestForceRelease(ns, "a")
				h.status("a", buildlockv1.PhaseReleased, buildlockv1.ReasonForceReleased, 0, "", func(s *buildlockv1.BuildLockStatus) {
					s.Message = "force-released: " + strings.Repeat("y", 40000)
				})
			},
			rules: []string{"text-bounded"},
		},
		"an escape sequence printed raw in a message": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "", func(s *buildlockv1.BuildLockStatus) {
					s.Message = "Waiting for build 1 of acme/shop@\x1b[2J to release env-0."
				})
			},
			rules: []string{"text-bounded"},
		},
		"the grant Lease deleted while it names a holder": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.grant("a", 1)
				h.c.ObserveLease(watch.Deleted, h.lease.DeepCopy())
			},
			rules: []string{"grant-record-kept"},
		},
		"an idle grant Lease deleted before its token was kept in the floor": {
			history: func(h *history) {
				h.unreserved = true
				h.grant("", 4)
				h.later(2 * time.Hour)
				h.c.ObserveLease(watch.Deleted, h.lease.DeepCopy())
			},
			rules: []string{"tokens-reserved", "grant-record-kept"},
		},
		"a hold never recorded in the Lease": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "")
			},
			rules: []string{"grant-before-hold"},
		},
		"a re-list showing two holders": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.hold("a", 1)
				b := h.claims["b"].DeepCopy()
				b.ResourceVersion = h.nextRV()
				b.Status.Phase, b.Status.FencingToken, b.Status.Reason = buildlockv1.PhaseHeld, 2, buildlockv1.ReasonAcquired
				h.c.RelistClaims([]buildlockv1.BuildLock{*h.claims["a"], *b}, b.ResourceVersion)
			},
			rules: []string{"one-holder", "grant-before-hold"},
		},
		"a re-list showing a waiting claim lost without ever holding": {
			history: func(h *history) {
				h.create("x", "acme/web", 7, "pod-x")
				h.hold("x", 1)
				h.create("a", "acme/shop", 41, "")
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.later(12 * time.Second)
				a := h.claims["a"].DeepCopy()
				a.ResourceVersion = h.nextRV()
				a.Status.Phase, a.Status.Reason = buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost
				h.c.RelistClaims([]buildlockv1.BuildLock{*h.claims["x"], *a}, a.ResourceVersion)
			},
			rules: []string{"released-for-a-reason"},
		},
		"a re-list showing a claim lost with a token the Lease never gave it": {
			history: func(h *history) {
				h.create("x", "acme/web", 7, "pod-x")
				h.hold("x", 1)
				h.create("a", "acme/shop", 41, "")
				h.status("a", buildlockv1.PhaseWaiting, buildlockv1.ReasonWaitingForHolder, 0, "")
				h.later(12 * time.Second)
				a := h.claims["a"].DeepCopy()
				a.ResourceVersion = h.nextRV()
				a.Status.Phase, a.Status.Reason, a.Status.FencingToken = buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost, 2
				a.Status.AcquiredAt = &metav1.MicroTime{Time: h.now.Add(-11 * time.Second)}
				h.c.RelistClaims([]buildlockv1.BuildLock{*h.claims["x"], *a}, a.ResourceVersion)
			},
			rules: []string{"grant-before-hold"},
		},
		"a re-list missing a live claim nobody deleted": {
			history: func(h *history) {
				h.create("a", "acme/shop", 41, "pod-a")
				h.create("b", "acme/web", 7, "pod-b")
				h.later(time.Second)
				h.c.RelistClaims([]buildlockv1.BuildLock{*h.claims["a"]}, h.nextRV())
			},
			rules: []string{"no-lost-claims"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			tc.history(h)
			h.c.CheckGrantsCoverHolds()
			h.c.CheckMemorySupersessions()
			h.c.CheckLeaseDeletions()
			h.c.CheckRestores()
			h.c.CheckForeignLeases()
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
		}
		if phase == buildlockv1.PhaseHeld {
			bl.Status.AcquiredAt = &metav1.MicroTime{Time: now.Add(-5 * time.Second)}
		}
		if phase == buildlockv1.PhaseWaiting {
			bl.Status.QueuedAt = &metav1.MicroTime{Time: now.Add(-time.Second)}
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
	type tc struct {
		claims   []buildlockv1.BuildLock
		lease    *coordinationv1.Lease
		policy   SettlePolicy
		problems int
	}
	cases := map[string]tc{
		"a live holder and a live waiter are settled": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 3), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseSuperseded, "done", 0)},
			lease:  lease("a", 3),
		},
		"a free lock with only finished claims is settled": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseReleased, "done", 3)},
			lease:  lease("", 3),
		},
		"a free lock whose Lease was deleted is settled": {claims: nil},
		"a Pending claim is not":                         {claims: []buildlockv1.BuildLock{claim("a", "", "running", 0)}, problems: 1},
		"a holder whose pod finished is not":             {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "done", 1)}, lease: lease("a", 1), problems: 1},
		"a holder whose pod is gone is not":              {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "gone", 1)}, lease: lease("a", 1), problems: 1},
		"a waiter behind no holder is not":               {claims: []buildlockv1.BuildLock{claim("b", buildlockv1.PhaseWaiting, "running", 0)}, problems: 1},
		"a holder the Lease does not name is not":        {claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 2)}, lease: lease("b", 2), problems: 1},
		"a Lease naming a holder nobody shows is not": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseReleased, "done", 2)}, lease: lease("a", 2), problems: 1,
		},
		"two waiters are not, with NewestWins": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseWaiting, "", 0)},
			lease:  lease("a", 1), problems: 1,
		},
		"two waiters of two lines are, with Queue": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseWaiting, "", 0)},
			lease:  lease("a", 1), policy: SettlePolicy{Ordering: buildlockv1.OrderingQueue},
		},
		"a pod-backed holder past its maximum hold is not": {
			claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1)}, lease: lease("a", 1),
			policy: SettlePolicy{MaxHold: 2 * time.Second}, problems: 1,
		},
	}
	sameLine := []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1), claim("b", buildlockv1.PhaseWaiting, "", 0), claim("c", buildlockv1.PhaseWaiting, "", 0)}
	sameLine[2].Spec.Repo = sameLine[1].Spec.Repo
	cases["two waiters of one line are not, with Queue"] = tc{claims: sameLine, lease: lease("a", 1), policy: SettlePolicy{Ordering: buildlockv1.OrderingQueue}, problems: 1}
	unplaced := claim("b", buildlockv1.PhaseWaiting, "", 0)
	unplaced.Status.QueuedAt = nil
	cases["a queued claim with no place is not, with Fifo"] = tc{claims: []buildlockv1.BuildLock{claim("a", buildlockv1.PhaseHeld, "running", 1), unplaced},
		lease: lease("a", 1), policy: SettlePolicy{Ordering: buildlockv1.OrderingFifo}, problems: 1}
	expired := claim("a", buildlockv1.PhaseHeld, "", 1)
	expired.Status.AcquiredAt = &metav1.MicroTime{Time: now.Add(-11 * time.Second)}
	cases["a pod-less holder past its expiry is not"] = tc{claims: []buildlockv1.BuildLock{expired}, lease: lease("a", 1), problems: 1}
	renewed := claim("a", buildlockv1.PhaseHeld, "", 1)
	renewed.Status.AcquiredAt = &metav1.MicroTime{Time: now.Add(-11 * time.Second)}
	renewed.Status.RenewedAt = &metav1.MicroTime{Time: now.Add(-2 * time.Second)}
	cases["a pod-less holder renewed in time is settled"] = tc{claims: []buildlockv1.BuildLock{renewed}, lease: lease("a", 1)}
	unseen := claim("a", buildlockv1.PhaseHeld, "running", 1)
	unseen.Generation = 2
	cases["a holder whose latest spec the operator has not seen is not"] = tc{claims: []buildlockv1.BuildLock{unseen}, lease: lease("a", 1), problems: 1}

	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := SettleProblems(tc.claims, tc.lease, pods, tc.policy, now)
			if len(got) != tc.problems {
				t.Errorf("got problems %q, want %d", got, tc.problems)
			}
		})
	}
}

// TestCheckerIsIndependent keeps the checker (every non-test file of this
// package) from importing the operator's code: a bug shared by the operator
// and its judge would go unseen.
func TestCheckerIsIndependent(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == windowPackage {
				// The window rules evaluate the policies' windows with the
				// operator's pure function: they judge its apply, not the
				// function, which has its own tables (windows.go).
				continue
			}
			if strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") || strings.Contains(path, "buildlock/pkg/") {
				t.Errorf("%s imports %s; the checker must depend on the API types and client libraries only", file, path)
			}
		}
	}
	if checked < 5 {
		t.Errorf("checked %d files of the checker; expected checker.go, ledger.go, orderings.go, relist.go and settle.go", checked)
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

// TestCheckActivities feeds the activities rules what holders recorded.
func TestCheckActivities(t *testing.T) {
	granted := func(h *history) {
		h.create("a", "acme/shop", 41, "")
		h.create("b", "acme/web", 7, "")
		h.hold("a", 1)
		h.grant("b", 2)
	}
	killedAt := func(a Activity, ms int, grace time.Duration) Activity {
		a.Killed, a.Grace = t0.Add(time.Duration(ms)*time.Millisecond), grace
		return a
	}
	cases := map[string]struct {
		acts  []Activity
		rules []string
	}{
		"one holder after the other":                {acts: []Activity{command("a", 1, "p1", 0, 1000), command("b", 2, "p2", 1000, 2000)}},
		"the old holder stopping within the window": {acts: []Activity{command("a", 1, "p1", 0, 1500), command("b", 2, "p2", 1000, 2000)}},
		"a killed plugin's command gone at once":    {acts: []Activity{killedAt(command("a", 1, "p1", 0, 1050), 1000, 3*time.Second)}},
		"a killed plugin's command stopped by SIGKILL after its grace period": {
			acts: []Activity{killedAt(command("a", 1, "p1", 0, 4100), 1000, 3*time.Second)},
		},
		"two commands at once for longer than the window": {
			acts: []Activity{command("a", 1, "p1", 0, 5000), command("b", 2, "p2", 1000, 6000)}, rules: []string{"one-deployer"},
		},
		"a command with a token its claim was never granted": {
			acts: []Activity{command("b", 1, "p2", 0, 100)}, rules: []string{"one-deployer"},
		},
		"two jobs deploying under one claim's grant": {
			acts: []Activity{command("a", 1, "matrix/job-1", 0, 500), command("a", 1, "matrix/job-2", 100, 600)}, rules: []string{"claim-per-job"},
		},
		"a command that outlived its killed plugin": {
			acts: []Activity{killedAt(command("a", 1, "p1", 0, 9000), 1000, 3*time.Second)}, rules: []string{"command-dies-with-plugin"},
		},
		"an overlap the person's edit of the grant explains": {
			acts: []Activity{command("a", 1, "p1", 0, 5000), func() Activity { a := command("b", 2, "p2", 1000, 6000); a.Excused = "edit"; return a }()},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			granted(h)
			h.c.CheckActivities(tc.acts, 2*time.Second)
			h.expect(tc.rules...)
		})
	}
}
