package arbiter

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Phase is a claim's standing in its lock. The values are the API's
// (api/v1alpha1.Phase); the arbiter keeps its own type so that it depends on
// nothing but the standard library.
type Phase string

// The phases, as in the API. See the package comment for their transitions.
const (
	Pending    Phase = "Pending"
	Waiting    Phase = "Waiting"
	Held       Phase = "Held"
	Superseded Phase = "Superseded"
	Released   Phase = "Released"
	Expired    Phase = "Expired"
)

// IsTerminal reports whether a claim in phase p can never change again.
func (p Phase) IsTerminal() bool {
	return p == Superseded || p == Released || p == Expired
}

// PodState is what is known of a claim's pod right now.
type PodState int

const (
	// NoPod means the claim has no podRef; it lives by expiresAfter and renewTime.
	NoPod PodState = iota
	// PodAlive means the pod is Pending, Running or Unknown.
	PodAlive
	// PodFinished means the pod reached Succeeded or Failed.
	PodFinished
	// PodGone means a live read found no pod of that name, or one with another UID.
	PodGone
	// PodUnknown means the pod's state could not be read; it counts as alive
	// (rule 8: only a positive observation ends a claim).
	PodUnknown
)

// String names the state for printed decisions.
func (s PodState) String() string {
	switch s {
	case NoPod:
		return "NoPod"
	case PodAlive:
		return "PodAlive"
	case PodFinished:
		return "PodFinished"
	case PodGone:
		return "PodGone"
	case PodUnknown:
		return "PodUnknown"
	}
	return fmt.Sprintf("PodState(%d)", int(s))
}

// Lock names the lock being decided: one target in one namespace.
type Lock struct {
	Namespace string
	Target    string
}

// Ordering is how a lock chooses among the builds that want it (the API's
// BuildLockPolicy spec.ordering). The rules of each are in the package
// comment.
type Ordering string

// The orderings, as in the API. The zero value is NewestWins.
const (
	NewestWins Ordering = "NewestWins"
	Queue      Ordering = "Queue"
	Fifo       Ordering = "Fifo"
)

