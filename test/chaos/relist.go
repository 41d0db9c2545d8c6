package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// This file reconciles the checker's history with a re-list, after its watch
// failed (410 Gone: etcd compacted what it had not read yet), and checks
// holds against time.

// RelistClaims reconciles the checker's view of the BuildLocks with a list
// taken after the watch failed. Each object that changed is judged as if its
// latest version had been watched (a jump over states the checker missed
// must still be one the contract allows); each object missing from the
// list was deleted meanwhile, which its owner or the finished TTL must
// explain (the TTL may have passed while the checker was blind). The list is
// one consistent state: the one-holder rule is judged on it as a whole.
// Rules that depend on the order of grants (the queue's fairness and order)
// start afresh: a grant may have gone unseen.
func (c *Checker) RelistClaims(items []buildlockv1.BuildLock, rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.beginRelist("BuildLock", len(items), rv)
	c.relisting = true
	// The queue rules start afresh before the list is judged: a claim the
	// list shows Held may have been granted after holds the checker never
	// saw, so the waits it followed before prove nothing.
	for i := range items {
		c.lock(LockKey{items[i].Namespace, items[i].Spec.Target})
	}
	for _, lv := range c.locks {
		lv.fair = map[line]*fairLine{}
		lv.unsureUntil = now.Add(c.o.PolicyLag)
	}
	c.listed = make(map[types.UID]*buildlockv1.BuildLock, len(items))
	for i := range items {
		c.listed[items[i].UID] = &items[i]
	}
	seen := map[types.UID]bool{}
	for i := range items {
		bl := &items[i]
		seen[bl.UID] = true
		if cv := c.claims[bl.UID]; cv != nil && !cv.deleted && cv.rv == bl.ResourceVersion {
			continue
		}
		c.stats.RelistChanged++
		c.observeClaim(Relisted, bl)
	}
	var gone []*claimView
	for uid, cv := range c.claims {
		if !cv.deleted && !seen[uid] {
			gone = append(gone, cv)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].name < gone[j].name })
	for _, cv := range gone {
		c.stats.RelistGone++
		bl := &buildlockv1.BuildLock{Spec: cv.spec, Status: cv.status}
		bl.Namespace, bl.Name, bl.UID = cv.lock.Namespace, cv.name, cv.uid
		e := c.record(Entry{At: now, Kind: "BuildLock", Type: Relisted, Lock: cv.lock, Name: cv.name, UID: cv.uid, What: "gone: " + describeClaim(bl)})
		c.checkDeletion(e, bl, now, true)
		cv.deleted = true
		delete(c.lock(cv.lock).held, cv.uid)
	}
	c.relisting, c.listed = false, nil
	for _, check := range c.deferred {
		check()
	}
	c.deferred = nil
	for k, lv := range c.locks {
		c.checkOneHolder(Entry{Seq: len(c.history) - 1, Lock: k}, lv)
	}
}

// beginRelist counts and records a re-list of n objects of kind, and
// returns the checker's time. Call with c.mu held.
func (c *Checker) beginRelist(kind string, n int, rv string) time.Time {
	c.stats.Relists[kind]++
	now := c.o.Now()
	c.record(Entry{At: now, Kind: "Check", Type: Relisted, RV: rv, What: fmt.Sprintf("re-listed %d %ss after the watch failed", n, kind)})
	return now
}

// RelistLeases reconciles the checker's view of the grant Leases (and token
// floors) of the given namespaces with a list taken after the watch failed.
// A Lease whose token moved by more than one granted the tokens between
// unseen; a Lease missing from the list was deleted, which the operator may
// do only to an idle Lease whose token the namespace's floor keeps. So was
// a Lease listed under another UID: it was deleted and created again
// meanwhile (a person's deletion, then the operator's restore), and it is
// judged as that deletion followed by the new Lease.
func (c *Checker) RelistLeases(items []coordinationv1.Lease, rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.beginRelist("Lease", len(items), rv)
	// Floors first: a deletion is judged against the floor of its time.
	sort.SliceStable(items, func(i, j int) bool { return items[i].Name == TokenFloorLease && items[j].Name != TokenFloorLease })
	present := map[LockKey]bool{}
	for i := range items {
		l := &items[i]
		if strings.HasPrefix(l.Name, LeasePrefix) {
			present[LockKey{l.Namespace, strings.TrimPrefix(l.Name, LeasePrefix)}] = true
		}
		if l.Name != TokenFloorLease {
			k := LockKey{l.Namespace, strings.TrimPrefix(l.Name, LeasePrefix)}
			lv := c.locks[k]
			if lv != nil && lv.lease != nil && lv.lease.ResourceVersion == l.ResourceVersion {
				continue
			}
			c.stats.RelistChanged++
			if lv != nil && lv.lease != nil && !lv.leaseDeleted && lv.lease.UID != l.UID {
				c.stats.RelistGone++
				e := c.record(Entry{At: now, Kind: "Lease", Type: Relisted, Lock: k, Name: lv.lease.Name, UID: lv.lease.UID, What: "gone: created again as " + string(l.UID)})
				c.checkLeaseDeletion(e, lv, lv.lease, parseRV(rv))
			}
		}
		c.observeLease(Relisted, l)
	}
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		if !lv.leaseSeen || lv.leaseDeleted || present[k] || lv.lease == nil {
			continue
		}
		c.stats.RelistGone++
		e := c.record(Entry{At: now, Kind: "Lease", Type: Relisted, Lock: k, Name: lv.lease.Name, What: "gone"})
		c.checkLeaseDeletion(e, lv, lv.lease, parseRV(rv))
	}
}

