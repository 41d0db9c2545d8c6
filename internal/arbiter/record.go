package arbiter

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// What a decision restored of the grant record it was given (rule 11):
// Decision.Repair.
const (
	// RepairRecreated: there was no record (Grant.Absent), and the claims
	// show a hold or builds that held; the record is written again.
	RepairRecreated = "Recreated"
	// RepairHolder: the record does not name the claim whose status shows
	// the lock's latest hold; it names it again.
	RepairHolder = "Holder"
	// RepairToken: the record's token or acquire time is not its holder's:
	// it differs from what the holder's status shows, or (before that
	// status is written) is not above every other token known.
	RepairToken = "Token"
	// RepairWriter: the record's Writer is not the one its holder's spec
	// implies.
	RepairWriter = "Writer"
	// RepairLines: the record's Lines lack a build the claims show held
	// (that the memory's budgets have room for).
	RepairLines = "Lines"
)

// names reports whether the record names claim c as its holder.
func (g Grant) names(c *Claim) bool {
	return g.Holder != "" && g.Holder == c.Name && g.HolderUID == c.UID
}

// names reports whether the ending is claim c's.
func (e Ending) names(c *Claim) bool {
	return e.Name == c.Name && e.UID == c.UID
}

// restoreRecord applies rule 11 to the input record g: the claims' statuses,
// which only the operator writes, say which hold is the lock's latest, and
// the record must agree with them. It returns the record the decision goes
// on with, and what it repaired ("" if nothing).
func (d *decider) restoreRecord(g Grant) (Grant, string) {
	if h := d.shownHold(g); h != none && !g.names(d.claims[h]) {
		c := d.claims[h]
		// A record that names another claim with a token no later than
		// c's, that names nobody although it never recorded c's end, or
		// that is missing was deleted or edited: c's hold goes on.
		if g.Absent || g.Token < c.FencingToken || g.Holder != "" || !g.Ended.names(c) {
			repair := RepairHolder
			if g.Absent {
				repair = RepairRecreated
			}
			return Grant{Holder: c.Name, HolderUID: c.UID, Token: c.FencingToken, AcquiredAt: c.AcquiredAt,
				Lines: g.Lines, Ended: g.Ended, Writer: c.Writer, Audit: g.Audit, Floor: max(g.Floor, g.Token)}, repair
		}
	}
	holder := d.namedClaim(g)
	if holder == none {
		return g, ""
	}
	return d.restoreNamed(g, holder)
}

// restoreNamed applies rule 11 to record g, which names claim holder: its
// token, acquire time and writer are that claim's hold's.
func (d *decider) restoreNamed(g Grant, holder int) (Grant, string) {
	c, out, repair := d.claims[holder], g, ""
	switch others := d.highestTokenBut(holder); {
	case c.Phase == Held && regranted(c, g):
		// A later grant to the same claim (a person freed the record, and
		// the claim, still waiting in some cache, was granted again): its
		// Held status shows the earlier grant until this decision writes
		// it. The higher token stays; lowering it would send a token back.
	case c.Phase == Held && c.FencingToken > 0 && c.FencingToken >= others &&
		(c.FencingToken != g.Token || (!c.AcquiredAt.IsZero() && !c.AcquiredAt.Equal(g.AcquiredAt))):
		// The holder's status shows its hold: the record's token and acquire
		// time are that hold's. An edited-up token stays a floor.
		out.Floor, out.Token = max(g.Floor, g.Token), c.FencingToken
		if !c.AcquiredAt.IsZero() {
			out.AcquiredAt = c.AcquiredAt
		}
		repair = RepairToken
	case c.Phase != Held && grantedToken(c, g) > g.Token:
		// Granted, its Held status not written yet, and its token lowered
		// by hand: the line record the grant wrote with it still says
		// which token it was (bug 15: the claims that showed the tokens
		// before it may be gone, and its pipeline may hold that one).
		out.Token = grantedToken(c, g)
		repair = RepairToken
	case c.Phase != Held && (g.Token < g.Floor || g.Token <= others):
		// Granted, its Held status not written yet: a grant's token is above
		// every token there was, so a lower one was lowered by hand.
		out.Token = max(g.Floor, others+1)
		repair = RepairToken
	}
	if out.Writer != c.Writer {
		out.Writer = c.Writer
		repair = cmp.Or(repair, RepairWriter)
	}
	return out, repair
}

