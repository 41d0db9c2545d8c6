package arbiter

import (
	"slices"
	"time"
)

// The reasons a verdict gives for its phase. They equal the API's
// (api/v1alpha1.Reason*), which describe when each applies.
const (
	ReasonAcquired               = "Acquired"
	ReasonWaitingForHolder       = "WaitingForHolder"
	ReasonQueued                 = "Queued"
	ReasonSupersededByNewerBuild = "SupersededByNewerBuild"
	ReasonDuplicateBuild         = "DuplicateBuild"
	ReasonPodFinished            = "PodFinished"
	ReasonPodGone                = "PodGone"
	ReasonLockLost               = "LockLost"
	ReasonExpired                = "Expired"
	ReasonMaxHoldExceeded        = "MaxHoldExceeded"
	ReasonForceReleased          = "ForceReleased"
	ReasonDeleted                = "Deleted"
	ReasonLineOwnedByOther       = "LineOwnedByOther"
	ReasonBuildJumpTooLarge      = "BuildJumpTooLarge"
	ReasonRollbackNotAllowed     = "RollbackNotAllowed"
	ReasonFrozen                 = "Frozen"
	ReasonFreezeStarted          = "FreezeStarted"
	ReasonLineMemoryFull         = "LineMemoryFull"
)

// Values the arbiter shares with the API (api/v1alpha1); a test keeps them
// equal, so that the arbiter imports nothing but the standard library.
const (
	// DefaultExpiresAfter bounds a pod-less hold whose ExpiresAfter is not
	// positive, as the API does for an absent spec.expiresAfter.
	DefaultExpiresAfter = time.Hour
	// DefaultMaxTimestampSkew is how far after its creation a claim's
	// Timestamp may place it when Policy.MaxTimestampSkew is not positive
	// (see [Policy.OrderTime]).
	DefaultMaxTimestampSkew = 5 * time.Second
	// MaxQuotedLength is the most characters of free text (a force-release
	// reason) that a message quotes.
	MaxQuotedLength = 320
	// DefaultGrantRetention is how long a grant record remembers the build
	// of a line that held the lock when Policy.LineMemory is not positive.
	DefaultGrantRetention = 24 * time.Hour
	// DefaultMaxBuildJump is how far above its line's highest remembered
	// build a claim may go when Policy.MaxBuildJump is not positive.
	DefaultMaxBuildJump = 1000
	// MaxOverrideFor bounds how far ahead an override's expiry may be
	// (Override.InEffect).
	MaxOverrideFor = 24 * time.Hour
)

// LineMemoryBytes bounds Grant.Lines by the sizes of its records
// (LineRecord.Size): a new line is recorded only while they stay within it.
// A record is never evicted to make room; records leave when they are older
// than Policy.LineMemory. So the grant Lease's annotations stay bounded, and
// a flood of lines keeps new lines from being remembered but makes the lock
// forget none.
const LineMemoryBytes = 96 << 10

// LineMemoryBytesPerOwner bounds what the records of one owner (a verified
// identity, LineRecord.Owner) may take of LineMemoryBytes, so that no single
// identity fills the memory. Records without an owner (holders whose
// identity could not be verified) share the whole of LineMemoryBytes: none
// of them can be told from another.
const LineMemoryBytesPerOwner = 24 << 10

// maxKeptLineBytes bounds what a decision keeps of the records it is given:
// a record the operator wrote is within it (its new lines within
// LineMemoryBytes, and a replaced line's record grows by its owner's name
// at most); only a record edited by hand can exceed it, and then its oldest
// records go.
const maxKeptLineBytes = 2 * LineMemoryBytes

// warnAtPercent is how far into its maximum hold a holder is warned.
const warnAtPercent = 80

// none marks "no claim" where claims are referred to by index.
const none = -1

// Decide returns the decision for one lock at instant now: the verdict for
// every claim, the grant after it, and when to look again. The rules it
// applies are in the package comment. Claims are the lock's claims in any
// order; their names are unique, as in a namespace. Decide neither keeps nor
// modifies its inputs.
func Decide(lock Lock, claims []Claim, grant Grant, now time.Time, policy Policy) Decision {
	d := newDecider(lock, claims, grant, now, policy)
	candidates := d.endClaims()
	candidates = d.supersedeBackwards(candidates)
	var queue []int
	switch policy.Ordering {
	case Queue:
		queue = d.queueByLine(candidates)
	case Fifo:
		queue = d.queueByArrival(candidates)
	default:
		queue = d.rankNewest(candidates)
	}
	d.grantAndQueue(queue)
	return d.decision()
}