// RelistPolicies replaces the checker's view of the policies with a list
// taken after the watch failed: a policy changed or deleted meanwhile takes
// effect as of now, with the policy lag before the ordering rules apply.
func (c *Checker) RelistPolicies(items []buildlockv1.BuildLockPolicy, rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.beginRelist("BuildLockPolicy", len(items), rv)
	present := map[LockKey]bool{}
	for i := range items {
		p := &items[i]
		present[LockKey{p.Namespace, p.Name}] = true
		c.observePolicy(Relisted, p, false)
	}
	for k, lv := range c.locks {
		if last := lv.eras[len(lv.eras)-1]; !present[k] && (last.ordering != buildlockv1.OrderingNewestWins || last.maxHold != c.o.MaxHold) {
			p := &buildlockv1.BuildLockPolicy{}
			p.Namespace, p.Name = k.Namespace, k.Target
			c.observePolicy(watch.Deleted, p, false)
		}
	}
}

// CheckHoldDeadlines judges time itself: a claim shown Held past the latest
// instant its hold may last (its pod-less expiry counted from the latest
// instant its renewal may count from, or its maximum hold) is a violation
// once that has gone on for longer than the hold slack, in real time
// (realNow), plus the time within in which no manager could act (an
// outage: outages.go): the operator had time to end it. So is a claim
// being deleted that has not ended, and a person's edit or deletion of a
// grant Lease that the operator has not undone, after as long. Call it
// often.
func (c *Checker) CheckHoldDeadlines(realNow time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkDeletingEnds(realNow)
	c.checkRepairsDue(realNow)
	now := c.o.Now()
	for uid := range c.heldUIDs() {
		cv := c.claims[uid]
		lv := c.locks[cv.lock]
		end := c.latestEnd(lv, cv)
		if end.IsZero() || now.Before(end.Add(c.o.Tolerance)) {
			cv.overrunSince = time.Time{}
			continue
		}
		over, allowed, due := c.overdue(&cv.overrunSince, realNow)
		if !due {
			c.stats.LongestOverrun = max(c.stats.LongestOverrun, over)
			continue
		}
		e := c.record(Entry{At: now, Kind: "Check", Lock: cv.lock, Name: cv.name, UID: cv.uid, What: "hold deadline"})
		c.violate(e, "hold-bounded", "%s is still Held %s after its hold ended at %s (slack %s, plus %s in which no manager could act): renewal from %s, expiresAfter %s",
			cv.name, now.Sub(end).Round(time.Millisecond), end.Format(time.StampMilli), c.o.HoldSlack, allowed.Round(time.Millisecond),
			cv.renewHigh.Format(time.StampMilli), expiresAfter(cv.spec))
		cv.overrunSince = realNow.Add(24 * time.Hour) // report once
	}
}

// overdue follows how long something the operator must react to has gone
// on: *since is when the checker first saw it (real time, set now the first
// time). It returns how long that is, the outage allowance (how long within
// no manager could act), and whether it is past the hold slack plus that.
func (c *Checker) overdue(since *time.Time, realNow time.Time) (over, allowed time.Duration, due bool) {
	if since.IsZero() {
		*since = realNow
	}
	over = realNow.Sub(*since)
	if over <= c.o.HoldSlack {
		return over, 0, false
	}
	allowed = c.allowance(*since, realNow)
	if over <= c.o.HoldSlack+allowed {
		c.stats.LongestExcused = max(c.stats.LongestExcused, over-c.o.HoldSlack)
		c.stats.LongestAllowance = max(c.stats.LongestAllowance, allowed)
		return over, allowed, false
	}
	return over, allowed, true
}

func (c *Checker) heldUIDs() map[types.UID]bool {
	out := map[types.UID]bool{}
	for _, lv := range c.locks {
		for uid := range lv.held {
			out[uid] = true
		}
	}
	return out
}
