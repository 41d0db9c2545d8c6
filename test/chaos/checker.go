package chaos

// This file is the independent checker. It imports the API types and the
// Kubernetes libraries only, never internal/...: it restates the operator's
// contract (the API's phase documentation and issue 4's grant record) in its
// own words. TestCheckerIsIndependent keeps it that way.

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// LeasePrefix starts the name of every grant Lease: the grant record of
// target t is the Lease "buildlock-<t>" in the claims' namespace; its holderIdentity is "<name>/<uid>" of the holding
// BuildLock and its leaseTransitions is the fencing token.
const LeasePrefix = "buildlock-"

// defaultExpiresAfter is the API's default for spec.expiresAfter.
const defaultExpiresAfter = time.Hour

// LockKey names one lock: the claims' namespace and their spec.target.
type LockKey struct{ Namespace, Target string }

func (k LockKey) String() string { return k.Namespace + "/" + k.Target }

// ---------------------------------------------------------------------------
// Ledger

// Ledger is what the workload did, written down before each call so that the
// checker can tell the workload's changes from anybody else's.
type Ledger struct {
	mu      sync.Mutex
	specs   map[string]map[string]bool // ns/name → canonical specs written
	deletes map[string]bool            // ns/name of claims the workload deleted
	pods    map[string]*PodRecord      // ns/name of pods the workload created
}

// PodRecord is what the workload did to one pod.
type PodRecord struct {
	UID types.UID
	// Finished: the workload set the pod's phase to Succeeded or Failed.
	Finished bool
	// Deleted: the workload deleted the pod.
	Deleted bool
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{specs: map[string]map[string]bool{}, deletes: map[string]bool{}, pods: map[string]*PodRecord{}}
}

// WroteSpec records that the workload creates or updates claim ns/name with
// spec.
func (l *Ledger) WroteSpec(ns, name string, spec buildlockv1.BuildLockSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := ns + "/" + name
	if l.specs[key] == nil {
		l.specs[key] = map[string]bool{}
	}
	l.specs[key][SpecKey(spec)] = true
}

// SpecWritten reports whether the workload ever wrote spec for ns/name.
func (l *Ledger) SpecWritten(ns, name string, spec buildlockv1.BuildLockSpec) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.specs[ns+"/"+name][SpecKey(spec)]
}

// RequestDelete records that the workload (the claim's owner) deletes ns/name.
func (l *Ledger) RequestDelete(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deletes[ns+"/"+name] = true
}

// DeleteRequested reports whether the workload deleted ns/name.
func (l *Ledger) DeleteRequested(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deletes[ns+"/"+name]
}

// PodCreated records a pod the workload created.
func (l *Ledger) PodCreated(ns, name string, uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods[ns+"/"+name] = &PodRecord{UID: uid}
}

// PodFinishing records that the workload sets the pod's phase to Succeeded or
// Failed; finished=false takes it back when the write failed.
func (l *Ledger) PodFinishing(ns, name string, finished bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[ns+"/"+name]; p != nil {
		p.Finished = finished
	}
}

// PodDeleting records that the workload deletes the pod.
func (l *Ledger) PodDeleting(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[ns+"/"+name]; p != nil {
		p.Deleted = true
	}
}

// PodGone reports whether the pod a claim references is gone as far as the
// workload knows: never created, deleted, or another UID than the reference.
func (l *Ledger) PodGone(ns string, ref *buildlockv1.PodReference) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[ns+"/"+ref.Name]
	return p == nil || p.Deleted || (ref.UID != "" && types.UID(ref.UID) != p.UID)
}

// PodFinished reports whether the workload finished the referenced pod.
func (l *Ledger) PodFinished(ns string, ref *buildlockv1.PodReference) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[ns+"/"+ref.Name]
	return p != nil && p.Finished && (ref.UID == "" || types.UID(ref.UID) == p.UID)
}

// SpecKey renders a spec canonically, with the API's defaults applied and
// times at the API's microsecond precision, so that what the workload wrote
// and what the API server returns compare equal.
func SpecKey(s buildlockv1.BuildLockSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "target=%s repo=%s branch=%s build=%d", s.Target, s.Repo, s.Branch, s.Build)
	if s.PodRef != nil {
		fmt.Fprintf(&b, " pod=%s/%s", s.PodRef.Name, s.PodRef.UID)
	}
	if s.Timestamp != nil {
		fmt.Fprintf(&b, " timestamp=%d", s.Timestamp.UnixMicro())
	}
	fmt.Fprintf(&b, " expiresAfter=%s", expiresAfter(s))
	if s.RenewTime != nil {
		fmt.Fprintf(&b, " renewTime=%d", s.RenewTime.UnixMicro())
	}
	return b.String()
}

