package chaos

// This file and the other non-test files of this package are the independent
// checker. They import the API types and the Kubernetes libraries only, never
// internal/...: they restate the operator's contract (the API's documentation
// of phases, orderings, renewals and the grant record) in their own words.
// TestCheckerIsIndependent keeps it that way.

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// LeasePrefix starts the name of every grant Lease: the grant record of
// target t is the Lease "buildlock-<t>" in the claims' namespace; its
// holderIdentity is "<name>/<uid>" of the holding BuildLock and its
// leaseTransitions is the fencing token.
const LeasePrefix = "buildlock-"

// TokenFloorLease is the Lease, one per namespace, whose leaseTransitions is
// the highest fencing token of the grant Leases the operator deleted there
// (the Leases of targets nobody claimed for the grant retention). Its name
// has a dot, so that no target's grant Lease can have it.
const TokenFloorLease = "buildlock.token-floor"

// LinesAnnotation is the grant Lease's line memory: per line, the highest
// build that held the lock and when (JSON), from which the operator
// supersedes a lower build even when no claim of that build remains.
const LinesAnnotation = "buildlock.io/lines"

// WriterPodAnnotation and WriterUserAnnotation, on the grant Lease of an
// enforced lock, say whose writes into the target admission lets through
// while the holder holds: its pod (by UID), or a pod-less holder's
// requester.
const (
	WriterPodAnnotation  = "buildlock.io/writer-pod-uid"
	WriterUserAnnotation = "buildlock.io/writer-username"
	// WriterRunAnnotation pins a pod-less holder's writes to its CI run,
	// when its requester had one.
	WriterRunAnnotation = "buildlock.io/writer-run"
)

// ManagedByLabel, with value ManagedByValue, marks the Leases the operator
// writes. A Lease named like a grant Lease that carries neither it nor any
// other buildlock.io/ label or annotation is somebody else's, which the
// operator never takes over.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "buildlock"
)

// maxStatusText bounds the checker's view of a status message: a message
// quotes free text (a force-release reason of up to 40,000 characters) only
// in part, so a message longer than this means free text was copied in
// whole. It is an eighth of the API server's 32 KiB bound on a condition
// message, which a copied text would break (and with it the status write).
const maxStatusText = 4096

// LockKey names one lock: the claims' namespace and their spec.target.
type LockKey struct{ Namespace, Target string }

func (k LockKey) String() string { return k.Namespace + "/" + k.Target }

// line is a repository, branch and workflow (spec.workflow, "" for none),
// whose builds replace each other.
type line struct{ repo, branch, workflow string }

func lineOf(s buildlockv1.BuildLockSpec) line { return line{s.Repo, s.Branch, s.Workflow} }

func (l line) String() string {
	if l.workflow == "" {
		return l.repo + "@" + l.branch
	}
	return l.repo + "@" + l.branch + "/" + l.workflow
}

func expiresAfter(s buildlockv1.BuildLockSpec) time.Duration {
	if s.ExpiresAfter == nil {
		return buildlockv1.DefaultExpiresAfter
	}
	return s.ExpiresAfter.Duration
}

// ---------------------------------------------------------------------------
// History

