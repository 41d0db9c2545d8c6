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
	ReasonSupersededByNewerBuild = "SupersededByNewerBuild"
	ReasonDuplicateBuild         = "DuplicateBuild"
	ReasonPodFinished            = "PodFinished"
	ReasonPodGone                = "PodGone"
	ReasonLockLost               = "LockLost"
	ReasonExpired                = "Expired"
	ReasonMaxHoldExceeded        = "MaxHoldExceeded"
	ReasonForceReleased          = "ForceReleased"
)

// DefaultExpiresAfter bounds a pod-less hold whose ExpiresAfter is not
// positive. The API defaults spec.expiresAfter to the same hour; applying it
// here too means a hand-built Claim can never be granted a hold that has
// expired the instant it starts (which would break the fixed point).
const DefaultExpiresAfter = time.Hour

// warnAtPercent is how far into MaxHold a pod-backed holder is warned.
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
	survivors := d.pickLineSurvivors(candidates)
	d.rankForSlot(survivors)
	return d.decision()
}

// decider holds one call of Decide while it works. Claims are referred to by
// their index in claims, which is sorted by identity so that nothing depends
// on the input order.
type decider struct {
	lock   Lock
	grant  Grant
	now    time.Time
	policy Policy

	claims   []Claim
	verdicts []Verdict // verdicts[i] is for claims[i]; Phase "" until decided.
	// supersededBy[i] is the claim that made claims[i] obsolete, or none.
	supersededBy []int

	granted    int // the claim the input grant names, or none.
	liveHolder int // granted, if its hold goes on; else none.
	newHolder  int // the claim granted by this decision, or none.
	slot       int // the claim that waits after this decision, or none.
}

func newDecider(lock Lock, claims []Claim, grant Grant, now time.Time, policy Policy) *decider {
	d := &decider{
		lock:         lock,
		grant:        grant,
		now:          now,
		policy:       policy,
		claims:       slices.Clone(claims),
		verdicts:     make([]Verdict, len(claims)),
		supersededBy: make([]int, len(claims)),
		granted:      none,
		liveHolder:   none,
		newHolder:    none,
		slot:         none,
	}
	slices.SortFunc(d.claims, compareIdentity)
	for i := range d.claims {
		c := &d.claims[i]
		if c.Phase == "" {
			c.Phase = Pending
		}
		d.verdicts[i] = Verdict{Name: c.Name, UID: c.UID, From: c.Phase}
		d.supersededBy[i] = none
		if d.granted == none && grant.Holder != "" && !c.Phase.IsTerminal() &&
			c.Name == grant.Holder && c.UID == grant.HolderUID {
			d.granted = i
		}
	}
	return d
}

// endClaims settles terminal claims (rule 7), the holder (2), other claims
// shown Held (1) and dead waiters (6), and returns the claims still in the
// running.
func (d *decider) endClaims() (candidates []int) {
	for i, c := range d.claims {
		v := &d.verdicts[i]
		switch {
		case c.Phase.IsTerminal():
			// Rule 7: unchanged; the empty reason tells the controller so.
			v.Phase = c.Phase
		case i == d.granted:
			// Rule 2: the holder keeps the lock until it positively ends.
			if phase, reason := holdEnd(c, d.grant.AcquiredAt, d.now, d.policy); phase != "" {
				v.Phase, v.Reason = phase, reason
			} else {
				d.liveHolder = i
				v.Phase, v.Reason = Held, ReasonAcquired
			}
		case c.Phase == Held:
			// Rule 1: shown Held, but the grant names another claim or none.
			v.Phase, v.Reason = Released, ReasonLockLost
			if reason := leaveReason(c); reason != "" {
				v.Reason = reason
			}
		case leaveReason(c) != "":
			// Rule 6: a waiter whose pod ended, or that was force-released,
			// leaves.
			v.Phase, v.Reason = Released, leaveReason(c)
		default:
			candidates = append(candidates, i)
		}
	}
	return candidates
}

// holdEnd returns how a hold granted at acquiredAt has ended by now (rule 2),
// or "" if it goes on.
func holdEnd(c Claim, acquiredAt, now time.Time, policy Policy) (Phase, string) {
	if reason := leaveReason(c); reason != "" {
		return Released, reason
	}
	if c.Pod == NoPod {
		if !now.Before(podlessExpiry(c, acquiredAt)) {
			return Expired, ReasonExpired
		}
		return "", ""
	}
	// PodAlive or PodUnknown: alive (rule 8), bounded only by MaxHold.
	if policy.MaxHold > 0 && !now.Before(acquiredAt.Add(policy.MaxHold)) {
		return Expired, ReasonMaxHoldExceeded
	}
	return "", ""
}