func expiresAfter(s buildlockv1.BuildLockSpec) time.Duration {
	if s.ExpiresAfter == nil {
		return defaultExpiresAfter
	}
	return s.ExpiresAfter.Duration
}

// ---------------------------------------------------------------------------
// History

// Entry is one event the checker judged.
type Entry struct {
	Seq  int
	At   time.Time // the workload's clock when the checker saw it
	Kind string    // BuildLock or Lease
	Type watch.EventType
	Lock LockKey
	Name string
	UID  types.UID
	RV   string
	What string
	// For the cross-kind analysis: a claim's phase, token and identity
	// (name/uid), or a Lease's holder identity and token.
	phase    buildlockv1.Phase
	token    int64
	identity string
}

func (e Entry) String() string {
	return fmt.Sprintf("#%-6d %s %-9s %-8s %-22s %-28s rv=%-7s %s", e.Seq, e.At.Format("15:04:05.000"), e.Kind, e.Type, e.Lock, e.Name, e.RV, e.What)
}

// Violation is a broken rule, found at history entry Seq.
type Violation struct {
	Seq  int
	Lock LockKey
	Rule string
	Msg  string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] %s: %s (event #%d)", v.Rule, v.Lock, v.Msg, v.Seq)
}

// CheckerStats count what the checker saw.
type CheckerStats struct {
	ClaimEvents, LeaseEvents int
	// Grants counts Lease writes that name a new holder.
	Grants int
	// HeldTransitions counts claims entering Held.
	HeldTransitions int
	// Phases counts transitions into each phase, by phase/reason.
	Phases map[string]int
	// OwnerDeletes and TTLDeletes count deletions by the workload and by the
	// operator's finished TTL.
	OwnerDeletes, TTLDeletes int
	MaxToken                 int64
}

// ---------------------------------------------------------------------------
// Checker

// Checker judges every BuildLock and grant-Lease event, in the API server's
// order per kind, against the safety rules. See the package documentation and
// docs/reliability.md for the rules.
type Checker struct {
	ledger *Ledger
	// ttl is the operator's finished TTL (zero: it never deletes).
	ttl time.Duration
	// tolerance is how far a manager's clock may run ahead of the workload's.
	tolerance time.Duration
	now       func() time.Time

	mu         sync.Mutex
	claims     map[types.UID]*claimView
	names      map[string]types.UID // ns/name → latest UID
	locks      map[LockKey]*lockView
	history    []Entry
	violations []Violation
	stats      CheckerStats
}

type claimView struct {
	lock    LockKey
	name    string
	uid     types.UID
	created time.Time
	spec    buildlockv1.BuildLockSpec
	status  buildlockv1.BuildLockStatus
	deleted bool
	// heldTokens are the tokens with which the claim was shown Held.
	heldTokens []int64
	heldAt     time.Time
	// expiredBeforeRenewal: a renewal arrived after the pod-less hold had
	// already expired under the spec of the time. An expiry decided before
	// the renewal stands, even if its status is written after it.
	expiredBeforeRenewal bool
}

type lockView struct {
	held          map[types.UID]bool // claims whose latest status is Held
	lastHeldToken int64
	lastHeldName  string
	// The grant Lease as last seen.
	leaseSeen     bool
	leaseHolder   string
	leaseToken    int64
	leaseMaxToken int64
	// grants: every (holderIdentity, token) the Lease named, with its
	// acquireTime.
	grants map[string]time.Time
}

// NewChecker returns a checker that consults ledger for the workload's own
// changes, allows finished-TTL deletions after ttl, and tolerates managers'
// clocks up to tolerance ahead of now (the workload's clock).
func NewChecker(ledger *Ledger, ttl, tolerance time.Duration, now func() time.Time) *Checker {
	return &Checker{
		ledger: ledger, ttl: ttl, tolerance: tolerance, now: now,
		claims: map[types.UID]*claimView{}, names: map[string]types.UID{}, locks: map[LockKey]*lockView{},
		stats: CheckerStats{Phases: map[string]int{}},
	}
}

