package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// 2. Liveness

// state is a live read of every claim, grant Lease, policy and pod.
type state struct {
	claims   map[LockKey][]buildlockv1.BuildLock
	leases   map[LockKey]*coordinationv1.Lease
	policies map[LockKey]SettlePolicy
	pods     map[string]map[string]*corev1.Pod // namespace → name → pod
}

func (h *harness) read(ctx context.Context, namespaces []string) (state, error) {
	s := state{claims: map[LockKey][]buildlockv1.BuildLock{}, leases: map[LockKey]*coordinationv1.Lease{},
		policies: map[LockKey]SettlePolicy{}, pods: map[string]map[string]*corev1.Pod{}}
	for _, ns := range namespaces {
		var policies buildlockv1.BuildLockPolicyList
		if err := h.c.List(ctx, &policies, client.InNamespace(ns)); err != nil {
			return s, err
		}
		for _, p := range policies.Items {
			sp := SettlePolicy{Ordering: p.Spec.Ordering}
			if p.Spec.MaxHold != nil {
				sp.MaxHold = p.Spec.MaxHold.Duration
			}
			s.policies[LockKey{ns, p.Name}] = sp
		}
		var claims buildlockv1.BuildLockList
		if err := h.c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
			return s, err
		}
		for _, bl := range claims.Items {
			k := LockKey{ns, bl.Spec.Target}
			s.claims[k] = append(s.claims[k], bl)
		}
		var leases coordinationv1.LeaseList
		if err := h.c.List(ctx, &leases, client.InNamespace(ns)); err != nil {
			return s, err
		}
		for i := range leases.Items {
			if l := &leases.Items[i]; strings.HasPrefix(l.Name, LeasePrefix) {
				s.leases[LockKey{ns, strings.TrimPrefix(l.Name, LeasePrefix)}] = l
			}
		}
		var pods corev1.PodList
		if err := h.c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return s, err
		}
		s.pods[ns] = map[string]*corev1.Pod{}
		for i := range pods.Items {
			s.pods[ns][pods.Items[i].Name] = &pods.Items[i]
		}
	}
	return s, nil
}

// problems lists, per lock, why it is not settled (see SettleProblems).
func (h *harness) problems(s state, locks []LockKey) map[LockKey][]string {
	out := map[LockKey][]string{}
	now := h.clock.Now()
	for _, k := range locks {
		if p := SettleProblems(s.claims[k], s.leases[k], s.pods[k.Namespace], s.policies[k], now); len(p) > 0 {
			out[k] = p
		}
	}
	return out
}

