package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// This file holds the checker's rules on what people do around the locks
// and what the operator must make of it: grant Leases and token floors
// deleted or edited by hand (the operator writes them again from the
// claims, and a token never goes back), a Lease of somebody else's under a
// grant Lease's name (never taken over), and namespaces' consent to a lock
// (given and withdrawn by people only).

// repairDue is a person's edit or deletion of a grant Lease that no
// operator version has followed yet.
type repairDue struct {
	e     Entry
	what  string
	since time.Time // real time
}

// restore is an operator version of a grant Lease that names the latest
// grant's holder again (after the Lease was deleted, or written away from
// it): right only if that claim had not ended, which is judged at the end
// of the run, in etcd's order.
type restore struct {
	e   Entry
	uid types.UID
	rv  uint64
}

// follow is an operator version of a grant Lease that grants what a
// person's edit named, with the token of the grant before it: the
// documented residual of a person's edit (docs/api.md, "When someone
// deletes or edits them"), right only if the claim that held that token
// had ended, or gone, before it (judged at the end of the run, in etcd's
// order): then nothing shows the token any more, and the edit looks like
// another manager's grant.
type follow struct {
	e      Entry
	holder types.UID // the grant before it, whose token it took
	rv     uint64
}

// foreignLease is a Lease a person created under a grant Lease's name,
// carrying nothing of buildlock's: the operator must never change it, and
// no claim of its lock may hold while it exists.
type foreignLease struct {
	uid       types.UID
	first     *coordinationv1.Lease
	createdRV uint64
	deletedRV uint64 // zero while it exists
}

// foreignHold is a claim that entered Held while the checker knew of a
// foreign Lease of its lock.
type foreignHold struct {
	e    Entry
	name string
	rv   uint64
}

// namespaceView is a namespace's consent label as last seen.
type namespaceView struct {
	consent string // "" when it has none
}

// notePersonEdit records a version of the grant Lease that a person wrote:
// the operator must follow it with a version of its own that undoes it.
func (c *Checker) notePersonEdit(e Entry, lv *lockView, l *coordinationv1.Lease) {
	c.stats.PersonLeaseEdits++
	lv.personHolder, lv.personToken = e.identity, e.token
	lv.personEdited = true
	if lv.repair == nil {
		lv.repair = &repairDue{e: e, what: "edited", since: c.realNow()}
	}
	lv.lease = l.DeepCopy()
}

// notePersonDelete records that a person deleted the grant Lease. While
// the lock has live claims the operator must write it again; the line
// memory it rebuilds comes from the claims that remain.
func (c *Checker) notePersonDelete(e Entry, lv *lockView) {
	c.stats.PersonLeaseDeletes++
	lv.personDeleted = true
	lv.forgetBefore = c.o.Now().Add(c.o.Tolerance)
	if lv.repair == nil && c.liveClaims(e.Lock) > 0 {
		lv.repair = &repairDue{e: e, what: "deleted", since: c.realNow()}
	}
}

// noteRepaired: an operator version followed a person's edit or deletion.
func (c *Checker) noteRepaired(lv *lockView) {
	if lv.repair == nil {
		return
	}
	c.stats.Repairs++
	c.stats.LongestRepair = max(c.stats.LongestRepair, c.realNow().Sub(lv.repair.since))
	lv.repair = nil
}

// noteRestore records an operator version that names the latest grant's
// holder again, with its token: not a new grant, so no token rule binds
// it, but the claim it names must not have ended before it.
func (c *Checker) noteRestore(e Entry, lv *lockView, l *coordinationv1.Lease, holder string) {
	c.stats.Restores++
	if _, uid, ok := strings.Cut(holder, "/"); ok {
		lv.restores = append(lv.restores, restore{e: e, uid: types.UID(uid), rv: parseRV(l.ResourceVersion)})
	}
}

// noteFollowed records an operator version that grants what a person's
// edit named (holder, with the token of the latest grant): not a new grant
// with a new token, so it is judged at the end of the run (CheckRestores):
// the claim granted that token before must have ended or gone by then.
func (c *Checker) noteFollowed(e Entry, lv *lockView, l *coordinationv1.Lease, holder string, token int64) {
	c.stats.FollowedEdits++
	if token != lv.lastGrantToken {
		c.noteGrant(e, lv, l, holder, token) // a raised token: judged as any grant
		return
	}
	_, before, _ := strings.Cut(lv.lastGrantHolder, "/")
	lv.follows = append(lv.follows, follow{e: e, holder: types.UID(before), rv: parseRV(l.ResourceVersion)})
	recordGrant(lv, l, holder, token)
}