func (c *Checker) lock(k LockKey) *lockView {
	lv := c.locks[k]
	if lv == nil {
		lv = &lockView{held: map[types.UID]bool{}, grants: map[string]time.Time{}}
		c.locks[k] = lv
	}
	return lv
}

func (c *Checker) record(e Entry) Entry {
	e.Seq = len(c.history)
	c.history = append(c.history, e)
	return e
}

func (c *Checker) violate(e Entry, rule, format string, args ...any) {
	c.violations = append(c.violations, Violation{Seq: e.Seq, Lock: e.Lock, Rule: rule, Msg: fmt.Sprintf(format, args...)})
}

func phaseOf(p buildlockv1.Phase) buildlockv1.Phase {
	if p == "" {
		return buildlockv1.PhasePending
	}
	return p
}

// legalNext is the API's phase contract (api/v1alpha1.Phase* comments):
// Pending can become anything; Waiting → Held, Superseded or Released; Held →
// Released or Expired; the rest are terminal.
var legalNext = map[buildlockv1.Phase][]buildlockv1.Phase{
	buildlockv1.PhasePending: {buildlockv1.PhaseWaiting, buildlockv1.PhaseHeld, buildlockv1.PhaseSuperseded, buildlockv1.PhaseReleased, buildlockv1.PhaseExpired},
	buildlockv1.PhaseWaiting: {buildlockv1.PhaseHeld, buildlockv1.PhaseSuperseded, buildlockv1.PhaseReleased},
	buildlockv1.PhaseHeld:    {buildlockv1.PhaseReleased, buildlockv1.PhaseExpired},
}

func legal(from, to buildlockv1.Phase) bool {
	if from == to {
		return true
	}
	for _, p := range legalNext[from] {
		if p == to {
			return true
		}
	}
	return false
}

func isTerminal(p buildlockv1.Phase) bool {
	return p == buildlockv1.PhaseSuperseded || p == buildlockv1.PhaseReleased || p == buildlockv1.PhaseExpired
}

func describeClaim(bl *buildlockv1.BuildLock) string {
	s := bl.Status
	var b strings.Builder
	fmt.Fprintf(&b, "%s", phaseOf(s.Phase))
	if s.Reason != "" {
		fmt.Fprintf(&b, "/%s", s.Reason)
	}
	if s.FencingToken != 0 {
		fmt.Fprintf(&b, " token=%d", s.FencingToken)
	}
	if s.Holder != "" {
		fmt.Fprintf(&b, " holder=%s", s.Holder)
	}
	if s.Waiting != "" {
		fmt.Fprintf(&b, " waiting=%s", s.Waiting)
	}
	if s.SupersededBy != "" {
		fmt.Fprintf(&b, " by=%s", s.SupersededBy)
	}
	fmt.Fprintf(&b, " | %s@%s#%d", bl.Spec.Repo, bl.Spec.Branch, bl.Spec.Build)
	if bl.Spec.PodRef != nil {
		fmt.Fprintf(&b, " pod=%s", bl.Spec.PodRef.Name)
	} else {
		fmt.Fprintf(&b, " podless/%s", expiresAfter(bl.Spec))
	}
	if bl.Spec.RenewTime != nil {
		fmt.Fprintf(&b, " renew=%s", bl.Spec.RenewTime.Format("15:04:05.000"))
	}
	return b.String()
}

// orderTime is when a build started, for ranking builds of different lines:
// spec.timestamp, else the creation time (the API's documented fallback).
func (v *claimView) orderTime() time.Time {
	if v.spec.Timestamp != nil {
		return v.spec.Timestamp.Time
	}
	return v.created
}

// atLeastAsNew reports whether claim a may supersede claim b: a build of the
// same line (repo and branch) with a build number at least b's, or a build of
// another line that started no earlier than b.
func atLeastAsNew(a, b *claimView) bool {
	if a.spec.Repo == b.spec.Repo && a.spec.Branch == b.spec.Branch {
		return a.spec.Build >= b.spec.Build
	}
	return !a.orderTime().Before(b.orderTime())
}