// waitSettled waits up to bound for every lock to settle and returns the
// state it settled in and how long that took; it fails the test, showing each
// unsettled lock's last events, when the bound passes.
func (h *harness) waitSettled(ctx context.Context, what string, namespaces []string, locks []LockKey, bound time.Duration) (state, time.Duration) {
	start := time.Now()
	var last map[LockKey][]string
	var s state
	for {
		var err error
		if s, err = h.read(ctx, namespaces); err == nil {
			if last = h.problems(s, locks); len(last) == 0 {
				return s, time.Since(start)
			}
		}
		if time.Since(start) > bound {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	keys := make([]LockKey, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %s", k, strings.Join(last[k], "; "))
		for _, e := range h.check.Around(Violation{Seq: len(h.check.History()) - 1, Lock: k}, 15, 0) {
			fmt.Fprintf(&b, "\n      %s", e)
		}
	}
	h.t.Errorf("LIVENESS (seed %d): %s: %d of %d locks not settled within %s:%s", h.o.seed, what, len(last), len(locks), bound, b.String())
	return s, -1
}

// settleAfterChaos: the faults stopped with one manager left running; every
// lock must settle within the bound, on that manager's own events (it is not
// restarted: a manager that dropped an event must not be rescued by a fresh
// start).
func (h *harness) settleAfterChaos(ctx context.Context) {
	_, took := h.waitSettled(ctx, "after the faults stopped", h.namespaces, h.targets, h.o.settleBound)
	if took < 0 {
		h.figure("liveness: NOT all %d locks settled within %s after the workload and the faults stopped", len(h.targets), h.o.settleBound)
		return
	}
	h.figure("liveness: all %d locks settled %.1fs after the workload and the faults stopped (bound %s)", len(h.targets), took.Seconds(), h.o.settleBound)
}

// drain ends each lock's holder (its pod Succeeds, or a pod-less claim is
// deleted by its owner) until every lock is free, and checks that each time
// the next claim takes over: the Waiting one (NewestWins), or the first in
// the queue, by status.queuedAt (Queue, Fifo).
func (h *harness) drain(ctx context.Context) {
	s, err := h.read(ctx, h.namespaces)
	if err != nil {
		h.t.Fatal(err)
	}
	work := newWorkload(h.c, h.o.seed, h.clock, h.ledger, h.check, h.targets)
	handOffs, frees, rounds := 0, 0, 0
	var slowest time.Duration
	for round := 1; round <= 4*maxLive; round++ {
		expect := map[LockKey]string{}
		ended := map[LockKey]time.Time{}
		for _, k := range h.targets {
			holder, next := holderAndNext(s.claims[k])
			if holder == nil {
				continue
			}
			expect[k] = ""
			if next != nil {
				expect[k] = next.Name
			}
			ended[k] = h.clock.Now()
			h.endHolder(ctx, work, holder)
		}
		if len(expect) == 0 {
			break
		}
		rounds++
		var took time.Duration
		if s, took = h.waitSettled(ctx, fmt.Sprintf("drain round %d", round), h.namespaces, h.targets, h.o.settleBound); took < 0 {
			break // reported; more rounds would only repeat it
		}
		for k, want := range expect {
			got := ""
			for _, bl := range s.claims[k] {
				if bl.Status.Phase == buildlockv1.PhaseHeld {
					got = bl.Name
				}
			}
			if got != want {
				h.t.Errorf("LIVENESS (seed %d): %s: after its holder ended, %q holds; the next claim %q should", h.o.seed, k, got, want)
				continue
			}
			if want == "" {
				frees++
				continue
			}
			handOffs++
			if _, heldAt, _ := h.check.Claim(k.Namespace, want); !heldAt.IsZero() {
				slowest = max(slowest, heldAt.Sub(ended[k]))
			}
		}
	}
	h.figure("drain: %d hand-offs to the next claim in %d rounds (slowest %s after the holder ended), %d locks freed", handOffs, rounds, slowest.Round(time.Millisecond), frees)
}

// holderAndNext returns a settled lock's holder and the claim that must
// take over when it ends: the one Waiting with the earliest place (with
// NewestWins there is one Waiting claim).
func holderAndNext(claims []buildlockv1.BuildLock) (holder, next *buildlockv1.BuildLock) {
	for i := range claims {
		switch bl := &claims[i]; bl.Status.Phase {
		case buildlockv1.PhaseHeld:
			holder = bl
		case buildlockv1.PhaseWaiting:
			if next == nil || placeOf(bl).Before(placeOf(next)) {
				next = bl
			}
		}
	}
	return holder, next
}

func placeOf(bl *buildlockv1.BuildLock) time.Time {
	if bl.Status.QueuedAt == nil {
		return time.Time{}
	}
	return bl.Status.QueuedAt.Time
}

// endHolder ends a holding build the way a pipeline does: its pod Succeeds,
// or the owner of a pod-less claim deletes it.
func (h *harness) endHolder(ctx context.Context, w *workload, bl *buildlockv1.BuildLock) {
	if ref := bl.Spec.PodRef; ref != nil {
		p := &wPod{ns: bl.Namespace, name: ref.Name}
		h.ledger.PodFinishing(p.ns, p.name, true)
		if err := w.setPodPhase(ctx, p, corev1.PodSucceeded); err != nil {
			h.t.Errorf("finishing pod %s/%s: %v", p.ns, p.name, err)
		}
		return
	}
	h.ledger.RequestDelete(bl.Namespace, bl.Name)
	if err := h.c.Delete(ctx, bl); err != nil && !apierrors.IsNotFound(err) {
		h.t.Errorf("deleting %s/%s: %v", bl.Namespace, bl.Name, err)
	}
}

// ---------------------------------------------------------------------------
// 4. Restart

// restartCheck: with many live locks (a holder and a waiter each), the
// manager is killed and a new one started. The holders must not change (the
// new manager writes no grant and no status for them), and right after its
// cache syncs it must hand over the locks whose holders just ended.
func (h *harness) restartCheck(ctx context.Context) {
	const nsCount = 5
	var namespaces []string
	for i := range nsCount {
		ns := fmt.Sprintf("restart-%d", i)
		h.createNamespace(ctx, ns)
		namespaces = append(namespaces, ns)
	}
	w := newWorkload(h.c, h.o.seed, h.clock, h.ledger, h.check, nil)
	locks := make([]LockKey, h.o.locks)
	for i := range locks {
		locks[i] = LockKey{namespaces[i%nsCount], fmt.Sprintf("t-%03d", i)}
	}
	createStart := time.Now()
	h.parallel(len(locks), func(i int) error {
		k := locks[i]
		// The build started now by the API server's clock, the one its
		// creationTimestamp is read on (the API servers run on this
		// machine, unwarped). The workload's clock has run ahead by the
		// warps: stamps from it would all be capped at creation plus the
		// timestamp skew, and the two claims of a lock would tie.
		stamp := time.Now()
		for j, repo := range []string{"acme/shop", "acme/web"} {
			name := fmt.Sprintf("%s-%d", strings.ReplaceAll(repo, "/", "-"), i)
			spec := buildlockv1.BuildLockSpec{Target: k.Target, Repo: repo, Branch: "main", Build: 1, Timestamp: micro(stamp.Add(time.Duration(j) * time.Millisecond))}
			if j == 0 && i%5 == 4 {
				spec.ExpiresAfter = &metav1.Duration{Duration: time.Hour} // pod-less
			} else {
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: "pod-" + name},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
				if err := h.c.Create(ctx, pod); err != nil {
					return err
				}
				h.ledger.PodCreated(pod.Namespace, pod.Name, pod.UID)
				spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
			}
			h.ledger.WroteSpec(k.Namespace, name, spec)
			if err := h.c.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: name}, Spec: spec}); err != nil {
				return err
			}
		}
		return nil
	})
	before, _ := h.waitSettled(ctx, "restart check: granting", namespaces, locks, 120*time.Second)
	holders := holderSet(before, locks)
	for _, k := range locks {
		if hd := holders[k]; hd.name == "" || hd.waiting == "" {
			h.t.Fatalf("restart check: before the restart, %s has holder %q and waiter %q; want both", k, hd.name, hd.waiting)
		}
	}
	h.t.Logf("restart check: %d live locks created and granted in %s", len(locks), time.Since(createStart).Round(time.Millisecond))

	// Kill the manager; start a new one; as soon as its cache has synced,
	// end the holders of some locks.
	h.stopAll()
	startAt := time.Now()
	m := h.startManager(ctx, 0, "")
	syncedAt := h.clock.Now()
	startTook := time.Since(startAt)
	pick := rand.New(rand.NewPCG(h.o.seed, 0x72657374617274)).Perm(len(locks))[:h.o.handOffs]
	ended := map[LockKey]string{}
	// Each hand-off writes the new holder's status, and the old holder's
	// end if its claim is still there: a pod-backed holder's pod finishes
	// (Released), a pod-less holder's claim is deleted (no status to write).
	wantStatuses := 0
	for _, i := range pick {
		k := locks[i]
		ended[k] = holders[k].waiting
		for _, bl := range before.claims[k] {
			if bl.Name == holders[k].name {
				h.endHolder(ctx, w, &bl)
				wantStatuses++
				if bl.Spec.PodRef != nil {
					wantStatuses++
				}
			}
		}
	}

	// Every ended lock goes to its waiter within the bound.
	var first, last time.Duration
	deadline := time.Now().Add(h.o.handOffTime)
	for {
		pending := 0
		first, last = 0, 0
		for k, waiter := range ended {
			phase, heldAt, _ := h.check.Claim(k.Namespace, waiter)
			if isTerminal(phase) {
				h.t.Errorf("RESTART (seed %d): %s: the waiting claim %s ended %s instead of taking over", h.o.seed, k, waiter, phase)
				delete(ended, k)
				continue
			}
			if phase != buildlockv1.PhaseHeld {
				pending++
				continue
			}
			d := heldAt.Sub(syncedAt)
			if first == 0 || d < first {
				first = d
			}
			last = max(last, d)
		}
		if pending == 0 {
			if first > h.o.firstHandOff {
				h.t.Errorf("RESTART (seed %d): the first hand-off came %.2fs after the new manager's cache synced; bound %s", h.o.seed, first.Seconds(), h.o.firstHandOff)
			}
			break
		}
		if time.Now().After(deadline) {
			h.t.Errorf("RESTART (seed %d): %d of %d hand-offs not done %s after the new manager's cache synced", h.o.seed, pending, len(ended), h.o.handOffTime)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The others kept their holder, token and waiter; the new manager wrote
	// one grant per hand-off and wantStatuses statuses.
	time.Sleep(2 * time.Second)
	after, _ := h.waitSettled(ctx, "restart check: after the restart", namespaces, locks, h.o.settleBound)
	changed := 0
	for _, k := range locks {
		if _, isEnded := ended[k]; isEnded {
			continue
		}
		b, a := holders[k], holderSet(after, []LockKey{k})[k]
		if b != a {
			changed++
			if changed <= 5 {
				h.t.Errorf("RESTART (seed %d): %s changed over the restart: before %+v, after %+v", h.o.seed, k, b, a)
			}
		}
	}
	// Only the restart check's namespaces: the new manager may still end
	// holds and delete finished claims and idle Leases in the workload's.
	grants := m.restartWrites.get("update lease") + m.restartWrites.get("create lease")
	statuses := m.restartWrites.get("update/status buildlock")
	if grants != len(ended) {
		h.t.Errorf("RESTART (seed %d): the new manager wrote %d grants for %d hand-offs (writes: %s)", h.o.seed, grants, len(ended), m.restartWrites)
	}
	if statuses != wantStatuses {
		h.t.Errorf("RESTART (seed %d): the new manager wrote %d statuses for %d hand-offs; want %d (the new holders', and the ends of the holders whose pods finished) (writes: %s)",
			h.o.seed, statuses, len(ended), wantStatuses, m.restartWrites)
	}
	h.figure("restart: %d live locks; holders unchanged over the restart: %d of %d (changed %d); new manager started and synced in %.1fs; "+
		"%d holders ended right after: first hand-off %.2fs and last %.2fs after the cache synced; its writes: %s",
		len(locks), len(locks)-len(ended)-changed, len(locks)-len(ended), changed, startTook.Seconds(), len(ended), first.Seconds(), last.Seconds(), m.restartWrites)
}

// holding is one lock's holder as a live read shows it.
type holding struct {
	name, lease, waiting string
	token                int64
}

func holderSet(s state, locks []LockKey) map[LockKey]holding {
	out := map[LockKey]holding{}
	for _, k := range locks {
		var hd holding
		for _, bl := range s.claims[k] {
			switch bl.Status.Phase {
			case buildlockv1.PhaseHeld:
				hd.name, hd.token = bl.Name, bl.Status.FencingToken
			case buildlockv1.PhaseWaiting:
				hd.waiting = bl.Name
			}
		}
		if l := s.leases[k]; l != nil && l.Spec.HolderIdentity != nil {
			hd.lease = *l.Spec.HolderIdentity
		}
		if hd.name != "" {
			out[k] = hd
		}
	}
	return out
}

// parallel runs do(0..n-1) on eight goroutines and fails the test on the
// first error.
func (h *harness) parallel(n int, do func(int) error) {
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, n)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		h.t.Fatalf("creating the restart check's locks: %v", err)
	}
}