// grantedToken is the token that record g's line record of claim c's
// grant carries (the record of c's line at c's build, held at g's acquire
// time: written in the grant's own compare-and-swap), or 0 if there is
// none.
func grantedToken(c *Claim, g Grant) int64 {
	for _, r := range g.Lines {
		if lineOfRecord(&r) == lineOf(*c) && r.Build == c.Build && r.HeldAt.Equal(g.AcquiredAt) {
			return r.Token
		}
	}
	return 0
}

// regranted reports whether record g, which names claim c shown Held, is
// a later grant to c than the one c's status shows: a higher token,
// acquired after c's acquire time.
func regranted(c *Claim, g Grant) bool {
	return c.FencingToken > 0 && g.Token > c.FencingToken && !c.AcquiredAt.IsZero() && g.AcquiredAt.After(c.AcquiredAt)
}

// shownHold returns the claim whose status shows the lock's latest hold: a
// non-terminal claim shown Held, with a positive token and an acquire time,
// whose token is the highest of every claim's, at least the record's Floor,
// and, unless there is no record, at least the record's Token (a higher
// record token is a later grant). none if there is none.
func (d *decider) shownHold(g Grant) int {
	best := none
	var highest int64
	for i, c := range d.claims {
		highest = max(highest, c.FencingToken)
		if c.Phase == Held && c.FencingToken > 0 && !c.AcquiredAt.IsZero() &&
			(best == none || c.FencingToken > d.claims[best].FencingToken) {
			best = i
		}
	}
	if best == none {
		return none
	}
	if t := d.claims[best].FencingToken; t < highest || t < g.Floor || (!g.Absent && t < g.Token) {
		return none
	}
	return best
}

// namedClaim returns the non-terminal claim that record g names, or none.
func (d *decider) namedClaim(g Grant) int {
	for i, c := range d.claims {
		if !c.Phase.IsTerminal() && g.names(c) {
			return i
		}
	}
	return none
}

// highestTokenBut is the highest token of every claim but claims[skip].
func (d *decider) highestTokenBut(skip int) int64 {
	var highest int64
	for i, c := range d.claims {
		if i != skip {
			highest = max(highest, c.FencingToken)
		}
	}
	return highest
}

// history returns the line records the claims vouch for, in the order
// they were granted: a claim whose status shows that it held (a token and
// an acquire time: only a grant gives them) held its build at its acquire
// time, as its identity; and so did the claim the record names, since the
// record's acquire time while its hold goes on (its status then shows that
// time once written), and if its status shows no acquire time. A
// rollback's record rolls its line back then.
func (d *decider) history() []LineRecord {
	var out []LineRecord
	for i, c := range d.claims {
		switch {
		case i == d.granted && i == d.liveHolder:
			out = append(out, heldRecord(c, d.grant.AcquiredAt, d.grant.Token, d.orderTime[i]))
		case c.FencingToken > 0 && !c.AcquiredAt.IsZero():
			out = append(out, heldRecord(c, c.AcquiredAt, c.FencingToken, d.orderTime[i]))
		case i == d.granted:
			out = append(out, heldRecord(c, d.grant.AcquiredAt, d.grant.Token, d.orderTime[i]))
		}
	}
	if len(out) > 1 {
		slices.SortStableFunc(out, compareGrants)
	}
	return out
}

// compareGrants orders line records by when they were granted: by HeldAt,
// and at one instant by token where both have one (records of an older
// operator have none, and keep the order they come in).
func compareGrants(a, b LineRecord) int {
	if c := a.HeldAt.Compare(b.HeldAt); c != 0 || a.Token == 0 || b.Token == 0 {
		return c
	}
	return cmp.Compare(a.Token, b.Token)
}