// decider holds one call of Decide while it works. Claims are referred to by
// their index in claims, which is sorted by identity so that nothing depends
// on the input order.
type decider struct {
	lock  Lock
	grant Grant
	// reserved is the input record's Reserved (restoreRecord drops it; the
	// decision's Grant keeps it): what a new token is above besides
	// maxToken's other sources.
	reserved int64
	now      time.Time
	policy   Policy

	claims   []*Claim  // the input claims, sorted by identity (read, never written)
	verdicts []Verdict // verdicts[i] is for claims[i]; Phase "" until decided.
	// supersededBy[i] is the claim that made claims[i] obsolete, or none
	// (also when a remembered build did, see byMemory).
	supersededBy []int
	// byMemory[i] is the grant record's memory of a higher build of the line
	// that superseded claims[i], if that is what did (nil otherwise).
	byMemory []*LineRecord
	// endedByRecord[i] says that claims[i] was still shown Held and takes the
	// ending the grant record kept for it.
	endedByRecord []bool
	// orderTime[i] is OrderTime(claims[i]).
	orderTime []time.Time
	// place[i] is claims[i]'s place in the queue: its QueuedAt, an inherited
	// one, or now for a newcomer.
	place []time.Time
	// ahead[i] is the claim directly ahead of queued claim i (none: the
	// holder is).
	ahead []int

	// memory is the line memory rule 3 judged by (rememberedLines), and
	// branches what it says across the lines of each branch.
	memory   map[line]*LineRecord
	branches map[branch]*branchMemory
	// budget is the line memory's budgets before this decision's grant
	// (lineBudget), built when first needed (roomFor).
	budget *lineBudget

	repair     string // what rule 11 restored of the input record ("" if nothing)
	granted    int    // the claim the (restored) grant names, or none.
	liveHolder int    // granted, if its hold goes on; else none.
	newHolder  int    // the claim granted by this decision, or none.
	queue      []int
	ended      Ending // the hold this decision ended, if any.
	buf        []byte // the buffer messages are built in.
}

func newDecider(lock Lock, claims []Claim, grant Grant, now time.Time, policy Policy) *decider {
	n := len(claims)
	d := &decider{
		lock:          lock,
		now:           now,
		policy:        policy,
		claims:        byIdentity(claims),
		verdicts:      make([]Verdict, n),
		supersededBy:  make([]int, n),
		byMemory:      make([]*LineRecord, n),
		endedByRecord: make([]bool, n),
		place:         make([]time.Time, n),
		orderTime:     make([]time.Time, n),
		ahead:         make([]int, n),
		granted:       none,
		liveHolder:    none,
		newHolder:     none,
	}
	d.grant, d.repair = d.restoreRecord(grant)
	d.reserved = grant.Reserved
	for i, c := range d.claims {
		from := c.Phase
		if from == "" {
			from = Pending
		}
		d.verdicts[i] = Verdict{Name: c.Name, UID: c.UID, From: from}
		d.orderTime[i] = policy.OrderTime(*c)
		d.supersededBy[i] = none
		if d.granted == none && !c.Phase.IsTerminal() && d.grant.names(c) {
			d.granted = i
		}
	}
	return d
}

// endClaims settles terminal claims (rule 8), the holder (2), other claims
// shown Held (1) and waiters that leave (7), and returns the claims still in
// the running.
func (d *decider) endClaims() (candidates []int) {
	for i, c := range d.claims {
		v := &d.verdicts[i]
		switch {
		case c.Phase.IsTerminal():
			// Rule 8: unchanged; the empty reason tells the controller so.
			v.Phase = c.Phase
		case i == d.granted:
			// Rule 2: the holder keeps the lock until it positively ends
			// (or, rule 12, a freeze that says so starts).
			phase, reason := holdEnd(c, d.grant.AcquiredAt, d.now, d.policy.MaxHold)
			if phase == "" && d.releasedByFreeze(c) {
				phase, reason = Released, ReasonFreezeStarted
			}
			if phase != "" {
				v.Phase, v.Reason = phase, reason
				d.ended = Ending{Name: c.Name, UID: c.UID, Phase: phase, Reason: reason, At: d.now}
			} else {
				d.liveHolder = i
				v.Phase, v.Reason = Held, ReasonAcquired
			}
		case c.Phase == Held:
			// Rule 1: shown Held, but the grant names another claim or none.
			v.Phase, v.Reason = Released, ReasonLockLost
			if e := d.grant.Ended; e.Name == c.Name && e.UID == c.UID {
				v.Phase, v.Reason = e.Phase, e.Reason
				d.endedByRecord[i] = true
			} else if reason := leaveReason(c); reason != "" {
				v.Reason = reason
			}
		case leaveReason(c) != "":
			// Rule 7: a waiter whose pod ended, or that was force-released,
			// leaves.
			v.Phase, v.Reason = Released, leaveReason(c)
		default:
			candidates = append(candidates, i)
		}
	}
	return candidates
}

