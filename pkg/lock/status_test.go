package lock

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

var statusNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// claimOn is a claim on target in namespace ns created age ago, in phase
// (with token when Held, and queuedAt when queued is not zero).
func claimOn(ns, target, name string, build int64, phase buildlockv1.Phase, token int64, age, queued time.Duration) buildlockv1.BuildLock {
	bl := buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name),
			CreationTimestamp: metav1.NewTime(statusNow.Add(-age))},
		Spec:   buildlockv1.BuildLockSpec{Target: target, Repo: "acme/" + name, Branch: "main", Build: build},
		Status: buildlockv1.BuildLockStatus{Phase: phase, FencingToken: token},
	}
	if queued != 0 {
		at := metav1.NewMicroTime(statusNow.Add(-queued))
		bl.Status.QueuedAt = &at
	}
	return bl
}

func policy(ns, target string, ordering buildlockv1.Ordering) buildlockv1.BuildLockPolicy {
	return buildlockv1.BuildLockPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target},
		Spec:       buildlockv1.BuildLockPolicySpec{Ordering: ordering},
	}
}

func TestSummarize(t *testing.T) {
	const w, p, h = buildlockv1.PhaseWaiting, buildlockv1.PhasePending, buildlockv1.PhaseHeld
	claims := []buildlockv1.BuildLock{
		// ci/staging, Queue: a holder and three queued lines, one not decided yet.
		claimOn("ci", "staging", "web", 7, w, 0, 3*time.Minute, 2*time.Minute),
		claimOn("ci", "staging", "shop", 41, h, 5, 10*time.Minute, 0),
		claimOn("ci", "staging", "api", 3, w, 0, 5*time.Minute, 4*time.Minute),
		claimOn("ci", "staging", "docs", 1, "", 0, time.Second, 0),
		claimOn("ci", "staging", "old", 2, buildlockv1.PhaseReleased, 4, time.Hour, 0),
		// ci/prod, no policy: NewestWins, one waiting claim without queuedAt.
		claimOn("ci", "prod", "cli", 9, w, 0, time.Minute, 0),
		// apps/staging, Fifo, and a hand-off half written: two shown Held.
		claimOn("apps", "staging", "x", 1, h, 1, 2*time.Hour, 0),
		claimOn("apps", "staging", "y", 2, h, 2, time.Hour, 0),
	}
	locks := Summarize(claims, []buildlockv1.BuildLockPolicy{
		policy("ci", "staging", buildlockv1.OrderingQueue),
		policy("apps", "staging", buildlockv1.OrderingFifo),
		policy("ci", "unused", buildlockv1.OrderingFifo),
		policy("other", "prod", buildlockv1.OrderingQueue),
	})

	type row struct {
		lock     string
		ordering buildlockv1.Ordering
		holder   string
		queue    []string
		claims   int
	}
	var got []row
	for _, l := range locks {
		r := row{lock: l.Namespace + "/" + l.Target, ordering: l.Ordering, claims: len(l.Claims)}
		if l.Holder != nil {
			r.holder = l.Holder.Name
		}
		for i, q := range l.Queue {
			if q.Position != i+1 {
				t.Errorf("%s: %s at index %d has position %d", r.lock, q.Name, i, q.Position)
			}
			r.queue = append(r.queue, q.Name)
		}
		got = append(got, r)
	}
	want := []row{
		{lock: "apps/staging", ordering: buildlockv1.OrderingFifo, holder: "y", claims: 2},
		{lock: "ci/prod", ordering: buildlockv1.OrderingNewestWins, queue: []string{"cli"}, claims: 1},
		{lock: "ci/staging", ordering: buildlockv1.OrderingQueue, holder: "shop", queue: []string{"api", "web", "docs"}, claims: 5},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Summarize() =\n%v\nwant\n%v", got, want)
	}
	staging := locks[2]
	if staging.Claims[0].Name != "docs" || staging.Claims[0].Phase != buildlockv1.PhasePending || staging.Holder.FencingToken != 5 {
		t.Errorf("ci/staging claims, newest first: %+v; holder %+v", staging.Claims, staging.Holder)
	}
}

// TestCompareQueuedIsATotalOrder checks the comparator's laws over random
// claims: antisymmetric, transitive, and zero only for one claim (names are
// unique), so that the queue's order never depends on the order claims
// were read in.
func TestCompareQueuedIsATotalOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	random := func(i int) *buildlockv1.BuildLock {
		phase := []buildlockv1.Phase{buildlockv1.PhaseWaiting, buildlockv1.PhasePending, ""}[r.IntN(3)]
		var queued time.Duration // none, or one of three instants, so that ties occur
		if r.IntN(3) > 0 {
			queued = time.Duration(1+r.IntN(3)) * time.Second
		}
		bl := claimOn("ci", "staging", fmt.Sprintf("c%d", i), 1, phase, 0, time.Minute, queued)
		return &bl
	}
	for round := range 200 {
		claims := make([]*buildlockv1.BuildLock, 6)
		for i := range claims {
			claims[i] = random(i)
		}
		for _, a := range claims {
			for _, b := range claims {
				if ab, ba := compareQueued(a, b), compareQueued(b, a); ab != -ba || (ab == 0) != (a == b) {
					t.Fatalf("round %d: compare(%s, %s) = %d, compare(%s, %s) = %d", round, a.Name, b.Name, ab, b.Name, a.Name, ba)
				}
				for _, c := range claims {
					if compareQueued(a, b) < 0 && compareQueued(b, c) < 0 && compareQueued(a, c) >= 0 {
						t.Fatalf("round %d: %s < %s < %s but not %s < %s", round, a.Name, b.Name, c.Name, a.Name, c.Name)
					}
				}
			}
		}
		shuffled := slices.Clone(claims)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if !slices.Equal(queueOf(claims), queueOf(shuffled)) {
			t.Fatalf("round %d: the queue depends on the order claims were read in", round)
		}
	}
}

func TestPlaceOf(t *testing.T) {
	const w = buildlockv1.PhaseWaiting
	claims := []buildlockv1.BuildLock{
		claimOn("ci", "staging", "shop", 41, buildlockv1.PhaseHeld, 5, 10*time.Minute, 0),
		claimOn("ci", "staging", "api", 3, w, 0, 5*time.Minute, 4*time.Minute),
		claimOn("ci", "staging", "web", 7, w, 0, 3*time.Minute, 2*time.Minute),
	}
	ptrs := []*buildlockv1.BuildLock{&claims[0], &claims[1], &claims[2]}
	if got, want := placeOf(ptrs, &claims[2]), (Place{Position: 2, Waiting: 2, Ahead: "api", Holder: "shop", Token: 5}); got == nil || *got != want {
		t.Errorf("placeOf(web) = %+v, want %+v", got, want)
	}
	if got := placeOf(ptrs, &claims[1]); got == nil || got.Position != 1 || got.Ahead != "" {
		t.Errorf("placeOf(api) = %+v, want position 1 with nobody ahead", got)
	}
	if got := placeOf(ptrs, &claims[0]); got != nil {
		t.Errorf("the holder has a place in the queue: %+v", got)
	}
}
