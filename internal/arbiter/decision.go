package arbiter

import (
	"fmt"
	"strings"
	"time"
)

// Apply returns claims as they are once the decision is written: every claim
// with a verdict takes the verdict's phase, the holder the grant's fencing
// token and acquire time, a waiting claim its place in the queue, and a
// renewal is recorded.
// Claims are matched by Name and UID; a claim the decision does not know is
// returned as it is. Apply does not modify claims.
//
// With Decision.Grant as the new grant, the result decides again to the same
// holder, waiting claims and phases (rule 10).
func (d Decision) Apply(claims []Claim) []Claim {
	type identity struct{ name, uid string }
	byIdentity := make(map[identity]Verdict, len(d.Verdicts))
	for _, v := range d.Verdicts {
		byIdentity[identity{v.Name, v.UID}] = v
	}
	out := make([]Claim, len(claims))
	for i, c := range claims {
		if v, ok := byIdentity[identity{c.Name, c.UID}]; ok && v.Reason != "" {
			c.Phase = v.Phase
			switch v.Phase {
			case Held:
				c.FencingToken, c.AcquiredAt = v.FencingToken, d.Grant.AcquiredAt
				c.QueuedAt = time.Time{}
			case Waiting:
				c.QueuedAt = v.QueuedAt
			}
			if !v.Phase.IsTerminal() {
				c.RenewedAt, c.RenewTime = v.RenewedAt, time.Time{}
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
	fmt.Fprintf(&b, "holder=%q waiting=%q queued=%d grant={%s}", d.Holder, d.Waiting, d.Queued, d.Grant)
	if d.GrantChanged {
		b.WriteString(" changed")
	}
	if d.Repair != "" {
		fmt.Fprintf(&b, " repaired=%s", d.Repair)
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
	if !v.QueuedAt.IsZero() {
		fmt.Fprintf(&b, " queuedAt=%s", precise(v.QueuedAt))
	}
	if v.Warning != "" {
		b.WriteString(" warning")
	}
	if v.Overridden {
		b.WriteString(" overridden")
	}
	return b.String()
}

// String summarizes a grant: "free token=7", or
// "shop-43/uid-43 token=8 since 2026-01-02T10:00:00Z", followed by the
// remembered lines ("lines=[acme/shop@main#43 ...]") and the last ending.
func (g Grant) String() string {
	var b strings.Builder
	switch {
	case g.Absent:
		fmt.Fprintf(&b, "absent token=%d", g.Token)
	case g.Holder == "":
		fmt.Fprintf(&b, "free token=%d", g.Token)
	default:
		fmt.Fprintf(&b, "%s/%s token=%d since %s", g.Holder, g.HolderUID, g.Token, precise(g.AcquiredAt))
	}
	if g.Floor != 0 {
		fmt.Fprintf(&b, " floor=%d", g.Floor)
	}
	if g.Reserved != 0 {
		fmt.Fprintf(&b, " reserved=%d", g.Reserved)
	}
	if len(g.Lines) > 0 {
		b.WriteString(" lines=[")
		for k, r := range g.Lines {
			if k > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s@%s#%d", r.Repo, r.Branch, r.Build)
		}
		b.WriteByte(']')
	}
	if g.Ended.Name != "" {
		fmt.Fprintf(&b, " ended=%s:%s/%s", g.Ended.Name, g.Ended.Phase, g.Ended.Reason)
	}
	return b.String()
}

// precise formats an instant to the nanosecond, so that printed decisions
// that differ in time differ in text.
func precise(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}