// followsEdit reports whether claim cv holds with token by an operator
// version that granted what a person's edit named (judged by
// CheckRestores).
func followsEdit(lv *lockView, cv *claimView, token int64) bool {
	for _, f := range lv.follows {
		if f.e.identity == holderIdentity(cv.name, cv.uid) && f.e.token == token {
			return true
		}
	}
	return false
}

// liveClaims counts the claims of lock k that exist and have not ended.
// Call with c.mu held.
func (c *Checker) liveClaims(k LockKey) int {
	n := 0
	for _, cv := range c.claims {
		if cv.lock == k && !cv.deleted && !isTerminal(phaseOf(cv.status.Phase)) {
			n++
		}
	}
	return n
}

// checkRepairsDue: a person's edit or deletion of a grant Lease whose lock
// still has live claims is undone by the operator within the hold slack
// (real time), plus the time within in which no manager could act: it
// notices at once, from its watch of the Leases.
func (c *Checker) checkRepairsDue(realNow time.Time) {
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		r := lv.repair
		if r == nil {
			continue
		}
		_, allowed, due := c.overdue(&r.since, realNow)
		if !due {
			continue
		}
		lv.repair = nil
		if c.liveClaims(k) == 0 {
			continue // nothing left to restore it from
		}
		e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: k, Name: LeasePrefix + k.Target, What: "repair deadline"})
		c.violate(e, "grant-record-repaired", "the grant Lease %s%s, %s by a person (event #%d), was not written again by the operator within %s (the slack %s, plus %s in which no manager could act)",
			LeasePrefix, k.Target, r.what, r.e.Seq, realNow.Sub(r.since).Round(time.Millisecond), c.o.HoldSlack, allowed.Round(time.Millisecond))
	}
}

// CheckRestores is run once the watches have caught up: a grant the
// operator wrote again (after a deletion of the Lease, or an edit of its
// holder) names a claim that had not ended or gone before, in etcd's order.
// A manager whose cache still shows an ended holder must not bring its
// grant back.
func (c *Checker) CheckRestores() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		for _, r := range lv.restores {
			cv := c.claims[r.uid]
			switch {
			case cv == nil:
			case cv.deleted && cv.deletedRV != 0 && cv.deletedRV < r.rv:
				c.violate(r.e, "grant-record-repaired", "the grant Lease named %s again (rv %d), which had been deleted (rv %d): its grant came back after it ended",
					cv.name, r.rv, cv.deletedRV)
			case cv.endRV != 0 && cv.endRV < r.rv:
				c.violate(r.e, "grant-record-repaired", "the grant Lease named %s again (rv %d), which had ended %s (rv %d): its grant came back after it ended",
					cv.name, r.rv, phaseOf(cv.status.Phase), cv.endRV)
			}
		}
		lv.restores = nil
		for _, f := range lv.follows {
			cv := c.claims[f.holder]
			switch {
			case cv == nil:
			case cv.deleted && cv.deletedRV != 0 && cv.deletedRV < f.rv, cv.endRV != 0 && cv.endRV < f.rv:
			default:
				c.violate(f.e, "fencing-token-increases", "the grant Lease gave %s's token to %q (rv %d), as a person's edit named it, while %s still held: the edit must be undone",
					cv.name, f.e.identity, f.rv, cv.name)
			}
		}
		lv.follows = nil
	}
}

// checkWriter: an operator version that names a holder admits into an
// enforced target only the writes of that holder's pod (its own, by UID,
// else its requester's), or of no pod when it has neither. A writer
// annotation a person changed or added must not survive the operator's
// next write.
func (c *Checker) checkWriter(e Entry, l *coordinationv1.Lease, holder string) {
	writer := l.Annotations[WriterPodAnnotation]
	_, uid, ok := strings.Cut(holder, "/")
	if writer == "" || !ok {
		return
	}
	cv := c.claims[types.UID(uid)]
	if cv == nil {
		return
	}
	var pod string // the holder's writer pod, as the operator derives it
	switch r := cv.spec.Requester; {
	case cv.spec.PodRef != nil:
		pod = cv.spec.PodRef.UID
	case r != nil:
		pod = r.PodUID
	}
	if pod == writer || cv.spec.PodRef != nil && pod == "" {
		return // a pod by name only: its UID is not known here
	}
	if pod == "" {
		c.violate(e, "grant-record", "the grant Lease names %s, which has no pod, but admits the writes of pod %s", cv.name, writer)
		return
	}
	c.violate(e, "grant-record", "the grant Lease names %s, whose pod is %s, but admits the writes of pod %s", cv.name, pod, writer)
}

