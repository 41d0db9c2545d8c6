package chaos

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// This file holds the checker's rules that depend on a lock's policy: its
// ordering (NewestWins, Queue, Fifo) and its maximum hold, which the checker
// learns from the BuildLockPolicies it watches, and the rule that holds in
// every ordering: a line never deploys backwards.

// policyEra is a lock's policy from an instant on.
type policyEra struct {
	from     time.Time
	ordering buildlockv1.Ordering
	// maxHold bounds every hold (zero: none).
	maxHold time.Duration
	// refuseReruns: spec.reruns is Refused; rollbacks is spec.rollbacks
	// (Anyone when unset).
	refuseReruns bool
	rollbacks    buildlockv1.Rollbacks
}

// heldBuild is a build of a line that held a lock.
type heldBuild struct {
	build int64
	at    time.Time // its grant (status.acquiredAt, the granting manager's clock)
	name  string
	// owner is the identity of the claim that held (its requester; in a
	// Lease's memory, the record's owner).
	owner string
	// started is when the build started (its claim's order time; in a
	// Lease's memory, the record's started, zero where it has none).
	started time.Time
	// token is the hold's fencing token (zero where unknown): tokens of a
	// lock only go up, so they order its grants whatever order the
	// checker's two watches delivered them in.
	token int64
}

// judgedOn lists the lines a claim is judged on (the arbiter's rule 3): its
// own and, when it names a workflow, its branch's line without one. The
// checker takes every workflow as one nothing verified (its pipelines are
// service accounts, which have none), which at worst lets it explain more.
func judgedOn(cv *claimView) []line {
	l := lineOf(cv.spec)
	if l.workflow == "" {
		return []line{l}
	}
	return []line{l, {repo: l.repo, branch: l.branch}}
}

// sameBranch reports whether two lines are of one repository and branch.
func sameBranch(a, b line) bool { return a.repo == b.repo && a.branch == b.branch }

// branchExplains reports whether build b of line l, which held (or is
// granted), may supersede claim cv by the rules of cv's branch (the
// arbiter's rules 3 and 6): b is of a line cv is judged on and at or above
// cv's build, or of another line of cv's branch and started no earlier
// than cv.
func branchExplains(cv *claimView, l line, build int64, started time.Time) bool {
	if !sameBranch(l, lineOf(cv.spec)) {
		return false
	}
	if slices.Contains(judgedOn(cv), l) && build >= cv.spec.Build {
		return true
	}
	return l != lineOf(cv.spec) && !started.IsZero() && !started.Before(cv.orderTime())
}

// fairLine follows one line's wait in a Queue: it joined at place q with
// ahead lines queued before it, and others hand-offs went to other lines
// since.
type fairLine struct {
	q      time.Time
	ahead  int
	others int
	name   string
	// joinRV is the resourceVersion of the status that gave the line its
	// place: a grant written before it (in the same decision, or an older
	// one) is not a hand-off the line waited through.
	joinRV uint64
}

// ObservePolicy learns a lock's policy from a BuildLockPolicy event (named
// after its target, in the claims' namespace). Policies of the initial list
// are in effect from the start.
func (c *Checker) ObservePolicy(typ watch.EventType, p *buildlockv1.BuildLockPolicy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observePolicy(typ, p, false)
}

func (c *Checker) observePolicy(typ watch.EventType, p *buildlockv1.BuildLockPolicy, initial bool) {
	now := c.o.Now()
	lock := LockKey{p.Namespace, p.Name}
	era := policyEra{from: now, ordering: buildlockv1.OrderingNewestWins, maxHold: c.o.MaxHold, rollbacks: buildlockv1.RollbacksAnyone}
	if typ != watch.Deleted {
		switch o := p.Spec.Ordering; o {
		case buildlockv1.OrderingQueue, buildlockv1.OrderingFifo:
			era.ordering = o
		}
		if p.Spec.MaxHold != nil {
			era.maxHold = p.Spec.MaxHold.Duration
		}
		era.refuseReruns = p.Spec.Reruns == buildlockv1.RerunsRefused
		switch r := p.Spec.Rollbacks; r {
		case buildlockv1.RollbacksPeopleOnly, buildlockv1.RollbacksNobody:
			era.rollbacks = r
		}
	}
	c.record(Entry{At: now, Kind: "Policy", Type: typ, Lock: lock, Name: p.Name, UID: p.UID, RV: p.ResourceVersion,
		What: fmt.Sprintf("ordering=%s maxHold=%s refuseReruns=%v rollbacks=%s", era.ordering, era.maxHold, era.refuseReruns, era.rollbacks)})
	c.stats.PolicyEvents++
	c.observeWindows(typ, p, now, initial)
	lv := c.lock(lock)
	last := lv.eras[len(lv.eras)-1]
	if era.from = last.from; era == last {
		return
	}
	era.from = now
	if initial {
		era.from = time.Time{}
		lv.eras = []policyEra{era}
		return
	}
	if last.ordering != era.ordering {
		c.stats.OrderingChanges++
		// The queue's history no longer says where a line stands.
		lv.fair = map[line]*fairLine{}
	}
	lv.eras = append(lv.eras, era)
}