// heldRecord is the line record of c's hold granted at heldAt with the
// given fencing token; started is c's OrderTime.
func heldRecord(c *Claim, heldAt time.Time, token int64, started time.Time) LineRecord {
	r := LineRecord{Repo: c.Repo, Branch: c.Branch, Workflow: c.Workflow, Build: c.Build, HeldAt: heldAt, Owner: c.Identity,
		OwnerCI: c.CIIdentity, Token: token, Started: started}
	if c.Rollback {
		r.Since = heldAt
	}
	return r
}

// lineOfRecord is the line a record is of.
func lineOfRecord(r *LineRecord) line { return line{r.Repo, r.Branch, r.Workflow} }

// lastRollback is a line's last rollback: when, and the highest token of the
// records granted at that instant since it (0: none has a token).
type lastRollback struct {
	at    time.Time
	token int64
}

// rollbacks returns when each line of the given records was last rolled
// back within the line memory: the latest Since of its records that are
// remembered (nil when no line was), but never after now (a record edited
// to the future cannot have rolled anything back yet). A line's builds
// granted before it no longer count; of two rollbacks at one instant, the
// one with the higher token is the later.
func (d *decider) rollbacks(sets ...[]LineRecord) map[line]lastRollback {
	var since map[line]lastRollback
	for _, records := range sets {
		for k := range records {
			r := &records[k]
			if r.Since.IsZero() || r.Since.After(d.now) || !d.remembers(*r) {
				continue
			}
			if since == nil {
				since = map[line]lastRollback{}
			}
			l := lineOfRecord(r)
			last := since[l]
			if r.Since.After(last.at) {
				last = lastRollback{at: r.Since}
			}
			if r.Since.Equal(last.at) && r.HeldAt.Equal(r.Since) {
				last.token = max(last.token, r.Token)
			}
			since[l] = last
		}
	}
	return since
}

// counts reports whether record r is part of its line's memory at now: it
// is within the line memory, and granted after its line's last rollback
// (or is that rollback's own record).
func (d *decider) counts(r *LineRecord, since map[line]lastRollback) bool {
	return d.remembers(*r) && afterRollback(r, since[lineOfRecord(r)], d.now)
}

// afterRollback reports whether record r counts after its line's last
// rollback (zero: none): it was granted later, or at that very instant
// with a token no lower than the last grant's since the rollback (the
// rollback's own record, or a grant after it); where either has no token,
// only the records since the rollback count at its instant. A record of a
// grant after now (an edited record, a skewed clock) counts as granted
// now, but not after a rollback granted now: it cannot have come after it.
func afterRollback(r *LineRecord, since lastRollback, now time.Time) bool {
	heldAt := r.HeldAt
	if heldAt.After(now) {
		heldAt = now
	}
	switch {
	case since.at.IsZero() || heldAt.After(since.at):
		return true
	case !heldAt.Equal(since.at):
		return false
	case r.HeldAt.Equal(since.at) && r.Token > 0 && since.token > 0:
		return r.Token >= since.token
	}
	return r.Since.Equal(since.at)
}

// higher reports whether record r of a line beats old, of the same line:
// a higher build, or the same build granted later (a re-run): with the
// higher token where both have one (tokens order grants; acquire times
// come from the granting manager's clock, which may be skewed), else
// later; records of one build granted at one instant without tokens
// tie-break on their owner, so that the order they come in does not
// matter.
func higher(old, r *LineRecord) bool {
	switch {
	case r.Build != old.Build:
		return r.Build > old.Build
	case r.Token > 0 && old.Token > 0 && r.Token != old.Token:
		return r.Token > old.Token
	case !r.HeldAt.Equal(old.HeldAt):
		return r.HeldAt.After(old.HeldAt)
	}
	return r.Owner > old.Owner
}

