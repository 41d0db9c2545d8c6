package arbiter

import (
	"slices"
	"time"
	"unicode/utf8"
)

// audit returns the grant record's audit after a decision that moves the
// grant (to c with token, or, with c nil, to nobody): the input record's,
// with the entries of what this decision did that must outlive its claims:
// a hold it ended because a person force-released it, and c's grant when c
// is a rollback, a person's claim that a pipeline's would not have been, or
// a claim a person's override let through a freeze. The newest
// MaxAuditEntries within AuditBytes are kept.
func (d *decider) audit(c *Claim, token int64) []AuditEntry {
	var added []AuditEntry
	if d.ended.Reason == ReasonForceReleased && d.granted != none {
		h := d.claims[d.granted]
		added = append(added, auditEntry(AuditForceRelease, h, d.grant.Token, d.now, h.ForceReleasedBy, h.ForceRelease))
	}
	if c != nil {
		if e, ok := d.grantAudit(c, token); ok {
			added = append(added, e)
		}
		if e, ok := d.freezeAudit(c, token); ok {
			added = append(added, e)
		}
	}
	if len(added) == 0 {
		return d.grant.Audit
	}
	return boundAudit(slices.Concat(d.grant.Audit, added))
}

// grantAudit is the entry of c's grant with token, if c is a rollback, or a
// person's claim that rule 3 would have refused to a pipeline: of a branch
// another pipeline held last, or further above the line's memory than
// Policy.MaxBuildJump.
func (d *decider) grantAudit(c *Claim, token int64) (AuditEntry, bool) {
	r, remembered := d.memory[lineOf(*c)]
	var latest *LineRecord
	if b := d.branches[branchOfClaim(c)]; b != nil {
		latest = b.latest
	}
	switch {
	case c.Rollback:
		e := auditEntry(AuditRollback, c, token, d.now, c.Identity, c.RollbackReason)
		if remembered {
			e.From = r.Build
		}
		return e, true
	case !isPerson(c):
	case latest != nil && IsPipeline(latest.Owner, latest.OwnerCI) && latest.Owner != c.Identity:
		e := auditEntry(AuditOverride, c, token, d.now, c.Identity, ReasonLineOwnedByOther)
		e.From, e.Owner = latest.Build, latest.Owner
		return e, true
	case remembered && c.Build-r.Build > d.maxBuildJump():
		e := auditEntry(AuditOverride, c, token, d.now, c.Identity, ReasonBuildJumpTooLarge)
		e.From = r.Build
		return e, true
	}
	return AuditEntry{}, false
}

// freezeAudit is the entry of c's grant with token, if it goes through a
// freeze by c's override (rule 12): who let it through (the override's
// verified By) and why, as "Frozen: <the override's reason>".
func (d *decider) freezeAudit(c *Claim, token int64) (AuditEntry, bool) {
	if !d.policy.Freeze.Frozen || !c.Override.InEffect(d.now) {
		return AuditEntry{}, false
	}
	return auditEntry(AuditOverride, c, token, d.now, c.Override.By, ReasonFrozen+": "+c.Override.Reason), true
}

// auditEntry is an entry of kind about claim c's hold with token, by and
// why (free text, cut to what an entry keeps).
func auditEntry(kind string, c *Claim, token int64, at time.Time, by, why string) AuditEntry {
	return AuditEntry{
		Kind: kind, At: at, Name: c.Name, Repo: c.Repo, Branch: c.Branch, Workflow: c.Workflow, Build: c.Build,
		Token: token, By: cutText(by), Reason: cutText(why),
	}
}

// boundAudit keeps the newest entries: at most MaxAuditEntries, whose sizes
// add up to at most AuditBytes.
func boundAudit(entries []AuditEntry) []AuditEntry {
	size, keep := 0, len(entries)
	for k := len(entries) - 1; k >= 0; k-- {
		if size += entries[k].Size(); size > AuditBytes || len(entries)-k > MaxAuditEntries {
			break
		}
		keep = k
	}
	return entries[keep:]
}

// cutText cuts free text for the audit: at most MaxQuotedLength characters
// and maxAuditTextBytes bytes, on a character boundary.
func cutText(s string) string {
	n := 0
	for k := range s {
		if n == MaxQuotedLength || k > maxAuditTextBytes-utf8.UTFMax {
			return s[:k]
		}
		n++
	}
	return s
}