// ObserveClaim judges one BuildLock watch event.
func (c *Checker) ObserveClaim(typ watch.EventType, bl *buildlockv1.BuildLock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	lock := LockKey{bl.Namespace, bl.Spec.Target}
	e := c.record(Entry{At: now, Kind: "BuildLock", Type: typ, Lock: lock, Name: bl.Name, UID: bl.UID, RV: bl.ResourceVersion, What: describeClaim(bl),
		phase: phaseOf(bl.Status.Phase), token: bl.Status.FencingToken, identity: holderIdentity(bl.Name, bl.UID)})
	c.stats.ClaimEvents++
	lv := c.lock(lock)

	prev := c.claims[bl.UID]
	cv := &claimView{lock: lock, name: bl.Name, uid: bl.UID, created: bl.CreationTimestamp.Time}
	if prev != nil {
		cv.heldTokens, cv.heldAt, cv.expiredBeforeRenewal = prev.heldTokens, prev.heldAt, prev.expiredBeforeRenewal
		if renewed(prev.spec, bl.Spec) {
			if expiry, ok := c.holdExpiry(lv, prev); ok && !now.Add(c.tolerance).Before(expiry) {
				cv.expiredBeforeRenewal = true
			}
		}
	}
	cv.spec, cv.status = *bl.Spec.DeepCopy(), *bl.Status.DeepCopy()
	c.claims[bl.UID] = cv
	c.names[bl.Namespace+"/"+bl.Name] = bl.UID

	// Spec: only the workload writes it.
	if !c.ledger.SpecWritten(bl.Namespace, bl.Name, bl.Spec) {
		c.violate(e, "spec-by-owner-only", "%s has a spec the workload never wrote: %s", bl.Name, SpecKey(bl.Spec))
	}

	from := buildlockv1.PhasePending
	if prev != nil {
		from = phaseOf(prev.status.Phase)
	}
	to := phaseOf(bl.Status.Phase)

	if typ == watch.Deleted {
		cv.deleted = true
		delete(lv.held, bl.UID)
		c.checkDeletion(e, bl, now)
		return
	}

	// Terminal is terminal: not a field of the status changes again.
	if isTerminal(from) {
		if !equality.Semantic.DeepEqual(prev.status, bl.Status) {
			c.violate(e, "terminal-is-terminal", "%s was %s and its status changed (now %s, reason %q)", bl.Name, from, to, bl.Status.Reason)
		}
	} else if !legal(from, to) {
		c.violate(e, "legal-transition", "%s went %s → %s, which the API's phase contract does not allow", bl.Name, from, to)
	}

	c.checkHeld(e, lv, cv, prev, from, to)
	if from != to {
		c.stats.Phases[string(to)+"/"+bl.Status.Reason]++
		switch to {
		case buildlockv1.PhaseSuperseded:
			c.checkSuperseded(e, cv)
		case buildlockv1.PhaseExpired:
			c.checkExpired(e, lv, cv, now)
		case buildlockv1.PhaseReleased:
			c.checkReleased(e, lv, cv, from, now)
		}
	}
}

// checkHeld keeps the set of claims shown Held: at most one per lock, and
// each new holder's fencing token above the previous holder's.
func (c *Checker) checkHeld(e Entry, lv *lockView, cv, prev *claimView, from, to buildlockv1.Phase) {
	token := cv.status.FencingToken
	switch {
	case to == buildlockv1.PhaseHeld && from != buildlockv1.PhaseHeld:
		if token <= lv.lastHeldToken {
			c.violate(e, "fencing-token-increases", "%s holds with fencing token %d, not above the previous holder %s's %d", cv.name, token, lv.lastHeldName, lv.lastHeldToken)
		}
		lv.lastHeldToken, lv.lastHeldName = max(lv.lastHeldToken, token), cv.name
		cv.heldTokens = append(cv.heldTokens, token)
		cv.heldAt = e.At
		c.stats.HeldTransitions++
		c.stats.MaxToken = max(c.stats.MaxToken, token)
	case to == buildlockv1.PhaseHeld && token != prev.status.FencingToken:
		c.violate(e, "fencing-token-increases", "%s kept holding but its fencing token changed %d → %d", cv.name, prev.status.FencingToken, token)
	}
	if to == buildlockv1.PhaseHeld {
		lv.held[cv.uid] = true
	} else {
		delete(lv.held, cv.uid)
	}
	if len(lv.held) > 1 {
		var names []string
		for uid := range lv.held {
			h := c.claims[uid]
			names = append(names, fmt.Sprintf("%s (token %d)", h.name, h.status.FencingToken))
		}
		sort.Strings(names)
		c.violate(e, "one-holder", "%d claims are Held at once: %s", len(names), strings.Join(names, ", "))
	}
}