// rememberedLines returns, by line, the record of the highest build that
// held within Policy.LineMemory since the line's last rollback: the grant
// record's, or the claims' own (history), so that a record deleted or
// edited by hand forgets nothing the claims still show; and, by branch,
// what rule 3 judges across the branch's lines (see branchMemory).
func (d *decider) rememberedLines() (map[line]*LineRecord, map[branch]*branchMemory) {
	hist := d.history()
	if len(d.grant.Lines) == 0 && len(hist) == 0 {
		return nil, nil
	}
	since := d.rollbacks(d.grant.Lines, hist)
	memory := make(map[line]*LineRecord, len(d.grant.Lines)+len(hist))
	for _, records := range [][]LineRecord{d.grant.Lines, hist} {
		for k := range records {
			r := &records[k]
			if !d.counts(r, since) {
				continue
			}
			if old, ok := memory[lineOfRecord(r)]; !ok || higher(old, r) {
				memory[lineOfRecord(r)] = r
			}
		}
	}
	return memory, d.branchMemories(memory, since)
}

// branch is a repository and branch: the lines of its workflows, and the
// line without one, belong to it.
type branch struct{ repo, branch string }

func branchOfLine(l line) branch    { return branch{l.repo, l.branch} }
func branchOfClaim(c *Claim) branch { return branch{c.Repo, c.Branch} }

// branchLine is the line of c's branch without a workflow.
func branchLine(c *Claim) line { return line{c.Repo, c.Branch, ""} }

// branchMemory is what rule 3 judges a claim by across the lines of its
// branch, from the line memory (each line's record).
type branchMemory struct {
	// latest is the record of the branch's latest grant (compareGrants,
	// then by line and owner): its owner owns the branch.
	latest *LineRecord
	// started holds the records, of two different lines, whose builds
	// started last (Started) among those granted since the branch's last
	// rollback (of any of its lines); nil where there are none.
	started [2]*LineRecord
}

// branchMemories returns, by branch, what the memory (one record per line)
// says of it; since is each line's last rollback.
func (d *decider) branchMemories(memory map[line]*LineRecord, since map[line]lastRollback) map[branch]*branchMemory {
	// The branch's last rollback is the latest of its lines'.
	var branchSince map[branch]lastRollback
	for l, r := range since {
		b := branchOfLine(l)
		if last, ok := branchSince[b]; !ok || r.at.After(last.at) || r.at.Equal(last.at) && r.token > last.token {
			if branchSince == nil {
				branchSince = map[branch]lastRollback{}
			}
			branchSince[b] = r
		}
	}
	branches := make(map[branch]*branchMemory, len(memory))
	for l, r := range memory {
		b := branches[branchOfLine(l)]
		if b == nil {
			b = &branchMemory{}
			branches[branchOfLine(l)] = b
		}
		if b.latest == nil || d.laterGrant(b.latest, r) {
			b.latest = r
		}
		if r.Started.IsZero() || !afterRollback(r, branchSince[branchOfLine(l)], d.now) {
			continue
		}
		switch {
		case b.started[0] == nil || startedLater(b.started[0], r):
			b.started[0], b.started[1] = r, b.started[0]
		case b.started[1] == nil || startedLater(b.started[1], r):
			b.started[1] = r
		}
	}
	return branches
}

// laterGrant reports whether record r was granted after old (of another
// line of the branch) at now: by grant time, a time after now counting as
// now (a record edited to the future, or a skewed clock, cannot have come
// after a grant made now); at one instant by token (a record without one
// is the older); then by line and owner, so that the result does not
// depend on the order records come in.
func (d *decider) laterGrant(old, r *LineRecord) bool {
	oldAt, at := old.HeldAt, r.HeldAt
	if oldAt.After(d.now) {
		oldAt = d.now
	}
	if at.After(d.now) {
		at = d.now
	}
	switch {
	case !at.Equal(oldAt):
		return at.After(oldAt)
	case r.Token != old.Token:
		return r.Token > old.Token
	}
	if c := compareRecords(*r, *old); c != 0 {
		return c > 0
	}
	return r.Owner > old.Owner
}