// checkMemoryKept: a line record that an operator version of the grant
// Lease holds stays in every later operator version (with that build or a
// higher one) until it is older than the grant retention: no record leaves
// to make room, however many lines others hold, unless a granted rollback
// of the line lowered it. A deletion of the Lease starts afresh.
func (c *Checker) checkMemoryKept(e Entry, lv *lockView, records map[line]heldBuild) {
	now := c.o.Now()
	for l, kept := range lv.kept {
		// heldAt is a manager's clock: the record may age out one skew
		// early, and another skew for this checker's clock.
		if !now.Before(kept.at.Add(c.o.Retention - 2*c.o.Tolerance)) {
			delete(lv.kept, l)
			continue
		}
		c.stats.MemoryChecked++
		r, ok := records[l]
		if ok && r.build < kept.build && c.rolledBack(lv, e.Lock.Namespace, l, r.build, kept.at) {
			lv.kept[l] = r
			continue
		}
		if !ok || r.build < kept.build {
			c.violate(e, "line-memory-kept", "the grant Lease forgot that build %d of %s held (at %s, within the retention %s): a line's memory leaves only with age",
				kept.build, l, kept.at.Format(time.StampMilli), c.o.Retention)
			delete(lv.kept, l)
		}
	}
	for l, r := range records {
		if k, ok := lv.kept[l]; !ok || r.build > k.build || (r.build == k.build && r.at.After(k.at)) {
			lv.kept[l] = r
		}
	}
}

// forgotten reports whether build b, granted before a person deleted lock
// lv's Lease, may have left the memory the operator rebuilt: its claim is
// gone.
func (c *Checker) forgotten(lv *lockView, k LockKey, b heldBuild) bool {
	if lv.forgetBefore.IsZero() || !b.at.Before(lv.forgetBefore) {
		return false
	}
	cv := c.claims[c.names[k.Namespace+"/"+b.name]]
	return cv == nil || cv.deleted
}

// checkDeletingEnds: a claim being deleted (a finalizer keeps it) has
// ended: it must be terminal within the hold slack (real time) of the
// checker seeing its deletionTimestamp.
func (c *Checker) checkDeletingEnds(realNow time.Time) {
	for _, cv := range c.claims {
		if !cv.deleting || cv.deleted || isTerminal(phaseOf(cv.status.Phase)) {
			continue
		}
		over, allowed, due := c.overdue(&cv.deletingSince, realNow)
		if !due {
			c.stats.LongestDeleting = max(c.stats.LongestDeleting, over)
			continue
		}
		e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: cv.lock, Name: cv.name, UID: cv.uid, What: "deletion deadline"})
		c.violate(e, "deleted-claim-ends", "%s is still %s %s after it was deleted (a finalizer keeps it; slack %s, plus %s in which no manager could act): a claim being deleted has ended",
			cv.name, phaseOf(cv.status.Phase), over.Round(time.Millisecond), c.o.HoldSlack, allowed.Round(time.Millisecond))
		cv.deletingSince = realNow.Add(24 * time.Hour) // report once
	}
}

// ownedByBuildlock reports whether a Lease is the operator's: it carries
// the managed-by label, or any label or annotation of buildlock's.
func ownedByBuildlock(l *coordinationv1.Lease) bool {
	if l.Labels[ManagedByLabel] == ManagedByValue {
		return true
	}
	for _, m := range []map[string]string{l.Labels, l.Annotations} {
		for k := range m {
			if strings.HasPrefix(k, "buildlock.io/") {
				return true
			}
		}
	}
	return false
}