// releasedByFreeze reports whether the hold of c, which the grant names,
// ends because a freeze whose window releases the holder started after its
// grant (rule 12): not a hold with a verified override, which goes
// through the freeze.
func (d *decider) releasedByFreeze(c *Claim) bool {
	f := d.policy.Freeze
	return f.Frozen && !f.ReleaseSince.IsZero() && f.ReleaseSince.After(d.grant.AcquiredAt) && !c.Override.Verified()
}

// holdEnd returns the phase and reason with which the hold of c granted at
// acquiredAt has ended by now (rule 2), or "" if it goes on.
func holdEnd(c *Claim, acquiredAt, now time.Time, maxHold time.Duration) (Phase, string) {
	if reason := leaveReason(c); reason != "" {
		return Released, reason
	}
	if deadline, reason := holdDeadline(c, acquiredAt, now, maxHold); !deadline.IsZero() && !now.Before(deadline) {
		return Expired, reason
	}
	return "", ""
}

// holdDeadline returns when the hold of c granted at acquiredAt ends by time
// alone, and the reason it will end with; zero if it never does. A pod-less
// hold ends ExpiresAfter after its grant or last renewal; every hold ends at
// its maximum hold, whichever comes first.
func holdDeadline(c *Claim, acquiredAt, now time.Time, maxHold time.Duration) (time.Time, string) {
	var deadline time.Time
	reason := ""
	if c.Pod == NoPod {
		from := acquiredAt
		if r := renewal(c, now); r.After(from) {
			from = r
		}
		deadline, reason = from.Add(expiresAfter(c)), ReasonExpired
	}
	if maxHold > 0 {
		if end := acquiredAt.Add(maxHold); deadline.IsZero() || end.Before(deadline) {
			deadline, reason = end, ReasonMaxHoldExceeded
		}
	}
	return deadline, reason
}

// renewal is the instant the latest renewal of c counts from at now: the
// recorded one, or a new one at min(RenewTime, now), whichever is later.
func renewal(c *Claim, now time.Time) time.Time {
	r := c.RenewedAt
	if !c.RenewTime.IsZero() {
		seen := c.RenewTime
		if now.Before(seen) {
			seen = now
		}
		if seen.After(r) {
			r = seen
		}
	}
	return r
}

func expiresAfter(c *Claim) time.Duration {
	if c.ExpiresAfter <= 0 {
		return DefaultExpiresAfter
	}
	return c.ExpiresAfter
}

// leaveReason is why a claim ends regardless of time: it was deleted (a
// finalizer keeps it), a person force-released it, or its pod ended; ""
// while it may go on.
func leaveReason(c *Claim) string {
	switch {
	case c.Deleting:
		return ReasonDeleted
	case c.ForceRelease != "":
		return ReasonForceReleased
	}
	return podEndReason(c.Pod)
}

// podEndReason is the reason a claim ends for what is known of its pod, or ""
// while the pod may be alive.
func podEndReason(s PodState) string {
	switch s {
	case PodFinished:
		return ReasonPodFinished
	case PodGone:
		return ReasonPodGone
	}
	return ""
}

// line is a claim's repository, branch and workflow: builds of one line
// replace each other.
type line struct{ repo, branch, workflow string }

func lineOf(c Claim) line { return line{c.Repo, c.Branch, c.Workflow} }

// supersedeBackwards applies rule 3: a rollback its policy does not allow
// is Superseded; so is a candidate that the live holder's build refuses
// (behind it on a line the candidate is judged on), and one that the line
// memory refuses (memoryRefusal). It returns the others.
func (d *decider) supersedeBackwards(candidates []int) []int {
	d.memory, d.branches = d.rememberedLines()
	out := candidates[:0:0]
	for _, i := range candidates {
		c := d.claims[i]
		if c.Rollback && !d.mayRollBack(c) {
			d.verdicts[i].Phase, d.verdicts[i].Reason = Superseded, ReasonRollbackNotAllowed
			continue
		}
		if h := d.liveHolder; h != none && judgedOn(c, lineOf(*d.claims[h])) && behind(c, d.claims[h].Build) {
			d.supersede(i, h, inLineReason(c.Build, d.claims[h].Build))
			continue
		}
		if reason, r := d.memoryRefusal(i); reason != "" {
			d.verdicts[i].Phase, d.verdicts[i].Reason = Superseded, reason
			d.byMemory[i] = r
			continue
		}
		out = append(out, i)
	}
	return out
}

