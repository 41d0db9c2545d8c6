package arbiter

import (
	"cmp"
	"strings"
	"time"
)

// OrderTime is the instant that orders claim c against claims of other lines
// with NewestWins: its Timestamp (when its build started), else its creation
// time, and never later than Created + MaxTimestampSkew. A build cannot start
// after its claim is created, so a later Timestamp is a client's clock
// running ahead; capping it means a claim stamped far in the future ranks as
// if created a little later, and wins nothing against claims created after
// that.
func (p Policy) OrderTime(c Claim) time.Time {
	latest := c.Created.Add(p.timestampSkew())
	if c.Timestamp.IsZero() {
		return c.Created
	}
	if c.Timestamp.After(latest) {
		return latest
	}
	return c.Timestamp
}

// timestampSkew is MaxTimestampSkew, or its default.
func (p Policy) timestampSkew() time.Duration {
	if p.MaxTimestampSkew <= 0 {
		return DefaultMaxTimestampSkew
	}
	return p.MaxTimestampSkew
}

// Newer reports whether claim a ranks before claim b for the lock's waiting
// slot with NewestWins (rule 5): whether a is the newer build. The criteria,
// in order:
//
//  1. the later [Policy.OrderTime] is newer;
//  2. on equal OrderTime, the claim already in the slot (phase Waiting) is
//     newer, so that a tie never displaces the claim that waits;
//  3. then the smaller Name, then the smaller UID, a deterministic tie-break.
//
// Newer is a strict total order on claims with distinct names (names are
// unique in a namespace): for such a and b exactly one of Newer(a, b) and
// Newer(b, a) holds, and Newer(a, b) and Newer(b, c) imply Newer(a, c).
func (p Policy) Newer(a, b Claim) bool {
	return p.compareNewer(&a, &b) < 0
}

// compareNewer is Newer as a comparison for slices.SortFunc: negative when a
// is newer than b. The comparisons take pointers: a Claim is a few hundred
// bytes, and a decision over thousands of claims compares them often.
func (p Policy) compareNewer(a, b *Claim) int {
	if c := p.OrderTime(*b).Compare(p.OrderTime(*a)); c != 0 {
		return c
	}
	return compareNewerTie(a, b)
}

// compareNewerTie is compareNewer on claims of equal OrderTime.
func compareNewerTie(a, b *Claim) int {
	if c := compareFirst(a.Phase == Waiting, b.Phase == Waiting); c != 0 {
		return c
	}
	return compareIdentity(a, b)
}

// compareArrival orders claims of equal OrderTime that join the queue in
// the same decision (Queue and Fifo): the earlier Created first, then by
// identity.
func compareArrival(a, b *Claim) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return compareIdentity(a, b)
}

// compareInLine ranks claims of one line (rule 4): the higher Build first;
// among equal builds the one that was there first keeps its place: the claim
// already Waiting, then the earlier Created, then the smaller Name and UID.
func compareInLine(a, b *Claim) int {
	if c := cmp.Compare(b.Build, a.Build); c != 0 {
		return c
	}
	if c := compareFirst(a.Phase == Waiting, b.Phase == Waiting); c != 0 {
		return c
	}
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return compareIdentity(a, b)
}

// compareFirst ranks true before false.
func compareFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// compareIdentity orders claims by Name, then UID.
func compareIdentity(a, b *Claim) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return strings.Compare(a.UID, b.UID)
}
