package arbiter

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// message is the sentence a pipeline author reads on claim i after the
// decision: what happened, naming the builds involved, and what to do. It
// depends only on the decision's inputs, never on how much time passed, so
// that an unchanged claim gets an unchanged message (and no status write);
// and a queued claim's message names only the claim directly ahead of it,
// which stays true through hand-offs.
func (d *decider) message(i int, grant Grant) string {
	c, v, target := d.claims[i], &d.verdicts[i], d.lock.Target
	switch v.Reason {
	case ReasonAcquired:
		return d.heldMessage(c, v, grant)
	case ReasonWaitingForHolder:
		w := d.sentence("Waiting for ")
		w.build(d.claims[d.holder()], false)
		return w.done(" to release ", target, ".")
	case ReasonQueued:
		ahead := d.ahead[i]
		if ahead == none {
			ahead = d.holder()
		}
		w := d.sentence("Queued for ", target, " behind ")
		w.build(d.claims[ahead], false)
		return w.done(".")
	case ReasonSupersededByNewerBuild, ReasonDuplicateBuild:
		return d.supersededMessage(i)
	case ReasonLineOwnedByOther:
		r := d.byMemory[i]
		return fmt.Sprintf("%s will not deploy: its line belongs to %s, which held %s with build %d at %s, and this "+
			"claim was created by %s. A line belongs to the pipeline that holds it, until %s; claim it as that "+
			"pipeline, or have a person claim it.", capitalized(build(c)), printable(r.Owner), target,
			r.Build, stamp(r.HeldAt), printable(c.Identity), stamp(r.HeldAt.Add(d.lineMemory())))
	case ReasonBuildJumpTooLarge:
		r := d.byMemory[i]
		return fmt.Sprintf("%s is more than %d above build %d of its line, which held %s at %s: it will not deploy. "+
			"Until %s a build of the line may go at most %d higher (the operator's --max-build-jump); give it a "+
			"lower build number, or have a person claim it.", capitalized(build(c)), d.maxBuildJump(), r.Build, target,
			stamp(r.HeldAt), stamp(r.HeldAt.Add(d.lineMemory())), d.maxBuildJump())
	case ReasonDeleted:
		if d.wasHolding(i) {
			return fmt.Sprintf("The BuildLock of %s was deleted (a finalizer still keeps it); its hold on %s "+
				"ends: stop deploying.", build(c), target)
		}
		return fmt.Sprintf("The BuildLock of %s was deleted (a finalizer still keeps it); it leaves the queue for %s.",
			build(c), target)
	case ReasonPodFinished, ReasonPodGone:
		what := "finished"
		if v.Reason == ReasonPodGone {
			what = "is gone"
		}
		if d.wasHolding(i) {
			return fmt.Sprintf("The pod of %s %s; its hold on %s is released.", build(c), what, target)
		}
		return fmt.Sprintf("The pod of %s %s; it leaves the queue for %s.", build(c), what, target)
	case ReasonForceReleased:
		what := "it leaves the queue for " + target
		if d.wasHolding(i) {
			what = "its hold on " + target + " ends; stop deploying"
		}
		by := "an unverified requester"
		if c.ForceReleasedBy != "" {
			by = quote(c.ForceReleasedBy)
		}
		return fmt.Sprintf("%s was force-released by %s (%s); %s.", capitalized(build(c)), by, quote(c.ForceRelease), what)
	case ReasonLockLost:
		return fmt.Sprintf("The grant record of %s no longer names %s; stop deploying, and create a new "+
			"BuildLock to claim %s again.", target, build(c), target)
	case ReasonExpired:
		return d.expiredMessage(i)
	case ReasonMaxHoldExceeded:
		return fmt.Sprintf("%s held %s for its maximum hold, until %s; stop deploying.",
			capitalized(build(c)), target, stamp(d.endedAt(i)))
	}
	return "" // Rule 8: a terminal claim keeps its stored message.
}