// Entry is one event the checker judged.
type Entry struct {
	Seq  int
	At   time.Time // the workload's clock when the checker saw it
	Kind string    // BuildLock, Lease, Policy, Check or Run (what the run did: outages.go)
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

// Relisted marks an entry that a re-list inferred: the object changed (or
// went) while the checker's watch was down.
const Relisted watch.EventType = "RELISTED"

func (e Entry) String() string {
	return fmt.Sprintf("#%-6d %s %-9s %-9s %-22s %-28s rv=%-7s %s", e.Seq, e.At.Format("15:04:05.000"), e.Kind, e.Type, e.Lock, e.Name, e.RV, e.What)
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
	ClaimEvents, LeaseEvents, PolicyEvents int
	// Grants counts Lease writes that name a new holder.
	Grants int
	// HeldTransitions counts claims entering Held.
	HeldTransitions int
	// Phases counts transitions into each phase, by phase/reason.
	Phases map[string]int
	// OwnerDeletes and TTLDeletes count deletions by the workload and by the
	// operator's finished TTL; LeaseDeletes the idle grant Leases deleted.
	OwnerDeletes, TTLDeletes, LeaseDeletes int
	MaxToken                               int64
	// Relists counts the re-lists after a watch failed (by kind);
	// RelistChanged and RelistGone the objects found changed or gone, and
	// GapDeletes the deletions the checker could not see but the time it
	// was blind explains.
	Relists                                        map[string]int
	RelistChanged, RelistGone, GapDeletes, GapHold int
	// GapLeaseDeletes counts grant Leases a re-list found gone whose last
	// version seen named a holder that had ended before the list (a
	// version the checker missed freed them).
	GapLeaseDeletes int
	// GapSupersessions counts supersessions by claims the checker never
	// saw (created and gone while it was blind), judged by their specs.
	GapSupersessions int
	// MemorySupersessions counts supersessions by the grant record's line
	// memory that only a version of the Lease explains (the checker did not
	// see the hold that it remembers).
	MemorySupersessions int
	// Reruns counts grants of another run of a build of its line that
	// held; Rollbacks, grants of rollbacks below their line's memory or at it.
	Reruns, Rollbacks int
	// UnseenHolds counts claims a re-list showed ended with a fencing
	// token, that held while the checker's watch was down.
	UnseenHolds int
	// Renewals counts renewals seen; FarRenewals those stamped more than a
	// minute ahead of the workload's clock.
	Renewals, FarRenewals int
	// LockLostExpired counts holds that ended LockLost although their hold
	// had expired (the expiry the grant record should have kept).
	LockLostExpired int
	// LockLostFrozen counts holds that ended LockLost while a freeze that
	// releases its holder had started.
	LockLostFrozen int
	// QueueGrants counts grants judged by the queue-order rule, and
	// FairnessTracked the lines whose fairness bound was followed.
	QueueGrants, FairnessTracked int
	// OrderingChanges counts policy changes of ordering seen mid-run.
	OrderingChanges int
	// LinePlacesTaken counts waiting claims that moved up to the place of
	// an older build of their line (Queue, after two managers decided at
	// once).
	LinePlacesTaken int
	// LongestOverrun is the longest a hold was seen going on past its end
	// (in real time), within the slack allowed.
	LongestOverrun time.Duration
	// LongestExcused is the longest a reaction (a hold's end, a repair, a
	// deleted claim's end) went past the hold slack within the outage
	// allowance, and LongestAllowance the longest allowance that excused
	// one: the time in which no manager could act.
	LongestExcused, LongestAllowance time.Duration
	// PersonLeaseEdits and PersonLeaseDeletes count the grant Lease
	// versions people wrote and the grant Leases they deleted; Repairs the
	// operator versions that followed them, LongestRepair the longest that
	// took (real time); Restores the grants the operator wrote again to
	// their holder (after a deletion, or an edit of the holder).
	PersonLeaseEdits, PersonLeaseDeletes, Repairs, Restores int
	LongestRepair                                           time.Duration
	// FollowedEdits counts the operator versions that granted what a
	// person's edit named, with the token of the grant before it (a
	// residual, once the holder of that token has ended: bug 8 of
	// docs/reliability.md).
	FollowedEdits int
	// Regrants counts the operator versions that granted the holder again,
	// with a later token, after a person's edit of the Lease.
	Regrants int
	// TokensRestarted counts grants whose token was not above the lock's
	// highest because people had deleted both its Lease and the
	// namespace's floor (the residual of docs/api.md).
	TokensRestarted int
	// FloorDeletes counts token floors people deleted.
	FloorDeletes int
	// DeletingEnded counts claims that ended while being deleted (a
	// finalizer kept them); LongestDeleting the longest one was seen being
	// deleted and not ended (real time).
	DeletingEnded   int
	LongestDeleting time.Duration
	// ForeignLeases counts the Leases people created under a grant Lease's
	// name; ConsentChanges the changes of namespaces' consent labels seen.
	ForeignLeases, ConsentChanges int
	// MemoryChecked counts the line records that later versions of their
	// Lease had to keep.
	MemoryChecked int
}

// ---------------------------------------------------------------------------
// Checker

// CheckerOptions are what the checker knows of how the operator runs.
type CheckerOptions struct {
	// TTL is the operator's finished TTL (zero: it never deletes claims).
	TTL time.Duration
	// Tolerance is how far a manager's clock may be from the workload's,
	// plus the rounding of stored times.
	Tolerance time.Duration
	// Retention is the operator's grant retention: how long a lock remembers
	// which builds of each line held it, and after how long without a write
	// an unclaimed lock's Lease may be deleted.
	Retention time.Duration
	// MaxHold is the operator's --max-hold, for locks whose policy sets no
	// spec.maxHold (zero: none).
	MaxHold time.Duration
	// PolicyLag is how long after a policy changes a manager may still
	// decide under the old one (its cache lags, it is frozen or
	// partitioned): rules that depend on the ordering judge only what is
	// decided when every ordering in effect within PolicyLag agrees.
	PolicyLag time.Duration
	// HoldSlack is how long (in real time) a hold may be seen going on past
	// its end before that is a violation: the operator's reaction time
	// through faults, partitions and control-plane restarts.
	HoldSlack time.Duration
	// Now is the workload's clock.
	Now func() time.Time
	// RealNow is the real clock, against which the slack for the operator's
	// reactions is measured (nil: time.Now).
	RealNow func() time.Time
	// OnLease, when set, is told of every grant Lease event the checker
	// judges (with the checker's lock held), re-lists included.
	OnLease func(typ watch.EventType, l *coordinationv1.Lease)
	// RequesterVerified says whether the operator takes the spec.requester
	// of a claim created at created as the API server's word, and whether
	// that is certain (near the instant it starts to, either may be
	// true). Nil: every requester is verified.
	RequesterVerified func(created time.Time) (verified, certain bool)
}

// Checker judges every BuildLock, grant-Lease and BuildLockPolicy event, in
// the API server's order per kind, against the safety rules. See the
// package documentation and docs/reliability.md for the rules.
type Checker struct {
	ledger *Ledger
	o      CheckerOptions

	mu     sync.Mutex
	claims map[types.UID]*claimView
	names  map[string]types.UID // ns/name → latest UID
	locks  map[LockKey]*lockView
	floors map[string]int64 // namespace → the highest token floor seen
	// floorDeletes counts, per namespace, the token floors people deleted.
	floorDeletes map[string]int
	namespaces   map[string]*namespaceView
	history      []Entry
	violations   []Violation
	stats        CheckerStats
	// relisting suppresses the per-event one-holder check while a re-list is
	// applied: the list is one consistent state, its items are not; and
	// defers the checks that need another item of the list.
	relisting bool
	deferred  []func()
	// listed is, during a re-list of the claims, the list by UID: what a
	// check of one item must know of another that comes later.
	listed map[types.UID]*buildlockv1.BuildLock
	// windows follows the deploy windows and the overrides (windows.go).
	windows windowState
	// op follows when the operator could act (outages.go).
	op operatorState
}

type claimView struct {
	lock    LockKey
	name    string
	uid     types.UID
	created time.Time
	spec    buildlockv1.BuildLockSpec
	status  buildlockv1.BuildLockStatus
	rv      string
	deleted bool
	// deletedRV is the resourceVersion of its deletion (zero: not seen
	// deleted, or found gone by a re-list).
	deletedRV uint64
	// addedRV is the resourceVersion the claim was first seen with: no
	// decision written to the Lease before it can have known the claim.
	addedRV uint64
	// placedRV is the resourceVersion of the first status that gave the
	// claim a place in its lock's queue (status.queuedAt): it joined the
	// queue there, and a grant written before it cannot have passed it over.
	placedRV uint64
	// lastSeen is when the checker last had news of the claim.
	lastSeen time.Time
	// heldTokens are the tokens with which the claim was shown Held.
	heldTokens []int64
	heldAt     time.Time
	// renewLow and renewHigh bound the instant the operator may count the
	// latest renewal from: min(renewTime, when it was sent) and
	// min(renewTime, when the checker saw it). A renewal stamped in the
	// future counts from when it arrived, never from its stamp.
	renewLow, renewHigh time.Time
	// expiredBeforeRenewal: a renewal arrived after the pod-less hold had
	// already expired under the spec of the time. An expiry decided before
	// the renewal stands, even if its status is written after it.
	expiredBeforeRenewal bool
	// overrunSince is the real time at which the checker first saw the hold
	// going on past its end (zero while it has not).
	overrunSince time.Time
	// deleting: the claim was seen with a deletionTimestamp (a finalizer
	// keeps it); deletingSince is the real time at which the checker first
	// saw it being deleted and not ended.
	deleting      bool
	deletingSince time.Time
	// endRV is the resourceVersion of the first terminal status seen.
	endRV uint64
	// requester is who created the claim (spec.requester's user name, as
	// the API server stamped it; "" when not stamped).
	requester string
	// ciRequester: the requester is a CI identity (spec.requester.repository).
	ciRequester bool
}

type lockView struct {
	held          map[types.UID]bool // claims whose latest status is Held
	lastHeldToken int64
	lastHeldName  string
	// The grant Lease as last seen.
	leaseSeen     bool
	leaseDeleted  bool
	lease         *coordinationv1.Lease
	leaseHolder   string
	leaseToken    int64
	leaseMaxToken int64
	// grants: every (holderIdentity, token) the Lease named, with its
	// acquireTime, and the resourceVersion of the Lease that did.
	grants   map[string]time.Time
	grantRVs map[string]uint64
	// gapTokens are tokens issued while the checker's Lease watch was down:
	// holds with them were granted unseen.
	gapTokens [][2]int64
	// eras is the lock's policy over time, the first era from the start.
	eras []policyEra
	// lines are the builds of each line that held, with their grant time.
	lines map[line][]heldBuild
	// memory is what the Lease's line memory (LinesAnnotation) said held,
	// per line, in any version of the Lease seen: the operator supersedes
	// from it, and it may know of a hold the checker never saw (granted
	// and ended while the claim watch was behind, or of a claim not yet
	// seen when its grant was).
	memory map[line][]heldBuild
	// deletions are Lease deletions seen while claims of the lock were
	// live as far as the checker knew.
	deletions []leaseDeletion
	// memoryPending are supersessions by the line memory that nothing seen
	// so far explains; the Lease that does may arrive later than the
	// claim's status (two watches), so they are judged at the end of the
	// run.
	memoryPending []memorySupersession
	// fair follows the queue's fairness bound per line (ordering Queue).
	fair map[line]*fairLine
	// unsureUntil: after a re-list the checker may have missed holds; the
	// rules that depend on the queue's history wait until then.
	unsureUntil time.Time
	// lastGrantHolder and lastGrantToken are the latest grant the operator
	// wrote: a version that names them again after the Lease was deleted,
	// or after the holder was written away, restores that grant (restores
	// are judged at the end of the run, in etcd's order).
	lastGrantHolder string
	lastGrantToken  int64
	restores        []restore
	// personHolder and personToken are what the latest version a person
	// wrote named; follows the operator versions that granted just that.
	personHolder string
	personToken  int64
	follows      []follow
	// personEdited: a person wrote the Lease since the operator's last
	// version; personDeleted: a person deleted it since then.
	personEdited, personDeleted bool
	// floorDeletesSeen is the namespace's floorDeletes at the operator's
	// last version of the Lease.
	floorDeletesSeen int
	// repair is a person's edit or deletion of the grant Lease that no
	// operator version has followed yet.
	repair *repairDue
	// kept is, per line, the highest build an operator version of the
	// Lease remembered, which later versions must remember until it ages
	// out; forgetBefore is when a person last deleted the Lease: the
	// operator then rebuilds the memory from the claims that remain, so a
	// build granted before whose claim is gone no longer counts.
	kept         map[line]heldBuild
	forgetBefore time.Time
	// foreign is a Lease a person created under the grant Lease's name;
	// foreignHolds the claims that entered Held while the checker knew of
	// it (judged in etcd's order at the end of the run).
	foreign      *foreignLease
	foreignHolds []foreignHold
}

// NewChecker returns a checker that consults ledger for the workload's own
// changes.
func NewChecker(ledger *Ledger, o CheckerOptions) *Checker {
	return &Checker{
		ledger: ledger, o: o,
		claims: map[types.UID]*claimView{}, names: map[string]types.UID{}, locks: map[LockKey]*lockView{}, floors: map[string]int64{}, floorDeletes: map[string]int{},
		namespaces: map[string]*namespaceView{},
		stats:      CheckerStats{Phases: map[string]int{}, Relists: map[string]int{}},
		op:         newOperatorState(),
	}
}

func (c *Checker) lock(k LockKey) *lockView {
	lv := c.locks[k]
	if lv == nil {
		lv = &lockView{held: map[types.UID]bool{}, grants: map[string]time.Time{}, grantRVs: map[string]uint64{}, lines: map[line][]heldBuild{}, memory: map[line][]heldBuild{}, fair: map[line]*fairLine{},
			kept: map[line]heldBuild{},
			eras: []policyEra{{ordering: buildlockv1.OrderingNewestWins, maxHold: c.o.MaxHold}}}
		c.locks[k] = lv
	}
	return lv
}

// realNow is the real clock.
func (c *Checker) realNow() time.Time {
	if c.o.RealNow != nil {
		return c.o.RealNow()
	}
	return time.Now()
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
// Pending can become anything; Waiting → Held, Superseded, Released or
// Expired (a claim granted whose Held status was never written, when the
// hold ran out); Held → Released or Expired; the rest are terminal.
var legalNext = map[buildlockv1.Phase][]buildlockv1.Phase{
	buildlockv1.PhasePending: {buildlockv1.PhaseWaiting, buildlockv1.PhaseHeld, buildlockv1.PhaseSuperseded, buildlockv1.PhaseReleased, buildlockv1.PhaseExpired},
	buildlockv1.PhaseWaiting: {buildlockv1.PhaseHeld, buildlockv1.PhaseSuperseded, buildlockv1.PhaseReleased, buildlockv1.PhaseExpired},
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
	if s.QueuedAt != nil {
		fmt.Fprintf(&b, " queued=%s", s.QueuedAt.Format("15:04:05.000000"))
	}
	fmt.Fprintf(&b, " | %s@%q#%d", bl.Spec.Repo, bl.Spec.Branch, bl.Spec.Build)
	if bl.Spec.PodRef != nil {
		fmt.Fprintf(&b, " pod=%s", bl.Spec.PodRef.Name)
	} else {
		fmt.Fprintf(&b, " podless/%s", expiresAfter(bl.Spec))
	}
	if bl.Spec.RenewTime != nil {
		fmt.Fprintf(&b, " renew=%s", bl.Spec.RenewTime.Format("2006-01-02T15:04:05.000"))
	}
	if s.RenewedAt != nil {
		fmt.Fprintf(&b, " renewed=%s", s.RenewedAt.Format("15:04:05.000"))
	}
	if bl.DeletionTimestamp != nil {
		fmt.Fprintf(&b, " deleting")
	}
	if _, forced := bl.Annotations[buildlockv1.ForceReleaseAnnotation]; forced {
		fmt.Fprintf(&b, " force-released(%d chars)", utf8.RuneCountInString(bl.Annotations[buildlockv1.ForceReleaseAnnotation]))
	}
	return b.String()
}

// orderTime is when a build started, for ranking builds of different lines
// (NewestWins): spec.timestamp, else the creation time (the API's
// documented fallback), never later than the creation time plus
// MaxTimestampSkew (a stamp in the future ranks as if a little later).
func (v *claimView) orderTime() time.Time {
	if v.spec.Timestamp == nil {
		return v.created
	}
	if latest := v.created.Add(buildlockv1.MaxTimestampSkew); v.spec.Timestamp.After(latest) {
		return latest
	}
	return v.spec.Timestamp.Time
}

// newClaimView is the checker's view of version bl of a claim, carrying
// on what it followed of the claim's earlier versions (prev; nil for the
// first seen).
func newClaimView(lock LockKey, bl *buildlockv1.BuildLock, prev *claimView, now time.Time) *claimView {
	cv := &claimView{lock: lock, name: bl.Name, uid: bl.UID, created: bl.CreationTimestamp.Time, rv: bl.ResourceVersion, lastSeen: now}
	cv.addedRV = parseRV(bl.ResourceVersion)
	if prev != nil {
		cv.addedRV, cv.placedRV = prev.addedRV, prev.placedRV
		cv.heldTokens, cv.heldAt, cv.expiredBeforeRenewal = prev.heldTokens, prev.heldAt, prev.expiredBeforeRenewal
		cv.renewLow, cv.renewHigh, cv.overrunSince = prev.renewLow, prev.renewHigh, prev.overrunSince
		cv.deletingSince, cv.endRV = prev.deletingSince, prev.endRV
	}
	cv.deleting = bl.DeletionTimestamp != nil
	if r := bl.Spec.Requester; r != nil {
		cv.requester, cv.ciRequester = r.Username, r.Repository != ""
	}
	if cv.endRV == 0 && isTerminal(phaseOf(bl.Status.Phase)) {
		cv.endRV = parseRV(bl.ResourceVersion)
	}
	cv.spec, cv.status = *bl.Spec.DeepCopy(), *bl.Status.DeepCopy()
	cv.notePlace(bl)
	return cv
}

// notePlace records the resourceVersion at which the claim was first seen
// with a place in its lock's queue.
func (v *claimView) notePlace(bl *buildlockv1.BuildLock) {
	if v.placedRV == 0 && bl.Status.QueuedAt != nil {
		v.placedRV = parseRV(bl.ResourceVersion)
	}
}

// heldUnseen reports whether a claim a re-list found ended (from from to
// to) held while the watch was down, and records that hold: only a grant
// gives a claim a fencing token, so it is judged as a hold that ended. The
// end of the run checks that the Lease named it with that token (or that
// the token was issued while the Lease watch was down too).
func (c *Checker) heldUnseen(lv *lockView, cv *claimView, bl *buildlockv1.BuildLock, from, to buildlockv1.Phase) bool {
	if from == buildlockv1.PhaseHeld || (to != buildlockv1.PhaseReleased && to != buildlockv1.PhaseExpired) ||
		bl.Status.FencingToken <= 0 || slices.Contains(cv.heldTokens, bl.Status.FencingToken) {
		return false
	}
	cv.heldTokens = append(cv.heldTokens, bl.Status.FencingToken)
	lv.lastHeldToken = max(lv.lastHeldToken, bl.Status.FencingToken)
	if at := bl.Status.AcquiredAt; at != nil {
		c.rememberHeld(lv, cv, at.Time, int64(bl.Status.FencingToken))
	}
	c.stats.UnseenHolds++
	return true
}

// ObserveClaim judges one BuildLock watch event.
func (c *Checker) ObserveClaim(typ watch.EventType, bl *buildlockv1.BuildLock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observeClaim(typ, bl)
}

func (c *Checker) observeClaim(typ watch.EventType, bl *buildlockv1.BuildLock) {
	now := c.o.Now()
	lock := LockKey{bl.Namespace, bl.Spec.Target}
	e := c.record(Entry{At: now, Kind: "BuildLock", Type: typ, Lock: lock, Name: bl.Name, UID: bl.UID, RV: bl.ResourceVersion, What: describeClaim(bl),
		phase: phaseOf(bl.Status.Phase), token: bl.Status.FencingToken, identity: holderIdentity(bl.Name, bl.UID)})
	c.stats.ClaimEvents++
	lv := c.lock(lock)

	prev := c.claims[bl.UID]
	cv := newClaimView(lock, bl, prev, now)

	// Spec: only the workload writes it.
	sentAt, written := c.ledger.SpecWritten(bl.Namespace, bl.Name, bl.Spec)
	if !written {
		c.violate(e, "spec-by-owner-only", "%s has a spec the workload never wrote: %s", bl.Name, SpecKey(bl.Spec))
	}
	if prev == nil || renewed(prev.spec, bl.Spec) {
		c.noteRenewal(lv, cv, prev, sentAt, now)
	}
	c.claims[bl.UID] = cv
	c.names[bl.Namespace+"/"+bl.Name] = bl.UID
	c.noteClaimWindows(bl, now)

	from := buildlockv1.PhasePending
	if prev != nil {
		from = phaseOf(prev.status.Phase)
	}
	to := phaseOf(bl.Status.Phase)
	if typ == Relisted && c.heldUnseen(lv, cv, bl, from, to) {
		from = buildlockv1.PhaseHeld
	}

	if typ == watch.Deleted {
		cv.deleted = true
		cv.deletedRV = parseRV(bl.ResourceVersion)
		delete(lv.held, bl.UID)
		c.checkDeletion(e, bl, now, false)
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
	if prev == nil || !equality.Semantic.DeepEqual(prev.status, bl.Status) {
		c.checkStatusText(e, cv)
		c.checkRenewalRecorded(e, cv, now)
		c.checkPlaceKept(e, lv, cv, prev, now)
	}

	c.checkHeld(e, lv, cv, prev, from, to, now)
	if from != to {
		c.checkEnding(e, lv, cv, from, to, now)
	}
	if to == buildlockv1.PhaseWaiting {
		c.trackFairness(lv, cv, now)
	}
}

// checkEnding judges a claim's move from phase from to phase to: how it
// ended, when it did.
func (c *Checker) checkEnding(e Entry, lv *lockView, cv *claimView, from, to buildlockv1.Phase, now time.Time) {
	c.stats.Phases[string(to)+"/"+cv.status.Reason]++
	if cv.deleting && isTerminal(to) && !isTerminal(from) {
		c.stats.DeletingEnded++
	}
	switch to {
	case buildlockv1.PhaseSuperseded:
		c.checkSuperseded(e, lv, cv, now)
	case buildlockv1.PhaseExpired:
		c.checkExpired(e, lv, cv, now)
	case buildlockv1.PhaseReleased:
		c.checkReleased(e, lv, cv, from, now)
	}
}

// noteRenewal follows a claim's renewals: the instant the operator may
// count the latest from lies between min(renewTime, when the workload sent
// it) and min(renewTime, when the checker saw it). A renewal that comes
// after the hold already expired does not revive it.
func (c *Checker) noteRenewal(lv *lockView, cv, prev *claimView, sentAt, now time.Time) {
	rt := cv.spec.RenewTime
	if rt == nil {
		return
	}
	if prev != nil {
		c.stats.Renewals++
		if rt.After(now.Add(time.Minute)) {
			c.stats.FarRenewals++
		}
		if expiry, ok := c.earliestExpiry(lv, prev); ok && !now.Add(c.o.Tolerance).Before(expiry) {
			cv.expiredBeforeRenewal = true
		}
	}
	if sentAt.IsZero() || sentAt.After(now) {
		sentAt = now
	}
	cv.renewLow = laterOf(cv.renewLow, earlierOf(rt.Time, sentAt))
	cv.renewHigh = laterOf(cv.renewHigh, earlierOf(rt.Time, now))
}

func earlierOf(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
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

// checkStatusText: a status carries no free text in whole, and nothing
// that a terminal would interpret (control characters, bidirectional
// overrides), however long and hostile the force-release reason was.
func (c *Checker) checkStatusText(e Entry, cv *claimView) {
	texts := []string{cv.status.Message}
	for _, cond := range cv.status.Conditions {
		texts = append(texts, cond.Message)
	}
	for _, s := range texts {
		if len(s) > maxStatusText {
			c.violate(e, "text-bounded", "%s's status carries a message of %d bytes (bound %d)", cv.name, len(s), maxStatusText)
			return
		}
		if r, bad := unprintable(s); bad {
			c.violate(e, "text-bounded", "%s's status message carries the raw character %U", cv.name, r)
			return
		}
	}
}

// unprintable returns the first control character or bidirectional override
// in s.
func unprintable(s string) (rune, bool) {
	for _, r := range s {
		switch {
		case r < 0x20, r >= 0x7f && r <= 0x9f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == utf8.RuneError:
			return r, true
		}
	}
	return 0, false
}

// checkRenewalRecorded: the renewal the operator records (status.renewedAt)
// is never later than the client's renewTime, nor later than the moment it
// could have seen it: a renewal stamped in the future counts from when it
// arrived.
func (c *Checker) checkRenewalRecorded(e Entry, cv *claimView, now time.Time) {
	ra := cv.status.RenewedAt
	if ra == nil {
		return
	}
	switch rt := cv.spec.RenewTime; {
	case rt == nil:
		c.violate(e, "renewal-observed", "%s records a renewal at %s but was never renewed", cv.name, ra.Format(time.StampMicro))
	case ra.After(rt.Time):
		c.violate(e, "renewal-observed", "%s records its renewal at %s, after the renewTime %s it was stamped with", cv.name, ra.Format(time.StampMicro), rt.Format(time.RFC3339Nano))
	case ra.After(now.Add(c.o.Tolerance)):
		c.violate(e, "renewal-observed", "%s records its renewal at %s, later than the status write that records it (%s): the renewal counts from when the operator saw it, not from the client's clock",
			cv.name, ra.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	}
}

// checkHeld keeps the set of claims shown Held: at most one per lock, each
// new holder's fencing token above the previous holder's, no build granted
// at or below one of its line that held within the retention, the queue's
// order, and a hold's stated end within its bounds.
func (c *Checker) checkHeld(e Entry, lv *lockView, cv, prev *claimView, from, to buildlockv1.Phase, now time.Time) {
	token := cv.status.FencingToken
	switch {
	case to == buildlockv1.PhaseHeld && from != buildlockv1.PhaseHeld:
		if token <= lv.lastHeldToken && !followsEdit(lv, cv, token) {
			c.violate(e, "fencing-token-increases", "%s holds with fencing token %d, not above the previous holder %s's %d", cv.name, token, lv.lastHeldName, lv.lastHeldToken)
		}
		if cv.deleting {
			c.violate(e, "deleted-claim-ends", "%s entered Held while being deleted: a claim being deleted has ended", cv.name)
		}
		if lv.foreign != nil {
			lv.foreignHolds = append(lv.foreignHolds, foreignHold{e: e, name: cv.name, rv: parseRV(cv.rv)})
		}
		lv.lastHeldToken, lv.lastHeldName = max(lv.lastHeldToken, token), cv.name
		cv.heldTokens = append(cv.heldTokens, token)
		cv.heldAt = e.At
		c.stats.HeldTransitions++
		c.stats.MaxToken = max(c.stats.MaxToken, token)
		c.checkNoRollback(e, lv, cv)
		c.checkQueueOrder(e, lv, cv, prev, now)
		c.countHandOff(e, lv, cv, prev, now)
	case to == buildlockv1.PhaseHeld && token > lv.lastHeldToken && lv.granted(cv, token):
		// Granted again with a later token, after a person freed the
		// Lease (judgeTokens): a new hold of the same claim.
		lv.lastHeldToken = token
		cv.heldTokens = append(cv.heldTokens, token)
	case to == buildlockv1.PhaseHeld && token != prev.status.FencingToken:
		c.violate(e, "fencing-token-increases", "%s kept holding but its fencing token changed %d → %d", cv.name, prev.status.FencingToken, token)
	}
	if to == buildlockv1.PhaseHeld {
		lv.held[cv.uid] = true
		c.checkStatedEnd(e, lv, cv)
	} else {
		delete(lv.held, cv.uid)
	}
	if !c.relisting {
		c.checkOneHolder(e, lv)
	}
}

func (c *Checker) checkOneHolder(e Entry, lv *lockView) {
	if len(lv.held) <= 1 {
		return
	}
	var names []string
	for uid := range lv.held {
		h := c.claims[uid]
		names = append(names, fmt.Sprintf("%s (token %d)", h.name, h.status.FencingToken))
	}
	sort.Strings(names)
	c.violate(e, "one-holder", "%d claims are Held at once: %s", len(names), strings.Join(names, ", "))
}

// checkStatedEnd: the end a Held status states (expiresAt) is within the
// hold's bounds: for a pod-less hold, its grant or recorded renewal plus
// expiresAfter; for every hold, its grant plus the maximum hold when one is
// in effect.
func (c *Checker) checkStatedEnd(e Entry, lv *lockView, cv *claimView) {
	st := cv.status
	if st.AcquiredAt == nil {
		return
	}
	var bound time.Time
	if cv.spec.PodRef == nil {
		from := st.AcquiredAt.Time
		if st.RenewedAt != nil && st.RenewedAt.After(from) {
			from = st.RenewedAt.Time
		}
		bound = from.Add(expiresAfter(cv.spec))
	}
	if longest, bounded := c.maxHoldLongest(lv, st.AcquiredAt.Time); bounded {
		if end := st.AcquiredAt.Add(longest); bound.IsZero() || end.Before(bound) {
			bound = end
		}
	}
	switch {
	case bound.IsZero():
		return
	case st.ExpiresAt == nil:
		c.violate(e, "hold-bounded", "%s is Held with no stated end, but its hold ends at %s", cv.name, bound.Format(time.StampMicro))
	case st.ExpiresAt.After(bound.Add(time.Microsecond)):
		c.violate(e, "hold-bounded", "%s is Held until %s, %s past its bound %s", cv.name, st.ExpiresAt.Format(time.StampMicro),
			st.ExpiresAt.Sub(bound).Round(time.Millisecond), bound.Format(time.StampMicro))
	}
}

// checkExpired: a hold expires by time only, not before it may: with reason
// Expired, a pod-less hold at max(grant, renewal) + expiresAfter; with
// reason MaxHoldExceeded, any hold at its grant plus a maximum hold in
// effect; give or take the managers' clock skew.
func (c *Checker) checkExpired(e Entry, lv *lockView, cv *claimView, now time.Time) {
	switch cv.status.Reason {
	case buildlockv1.ReasonExpired:
		if cv.spec.PodRef != nil {
			c.violate(e, "expiry", "%s has a pod but Expired (reason Expired): only a pod-less hold expires un-renewed", cv.name)
			return
		}
		c.checkExpiryPassed(e, "expiry", lv, cv, now)
	case buildlockv1.ReasonMaxHoldExceeded:
		acquired, granted := c.acquiredAt(lv, cv)
		shortest, bounded := c.maxHoldShortest(lv, acquired)
		switch {
		case !granted:
			c.violate(e, "expiry", "%s exceeded its maximum hold but was never granted", cv.name)
		case !bounded:
			c.violate(e, "expiry", "%s Expired (MaxHoldExceeded) but no maximum hold was in effect", cv.name)
		case now.Add(c.o.Tolerance).Before(acquired.Add(shortest)):
			c.violate(e, "expiry", "%s exceeded its maximum hold of %s at %s, %s early", cv.name, shortest, now.Format(time.StampMilli),
				acquired.Add(shortest).Sub(now).Round(time.Millisecond))
		}
	default:
		c.violate(e, "expiry", "%s Expired with unknown reason %q", cv.name, cv.status.Reason)
	}
}

// checkExpiryPassed: a pod-less hold may end no earlier than max(acquiredAt,
// renewal) + expiresAfter, give or take the managers' clock skew, where the
// renewal is the one in effect then: a renewal that arrives after the hold
// expired does not revive it.
func (c *Checker) checkExpiryPassed(e Entry, rule string, lv *lockView, cv *claimView, now time.Time) {
	expiry, granted := c.earliestExpiry(lv, cv)
	if !granted {
		c.violate(e, rule, "%s %s but was never granted", cv.name, phaseOf(cv.status.Phase))
		return
	}
	// A grant's acquiredAt and the decision that ends the hold are judged on
	// the deciding manager's clock, so one skew counts. A renewal counts
	// from when a manager recorded it (status.renewedAt, its clock) and the
	// expiry is decided on another's: two skews, in opposite directions.
	tolerance := c.o.Tolerance
	if acquired, _ := c.acquiredAt(lv, cv); cv.renewLow.After(acquired) {
		tolerance = 2 * c.o.Tolerance
	}
	if !cv.expiredBeforeRenewal && now.Add(tolerance).Before(expiry) {
		c.violate(e, rule, "%s %s (%s) at %s, %s before its expiry %s (tolerance %s)", cv.name, phaseOf(cv.status.Phase), cv.status.Reason,
			now.Format(time.StampMilli), expiry.Sub(now).Round(time.Millisecond), expiry.Format(time.StampMilli), tolerance)
	}
}

// acquiredAt is when claim cv was granted: its status's acquiredAt, else the
// grant Lease's acquireTime for it.
func (c *Checker) acquiredAt(lv *lockView, cv *claimView) (time.Time, bool) {
	if cv.status.AcquiredAt != nil {
		return cv.status.AcquiredAt.Time, true
	}
	at, ok := lv.grants[holderIdentity(cv.name, cv.uid)]
	return at, ok
}

// earliestExpiry is the earliest instant at which claim cv's pod-less hold
// may expire: max(grant, renewal sent) + expiresAfter; granted is false if
// the claim was never granted.
func (c *Checker) earliestExpiry(lv *lockView, cv *claimView) (expiry time.Time, granted bool) {
	acquired, ok := c.acquiredAt(lv, cv)
	if !ok {
		return time.Time{}, false
	}
	return laterOf(acquired, cv.renewLow).Add(expiresAfter(cv.spec)), true
}

// latestEnd is the latest instant at which claim cv's hold must have ended
// by time alone (zero: it has no end in time): its pod-less expiry counted
// from the latest instant the renewal may count from, or its grant plus the
// longest maximum hold in effect.
func (c *Checker) latestEnd(lv *lockView, cv *claimView) time.Time {
	acquired, ok := c.acquiredAt(lv, cv)
	if !ok {
		return time.Time{}
	}
	var end time.Time
	if cv.spec.PodRef == nil {
		end = laterOf(acquired, cv.renewHigh).Add(expiresAfter(cv.spec))
	}
	if longest, bounded := c.maxHoldLongest(lv, acquired); bounded {
		if m := acquired.Add(longest); end.IsZero() || m.Before(end) {
			end = m
		}
	}
	return end
}

// checkReleased: a claim is released because its pod finished or is gone
// (which the workload must have done), because a person force-released it,
// or because it lost a hold the grant no longer names. No pre-emption: a
// lost hold must have ended anyway.
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
	case buildlockv1.ReasonForceReleased:
		if !c.ledger.ForceReleaseRequested(cv.lock.Namespace, cv.name) {
			c.violate(e, "released-for-a-reason", "%s Released as ForceReleased but nobody force-released it", cv.name)
		}
	case buildlockv1.ReasonLockLost:
		c.checkLockLost(e, lv, cv, from, now)
	case buildlockv1.ReasonFreezeStarted:
		c.checkFreezeStarted(e, lv, cv, now)
	case buildlockv1.ReasonDeleted:
		if !cv.deleting && !c.ledger.DeleteRequested(cv.lock.Namespace, cv.name) {
			c.violate(e, "released-for-a-reason", "%s Released as Deleted but nobody deleted it", cv.name)
		}
	default:
		c.violate(e, "released-for-a-reason", "%s Released with unknown reason %q", cv.name, cv.status.Reason)
	}
}

// checkLockLost: only a holder loses the lock, and only a hold that ended
// anyway: its pod finished or is gone, it was force-released, a freeze
// that releases its holder started, or it ran out of time.
func (c *Checker) checkLockLost(e Entry, lv *lockView, cv *claimView, from buildlockv1.Phase, now time.Time) {
	ref := cv.spec.PodRef
	ns := cv.lock.Namespace
	acquired, granted := c.acquiredAt(lv, cv)
	shortest, bounded := c.maxHoldShortest(lv, acquired)
	switch {
	case from != buildlockv1.PhaseHeld:
		c.violate(e, "released-for-a-reason", "%s Released as LockLost from %s; only a holder can lose the lock", cv.name, from)
	case c.ledger.ForceReleaseRequested(ns, cv.name):
	case granted && bounded && !now.Add(c.o.Tolerance).Before(acquired.Add(shortest)):
	case c.freezeReleased(lv, cv, now):
		// A manager that saw the freeze released the hold (its Lease
		// version raised the token: its first write after it started); one
		// that had not seen the freeze yet, running beside it, took that
		// for a hand-off and wrote the holder's end as LockLost.
		c.stats.LockLostFrozen++
	case ref == nil:
		c.checkExpiryPassed(e, "no-preemption", lv, cv, now)
		c.stats.LockLostExpired++
	case !c.ledger.PodFinished(ns, ref) && !c.ledger.PodGone(ns, ref):
		c.violate(e, "no-preemption", "%s lost the lock (LockLost) while its pod runs", cv.name)
	}
}

// checkDeletion: only the owner (the workload) deletes a claim, or the
// operator once a terminal claim's finishedAt + TTL has passed. A deletion
// found by a re-list (gap) is also explained when the checker was blind for
// long enough for the claim to end and its TTL to pass.
func (c *Checker) checkDeletion(e Entry, bl *buildlockv1.BuildLock, now time.Time, gap bool) {
	if c.ledger.DeleteRequested(bl.Namespace, bl.Name) {
		c.stats.OwnerDeletes++
		return
	}
	st := bl.Status
	late := now.Add(c.o.Tolerance)
	if c.o.TTL > 0 && isTerminal(st.Phase) && st.FinishedAt != nil && !late.Before(st.FinishedAt.Add(c.o.TTL)) {
		c.stats.TTLDeletes++
		return
	}
	if cv := c.claims[bl.UID]; gap && c.o.TTL > 0 && cv != nil && !late.Before(cv.lastSeen.Add(c.o.TTL)) {
		c.stats.GapDeletes++
		return
	}
	c.violate(e, "no-lost-claims", "%s (%s) was deleted by neither its owner nor the finished TTL (%s)", bl.Name, phaseOf(st.Phase), c.o.TTL)
}

func holderIdentity(name string, uid types.UID) string { return name + "/" + string(uid) }

func holderIdentityToken(identity string, token int64) string {
	return fmt.Sprintf("%s#%d", identity, token)
}

// ObserveLease judges one event of a Lease in the workload's namespaces:
// a grant Lease, or a namespace's token floor (others are ignored).
func (c *Checker) ObserveLease(typ watch.EventType, l *coordinationv1.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observeLease(typ, l)
}

func (c *Checker) observeLease(typ watch.EventType, l *coordinationv1.Lease) {
	token := int64(0)
	if l.Spec.LeaseTransitions != nil {
		token = int64(*l.Spec.LeaseTransitions)
	}
	if l.Name == TokenFloorLease {
		c.observeFloor(typ, l, token)
		return
	}
	if !strings.HasPrefix(l.Name, LeasePrefix) {
		return
	}
	lock := LockKey{l.Namespace, strings.TrimPrefix(l.Name, LeasePrefix)}
	lv := c.lock(lock)
	if c.observeForeign(typ, lv, lock, l) {
		return
	}
	if c.o.OnLease != nil {
		c.o.OnLease(typ, l)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	person := typ != watch.Deleted && c.ledger.PersonWroteLease(l)
	what := fmt.Sprintf("holder=%q token=%d", holder, token)
	if w := l.Annotations[WriterPodAnnotation]; w != "" {
		what += " writer=" + w
	}
	if person {
		what += " (written by a person)"
	}
	e := c.record(Entry{At: c.o.Now(), Kind: "Lease", Type: typ, Lock: lock, Name: l.Name, UID: l.UID, RV: l.ResourceVersion,
		What: what, token: token, identity: holder})
	c.stats.LeaseEvents++
	if typ == watch.Deleted {
		c.checkLeaseDeletion(e, lv, l, 0)
		return
	}
	if person {
		// Not the operator's: no rule binds what a person writes, and no
		// later grant is measured against it; the operator must undo it.
		c.notePersonEdit(e, lv, l)
		return
	}
	edited := lv.personEdited
	lv.personEdited = false
	c.noteRepaired(lv)
	c.judgeReserved(e, l, token)
	c.judgeTokens(e, lv, l, holder, token, edited)
	lv.personDeleted, lv.floorDeletesSeen = false, c.floorDeletes[l.Namespace]
	c.checkWriter(e, l, holder)
	c.noteMemory(e, lv, l)
	lv.leaseSeen, lv.leaseDeleted, lv.leaseHolder, lv.leaseToken = true, false, holder, token
	lv.lease = l.DeepCopy()
	lv.leaseMaxToken = max(lv.leaseMaxToken, token)
	c.stats.MaxToken = max(c.stats.MaxToken, token)
}

// judgeTokens judges a version of the grant Lease the operator wrote
// against the grants before it: a new holder comes with a token above every
// token so far, or names the latest grant's holder again (a restore); a
// holder keeps its token; a freed Lease keeps its token floor. After a
// person's edit (edited), a version naming the holder again with a token
// above every token so far is a new grant to it: a stale cache showed the
// holder still waiting when the edit freed the Lease, and the operator
// granted it again (its later token stands: lowering it would send a token
// back).
func (c *Checker) judgeTokens(e Entry, lv *lockView, l *coordinationv1.Lease, holder string, token int64, edited bool) {
	switch {
	case lv.namesLatestGrantAgain(holder, token):
		c.noteRestore(e, lv, l, holder)
	case lv.followsPerson(holder, token):
		c.noteFollowed(e, lv, l, holder, token)
	case holder != "" && (!lv.leaseSeen || lv.leaseDeleted || holder != lv.leaseHolder):
		c.noteGrant(e, lv, l, holder, token)
	case holder != "" && edited && token > lv.leaseMaxToken:
		c.stats.Regrants++
		c.noteGrant(e, lv, l, holder, token)
	case holder != "" && token != lv.leaseToken:
		c.violate(e, "fencing-token-increases", "the Lease kept holder %s but its token changed %d → %d", holder, lv.leaseToken, token)
	case holder == "" && token < lv.leaseMaxToken:
		c.violate(e, "fencing-token-increases", "the freed Lease lowered its token floor %d → %d", lv.leaseMaxToken, token)
	case holder == "" && e.Type == Relisted && token > lv.leaseMaxToken:
		lv.gapTokens = append(lv.gapTokens, [2]int64{lv.leaseMaxToken + 1, token})
	}
}

// namesLatestGrantAgain reports whether a version naming holder with
// token names the latest grant again, after the Lease was deleted or
// written away from it.
func (lv *lockView) namesLatestGrantAgain(holder string, token int64) bool {
	return holder != "" && holder == lv.lastGrantHolder && token == lv.lastGrantToken && (lv.leaseDeleted || holder != lv.leaseHolder)
}

// bothRecordsDeleted reports whether, since the operator's last version
// of the Lease, a person deleted it and a person deleted the namespace's
// token floor (floorDeletes of them so far).
func (lv *lockView) bothRecordsDeleted(floorDeletes int) bool {
	return lv.personDeleted && floorDeletes > lv.floorDeletesSeen
}

// judgeReserved: every token the operator writes into a grant Lease is
// one the namespace's token floor already holds (the operator raises the
// floor ahead of its grants), so that a lock left without its Lease
// starts above every token it issued. The floor's versions and the grant
// Lease's come in etcd's order on one watch; the highest floor seen counts
// (people only delete floors, and the operator restores them).
func (c *Checker) judgeReserved(e Entry, l *coordinationv1.Lease, token int64) {
	if token > c.floors[l.Namespace] {
		c.violate(e, "tokens-reserved", "the grant Lease %s carries token %d above the token floor of %s (%d): a lock left without its Lease could issue it again",
			l.Name, token, l.Namespace, c.floors[l.Namespace])
	}
}

// followsPerson reports whether a version naming holder with token grants
// what the latest version a person wrote named.
func (lv *lockView) followsPerson(holder string, token int64) bool {
	return holder != "" && holder == lv.personHolder && token == lv.personToken && holder != lv.leaseHolder
}

// observeFloor follows a namespace's token floor: the highest token of the
// grant Leases the operator deleted there. The operator raises it before it
// deletes a Lease, so an idle Lease is deleted only once some version of
// the floor held its token (a person's deletion of the floor meanwhile
// does not make that deletion wrong: the operator restores the floor, and
// fencing-token-increases judges every later grant). Only a person deletes
// a floor.
func (c *Checker) observeFloor(typ watch.EventType, l *coordinationv1.Lease, token int64) {
	e := c.record(Entry{At: c.o.Now(), Kind: "Lease", Type: typ, Lock: LockKey{Namespace: l.Namespace}, Name: l.Name, UID: l.UID, RV: l.ResourceVersion,
		What: fmt.Sprintf("token floor %d", token), token: token})
	if typ != watch.Deleted {
		c.floors[l.Namespace] = max(c.floors[l.Namespace], token)
		return
	}
	if c.ledger.PersonDeletedLease(l.UID) {
		c.stats.FloorDeletes++
		c.floorDeletes[l.Namespace]++
		return
	}
	c.violate(e, "grant-record-kept", "the token floor of %s (%d) was deleted by nobody who may", l.Namespace, token)
}

// noteGrant judges and records a Lease that names a new holder: its token
// must be above every token so far; the grant record remembers the granted
// build from now on, even if its Held status is never written.
func (c *Checker) noteGrant(e Entry, lv *lockView, l *coordinationv1.Lease, holder string, token int64) {
	switch {
	case token <= lv.leaseMaxToken && lv.bothRecordsDeleted(c.floorDeletes[l.Namespace]):
		// The documented residual: people deleted the grant Lease and the
		// namespace's floor, and the claims that showed the lock's tokens
		// went, before an operator wrote them again: the lock's tokens
		// start again from here.
		c.stats.TokensRestarted++
		lv.leaseMaxToken, lv.lastHeldToken = 0, 0
	case token <= lv.leaseMaxToken:
		c.violate(e, "fencing-token-increases", "the Lease was granted to %s with token %d, not above the highest so far, %d", holder, token, lv.leaseMaxToken)
	}
	if e.Type == Relisted && token > lv.leaseMaxToken+1 {
		lv.gapTokens = append(lv.gapTokens, [2]int64{lv.leaseMaxToken + 1, token - 1})
	}
	_, regrant := lv.grants[holder]
	acquired := recordGrant(lv, l, holder, token)
	lv.lastGrantToken = token
	c.stats.Grants++
	c.noteWindowGrant(e, e.Lock, holder, token, acquired, regrant)
	if _, uid, ok := strings.Cut(holder, "/"); ok {
		if cv := c.claims[types.UID(uid)]; cv != nil && !acquired.IsZero() {
			c.rememberHeld(lv, cv, acquired, int64(token))
		}
	}
}

// granted reports whether an operator version of the Lease granted claim
// cv token.
func (lv *lockView) granted(cv *claimView, token int64) bool {
	_, ok := lv.grants[holderIdentityToken(holderIdentity(cv.name, cv.uid), token)]
	return ok
}

// recordGrant records that version l of lock lv's Lease granted holder
// token (and makes it the latest grant), and returns the grant's acquire
// time.
func recordGrant(lv *lockView, l *coordinationv1.Lease, holder string, token int64) time.Time {
	var acquired time.Time
	if l.Spec.AcquireTime != nil {
		acquired = l.Spec.AcquireTime.Time
	}
	lv.grants[holderIdentityToken(holder, token)] = acquired
	lv.grantRVs[holderIdentityToken(holder, token)] = parseRV(l.ResourceVersion)
	lv.grants[holder] = acquired
	lv.lastGrantHolder = holder
	return acquired
}

// checkLeaseDeletion: the operator deletes a grant Lease only when it
// grants nothing, no claim of the lock exists, and it was not written for
// the grant retention; and only after the namespace's token floor holds its
// token, so that no token can ever be issued twice. A person may delete
// it at any time: the operator must then write it again from the claims.
// listRV is the resourceVersion of the re-list that found the Lease gone
// (0: its deletion was watched): l is then the last version the checker
// saw, and later ones it missed may have freed it.
func (c *Checker) checkLeaseDeletion(e Entry, lv *lockView, l *coordinationv1.Lease, listRV uint64) {
	gap := listRV != 0
	lv.kept = map[line]heldBuild{}
	if c.ledger.PersonDeletedLease(l.UID) {
		c.notePersonDelete(e, lv)
		lv.leaseDeleted, lv.leaseHolder, lv.lease = true, "", nil
		return
	}
	c.stats.LeaseDeletes++
	token := int64(0)
	if l.Spec.LeaseTransitions != nil {
		token = int64(*l.Spec.LeaseTransitions)
	}
	lastWritten := l.CreationTimestamp.Time
	if l.Spec.RenewTime != nil {
		lastWritten = l.Spec.RenewTime.Time
	}
	var live []*claimView
	for _, cv := range c.claims {
		if cv.lock == e.Lock && !cv.deleted {
			live = append(live, cv)
		}
	}
	// A version the checker missed may have freed a Lease found gone by a
	// re-list (its holder ended): that is judged at the end of the run, by
	// whether the holder ended before the re-list, unless another rule
	// already fails (a lower bound of its last write, or its token).
	holder, gapHolder := ptr.Deref(l.Spec.HolderIdentity, ""), ""
	if gap {
		holder, gapHolder = "", holder
	}
	switch now := c.o.Now(); {
	case holder != "":
		c.violate(e, "grant-record-kept", "the grant Lease %s was deleted while it named %s", l.Name, holder)
	case c.floors[l.Namespace] < token:
		c.violate(e, "grant-record-kept", "the grant Lease %s (token %d) was deleted before the token floor of %s held its token (floor %d): tokens could repeat",
			l.Name, token, l.Namespace, c.floors[l.Namespace])
	case len(live) > 0 && !gap:
		// The claims' deletions may still be on their way (two watches):
		// judged at the end of the run, in etcd's order.
		lv.deletions = append(lv.deletions, leaseDeletion{e: e, name: l.Name, rv: parseRV(l.ResourceVersion), live: live})
	case now.Add(c.o.Tolerance).Before(lastWritten.Add(c.o.Retention)):
		c.violate(e, "grant-record-kept", "the grant Lease %s was deleted %s after its last write, before the grant retention %s",
			l.Name, now.Sub(lastWritten).Round(time.Millisecond), c.o.Retention)
	case gapHolder != "":
		_, uid, _ := strings.Cut(gapHolder, "/")
		lv.deletions = append(lv.deletions, leaseDeletion{e: e, name: l.Name, rv: listRV, holder: types.UID(uid), holderIdentity: gapHolder})
	}
	lv.leaseDeleted, lv.leaseHolder, lv.lease = true, "", nil
}

// CheckGrantsCoverHolds is run once the watches have caught up: every claim
// ever shown Held with token t was named by its lock's Lease with token t
// (the grant is written before the status), unless the checker's Lease
// watch was down when that token was issued.
func (c *Checker) CheckGrantsCoverHolds() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cv := range c.claims {
		lv := c.locks[cv.lock]
		for _, t := range cv.heldTokens {
			if _, ok := lv.grants[holderIdentityToken(holderIdentity(cv.name, cv.uid), t)]; ok {
				continue
			}
			if inGap(lv.gapTokens, t) {
				c.stats.GapHold++
				continue
			}
			e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: cv.lock, Name: cv.name, UID: cv.uid, What: "end of run"})
			c.violate(e, "grant-before-hold", "%s was shown Held with token %d, but the Lease never named it with that token", cv.name, t)
		}
	}
}

// leaseDeletion is a grant Lease deleted (resourceVersion rv) while the
// claims live were not seen deleted yet; or found gone by a re-list (at
// resourceVersion rv) while the last version seen named holder.
type leaseDeletion struct {
	e    Entry
	name string
	rv   uint64
	live []*claimView
	// holder is the claim (UID) the last version seen named, when the
	// deletion was not watched.
	holder         types.UID
	holderIdentity string
}

// sortedLocks lists the locks the checker knows, in a stable order, so that
// reports read the same from run to run.
func (c *Checker) sortedLocks() []LockKey {
	keys := make([]LockKey, 0, len(c.locks))
	for k := range c.locks {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	return keys
}

// CheckLeaseDeletions is run once the watches have caught up: a grant Lease
// is deleted only when no claim of its lock exists, in etcd's order. A
// claim deleted at a lower resourceVersion than the Lease (its event came
// later, on the other watch), created at a higher one, or found gone by a
// re-list (when is unknown) does not count.
func (c *Checker) CheckLeaseDeletions() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		for _, d := range lv.deletions {
			if d.holder != "" {
				// Found gone by a re-list: the holder its last version seen
				// named must have ended (or gone) before the list.
				cv := c.claims[d.holder]
				switch {
				case cv == nil:
				case cv.deleted && (cv.deletedRV == 0 || cv.deletedRV < d.rv), cv.endRV != 0 && cv.endRV < d.rv:
					c.stats.GapLeaseDeletes++
				default:
					c.violate(d.e, "grant-record-kept", "the grant Lease %s was gone (found by a re-list at rv %d) while it named %s, which had not ended before",
						d.name, d.rv, d.holderIdentity)
				}
				continue
			}
			var had []string
			for _, cv := range d.live {
				if latest := c.claims[cv.uid]; latest != nil {
					cv = latest // each event makes a new view
				}
				gone := cv.deleted && (cv.deletedRV == 0 || cv.deletedRV < d.rv)
				if !gone && cv.addedRV < d.rv {
					had = append(had, cv.name)
				}
			}
			if len(had) > 0 {
				sort.Strings(had)
				c.violate(d.e, "grant-record-kept", "the grant Lease %s was deleted while its lock had claims (%s)", d.name, strings.Join(had, ", "))
			}
		}
		lv.deletions = nil
	}
}