// erasSince returns the eras in effect at some point of [from, now].
func (lv *lockView) erasSince(from time.Time) []policyEra {
	i := len(lv.eras) - 1
	for i > 0 && lv.eras[i].from.After(from) {
		i--
	}
	return lv.eras[i:]
}

// stableOrdering returns the ordering of lock lv if it was the only one in
// effect during the policy lag before now: what every manager, however
// late, decides with.
func (c *Checker) stableOrdering(lv *lockView, now time.Time) (buildlockv1.Ordering, bool) {
	eras := lv.erasSince(now.Add(-c.o.PolicyLag))
	for _, e := range eras[1:] {
		if e.ordering != eras[0].ordering {
			return "", false
		}
	}
	return eras[0].ordering, true
}

// orderingsSince returns the orderings in effect at some point since from,
// minus the policy lag.
func (c *Checker) orderingsSince(lv *lockView, from time.Time) map[buildlockv1.Ordering]bool {
	out := map[buildlockv1.Ordering]bool{}
	for _, e := range lv.erasSince(from.Add(-c.o.PolicyLag)) {
		out[e.ordering] = true
	}
	return out
}

// maxHoldShortest is the shortest maximum hold in effect for a hold granted
// at acquired, from then on; bounded is false when none was.
func (c *Checker) maxHoldShortest(lv *lockView, acquired time.Time) (d time.Duration, bounded bool) {
	for _, e := range lv.erasSince(acquired.Add(-c.o.PolicyLag)) {
		if e.maxHold > 0 && (!bounded || e.maxHold < d) {
			d, bounded = e.maxHold, true
		}
	}
	return d, bounded
}

// maxHoldLongest is the longest maximum hold in effect for a hold granted at
// acquired, from then on; bounded is false when at some point none was.
func (c *Checker) maxHoldLongest(lv *lockView, acquired time.Time) (d time.Duration, bounded bool) {
	for _, e := range lv.erasSince(acquired.Add(-c.o.PolicyLag)) {
		if e.maxHold <= 0 {
			return 0, false
		}
		d = max(d, e.maxHold)
	}
	return d, true
}

// atLeastAsNew reports whether claim a may supersede claim b under
// NewestWins: a build of the same line with a build number at least b's, or
// a build of another line that started no earlier than b (by the capped
// start time).
func atLeastAsNew(a, b *claimView) bool {
	if lineOf(a.spec) == lineOf(b.spec) {
		return a.spec.Build >= b.spec.Build
	}
	return !a.orderTime().Before(b.orderTime())
}

