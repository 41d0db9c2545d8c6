package chaos

// The checker's rules of rollbacks refused (issue 22), in its own words: a
// claim with spec.rollback that its lock's policy does not allow for its
// requester (spec.rollbacks Nobody; PeopleOnly and a pipeline, or a
// requester the operator does not take as verified) is Superseded with
// reason RollbackNotAllowed, and that reason is given to nothing else. A
// rollback the policy allows is judged like any other claim
// (checkNoRollback lets it go below its line).

import (
	"strings"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// mayRollBack reports whether policy setting r may allow claim cv's
// rollback, and whether it may refuse it (both, when it is not certain
// whether the operator verified cv's requester): Anyone allows it, Nobody
// refuses it; PeopleOnly allows a verified requester that is neither a
// service account nor a CI identity.
func (c *Checker) mayRollBack(r buildlockv1.Rollbacks, cv *claimView) (allowed, refused bool) {
	switch r {
	case buildlockv1.RollbacksNobody:
		return false, true
	case buildlockv1.RollbacksPeopleOnly:
		if cv.requester == "" || isServiceAccount(cv.requester) || cv.ciRequester {
			return false, true
		}
		if c.o.RequesterVerified == nil {
			return true, false
		}
		verified, certain := c.o.RequesterVerified(cv.created)
		return verified || !certain, !verified || !certain
	}
	return true, false
}

// checkRollbackRefusal judges a superseded claim's reason against the
// rollback rule. The policies judged by are those in effect at some point
// since the policy lag before the claim was created: its decision came
// after that, whatever the checker saw of it (a re-list shows an ending
// late). It reports whether the claim was refused as a rollback, which
// nothing else need explain (the operator refuses it whatever its line
// held).
func (c *Checker) checkRollbackRefusal(e Entry, lv *lockView, cv *claimView) bool {
	allowed, refused := false, false
	var settings []buildlockv1.Rollbacks
	for _, era := range lv.erasSince(cv.created.Add(-c.o.PolicyLag)) {
		a, r := c.mayRollBack(era.rollbacks, cv)
		allowed, refused = allowed || a, refused || r
		settings = append(settings, era.rollbacks)
	}
	if cv.status.Reason == buildlockv1.ReasonRollbackNotAllowed {
		switch {
		case cv.spec.Rollback == nil:
			c.violate(e, "rollback-refused", "%s was refused as a rollback (%s), but it is no rollback (no spec.rollback)", cv.name, cv.status.Reason)
		case !refused:
			c.violate(e, "rollback-refused", "%s was refused as a rollback (%s), but every policy since it was created (rollbacks %v) allows its requester %q to roll back (verified)",
				cv.name, cv.status.Reason, settings, cv.requester)
		}
		return true
	}
	if cv.spec.Rollback != nil && !allowed {
		c.violate(e, "rollback-refused", "%s is a rollback that no policy since it was created (rollbacks %v) allows its requester %q, and was superseded with reason %q, not %s",
			cv.name, settings, cv.requester, cv.status.Reason, buildlockv1.ReasonRollbackNotAllowed)
	}
	return false
}

// ClaimEnd returns claim ns/name's phase and reason as last seen, whether
// its lock's grant Lease ever named it, and whether the checker saw it.
func (c *Checker) ClaimEnd(ns, name string) (phase buildlockv1.Phase, reason string, granted, seen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cv := c.claims[c.names[ns+"/"+name]]
	if cv == nil {
		return "", "", false, false
	}
	_, granted = c.locks[cv.lock].grants[holderIdentity(cv.name, cv.uid)]
	return phaseOf(cv.status.Phase), cv.status.Reason, granted, true
}

// rolledBack reports whether lock lv (in namespace ns) granted a rollback
// of line l, at or below build, after the hold at heldAt that the line's
// memory kept (one manager's skew either way): the memory of a line starts
// again from its rollback, so a record lowered to it (or to a later build
// above it) is not forgotten. A holder the checker has not seen yet (its
// watch was down) is judged by the spec the workload created it with.
func (c *Checker) rolledBack(lv *lockView, ns string, l line, build int64, heldAt time.Time) bool {
	for identity, at := range lv.grants {
		if at.Before(heldAt.Add(-2 * c.o.Tolerance)) {
			continue
		}
		name, _, _ := strings.Cut(identity, "/")
		var spec buildlockv1.BuildLockSpec
		if cv := c.claims[c.names[ns+"/"+name]]; cv != nil {
			spec = cv.spec
		} else if first, ok := c.ledger.FirstSpec(ns, name); ok {
			spec = first
		}
		if spec.Rollback != nil && lineOf(spec) == l && spec.Build <= build {
			return true
		}
	}
	return false
}