// CheckMemorySupersessions is run once the watches have caught up: a claim
// superseded by the grant record's line memory must be explained by a hold
// the checker saw or by a version of the Lease whose memory named a build of
// its line at or above it.
func (c *Checker) CheckMemorySupersessions() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.sortedLocks() {
		lv := c.locks[k]
		for _, p := range lv.memoryPending {
			switch p.cv.status.Reason {
			case buildlockv1.ReasonLineOwnedByOther:
				c.violate(p.e, "superseded-by-newer", "%s (%s#%d, by %q) was superseded as LineOwnedByOther, but no other service account's build of its line held within %s",
					p.cv.name, lineOf(p.cv.spec), p.cv.spec.Build, p.cv.requester, c.o.Retention)
			case buildlockv1.ReasonBuildJumpTooLarge:
				c.violate(p.e, "superseded-by-newer", "%s (%s#%d) was superseded as BuildJumpTooLarge, but no build of its line more than %d below it held within %s",
					p.cv.name, lineOf(p.cv.spec), p.cv.spec.Build, buildlockv1.DefaultMaxBuildJump, c.o.Retention)
			default:
				c.violate(p.e, "superseded-by-newer", "%s (%s#%d) was superseded by the grant record's memory, but no build of its line at or above it held within %s, and no version of the Lease remembered one",
					p.cv.name, lineOf(p.cv.spec), p.cv.spec.Build, c.o.Retention)
			}
		}
		lv.memoryPending = nil
	}
}

