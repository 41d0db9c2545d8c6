package arbiter

import (
	"cmp"
	"strings"
)

// Newer reports whether claim a ranks before claim b for the lock's waiting
// slot (rule 4): whether a is the newer build. The criteria, in order:
//
//  1. the later OrderTime is newer;
//  2. on equal OrderTime, the claim already in the slot (phase Waiting) is
//     newer, so that a tie never displaces the claim that waits;
//  3. then the smaller Name, then the smaller UID, a deterministic tie-break.
//
// Newer is a strict total order on claims with distinct names (names are
// unique in a namespace): for such a and b exactly one of Newer(a, b) and
// Newer(b, a) holds, and Newer(a, b) and Newer(b, c) imply Newer(a, c).
func Newer(a, b Claim) bool {
	return compareNewer(a, b) < 0
}

// compareNewer is Newer as a comparison for slices.SortFunc: negative when a
// is newer than b.
func compareNewer(a, b Claim) int {
	if c := b.OrderTime.Compare(a.OrderTime); c != 0 {
		return c
	}
	if c := compareFirst(a.Phase == Waiting, b.Phase == Waiting); c != 0 {
		return c
	}
	return compareIdentity(a, b)
}

// compareInLine ranks claims of one line (rule 3): the higher Build first;
// among equal builds the one that was there first keeps its place: the claim
// already Waiting, then the earlier Created, then the smaller Name and UID.
func compareInLine(a, b Claim) int {
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
func compareIdentity(a, b Claim) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return strings.Compare(a.UID, b.UID)
}