// observeForeign judges the events of a Lease a person created under lock
// k's grant Lease name as somebody else's, and reports whether l was one.
// Nobody but that person changes or deletes it, and the operator never
// takes it over (writes its own grant into it).
func (c *Checker) observeForeign(typ watch.EventType, lv *lockView, k LockKey, l *coordinationv1.Lease) bool {
	f := lv.foreign
	mine := f != nil && f.uid == l.UID
	if !mine && (ownedByBuildlock(l) || !c.ledger.ForeignLeaseCreated(l.Namespace, l.Name)) {
		return false
	}
	e := c.record(Entry{At: c.o.Now(), Kind: "Lease", Type: typ, Lock: k, Name: l.Name, UID: l.UID, RV: l.ResourceVersion, What: "somebody else's Lease"})
	switch {
	case !mine:
		c.stats.ForeignLeases++
		lv.foreign = &foreignLease{uid: l.UID, first: l.DeepCopy(), createdRV: parseRV(l.ResourceVersion)}
	case typ == watch.Deleted:
		f.deletedRV = parseRV(l.ResourceVersion)
		if !c.ledger.PersonDeletedLease(l.UID) {
			c.violate(e, "foreign-lease-kept", "%s, a Lease somebody else created, was deleted by nobody who owns it", l.Name)
		}
	case !equality.Semantic.DeepEqual(f.first.Spec, l.Spec) || !equality.Semantic.DeepEqual(f.first.Labels, l.Labels) ||
		!equality.Semantic.DeepEqual(f.first.Annotations, l.Annotations):
		c.violate(e, "foreign-lease-kept", "%s, a Lease somebody else created, was changed (holder %q, token %v, labels %v): the operator must never take it over",
			l.Name, valueOf(l.Spec.HolderIdentity), valueOf(l.Spec.LeaseTransitions), l.Labels)
	}
	return true
}

// valueOf is *p, or nil.
func valueOf[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// CheckForeignLeases is run once the watches have caught up: no claim of a
// lock entered Held while a Lease of somebody else's had its grant Lease's
// name, in etcd's order.
func (c *Checker) CheckForeignLeases() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		f := lv.foreign
		if f == nil {
			continue
		}
		for _, h := range lv.foreignHolds {
			if h.rv > f.createdRV && (f.deletedRV == 0 || h.rv < f.deletedRV) {
				until := "still there"
				if f.deletedRV != 0 {
					until = fmt.Sprintf("deleted at rv %d", f.deletedRV)
				}
				c.violate(h.e, "foreign-lease-kept", "%s entered Held (rv %d) while %s%s was somebody else's Lease (created at rv %d, %s)",
					h.name, h.rv, LeasePrefix, k.Target, f.createdRV, until)
			}
		}
		lv.foreignHolds = nil
	}
}

// ObserveNamespace judges one event of a namespace: its consent to a lock
// (the label buildlockv1.LockedByLabel) changes only when a person changes
// it. A pipeline's change, which admission must refuse, never shows.
func (c *Checker) ObserveNamespace(typ watch.EventType, ns *corev1.Namespace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observeNamespace(typ, ns, false)
}

func (c *Checker) observeNamespace(typ watch.EventType, ns *corev1.Namespace, initial bool) {
	if typ == watch.Deleted {
		delete(c.namespaces, ns.Name)
		return
	}
	value := ns.Labels[buildlockv1.LockedByLabel]
	prev, seen := c.namespaces[ns.Name]
	c.namespaces[ns.Name] = &namespaceView{consent: value}
	switch {
	case initial:
		return
	case seen && prev.consent == value:
		return
	case !seen && value == "":
		return
	}
	c.stats.ConsentChanges++
	e := c.record(Entry{At: c.o.Now(), Kind: "Namespace", Type: typ, Lock: LockKey{Namespace: ns.Name}, Name: ns.Name, UID: ns.UID, RV: ns.ResourceVersion,
		What: fmt.Sprintf("%s=%q", buildlockv1.LockedByLabel, value)})
	if c.ledger.ConsentSet(ns.Name, value) {
		return
	}
	by := "nobody asked for it"
	if c.ledger.PipelineTriedConsent(ns.Name, value) {
		by = "a pipeline asked for it, and admission should have refused it"
	}
	c.violate(e, "consent-by-people", "namespace %s's consent label %s changed to %q (%s): consent is given and withdrawn by people only",
		ns.Name, buildlockv1.LockedByLabel, value, by)
}

// RelistNamespaces reconciles the checker's view of the namespaces with a
// list taken after the watch failed: each change is judged as if watched.
func (c *Checker) RelistNamespaces(items []corev1.Namespace, rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.beginRelist("Namespace", len(items), rv)
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	for i := range items {
		c.observeNamespace(Relisted, &items[i], false)
	}
}

// ObserveInitialNamespaces takes the namespaces of the initial list as
// they are: consent given before the run is the baseline.
func (c *Checker) ObserveInitialNamespaces(items []corev1.Namespace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range items {
		c.observeNamespace(watch.Added, &items[i], true)
	}
}