// memoryRefusal is why the line memory refuses claim i (rule 3), and the
// record that does, or "": the record of its line, or, for a claim whose
// workflow nothing verified, that of its branch's line without a workflow,
// has a higher build, or the same one where the policy refuses re-runs;
// a build of another line of its branch that started after it held since
// the branch's last rollback; its branch's latest grant went to another
// pipeline; or, unless it is a person's, its build jumps too far above its
// line's. Rollbacks the policy allows are exempt from the first two.
func (d *decider) memoryRefusal(i int) (string, *LineRecord) {
	c := d.claims[i]
	own := d.memory[lineOf(*c)]
	if reason := d.backwards(c, own); reason != "" {
		return reason, own
	}
	if unverifiedWorkflow(c) {
		if r := d.memory[branchLine(c)]; d.backwards(c, r) != "" {
			return d.backwards(c, r), r
		}
	}
	if b := d.branches[branchOfClaim(c)]; b != nil {
		if r := b.startedAfter(lineOf(*c), d.orderTime[i]); r != nil && !c.Rollback {
			return ReasonSupersededByNewerBuild, r
		}
		if ownedByOther(b.latest, c) {
			return ReasonLineOwnedByOther, b.latest
		}
	}
	if own != nil && !isPerson(c) && c.Build-own.Build > d.maxBuildJump() {
		return ReasonBuildJumpTooLarge, own
	}
	return "", nil
}

// backwards is why record r (nil: none) refuses claim c as going
// backwards on r's line, or "": a higher build (SupersededByNewerBuild),
// or the same one where the policy refuses re-runs (DuplicateBuild). A
// rollback never goes backwards.
func (d *decider) backwards(c *Claim, r *LineRecord) string {
	switch {
	case r == nil || c.Rollback:
	case c.Build < r.Build:
		return ReasonSupersededByNewerBuild
	case c.Build == r.Build && d.policy.RefuseReruns:
		return ReasonDuplicateBuild
	}
	return ""
}

// unverifiedWorkflow reports whether claim c names a workflow that nothing
// verified.
func unverifiedWorkflow(c *Claim) bool { return c.Workflow != "" && !c.WorkflowVerified }

// judgedOn reports whether claim c is judged by the build numbers of line
// l (rule 3): l is c's own line, or c's workflow is not verified and l is
// its branch's line without one.
func judgedOn(c *Claim, l line) bool {
	return l == lineOf(*c) || (l.workflow == "" && unverifiedWorkflow(c) && l == branchLine(c))
}

// behind reports whether claim c must give way to a build of its line that
// holds or waits ahead of it: it is the same build (two runs of one build
// never go at once), or a lower one and no rollback.
func behind(c *Claim, ahead int64) bool {
	return c.Build == ahead || (c.Build < ahead && !c.Rollback)
}

// mayRollBack reports whether the policy lets claim c, a rollback, go
// below its line's memory: anyone's, a person's only (an identity the API
// server verified that is not a pipeline's: an unverified one fails
// closed), or nobody's.
func (d *decider) mayRollBack(c *Claim) bool {
	switch d.policy.Rollbacks {
	case RollbacksNobody:
		return false
	case RollbacksPeopleOnly:
		return isPerson(c)
	}
	return true
}

// ownedByOther reports whether record r, of the latest grant of c's
// branch, binds the branch to a pipeline other than claim c's: c's
// identity is a pipeline too, and another one held the branch last.
func ownedByOther(r *LineRecord, c *Claim) bool {
	return r != nil && IsPipeline(r.Owner, r.OwnerCI) && IsPipeline(c.Identity, c.CIIdentity) && r.Owner != c.Identity
}

// isPerson reports whether claim c was created by a verified identity that
// is not a pipeline: a person, whom neither a line's owner nor
// Policy.MaxBuildJump binds.
func isPerson(c *Claim) bool {
	return c.Identity != "" && !IsPipeline(c.Identity, c.CIIdentity)
}

func (d *decider) maxBuildJump() int64 {
	if d.policy.MaxBuildJump <= 0 {
		return DefaultMaxBuildJump
	}
	return d.policy.MaxBuildJump
}

// inLineReason is the reason a build is superseded by another build of its
// line: DuplicateBuild for the same number, else SupersededByNewerBuild.
func inLineReason(build, by int64) string {
	if build == by {
		return ReasonDuplicateBuild
	}
	return ReasonSupersededByNewerBuild
}

// collapseLines applies rule 4 (one survivor per line): among the candidates
// of one line only the highest build survives; the others are Superseded by
// it. It returns the survivors, and leaves in d.place the earliest place in
// the queue that a member of each survivor's line had (zero if none).
func (d *decider) collapseLines(candidates []int) []int {
	type lineState struct {
		best  int
		place time.Time
	}
	lines := make(map[line]*lineState, min(len(candidates), 64))
	states := make([]lineState, 0, len(candidates)) // one allocation for every line's state
	for _, i := range candidates {
		c := d.claims[i]
		st, ok := lines[lineOf(*c)]
		if !ok {
			states = append(states, lineState{best: i})
			st = &states[len(states)-1]
			lines[lineOf(*c)] = st
		} else if compareInLine(c, d.claims[st.best]) < 0 {
			st.best = i
		}
		if q := c.QueuedAt; !q.IsZero() && (st.place.IsZero() || q.Before(st.place)) {
			st.place = q
		}
	}
	survivors := make([]int, 0, len(states))
	for _, st := range states {
		survivors = append(survivors, st.best)
		d.place[st.best] = st.place
	}
	for _, i := range candidates {
		best := lines[lineOf(*d.claims[i])].best
		if i != best {
			d.supersede(i, best, inLineReason(d.claims[i].Build, d.claims[best].Build))
		}
	}
	return survivors
}

