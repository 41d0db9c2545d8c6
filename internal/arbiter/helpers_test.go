package arbiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"
)

// t0 is the tests' epoch; at(m) is m minutes after it.
var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

func at(minute int) time.Time { return t0.Add(time.Duration(minute) * time.Minute) }

var staging = Lock{Namespace: "ci", Target: "staging"}

// claim is a Pending claim on build n of lineSpec ("acme/shop@main") with a
// live pod, stamped and created at minute.
func claim(name, lineSpec string, n int64, minute int) Claim {
	repo, branch, _ := strings.Cut(lineSpec, "@")
	return Claim{
		Name: name, UID: "uid-" + name,
		Repo: repo, Branch: branch, Build: n,
		Timestamp: at(minute), Created: at(minute),
		Phase: Pending, Pod: PodAlive,
	}
}

func held(c Claim, token int64) Claim { c.Phase, c.FencingToken = Held, token; return c }
func waiting(c Claim) Claim           { c.Phase = Waiting; return c }
func inPhase(c Claim, p Phase) Claim  { c.Phase = p; return c }
func withPod(c Claim, s PodState) Claim {
	c.Pod = s
	return c
}
func forceReleased(c Claim) Claim {
	c.ForceRelease = "alice: stuck deploy"
	return c
}
func verifiedBy(c Claim, user string) Claim { c.ForceReleasedBy = user; return c }
func created(c Claim, minute int) Claim     { c.Created = at(minute); return c }
func queuedAt(c Claim, minute int) Claim    { c.Phase, c.QueuedAt = Waiting, at(minute); return c }

// renewing gives c a renewal the operator has not recorded, stamped at
// minute; renewedAt one it recorded at minute.
func renewing(c Claim, minute int) Claim  { c.RenewTime = at(minute); return c }
func renewedAt(c Claim, minute int) Claim { c.RenewedAt = at(minute); return c }
func podless(c Claim, expiresAfter time.Duration) Claim {
	c.Pod, c.ExpiresAfter = NoPod, expiresAfter
	return c
}

// grantTo is the grant record of c's hold with token, acquired at minute.
func grantTo(c Claim, token int64, minute int) Grant {
	return Grant{Holder: c.Name, HolderUID: c.UID, Token: token, AcquiredAt: at(minute)}
}

// short prints a verdict for table comparisons: "Superseded DuplicateBuild
// by=shop-42", or "Released (unchanged)" for a terminal claim.
func short(v Verdict) string {
	switch {
	case v.Reason == "":
		return string(v.Phase) + " (unchanged)"
	case v.SupersededBy != "":
		return fmt.Sprintf("%s %s by=%s", v.Phase, v.Reason, v.SupersededBy)
	}
	return fmt.Sprintf("%s %s", v.Phase, v.Reason)
}

// verdictOf returns the verdict for the claim named name.
func verdictOf(d Decision, name string) Verdict {
	for _, v := range d.Verdicts {
		if v.Name == name {
			return v
		}
	}
	return Verdict{}
}

// input is one call of Decide.
type input struct {
	claims []Claim
	grant  Grant
	now    time.Time
	policy Policy
}

func (in input) decide() Decision { return Decide(staging, in.claims, in.grant, in.now, in.policy) }

// chooser feeds the input generator: random numbers for property tests, the
// fuzzer's bytes for FuzzDecide.
type chooser interface {
	// intn returns a number in [0, n).
	intn(n int) int
}

type randomChooser struct{ r *rand.Rand }

func (c randomChooser) intn(n int) int { return c.r.IntN(n) }