// checkSuperseded: a claim is only ever superseded by a claim of its lock
// that is at least as new.
func (c *Checker) checkSuperseded(e Entry, cv *claimView) {
	by := c.claims[c.names[cv.lock.Namespace+"/"+cv.status.SupersededBy]]
	switch {
	case by == nil:
		c.violate(e, "superseded-by-newer", "%s was superseded by %q, a claim never seen", cv.name, cv.status.SupersededBy)
	case by.lock != cv.lock:
		c.violate(e, "superseded-by-newer", "%s was superseded by %s, a claim of another lock (%s)", cv.name, by.name, by.lock)
	case !atLeastAsNew(by, cv):
		c.violate(e, "superseded-by-newer", "%s (%s@%s#%d, started %s) was superseded by the older %s (%s@%s#%d, started %s)",
			cv.name, cv.spec.Repo, cv.spec.Branch, cv.spec.Build, cv.orderTime().Format(time.StampMicro),
			by.name, by.spec.Repo, by.spec.Branch, by.spec.Build, by.orderTime().Format(time.StampMicro))
	}
}

// checkExpired: only a pod-less hold expires (this run sets no --max-hold),
// and not before max(acquiredAt, renewTime) + expiresAfter, give or take the
// managers' clock skew.
func (c *Checker) checkExpired(e Entry, lv *lockView, cv *claimView, now time.Time) {
	if cv.spec.PodRef != nil {
		c.violate(e, "expiry", "%s has a pod but Expired (reason %q); no max hold is set", cv.name, cv.status.Reason)
		return
	}
	c.checkExpiryPassed(e, "expiry", lv, cv, now)
}

// checkExpiryPassed: a pod-less hold may end no earlier than max(acquiredAt,
// renewTime) + expiresAfter, give or take the managers' clock skew, where
// renewTime is the one in effect then: a renewal that arrives after the hold
// expired does not revive it.
func (c *Checker) checkExpiryPassed(e Entry, rule string, lv *lockView, cv *claimView, now time.Time) {
	expiry, granted := c.holdExpiry(lv, cv)
	if !granted {
		c.violate(e, rule, "%s %s but was never granted", cv.name, phaseOf(cv.status.Phase))
		return
	}
	if !cv.expiredBeforeRenewal && now.Add(c.tolerance).Before(expiry) {
		c.violate(e, rule, "%s %s (%s) at %s, %s before its expiry %s (tolerance %s)", cv.name, phaseOf(cv.status.Phase), cv.status.Reason,
			now.Format(time.StampMilli), expiry.Sub(now).Round(time.Millisecond), expiry.Format(time.StampMilli), c.tolerance)
	}
}

// holdExpiry is when claim cv's pod-less hold expires under its current
// spec; granted is false if the claim was never granted.
func (c *Checker) holdExpiry(lv *lockView, cv *claimView) (expiry time.Time, granted bool) {
	var acquired time.Time
	if cv.status.AcquiredAt != nil {
		acquired = cv.status.AcquiredAt.Time
	} else if at, ok := lv.grants[holderIdentity(cv.name, cv.uid)]; ok {
		acquired = at
	} else {
		return time.Time{}, false
	}
	from := acquired
	if cv.spec.RenewTime != nil && cv.spec.RenewTime.After(from) {
		from = cv.spec.RenewTime.Time
	}
	return from.Add(expiresAfter(cv.spec)), true
}

// renewed reports whether spec.renewTime moved between a and b.
func renewed(a, b buildlockv1.BuildLockSpec) bool {
	switch {
	case b.RenewTime == nil:
		return false
	case a.RenewTime == nil:
		return true
	}
	return !a.RenewTime.Equal(b.RenewTime.Time)
}

