package arbiter

import (
	"fmt"
	"strings"
	"time"
)

// Apply returns claims as they are once the decision is written: every claim
// with a verdict takes the verdict's phase, and the holder the grant's
// fencing token. Claims are matched by Name and UID; a claim the decision
// does not know is returned as it is. Apply does not modify claims.
//
// With Decision.Grant as the new grant, the result decides again to the same
// holder, waiting claim and phases (rule 9).
func (d Decision) Apply(claims []Claim) []Claim {
	type identity struct{ name, uid string }
	byIdentity := make(map[identity]Verdict, len(d.Verdicts))
	for _, v := range d.Verdicts {
		byIdentity[identity{v.Name, v.UID}] = v
	}
	out := make([]Claim, len(claims))
	for i, c := range claims {
		if v, ok := byIdentity[identity{c.Name, c.UID}]; ok {
			c.Phase = v.Phase
			if v.Phase == Held {
				c.FencingToken = v.FencingToken
			}
		}
		out[i] = c
	}
	return out
}

// String summarizes the decision on several lines: the holder, the waiting
// claim, the grant and the next look, then one verdict per line in writing
// order. The text depends only on the decision, for comparing in tests.
func (d Decision) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "holder=%q waiting=%q grant={%s}", d.Holder, d.Waiting, d.Grant)
	if d.GrantChanged {
		b.WriteString(" changed")
	}
	if !d.NextLook.IsZero() {
		fmt.Fprintf(&b, " nextLook=%s", precise(d.NextLook))
	}
	for _, v := range d.Verdicts {
		b.WriteString("\n  ")
		b.WriteString(v.String())
	}
	return b.String()
}

// String summarizes a verdict on one line, for example
// "shop-43: Waiting -> Held Acquired token=8". An unchanged terminal claim
// prints as "shop-41: Superseded (unchanged)". The message is left out.
func (v Verdict) String() string {
	if v.Reason == "" {
		return fmt.Sprintf("%s: %s (unchanged)", v.Name, v.Phase)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s -> %s %s", v.Name, v.From, v.Phase, v.Reason)
	if v.SupersededBy != "" {
		fmt.Fprintf(&b, " by=%s", v.SupersededBy)
	}
	if v.FencingToken != 0 {
		fmt.Fprintf(&b, " token=%d", v.FencingToken)
	}
	if !v.ExpiresAt.IsZero() {
		fmt.Fprintf(&b, " expiresAt=%s", precise(v.ExpiresAt))
	}
	if v.Warning != "" {
		b.WriteString(" warning")
	}
	return b.String()
}

// String summarizes a grant: "free token=7", or
// "shop-43/uid-43 token=8 since 2026-01-02T10:00:00Z".
func (g Grant) String() string {
	if g.Holder == "" {
		return fmt.Sprintf("free token=%d", g.Token)
	}
	return fmt.Sprintf("%s/%s token=%d since %s", g.Holder, g.HolderUID, g.Token, precise(g.AcquiredAt))
}

// precise formats an instant to the nanosecond, so that printed decisions
// that differ in time differ in text.
func precise(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}