// Claim is one BuildLock as the arbiter sees it: plain data, gathered by the
// controller.
type Claim struct {
	// Name and UID identify the BuildLock.
	Name string
	UID  string
	// Repo, Branch, Workflow and Build are the claim's spec:
	// Repo+Branch+Workflow is its line (an empty Workflow is the line of
	// Repo and Branch alone, as claims without spec.workflow have).
	Repo     string
	Branch   string
	Workflow string
	Build    int64
	// Timestamp is spec.timestamp, when the build started (zero if unset).
	// It orders claims of different lines with NewestWins, capped at
	// Created + Policy.MaxTimestampSkew (see [Policy.OrderTime]).
	Timestamp time.Time
	// Created is the BuildLock's creationTimestamp, in the API server's
	// clock.
	Created time.Time
	// Phase is the claim's current status.phase ("" counts as Pending).
	Phase Phase
	// FencingToken is the token in the claim's current status (0 if none). The
	// next grant's token is above every token seen, so tokens are never
	// reused even if the grant record is lost.
	FencingToken int64
	// AcquiredAt is when the claim's hold was granted, as its status says
	// (status.acquiredAt; zero if it never held). With FencingToken it is
	// the claim's own record of its hold, from which a lost or edited grant
	// record is restored (rule 11), and the line memory rebuilt.
	AcquiredAt time.Time
	// ExpiresAfter bounds a pod-less hold between renewals (zero or less:
	// DefaultExpiresAfter).
	ExpiresAfter time.Duration
	// RenewTime is a renewal the operator has not recorded yet: spec.renewTime,
	// in the client's clock, while status.renewedAt does not account for it;
	// zero otherwise. It counts from min(RenewTime, now): a client's clock in
	// the future extends nothing.
	RenewTime time.Time
	// RenewedAt is the last renewal the operator recorded (status.renewedAt).
	RenewedAt time.Time
	// QueuedAt is the claim's recorded place in the lock's queue
	// (status.queuedAt); zero if it has none yet.
	QueuedAt time.Time
	// Pod is what is known of the claim's pod.
	Pod PodState
	// ForceRelease, when not empty, is why a person asked to end this claim
	// (the BuildLock's buildlock.io/force-release annotation: "who: why"). A
	// holder or a waiter with it is Released, reason ForceReleased. It is
	// free text: messages quote at most MaxQuotedLength characters of it,
	// escaped.
	ForceRelease string
	// ForceReleasedBy is who set ForceRelease, as the API server
	// authenticated them (the force-released-by stamp of enforcement's
	// admission policies); empty when nothing verified it. Messages quote
	// it.
	ForceReleasedBy string
	// Writer is who may write into an enforced target while this claim
	// holds it; the grant records it.
	Writer Writer
	// Deleting says the claim was deleted and is kept only by a finalizer
	// (its deletionTimestamp is set): it has ended, holder or waiter
	// (Released, reason Deleted).
	Deleting bool
	// Rollback says the claim is a rollback on purpose (spec.rollback), and
	// RollbackReason why: it is exempt from "never backwards" (rule 3) if
	// Policy.Rollbacks allows it from its Identity, and its grant lowers its
	// line's memory to its build. The reason is free text: the grant
	// record's audit keeps at most MaxQuotedLength characters of it.
	Rollback       bool
	RollbackReason string
	// Override, when its Reason is set, is a person's leave for this claim
	// to be granted through a freeze (the BuildLock's buildlock.io/override
	// annotations): rule 12.
	Override Override
	// Identity is who created the claim, as far as the API server vouches
	// for it: spec.requester's user name when the buildlock-requester
	// admission policy stamped it, else empty (unknown). A pipeline (see
	// IsPipeline) owns the branch it held last (rule 3); a person neither
	// owns a branch nor is bound by an owner or by Policy.MaxBuildJump.
	Identity string
	// CIIdentity says that Identity is a CI system's: the API server
	// authenticated an OIDC token of GitHub Actions or GitLab CI and mapped
	// its repository into the user (spec.requester.repository). Such an
	// identity is a pipeline, as a service account is.
	CIIdentity bool
	// WorkflowVerified says that the API server vouches for Workflow: the
	// claim's verified requester is a CI identity whose token names that
	// workflow (spec.requester.workflow, mapped from the token by the
	// authenticator). A Workflow nothing verified is free text: rule 3
	// judges the claim by its branch's line without a workflow too, so that
	// naming a workflow never gets a build past what it would face without
	// one.
	WorkflowVerified bool
}

// Override is a person's leave for one claim to be granted while its
// target is frozen: once (a claim is granted once), and until Expires.
type Override struct {
	// Reason is why (the buildlock.io/override annotation); empty means no
	// override. It is free text: messages quote at most MaxQuotedLength
	// characters of it, escaped.
	Reason string
	// Expires is when the override lapses unused (the
	// buildlock.io/override-expires annotation); zero when that is missing
	// or not an RFC 3339 time, which makes the override void.
	Expires time.Time
	// By is who set it, as the API server authenticated them (the
	// overridden-by stamp of enforcement's admission policies); empty when
	// nothing verified it. Messages quote it.
	By string
}

// Verified reports whether the override may let its claim through a
// freeze at all: it is set, the API server verified who set it (By), and
// that is a person's identity, not a service account's. An override that
// nothing verified (a cluster without the buildlock-override admission
// policies, where any client with patch rights on its claim could write
// it: the pipeline itself) never widens anyone's rights; it is void, and
// the claim's message says why.
func (o Override) Verified() bool {
	return o.Reason != "" && o.By != "" && !IsServiceAccount(o.By)
}

// InEffect reports whether the override lets its claim be granted at now:
// it is Verified, has not expired, and expires at most MaxOverrideFor
// after now (an expiry further ahead is void until then: no override lasts
// longer).
func (o Override) InEffect(now time.Time) bool {
	return o.Verified() && now.Before(o.Expires) && !o.Expires.After(now.Add(MaxOverrideFor))
}