// checkReleased: a claim is released because its pod finished or is gone
// (which the workload must have done), or because it lost a hold the grant
// no longer names. No pre-emption: this run never force-releases, so a lost
// hold must have ended anyway, its pod finished or gone, or its pod-less
// hold expired (the grant moved on and the end was not written in time).
func (c *Checker) checkReleased(e Entry, lv *lockView, cv *claimView, from buildlockv1.Phase, now time.Time) {
	ref := cv.spec.PodRef
	switch cv.status.Reason {
	case buildlockv1.ReasonPodFinished:
		if ref == nil || !c.ledger.PodFinished(cv.lock.Namespace, ref) {
			c.violate(e, "released-for-a-reason", "%s Released as PodFinished but the workload never finished its pod", cv.name)
		}
	case buildlockv1.ReasonPodGone:
		if ref == nil || !c.ledger.PodGone(cv.lock.Namespace, ref) {
			c.violate(e, "released-for-a-reason", "%s Released as PodGone but its pod exists (unknown is not dead)", cv.name)
		}
	case buildlockv1.ReasonLockLost:
		switch {
		case from != buildlockv1.PhaseHeld:
			c.violate(e, "released-for-a-reason", "%s Released as LockLost from %s; only a holder can lose the lock", cv.name, from)
		case ref == nil:
			c.checkExpiryPassed(e, "no-preemption", lv, cv, now)
		case !c.ledger.PodFinished(cv.lock.Namespace, ref) && !c.ledger.PodGone(cv.lock.Namespace, ref):
			c.violate(e, "no-preemption", "%s lost the lock (LockLost) while its pod runs", cv.name)
		}
	default:
		c.violate(e, "released-for-a-reason", "%s Released with unknown reason %q", cv.name, cv.status.Reason)
	}
}

// checkDeletion: only the owner (the workload) deletes a claim, or the
// operator once a terminal claim's finishedAt + TTL has passed.
func (c *Checker) checkDeletion(e Entry, bl *buildlockv1.BuildLock, now time.Time) {
	if c.ledger.DeleteRequested(bl.Namespace, bl.Name) {
		c.stats.OwnerDeletes++
		return
	}
	st := bl.Status
	if c.ttl > 0 && isTerminal(st.Phase) && st.FinishedAt != nil && !now.Add(c.tolerance).Before(st.FinishedAt.Add(c.ttl)) {
		c.stats.TTLDeletes++
		return
	}
	c.violate(e, "no-lost-claims", "%s (%s) was deleted by neither its owner nor the finished TTL (%s)", bl.Name, phaseOf(st.Phase), c.ttl)
}

func holderIdentity(name string, uid types.UID) string { return name + "/" + string(uid) }

// ObserveLease judges one event of a grant Lease (callers pass Leases of the
// workload's namespaces; others are ignored by name).
func (c *Checker) ObserveLease(typ watch.EventType, l *coordinationv1.Lease) {
	if !strings.HasPrefix(l.Name, LeasePrefix) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lock := LockKey{l.Namespace, strings.TrimPrefix(l.Name, LeasePrefix)}
	holder, token := "", int64(0)
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		token = int64(*l.Spec.LeaseTransitions)
	}
	e := c.record(Entry{At: c.now(), Kind: "Lease", Type: typ, Lock: lock, Name: l.Name, UID: l.UID, RV: l.ResourceVersion,
		What: fmt.Sprintf("holder=%q token=%d", holder, token), token: token, identity: holder})
	c.stats.LeaseEvents++
	lv := c.lock(lock)
	if typ == watch.Deleted {
		c.violate(e, "grant-record-kept", "the grant Lease %s was deleted: fencing tokens could repeat", l.Name)
		return
	}
	switch {
	case holder != "" && (!lv.leaseSeen || holder != lv.leaseHolder):
		if token <= lv.leaseMaxToken {
			c.violate(e, "fencing-token-increases", "the Lease was granted to %s with token %d, not above the highest so far, %d", holder, token, lv.leaseMaxToken)
		}
		var acquired time.Time
		if l.Spec.AcquireTime != nil {
			acquired = l.Spec.AcquireTime.Time
		}
		lv.grants[holderIdentityToken(holder, token)] = acquired
		lv.grants[holder] = acquired
		c.stats.Grants++
	case holder != "" && token != lv.leaseToken:
		c.violate(e, "fencing-token-increases", "the Lease kept holder %s but its token changed %d → %d", holder, lv.leaseToken, token)
	case holder == "" && token < lv.leaseMaxToken:
		c.violate(e, "fencing-token-increases", "the freed Lease lowered its token floor %d → %d", lv.leaseMaxToken, token)
	}
	lv.leaseSeen, lv.leaseHolder, lv.leaseToken = true, holder, token
	lv.leaseMaxToken = max(lv.leaseMaxToken, token)
	c.stats.MaxToken = max(c.stats.MaxToken, token)
}

func holderIdentityToken(identity string, token int64) string {
	return fmt.Sprintf("%s#%d", identity, token)
}