// rankNewest applies NewestWins (rule 5): one survivor per line, ranked by
// [Newer]. Only the first two matter (the one granted, if the lock is free,
// and the one that takes the slot), so they are picked rather than sorted.
func (d *decider) rankNewest(candidates []int) []int {
	survivors := d.collapseLines(candidates)
	for k := 0; k < min(2, len(survivors)); k++ {
		best := k
		for j := k + 1; j < len(survivors); j++ {
			if d.compareNewer(survivors[j], survivors[best]) < 0 {
				best = j
			}
		}
		survivors[k], survivors[best] = survivors[best], survivors[k]
	}
	for k := range min(2, len(survivors)) {
		d.place[survivors[k]] = d.placeOf(survivors[k])
	}
	return survivors
}

// compareNewer is [Newer] on claims i and j, with their OrderTime computed
// once.
func (d *decider) compareNewer(i, j int) int {
	if c := d.orderTime[j].Compare(d.orderTime[i]); c != 0 {
		return c
	}
	return compareNewerTie(d.claims[i], d.claims[j])
}

// placeOf is the place of a claim that waits with NewestWins: its own, its
// line's, or now.
func (d *decider) placeOf(i int) time.Time {
	switch {
	case !d.claims[i].QueuedAt.IsZero():
		return d.claims[i].QueuedAt
	case !d.place[i].IsZero():
		return d.place[i]
	}
	return d.now
}

// queueByLine applies Queue (rule 5): one survivor per line, which keeps the
// line's place, in the order of the places.
func (d *decider) queueByLine(candidates []int) []int {
	survivors := d.collapseLines(candidates)
	d.placeAll(survivors)
	d.sortByPlace(survivors)
	return survivors
}

// queueByArrival applies Fifo (rule 5): every candidate in the order of its
// place, except a build that must give way (behind) to one of its line ahead
// of it: another run of the same build, or a higher build (unless it is a
// rollback). A rollback queued ahead does not lower the builds behind it:
// they are judged as the line's memory will judge them when they are next.
func (d *decider) queueByArrival(candidates []int) []int {
	ordered := slices.Clone(candidates)
	d.placeAll(ordered)
	d.sortByPlace(ordered)
	type lineBuild struct {
		l     line
		build int64
	}
	first := make(map[lineBuild]int) // the first claim of each build ahead
	highest := make(map[line]int)    // the highest build of each line ahead
	survivors := ordered[:0]
	for _, i := range ordered {
		c := d.claims[i]
		l := lineOf(*c)
		if j, ok := first[lineBuild{l, c.Build}]; ok {
			d.supersede(i, j, ReasonDuplicateBuild)
			continue
		}
		j, ok := highest[l]
		if ok && behind(c, d.claims[j].Build) {
			d.supersede(i, j, ReasonSupersededByNewerBuild)
			continue
		}
		if !ok || c.Build > d.claims[j].Build {
			highest[l] = i
		}
		first[lineBuild{l, c.Build}] = i
		survivors = append(survivors, i)
	}
	return survivors
}

// placeAll gives each claim its place in the queue: the earliest one its
// line had (left in d.place by collapseLines, with Queue), else its own,
// else a new place at the back. Newcomers join in the order of their
// OrderTime, then [compareArrival], each strictly after every place already
// taken (one microsecond apart, the precision the API stores), so that the
// queue's order is total and the same in every later decision.
func (d *decider) placeAll(idx []int) {
	var newcomers []int
	back := d.now.Add(-time.Microsecond)
	for _, i := range idx {
		switch {
		case !d.place[i].IsZero():
		case !d.claims[i].QueuedAt.IsZero():
			d.place[i] = d.claims[i].QueuedAt
		default:
			newcomers = append(newcomers, i)
			continue
		}
		if d.place[i].After(back) {
			back = d.place[i]
		}
	}
	slices.SortFunc(newcomers, func(i, j int) int {
		if c := d.orderTime[i].Compare(d.orderTime[j]); c != 0 {
			return c
		}
		return compareArrival(d.claims[i], d.claims[j])
	})
	for _, i := range newcomers {
		back = back.Add(time.Microsecond)
		d.place[i] = back
	}
}

// sortByPlace orders claims by their place in the queue, then by identity
// (places are distinct but for inconsistent inputs).
func (d *decider) sortByPlace(idx []int) {
	slices.SortFunc(idx, func(i, j int) int {
		if c := d.place[i].Compare(d.place[j]); c != 0 {
			return c
		}
		return compareIdentity(d.claims[i], d.claims[j])
	})
}

