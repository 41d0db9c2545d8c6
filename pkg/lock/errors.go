package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The outcomes of Acquire other than a hold. Match them with errors.Is; get
// the details with errors.As and the matching *XxxError type.
var (
	// ErrSuperseded: a newer build made the claim obsolete. Its build should
	// stop without deploying; this is a normal outcome, not a failure.
	ErrSuperseded = errors.New("superseded by a newer build")
	// ErrEnded: the claim ended (Released or Expired, or was deleted) before
	// it held the lock.
	ErrEnded = errors.New("claim ended before it held the lock")
	// ErrTimeout: the context's deadline passed while the claim waited; the
	// claim was deleted.
	ErrTimeout = errors.New("timed out waiting for the lock")
	// ErrInvalidClaim: the claim cannot be created as given.
	ErrInvalidClaim = errors.New("invalid claim")
	// ErrNameTaken: the claim's BuildLock name (and its fallback) belong to
	// another claim.
	ErrNameTaken = errors.New("BuildLock name taken by another claim")
	// ErrClaimedByAnotherRun: a BuildLock of the same build, created by
	// another run of it (a re-run of the CI job), is still in the running:
	// two runs of one build never deploy at once.
	ErrClaimedByAnotherRun = errors.New("claimed by another run of the same build")
	// ErrLost: a held claim was deleted or stopped holding (released, expired,
	// force-released) while its holder still used it.
	ErrLost = errors.New("the hold was lost")
	// ErrNoHolder: force-release found no claim that holds the target.
	ErrNoHolder = errors.New("no claim holds the target")
	// ErrInvalidReason: the reason of a force-release, a freeze or an
	// override is empty, too long, or has control characters.
	ErrInvalidReason = errors.New("invalid reason")
)

// SupersededError is the ErrSuperseded outcome.
type SupersededError struct {
	// Namespace and Name identify the superseded BuildLock.
	Namespace, Name string
	// SupersededBy names the BuildLock that made it obsolete.
	SupersededBy string
	// Reason (SupersededByNewerBuild or DuplicateBuild) and Message are the
	// operator's.
	Reason, Message string
}

func (e *SupersededError) Error() string {
	msg := fmt.Sprintf("BuildLock %s/%s was superseded", e.Namespace, e.Name)
	if e.SupersededBy != "" {
		msg += " by " + e.SupersededBy
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is makes errors.Is(err, ErrSuperseded) true.
func (e *SupersededError) Is(target error) bool { return target == ErrSuperseded }

// EndedError is the ErrEnded outcome.
type EndedError struct {
	// Namespace and Name identify the BuildLock.
	Namespace, Name string
	// Phase is Released or Expired, or empty when the BuildLock was deleted.
	Phase buildlockv1.Phase
	// Reason is the operator's (PodFinished, PodGone, Expired, ...), or
	// ReasonDeleted.
	Reason, Message string
}

// ReasonDeleted is EndedError.Reason and LostError.Reason when the
// BuildLock was deleted.
const ReasonDeleted = "Deleted"

func (e *EndedError) Error() string {
	what := "ended"
	if e.Phase != "" {
		what = "ended " + string(e.Phase)
	}
	msg := fmt.Sprintf("BuildLock %s/%s %s", e.Namespace, e.Name, what)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is makes errors.Is(err, ErrEnded) true.
func (e *EndedError) Is(target error) bool { return target == ErrEnded }

// TimeoutError is the ErrTimeout outcome. It also matches
// context.DeadlineExceeded.
type TimeoutError struct {
	// Namespace and Name identify the BuildLock, which was deleted.
	Namespace, Name string
	// Waited is how long the claim waited.
	Waited time.Duration
	// Phase and Message are the claim's last status (Pending or Waiting).
	Phase   buildlockv1.Phase
	Message string
	// CleanupErr is set when the claim could not be deleted.
	CleanupErr error
}

func (e *TimeoutError) Error() string {
	msg := fmt.Sprintf("timed out after %s waiting for BuildLock %s/%s to hold its lock", e.Waited.Round(time.Second), e.Namespace, e.Name)
	if e.Message != "" {
		msg += " (last status: " + e.Message + ")"
	}
	if e.CleanupErr != nil {
		msg += "; deleting the claim failed: " + e.CleanupErr.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// Unwrap makes errors.Is(err, context.DeadlineExceeded) true.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// ClaimedByAnotherRunError is the ErrClaimedByAnotherRun outcome.
type ClaimedByAnotherRunError struct {
	// BuildLock is the other run's claim, as read; nil when Busy says why.
	BuildLock *buildlockv1.BuildLock
	// RunID is this run's id.
	RunID string
	// Busy, when set, says that another process of this run id and state
	// directory works on this claim right now (it holds the proof's file).
	Busy string
	// HandedOver says that BuildLock is this job's, taken by an earlier
	// acquire that handed it over to the job's later steps (Hold.Detach).
	HandedOver bool
}

// SameRunID reports whether the claim in the way carries this very run id:
// two jobs (or two processes) computed the same one, and each needs its
// own.
func (e *ClaimedByAnotherRunError) SameRunID() bool {
	return e.Busy != "" || e.BuildLock != nil && RunIDOf(e.BuildLock) == e.RunID
}

func (e *ClaimedByAnotherRunError) Error() string {
	if e.BuildLock == nil {
		return fmt.Sprintf("another acquire of this run (run %s) is at work on the claim (%s); two processes never share a claim", e.RunID, e.Busy)
	}
	bl := e.BuildLock
	phase := bl.Status.Phase
	if phase == "" {
		phase = buildlockv1.PhasePending
	}
	what := fmt.Sprintf("BuildLock %s/%s (%s, %s)", bl.Namespace, bl.Name, Describe(bl), phase)
	switch {
	case e.HandedOver:
		return fmt.Sprintf("%s was taken by an earlier acquire of this run (run %s), which handed it over to the job's later steps; "+
			"a claim is taken once", what, e.RunID)
	case e.SameRunID():
		return fmt.Sprintf("%s has this run's id (run %s) but was not created by this job (it cannot show the claim's proof); "+
			"two jobs that compute the same run id never share a claim", what, e.RunID)
	}
	theirs := RunIDOf(bl)
	if theirs == "" {
		theirs = "unknown"
	}
	return fmt.Sprintf("%s belongs to another run of this build (run %s, this is run %s); two runs of one build never deploy at once",
		what, theirs, e.RunID)
}

// Is makes errors.Is(err, ErrClaimedByAnotherRun) true.
func (e *ClaimedByAnotherRunError) Is(target error) bool { return target == ErrClaimedByAnotherRun }

// LostError is the ErrLost outcome.
type LostError struct {
	// Namespace and Name identify the BuildLock.
	Namespace, Name string
	// Phase is the claim's phase when it stopped holding, empty when it was
	// deleted.
	Phase buildlockv1.Phase
	// Reason is the operator's (Released with ForceReleased, Expired,
	// LockLost, ...), or ReasonDeleted.
	Reason, Message string
}

func (e *LostError) Error() string {
	msg := fmt.Sprintf("BuildLock %s/%s no longer holds its lock", e.Namespace, e.Name)
	switch {
	case e.Reason == ReasonDeleted:
		msg += ": it was deleted"
	case e.Phase != "":
		msg += fmt.Sprintf(": it is %s (%s)", e.Phase, e.Reason)
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }
