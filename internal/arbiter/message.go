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
		return w.done(" to release ", target, ".", d.overriddenNote(c))
	case ReasonQueued:
		ahead := d.ahead[i]
		if ahead == none {
			ahead = d.holder()
		}
		w := d.sentence("Queued for ", target, " behind ")
		w.build(d.claims[ahead], false)
		return w.done(".", d.overriddenNote(c))
	case ReasonFrozen, ReasonFreezeStarted:
		return d.freezeMessage(c, v.Reason)
	case ReasonLineMemoryFull:
		return d.memoryFullMessage(c)
	case ReasonSupersededByNewerBuild, ReasonDuplicateBuild:
		return d.supersededMessage(i)
	case ReasonRollbackNotAllowed:
		return d.rollbackRefusedMessage(c)
	case ReasonLineOwnedByOther, ReasonBuildJumpTooLarge:
		return d.lineMemoryMessage(i, v.Reason)
	case ReasonDeleted, ReasonPodFinished, ReasonPodGone:
		return d.goneMessage(i)
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

// goneMessage is the message of claim i, which ended because it was
// deleted (a finalizer keeps it) or its pod finished or is gone.
func (d *decider) goneMessage(i int) string {
	c, target := d.claims[i], d.lock.Target
	if d.verdicts[i].Reason == ReasonDeleted {
		if d.wasHolding(i) {
			return fmt.Sprintf("The BuildLock of %s was deleted (a finalizer still keeps it); its hold on %s "+
				"ends: stop deploying.", build(c), target)
		}
		return fmt.Sprintf("The BuildLock of %s was deleted (a finalizer still keeps it); it leaves the queue for %s.",
			build(c), target)
	}
	what := "finished"
	if d.verdicts[i].Reason == ReasonPodGone {
		what = "is gone"
	}
	if d.wasHolding(i) {
		return fmt.Sprintf("The pod of %s %s; its hold on %s is released.", build(c), what, target)
	}
	return fmt.Sprintf("The pod of %s %s; it leaves the queue for %s.", build(c), what, target)
}

// freezeMessage is the message of a claim that waits because its target
// is frozen, or whose hold a freeze ended (rule 12).
func (d *decider) freezeMessage(c *Claim, reason string) string {
	target, f := d.lock.Target, d.policy.Freeze
	if reason == ReasonFrozen {
		// The words the issue gives, which pipelines may match on.
		return target + " is frozen " + f.Describe() + "; this build keeps its place" + d.voidOverrideNote(c)
	}
	return fmt.Sprintf("%s froze at %s (%s; its window %s says holder: Release): the hold of %s ends; stop deploying.",
		target, f.ReleaseSince.Format(time.RFC3339), f.Describe(), f.ReleaseWindow, build(c))
}

// heldMessage tells the holder to deploy, and until when it may; a
// rollback, that it holds as one; a holder with a verified override while
// the target is frozen, that it holds through the freeze (why it is
// frozen, not until when: the one "until" of the message is the hold's),
// and by whose override.
func (d *decider) heldMessage(c *Claim, v *Verdict, grant Grant) string {
	_, reason := holdDeadline(c, grant.AcquiredAt, d.now, d.policy.MaxHold)
	holding := fmt.Sprintf("Holding %s with fencing token %d", d.lock.Target, grant.Token)
	if c.Rollback {
		holding += fmt.Sprintf(", as a rollback of %s@%s to build %d (%s)", c.Repo, printable(c.Branch), c.Build, quote(c.RollbackReason))
	}
	switch {
	case v.ExpiresAt.IsZero():
	case reason == ReasonExpired:
		holding += fmt.Sprintf(" until %s unless spec.renewTime is bumped", stamp(v.ExpiresAt))
	default:
		holding += fmt.Sprintf(" until %s, its maximum hold", stamp(v.ExpiresAt))
	}
	if o := c.Override; d.policy.Freeze.Frozen && o.Verified() {
		holding += fmt.Sprintf(", through its freeze (%s): overridden by %s (%s)", d.policy.Freeze.Why(), quote(o.By), quote(o.Reason))
	}
	return holding + "; deploy now and delete this BuildLock when done."
}

