package arbiter

import (
	"fmt"
	"strings"
	"time"
)

// message is the sentence a pipeline author reads on claim i after the
// decision: what happened, naming the builds involved, and what to do. It
// depends only on the decision's inputs, never on how much time passed, so
// that an unchanged claim gets an unchanged message (and no status write).
func (d *decider) message(i int, grant Grant) string {
	c, v, target := d.claims[i], d.verdicts[i], d.lock.Target
	switch v.Reason {
	case ReasonAcquired:
		if c.Pod == NoPod {
			return fmt.Sprintf("Holding %s with fencing token %d until %s unless spec.renewTime is bumped; "+
				"deploy now and delete this BuildLock when done.", target, grant.Token, stamp(v.ExpiresAt))
		}
		return fmt.Sprintf("Holding %s with fencing token %d; deploy now and delete this BuildLock when done.",
			target, grant.Token)
	case ReasonWaitingForHolder:
		return fmt.Sprintf("Waiting for %s to release %s.", build(d.claims[d.holder()]), target)
	case ReasonSupersededByNewerBuild:
		by := d.supersededBy[i]
		what := ""
		switch d.verdicts[by].Phase {
		case Held:
			what = " and holds " + target
		case Waiting:
			what = " and waits for " + target
		}
		return fmt.Sprintf("%s is newer%s; this build will not deploy.", capitalized(build(d.claims[by])), what)
	case ReasonDuplicateBuild:
		return fmt.Sprintf("%s is already claimed by BuildLock %s; this duplicate will not deploy.",
			capitalized(build(c)), v.SupersededBy)
	case ReasonPodFinished, ReasonPodGone:
		what := "finished"
		if v.Reason == ReasonPodGone {
			what = "is gone"
		}
		if v.From == Held || i == d.granted {
			return fmt.Sprintf("The pod of %s %s; its hold on %s is released.", build(c), what, target)
		}
		return fmt.Sprintf("The pod of %s %s; it leaves the queue for %s.", build(c), what, target)
	case ReasonForceReleased:
		what := "it leaves the queue for " + target
		if v.From == Held || i == d.granted {
			what = "its hold on " + target + " ends; stop deploying"
		}
		return fmt.Sprintf("%s was force-released (%s); %s.", capitalized(build(c)), c.ForceRelease, what)
	case ReasonLockLost:
		return fmt.Sprintf("The grant record of %s no longer names %s; stop deploying, and create a new "+
			"BuildLock to claim %s again.", target, build(c), target)
	case ReasonExpired:
		return fmt.Sprintf("%s was not renewed in time: its hold on %s expired at %s; stop deploying.",
			capitalized(build(c)), target, stamp(podlessExpiry(c, d.grant.AcquiredAt)))
	case ReasonMaxHoldExceeded:
		return fmt.Sprintf("%s held %s for the operator's maximum hold of %s; stop deploying.",
			capitalized(build(c)), target, d.policy.MaxHold)
	}
	return "" // Rule 7: a terminal claim keeps its stored message.
}

// maxHoldWarning is the Warning on a pod-backed hold past 80 % of MaxHold.
func (d *decider) maxHoldWarning(c Claim, endAt time.Time) string {
	return fmt.Sprintf("%s has held %s for over %d %% of the operator's maximum hold of %s; "+
		"the hold expires at %s.", capitalized(build(c)), d.lock.Target, warnAtPercent, d.policy.MaxHold, stamp(endAt))
}

// build names a claim's build for messages: "build 43 of acme/shop@main".
func build(c Claim) string {
	return fmt.Sprintf("build %d of %s@%s", c.Build, c.Repo, c.Branch)
}

// capitalized starts a sentence with s, which is not empty.
func capitalized(s string) string {
	return strings.ToUpper(s[:1]) + s[1:]
}

// stamp formats an instant for messages and printed decisions.
func stamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}
