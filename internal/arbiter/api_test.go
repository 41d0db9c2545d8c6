package arbiter_test

import (
	"testing"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// TestReasonsAndPhasesAreTheAPIs keeps the arbiter's copies (it imports only
// the standard library) equal to the API's, which the controller writes.
func TestReasonsAndPhasesAreTheAPIs(t *testing.T) {
	for _, pair := range [][2]string{
		{arbiter.ReasonAcquired, buildlockv1.ReasonAcquired},
		{arbiter.ReasonWaitingForHolder, buildlockv1.ReasonWaitingForHolder},
		{arbiter.ReasonQueued, buildlockv1.ReasonQueued},
		{arbiter.ReasonSupersededByNewerBuild, buildlockv1.ReasonSupersededByNewerBuild},
		{arbiter.ReasonDuplicateBuild, buildlockv1.ReasonDuplicateBuild},
		{arbiter.ReasonPodFinished, buildlockv1.ReasonPodFinished},
		{arbiter.ReasonPodGone, buildlockv1.ReasonPodGone},
		{arbiter.ReasonLockLost, buildlockv1.ReasonLockLost},
		{arbiter.ReasonExpired, buildlockv1.ReasonExpired},
		{arbiter.ReasonMaxHoldExceeded, buildlockv1.ReasonMaxHoldExceeded},
		{arbiter.ReasonForceReleased, buildlockv1.ReasonForceReleased},
		{arbiter.ReasonDeleted, buildlockv1.ReasonDeleted},
		{arbiter.ReasonLineOwnedByOther, buildlockv1.ReasonLineOwnedByOther},
		{arbiter.ReasonBuildJumpTooLarge, buildlockv1.ReasonBuildJumpTooLarge},
		{arbiter.ReasonFrozen, buildlockv1.ReasonFrozen},
		{arbiter.ReasonFreezeStarted, buildlockv1.ReasonFreezeStarted},
		{arbiter.ReasonLineMemoryFull, buildlockv1.ReasonLineMemoryFull},
		{string(arbiter.Pending), string(buildlockv1.PhasePending)},
		{string(arbiter.Waiting), string(buildlockv1.PhaseWaiting)},
		{string(arbiter.Held), string(buildlockv1.PhaseHeld)},
		{string(arbiter.Superseded), string(buildlockv1.PhaseSuperseded)},
		{string(arbiter.Released), string(buildlockv1.PhaseReleased)},
		{string(arbiter.Expired), string(buildlockv1.PhaseExpired)},
		{string(arbiter.NewestWins), string(buildlockv1.OrderingNewestWins)},
		{string(arbiter.Queue), string(buildlockv1.OrderingQueue)},
		{string(arbiter.Fifo), string(buildlockv1.OrderingFifo)},
	} {
		if pair[0] != pair[1] {
			t.Errorf("arbiter has %q where the API has %q", pair[0], pair[1])
		}
	}
}

// TestValuesAreTheAPIs keeps the arbiter's copies of the API's defaults and
// bounds equal to api/v1alpha1's.
func TestValuesAreTheAPIs(t *testing.T) {
	for _, pair := range [][2]any{
		{arbiter.DefaultExpiresAfter, buildlockv1.DefaultExpiresAfter},
		{arbiter.DefaultMaxTimestampSkew, buildlockv1.MaxTimestampSkew},
		{arbiter.DefaultMaxBuildJump, buildlockv1.DefaultMaxBuildJump},
		{arbiter.DefaultGrantRetention, buildlockv1.DefaultGrantRetention},
		{arbiter.MaxQuotedLength, buildlockv1.MaxQuotedLength},
		{arbiter.MaxOverrideFor, buildlockv1.MaxOverrideFor},
	} {
		if pair[0] != pair[1] {
			t.Errorf("arbiter has %v where the API has %v", pair[0], pair[1])
		}
	}
}