// overriddenNote is what a message adds for a claim that waits while the
// target is frozen, with an override in effect (rule 12): it goes through
// the freeze when its turn comes. Empty otherwise.
func (d *decider) overriddenNote(c *Claim) string {
	o := c.Override
	if !d.policy.Freeze.Frozen || !o.InEffect(d.now) {
		return ""
	}
	return fmt.Sprintf(" %s is frozen %s, but this claim is overridden by %s (%s), which lapses unused at %s: it goes through "+
		"the freeze when its turn comes.", d.lock.Target, d.policy.Freeze.Describe(), quote(o.By), quote(o.Reason), stamp(o.Expires))
}

// voidOverrideNote says why the override of a claim held back by a freeze
// does not apply; empty when it has none.
func (d *decider) voidOverrideNote(c *Claim) string {
	o := c.Override
	switch {
	case o.Reason == "":
		return ""
	case o.By == "":
		return fmt.Sprintf(". Its override (%s) does not apply: nothing verified who set it. Only an override that the API server "+
			"stamped with a person's name (buildlock.io/overridden-by, by the buildlock-override admission policies) lets a claim "+
			"through a freeze", quote(o.Reason))
	case !o.Verified():
		return fmt.Sprintf(". Its override by %s (%s) does not apply: that is a pipeline's identity, and overriding a freeze is "+
			"for people (kubectl buildlock override)", quote(o.By), quote(o.Reason))
	case o.Expires.IsZero():
		return fmt.Sprintf(". Its override by %s does not apply: it has no buildlock.io/override-expires, or one that is not an "+
			"RFC 3339 time", quote(o.By))
	case !d.now.Before(o.Expires):
		return fmt.Sprintf(". Its override by %s expired at %s", quote(o.By), stamp(o.Expires))
	}
	return fmt.Sprintf(". Its override by %s does not apply yet: it expires at %s, more than %s ahead (kubectl buildlock "+
		"override --for at most %s)", quote(o.By), stamp(o.Expires), MaxOverrideFor, MaxOverrideFor)
}

// rollbackHint says how to deploy a build of a line below what it
// deployed, on purpose.
const rollbackHint = "kubectl buildlock acquire --rollback --reason \"...\" (spec.rollback)"