// checkSuperseded: a claim is only ever superseded by a claim of its lock
// that is at least as new: in every ordering by a build of its line at
// least as high, or of its branch (any workflow) by one that explains it
// by the branch's rules (branchExplains); across other lines only with
// NewestWins, by a build that started no earlier. A claim superseded by no
// claim (the grant record's memory) must be at or below a build of its
// line that held within the retention, or be explained by a build of its
// branch that did; one refused as a rollback is judged by
// checkRollbackRefusal alone.
func (c *Checker) checkSuperseded(e Entry, lv *lockView, cv *claimView, now time.Time) {
	if c.checkRollbackRefusal(e, lv, cv) {
		return
	}
	if cv.status.SupersededBy == "" {
		c.checkSupersededByLine(e, lv, cv, now)
		return
	}
	by := c.claims[c.names[cv.lock.Namespace+"/"+cv.status.SupersededBy]]
	if by == nil && c.relisting {
		// The superseding claim may come later in the list.
		c.deferred = append(c.deferred, func() { c.checkSuperseded(e, lv, cv, now) })
		return
	}
	orderings := c.orderingsSince(lv, now)
	if by == nil {
		// Created and gone while the checker's watch was down: judge it
		// by the spec the workload created it with, what is certain of it.
		spec, ok := c.ledger.FirstSpec(cv.lock.Namespace, cv.status.SupersededBy)
		if !ok || spec.Target != cv.lock.Target {
			c.violate(e, "superseded-by-newer", "%s was superseded by %q, a claim never seen", cv.name, cv.status.SupersededBy)
			return
		}
		c.stats.GapSupersessions++
		by = &claimView{lock: cv.lock, name: cv.status.SupersededBy, spec: spec, created: cv.created}
		if lineOf(spec) != lineOf(cv.spec) && orderings[buildlockv1.OrderingNewestWins] {
			return // its start time is not known
		}
	}
	switch {
	case by.lock != cv.lock:
		c.violate(e, "superseded-by-newer", "%s was superseded by %s, a claim of another lock (%s)", cv.name, by.name, by.lock)
	case lineOf(by.spec) == lineOf(cv.spec) && by.spec.Build < cv.spec.Build:
		c.violate(e, "superseded-by-newer", "%s (build %d) was superseded by the lower build %d of its line, %s", cv.name, cv.spec.Build, by.spec.Build, by.name)
	case lineOf(by.spec) != lineOf(cv.spec) && branchExplains(cv, lineOf(by.spec), by.spec.Build, by.orderTime()):
		// A claim of its branch: judged on its line, or started later.
	case lineOf(by.spec) != lineOf(cv.spec) && !orderings[buildlockv1.OrderingNewestWins]:
		c.violate(e, "superseded-by-newer", "%s (%s) was superseded by %s of another line (%s) under the ordering %s, where lines never supersede each other",
			cv.name, lineOf(cv.spec), by.name, lineOf(by.spec), orderingList(orderings))
	case lineOf(by.spec) != lineOf(cv.spec) && !atLeastAsNew(by, cv):
		c.violate(e, "superseded-by-newer", "%s (%s#%d, started %s) was superseded by the older %s (%s#%d, started %s)",
			cv.name, lineOf(cv.spec), cv.spec.Build, cv.orderTime().Format(time.StampMicro),
			by.name, lineOf(by.spec), by.spec.Build, by.orderTime().Format(time.StampMicro))
	}
}

func orderingList(m map[buildlockv1.Ordering]bool) string {
	var s []string
	for _, o := range []buildlockv1.Ordering{buildlockv1.OrderingNewestWins, buildlockv1.OrderingQueue, buildlockv1.OrderingFifo} {
		if m[o] {
			s = append(s, string(o))
		}
	}
	return fmt.Sprint(s)
}

// heldAtOrAbove returns a build of cv's line at or above cv's that held
// lock lv within the given time before now (cv itself excluded).
func (c *Checker) heldAtOrAbove(lv *lockView, cv *claimView, now time.Time, within time.Duration) (heldBuild, bool) {
	for _, b := range lv.lines[lineOf(cv.spec)] {
		if b.name != cv.name && b.build >= cv.spec.Build && now.Sub(b.at) < within {
			return b, true
		}
	}
	return c.heldByBranch(lv.lines, cv, now, within)
}

// heldByBranch returns a build of another line of cv's branch, in held
// (the holds seen, or a Lease's memory), that held within the given time
// before now and explains cv's supersession by its branch (branchExplains).
func (c *Checker) heldByBranch(held map[line][]heldBuild, cv *claimView, now time.Time, within time.Duration) (heldBuild, bool) {
	own := lineOf(cv.spec)
	for l, builds := range held {
		if l == own || !sameBranch(l, own) {
			continue
		}
		for _, b := range builds {
			if b.name != cv.name && now.Sub(b.at) < within && branchExplains(cv, l, b.build, b.started) {
				return b, true
			}
		}
	}
	return heldBuild{}, false
}