// Freeze is whether the lock's target takes grants now, as its policy's
// windows say (package internal/window works it out; the arbiter is told
// the outcome at now).
type Freeze struct {
	// Frozen says no claim is granted but through an override (rule 12).
	Frozen bool
	// Until is when the target opens, in the time zone messages give it
	// in; zero when that is not known (beyond the operator's look-ahead,
	// or never while a window cannot be evaluated).
	Until time.Time
	// Window names the window that freezes the target ("holiday",
	// "windows[2]"); empty when it is frozen because it is outside every
	// Allow window, or because a window cannot be evaluated (Invalid).
	Window string
	// Reason is that window's reason ("holiday freeze"), if it has one.
	Reason string
	// Invalid says a window of the policy cannot be evaluated: the target
	// is frozen until the policy is fixed.
	Invalid bool
	// ReleaseSince is the latest start of the Deny windows in effect whose
	// holder is Release (zero if none), in the time zone messages give it
	// in: a holder granted before it, without an override, is Released
	// (FreezeStarted). ReleaseWindow names that window.
	ReleaseSince  time.Time
	ReleaseWindow string
}

// Describe says until when and why the target is frozen, as messages quote
// it: "until 2026-12-28T08:00:00+01:00 (holiday freeze)". It depends only
// on f, not on how much time passed.
func (f Freeze) Describe() string {
	switch {
	case f.Invalid:
		return "until its BuildLockPolicy is fixed (" + f.Why() + ": see the policy's Ready condition)"
	case f.Until.IsZero():
		return fmt.Sprintf("for more than a year (%s)", f.Why())
	}
	return fmt.Sprintf("until %s (%s)", f.Until.Format(time.RFC3339), f.Why())
}

// Why says why the target is frozen, as Describe gives it in parentheses:
// the window's reason ("holiday freeze"), else its name ("window
// holiday"), else "outside its Allow windows"; printable.
func (f Freeze) Why() string {
	switch {
	case f.Invalid:
		return "a window cannot be evaluated"
	case f.Reason != "":
		return printable(f.Reason)
	case f.Window != "":
		return printable("window " + f.Window)
	}
	return "outside its Allow windows"
}

// serviceAccountPrefix starts the user name of every Kubernetes service
// account.
const serviceAccountPrefix = "system:serviceaccount:"

// IsServiceAccount reports whether identity is a Kubernetes service account
// (system:serviceaccount:<namespace>:<name>): a pipeline, as opposed to a
// person.
func IsServiceAccount(identity string) bool {
	return strings.HasPrefix(identity, serviceAccountPrefix)
}

// IsPipeline reports whether identity is a pipeline's, as opposed to a
// person's: a service account, or a CI identity (ci: see
// Claim.CIIdentity).
func IsPipeline(identity string, ci bool) bool {
	return identity != "" && (ci || IsServiceAccount(identity))
}

// Writer is the identity whose writes an enforced target admits from its
// holder: a pod (by UID), else a user name.
type Writer struct {
	// PodUID, when set, is the only pod whose service-account token is the
	// holder's: the claim's podRef.uid, or the pod its requester's token
	// was bound to.
	PodUID string
	// Username is the holder's requester, for a pod-less holder whose
	// requester had no pod-bound token.
	Username string
	// Run, with Username, is the only CI run whose writes are the
	// holder's: its requester's (a CI identity's token names its run).
	Run string
}

// Grant is the lock's grant record (the Lease): who holds it, since when,
// the fencing token of that grant, which builds of each line held the lock,
// and how the last hold this arbiter ended ended. A zero Holder means the
// lock is free; Token then keeps the last token issued.
//
// Absent, Floor and Reserved describe the input record, not the record
// itself: a decision's Grant keeps the input's Floor and Reserved, and is Absent only
// when there was no record and the decision writes none.
type Grant struct {
	Holder     string
	HolderUID  string
	Token      int64
	AcquiredAt time.Time
	// Lines records, per line, the highest build that held the lock, when it
	// was granted and by whom; records older than Policy.LineMemory no
	// longer count. A new line is recorded only while the records' sizes
	// stay within LineMemoryBytes, and its owner's within
	// LineMemoryBytesPerOwner: no record is evicted to make room. Sorted by
	// line.
	Lines []LineRecord
	// Ended is how the previous holder's hold ended, when a decision ended it
	// (zero otherwise): a claim still shown Held whose end was never written
	// gets this ending instead of LockLost.
	Ended Ending
	// Writer is the holder's Writer, recorded with the grant so that an
	// enforced target admits the holder's writes and no one else's, and
	// never ahead of the grant.
	Writer Writer
	// Audit records the lock's notable events, oldest first, so that they
	// outlive their claims: force-released holds, rollbacks and overrides
	// granted (see AuditEntry). A decision appends to it when it moves the
	// grant, and keeps the newest MaxAuditEntries within AuditBytes.
	Audit []AuditEntry

	// Absent says that the lock has no grant record at all (its Lease does
	// not exist): a lock never granted, or one whose record was deleted.
	// The decision then restores it from the claims (rule 11).
	Absent bool
	// Floor is the highest fencing token known to have been issued for
	// the lock besides Token and the claims' tokens (the namespace's token
	// floor, the operator's memory of every record it saw): the next
	// grant's token is above it too, so that a deleted or edited record
	// never makes a token repeat.
	Floor int64
	// Reserved bounds every token that may have been issued for the lock,
	// besides Token, Floor and the claims' (the namespace's token floor,
	// which the operator raises before it issues a token above it): a new
	// token is above it. Unlike Floor it says nothing of which hold is the
	// latest: a claim shown Held below it may still hold (its record was
	// deleted, and it is restored with its token).
	Reserved int64
}

