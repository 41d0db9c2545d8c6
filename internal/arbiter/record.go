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
				Lines: g.Lines, Ended: g.Ended, Writer: c.Writer, Floor: max(g.Floor, g.Token)}, repair
		}
	}
	holder := d.namedClaim(g)
	if holder == none {
		return g, ""
	}
	c, out, repair := d.claims[holder], g, ""
	switch others := d.highestTokenBut(holder); {
	case c.Phase == Held && c.FencingToken > 0 && c.FencingToken >= others &&
		(c.FencingToken != g.Token || (!c.AcquiredAt.IsZero() && !c.AcquiredAt.Equal(g.AcquiredAt))):
		// The holder's status shows its hold: the record's token and acquire
		// time are that hold's. An edited-up token stays a floor.
		out.Floor, out.Token = max(g.Floor, g.Token), c.FencingToken
		if !c.AcquiredAt.IsZero() {
			out.AcquiredAt = c.AcquiredAt
		}
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

// history returns the line records the claims vouch for: a claim whose
// status shows that it held (a token and an acquire time: only a grant
// gives them) held its build at its acquire time, as its identity; and so
// did the claim the record names, since the record's acquire time.
func (d *decider) history() []LineRecord {
	var out []LineRecord
	for i, c := range d.claims {
		switch {
		case i == d.granted:
			out = append(out, recordOf(c, d.grant.AcquiredAt))
		case c.FencingToken > 0 && !c.AcquiredAt.IsZero():
			out = append(out, recordOf(c, c.AcquiredAt))
		}
	}
	return out
}

// recordOf is the line record of claim c's build held since heldAt, by
// c's identity.
func recordOf(c *Claim, heldAt time.Time) LineRecord {
	return LineRecord{Repo: c.Repo, Branch: c.Branch, Build: c.Build, HeldAt: heldAt, Owner: c.Identity, OwnerCI: c.CIIdentity}
}

// rememberedLines returns, by line, the record of the highest build that
// held within Policy.LineMemory: the grant record's, or the claims' own
// (history), so that a record deleted or edited by hand forgets nothing the
// claims still show. Of two records of one build, the later counts, as
// recordLine keeps it: its owner is the line's.
func (d *decider) rememberedLines() map[line]*LineRecord {
	hist := d.history()
	if len(d.grant.Lines) == 0 && len(hist) == 0 {
		return nil
	}
	memory := make(map[line]*LineRecord, len(d.grant.Lines)+len(hist))
	for _, records := range [][]LineRecord{d.grant.Lines, hist} {
		for k := range records {
			if r := &records[k]; d.remembers(*r) {
				l := line{r.Repo, r.Branch}
				if old, ok := memory[l]; !ok || r.Build > old.Build || (r.Build == old.Build && r.HeldAt.After(old.HeldAt)) {
					memory[l] = r
				}
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
	for _, r := range d.grant.Lines {
		if d.remembers(r) {
			kept[line{r.Repo, r.Branch}] = max(kept[line{r.Repo, r.Branch}], r.Build)
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
		if b := shown[line{r.Repo, r.Branch}]; b > 0 && b == r.Build && kept[line{r.Repo, r.Branch}] < b {
			return true
		}
	}
	return false
}

// recordLine returns the grant record's line records after granting c (nil
// records nothing). Records that no longer count are dropped; every other
// line keeps its record, raised to what the claims show (history); and c's
// line records c's build. A line without a record gets one only within the
// budgets (lineBudget): none is evicted to make room.
func (d *decider) recordLine(c *Claim) []LineRecord {
	var b lineBudget
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
	hist := d.history()
	slices.SortFunc(hist, compareRecords)
	for _, r := range hist {
		if d.remembers(r) {
			b.record(r)
		}
	}
	if c != nil {
		b.record(recordOf(c, d.now))
	}
	return b.sorted()
}

// lineBudget builds a line memory within LineMemoryBytes and
// LineMemoryBytesPerOwner: one record per line.
type lineBudget struct {
	records []LineRecord
	index   map[line]int   // records[index[l]] is line l's
	total   int            // the records' sizes
	owners  map[string]int // by owner
}

// keep adds a record the grant record had, unless its line has a higher
// one, or the memory holds maxKeptLineBytes already.
func (b *lineBudget) keep(r LineRecord) {
	if k, ok := b.index[line{r.Repo, r.Branch}]; ok {
		if r.Build > b.records[k].Build {
			b.replace(k, r)
		}
		return
	}
	if b.total+r.Size() <= maxKeptLineBytes {
		b.add(r)
	}
}

// record remembers r: a line with a record takes r's build when it is
// higher; a new line is added while the budgets allow.
func (b *lineBudget) record(r LineRecord) {
	if k, ok := b.index[line{r.Repo, r.Branch}]; ok {
		if r.Build > b.records[k].Build || (r.Build == b.records[k].Build && r.HeldAt.After(b.records[k].HeldAt)) {
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

func (b *lineBudget) add(r LineRecord) {
	if b.index == nil {
		b.index, b.owners = map[line]int{}, map[string]int{}
	}
	b.index[line{r.Repo, r.Branch}] = len(b.records)
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

// compareRecords orders line records by repository, branch, then when they
// held.
func compareRecords(a, b LineRecord) int {
	if c := strings.Compare(a.Repo, b.Repo); c != 0 {
		return c
	}
	if c := strings.Compare(a.Branch, b.Branch); c != 0 {
		return c
	}
	return a.HeldAt.Compare(b.HeldAt)
}