// checkSupersededByLine: a claim superseded by no claim is superseded by
// what its line held within the retention: a build at or above it, a line
// another service account owns, or a build too far below it. What the
// checker saw hold, or a version of the Lease's memory, must explain it;
// the version that does may still be on its way (two watches), so what is
// not explained yet is judged at the end of the run.
func (c *Checker) checkSupersededByLine(e Entry, lv *lockView, cv *claimView, now time.Time) {
	if c.relisting {
		// Found by a re-list: the supersession happened at some point since
		// the claim watch last delivered, and the retention counts from
		// then at the earliest.
		if since, ok := c.op.blindSince["BuildLock"]; ok && since.Before(now) {
			now = since
		}
	}
	if r := cv.status.Reason; r != buildlockv1.ReasonLineOwnedByOther && r != buildlockv1.ReasonBuildJumpTooLarge {
		if _, ok := c.heldAtOrAbove(lv, cv, now, c.o.Retention+c.o.Tolerance); ok {
			return
		}
	}
	if c.explainedByMemory(lv, cv, now) {
		if cv.status.Reason != buildlockv1.ReasonLineOwnedByOther && cv.status.Reason != buildlockv1.ReasonBuildJumpTooLarge {
			c.stats.MemorySupersessions++
		}
		return
	}
	lv.memoryPending = append(lv.memoryPending, memorySupersession{e: e, cv: cv, now: now})
}

// boundByLine reports whether a build of cv's branch held within the
// retention explains its supersession by the branch's rules (reasons
// LineOwnedByOther and BuildJumpTooLarge): another service account held
// one of the branch's lines, and cv's creator is a service account too; or
// cv's build is more than the jump bound above a build that held of a line
// it is judged on.
func (c *Checker) boundByLine(lv *lockView, cv *claimView, now time.Time) bool {
	within := c.o.Retention + 2*c.o.Tolerance
	own := lineOf(cv.spec)
	judged := judgedOn(cv)
	for _, held := range []map[line][]heldBuild{lv.lines, lv.memory} {
		for l, builds := range held {
			if !sameBranch(l, own) {
				continue
			}
			for _, b := range builds {
				if b.name == cv.name || now.Sub(b.at) >= within {
					continue
				}
				switch cv.status.Reason {
				case buildlockv1.ReasonLineOwnedByOther:
					// A branch belongs to the pipeline that held any of
					// its lines.
					if isServiceAccount(b.owner) && isServiceAccount(cv.requester) && b.owner != cv.requester {
						return true
					}
				case buildlockv1.ReasonBuildJumpTooLarge:
					if slices.Contains(judged, l) && cv.spec.Build-b.build > buildlockv1.DefaultMaxBuildJump {
						return true
					}
				}
			}
		}
	}
	return false
}

// isServiceAccount reports whether a user name is a Kubernetes service
// account's (a pipeline's), as opposed to a person's.
func isServiceAccount(user string) bool { return strings.HasPrefix(user, "system:serviceaccount:") }

// memorySupersession is a claim superseded by the grant record's memory,
// with the status event that showed it and when.
type memorySupersession struct {
	e   Entry
	cv  *claimView
	now time.Time
}

// rememberedAtOrAbove reports whether some version of lock lv's Lease
// remembered a build of cv's line at or above cv's that held within the
// retention before now: what the operator may supersede cv with.
func (c *Checker) rememberedAtOrAbove(lv *lockView, cv *claimView, now time.Time) bool {
	for _, b := range lv.memory[lineOf(cv.spec)] {
		if b.build >= cv.spec.Build && now.Sub(b.at) < c.o.Retention+c.o.Tolerance {
			return true
		}
	}
	_, ok := c.heldByBranch(lv.memory, cv, now, c.o.Retention+c.o.Tolerance)
	return ok
}

// explainedByMemory reports whether what the checker knows now explains a
// supersession that waited for a version of the Lease.
func (c *Checker) explainedByMemory(lv *lockView, cv *claimView, now time.Time) bool {
	if r := cv.status.Reason; r == buildlockv1.ReasonLineOwnedByOther || r == buildlockv1.ReasonBuildJumpTooLarge {
		return c.boundByLine(lv, cv, now)
	}
	return c.rememberedAtOrAbove(lv, cv, now)
}