// CheckGrantsCoverHolds is run once the watches have caught up: every claim
// ever shown Held with token t was named by its lock's Lease with token t
// (the grant is written before the status).
func (c *Checker) CheckGrantsCoverHolds() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cv := range c.claims {
		lv := c.locks[cv.lock]
		for _, t := range cv.heldTokens {
			if _, ok := lv.grants[holderIdentityToken(holderIdentity(cv.name, cv.uid), t)]; !ok {
				e := c.record(Entry{At: c.now(), Kind: "Check", Lock: cv.lock, Name: cv.name, UID: cv.uid, What: "end of run"})
				c.violate(e, "grant-before-hold", "%s was shown Held with token %d, but the Lease never named it with that token", cv.name, t)
			}
		}
	}
}

// HoldsBehindTheGrant replays the history in etcd's order (resourceVersions
// of one etcd are one sequence across kinds, as in envtest) and returns the
// claims that entered Held while their lock's Lease named another holder or
// token. This is not a violation of the promise: statuses follow the grant,
// and a write racing a hand-off can show a claim Held for a moment after the
// grant moved on, as long as no second claim is shown Held (which the
// one-holder rule checks). It is a figure to watch.
func (c *Checker) HoldsBehindTheGrant() (n int, examples []string) {
	c.mu.Lock()
	entries := append([]Entry(nil), c.history...)
	c.mu.Unlock()
	rv := func(e Entry) uint64 { v, _ := strconv.ParseUint(e.RV, 10, 64); return v }
	sort.SliceStable(entries, func(i, j int) bool { return rv(entries[i]) < rv(entries[j]) })
	type grant struct {
		identity string
		token    int64
	}
	leases := map[LockKey]grant{}
	phases := map[types.UID]buildlockv1.Phase{}
	for _, e := range entries {
		switch e.Kind {
		case "Lease":
			leases[e.Lock] = grant{e.identity, e.token}
		case "BuildLock":
			prev := phases[e.UID]
			phases[e.UID] = e.phase
			if e.Type == watch.Deleted || e.phase != buildlockv1.PhaseHeld || prev == buildlockv1.PhaseHeld {
				continue
			}
			if g := leases[e.Lock]; g.identity != e.identity || g.token != e.token {
				n++
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("%s: %s Held with token %d at rv %s while the Lease named %q with token %d",
						e.Lock, e.Name, e.token, e.RV, g.identity, g.token))
				}
			}
		}
	}
	return n, examples
}

// Violations returns the violations found so far.
func (c *Checker) Violations() []Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Violation(nil), c.violations...)
}

// Stats returns a copy of the counts.
func (c *Checker) Stats() CheckerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Phases = map[string]int{}
	for k, v := range c.stats.Phases {
		s.Phases[k] = v
	}
	return s
}

// Claim returns the latest view of claim ns/name: its phase, when it entered
// Held (zero if never), and whether it exists.
func (c *Checker) Claim(ns, name string) (phase buildlockv1.Phase, heldAt time.Time, exists bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cv := c.claims[c.names[ns+"/"+name]]
	if cv == nil {
		return "", time.Time{}, false
	}
	return phaseOf(cv.status.Phase), cv.heldAt, !cv.deleted
}

// Holders returns, per lock, the claims whose latest status is Held.
func (c *Checker) Holders() map[LockKey][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[LockKey][]string{}
	for k, lv := range c.locks {
		for uid := range lv.held {
			out[k] = append(out[k], c.claims[uid].name)
		}
	}
	return out
}

// History returns every entry judged so far.
func (c *Checker) History() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Entry(nil), c.history...)
}

// Around returns the events of v's lock up to `before` entries before v and
// `after` entries after it, so that a report shows how the lock got there.
func (c *Checker) Around(v Violation, before, after int) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var prior, later []Entry
	for i := v.Seq; i >= 0 && len(prior) <= before; i-- {
		if c.history[i].Lock == v.Lock {
			prior = append(prior, c.history[i])
		}
	}
	for i := v.Seq + 1; i < len(c.history) && len(later) < after; i++ {
		if c.history[i].Lock == v.Lock {
			later = append(later, c.history[i])
		}
	}
	out := make([]Entry, 0, len(prior)+len(later))
	for i := len(prior) - 1; i >= 0; i-- {
		out = append(out, prior[i])
	}
	return append(out, later...)
}

// ---------------------------------------------------------------------------
// Liveness