// heldMessage tells the holder to deploy, and until when it may.
func (d *decider) heldMessage(c *Claim, v *Verdict, grant Grant) string {
	_, reason := holdDeadline(c, grant.AcquiredAt, d.now, d.policy.MaxHold)
	switch {
	case v.ExpiresAt.IsZero():
		return fmt.Sprintf("Holding %s with fencing token %d; deploy now and delete this BuildLock when done.",
			d.lock.Target, grant.Token)
	case reason == ReasonExpired:
		return fmt.Sprintf("Holding %s with fencing token %d until %s unless spec.renewTime is bumped; "+
			"deploy now and delete this BuildLock when done.", d.lock.Target, grant.Token, stamp(v.ExpiresAt))
	}
	return fmt.Sprintf("Holding %s with fencing token %d until %s, its maximum hold; "+
		"deploy now and delete this BuildLock when done.", d.lock.Target, grant.Token, stamp(v.ExpiresAt))
}

// supersededMessage says which build made claim i obsolete.
func (d *decider) supersededMessage(i int) string {
	c, v, target := d.claims[i], &d.verdicts[i], d.lock.Target
	if r := d.byMemory[i]; r != nil {
		held := capitalized(build(&Claim{Repo: r.Repo, Branch: r.Branch, Build: r.Build}))
		if v.Reason == ReasonDuplicateBuild {
			return fmt.Sprintf("%s already held %s at %s; this claim of the same build will not deploy "+
				"(a build deploys once: give a re-run a new build number).", held, target, stamp(r.HeldAt))
		}
		return fmt.Sprintf("%s held %s at %s; this older build will not deploy (a line never deploys backwards).",
			held, target, stamp(r.HeldAt))
	}
	if v.Reason == ReasonDuplicateBuild {
		w := d.sentence()
		w.build(c, true)
		return w.done(" is already claimed by BuildLock ", v.SupersededBy, "; this duplicate will not deploy.")
	}
	by := d.supersededBy[i]
	w := d.sentence()
	w.build(d.claims[by], true)
	w.add(" is newer")
	switch d.verdicts[by].Phase {
	case Held:
		w.add(" and holds ", target)
	case Waiting:
		w.add(" and waits for ", target)
	}
	return w.done("; this build will not deploy.")
}

// sentence builds one message in the decider's buffer, with one allocation
// (the resulting string): a lock with thousands of claims is decided often.
type sentence struct{ b *[]byte }

// sentence starts a message with parts.
func (d *decider) sentence(parts ...string) sentence {
	d.buf = d.buf[:0]
	w := sentence{&d.buf}
	w.add(parts...)
	return w
}

func (w sentence) add(parts ...string) {
	for _, p := range parts {
		*w.b = append(*w.b, p...)
	}
}

// build appends "build 43 of acme/shop@main" (capitalized: "Build ...").
func (w sentence) build(c *Claim, capital bool) {
	if capital {
		w.add("Build ")
	} else {
		w.add("build ")
	}
	*w.b = strconv.AppendInt(*w.b, c.Build, 10)
	w.add(" of ", c.Repo, "@", printable(c.Branch))
}

// done appends parts and returns the message.
func (w sentence) done(parts ...string) string {
	w.add(parts...)
	return string(*w.b)
}

// wasHolding reports whether claim i held (in its status, or in the grant)
// before this decision ended it.
func (d *decider) wasHolding(i int) bool {
	return d.verdicts[i].From == Held || i == d.granted
}

// endedAt is when claim i's hold ended by time: the recorded ending for a
// claim whose end the grant record kept, else its deadline under the input
// grant.
func (d *decider) endedAt(i int) time.Time {
	if d.endedByRecord[i] {
		return d.grant.Ended.At
	}
	deadline, _ := holdDeadline(d.claims[i], d.grant.AcquiredAt, d.now, d.policy.MaxHold)
	return deadline
}