// noteMemory records the line memory of a version of the Lease and settles
// the supersessions waiting for it. An annotation that does not parse is a
// violation: the operator writes it, and decides from it.
func (c *Checker) noteMemory(e Entry, lv *lockView, l *coordinationv1.Lease) {
	raw := l.Annotations[LinesAnnotation]
	var records []struct {
		Repo     string    `json:"repo"`
		Branch   string    `json:"branch"`
		Workflow string    `json:"workflow"`
		Build    int64     `json:"build"`
		HeldAt   time.Time `json:"heldAt"`
		Owner    string    `json:"owner"`
		Started  time.Time `json:"started"`
	}
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &records); err != nil {
			c.violate(e, "grant-record", "the Lease's %s annotation does not parse: %v", LinesAnnotation, err)
			return
		}
	}
	remembered := map[line]heldBuild{}
	for _, r := range records {
		ln := line{r.Repo, r.Branch, r.Workflow}
		known := false
		for _, b := range lv.memory[ln] {
			known = known || (b.build == r.Build && b.at.Equal(r.HeldAt))
		}
		if !known {
			lv.memory[ln] = append(lv.memory[ln], heldBuild{build: r.Build, at: r.HeldAt, owner: r.Owner, started: r.Started})
		}
		if b, ok := remembered[ln]; !ok || r.Build > b.build {
			remembered[ln] = heldBuild{build: r.Build, at: r.HeldAt, owner: r.Owner}
		}
	}
	c.checkMemoryKept(e, lv, remembered)
	kept := lv.memoryPending[:0]
	for _, p := range lv.memoryPending {
		if c.explainedByMemory(lv, p.cv, p.now) {
			c.stats.MemorySupersessions++
			continue
		}
		kept = append(kept, p)
	}
	lv.memoryPending = kept
}

// checkNoRollback: in every ordering, a build is never granted below a
// build of its line that held before, within the grant retention (an older
// build arriving late), nor at it (another run of the build) while the
// earlier run's claim has not ended, or when the policy refuses re-runs.
// A rollback (spec.rollback) that the policy allows its requester is
// exempt, and its grant resets the line's memory to its build.
func (c *Checker) checkNoRollback(e Entry, lv *lockView, cv *claimView) {
	acquired, _ := c.acquiredAt(lv, cv)
	if acquired.IsZero() {
		acquired = e.At
	}
	l := lineOf(cv.spec)
	rollback := cv.spec.Rollback != nil && c.rollbackAllowed(lv, cv, acquired)
	for _, b := range lv.lines[l] {
		if b.name == cv.name || b.build < cv.spec.Build || c.forgotten(lv, cv.lock, b) {
			continue
		}
		if b.token > 0 && cv.status.FencingToken > 0 && cv.status.FencingToken < b.token {
			// Granted before b (a lower token), seen after it: the claims'
			// watch delivered b's hold first.
			continue
		}
		if b.build > cv.spec.Build && rollback {
			continue
		}
		if b.build == cv.spec.Build && c.ended(cv.lock, b) && (rollback || c.rerunsAllowed(lv, acquired)) {
			c.stats.Reruns++
			continue
		}
		// Both grant times are managers' clocks: allow the skew both ways.
		if acquired.Sub(b.at) < c.o.Retention-2*c.o.Tolerance {
			c.violate(e, "no-rollback", "%s (build %d of %s) was granted %s after build %d of its line (%s) held: a line never deploys backwards within the retention %s",
				cv.name, cv.spec.Build, l, acquired.Sub(b.at).Round(time.Millisecond), b.build, b.name, c.o.Retention)
			break
		}
	}
	if rollback {
		c.stats.Rollbacks++
		lv.lines[l] = nil
	}
	c.rememberHeld(lv, cv, acquired, int64(cv.status.FencingToken))
}

// ended reports whether the claim of build b, which held lock k, has
// ended: it is terminal, being deleted, or gone (during a re-list, as the
// list shows it, since its items are judged one at a time).
func (c *Checker) ended(k LockKey, b heldBuild) bool {
	earlier := c.claims[c.names[k.Namespace+"/"+b.name]]
	if earlier == nil || earlier.deleted || earlier.deleting || isTerminal(phaseOf(earlier.status.Phase)) {
		return true
	}
	if c.listed == nil {
		return false
	}
	listed := c.listed[earlier.uid]
	return listed == nil || listed.DeletionTimestamp != nil || isTerminal(phaseOf(listed.Status.Phase))
}

// rerunsAllowed reports whether some policy of lock lv in effect within the
// policy lag before acquired allowed re-runs.
func (c *Checker) rerunsAllowed(lv *lockView, acquired time.Time) bool {
	for _, era := range lv.erasSince(acquired.Add(-c.o.PolicyLag)) {
		if !era.refuseReruns {
			return true
		}
	}
	return false
}

// rollbackAllowed reports whether some policy in effect within the policy
// lag before acquired may have allowed claim cv's rollback (mayRollBack).
func (c *Checker) rollbackAllowed(lv *lockView, cv *claimView, acquired time.Time) bool {
	for _, era := range lv.erasSince(acquired.Add(-c.o.PolicyLag)) {
		if allowed, _ := c.mayRollBack(era.rollbacks, cv); allowed {
			return true
		}
	}
	return false
}