// startedLater reports whether record r's build started after old's, and
// at one instant orders them by line.
func startedLater(old, r *LineRecord) bool {
	if c := r.Started.Compare(old.Started); c != 0 {
		return c > 0
	}
	return compareRecords(*r, *old) > 0
}

// startedAfter returns the record of another line of the branch than l
// whose build started after t, the latest such (nil if none).
func (b *branchMemory) startedAfter(l line, t time.Time) *LineRecord {
	for _, r := range b.started {
		if r != nil && lineOfRecord(r) != l {
			if r.Started.After(t) {
				return r
			}
			return nil
		}
	}
	return nil
}

// remembers reports whether record r still counts at now.
func (d *decider) remembers(r LineRecord) bool {
	return d.now.Before(r.HeldAt.Add(d.lineMemory()))
}

// forgets reports whether the record's Lines lack a build that a claim
// other than the holder shows held, and that they would remember if
// written again (recordLine): the record lost it (it was edited, or did
// not parse). The holder's own build is the record's already: its line is
// written when its hold ends.
func (d *decider) forgets() bool {
	kept := map[line]int64{}
	for k := range d.grant.Lines {
		if r := &d.grant.Lines[k]; d.remembers(*r) {
			kept[lineOfRecord(r)] = max(kept[lineOfRecord(r)], r.Build)
		}
	}
	// The builds the claims show held that the record lacks: usually none,
	// and then the memory need not be built again to know.
	shown := map[line]int64{}
	for i, c := range d.claims {
		if l := lineOf(*c); i != d.granted && c.FencingToken > 0 && !c.AcquiredAt.IsZero() &&
			d.now.Before(c.AcquiredAt.Add(d.lineMemory())) && c.Build > kept[l] {
			shown[l] = max(shown[l], c.Build)
		}
	}
	if len(shown) == 0 {
		return false
	}
	for _, r := range d.recordLine(nil) {
		if b := shown[lineOfRecord(&r)]; b > 0 && b == r.Build && kept[lineOfRecord(&r)] < b {
			return true
		}
	}
	return false
}

// recordLine returns the grant record's line records after granting c (nil
// records nothing). Records that no longer count (older than the line
// memory, or than their line's last rollback) are dropped; every other line
// keeps its record, raised to what the claims show (history); and c's line
// records c's build (a rollback's lowers it, and records when). A line
// without a record gets one only within the budgets (lineBudget): none is
// evicted to make room, and a claim whose line would get none is not
// granted (roomFor).
func (d *decider) recordLine(c *Claim) []LineRecord {
	if c == nil {
		return d.lineBudget().sorted()
	}
	return d.budget.sorted() // granted by grantAndQueue
}

// grantedBudget returns the line memory after granting c now. The grant's
// record goes in first, and whatever the budgets say: c was granted
// because the memory before (roomFor) had room for it, which the records
// only the claims show must not take in the memory after.
func (d *decider) grantedBudget(c *Claim) *lineBudget {
	granted := heldRecord(c, d.now, d.maxToken()+1, d.policy.OrderTime(*c))
	b := d.keptBudget([]LineRecord{granted})
	if b.rolledOff == nil {
		b.rolledOff = map[line]bool{}
	}
	b.rolledOff[lineOfRecord(&granted)] = true
	b.grant(granted)
	d.addShown(b)
	return b
}

// lineBudget returns the line memory as it stands before a grant: the
// records the grant record keeps and those the claims show, within the
// budgets.
func (d *decider) lineBudget() *lineBudget {
	b := d.keptBudget(nil)
	d.addShown(b)
	return b
}

// keptBudget returns the line memory of the records the grant record
// keeps. granted, if any, is the record of the grant to come (its
// rollback counts for its line).
func (d *decider) keptBudget(granted []LineRecord) *lineBudget {
	b := &lineBudget{since: d.rollbacks(d.grant.Lines, d.history(), granted), now: d.now}
	kept := make([]LineRecord, 0, len(d.grant.Lines))
	for _, r := range d.grant.Lines {
		if d.remembers(r) {
			kept = append(kept, r)
		}
	}
	// The newest first, so that a record edited beyond what any decision
	// writes loses its oldest lines.
	slices.SortStableFunc(kept, func(a, b LineRecord) int { return b.HeldAt.Compare(a.HeldAt) })
	for _, r := range kept {
		b.keep(r)
	}
	return b
}