// AddViolation records a violation found outside the checker's own rules
// (the deployer's judgement of admitted writes), at the end of the history.
func (c *Checker) AddViolation(k LockKey, rule, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: k, What: rule})
	c.violate(e, rule, format, args...)
}

func inGap(gaps [][2]int64, t int64) bool {
	for _, g := range gaps {
		if t >= g[0] && t <= g[1] {
			return true
		}
	}
	return false
}

// HoldsBehindTheGrant replays the history in etcd's order (resourceVersions
// of one etcd are one sequence across kinds and API servers) and returns the
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
			if e.Type == watch.Deleted || e.Type == Relisted || e.phase != buildlockv1.PhaseHeld || prev == buildlockv1.PhaseHeld {
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
	s.Phases, s.Relists = map[string]int{}, map[string]int{}
	for k, v := range c.stats.Phases {
		s.Phases[k] = v
	}
	for k, v := range c.stats.Relists {
		s.Relists[k] = v
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

// Granted reports whether the grant Lease of claim ns/name's lock named it
// (it holds, or held).
func (c *Checker) Granted(ns, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cv := c.claims[c.names[ns+"/"+name]]
	if cv == nil {
		return false
	}
	lv := c.locks[cv.lock]
	_, ok := lv.grants[holderIdentity(cv.name, cv.uid)]
	return ok
}

// LiveClaims counts the claims of lock k that exist and are not terminal.
func (c *Checker) LiveClaims(k LockKey) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, cv := range c.claims {
		if cv.lock == k && !cv.deleted && !isTerminal(cv.status.Phase) {
			n++
		}
	}
	return n
}

// ClaimRef is a claim as the checker last saw it.
type ClaimRef struct {
	Name, PodUID string
	UID          types.UID
	Phase        buildlockv1.Phase
	Token        int64
}

// Claims returns the claims of lock k that exist and have not ended, in
// name order.
func (c *Checker) Claims(k LockKey) []ClaimRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ClaimRef
	for _, cv := range c.claims {
		if cv.lock != k || cv.deleted || isTerminal(phaseOf(cv.status.Phase)) {
			continue
		}
		r := ClaimRef{Name: cv.name, UID: cv.uid, Phase: phaseOf(cv.status.Phase), Token: cv.status.FencingToken}
		if cv.spec.PodRef != nil {
			r.PodUID = cv.spec.PodRef.UID
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// HeldLine is a build of a line that held a lock (the claim Name), and when
// it was granted.
type HeldLine struct {
	Repo, Branch, Workflow, Name string
	Build                        int64
	At                           time.Time
}

// LinesHeld returns, for lock k, the highest build of each line that held
// it, and when that build was granted.
func (c *Checker) LinesHeld(k LockKey) []HeldLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	lv := c.locks[k]
	if lv == nil {
		return nil
	}
	var out []HeldLine
	for l, builds := range lv.lines {
		if len(builds) == 0 {
			continue
		}
		best := builds[0]
		for _, b := range builds[1:] {
			if b.build > best.build {
				best = b
			}
		}
		out = append(out, HeldLine{Repo: l.repo, Branch: l.branch, Workflow: l.workflow, Name: best.name, Build: best.build, At: best.at})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Repo+"@"+out[i].Branch+"/"+out[i].Workflow < out[j].Repo+"@"+out[j].Branch+"/"+out[j].Workflow
	})
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