// grantAndQueue applies rule 6 to the ranked survivors: without a live
// holder the first is granted the lock; then NewestWins keeps one waiting
// claim and supersedes the rest by it, while Queue and Fifo queue them all.
// A claim whose build the line memory would not remember (roomFor) is not
// granted: the next is, and it waits with reason LineMemoryFull. While the
// target is frozen (rule 12) the first ranked survivor whose override is
// in effect is granted instead, if any, and the others wait with reason
// Frozen, but for those with an override in effect, which go through the
// freeze when their turn comes.
func (d *decider) grantAndQueue(ranked []int) {
	frozen := d.policy.Freeze.Frozen
	if d.liveHolder == none && len(ranked) > 0 {
		if next := d.nextGrant(ranked); next >= 0 {
			d.newHolder = ranked[next]
			d.budget = d.grantedBudget(d.claims[d.newHolder])
			d.verdicts[d.newHolder].Phase = Held
			d.verdicts[d.newHolder].Reason = ReasonAcquired
			rest := append(slices.Clip(ranked[:next]), ranked[next+1:]...)
			ranked = d.judgeBehind(d.newHolder, rest)
		}
	}
	if len(ranked) == 0 {
		return
	}
	reason := ReasonQueued
	if d.policy.Ordering != Queue && d.policy.Ordering != Fifo {
		reason = ReasonWaitingForHolder
		if d.newHolder != none {
			// The new holder may have superseded one of the two ranked
			// first: the newest of the others takes the slot.
			d.takeSlot(ranked)
		}
		for _, i := range ranked[1:] {
			d.supersede(i, ranked[0], ReasonSupersededByNewerBuild)
		}
		ranked = ranked[:1]
	}
	d.queue = ranked
	prev := none
	for _, i := range ranked {
		d.verdicts[i].Phase, d.verdicts[i].Reason = Waiting, reason
		switch {
		case !d.roomFor(i):
			d.verdicts[i].Reason = ReasonLineMemoryFull
		case frozen && !d.claims[i].Override.InEffect(d.now):
			d.verdicts[i].Reason = ReasonFrozen
		}
		d.verdicts[i].QueuedAt = d.place[i]
		d.ahead[i], prev = prev, i
	}
}

// takeSlot moves the newest of ranked (NewestWins survivors, ranked only
// as far as the first two) to its front, with its place.
func (d *decider) takeSlot(ranked []int) {
	best := 0
	for k := 1; k < len(ranked); k++ {
		if d.compareNewer(ranked[k], ranked[best]) < 0 {
			best = k
		}
	}
	ranked[0], ranked[best] = ranked[best], ranked[0]
	d.place[ranked[0]] = d.placeOf(ranked[0])
}

// nextGrant returns the index in ranked of the claim to grant: the first
// whose build the line memory would remember and, while the target is
// frozen, whose override is in effect (with NewestWins, whose survivors
// are ranked only as far as the first two, the newest such); -1 if none.
func (d *decider) nextGrant(ranked []int) int {
	eligible := func(i int) bool {
		return (!d.policy.Freeze.Frozen || d.claims[i].Override.InEffect(d.now)) && d.roomFor(i)
	}
	if d.policy.Ordering == Queue || d.policy.Ordering == Fifo || eligible(ranked[0]) {
		return slices.IndexFunc(ranked, eligible)
	}
	next := -1
	for k, i := range ranked {
		if eligible(i) && (next < 0 || d.compareNewer(i, ranked[next]) < 0) {
			next = k
		}
	}
	return next
}

// judgeBehind applies rule 3 to the claims ranked behind claim h, just
// granted, as h's record will judge them once h holds, so that the
// decision is a fixed point; it returns the others. Of h's branch: a claim
// judged on h's line (judgedOn) at or below h's build would deploy
// backwards after it (only an override that jumps the queue of a freeze,
// with Fifo, leaves such a build ahead of h), and is Superseded by h; so
// is one of another line whose build started before h's, unless it is a
// rollback; and one of another pipeline than h's (LineOwnedByOther), or of
// h's line and a jump too far above h's build (BuildJumpTooLarge, Fifo
// queues several builds of one line), is refused by h's record.
func (d *decider) judgeBehind(h int, ranked []int) []int {
	held := d.claims[h]
	r := new(heldRecord(held, d.now, d.maxToken()+1, d.orderTime[h]))
	out := ranked[:0]
	for _, i := range ranked {
		c := d.claims[i]
		reason := ""
		switch {
		case branchOfClaim(c) != branchOfClaim(held):
		case judgedOn(c, lineOf(*held)) && c.Build <= held.Build:
			d.supersede(i, h, inLineReason(c.Build, held.Build))
			continue
		case lineOf(*c) != lineOf(*held) && !c.Rollback && d.orderTime[i].Before(d.orderTime[h]):
			d.supersede(i, h, ReasonSupersededByNewerBuild)
			continue
		case ownedByOther(r, c):
			reason = ReasonLineOwnedByOther
		case lineOf(*c) == lineOf(*held) && !isPerson(c) && c.Build-r.Build > d.maxBuildJump():
			reason = ReasonBuildJumpTooLarge
		}
		if reason == "" {
			out = append(out, i)
			continue
		}
		d.verdicts[i].Phase, d.verdicts[i].Reason = Superseded, reason
		d.byMemory[i] = r
	}
	return out
}