// rememberHeld records that claim cv's build was granted at acquired with
// token (once per claim): by the Lease that names it, or by its Held status.
func (c *Checker) rememberHeld(lv *lockView, cv *claimView, acquired time.Time, token int64) {
	l := lineOf(cv.spec)
	kept := lv.lines[l][:0]
	for _, b := range lv.lines[l] {
		// Keep what can still matter: the builds held within the retention.
		if b.name != cv.name && acquired.Sub(b.at) < c.o.Retention+2*c.o.Tolerance {
			kept = append(kept, b)
		}
	}
	lv.lines[l] = append(kept, heldBuild{build: cv.spec.Build, at: acquired, name: cv.name, owner: cv.requester, started: cv.orderTime(),
		token: token})
}

// queuedAt is a claim's place in its lock's queue (zero: none).
func (v *claimView) queuedAt() time.Time {
	if v.status.QueuedAt == nil {
		return time.Time{}
	}
	return v.status.QueuedAt.Time
}

// eligible reports whether claim w, Waiting, could still be granted as far
// as the checker knows: it exists, its owner did not delete it, nobody
// force-released it, its pod (if any) runs, and no build of its line at or
// above it held within the retention.
func (c *Checker) eligible(lv *lockView, w *claimView, now time.Time) bool {
	ns := w.lock.Namespace
	switch {
	case w.deleted, c.ledger.DeleteRequested(ns, w.name), c.ledger.ForceReleaseRequested(ns, w.name):
		return false
	case w.spec.PodRef != nil && (c.ledger.PodFinished(ns, w.spec.PodRef) || c.ledger.PodGone(ns, w.spec.PodRef)):
		return false
	}
	_, behind := c.heldAtOrAbove(lv, w, now, c.o.Retention+2*c.o.Tolerance)
	return !behind
}

// waiting returns the claims of lock k whose latest status is Waiting.
func (c *Checker) waiting(k LockKey) []*claimView {
	var out []*claimView
	for _, v := range c.claims {
		if v.lock == k && !v.deleted && phaseOf(v.status.Phase) == buildlockv1.PhaseWaiting {
			out = append(out, v)
		}
	}
	return out
}

// checkQueueOrder: with Queue and Fifo, grants follow the places in the
// queue (status.queuedAt). A claim granted while a live claim that arrived
// before it waits with an earlier place jumped the queue (with Queue, the
// granted claim stands at the earliest place of its line).
func (c *Checker) checkQueueOrder(e Entry, lv *lockView, g, prev *claimView, now time.Time) {
	ordering, stable := c.stableOrdering(lv, now)
	if !stable || (ordering != buildlockv1.OrderingQueue && ordering != buildlockv1.OrderingFifo) || now.Before(lv.unsureUntil) {
		return
	}
	c.stats.QueueGrants++
	place := c.grantedPlace(g, prev, ordering)
	waiters := c.waiting(g.lock)
	for _, w := range waiters {
		if !c.waitedAhead(lv, w, g, place, ordering, waiters, now) {
			continue
		}
		at := "joined in the granting decision"
		if !place.IsZero() {
			at = "place " + place.Format("15:04:05.000000")
		}
		c.violate(e, "queue-order", "%s (%s, %s) was granted under %s while %s (%s, place %s) waited ahead of it",
			g.name, lineOf(g.spec), at, ordering, w.name, lineOf(w.spec), w.queuedAt().Format("15:04:05.000000"))
		return
	}
}

// grantedPlace is the place in the queue of claim g when it was granted:
// its own if it waited (zero: it joined in the granting decision, at the
// back); with Queue, the earliest its line had: a claim of its line still
// Waiting, or one g superseded (written just before its Held status).
func (c *Checker) grantedPlace(g, prev *claimView, ordering buildlockv1.Ordering) time.Time {
	var place time.Time
	if prev != nil && phaseOf(prev.status.Phase) == buildlockv1.PhaseWaiting {
		place = prev.queuedAt()
	}
	if ordering != buildlockv1.OrderingQueue {
		return place
	}
	for _, w := range c.claims {
		inherited := phaseOf(w.status.Phase) == buildlockv1.PhaseWaiting || w.status.SupersededBy == g.name
		q := w.queuedAt()
		if w.lock == g.lock && !w.deleted && inherited && lineOf(w.spec) == lineOf(g.spec) && !q.IsZero() && (place.IsZero() || q.Before(place)) {
			place = q
		}
	}
	return place
}