// supersededMessage says what made claim i obsolete (the build that waits
// or holds instead of it, or the build of its line that already deployed,
// and when) and what to do.
func (d *decider) supersededMessage(i int) string {
	c, v, target := d.claims[i], &d.verdicts[i], d.lock.Target
	if r := d.byMemory[i]; r != nil {
		held := capitalized(build(&Claim{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build}))
		switch {
		case lineOfRecord(r) == lineOf(*c):
		case !judgedOn(c, lineOfRecord(r)) || d.backwards(c, r) == "":
			// A build of another line of the branch that started later.
			return fmt.Sprintf("%s already deployed: it started at %s and held %s at %s, and this build started "+
				"earlier, at %s: a branch never deploys an older build after a newer one, whatever their workflows, so "+
				"this build will not deploy. Stop this pipeline; to deploy it on purpose, roll back: %s.",
				held, stamp(r.Started), target, stamp(r.HeldAt), stamp(d.orderTime[i]), rollbackHint)
		default:
			held += ", " + d.unverifiedNote(c) + ","
		}
		if v.Reason == ReasonDuplicateBuild {
			return fmt.Sprintf("%s already deployed: it held %s at %s, and the BuildLockPolicy of %s refuses re-runs "+
				"(spec.reruns: Refused), so this run of it will not deploy. Stop this pipeline; deploy with a new build "+
				"number, or roll back on purpose: %s.", held, target, stamp(r.HeldAt), target, rollbackHint)
		}
		return fmt.Sprintf("%s already deployed: it held %s at %s, and a line never deploys backwards, so this older "+
			"build %d will not deploy. Stop this pipeline; to deploy build %d again on purpose, roll back: %s.",
			held, target, stamp(r.HeldAt), c.Build, c.Build, rollbackHint)
	}
	by := d.supersededBy[i]
	w := d.sentence()
	w.build(d.claims[by], true)
	switch {
	case v.Reason == ReasonDuplicateBuild:
		w.add(" ", d.fate(by), " as BuildLock ", d.claims[by].Name,
			", another run of the same build: two runs of one build never deploy at once, so this one will not. "+
				"Stop this run; re-run it once that one has ended, if it must deploy again.")
		return w.done()
	case d.verdicts[by].Phase == Superseded:
		// The build that made this one obsolete gave way in turn: name the
		// build that goes instead.
		root := by
		for d.verdicts[root].Phase == Superseded && d.supersededBy[root] != none {
			root = d.supersededBy[root]
		}
		w.add(" is newer, and gave way in turn to ")
		w.build(d.claims[root], false)
		w.add(", which ", d.fate(root), ": this build will not deploy either. Stop this pipeline.")
		return w.done()
	case judgedOn(c, lineOf(*d.claims[by])):
		if lineOf(*d.claims[by]) != lineOf(*c) {
			w.add(" (", d.unverifiedNote(c), ")")
		}
		w.add(" is newer and ", d.fate(by), ": it deploys instead, and this build will not. Stop this pipeline")
		if c.Rollback {
			w.add("; roll back once that build has deployed, if you still must")
		}
		return w.done(".")
	case branchOfClaim(d.claims[by]) == branchOfClaim(c) && d.verdicts[by].Phase == Held:
		// Granted in this decision, its build started after this one's.
		w.add(" started later (at ", stamp(d.orderTime[by]), ") and ", d.fate(by), ": a branch never deploys an older "+
			"build after a newer one, whatever their workflows, so this build, started at ", stamp(d.orderTime[i]),
			", will not deploy. Stop this pipeline; to deploy it on purpose once that build has deployed, roll back: ",
			rollbackHint, ".")
		return w.done()
	}
	w.add(" is newer and ", d.fate(by), ": with the ordering NewestWins one build waits, the newest, and this build "+
		"will not deploy. Stop this pipeline; for every build to deploy in its turn, give ", target,
		" a BuildLockPolicy with the ordering Queue or Fifo.")
	return w.done()
}

// fate says what claim i does after the decision: "holds staging", "waits
// for staging", "is queued for staging", or "will not deploy".
func (d *decider) fate(i int) string {
	switch v := &d.verdicts[i]; {
	case v.Phase == Held:
		return "holds " + d.lock.Target
	case v.Reason == ReasonQueued:
		return "is queued for " + d.lock.Target
	case v.Phase == Waiting:
		return "waits for " + d.lock.Target
	}
	return "will not deploy"
}