// leaveReason is why a claim ends regardless of time: a person force-released
// it, or its pod ended; "" while it may go on.
func leaveReason(c Claim) string {
	if c.ForceRelease != "" {
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

// podlessExpiry is when a pod-less hold granted at acquiredAt ends unless
// renewed.
func podlessExpiry(c Claim, acquiredAt time.Time) time.Time {
	from := acquiredAt
	if c.RenewTime.After(from) {
		from = c.RenewTime
	}
	expiresAfter := c.ExpiresAfter
	if expiresAfter <= 0 {
		expiresAfter = DefaultExpiresAfter
	}
	return from.Add(expiresAfter)
}

// line is a claim's repository and branch: builds of one line replace each
// other.
type line struct{ repo, branch string }

func lineOf(c Claim) line { return line{c.Repo, c.Branch} }

// pickLineSurvivors applies rule 3 and returns at most one claim per line.
func (d *decider) pickLineSurvivors(candidates []int) []int {
	byLine := make(map[line][]int)
	for _, i := range candidates {
		l := lineOf(d.claims[i])
		byLine[l] = append(byLine[l], i)
	}
	survivors := make([]int, 0, len(byLine))
	// Map order does not matter: each line is decided on its own, and the
	// survivors are ranked by a total order afterwards.
	for l, members := range byLine {
		if d.liveHolder != none && l == lineOf(d.claims[d.liveHolder]) {
			members = d.supersedeByHolder(members)
		}
		if len(members) == 0 {
			continue
		}
		best := slices.MinFunc(members, func(i, j int) int {
			return compareInLine(d.claims[i], d.claims[j])
		})
		for _, i := range members {
			switch {
			case i == best:
			case d.claims[i].Build < d.claims[best].Build:
				d.supersede(i, best, ReasonSupersededByNewerBuild)
			default:
				d.supersede(i, best, ReasonDuplicateBuild)
			}
		}
		survivors = append(survivors, best)
	}
	return survivors
}

// supersedeByHolder supersedes the members of the holder's line whose build
// is not above the holder's, and returns the others.
func (d *decider) supersedeByHolder(members []int) []int {
	holderBuild := d.claims[d.liveHolder].Build
	var above []int
	for _, i := range members {
		switch b := d.claims[i].Build; {
		case b < holderBuild:
			d.supersede(i, d.liveHolder, ReasonSupersededByNewerBuild)
		case b == holderBuild:
			d.supersede(i, d.liveHolder, ReasonDuplicateBuild)
		default:
			above = append(above, i)
		}
	}
	return above
}

func (d *decider) supersede(i, by int, reason string) {
	d.verdicts[i].Phase, d.verdicts[i].Reason = Superseded, reason
	d.verdicts[i].SupersededBy = d.claims[by].Name
	d.supersededBy[i] = by
}

// rankForSlot applies rules 4 and 5 to the line survivors.
func (d *decider) rankForSlot(survivors []int) {
	slices.SortFunc(survivors, func(i, j int) int {
		return compareNewer(d.claims[i], d.claims[j])
	})
	if d.liveHolder == none && len(survivors) > 0 {
		d.newHolder = survivors[0]
		d.verdicts[d.newHolder].Phase = Held
		d.verdicts[d.newHolder].Reason = ReasonAcquired
		survivors = survivors[1:]
	}
	if len(survivors) == 0 {
		return
	}
	d.slot = survivors[0]
	d.verdicts[d.slot].Phase = Waiting
	d.verdicts[d.slot].Reason = ReasonWaitingForHolder
	for _, i := range survivors[1:] {
		d.supersede(i, d.slot, ReasonSupersededByNewerBuild)
	}
}

// holder is the claim that holds after the decision, or none.
func (d *decider) holder() int {
	if d.liveHolder != none {
		return d.liveHolder
	}
	return d.newHolder
}

// decision assembles the Decision once every claim has its phase.
func (d *decider) decision() Decision {
	out := Decision{Grant: d.grant}
	switch {
	case d.liveHolder != none:
		// The holder stays: the grant is left exactly as it is.
	case d.newHolder != none:
		c := d.claims[d.newHolder]
		out.Grant = Grant{Holder: c.Name, HolderUID: c.UID, Token: d.maxToken() + 1, AcquiredAt: d.now}
		out.GrantChanged = true
	case d.grant.Holder != "":
		// The holder ended or vanished and nobody takes over: free the lock,
		// keeping the token floor.
		out.Grant = Grant{Token: d.maxToken()}
		out.GrantChanged = true
	}
	if h := d.holder(); h != none {
		out.Holder = d.claims[h].Name
		out.NextLook = d.describeHold(h, out.Grant)
	}
	if d.slot != none {
		out.Waiting = d.claims[d.slot].Name
	}
	for i := range d.verdicts {
		d.verdicts[i].Message = d.message(i, out.Grant)
	}
	out.Verdicts = d.writeOrder()
	return out
}

// maxToken is the highest fencing token known (rule 5).
func (d *decider) maxToken() int64 {
	highest := d.grant.Token
	for _, c := range d.claims {
		highest = max(highest, c.FencingToken)
	}
	return highest
}

// describeHold fills in the holder's token, expiry and warning under grant,
// and returns the next instant at which time alone ends or warns its hold
// (zero if none).
func (d *decider) describeHold(h int, grant Grant) (nextLook time.Time) {
	c, v := d.claims[h], &d.verdicts[h]
	v.FencingToken = grant.Token
	if c.Pod == NoPod {
		v.ExpiresAt = podlessExpiry(c, grant.AcquiredAt)
		return v.ExpiresAt
	}
	if d.policy.MaxHold <= 0 {
		return time.Time{}
	}
	warnAt := grant.AcquiredAt.Add(d.policy.MaxHold * warnAtPercent / 100)
	endAt := grant.AcquiredAt.Add(d.policy.MaxHold)
	if d.now.Before(warnAt) {
		return warnAt
	}
	v.Warning = d.maxHoldWarning(c, endAt)
	return endAt
}

// writeOrder returns the verdicts in the order the controller writes them:
// claims that stop holding, then the others by name, then the claim that
// becomes Held.
func (d *decider) writeOrder() []Verdict {
	group := func(i int) int {
		v := d.verdicts[i]
		switch {
		case v.Phase != Held && (v.From == Held || i == d.granted):
			return 0
		case v.Phase == Held && v.From != Held:
			return 2
		}
		return 1
	}
	order := make([]int, len(d.verdicts))
	for i := range order {
		order[i] = i
	}
	// Stable: within a group, claims keep their order by identity.
	slices.SortStableFunc(order, func(i, j int) int { return group(i) - group(j) })
	out := make([]Verdict, len(order))
	for k, i := range order {
		out[k] = d.verdicts[i]
	}
	return out
}