// SettleProblems says why one lock is not settled, or nothing when it is. It
// is a pure function of the lock's claims, its grant Lease (nil if none), the
// pods of its namespace by name, and now (the workload's clock). A lock is
// settled when:
//
//   - no claim is Pending (every claim was decided);
//   - every Held or Waiting claim is alive: its pod exists (with the UID of
//     the reference, if it names one) and has not Succeeded or Failed; a
//     pod-less claim is alive unless it holds beyond max(acquiredAt,
//     renewTime) + expiresAfter (a dead build must neither keep nor wait for
//     the lock);
//   - at most one claim is Held and the Lease names exactly that claim with
//     its fencing token; when none is Held the Lease names nobody;
//   - at most one claim is Waiting, and only behind a holder.
//
// So the eligible claims (alive and not terminal) are exactly the holder and
// at most one waiter. With the checker's rule that a claim is superseded only
// by one at least as new, and a hand-off to the waiter (TestChaos drains
// every lock), this is "the newest eligible claim gets the lock, or it is
// free when none is eligible". No pre-emption: a live holder keeps the lock
// even when a newer build waits.
func SettleProblems(claims []buildlockv1.BuildLock, lease *coordinationv1.Lease, pods map[string]*corev1.Pod, now time.Time) []string {
	var problems []string
	var held, waiting []*buildlockv1.BuildLock
	for i := range claims {
		bl := &claims[i]
		switch phaseOf(bl.Status.Phase) {
		case buildlockv1.PhasePending:
			problems = append(problems, fmt.Sprintf("%s is still Pending", bl.Name))
			continue
		case buildlockv1.PhaseHeld:
			held = append(held, bl)
		case buildlockv1.PhaseWaiting:
			waiting = append(waiting, bl)
		default:
			continue
		}
		if why := notAlive(bl, pods, now); why != "" {
			problems = append(problems, fmt.Sprintf("%s is %s but %s", bl.Name, phaseOf(bl.Status.Phase), why))
		}
	}
	leaseHolder, leaseToken := "", int64(0)
	if lease != nil && lease.Spec.HolderIdentity != nil {
		leaseHolder = *lease.Spec.HolderIdentity
	}
	if lease != nil && lease.Spec.LeaseTransitions != nil {
		leaseToken = int64(*lease.Spec.LeaseTransitions)
	}
	switch len(held) {
	case 0:
		if leaseHolder != "" {
			problems = append(problems, fmt.Sprintf("no claim is Held but the Lease names %s", leaseHolder))
		}
	case 1:
		h := held[0]
		if id := holderIdentity(h.Name, h.UID); leaseHolder != id || leaseToken != h.Status.FencingToken {
			problems = append(problems, fmt.Sprintf("%s is Held with token %d but the Lease names %q with token %d", h.Name, h.Status.FencingToken, leaseHolder, leaseToken))
		}
	default:
		problems = append(problems, fmt.Sprintf("%d claims are Held", len(held)))
	}
	if len(waiting) > 1 {
		problems = append(problems, fmt.Sprintf("%d claims are Waiting", len(waiting)))
	}
	if len(waiting) > 0 && len(held) == 0 {
		problems = append(problems, fmt.Sprintf("%s is Waiting behind no holder", waiting[0].Name))
	}
	return problems
}

// notAlive says why a Held or Waiting claim's build is over, or "".
func notAlive(bl *buildlockv1.BuildLock, pods map[string]*corev1.Pod, now time.Time) string {
	if ref := bl.Spec.PodRef; ref != nil {
		pod := pods[ref.Name]
		switch {
		case pod == nil:
			return "its pod is gone"
		case ref.UID != "" && types.UID(ref.UID) != pod.UID:
			return "its pod was replaced"
		case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
			return fmt.Sprintf("its pod %s", pod.Status.Phase)
		}
		return ""
	}
	if phaseOf(bl.Status.Phase) != buildlockv1.PhaseHeld || bl.Status.AcquiredAt == nil {
		return ""
	}
	from := bl.Status.AcquiredAt.Time
	if bl.Spec.RenewTime != nil && bl.Spec.RenewTime.After(from) {
		from = bl.Spec.RenewTime.Time
	}
	if expiry := from.Add(expiresAfter(bl.Spec)); !now.Before(expiry) {
		return fmt.Sprintf("its hold expired at %s", expiry.Format(time.StampMilli))
	}
	return ""
}
