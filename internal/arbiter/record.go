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
			out = append(out, heldRecord(c, d.grant.AcquiredAt, d.grant.Token))
		case c.FencingToken > 0 && !c.AcquiredAt.IsZero():
			out = append(out, heldRecord(c, c.AcquiredAt, c.FencingToken))
		case i == d.granted:
			out = append(out, heldRecord(c, d.grant.AcquiredAt, d.grant.Token))
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
// given fencing token.
func heldRecord(c *Claim, heldAt time.Time, token int64) LineRecord {
	r := LineRecord{Repo: c.Repo, Branch: c.Branch, Workflow: c.Workflow, Build: c.Build, HeldAt: heldAt, Owner: c.Identity,
		OwnerCI: c.CIIdentity, Token: token}
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
// edited by hand forgets nothing the claims still show.
func (d *decider) rememberedLines() map[line]*LineRecord {
	hist := d.history()
	if len(d.grant.Lines) == 0 && len(hist) == 0 {
		return nil
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
	return memory
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
// evicted to make room.
func (d *decider) recordLine(c *Claim) []LineRecord {
	hist := d.history()
	var granted []LineRecord
	if c != nil {
		granted = []LineRecord{heldRecord(c, d.now, d.maxToken()+1)}
	}
	b := lineBudget{since: d.rollbacks(d.grant.Lines, hist, granted), now: d.now}
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
	slices.SortStableFunc(hist, compareRecords)
	for _, r := range hist {
		if d.remembers(r) {
			b.record(r)
		}
	}
	for _, r := range granted {
		b.grant(r)
	}
	return b.sorted()
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

// record remembers r, unless it is older than its line's last rollback: a
// line with a record takes it when it is higher (see higher); a new line is
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
	size := r.Size()
	if b.total+size > LineMemoryBytes || (r.Owner != "" && b.owners[r.Owner]+size > LineMemoryBytesPerOwner) {
		return
	}
	b.add(r)
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
	b.record(r)
}

// rolledBack reports whether r still counts after its line's last
// rollback, and if so gives it that rollback as its Since.
func (b *lineBudget) rolledBack(r *LineRecord) bool {
	since := b.since[lineOfRecord(r)]
	if !afterRollback(r, since, b.now) {
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