// expiredMessage says why claim i's pod-less hold expired, true to its
// renewals: none; one the operator sees only now, stamped more than
// expiresAfter earlier, which counted from its stamp ended the hold
// already; renewals stamped before the hold began, which extended
// nothing; or a last renewal that kept the hold until it expired. A renewal
// counts from its stamp at the latest, so a client whose clock is behind
// renews less than it thinks.
func (d *decider) expiredMessage(i int) string {
	c, target, end := d.claims[i], d.lock.Target, stamp(d.endedAt(i))
	last := c.RenewedAt
	if unrecorded := c.RenewTime; !unrecorded.IsZero() && !unrecorded.Before(last) {
		last = unrecorded
	}
	acquiredAt := d.grant.AcquiredAt
	if d.endedByRecord[i] {
		acquiredAt = c.AcquiredAt
	}
	switch r := c.RenewTime; {
	case last.IsZero():
		return fmt.Sprintf("%s was not renewed in time: its hold on %s expired at %s; stop deploying.",
			capitalized(build(c)), target, end)
	case !d.endedByRecord[i] && r.Equal(last) && !r.After(d.now) && !r.Before(acquiredAt):
		return fmt.Sprintf("%s was renewed with spec.renewTime %s, which is more than its expiresAfter of %s "+
			"before the operator saw the renewal (at %s): a renewal counts from its time at the latest, so its "+
			"hold on %s expired at %s; stop deploying. Renew with the current time (is the client's clock behind?).",
			capitalized(build(c)), stamp(r), expiresAfter(c), stamp(d.now), target, end)
	case !acquiredAt.IsZero() && last.Before(acquiredAt):
		return fmt.Sprintf("%s was last renewed with spec.renewTime %s, before its hold on %s began (at %s): a "+
			"renewal counts from its time at the latest, so none extended the hold, which expired at %s; stop "+
			"deploying. Renew with the current time (is the client's clock behind?).",
			capitalized(build(c)), stamp(last), target, stamp(acquiredAt), end)
	}
	return fmt.Sprintf("%s was not renewed in time: its last renewal, stamped %s, kept its hold on %s until %s; "+
		"stop deploying.", capitalized(build(c)), stamp(last), target, end)
}

// lineMemory is Policy.LineMemory, or its default.
func (d *decider) lineMemory() time.Duration {
	if d.policy.LineMemory <= 0 {
		return DefaultGrantRetention
	}
	return d.policy.LineMemory
}

// maxHoldWarning is the Warning on a hold past 80 % of its maximum hold.
func (d *decider) maxHoldWarning(c *Claim, endAt time.Time) string {
	return fmt.Sprintf("%s has held %s for over %d %% of its maximum hold of %s; "+
		"the hold expires at %s.", capitalized(build(c)), d.lock.Target, warnAtPercent, d.policy.MaxHold, stamp(endAt))
}

// build names a claim's build for messages: "build 43 of acme/shop@main". A
// branch with characters that are not printable (the API refuses them now,
// but older objects may have them) is quoted and escaped.
func build(c *Claim) string {
	return fmt.Sprintf("build %d of %s@%s", c.Build, c.Repo, printable(c.Branch))
}

// printable returns s as it is when every rune of it prints plainly, and
// else quoted with Go's escapes, so that no message carries a newline, an
// escape sequence or a bidirectional override.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}

// quote returns free text for a message: at most MaxQuotedLength characters
// of it (a longer text is cut and marked with "…"), quoted and escaped.
func quote(s string) string {
	if utf8.RuneCountInString(s) > MaxQuotedLength {
		runes := []rune(s)
		s = string(runes[:MaxQuotedLength]) + "…"
	}
	return strconv.Quote(s)
}

// capitalized starts a sentence with s, which is not empty.
func capitalized(s string) string {
	return strings.ToUpper(s[:1]) + s[1:]
}

// stamp formats an instant for messages and printed decisions.
func stamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}