// addShown adds to b the builds the claims show held (history): raising
// the lines b has first (a record that replaces another may free some of
// its owner's share), then adding new lines while the budgets allow, each
// by its highest build that fits, and raised to its highest; so that which
// line is remembered depends neither on the order of the lines nor on a
// claim that may vanish.
func (d *decider) addShown(b *lineBudget) {
	hist := d.history()
	shown := hist[:0]
	for _, r := range hist {
		if d.remembers(r) && b.rolledBack(&r) {
			shown = append(shown, r)
		}
	}
	// By line, the highest first.
	slices.SortStableFunc(shown, func(x, y LineRecord) int {
		if c := compareLines(x, y); c != 0 {
			return c
		}
		switch {
		case higher(&x, &y):
			return 1
		case higher(&y, &x):
			return -1
		}
		return 0
	})
	raise := func() {
		for _, r := range shown {
			if _, ok := b.index[lineOfRecord(&r)]; ok {
				b.record(r)
			}
		}
	}
	raise()
	for _, r := range shown {
		if _, ok := b.index[lineOfRecord(&r)]; !ok {
			b.record(r)
		}
	}
	// A line that got in by a lower build is raised to its highest, as the
	// next decision, which keeps the line, would.
	raise()
}

// compareLines orders records by line alone.
func compareLines(a, b LineRecord) int {
	if c := strings.Compare(a.Repo, b.Repo); c != 0 {
		return c
	}
	if c := strings.Compare(a.Branch, b.Branch); c != 0 {
		return c
	}
	return strings.Compare(a.Workflow, b.Workflow)
}

// roomFor reports whether the grant record would remember claim i's build
// if i were granted now: its line has a record, or the budgets have room
// for one. A build that would not be remembered is not granted (rule 6):
// once its claim was gone, a lower build of its line would deploy after
// it. Once this decision granted a claim, the memory is the one after
// that grant, which the next decision starts from.
func (d *decider) roomFor(i int) bool {
	if d.budget == nil {
		d.budget = d.lineBudget()
	}
	return d.budget.fits(heldRecord(d.claims[i], d.now, d.maxToken()+1, d.orderTime[i]))
}

// memoryFrees is when a record of the line memory first leaves it (the
// earliest HeldAt + LineMemory), which may make room for a line that has
// none; zero if the memory is empty.
func (d *decider) memoryFrees() time.Time {
	if d.budget == nil {
		d.budget = d.lineBudget()
	}
	var first time.Time
	for _, r := range d.budget.records {
		first = earliest(first, r.HeldAt.Add(d.lineMemory()))
	}
	return first
}

// lineBudget builds a line memory within LineMemoryBytes and
// LineMemoryBytesPerOwner: one record per line, the highest build since
// the line's last rollback (since), which it records.
type lineBudget struct {
	since   map[line]lastRollback
	now     time.Time
	records []LineRecord
	index   map[line]int   // records[index[l]] is line l's
	total   int            // the records' sizes
	owners  map[string]int // by owner
	// rolledOff marks the lines that had records which no longer count
	// (from before their last rollback), and the line of a grant found
	// room for (see grantedBudget): a grant of such a line goes in.
	rolledOff map[line]bool
}

// keep adds a record the grant record had, unless its line has a higher
// one (see higher), the record is older than its line's last rollback, or
// the memory holds maxKeptLineBytes already.
func (b *lineBudget) keep(r LineRecord) {
	if !b.rolledBack(&r) {
		return
	}
	if k, ok := b.index[lineOfRecord(&r)]; ok {
		if higher(&b.records[k], &r) {
			b.replace(k, r)
		}
		return
	}
	if b.total+r.Size() <= maxKeptLineBytes {
		b.add(r)
	}
}