func (d *decider) supersede(i, by int, reason string) {
	d.verdicts[i].Phase, d.verdicts[i].Reason = Superseded, reason
	d.verdicts[i].SupersededBy = d.claims[by].Name
	d.supersededBy[i] = by
}

// holder is the claim that holds after the decision, or none.
func (d *decider) holder() int {
	if d.liveHolder != none {
		return d.liveHolder
	}
	return d.newHolder
}

// queued reports whether the claim waits with Queue or Fifo (reason Queued,
// or Frozen): its status names neither holder nor waiting claim.
func (d *decider) queued(i int) bool {
	return d.verdicts[i].Phase == Waiting && (d.policy.Ordering == Queue || d.policy.Ordering == Fifo)
}

// decision assembles the Decision once every claim has its phase.
func (d *decider) decision() Decision {
	floor := d.grant.Floor
	if d.repair == "" && !d.grant.Absent && d.liveHolder == d.granted && d.forgets() {
		d.repair = RepairLines
	}
	out := Decision{Grant: d.grant, Queued: len(d.queue), Repair: d.repair}
	switch {
	case d.liveHolder != none:
		// The holder stays: the grant is left exactly as it is, unless rule
		// 11 restored it (a restored record also gets the memory of the
		// lines the claims show).
		if d.repair != "" {
			out.Grant.Lines = d.recordLine(nil)
			out.GrantChanged = true
		}
	case d.newHolder != none:
		c := d.claims[d.newHolder]
		token := d.maxToken() + 1
		out.Grant = Grant{Holder: c.Name, HolderUID: c.UID, Token: token, AcquiredAt: d.now,
			Lines: d.recordLine(c), Ended: d.endedHold(), Writer: c.Writer, Audit: d.audit(c, token), Floor: floor}
		out.GrantChanged = true
	case d.grant.Holder != "":
		// The holder ended or vanished and nobody takes over: free the lock,
		// keeping the token floor, the memory of the lines and the audit.
		out.Grant = Grant{Token: d.maxToken(), Lines: d.recordLine(nil), Ended: d.endedHold(), Audit: d.audit(nil, 0), Floor: floor}
		out.GrantChanged = true
	case d.grant.Absent:
		// No record, and nobody holds: write one only to keep the memory of
		// the builds the claims show held (rule 11).
		if lines := d.recordLine(nil); len(lines) > 0 {
			out.Grant = Grant{Token: d.maxToken(), Lines: lines, Floor: floor}
			out.GrantChanged, out.Repair = true, RepairRecreated
		}
	case d.repair == RepairLines:
		// A free record that forgot builds the claims show held.
		out.Grant.Lines, out.Grant.Token = d.recordLine(nil), d.maxToken()
		out.GrantChanged = true
	}
	if h := d.holder(); h != none {
		out.Holder = d.claims[h].Name
		out.NextLook = d.describeHold(h, out.Grant)
		v := &d.verdicts[h]
		v.Overridden = d.policy.Freeze.Frozen && v.From != Held && d.claims[h].Override.Verified()
	}
	out.NextLook = earliest(out.NextLook, d.overrideChange())
	if slices.ContainsFunc(d.queue, func(i int) bool { return d.verdicts[i].Reason == ReasonLineMemoryFull }) {
		// A record that leaves the memory may make room for a line that
		// waits for it.
		out.NextLook = earliest(out.NextLook, d.memoryFrees())
	}
	if len(d.queue) > 0 {
		out.Waiting = d.claims[d.queue[0]].Name
	}
	out.Grant.Reserved = d.reserved
	d.completeVerdicts(&out)
	out.Verdicts = d.writeOrder()
	return out
}

// completeVerdicts gives every changed verdict what the decision out
// names: its holder and waiting claim, its renewal's record and its
// message.
func (d *decider) completeVerdicts(out *Decision) {
	for i := range d.verdicts {
		v := &d.verdicts[i]
		if v.Reason == "" {
			continue
		}
		if !d.queued(i) {
			v.Holder = out.Holder
			if v.Phase != Held {
				// A holder's status names no waiter: each new waiter
				// would rewrite it (one status write more per claim).
				v.Waiting = out.Waiting
			}
		}
		if !v.Phase.IsTerminal() {
			v.RenewedAt = renewal(d.claims[i], d.now)
		}
		v.Message = d.message(i, out.Grant)
	}
}