// waitedAhead reports whether waiting claim w should have been granted
// before g, granted at place: w has an earlier place, arrived before g, could
// be granted, and (with Queue) is of another line, (with Fifo) is not
// behind a build of its line that is at least as high.
func (c *Checker) waitedAhead(lv *lockView, w, g *claimView, place time.Time, ordering buildlockv1.Ordering, waiters []*claimView, now time.Time) bool {
	q := w.queuedAt()
	switch {
	case w.uid == g.uid || q.IsZero() || (!place.IsZero() && !q.Before(place)):
		return false
	case ordering == buildlockv1.OrderingQueue && lineOf(w.spec) == lineOf(g.spec):
		return false
	case !arrivedBefore(w, g):
		return false // a decision that had placed neither takes g first
	case c.grantedBefore(lv, g, w):
		return false // the grant was written before w existed; its Held status came later
	case c.grantedBeforePlaced(lv, g, w):
		// The grant was written while w had no place yet (Pending): the
		// decision did not know it, or knew it only as a newcomer behind
		// g's line. Its place, written later by a manager whose clock
		// may be behind the one that placed g's line, can read earlier.
		return false
	case !c.eligible(lv, w, now):
		return false
	case ordering == buildlockv1.OrderingFifo && c.higherAhead(waiters, w):
		return false // w goes behind a build of its line; that one is judged
	}
	return true
}

// grantedBefore reports whether the Lease named g with its token before
// claim w was created (by resourceVersion: one etcd orders both kinds).
func (c *Checker) grantedBefore(lv *lockView, g, w *claimView) bool {
	rv, ok := lv.grantRVs[holderIdentityToken(holderIdentity(g.name, g.uid), g.status.FencingToken)]
	return ok && w.addedRV > rv
}

// grantedBeforePlaced reports whether the Lease named g with its token
// before claim w was given its place in the queue (by resourceVersion).
func (c *Checker) grantedBeforePlaced(lv *lockView, g, w *claimView) bool {
	rv, ok := lv.grantRVs[holderIdentityToken(holderIdentity(g.name, g.uid), g.status.FencingToken)]
	return ok && w.placedRV > rv
}

// arrivedBefore reports whether a joins a queue before b when both join in
// the same decision: the earlier start (the capped timestamp, else the
// creation), then the earlier creation.
func arrivedBefore(a, b *claimView) bool {
	if c := a.orderTime().Compare(b.orderTime()); c != 0 {
		return c < 0
	}
	return a.created.Before(b.created)
}

