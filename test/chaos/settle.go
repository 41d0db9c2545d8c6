package chaos

import (
	"fmt"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// SettlePolicy is what SettleProblems needs of a lock's policy.
type SettlePolicy struct {
	// Ordering is the lock's ordering ("" is NewestWins).
	Ordering buildlockv1.Ordering
	// MaxHold bounds every hold (zero: none).
	MaxHold time.Duration
}

// SettleProblems says why one lock is not settled, or nothing when it is. It
// is a pure function of the lock's claims, its grant Lease (nil if none), the
// pods of its namespace by name, its policy, and now (the workload's clock).
// A lock is settled when:
//
//   - no claim is Pending (every claim was decided), and every claim that
//     is not terminal has a status computed from its latest spec
//     (status.observedGeneration: a renewal was seen);
//   - every Held or Waiting claim is alive: its pod exists (with the UID of
//     the reference, if it names one) and has not Succeeded or Failed; a
//     pod-less holder is alive until max(acquiredAt, renewedAt) +
//     expiresAfter; any holder until acquiredAt plus the maximum hold (a
//     dead build must neither keep nor wait for the lock);
//   - at most one claim is Held and the Lease names exactly that claim with
//     its fencing token; when none is Held the Lease names nobody;
//   - claims wait only behind a holder: with NewestWins at most one, with
//     Queue at most one per line, with Fifo any number, each with its place
//     (status.queuedAt) when the ordering queues.
//
// So with NewestWins the eligible claims (alive and not terminal) are
// exactly the holder and at most one waiter; with Queue, the holder and one
// waiter per line, in the order of their places. With the checker's rules
// on supersession and the queue's order, and a hand-off to the first waiter
// (TestChaos drains every lock), this is "the newest eligible claim (or the
// first in the queue) gets the lock, or it is free when none is eligible".
// No pre-emption: a live holder keeps the lock even when others wait.
func SettleProblems(claims []buildlockv1.BuildLock, lease *coordinationv1.Lease, pods map[string]*corev1.Pod, p SettlePolicy, now time.Time) []string {
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
		if bl.Status.ObservedGeneration != bl.Generation {
			problems = append(problems, fmt.Sprintf("%s's status was computed from generation %d, not its latest spec (%d)", bl.Name, bl.Status.ObservedGeneration, bl.Generation))
		}
		if why := notAlive(bl, pods, p.MaxHold, now); why != "" {
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
	problems = append(problems, waitProblems(waiting, p.Ordering)...)
	if len(waiting) > 0 && len(held) == 0 {
		problems = append(problems, fmt.Sprintf("%s is Waiting behind no holder", waiting[0].Name))
	}
	return problems
}

// waitProblems says what is wrong with the waiting claims under ordering.
func waitProblems(waiting []*buildlockv1.BuildLock, ordering buildlockv1.Ordering) []string {
	var problems []string
	switch ordering {
	case buildlockv1.OrderingQueue:
		byLine := map[line]int{}
		for _, w := range waiting {
			byLine[lineOf(w.Spec)]++
		}
		var lines []string
		for l, n := range byLine {
			if n > 1 {
				lines = append(lines, fmt.Sprintf("%s has %d claims Waiting", l, n))
			}
		}
		sort.Strings(lines)
		problems = append(problems, lines...)
	case buildlockv1.OrderingFifo:
	default:
		if len(waiting) > 1 {
			problems = append(problems, fmt.Sprintf("%d claims are Waiting", len(waiting)))
		}
	}
	if ordering == buildlockv1.OrderingQueue || ordering == buildlockv1.OrderingFifo {
		for _, w := range waiting {
			if w.Status.QueuedAt == nil {
				problems = append(problems, fmt.Sprintf("%s waits in a queue with no place (status.queuedAt)", w.Name))
			}
		}
	}
	return problems
}

// notAlive says why a Held or Waiting claim's build is over, or "".
func notAlive(bl *buildlockv1.BuildLock, pods map[string]*corev1.Pod, maxHold time.Duration, now time.Time) string {
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
	}
	if phaseOf(bl.Status.Phase) != buildlockv1.PhaseHeld || bl.Status.AcquiredAt == nil {
		return ""
	}
	acquired := bl.Status.AcquiredAt.Time
	if maxHold > 0 && !now.Before(acquired.Add(maxHold)) {
		return fmt.Sprintf("its maximum hold ended at %s", acquired.Add(maxHold).Format(time.StampMilli))
	}
	if bl.Spec.PodRef != nil {
		return ""
	}
	from := acquired
	if bl.Status.RenewedAt != nil && bl.Status.RenewedAt.After(from) {
		from = bl.Status.RenewedAt.Time
	}
	if expiry := from.Add(expiresAfter(bl.Spec)); !now.Before(expiry) {
		return fmt.Sprintf("its hold expired at %s", expiry.Format(time.StampMilli))
	}
	return ""
}