// overrideChange is the next instant after now at which time alone changes
// whether the override of a claim that waits through a freeze is in effect
// (it lapses, or comes within MaxOverrideFor), and so its verdict; zero if
// none.
func (d *decider) overrideChange() time.Time {
	if !d.policy.Freeze.Frozen {
		return time.Time{}
	}
	var next time.Time
	for _, i := range d.queue {
		o := d.claims[i].Override
		switch {
		case !o.Verified() || !o.Expires.After(d.now):
		case o.InEffect(d.now):
			next = earliest(next, o.Expires)
		default:
			next = earliest(next, o.Expires.Add(-MaxOverrideFor))
		}
	}
	return next
}

// endedHold is how the input grant's hold ended when this decision moves
// the grant: as decided (d.ended), or, when the claim the grant named is
// not among the claims at all, Released with reason Deleted (a claim that
// is gone never comes back with its UID). Recording the vanished holder's
// end keeps rule 11 from taking a stale picture of it, still shown Held,
// for a hold that goes on.
func (d *decider) endedHold() Ending {
	if d.ended.Name != "" || d.granted != none || d.grant.Holder == "" {
		return d.ended
	}
	if slices.ContainsFunc(d.claims, func(c *Claim) bool { return d.grant.names(c) }) {
		return d.ended // a terminal claim: its status says how it ended
	}
	return Ending{Name: d.grant.Holder, UID: d.grant.HolderUID, Phase: Released, Reason: ReasonDeleted, At: d.now}
}

// maxToken is the highest fencing token known (rule 6): the record's, its
// floor, the input's reservation, and every claim's.
func (d *decider) maxToken() int64 {
	highest := max(d.grant.Token, d.grant.Floor, d.reserved)
	for _, c := range d.claims {
		highest = max(highest, c.FencingToken)
	}
	return highest
}

// describeHold fills in the holder's token, end and warning under grant,
// and returns the next instant at which time alone ends or warns its hold
// (zero if none).
func (d *decider) describeHold(h int, grant Grant) (nextLook time.Time) {
	c, v := d.claims[h], &d.verdicts[h]
	v.FencingToken = grant.Token
	deadline, _ := holdDeadline(c, grant.AcquiredAt, d.now, d.policy.MaxHold)
	v.ExpiresAt = deadline
	nextLook = deadline
	if d.policy.MaxHold > 0 {
		warnAt := grant.AcquiredAt.Add(d.policy.MaxHold * warnAtPercent / 100)
		if d.now.Before(warnAt) {
			nextLook = earliest(nextLook, warnAt)
		} else {
			v.Warning = d.maxHoldWarning(c, grant.AcquiredAt.Add(d.policy.MaxHold))
		}
	}
	return nextLook
}

// earliest returns the earlier of two instants, ignoring zero ones.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// writeOrder returns the verdicts in the order the controller writes them:
// claims that stop holding; claims that stay in the running (so that a
// build that takes over its line's place in the queue records it before the
// build it replaces ends); claims that end; each group by name; and last
// the claim that becomes Held.
func (d *decider) writeOrder() []Verdict {
	group := func(i int) int {
		v := &d.verdicts[i]
		switch {
		case v.Phase != Held && (v.From == Held || i == d.granted):
			return 0
		case v.Phase == Held && v.From != Held:
			return 3
		case v.Phase.IsTerminal():
			return 2
		}
		return 1
	}
	// A counting sort on the four groups (claims keep their order by
	// identity within a group), applied to d.verdicts in place: it is the
	// decider's own, and nothing reads it by claim after this.
	var start [5]int32
	for i := range d.verdicts {
		start[group(i)+1]++
	}
	for g := 1; g < len(start); g++ {
		start[g] += start[g-1]
	}
	dest := make([]int32, len(d.verdicts)) // where verdicts[i] goes
	for i := range d.verdicts {
		g := group(i)
		dest[i] = start[g]
		start[g]++
	}
	for i := range dest {
		for j := dest[i]; int(j) != i; j = dest[i] {
			d.verdicts[i], d.verdicts[j] = d.verdicts[j], d.verdicts[i]
			dest[i], dest[j] = dest[j], dest[i]
		}
	}
	return d.verdicts
}

// byIdentity returns the claims sorted by identity, so that nothing depends
// on the input order: pointers into claims, which is neither copied nor
// modified (a Claim is a few hundred bytes, and a lock may have thousands).
func byIdentity(claims []Claim) []*Claim {
	out := make([]*Claim, len(claims))
	for k := range claims {
		out[k] = &claims[k]
	}
	slices.SortFunc(out, compareIdentity)
	return out
}