// LineRecord says that build Build of the line Repo@Branch (of Workflow)
// was granted the lock at HeldAt, to a claim whose Identity was Owner: the
// highest build of the line granted since the line's last rollback, which
// was granted at Since (zero if it had none).
type LineRecord struct {
	Repo     string
	Branch   string
	Workflow string
	Build    int64
	HeldAt   time.Time
	// Owner is the Identity of the claim granted (empty when unknown). A
	// pipeline (IsPipeline) owns the branch while this is the branch's
	// latest record (rule 3).
	Owner string
	// OwnerCI is the CIIdentity of the claim granted.
	OwnerCI bool
	// Since is when the line was last rolled back (zero: not within the
	// record's life): builds granted before it no longer count, whatever
	// the claims show. A rollback's own record has Since == HeldAt.
	Since time.Time
	// Token is the fencing token of the grant (0 in records of an older
	// operator): of two grants of a line at one instant, the higher token
	// is the later.
	Token int64
	// Started is when the granted build started: its claim's
	// [Policy.OrderTime] (zero in records of an older operator). It orders
	// the builds of the branch's other lines (rule 3): a build that started
	// before it does not deploy after it, unless it is a rollback.
	Started time.Time
}

// Size is what a record counts against LineMemoryBytes: an upper bound of
// its length as the grant Lease stores it (JSON without HTML escaping, in
// which a string's byte takes at most two bytes).
func (r LineRecord) Size() int {
	size := lineRecordOverhead + len(r.Repo) + 2*len(r.Branch) + 2*len(r.Owner)
	if r.OwnerCI {
		size += ciOwnerOverhead
	}
	if r.Workflow != "" {
		size += lineRecordWorkflowOverhead + 2*len(r.Workflow)
	}
	if !r.Since.IsZero() {
		size += lineRecordSinceOverhead
	}
	if r.Token != 0 {
		size += lineRecordTokenOverhead
	}
	if !r.Started.IsZero() {
		size += lineRecordStartedOverhead
	}
	return size
}

// lineRecordOverhead bounds a record's encoding without its strings: the
// field names and punctuation, a build of up to 16 digits and an RFC 3339
// time with nanoseconds, and the comma that separates records. A workflow,
// a rollback's time, a token (of up to 20 characters) and a start time add
// their own (records without them are as long as before they existed).
const (
	lineRecordOverhead         = 112
	lineRecordWorkflowOverhead = 16
	lineRecordSinceOverhead    = 48
	lineRecordTokenOverhead    = 32
	lineRecordStartedOverhead  = 50
)

