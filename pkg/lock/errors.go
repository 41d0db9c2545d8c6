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

// ReasonDeleted is EndedError.Reason when the BuildLock was deleted while it
// waited.
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