// fits reports whether granting r would leave its line with a record: the
// line has one, or the budgets have room for a new one.
func (b *lineBudget) fits(r LineRecord) bool {
	if _, ok := b.index[lineOfRecord(&r)]; ok {
		return true
	}
	return b.room(r)
}

// room reports whether a new line's record r stays within LineMemoryBytes,
// and its owner's within LineMemoryBytesPerOwner.
func (b *lineBudget) room(r LineRecord) bool {
	size := r.Size()
	return b.total+size <= LineMemoryBytes && (r.Owner == "" || b.owners[r.Owner]+size <= LineMemoryBytesPerOwner)
}

// record remembers r, unless it is older than its line's last rollback: a
// line with a record takes it when it is higher (see higher); a line whose
// records the rollback left behind takes it in their place; a new line is
// added while the budgets allow.
func (b *lineBudget) record(r LineRecord) {
	if !b.rolledBack(&r) {
		return
	}
	if k, ok := b.index[lineOfRecord(&r)]; ok {
		if higher(&b.records[k], &r) {
			b.replace(k, r)
		}
		return
	}
	// A line whose records a rollback left behind keeps its place for the
	// rollback's; a new line goes in while the budgets allow.
	if b.rolledOff[lineOfRecord(&r)] || b.room(r) {
		b.add(r)
	}
}

// grant records r, the line's latest grant: it replaces the line's record
// unless that has a higher build, and a rollback's always does (the records
// before it no longer count); a new line is added while the budgets allow.
func (b *lineBudget) grant(r LineRecord) {
	// Granted now, it comes after every rollback the records know (none is
	// after now): it takes the line's last one as its Since.
	rollback := !r.Since.IsZero()
	r.Since = b.since[lineOfRecord(&r)].at
	if k, ok := b.index[lineOfRecord(&r)]; ok {
		if rollback || r.Build >= b.records[k].Build {
			b.replace(k, r)
		}
		return
	}
	if b.rolledOff[lineOfRecord(&r)] {
		// The line had a record that no longer counts (a rollback's grant
		// leaves it behind), or the grant was found room for already: the
		// grant takes its place.
		b.add(r)
		return
	}
	b.record(r)
}

// rolledBack reports whether r still counts after its line's last
// rollback, and if so gives it that rollback as its Since.
func (b *lineBudget) rolledBack(r *LineRecord) bool {
	since := b.since[lineOfRecord(r)]
	if !afterRollback(r, since, b.now) {
		if b.rolledOff == nil {
			b.rolledOff = map[line]bool{}
		}
		b.rolledOff[lineOfRecord(r)] = true
		return false
	}
	r.Since = since.at
	return true
}

func (b *lineBudget) add(r LineRecord) {
	if b.index == nil {
		b.index, b.owners = map[line]int{}, map[string]int{}
	}
	b.index[lineOfRecord(&r)] = len(b.records)
	b.records = append(b.records, r)
	b.total += r.Size()
	b.owners[r.Owner] += r.Size()
}

func (b *lineBudget) replace(k int, r LineRecord) {
	old := b.records[k]
	b.total += r.Size() - old.Size()
	b.owners[old.Owner] -= old.Size()
	b.owners[r.Owner] += r.Size()
	b.records[k] = r
}

// sorted returns the records by line (nil if none).
func (b *lineBudget) sorted() []LineRecord {
	if len(b.records) == 0 {
		return nil
	}
	slices.SortFunc(b.records, compareRecords)
	return b.records
}

// compareRecords orders line records by repository, branch, workflow, then
// when they held (compareGrants).
func compareRecords(a, b LineRecord) int {
	if c := strings.Compare(a.Repo, b.Repo); c != 0 {
		return c
	}
	if c := strings.Compare(a.Branch, b.Branch); c != 0 {
		return c
	}
	if c := strings.Compare(a.Workflow, b.Workflow); c != 0 {
		return c
	}
	return compareGrants(a, b)
}