// AuditEntry is one notable event of the lock (Grant.Audit): a
// force-released hold, a rollback granted, or an override granted (a
// person's claim on a line another service account owned, or whose build
// jumped further than a pipeline's may; or a claim a person's override let
// through a freeze).
type AuditEntry struct {
	// Kind is AuditForceRelease, AuditRollback or AuditOverride.
	Kind string
	At   time.Time
	// Name is the claim concerned, Repo..Build its build, Token its hold's
	// fencing token.
	Name     string
	Repo     string
	Branch   string
	Workflow string
	Build    int64
	Token    int64
	// By is who did it as the API server verified them (the force-release's
	// Claim.ForceReleasedBy, the claim's Identity, a freeze override's
	// Override.By); empty if unverified.
	By string
	// Reason is why: Claim.ForceRelease, Claim.RollbackReason, or the rule
	// an override was exempt from (ReasonLineOwnedByOther,
	// ReasonBuildJumpTooLarge; for a freeze, ReasonFrozen, a colon and the
	// override's reason: "Frozen: hotfix"). Free text is cut to
	// MaxQuotedLength characters and maxAuditTextBytes bytes.
	Reason string
	// From is the build of the line the memory had: the build a rollback
	// rolled back from, or the one an override went past.
	From int64
	// Owner is the service account that owned the line an override took.
	Owner string
}

// The kinds of AuditEntry, as in the API (api/v1alpha1.Audit*).
const (
	AuditForceRelease = "ForceRelease"
	AuditRollback     = "Rollback"
	AuditOverride     = "Override"
)

// MaxAuditEntries is how many entries Grant.Audit keeps; AuditBytes bounds
// their sizes (AuditEntry.Size): the oldest go first.
const (
	MaxAuditEntries = 10
	AuditBytes      = 32 << 10
)

// maxAuditTextBytes bounds each free text of an AuditEntry.
const maxAuditTextBytes = 512

// Size bounds the entry's length as the grant Lease stores it (JSON
// without HTML escaping): names take at most two bytes a byte, free text
// (which may hold control characters) at most six.
func (e AuditEntry) Size() int {
	return auditEntryOverhead + 2*(len(e.Kind)+len(e.Name)+len(e.Repo)+len(e.Branch)+len(e.Workflow)+len(e.Owner)) +
		6*(len(e.By)+len(e.Reason))
}

// auditEntryOverhead bounds an entry's encoding without its strings.
const auditEntryOverhead = 200

// ciOwnerOverhead bounds what OwnerCI adds to a record's encoding.
const ciOwnerOverhead = 16

// Ending is how a hold ended: the claim, its final phase and reason, and
// when.
type Ending struct {
	Name   string
	UID    string
	Phase  Phase
	Reason string
	At     time.Time
}

// Equal reports whether two grant records are the same (Absent, Floor and
// Reserved describe an input, and are not compared).
func (g Grant) Equal(o Grant) bool {
	return g.Holder == o.Holder && g.HolderUID == o.HolderUID && g.Token == o.Token &&
		g.AcquiredAt.Equal(o.AcquiredAt) && g.Ended.equal(o.Ended) && g.Writer == o.Writer &&
		slices.EqualFunc(g.Lines, o.Lines, LineRecord.equal) && slices.EqualFunc(g.Audit, o.Audit, AuditEntry.equal)
}

func (r LineRecord) equal(o LineRecord) bool {
	return r.Repo == o.Repo && r.Branch == o.Branch && r.Workflow == o.Workflow && r.Build == o.Build &&
		r.HeldAt.Equal(o.HeldAt) && r.Owner == o.Owner && r.Since.Equal(o.Since) &&
		r.OwnerCI == o.OwnerCI && r.Token == o.Token && r.Started.Equal(o.Started)
}

func (e AuditEntry) equal(o AuditEntry) bool {
	a, b := e, o
	a.At, b.At = time.Time{}, time.Time{}
	return a == b && e.At.Equal(o.At)
}

func (e Ending) equal(o Ending) bool {
	return e.Name == o.Name && e.UID == o.UID && e.Phase == o.Phase && e.Reason == o.Reason && e.At.Equal(o.At)
}