// rollbackRefusedMessage says why the policy refuses rollback c, and what
// to do.
func (d *decider) rollbackRefusedMessage(c *Claim) string {
	what := fmt.Sprintf("%s is a rollback (spec.rollback), and the BuildLockPolicy of %s", capitalized(build(c)), d.lock.Target)
	if d.policy.Rollbacks == RollbacksNobody {
		return what + " allows no rollbacks (spec.rollbacks: Nobody): it will not deploy. Deploy a new build instead, " +
			"or ask the policy's administrators to allow rollbacks."
	}
	who := "this claim was created by " + printable(c.Identity)
	if c.Identity == "" {
		who = "this claim's requester is not verified (the API server stamps spec.requester only where the " +
			"enforcement policies are installed)"
	}
	return fmt.Sprintf("%s allows rollbacks by people only (spec.rollbacks: PeopleOnly), and %s: it will not deploy. "+
		"Have a person roll back: %s.", what, who, rollbackHint)
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

// build appends "build 43 of acme/shop@main" (capitalized: "Build ..."),
// and " (workflow W)" for a claim of a workflow.
func (w sentence) build(c *Claim, capital bool) {
	if capital {
		w.add("Build ")
	} else {
		w.add("build ")
	}
	*w.b = strconv.AppendInt(*w.b, c.Build, 10)
	w.add(" of ", c.Repo, "@", printable(c.Branch))
	if c.Workflow != "" {
		w.add(" (workflow ", printable(c.Workflow), ")")
	}
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

// build names a claim's build for messages: "build 43 of acme/shop@main",
// and " (workflow W)" for a claim of a workflow. A branch with characters
// that are not printable (the API refuses them now, but older objects may
// have them) is quoted and escaped.
func build(c *Claim) string {
	s := fmt.Sprintf("build %d of %s@%s", c.Build, c.Repo, printable(c.Branch))
	if c.Workflow != "" {
		s += " (workflow " + printable(c.Workflow) + ")"
	}
	return s
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

// unverifiedNote says why claim c, of a workflow nothing verified, is
// judged as a build of its branch's line without one.
func (d *decider) unverifiedNote(c *Claim) string {
	return "and this claim's workflow " + printable(c.Workflow) + " is not verified (no CI token of its requester " +
		"names it), so it counts as a build of " + c.Repo + "@" + printable(c.Branch) + " too"
}

// memoryFullMessage is the message of claim c, which waits because the
// line memory has no room for its line (rule 6).
func (d *decider) memoryFullMessage(c *Claim) string {
	share := "the memory of lines of " + d.lock.Target + " is full (" + strconv.Itoa(LineMemoryBytes>>10) + " KiB)"
	if c.Identity != "" && d.budget.total+heldRecordSize(c) <= LineMemoryBytes {
		share = "the lines held as " + printable(c.Identity) + " fill its share of the memory of lines of " +
			d.lock.Target + " (" + strconv.Itoa(LineMemoryBytesPerOwner>>10) + " KiB)"
	}
	return fmt.Sprintf("%s waits: %s, so its line, new to the lock, cannot be remembered, and a build whose "+
		"line is not remembered is not granted (a lower build of its line could deploy after it). It keeps its "+
		"place until records leave the memory and make room (the next leaves at %s, %s after it held); builds of "+
		"lines the lock remembers go meanwhile.", capitalized(build(c)), share, stamp(d.memoryFrees()), d.lineMemory())
}

// heldRecordSize is the size of the record a grant to c would write, but
// for its token (which only grows it).
func heldRecordSize(c *Claim) int {
	return (&LineRecord{Repo: c.Repo, Branch: c.Branch, Workflow: c.Workflow, Owner: c.Identity, OwnerCI: c.CIIdentity,
		Token: 1, Started: c.Created}).Size()
}

// lineMemoryMessage is the message of claim i, refused by its line's memory
// for reason: LineOwnedByOther or BuildJumpTooLarge (rule 3).
func (d *decider) lineMemoryMessage(i int, reason string) string {
	c, r, target := d.claims[i], d.byMemory[i], d.lock.Target
	if reason == ReasonLineOwnedByOther {
		held := fmt.Sprintf("build %d", r.Build)
		if r.Workflow != "" {
			held += " of workflow " + printable(r.Workflow)
		}
		return fmt.Sprintf("%s will not deploy: its branch %s@%s belongs to %s, which held %s with %s at %s, and this "+
			"claim was created by %s. The lines of a branch, whatever their workflows, belong to the pipeline that "+
			"held one of them last, until %s; claim it as that pipeline, or have a person claim it.",
			capitalized(build(c)), c.Repo, printable(c.Branch), printable(r.Owner), target, held, stamp(r.HeldAt),
			printable(c.Identity), stamp(r.HeldAt.Add(d.lineMemory())))
	}
	return fmt.Sprintf("%s is more than %d above build %d of its line, which held %s at %s: it will not deploy. "+
		"Until %s a build of the line may go at most %d higher (the operator's --max-build-jump); give it a "+
		"lower build number, or have a person claim it.", capitalized(build(c)), d.maxBuildJump(), r.Build, target,
		stamp(r.HeldAt), stamp(r.HeldAt.Add(d.lineMemory())), d.maxBuildJump())
}