func parseRV(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

// higherAhead reports whether a build of w's line at or above it waits with
// an earlier place.
func (c *Checker) higherAhead(waiters []*claimView, w *claimView) bool {
	for _, o := range waiters {
		if o != w && lineOf(o.spec) == lineOf(w.spec) && o.spec.Build >= w.spec.Build && o.queuedAt().Before(w.queuedAt()) {
			return true
		}
	}
	return false
}

// checkPlaceKept: while a lock's ordering is Queue or Fifo, a waiting
// claim's place (status.queuedAt) never changes: restarts, split brain and
// re-lists never reorder the queue. Under Queue the place is its line's:
// a claim written Waiting with a place of its own while a build of its
// line still waited earlier (two managers deciding at once, each status
// write a compare-and-swap of one claim) moves up to that build's place,
// the line's, which the line kept all along.
func (c *Checker) checkPlaceKept(e Entry, lv *lockView, cv, prev *claimView, now time.Time) {
	if prev == nil || phaseOf(prev.status.Phase) != buildlockv1.PhaseWaiting || phaseOf(cv.status.Phase) != buildlockv1.PhaseWaiting {
		return
	}
	ordering, stable := c.stableOrdering(lv, now)
	if !stable || (ordering != buildlockv1.OrderingQueue && ordering != buildlockv1.OrderingFifo) {
		return
	}
	a, b := prev.queuedAt(), cv.queuedAt()
	switch {
	case a.Equal(b):
	case ordering == buildlockv1.OrderingQueue && b.Before(a) && c.lineWaitsAt(cv, b):
		c.stats.LinePlacesTaken++
	default:
		c.violate(e, "queue-place-kept", "%s waits under %s and its place moved %s → %s", cv.name, ordering,
			a.Format("15:04:05.000000"), b.Format("15:04:05.000000"))
	}
}

// lineWaitsAt reports whether another claim of cv's lock and line, at or
// below its build, is shown Waiting with place at.
func (c *Checker) lineWaitsAt(cv *claimView, at time.Time) bool {
	for _, o := range c.claims {
		if o != cv && o.lock == cv.lock && !o.deleted && lineOf(o.spec) == lineOf(cv.spec) && o.spec.Build <= cv.spec.Build &&
			phaseOf(o.status.Phase) == buildlockv1.PhaseWaiting && o.queuedAt().Equal(at) {
			return true
		}
	}
	return false
}

// trackFairness starts following a line that joins a Queue: with k lines
// queued ahead of it, it must hold after at most k+1 hand-offs, however busy
// the other lines are.
func (c *Checker) trackFairness(lv *lockView, cv *claimView, now time.Time) {
	ordering, stable := c.stableOrdering(lv, now)
	q := cv.queuedAt()
	if !stable || ordering != buildlockv1.OrderingQueue || q.IsZero() || now.Before(lv.unsureUntil) {
		return
	}
	l := lineOf(cv.spec)
	if f := lv.fair[l]; f != nil && f.q.Equal(q) {
		f.name = cv.name // a newer build of the line, in its place
		return
	}
	// A new place: the line left the queue since (its claim ended) and
	// joins again at the back.
	ahead := map[line]bool{}
	for _, w := range c.waiting(cv.lock) {
		if wl := lineOf(w.spec); wl != l && !w.queuedAt().IsZero() && w.queuedAt().Before(q) {
			ahead[wl] = true
		}
	}
	lv.fair[l] = &fairLine{q: q, ahead: len(ahead), name: cv.name, joinRV: parseRV(cv.rv)}
	c.stats.FairnessTracked++
}

// countHandOff counts a grant against every line that waits in a Queue:
// the granted line stops waiting; a line that has seen more hand-offs to
// others than lines were ahead of it when it joined, and still waits alive,
// was passed over.
func (c *Checker) countHandOff(e Entry, lv *lockView, g, prev *claimView, now time.Time) {
	if len(lv.fair) == 0 {
		return
	}
	if _, stable := c.stableOrdering(lv, now); !stable || now.Before(lv.unsureUntil) {
		lv.fair = map[line]*fairLine{}
		return
	}
	waiters := c.waiting(g.lock)
	grantRV := lv.grantRVs[holderIdentityToken(holderIdentity(g.name, g.uid), g.status.FencingToken)]
	granted := c.grantedPlace(g, prev, buildlockv1.OrderingQueue)
	for l, f := range lv.fair {
		if l == lineOf(g.spec) {
			delete(lv.fair, l)
			continue
		}
		if grantRV == 0 || grantRV < f.joinRV {
			continue // granted before the line joined (or the grant is unseen)
		}
		still := c.stillWaits(lv, l, waiters, now)
		if still == nil {
			delete(lv.fair, l) // it left the queue; a later build joins anew
			continue
		}
		f.ahead = max(f.ahead, f.others+linesAhead(l, f.q, waiters, g, granted))
		f.others++
		if f.others > f.ahead {
			c.violate(e, "queue-fairness", "%s (%s) joined the queue with %d lines ahead and still waits after %d hand-offs to other lines (this one to %s)",
				still.name, l, f.ahead, f.others, g.name)
			delete(lv.fair, l)
		}
	}
}

// stillWaits returns the claim of line l that waits and could be granted,
// or nil.
func (c *Checker) stillWaits(lv *lockView, l line, waiters []*claimView, now time.Time) *claimView {
	for _, w := range waiters {
		if lineOf(w.spec) == l && c.eligible(lv, w, now) {
			return w
		}
	}
	return nil
}

// linesAhead counts the other lines than l with a place before q: those
// waiting, and the one just granted (g, at place granted: its own, or its
// line's earliest, which a newer build of the line takes even straight
// from Pending). It catches lines ahead that the checker saw Waiting only
// after l joined (written later in the decision that placed them).
func linesAhead(l line, q time.Time, waiters []*claimView, g *claimView, granted time.Time) int {
	ahead := map[line]bool{}
	for _, w := range waiters {
		if lineOf(w.spec) != l && !w.queuedAt().IsZero() && w.queuedAt().Before(q) {
			ahead[lineOf(w.spec)] = true
		}
	}
	if lineOf(g.spec) != l && !granted.IsZero() && granted.Before(q) {
		ahead[lineOf(g.spec)] = true
	}
	return len(ahead)
}