// Policy holds the settings that shape one lock's decisions: its
// BuildLockPolicy, and the operator's flags where the policy is silent.
type Policy struct {
	// Ordering chooses among waiting builds; "" is NewestWins.
	Ordering Ordering
	// MaxHold, when positive, ends every hold (pod-backed or pod-less) this
	// long after its grant. Zero means holds are bounded only by their pod or
	// their expiry.
	MaxHold time.Duration
	// LineMemory is how long a grant record remembers which build of a line
	// held the lock (zero or less: DefaultGrantRetention).
	LineMemory time.Duration
	// MaxTimestampSkew is how far after its creation a claim's Timestamp
	// may place it (zero or less: DefaultMaxTimestampSkew; see
	// [Policy.OrderTime]).
	MaxTimestampSkew time.Duration
	// MaxBuildJump is how far above the highest remembered build of its
	// line a claim that is not a person's may go (zero or less:
	// DefaultMaxBuildJump; rule 3).
	MaxBuildJump int64
	// RefuseReruns makes a build deploy once: a claim of the build its line
	// remembers is Superseded (DuplicateBuild) even after the claim that
	// held it ended. By default such a re-run is granted like any build.
	RefuseReruns bool
	// Rollbacks says whose rollbacks (Claim.Rollback) are exempt from
	// "never backwards": RollbacksAnyone (also ""), RollbacksPeopleOnly or
	// RollbacksNobody. A rollback it refuses is Superseded
	// (RollbackNotAllowed).
	Rollbacks Rollbacks
	// Freeze says whether the target is frozen now (rule 12).
	Freeze Freeze
}

// Rollbacks says who may roll back (the API's BuildLockPolicy
// spec.rollbacks).
type Rollbacks string

// The values of Rollbacks, as in the API. The zero value is RollbacksAnyone.
const (
	RollbacksAnyone     Rollbacks = "Anyone"
	RollbacksPeopleOnly Rollbacks = "PeopleOnly"
	RollbacksNobody     Rollbacks = "Nobody"
)

// Verdict is the arbiter's decision for one claim.
type Verdict struct {
	Name string
	UID  string
	// From is the phase the claim had; Phase is the phase it must have now.
	From  Phase
	Phase Phase
	// Reason and Message explain Phase (API reasons, e.g. "WaitingForHolder").
	// An empty Reason means the claim is terminal and unchanged: keep the
	// stored status.
	Reason  string
	Message string
	// SupersededBy names the claim that made this one obsolete; empty when
	// the build is superseded by the grant record's memory of a build of its
	// line that held (the claim may be gone).
	SupersededBy string
	// Holder and Waiting are the claims this claim's status names as holding
	// and waiting: the decision's own, except on a claim queued with Queue or
	// Fifo, whose status names neither (so that a hand-off never rewrites
	// the queue), and on the holder, whose status names no waiter (so that
	// a new waiter never rewrites the holder).
	Holder  string
	Waiting string
	// FencingToken is the token of the hold (Decision.Grant.Token) on a Held
	// verdict, and zero on any other: a claim that stops holding keeps the
	// token it held.
	FencingToken int64
	// ExpiresAt is when the hold ends unless renewed (Held only): a pod-less
	// hold's expiry, capped at the maximum hold; a pod-backed hold's maximum
	// hold. Zero when the hold has no end in time.
	ExpiresAt time.Time
	// RenewedAt is the claim's last renewal as it must be recorded (zero if
	// none): see Claim.RenewTime.
	RenewedAt time.Time
	// QueuedAt is the claim's place in the queue (Waiting only).
	QueuedAt time.Time
	// Warning, when set, is a message to surface once: a hold past 80 % of
	// its maximum hold.
	Warning string
	// Overridden says a Held verdict starts a hold through a freeze, by the
	// claim's override (rule 12): the controller records it (an event, a
	// metric).
	Overridden bool
}

// Decision is everything the arbiter decided for one lock at one instant.
type Decision struct {
	// Holder and Waiting name the claims that hold and wait (with Queue and
	// Fifo: wait first) after this decision ("" if none).
	Holder  string
	Waiting string
	// Queued is how many claims wait after this decision.
	Queued int
	// Grant is the grant record after this decision. GrantChanged says it
	// differs from the input grant (a new holder, the lock freed, or the
	// record restored: see Repair), so the controller must
	// compare-and-swap it before writing any status.
	Grant        Grant
	GrantChanged bool
	// Verdicts hold one entry per input claim, ordered for writing: claims
	// that stop holding first, then claims that stay in the running, then
	// claims that end, each group by name, and the claim that becomes Held
	// (a newly granted holder) last.
	Verdicts []Verdict
	// NextLook is the earliest future instant at which time alone changes the
	// decision (an expiry, or a max-hold threshold); zero if none.
	NextLook time.Time
	// Repair says what of the input grant record the claims contradicted
	// and the decision restored (rule 11): one of the Repair* values, or
	// empty. A repair sets GrantChanged.
	Repair string
}
