package arbiter

import (
	"fmt"
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

// Claim is one BuildLock as the arbiter sees it: plain data, gathered by the
// controller.
type Claim struct {
	// Name and UID identify the BuildLock.
	Name string
	UID  string
	// Repo, Branch and Build are the claim's spec: Repo+Branch is its line.
	Repo   string
	Branch string
	Build  int64
	// OrderTime orders claims of different lines: spec.timestamp, else the
	// creation time.
	OrderTime time.Time
	// Created is the BuildLock's creationTimestamp.
	Created time.Time
	// Phase is the claim's current status.phase ("" counts as Pending).
	Phase Phase
	// FencingToken is the token in the claim's current status (0 if none). The
	// next grant's token is above every token seen, so tokens are never
	// reused even if the grant record is lost.
	FencingToken int64
	// ExpiresAfter and RenewTime (zero if unset) bound a pod-less hold.
	ExpiresAfter time.Duration
	RenewTime    time.Time
	// Pod is what is known of the claim's pod.
	Pod PodState
	// ForceRelease, when not empty, is why a person asked to end this claim
	// (the BuildLock's buildlock.io/force-release annotation: "who: why"). A
	// holder or a waiter with it is Released, reason ForceReleased.
	ForceRelease string
}

// Grant is the lock's grant record (the Lease): who holds it, since when,
// and the fencing token of that grant. A zero Holder means the lock is free;
// Token then keeps the last token issued.
type Grant struct {
	Holder     string
	HolderUID  string
	Token      int64
	AcquiredAt time.Time
}

// Policy holds the operator-wide settings that shape decisions.
type Policy struct {
	// MaxHold, when positive, ends a pod-backed hold after this long
	// (--max-hold). Zero means pod-backed holds never time out.
	MaxHold time.Duration
}

// Verdict is the arbiter's decision for one claim.
type Verdict struct {
	Name string
	UID  string
	// From is the phase the claim had; Phase is the phase it must have now.
	From  Phase
	Phase Phase
	// Reason and Message explain Phase (API reasons, e.g. "WaitingForHolder").
	// An empty Reason means the claim is terminal and unchanged: keep the
	// stored reason and message.
	Reason  string
	Message string
	// SupersededBy names the claim that made this one obsolete.
	SupersededBy string
	// FencingToken is the token of the hold (Decision.Grant.Token) on a Held
	// verdict, and zero on any other: a claim that stops holding keeps the
	// token it held.
	FencingToken int64
	// ExpiresAt is when a pod-less hold ends unless renewed (Held only).
	ExpiresAt time.Time
	// Warning, when set, is a message to surface once: a pod-backed hold past
	// 80 % of MaxHold.
	Warning string
}

// Decision is everything the arbiter decided for one lock at one instant.
type Decision struct {
	// Holder and Waiting name the claims that hold and wait after this
	// decision ("" if none).
	Holder  string
	Waiting string
	// Grant is the grant record after this decision. GrantChanged says it
	// differs from the input grant (a new holder, or the lock freed), so the
	// controller must compare-and-swap it before writing any status.
	Grant        Grant
	GrantChanged bool
	// Verdicts hold one entry per input claim, ordered for writing: claims
	// that stop holding first, then the rest by name, and the claim that
	// becomes Held (a newly granted holder) last.
	Verdicts []Verdict
	// NextLook is the earliest future instant at which time alone changes the
	// decision (an expiry, or a max-hold threshold); zero if none.
	NextLook time.Time
}