func seeded(seed uint64) randomChooser {
	return randomChooser{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// byteChooser reads one byte per choice, and chooses 0 once they run out.
type byteChooser struct{ data []byte }

func (c *byteChooser) intn(n int) int {
	if len(c.data) == 0 {
		return 0
	}
	v := int(c.data[0]) % n
	c.data = c.data[1:]
	return v
}

// The generator draws from small sets so that ties, duplicates and
// boundaries (expiry exactly now) are frequent.
var (
	genLines     = []string{"acme/shop@main", "acme/shop@dev", "acme/web@main"}
	genPhases    = []Phase{"", Pending, Waiting, Held, Superseded, Released, Expired}
	genPods      = []PodState{NoPod, PodAlive, PodFinished, PodGone, PodUnknown}
	genExpiries  = []time.Duration{0, 10 * time.Second, 5 * time.Minute, time.Hour}
	genMaxHolds  = []time.Duration{0, 30 * time.Minute, 2 * time.Hour}
	genOrderings = []Ordering{NewestWins, Queue, Fifo, ""}
	genMaxClaims = 16
)

// genInput builds an arbitrary (often inconsistent) input for one lock:
// claims in any phase, a grant that names one of them, a missing claim, a
// claim with another UID, or nobody.
func genInput(ch chooser) input {
	in := input{now: at(ch.intn(121)), policy: Policy{MaxHold: genMaxHolds[ch.intn(len(genMaxHolds))]}}
	n := ch.intn(genMaxClaims + 1)
	for k := range n {
		c := claim(fmt.Sprintf("c%02d", k), genLines[ch.intn(len(genLines))], int64(1+ch.intn(6)), ch.intn(11))
		c.Created = at(ch.intn(11))
		c.Phase = genPhases[ch.intn(len(genPhases))]
		c.FencingToken = int64(ch.intn(10))
		c.Pod = genPods[ch.intn(len(genPods))]
		c.ExpiresAfter = genExpiries[ch.intn(len(genExpiries))]
		if ch.intn(2) == 1 {
			c.RenewTime = at(ch.intn(121))
		}
		if ch.intn(8) == 0 {
			c.ForceRelease = "alice: stuck deploy"
		}
		in.claims = append(in.claims, c)
	}
	in.grant = Grant{Token: int64(ch.intn(10)), AcquiredAt: at(ch.intn(121))}
	switch k := ch.intn(n + 3); {
	case k < n:
		in.grant.Holder, in.grant.HolderUID = in.claims[k].Name, in.claims[k].UID
	case k == n:
		in.grant.AcquiredAt = time.Time{} // free
	case k == n+1:
		in.grant.Holder, in.grant.HolderUID = "deleted", "uid-deleted"
	case n > 0:
		in.grant.Holder, in.grant.HolderUID = in.claims[0].Name, "uid-of-an-older-object"
	}
	// Choices added later come last, so that the committed fuzz seeds keep
	// decoding to the inputs they were written for (a fuzzer's byteChooser
	// chooses 0 once its bytes run out: NewestWins, nothing recorded).
	in.policy.Ordering = genOrderings[ch.intn(len(genOrderings))]
	for k := range in.claims {
		c := &in.claims[k]
		if ch.intn(3) == 1 {
			c.QueuedAt = at(ch.intn(11))
		}
		if ch.intn(4) == 1 {
			c.RenewedAt, c.RenewTime = c.RenewTime, time.Time{}
		}
		if ch.intn(4) == 1 {
			c.Timestamp = time.Time{}
		}
		c.Writer = []Writer{{}, {PodUID: "pod-" + c.Name}, {Username: "system:serviceaccount:ci:" + c.Name}}[ch.intn(3)]
	}
	for range ch.intn(4) {
		repo, branch, _ := strings.Cut(genLines[ch.intn(len(genLines))], "@")
		in.grant.Lines = append(in.grant.Lines, LineRecord{Repo: repo, Branch: branch,
			Build: int64(1 + ch.intn(6)), HeldAt: at(ch.intn(121)).Add(-DefaultGrantRetention * time.Duration(ch.intn(2)))})
	}
	if n > 0 && ch.intn(3) == 1 {
		c := in.claims[ch.intn(n)]
		in.grant.Ended = Ending{Name: c.Name, UID: c.UID, Phase: Expired, Reason: ReasonExpired, At: at(ch.intn(121))}
	}
	// Rule 11's inputs, and identities (choices added after those above).
	for k := range in.claims {
		c := &in.claims[k]
		if c.FencingToken > 0 && ch.intn(3) > 0 {
			c.AcquiredAt = at(ch.intn(121))
		}
		c.Identity = genIdentities[ch.intn(len(genIdentities))]
		c.CIIdentity = genCIIdentity(c.Identity)
		c.Deleting = ch.intn(10) == 0
	}
	for k := range in.grant.Lines {
		r := &in.grant.Lines[k]
		r.Owner = genIdentities[ch.intn(len(genIdentities))]
		r.OwnerCI = genCIIdentity(r.Owner)
	}
	in.grant.Floor = int64(ch.intn(12))
	if ch.intn(5) == 1 {
		in.grant = Grant{Absent: true, Token: in.grant.Token, Floor: in.grant.Floor}
	}
	in.policy.MaxBuildJump = []int64{0, 2, 4}[ch.intn(3)]
	// Workflows, re-runs and rollbacks (choices added after those above).
	for k := range in.claims {
		c := &in.claims[k]
		if ch.intn(6) == 1 {
			c.Workflow = "hotfix.yml"
		}
		if ch.intn(6) == 1 {
			c.Rollback, c.RollbackReason = true, "INC-7: build 6 broke checkout"
		}
	}
	for k := range in.grant.Lines {
		r := &in.grant.Lines[k]
		if ch.intn(6) == 1 {
			r.Workflow = "hotfix.yml"
		}
		if ch.intn(4) == 1 {
			r.Since = r.HeldAt.Add(-time.Duration(ch.intn(2)) * time.Minute)
		}
	}
	in.policy.RefuseReruns = ch.intn(3) == 1
	in.policy.Rollbacks = genRollbacks[ch.intn(len(genRollbacks))]
	// Line records' tokens (records of an older operator have none).
	for k := range in.grant.Lines {
		if ch.intn(2) == 1 {
			in.grant.Lines[k].Token = int64(1 + ch.intn(8))
		}
	}
	// The namespace's reservation, read when the record is absent.
	if in.grant.Absent && ch.intn(2) == 1 {
		in.grant.Reserved = int64(ch.intn(40))
	}
	// Issue 31: workflows a CI token verified, records that know when
	// their build started, and a line memory about full.
	for k := range in.claims {
		c := &in.claims[k]
		c.WorkflowVerified = c.Workflow != "" && c.CIIdentity && ch.intn(2) == 1
	}
	for k := range in.grant.Lines {
		if r := &in.grant.Lines[k]; ch.intn(2) == 1 {
			r.Started = r.HeldAt.Add(-time.Duration(ch.intn(20)) * time.Minute)
		}
	}
	if !in.grant.Absent && ch.intn(8) == 1 {
		in.grant.Lines = append(in.grant.Lines, fullMemory(in.now, genIdentities[ch.intn(len(genIdentities))], 300*(1+ch.intn(3)))...)
	}
	return in
}

// fullMemory returns records of fake lines held by owner within the line
// memory at now, filling its share of it (the whole, for no owner) but for
// about slack bytes.
func fullMemory(now time.Time, owner string, slack int) []LineRecord {
	budget := LineMemoryBytes
	if owner != "" {
		budget = LineMemoryBytesPerOwner
	}
	var out []LineRecord
	size := 0
	// Long lines, then short ones into what is left.
	for _, branch := range []string{strings.Repeat("b", 200), "b"} {
		for k := 0; ; k++ {
			r := LineRecord{Repo: fmt.Sprintf("fake/app-%04d", len(out)), Branch: branch, Build: 1,
				HeldAt: now.Add(-time.Duration(len(out)) * time.Second), Owner: owner, OwnerCI: genCIIdentity(owner), Token: 1}
			if size+r.Size() > budget-slack {
				break
			}
			size += r.Size()
			out = append(out, r)
		}
	}
	return out
}

// genRollbacks are the policies on rollbacks.
var genRollbacks = []Rollbacks{"", RollbacksAnyone, RollbacksPeopleOnly, RollbacksNobody}

// withFreezes gives in a freeze (often) and its claims overrides (rule
// 12), chosen by ch. It draws from its own chooser in the property tests,
// so that the inputs genInput draws stay those every earlier version of
// the tests checked.
func withFreezes(ch chooser, in input) input {
	if ch.intn(3) > 0 {
		in.policy.Freeze = Freeze{Frozen: true, Until: in.now.Add(time.Duration(ch.intn(3)) * time.Hour), Window: "holiday", Reason: "holiday freeze"}
		if ch.intn(3) == 1 {
			in.policy.Freeze.ReleaseSince, in.policy.Freeze.ReleaseWindow = at(ch.intn(121)), "incident"
		}
	}
	for k := range in.claims {
		if ch.intn(4) == 1 {
			in.claims[k].Override = Override{Reason: "hotfix", By: genIdentities[ch.intn(len(genIdentities))],
				Expires: genOverrideExpiries(in.now)[ch.intn(4)]}
		}
	}
	return in
}

// genOverrideExpiries are the expiries the generator gives overrides at
// now: none (void), past, in effect, and too far ahead.
func genOverrideExpiries(now time.Time) []time.Time {
	return []time.Time{{}, now.Add(-time.Minute), now.Add(30 * time.Minute), now.Add(MaxOverrideFor + time.Hour)}
}

// genIdentities are the identities the generator gives claims: unknown, two
// service accounts, a person, and a CI identity (genCIIdentity).
var genIdentities = []string{"", "system:serviceaccount:ci:shop", "system:serviceaccount:ci:web", "alice@example.com", "github:acme/shop"}

// genCIIdentity reports whether the generator's identity is a CI identity
// (Claim.CIIdentity).
func genCIIdentity(identity string) bool { return strings.HasPrefix(identity, "github:") }

// genPipeline reports whether the generator's identity is a pipeline's.
func genPipeline(identity string) bool { return IsPipeline(identity, genCIIdentity(identity)) }

// validReasons lists, per resulting phase, the reasons a changed claim may
// give.
var validReasons = map[Phase][]string{
	Held:       {ReasonAcquired},
	Waiting:    {ReasonWaitingForHolder, ReasonQueued, ReasonFrozen, ReasonLineMemoryFull},
	Superseded: {ReasonSupersededByNewerBuild, ReasonDuplicateBuild, ReasonLineOwnedByOther, ReasonBuildJumpTooLarge, ReasonRollbackNotAllowed},
	Released:   {ReasonPodFinished, ReasonPodGone, ReasonLockLost, ReasonForceReleased, ReasonDeleted, ReasonFreezeStarted},
	Expired:    {ReasonExpired, ReasonMaxHoldExceeded},
}

// grantedClaim is the index of the non-terminal claim whose hold the grant
// record is (-1 if none), and the record as rule 11 restores it. Rule 11
// restated: a claim shown Held with a token and an acquire time, its token
// the highest of all and at least the record's floor and (unless there is
// no record) its token, holds, unless the record names it already or
// freed it at that very token recording its end. Else the record stands,
// and the claim it names holds.
func grantedClaim(claims []Claim, g Grant) (int, Grant) {
	shown, highest := -1, int64(0)
	for i, c := range claims {
		highest = max(highest, c.FencingToken)
		if c.Phase == Held && c.FencingToken > 0 && !c.AcquiredAt.IsZero() && (shown < 0 || c.FencingToken > claims[shown].FencingToken) {
			shown = i
		}
	}
	if shown >= 0 {
		c := claims[shown]
		latest := c.FencingToken >= highest && c.FencingToken >= g.Floor && (g.Absent || c.FencingToken >= g.Token)
		namedAlready := g.Holder == c.Name && g.HolderUID == c.UID
		endRecorded := g.Holder == "" && g.Token == c.FencingToken && g.Ended.Name == c.Name && g.Ended.UID == c.UID
		if latest && !namedAlready && !endRecorded {
			return shown, Grant{Holder: c.Name, HolderUID: c.UID, Token: c.FencingToken, AcquiredAt: c.AcquiredAt, Writer: c.Writer, Lines: g.Lines}
		}
	}
	for i, c := range claims {
		if g.Holder != "" && !c.Phase.IsTerminal() && c.Name == g.Holder && c.UID == g.HolderUID {
			if c.Phase == Held && !c.AcquiredAt.IsZero() && c.FencingToken > 0 && c.FencingToken >= maxTokenBut(claims, i) &&
				!laterGrantTo(c, g) {
				g.AcquiredAt = c.AcquiredAt
			}
			return i, g
		}
	}
	return -1, g
}

// laterGrantTo reports whether record g is a later grant to claim c than
// the one c's Held status shows (a higher token, acquired later): rule 11
// keeps it.
func laterGrantTo(c Claim, g Grant) bool {
	return c.FencingToken > 0 && g.Token > c.FencingToken && !c.AcquiredAt.IsZero() && g.AcquiredAt.After(c.AcquiredAt)
}

// personsOverride is Override.Verified restated independently: an
// override counts only when the API server stamped who set it, and that
// is no service account.
func personsOverride(o Override) bool {
	return o.Reason != "" && o.By != "" && !strings.HasPrefix(o.By, "system:serviceaccount:")
}

// holdIsLive is rule 2 restated independently: does the granted claim keep
// the lock at now?
func holdIsLive(c Claim, g Grant, now time.Time, p Policy) bool {
	if c.Deleting || c.ForceRelease != "" || c.Pod == PodFinished || c.Pod == PodGone {
		return false
	}
	if p.MaxHold > 0 && !now.Before(g.AcquiredAt.Add(p.MaxHold)) {
		return false
	}
	if f := p.Freeze; f.Frozen && f.ReleaseSince.After(g.AcquiredAt) && !personsOverride(c.Override) {
		return false // a freeze that releases holders started after the grant
	}
	if c.Pod != NoPod {
		return true
	}
	// A renewal counts from when it was seen, never from the future.
	from := g.AcquiredAt
	for _, r := range []time.Time{c.RenewedAt, c.RenewTime} {
		if r.After(now) {
			r = now
		}
		if r.After(from) {
			from = r
		}
	}
	expiresAfter := c.ExpiresAfter
	if expiresAfter <= 0 {
		expiresAfter = DefaultExpiresAfter
	}
	return now.Before(from.Add(expiresAfter))
}

// remembered returns the highest build of c's line that the grant record,
// or the claims, remember holding at now since the line's last rollback (0
// if none), and its owner (see rememberedRecord).
func remembered(g Grant, claims []Claim, c Claim, now time.Time, p Policy) (int64, string) {
	if r, _ := rememberedRecord(g, claims, lineOf(c), now, p); r != nil {
		return r.Build, r.Owner
	}
	return 0, ""
}

// heldRecords restates what the grant record and the claims remember: the
// record's lines, and a record of each claim that held: at its acquire
// time if its status has a token and an acquire time, or (at the record's,
// which counts while its hold goes on) if the record names it; a
// rollback's hold rolled its line back when it was granted. A record's
// Started is its build's OrderTime.
func heldRecords(g Grant, claims []Claim, now time.Time, p Policy) []LineRecord {
	records := slices.Clone(g.Lines)
	for i, h := range claims {
		var heldAt time.Time
		var token int64
		named := !h.Phase.IsTerminal() && g.Holder != "" && h.Name == g.Holder && h.UID == g.HolderUID
		switch {
		case named && holdIsLive(h, g, now, p):
			heldAt, token = g.AcquiredAt, namedToken(claims, i, g)
		case h.FencingToken > 0 && !h.AcquiredAt.IsZero():
			heldAt, token = h.AcquiredAt, h.FencingToken
		case named:
			heldAt, token = g.AcquiredAt, namedToken(claims, i, g)
		default:
			continue
		}
		r := LineRecord{Repo: h.Repo, Branch: h.Branch, Workflow: h.Workflow, Build: h.Build, HeldAt: heldAt, Owner: h.Identity,
			OwnerCI: h.CIIdentity, Token: token, Started: p.OrderTime(h)}
		if h.Rollback {
			r.Since = heldAt
		}
		records = append(records, r)
	}
	return records
}

// lineRollback is a line's last rollback within the memory: when, and the
// highest token of the grants at that instant since it.
type lineRollback struct {
	at    time.Time
	token int64
}

// after reports whether record r, granted at or after now at the latest,
// counts after rollback since: a build granted at the very instant of the
// rollback is after it only with a token no lower (without tokens, only
// records since it are), and a grant cannot have been after now.
func (since lineRollback) after(r LineRecord, now time.Time) bool {
	heldAt := r.HeldAt
	if heldAt.After(now) {
		heldAt = now
	}
	if r.HeldAt.Equal(since.at) && r.Token > 0 && since.token > 0 {
		return r.Token >= since.token
	}
	return since.at.IsZero() || heldAt.After(since.at) || heldAt.Equal(since.at) && r.Since.Equal(since.at)
}

// rememberedRecord returns the record of the highest build of line l that
// the grant record, or the claims, remember holding at now since the
// line's last rollback (nil if none), and that rollback. Of equal builds
// the later grant is the line's (and of one instant, the higher token, or
// without tokens the greater owner). Of rollbacks at one instant, the one
// with the higher token is the line's last.
func rememberedRecord(g Grant, claims []Claim, l line, now time.Time, p Policy) (*LineRecord, lineRollback) {
	memory := p.LineMemory
	if memory <= 0 {
		memory = DefaultGrantRetention
	}
	records := heldRecords(g, claims, now, p)
	ofLine := func(r LineRecord) bool {
		return lineOf(Claim{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow}) == l && now.Before(r.HeldAt.Add(memory))
	}
	var since lineRollback
	for _, r := range records {
		if !ofLine(r) || r.Since.IsZero() || r.Since.After(now) {
			continue
		}
		if r.Since.After(since.at) {
			since = lineRollback{at: r.Since}
		}
		if r.Since.Equal(since.at) && r.HeldAt.Equal(since.at) {
			since.token = max(since.token, r.Token)
		}
	}
	var best *LineRecord
	for k, r := range records {
		if !ofLine(r) || !since.after(r, now) {
			continue
		}
		if best == nil || r.Build > best.Build || r.Build == best.Build && laterGrantOfBuild(r, *best) {
			best = &records[k]
		}
	}
	return best, since
}

// branchJudges restates what rule 3 judges claim c by across the lines of
// its branch: the record of the branch's latest grant (each line's
// remembered record; the latest by grant time, token where both have
// one, then line and owner), whose owner owns the branch; and the record
// of another line whose build started after c's (OrderTime), among those
// granted since the branch's last rollback (of any of its lines), if any.
func branchJudges(g Grant, claims []Claim, c Claim, now time.Time, p Policy) (latest, startedLater *LineRecord) {
	lines := map[line]bool{}
	for _, r := range heldRecords(g, claims, now, p) {
		if r.Repo == c.Repo && r.Branch == c.Branch {
			lines[line{r.Repo, r.Branch, r.Workflow}] = true
		}
	}
	var branchSince lineRollback
	byLine := map[line]*LineRecord{}
	for l := range lines {
		r, since := rememberedRecord(g, claims, l, now, p)
		if r == nil {
			continue
		}
		byLine[l] = r
		if since.at.After(branchSince.at) || since.at.Equal(branchSince.at) && since.token > branchSince.token {
			branchSince = since
		}
		if latest == nil || laterRecord(*latest, *r, now) {
			latest = r
		}
	}
	for l, r := range byLine {
		if l != lineOf(c) && !r.Started.IsZero() && branchSince.after(*r, now) && r.Started.After(p.OrderTime(c)) {
			startedLater = r
		}
	}
	return latest, startedLater
}

// laterRecord restates which of two records of a branch was granted
// later at now: by time (one after now counts as now), at one instant by
// token (none is the lowest), then by workflow (their repository and
// branch are one) and owner.
func laterRecord(old, r LineRecord, now time.Time) bool {
	at := func(k LineRecord) time.Time {
		if k.HeldAt.After(now) {
			return now
		}
		return k.HeldAt
	}
	switch {
	case !at(r).Equal(at(old)):
		return at(r).After(at(old))
	case r.Token != old.Token:
		return r.Token > old.Token
	case r.Workflow != old.Workflow:
		return r.Workflow > old.Workflow
	}
	return r.Owner > old.Owner
}

// namedToken restates rule 11 for the token of the hold that record g
// names, claims[i]: its status shows it once written; until then a grant's
// token is above every other, and at least the floor.
func namedToken(claims []Claim, i int, g Grant) int64 {
	c, others := claims[i], maxTokenBut(claims, i)
	switch {
	case c.Phase == Held && c.FencingToken > 0 && c.FencingToken >= others:
		return c.FencingToken
	case c.Phase != Held && (g.Token < g.Floor || g.Token <= others):
		return max(g.Floor, others+1)
	}
	return g.Token
}

// laterGrantOfBuild reports whether record r, of the build old is of,
// was granted after it: by token where both have one, else by time, and at
// one instant by owner.
func laterGrantOfBuild(r, old LineRecord) bool {
	if r.Token > 0 && old.Token > 0 && r.Token != old.Token {
		return r.Token > old.Token
	}
	return r.HeldAt.After(old.HeldAt) || r.HeldAt.Equal(old.HeldAt) && laterAtOneInstant(r, old)
}

// laterAtOneInstant reports whether record r, granted at the instant old
// was, beats it: the higher token where both have one, else the greater
// owner.
func laterAtOneInstant(r, old LineRecord) bool {
	if r.Token > 0 && old.Token > 0 && r.Token != old.Token {
		return r.Token > old.Token
	}
	return r.Owner > old.Owner
}

// mayRollBack restates who may roll back under policy p: anyone, a
// verified identity that is not a pipeline's, or nobody.
func mayRollBack(p Policy, c Claim) bool {
	switch p.Rollbacks {
	case RollbacksNobody:
		return false
	case RollbacksPeopleOnly:
		return c.Identity != "" && !genPipeline(c.Identity)
	}
	return true
}

// refusedByMemory reports whether a line's memory of build r refuses claim
// c as going backwards: a lower build, or (re-runs refused) the same one;
// a rollback never is.
func refusedByMemory(p Policy, c Claim, r int64) bool {
	return !c.Rollback && (r > c.Build || r == c.Build && p.RefuseReruns)
}

// queuing reports whether the policy queues every survivor (Queue, Fifo).
func queuing(p Policy) bool { return p.Ordering == Queue || p.Ordering == Fifo }

func normalized(p Phase) Phase {
	if p == "" {
		return Pending
	}
	return p
}

// checkInvariants returns what, if anything, d breaks of the package's rules
// for input in. It checks every property that holds for any input, however
// inconsistent: one holder, terminal is terminal, no pre-emption, never
// backwards, tokens, the grant record, write order, permutation invariance
// and the fixed point.
func checkInvariants(in input, d Decision) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if len(d.Verdicts) != len(in.claims) {
		fail("%d verdicts for %d claims", len(d.Verdicts), len(in.claims))
	}
	byName := map[string]Verdict{}
	for _, v := range d.Verdicts {
		byName[v.Name] = v
	}
	granted, restored := grantedClaim(in.claims, in.grant)
	maxToken := max(in.grant.Token, in.grant.Floor, in.grant.Reserved)
	var heldNames, waitingNames []string
	for i, c := range in.claims {
		maxToken = max(maxToken, c.FencingToken)
		v, ok := byName[c.Name]
		if !ok || v.UID != c.UID {
			fail("%s: no verdict", c.Name)
			continue
		}
		if v.From != normalized(c.Phase) {
			fail("%s: From=%s for phase %q", c.Name, v.From, c.Phase)
		}
		if c.Phase.IsTerminal() {
			// Rule 8: terminal is terminal.
			if v.Phase != c.Phase || v.Reason != "" || v.Message != "" || v.SupersededBy != "" {
				fail("%s: terminal claim changed: %s", c.Name, v)
			}
			continue
		}
		if !slices.Contains(validReasons[v.Phase], v.Reason) {
			fail("%s: phase %s with reason %q", c.Name, v.Phase, v.Reason)
		}
		if v.Message == "" {
			fail("%s: no message", c.Name)
		}
		if v.SupersededBy != "" && v.Phase != Superseded {
			fail("%s: SupersededBy %q on %s", c.Name, v.SupersededBy, v.Phase)
		}
		// Legal transitions (the grant's own claim may be Held in all but its
		// status, so it may end as a holder from any phase).
		if i != granted && v.From != Held && v.Phase == Expired {
			fail("%s: %s -> Expired without holding", c.Name, v.From)
		}
		if v.From == Held && v.Phase != Held && v.Phase != Released && v.Phase != Expired {
			fail("%s: Held -> %s", c.Name, v.Phase)
		}
		// Queue and Fifo claims name the claim ahead, never the holder. A
		// frozen target holds back every waiting claim but those with an
		// override in effect (rule 12).
		queued := v.Phase == Waiting && queuing(in.policy)
		if v.Phase == Waiting {
			want := ReasonWaitingForHolder
			switch {
			case v.Reason == ReasonLineMemoryFull:
				// Its line cannot be remembered: the memory, as the decision
				// leaves it, has no room for it.
				if !memoryFull(d.Grant, in.claims, c, in) {
					fail("%s: waits for room in a memory that has it: %v", c.Name, d.Grant.Lines)
				}
				want = ReasonLineMemoryFull
			case in.policy.Freeze.Frozen && !c.Override.InEffect(in.now):
				want = ReasonFrozen
			case queued:
				want = ReasonQueued
			}
			if v.Reason != want {
				fail("%s: reason %s under ordering %q, frozen=%v, want %s", c.Name, v.Reason, in.policy.Ordering, in.policy.Freeze.Frozen, want)
			}
		}
		if queued && (v.Holder != "" || v.Waiting != "") {
			fail("%s: queued, but names holder %q and waiting %q", c.Name, v.Holder, v.Waiting)
		}
		// The holder names no waiter, so that a new waiter never rewrites it.
		waiting := d.Waiting
		if v.Phase == Held {
			waiting = ""
		}
		if !queued && (v.Holder != d.Holder || v.Waiting != waiting) {
			fail("%s: names holder %q and waiting %q, decision %q and %q", c.Name, v.Holder, v.Waiting, d.Holder, waiting)
		}
		switch v.Phase {
		case Held:
			heldNames = append(heldNames, c.Name)
			if v.FencingToken != d.Grant.Token {
				fail("%s: held with token %d, grant has %d", c.Name, v.FencingToken, d.Grant.Token)
			}
		case Waiting:
			waitingNames = append(waitingNames, c.Name)
			// A claim keeps its place; with Queue, the line's newest build
			// takes the line's earliest place.
			lineFirst := in.policy.Ordering == Queue && v.QueuedAt.Before(c.QueuedAt)
			if v.QueuedAt.IsZero() || (!c.QueuedAt.IsZero() && !v.QueuedAt.Equal(c.QueuedAt) && !lineFirst) {
				fail("%s: waits with place %s, had %s", c.Name, v.QueuedAt, c.QueuedAt)
			}
		}
	}
	// Rule "one holder": at most one Held; with NewestWins one Waiting.
	if len(heldNames) > 1 || (!queuing(in.policy) && len(waitingNames) > 1) {
		fail("held %v, waiting %v", heldNames, waitingNames)
	}
	if want := strings.Join(heldNames, ""); d.Holder != want || d.Grant.Holder != want {
		fail("Holder=%q Grant.Holder=%q, Held verdicts %v", d.Holder, d.Grant.Holder, heldNames)
	}
	if d.Queued != len(waitingNames) || (len(waitingNames) == 0) != (d.Waiting == "") {
		fail("Waiting=%q Queued=%d, Waiting verdicts %v", d.Waiting, d.Queued, waitingNames)
	}
	for _, name := range waitingNames {
		if first := byName[d.Waiting]; byName[name].QueuedAt.Before(first.QueuedAt) {
			fail("%s waits ahead of the first, %s", name, d.Waiting)
		}
	}
	// A free lock is granted at once: nobody waits or pends without a
	// holder, unless the target is frozen and no waiting claim has an
	// override in effect (rule 12).
	if d.Holder == "" {
		for _, v := range d.Verdicts {
			frozenOut := in.policy.Freeze.Frozen && v.Reason == ReasonFrozen || v.Reason == ReasonLineMemoryFull
			if !v.Phase.IsTerminal() && !frozenOut {
				fail("%s: %s (%s) on a free lock", v.Name, v.Phase, v.Reason)
			}
		}
	}
	// A frozen target grants only through an override in effect, and
	// records it.
	for i, c := range in.claims {
		v := byName[c.Name]
		newlyGranted := v.Phase == Held && i != granted
		if in.policy.Freeze.Frozen && newlyGranted && !c.Override.InEffect(in.now) {
			fail("%s: granted through a freeze without an override in effect (%+v)", c.Name, c.Override)
		}
		if newlyGranted && v.Overridden != in.policy.Freeze.Frozen {
			fail("%s: granted, Overridden=%v, frozen=%v", c.Name, v.Overridden, in.policy.Freeze.Frozen)
		}
		if v.Overridden && (v.Phase != Held || v.From == Held) {
			fail("%s: Overridden on %s -> %s", c.Name, v.From, v.Phase)
		}
	}
	// No pre-emption: a live holder stays, and so does its grant, but for
	// what rule 11 restores of it (its holder's own token, acquire time and
	// writer).
	liveHolder := granted >= 0 && holdIsLive(in.claims[granted], restored, in.now, in.policy)
	if liveHolder {
		h := in.claims[granted]
		if d.Holder != h.Name || d.Grant.HolderUID != h.UID || d.GrantChanged != (d.Repair != "") || d.Grant.Writer != h.Writer ||
			!d.Grant.AcquiredAt.Equal(restored.AcquiredAt) {
			fail("live holder %s pre-empted, or its grant not its own: %v", h.Name, d)
		}
		if h.Phase == Held && h.FencingToken > 0 && d.Grant.Token != h.FencingToken && h.FencingToken >= maxTokenBut(in.claims, granted) &&
			!laterGrantTo(h, in.grant) {
			fail("holder %s shown Held with token %d, its grant has %d", h.Name, h.FencingToken, d.Grant.Token)
		}
	}
	// Grant, tokens and the grant record's memory.
	switch {
	case !d.GrantChanged:
		if !d.Grant.Equal(in.grant) || d.Repair != "" {
			fail("grant %s changed without GrantChanged (was %s), repair %q", d.Grant, in.grant, d.Repair)
		}
	case liveHolder:
		if d.Repair == "" {
			fail("a live holder's grant changed, repairing nothing: %s after %s", d.Grant, in.grant)
		}
	case d.Holder != "":
		// A new hold: its token is above every token known, and the next
		// one unless rule 11 found a token issued beyond them.
		if d.Grant.Token <= maxToken || (d.Repair == "" && d.Grant.Token != maxToken+1) || !d.Grant.AcquiredAt.Equal(in.now) {
			fail("new grant %s after %s (highest token %d)", d.Grant, in.grant, maxToken)
		}
		h := in.claims[slices.IndexFunc(in.claims, func(c Claim) bool { return c.Name == d.Holder })]
		if b, owner := remembered(d.Grant, nil, h, in.now, in.policy); b != h.Build || owner != h.Identity {
			fail("granted build %d of %s@%s, the grant remembers %v", h.Build, h.Repo, h.Branch, d.Grant.Lines)
		}
		if d.Grant.Writer != h.Writer {
			fail("granted %s, whose writer is %+v, but recorded writer %+v", h.Name, h.Writer, d.Grant.Writer)
		}
	case d.Grant.Holder != "" || d.Grant.Token < maxToken || (d.Repair == "" && d.Grant.Token != maxToken) || d.Grant.Writer != (Writer{}):
		fail("freed grant %s after %s (highest token %d)", d.Grant, in.grant, maxToken)
	case in.grant.Holder == "" && !in.grant.Absent && d.Repair == "":
		fail("freed a free grant: %s after %s", d.Grant, in.grant)
	}
	// The memory never forgets a build it was given or the claims show,
	// and stays within its bounds.
	size := 0
	for _, r := range d.Grant.Lines {
		size += r.Size()
	}
	if size > maxKeptLineBytes {
		fail("the grant's line memory takes %d bytes", size)
	}
	if d.GrantChanged {
		rolledBack := ""
		if h := slices.IndexFunc(in.claims, func(c Claim) bool { return c.Name == d.Holder }); h >= 0 && in.claims[h].Rollback {
			rolledBack = in.claims[h].Name // its grant lowers its line's memory, on purpose
		}
		for _, c := range in.claims {
			if rolledBack != "" && lineOf(c) == lineOf(in.claims[slices.IndexFunc(in.claims, func(c Claim) bool { return c.Name == rolledBack })]) {
				continue
			}
			before, since := rememberedRecord(restored, in.claims, lineOf(c), in.now, in.policy)
			if before != nil {
				r := *before
				r.Since = since.at // as the record keeps it
				before = &r
			}
			// (A build only the claims show is remembered while the memory
			// has room for it.)
			if after, _ := remembered(d.Grant, nil, c, in.now, in.policy); before != nil && after < before.Build &&
				!wouldNotFit(d.Grant, nil, *before, in) {
				fail("the grant forgot build %d of %s@%s (remembers %d)", before.Build, c.Repo, c.Branch, after)
			}
		}
	}
	if !d.NextLook.IsZero() && !d.NextLook.After(in.now) {
		fail("NextLook %s not after now %s", d.NextLook, in.now)
	}
	// Write order: stop holding, stay in the running, end, newly Held last.
	group := func(v Verdict) int {
		isGranted := granted >= 0 && v.Name == in.claims[granted].Name && v.UID == in.claims[granted].UID
		switch {
		case v.Phase != Held && (v.From == Held || isGranted):
			return 0
		case v.Phase == Held && v.From != Held:
			return 3
		case v.Phase.IsTerminal():
			return 2
		}
		return 1
	}
	if !slices.IsSortedFunc(d.Verdicts, func(a, b Verdict) int {
		if g := group(a) - group(b); g != 0 {
			return g
		}
		return strings.Compare(a.Name, b.Name)
	}) {
		fail("verdicts out of writing order:\n%s", d)
	}
	checkSupersessions(in, d, fail)
	// Permutation invariance.
	for _, perm := range permutations(in.claims) {
		if other := Decide(staging, perm, in.grant, in.now, in.policy); !reflect.DeepEqual(other, d) {
			fail("order matters:\n%s\nversus\n%s", d, other)
			break
		}
	}
	// Fixed point.
	again := Decide(staging, d.Apply(in.claims), d.Grant, in.now, in.policy)
	if again.GrantChanged || again.Holder != d.Holder || again.Waiting != d.Waiting || again.Queued != d.Queued {
		fail("not a fixed point:\n%s\nthen\n%s", d, again)
	}
	for k, v := range again.Verdicts {
		if v.Phase != v.From {
			fail("not a fixed point: %s", v)
		}
		if !v.Phase.IsTerminal() && v.Message != byName[v.Name].Message {
			fail("not a fixed point: %s: message %q, then %q", v.Name, byName[v.Name].Message, again.Verdicts[k].Message)
		}
	}
	return errors.Join(errs...)
}

// checkSupersessions checks that every claim superseded now was superseded
// by a build of its line at or above its own (or remembered by the grant
// record), or, with NewestWins only, by the newer waiting claim; and that no
// build is granted or queued behind a build of its line at or above it.
func checkSupersessions(in input, d Decision, fail func(string, ...any)) {
	inputs := map[string]Claim{}
	for _, c := range in.claims {
		c.Phase = normalized(c.Phase)
		inputs[c.Name] = c
	}
	// A hold granted by this decision, rather than one that goes on (the
	// record's, as rule 11 restores it).
	_, restored := grantedClaim(in.claims, in.grant)
	newHold := d.Holder != "" && (d.Holder != restored.Holder || d.Grant.HolderUID != restored.HolderUID)
	for _, v := range d.Verdicts {
		if v.Phase != Superseded || v.From.IsTerminal() {
			continue
		}
		c, by := inputs[v.Name], inputs[v.SupersededBy]
		r, _ := remembered(restored, in.claims, c, in.now, in.policy)
		latest, startedLater := branchJudges(restored, in.claims, c, in.now, in.policy)
		branchBuild := int64(0)
		if unverifiedWorkflow(&c) {
			branchBuild, _ = remembered(restored, in.claims, withoutWorkflow(c), in.now, in.policy)
		}
		// A line's record refuses a jump too far above it, and the record
		// of its branch's latest grant another pipeline's claim: the
		// record remembered, or the one the new hold writes.
		jump := in.policy.MaxBuildJump
		if jump <= 0 {
			jump = DefaultMaxBuildJump
		}
		h := inputs[d.Holder]
		sameBranch := newHold && h.Repo == c.Repo && h.Branch == c.Branch
		switch {
		case v.Reason == ReasonRollbackNotAllowed:
			if v.SupersededBy != "" || !c.Rollback || mayRollBack(in.policy, c) {
				fail("%s: refused as a rollback (rollback %v, identity %q) under rollbacks %q", c.Name, c.Rollback, c.Identity, in.policy.Rollbacks)
			}
		case v.Reason == ReasonLineOwnedByOther:
			owns := func(owner string) bool { return genPipeline(owner) && genPipeline(c.Identity) && owner != c.Identity }
			if explained := latest != nil && owns(latest.Owner) || sameBranch && owns(h.Identity); v.SupersededBy != "" || !explained {
				fail("%s: refused as %q on its branch, whose latest grant is %+v", c.Name, c.Identity, latest)
			}
		case v.Reason == ReasonBuildJumpTooLarge:
			jumps := func(r int64) bool { return r > 0 && c.Build-r > jump && (c.Identity == "" || genPipeline(c.Identity)) }
			if explained := jumps(r) || newHold && lineOf(h) == lineOf(c) && jumps(h.Build); v.SupersededBy != "" || !explained {
				fail("%s: build %d refused as a jump; the memory has build %d", c.Name, c.Build, r)
			}
		case v.SupersededBy == "":
			byNumber := refusedByMemory(in.policy, c, r) && (r == c.Build) == (v.Reason == ReasonDuplicateBuild) ||
				refusedByMemory(in.policy, c, branchBuild) && (branchBuild == c.Build) == (v.Reason == ReasonDuplicateBuild)
			byTime := startedLater != nil && !c.Rollback && v.Reason == ReasonSupersededByNewerBuild
			if !byNumber && !byTime {
				fail("%s: build %d (rollback %v) superseded by the grant record, which remembers build %d (of the branch's line "+
					"without a workflow: %d; %s, refuse re-runs %v), and no later build of its branch",
					c.Name, c.Build, c.Rollback, r, branchBuild, v.Reason, in.policy.RefuseReruns)
			}
		case judgedOnLine(c, lineOf(by)) && by.Build >= c.Build && (by.Build == c.Build) == (v.Reason == ReasonDuplicateBuild):
			// A build at or above it of a line it is judged on.
		case lineOf(by) != lineOf(c) && by.Repo == c.Repo && by.Branch == c.Branch && by.Name == d.Holder && newHold &&
			!c.Rollback && in.policy.OrderTime(c).Before(in.policy.OrderTime(by)) && v.Reason == ReasonSupersededByNewerBuild:
			// Of another line of its branch, granted now, and its build
			// started after this one.
		case !queuing(in.policy) && by.Name == d.Waiting && in.policy.Newer(by, c) && v.Reason == ReasonSupersededByNewerBuild:
			// NewestWins: the newer claim took the waiting slot.
		case judgedOnLine(c, lineOf(by)):
			fail("%s: build %d superseded by build %d (%s)", c.Name, c.Build, by.Build, v.Reason)
		case queuing(in.policy):
			fail("%s: superseded by %s of another line under %s", c.Name, by.Name, in.policy.Ordering)
		case by.Name != d.Waiting || !in.policy.Newer(by, c) || v.Reason != ReasonSupersededByNewerBuild:
			fail("%s: superseded by %s of another line, which is not the newer waiting claim", c.Name, by.Name)
		}
	}
	// (An override granted through a freeze goes ahead of the newer.)
	// (And so does a claim whose line the memory has room for.)
	if !queuing(in.policy) && newHold && d.Waiting != "" && !in.policy.Freeze.Frozen && !in.policy.Newer(inputs[d.Holder], inputs[d.Waiting]) &&
		verdictOf(d, d.Waiting).Reason != ReasonLineMemoryFull && !memoryFull(restored, in.claims, inputs[d.Waiting], in) {
		fail("granted %s although %s is newer", d.Holder, d.Waiting)
	}
	// Never backwards: the holder and the waiting claims of each line, in
	// the order they go, have strictly increasing builds above every build of
	// the line the grant record remembers (or equal to it, a re-run, when
	// the policy allows), but for rollbacks, which go below (and lower
	// nothing for the builds behind them); and never two of the same build.
	var goes []Verdict
	for _, v := range d.Verdicts {
		if v.Phase == Held || v.Phase == Waiting {
			goes = append(goes, v)
		}
	}
	slices.SortFunc(goes, func(a, b Verdict) int {
		if g := compareFirst(a.Phase == Held, b.Phase == Held); g != 0 {
			return g
		}
		if q := a.QueuedAt.Compare(b.QueuedAt); q != 0 {
			return q
		}
		return strings.Compare(a.Name, b.Name) // places tie only in inconsistent inputs
	})
	last := map[line]int64{}
	for _, v := range goes {
		c := inputs[v.Name]
		if v.Phase == Held && !newHold {
			last[lineOf(c)] = c.Build
			continue
		}
		if b, ok := last[lineOf(c)]; ok && (b == c.Build || b > c.Build && !c.Rollback) {
			fail("%s: build %d (rollback %v) goes after build %d of its line", c.Name, c.Build, c.Rollback, b)
		}
		r, _ := remembered(restored, in.claims, c, in.now, in.policy)
		if refusedByMemory(in.policy, c, r) {
			fail("%s: build %d goes although build %d of its line held (refuse re-runs %v)", c.Name, c.Build, r, in.policy.RefuseReruns)
		}
		if unverifiedWorkflow(&c) {
			if b, _ := remembered(restored, in.claims, withoutWorkflow(c), in.now, in.policy); refusedByMemory(in.policy, c, b) {
				fail("%s: build %d of a workflow nothing verified goes although build %d of its branch held", c.Name, c.Build, b)
			}
		}
		if c.Rollback && !mayRollBack(in.policy, c) {
			fail("%s: a rollback goes as %q under rollbacks %q", c.Name, c.Identity, in.policy.Rollbacks)
		}
		latest, startedLater := branchJudges(restored, in.claims, c, in.now, in.policy)
		if latest != nil && genPipeline(latest.Owner) && genPipeline(c.Identity) && latest.Owner != c.Identity {
			fail("%s: goes as %s on a branch %s held last", c.Name, c.Identity, latest.Owner)
		}
		if startedLater != nil && !c.Rollback {
			fail("%s: goes although build %d of %q, which started later, held", c.Name, startedLater.Build, startedLater.Workflow)
		}
		// A rollback goes after a higher build, which stays the line's
		// highest for the builds behind.
		last[lineOf(c)] = max(last[lineOf(c)], c.Build)
	}
}

// withoutWorkflow is c on its branch's line without a workflow.
func withoutWorkflow(c Claim) Claim { c.Workflow = ""; return c }

// judgedOnLine restates which builds claim c is judged by: those of its
// own line, and, when its workflow is one nothing verified, those of its
// branch's line without one.
func judgedOnLine(c Claim, l line) bool {
	return l == lineOf(c) || c.Workflow != "" && !c.WorkflowVerified && l == lineOf(withoutWorkflow(c))
}

// memoryFull restates why claim c's line cannot be remembered in the line
// memory of grant g and the claims (noRoom).
func memoryFull(g Grant, claims []Claim, c Claim, in input) bool {
	r := LineRecord{Repo: c.Repo, Branch: c.Branch, Workflow: c.Workflow, Owner: c.Identity, OwnerCI: c.CIIdentity, Token: 1,
		Started: in.policy.OrderTime(c)}
	if c.Rollback {
		r.Since = in.now
	}
	return noRoom(g, claims, r, in)
}

// noRoom restates why a line's record r cannot be remembered in the line
// memory of grant g and the claims: the record has no line of r's, and r
// would take the memory past LineMemoryBytes, or its owner's records past
// LineMemoryBytesPerOwner. The memory counted is the record's lines and,
// for other lines it lacks, the builds the claims show held (at most what
// the arbiter counts: it adds those only while they fit).
func noRoom(g Grant, claims []Claim, r LineRecord, in input) bool {
	memory := in.policy.LineMemory
	if memory <= 0 {
		memory = DefaultGrantRetention
	}
	return !hasLine(g, r, memory, in.now) && wouldNotFit(g, claims, r, in)
}

// hasLine reports whether grant g remembers a build of r's line.
func hasLine(g Grant, r LineRecord, memory time.Duration, now time.Time) bool {
	for _, k := range g.Lines {
		if lineOf(Claim{Repo: k.Repo, Branch: k.Branch, Workflow: k.Workflow}) == lineOf(Claim{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow}) &&
			now.Before(k.HeldAt.Add(memory)) {
			return true
		}
	}
	return false
}

// wouldNotFit reports whether r, as a new line, would take the memory of
// grant g and the claims (without r's line) past its budgets.
func wouldNotFit(g Grant, claims []Claim, r LineRecord, in input) bool {
	memory := in.policy.LineMemory
	if memory <= 0 {
		memory = DefaultGrantRetention
	}
	of := func(k LineRecord) line { return lineOf(Claim{Repo: k.Repo, Branch: k.Branch, Workflow: k.Workflow}) }
	// Each line's record: its highest build, the later grant of equal ones.
	records := map[line]LineRecord{}
	for _, k := range heldRecords(g, claims, in.now, in.policy) {
		best, ok := records[of(k)]
		if in.now.Before(k.HeldAt.Add(memory)) && (!ok || k.Build > best.Build || k.Build == best.Build && laterGrantOfBuild(k, best)) {
			records[of(k)] = k
		}
	}
	delete(records, of(r))
	total, owner := 0, 0
	for _, k := range records {
		total += k.Size()
		if k.Owner == r.Owner {
			owner += k.Size()
		}
	}
	return total+r.Size() > LineMemoryBytes || r.Owner != "" && owner+r.Size() > LineMemoryBytesPerOwner
}

// maxTokenBut is the highest token of every claim but claims[skip].
func maxTokenBut(claims []Claim, skip int) int64 {
	var highest int64
	for i, c := range claims {
		if i != skip {
			highest = max(highest, c.FencingToken)
		}
	}
	return highest
}

// permutations returns a few reorderings of claims: reversed and rotated.
func permutations(claims []Claim) [][]Claim {
	if len(claims) < 2 {
		return nil
	}
	reversed := slices.Clone(claims)
	slices.Reverse(reversed)
	rotated := append(slices.Clone(claims[1:]), claims[0])
	return [][]Claim{reversed, rotated}
}
