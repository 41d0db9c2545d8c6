package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "how long the workload and faults run (env CHAOS_DURATION); 0 runs the short version that `make test` runs")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the workload and the fault schedule (env CHAOS_SEED); 0 picks one at random and prints it")
	flagTargets  = flag.Int("chaos.targets", 0, "targets (locks) the workload contends for; 0: 20 in a long run, 8 in the short one")
	flagLocks    = flag.Int("chaos.locks", 0, "live locks in the restart check; 0: 500 in a long run, 100 in the short one")
	flagFaults   = flag.Float64("chaos.faults", 0.02, "probability of each injected fault kind per write (four kinds) and per live read (two kinds)")
	flagBreak    = flag.String("chaos.break", "", "break the operator on purpose, to watch the checker fail: cas (grant Lease updates become blind merge patches, last writer wins) or decide (the waiting claim is shown Held too)")
	flagHistory  = flag.String("chaos.history", "", "write every checked event to this file (a failing run writes it to the temp directory anyway)")
	flagReport   = flag.String("chaos.report", "", "write the figures to this file")
	flagPodReads = flag.Bool("chaos.pod-read-faults", true, "fault the managers' live reads of pods too (a failed read must count as alive and be retried)")
)

// options of one run, from the flags (or CHAOS_* variables).
type options struct {
	seed                uint64
	duration            time.Duration
	long                bool
	namespaces, targets int
	locks, handOffs     int
	faultRate           float64
	maxSkew, ttl        time.Duration
	settleBound         time.Duration
	// In the restart check: the first hand-off and all of them must be done
	// within these of the new manager's cache sync.
	firstHandOff, handOffTime time.Duration
}

const shortDuration = 20 * time.Second

func resolveOptions(t *testing.T) options {
	o := options{duration: *flagDuration, seed: *flagSeed, faultRate: *flagFaults, maxSkew: 2 * time.Second, ttl: 5 * time.Second,
		settleBound: 20 * time.Second, handOffTime: 10 * time.Second, firstHandOff: 5 * time.Second}
	if v := os.Getenv("CHAOS_DURATION"); o.duration == 0 && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DURATION=%q: %v", v, err)
		}
		o.duration = d
	}
	if v := os.Getenv("CHAOS_SEED"); o.seed == 0 && v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		o.seed = s
	}
	if o.seed == 0 {
		o.seed = rand.Uint64N(1_000_000_000) + 1
	}
	o.long = o.duration > shortDuration
	if o.duration == 0 {
		o.duration = shortDuration
	}
	o.namespaces, o.targets, o.locks = 2, 8, 100
	if o.long {
		o.namespaces, o.targets, o.locks = 4, 20, 500
		o.handOffTime = 20 * time.Second // behind the new manager's first pass over 500 locks
	}
	if *flagTargets > 0 {
		o.targets = *flagTargets
	}
	if *flagLocks > 0 {
		o.locks = *flagLocks
	}
	o.handOffs = max(1, o.locks/10)
	return o
}

// harness is one chaos run: the API server, the checker and its watches, the
// workload, and the managers the fault schedule starts and kills.
type harness struct {
	t      *testing.T
	o      options
	cfg    *rest.Config
	c      client.Client // direct (uncached), fault-free: the workload's and the test's
	clock  *warpClock
	ledger *Ledger
	check  *Checker
	faults *faultSet

	namespaces []string // the workload's
	targets    []LockKey

	mu        sync.Mutex
	running   []*managerCtl
	nextID    int
	started   int
	killed    int
	zombies   int
	warps     int
	warpTotal time.Duration
	split     time.Duration // time with two or more managers running
	changedAt time.Time
	watchRV   map[string]uint64 // last resourceVersion each watch delivered
	watchErr  []string
	figures   []string
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos test runs against a real API server; skipped with -short")
	}
	logf.SetLogger(logr.Discard())
	o := resolveOptions(t)
	t.Logf("chaos seed %d: rerun with `make chaos SEED=%d DURATION=%s` or `go test ./test/chaos -run TestChaos -chaos.seed=%d -chaos.duration=%s`",
		o.seed, o.seed, o.duration, o.seed, o.duration)
	begin := time.Now()

	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the API server (run `make envtest`): %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping the API server: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	h := newHarness(t, cfg, o)
	defer h.stopAll() // also when a phase fails the test
	h.createNamespaces(ctx)
	h.startWatches(ctx)
	defer h.report()

	// 1. The workload and the faults, together.
	h.chaos(ctx)
	if len(h.check.Violations()) > 0 {
		h.stopAll()
		h.barrier(ctx)
		return // the report shows them; the later phases would add noise
	}
	// 2. Liveness: with the faults and the workload stopped, every lock
	// settles within a bound, under the one manager left.
	h.settleAfterChaos(ctx)
	// 3. Every lock hands over to its waiter until it is free.
	h.drain(ctx)
	// 4. A new manager over many live locks keeps every holder and hands over
	// at once.
	h.restartCheck(ctx)

	h.stopAll()
	h.barrier(ctx)
	h.check.CheckGrantsCoverHolds()
	h.figure("run: %s in total (chaos %s)", time.Since(begin).Round(time.Second), o.duration)
}

func newHarness(t *testing.T, cfg *rest.Config, o options) *harness {
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	clock := &warpClock{}
	ledger := NewLedger()
	h := &harness{
		t: t, o: o, cfg: cfg, c: c, clock: clock, ledger: ledger,
		// Managers' clocks run up to maxSkew ahead; 100ms more for the
		// microsecond truncation of stored times and the reconcile's own
		// reading of its clock before it writes.
		check: NewChecker(ledger, o.ttl, o.maxSkew+100*time.Millisecond, clock.Now),
		faults: &faultSet{
			plan:    &faultPlan{rng: rand.New(rand.NewPCG(o.seed, 0x6661756c7473)), writeRate: o.faultRate, readRate: o.faultRate, podReads: *flagPodReads, injected: newCounters()},
			refused: newCounters(), zombie: newCounters(),
			breakCAS: *flagBreak == "cas", breakDecide: *flagBreak == "decide",
		},
		watchRV: map[string]uint64{},
	}
	if *flagBreak != "" && !h.faults.breakCAS && !h.faults.breakDecide {
		t.Fatalf("-chaos.break=%q: want cas or decide", *flagBreak)
	}
	return h
}

func (h *harness) figure(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.figures = append(h.figures, fmt.Sprintf(format, args...))
}

func (h *harness) createNamespaces(ctx context.Context) {
	for i := range h.o.namespaces {
		ns := fmt.Sprintf("chaos-%d", i)
		h.createNamespace(ctx, ns)
		h.namespaces = append(h.namespaces, ns)
	}
	for i := range h.o.targets {
		ns := h.namespaces[i%len(h.namespaces)]
		h.targets = append(h.targets, LockKey{Namespace: ns, Target: fmt.Sprintf("env-%d", i)})
	}
}

func (h *harness) createNamespace(ctx context.Context, ns string) {
	if err := h.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		h.t.Fatalf("creating namespace %s: %v", ns, err)
	}
}

// ---------------------------------------------------------------------------
// Watches

// startWatches feeds the checker: one watch on all BuildLocks and one on all
// Leases, each from the resourceVersion of an initial list, so that every
// event arrives once and in the API server's order.
func (h *harness) startWatches(ctx context.Context) {
	wc, err := client.NewWithWatch(h.cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		h.t.Fatal(err)
	}
	var claims buildlockv1.BuildLockList
	if err := wc.List(ctx, &claims); err != nil {
		h.t.Fatal(err)
	}
	for i := range claims.Items {
		h.check.ObserveClaim(watch.Added, &claims.Items[i])
	}
	var leases coordinationv1.LeaseList
	if err := wc.List(ctx, &leases); err != nil {
		h.t.Fatal(err)
	}
	go h.watchLoop(ctx, wc, "BuildLock", &buildlockv1.BuildLockList{}, claims.ResourceVersion, func(typ watch.EventType, obj runtime.Object) {
		if bl, ok := obj.(*buildlockv1.BuildLock); ok {
			h.check.ObserveClaim(typ, bl)
		}
	})
	go h.watchLoop(ctx, wc, "Lease", &coordinationv1.LeaseList{}, leases.ResourceVersion, func(typ watch.EventType, obj runtime.Object) {
		if l, ok := obj.(*coordinationv1.Lease); ok && (strings.HasPrefix(l.Namespace, "chaos-") || strings.HasPrefix(l.Namespace, "restart-")) {
			h.check.ObserveLease(typ, l)
		}
	})
}

func (h *harness) watchLoop(ctx context.Context, wc client.WithWatch, kind string, list client.ObjectList, rv string, handle func(watch.EventType, runtime.Object)) {
	for ctx.Err() == nil {
		w, err := wc.Watch(ctx, list, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if status, ok := ev.Object.(*metav1.Status); ok && status.Code == 410 {
					h.mu.Lock()
					h.watchErr = append(h.watchErr, fmt.Sprintf("the %s watch expired at resourceVersion %s: the checker missed events", kind, rv))
					h.mu.Unlock()
					w.Stop()
					return
				}
				break
			}
			obj, ok := ev.Object.(client.Object)
			if !ok {
				continue
			}
			if ev.Type != watch.Bookmark {
				handle(ev.Type, ev.Object)
			}
			rv = obj.GetResourceVersion()
			if n, err := strconv.ParseUint(rv, 10, 64); err == nil {
				h.mu.Lock()
				h.watchRV[kind] = n
				h.mu.Unlock()
			}
		}
		w.Stop()
	}
}

// barrier returns once both watches delivered a write made after everything
// before it, so that the checker has judged the whole history. It relies on
// resourceVersions of one etcd growing, which envtest's single etcd gives.
func (h *harness) barrier(ctx context.Context) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: h.namespaces[0], GenerateName: "chaos-barrier-"}}
	if err := h.c.Create(ctx, lease); err != nil {
		h.t.Errorf("barrier: %v", err)
		return
	}
	want, _ := strconv.ParseUint(lease.ResourceVersion, 10, 64)
	var claims buildlockv1.BuildLockList
	var claimWant uint64
	if err := h.c.List(ctx, &claims, client.Limit(1)); err == nil && len(claims.Items) > 0 {
		bl := &claims.Items[0]
		patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"chaos.buildlock.io/barrier":%q}}}`, time.Now().Format(time.RFC3339Nano)))
		if err := h.c.Patch(ctx, bl, client.RawPatch(types.MergePatchType, patch)); err == nil {
			claimWant, _ = strconv.ParseUint(bl.ResourceVersion, 10, 64)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		done := h.watchRV["Lease"] >= want && h.watchRV["BuildLock"] >= claimWant
		h.mu.Unlock()
		if done {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Errorf("the checker's watches did not catch up within 15s")
}

// ---------------------------------------------------------------------------
// Managers

// startManager starts a manager with its own clock skew, API faults, and, for
// a zombie, a freezer.
// freezePoint is "" for a healthy manager, else where the zombie freezes.
func (h *harness) startManager(ctx context.Context, skew time.Duration, freezePoint string) *managerCtl {
	h.mu.Lock()
	h.nextID++
	m := &managerCtl{id: h.nextID, skew: skew, writes: newCounters()}
	h.mu.Unlock()
	zombie := freezePoint != ""
	workers := 4
	if zombie {
		m.zombie = newFreezer(freezePoint)
		workers = 8 // more reconcilers caught mid-flight
	}
	opts := testenv.ManagerOptions{
		Clock:       skewClock{base: h.clock, skew: skew},
		NewClient:   testenv.InterceptClient(*h.faults.interceptor(m)),
		Decide:      h.faults.decide(m),
		FinishedTTL: h.o.ttl,
		Workers:     workers,
	}
	var mgr *testenv.Manager
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if mgr, err = testenv.StartManager(ctx, h.faults.transport(h.cfg), opts); err == nil {
			break
		}
	}
	if err != nil {
		h.t.Fatalf("starting manager %d: %v", m.id, err)
	}
	m.started = time.Now()
	m.stop = func() error {
		if m.zombie != nil {
			close(m.zombie.stopped)
		}
		return mgr.Stop()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.account()
	h.running = append(h.running, m)
	h.started++
	if zombie {
		h.zombies++
	}
	return m
}

// kill stops m abruptly: nothing is released, in-flight reconciles are cut.
func (h *harness) kill(m *managerCtl) {
	h.mu.Lock()
	for i, r := range h.running {
		if r == m {
			h.account()
			h.running = append(h.running[:i], h.running[i+1:]...)
			h.killed++
			break
		}
	}
	h.mu.Unlock()
	if err := m.stop(); err != nil {
		h.t.Logf("manager %d returned: %v", m.id, err)
	}
}

// account adds the time since the last change of the running set to the
// split-brain total if two or more managers ran. Call with h.mu held.
func (h *harness) account() {
	now := time.Now()
	if len(h.running) >= 2 {
		h.split += now.Sub(h.changedAt)
	}
	h.changedAt = now
}

func (h *harness) healthy() []*managerCtl {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*managerCtl
	for _, m := range h.running {
		if m.zombie == nil {
			out = append(out, m)
		}
	}
	return out
}

func (h *harness) stopAll() {
	h.mu.Lock()
	running := append([]*managerCtl(nil), h.running...)
	h.mu.Unlock()
	for _, m := range running {
		h.kill(m)
	}
}

// ---------------------------------------------------------------------------
// 1. Chaos

// chaos runs the workload and the fault schedule for the run's duration. The
// schedule is a seeded sequence of episodes, each a few seconds long:
//
//   - restart: kill a healthy manager (no graceful release) and start another;
//   - split brain: start a second manager, let both run 2–6 s, kill one;
//   - zombie: start a manager, freeze it 3–6 s in the middle of its work
//     while the others move on, thaw it so that it writes what it decided
//     before, then kill it;
//   - warp: time jumps 2–6 s forward for everybody (pod-less holds expire);
//   - calm: nothing for 1–3 s.
//
// Every manager's clock is skewed by up to ±maxSkew, and a fraction of its
// writes and live reads fail (see faultPlan).
func (h *harness) chaos(ctx context.Context) {
	rng := rand.New(rand.NewPCG(h.o.seed, 0x7363686564756c65))
	skew := func() time.Duration {
		return time.Duration(rng.Int64N(int64(2*h.o.maxSkew))) - h.o.maxSkew
	}
	h.faults.plan.on.Store(true)
	h.startManager(ctx, skew(), "")

	wctx, stopWorkload := context.WithCancel(ctx)
	work := newWorkload(h.c, h.o.seed, h.clock, h.ledger, h.check, h.targets)
	workDone := make(chan struct{})
	go func() { defer close(workDone); work.run(wctx) }()

	deadline := time.Now().Add(h.o.duration)
	sleep := func(lo, hi time.Duration) {
		d := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		if left := time.Until(deadline); d > left {
			d = max(0, left)
		}
		time.Sleep(d)
	}
	episodes := newCounters()
	// Every kind of episode comes once first so that even the short run has
	// them all: the instant ones (a clock warp, a restart), then the long ones
	// in a seeded order; then they are drawn at random.
	first := []int{70, 0, 40, 55, 62}
	rng.Shuffle(len(first)-2, func(i, j int) { first[2+i], first[2+j] = first[2+j], first[2+i] })
	for i := 0; time.Now().Before(deadline); i++ {
		n := rng.IntN(100)
		if i < len(first) {
			n = first[i]
		}
		switch {
		case n < 35:
			episodes.add("restart", 1)
			healthy := h.healthy()
			h.kill(healthy[rng.IntN(len(healthy))])
			h.startManager(ctx, skew(), "")
		case n < 55:
			episodes.add("split brain", 1)
			h.startManager(ctx, skew(), "")
			sleep(2*time.Second, 6*time.Second)
			healthy := h.healthy()
			h.kill(healthy[rng.IntN(len(healthy))])
		case n < 70:
			point := freezeAtDecide
			if n >= 62 {
				point = freezeAtWrite
			}
			episodes.add("zombie frozen at "+point, 1)
			z := h.startManager(ctx, skew(), point)
			sleep(500*time.Millisecond, 1500*time.Millisecond)
			z.zombie.freeze()
			sleep(3*time.Second, 6*time.Second)
			z.zombie.unfreeze()
			sleep(500*time.Millisecond, time.Second)
			h.kill(z)
		case n < 80:
			episodes.add("clock warp", 1)
			d := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			h.clock.advance(d)
			h.mu.Lock()
			h.warps++
			h.warpTotal += d
			h.mu.Unlock()
		default:
			episodes.add("calm", 1)
			sleep(time.Second, 3*time.Second)
		}
		sleep(300*time.Millisecond, 1500*time.Millisecond)
	}

	// The workload ends with a burst that ends the holders of half the
	// targets while the faults still run, so that the last event of those
	// locks is a hand-off made under faults: the liveness check then sees
	// whether any got lost. The other half keep holder and waiter for the
	// drain.
	stopWorkload()
	<-workDone
	burstTargets := map[LockKey]bool{}
	for i, k := range h.targets {
		if i%2 == 0 {
			burstTargets[k] = true
		}
	}
	burst := work.endHolders(ctx, burstTargets)
	time.Sleep(2 * time.Second)

	// Faults end: no more injected errors, no zombie, one manager left.
	h.faults.plan.on.Store(false)
	healthy := h.healthy()
	h.mu.Lock()
	running := append([]*managerCtl(nil), h.running...)
	h.mu.Unlock()
	for _, m := range running {
		if m.zombie != nil {
			m.zombie.unfreeze()
		}
		if m != healthy[len(healthy)-1] {
			h.kill(m)
		}
	}

	h.mu.Lock()
	h.figure0("workload: %d operations in %s: %s; final burst under faults: %d holders ended", work.ops.total(), h.o.duration, work.ops, burst)
	h.figure0("workload operations the API server refused (expected: deleting what the TTL deleted, and so on): %s", work.failed)
	h.figure0("fault schedule: %s", episodes)
	h.figure0("managers: %d started, %d killed without release (%d of them zombies); split brain (2+ managers running) %.1fs; clock warps %d (+%s); skews within ±%s",
		h.started, h.killed, h.zombies, h.split.Seconds(), h.warps, h.warpTotal, h.o.maxSkew)
	h.mu.Unlock()
}

// figure0 is figure with h.mu held.
func (h *harness) figure0(format string, args ...any) {
	h.figures = append(h.figures, fmt.Sprintf(format, args...))
}

// ---------------------------------------------------------------------------
// 2. Liveness

// state is a live read of every claim, grant Lease and pod.
type state struct {
	claims map[LockKey][]buildlockv1.BuildLock
	leases map[LockKey]*coordinationv1.Lease
	pods   map[string]map[string]*corev1.Pod // namespace → name → pod
}

func (h *harness) read(ctx context.Context, namespaces []string) (state, error) {
	s := state{claims: map[LockKey][]buildlockv1.BuildLock{}, leases: map[LockKey]*coordinationv1.Lease{}, pods: map[string]map[string]*corev1.Pod{}}
	for _, ns := range namespaces {
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
		if p := SettleProblems(s.claims[k], s.leases[k], s.pods[k.Namespace], now); len(p) > 0 {
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
// the claim that was Waiting takes over.
func (h *harness) drain(ctx context.Context) {
	s, err := h.read(ctx, h.namespaces)
	if err != nil {
		h.t.Fatal(err)
	}
	work := newWorkload(h.c, h.o.seed, h.clock, h.ledger, h.check, h.targets)
	handOffs, frees := 0, 0
	var slowest time.Duration
	for round := 1; round <= 4; round++ {
		expect := map[LockKey]string{}
		ended := map[LockKey]time.Time{}
		for _, k := range h.targets {
			var holder, waiting *buildlockv1.BuildLock
			for i := range s.claims[k] {
				switch bl := &s.claims[k][i]; bl.Status.Phase {
				case buildlockv1.PhaseHeld:
					holder = bl
				case buildlockv1.PhaseWaiting:
					waiting = bl
				}
			}
			if holder == nil {
				continue
			}
			expect[k] = ""
			if waiting != nil {
				expect[k] = waiting.Name
			}
			ended[k] = h.clock.Now()
			h.endHolder(ctx, work, holder)
		}
		if len(expect) == 0 {
			break
		}
		s, _ = h.waitSettled(ctx, fmt.Sprintf("drain round %d", round), h.namespaces, h.targets, h.o.settleBound)
		for k, want := range expect {
			got := ""
			for _, bl := range s.claims[k] {
				if bl.Status.Phase == buildlockv1.PhaseHeld {
					got = bl.Name
				}
			}
			if got != want {
				h.t.Errorf("LIVENESS (seed %d): %s: after its holder ended, %q holds; the waiting claim %q should", h.o.seed, k, got, want)
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
	h.figure("drain: %d hand-offs to the waiting claim (slowest %s after the holder ended), %d locks freed", handOffs, slowest.Round(time.Millisecond), frees)
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
		stamp := h.clock.Now()
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
	for _, i := range pick {
		k := locks[i]
		ended[k] = holders[k].waiting
		for _, bl := range before.claims[k] {
			if bl.Name == holders[k].name {
				h.endHolder(ctx, w, &bl)
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
	// one grant per hand-off and two statuses (the end, then the new hold).
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
	grants := m.writes.get("update lease") + m.writes.get("create lease")
	statuses := m.writes.get("update/status buildlock")
	if grants != len(ended) {
		h.t.Errorf("RESTART (seed %d): the new manager wrote %d grants for %d hand-offs (writes: %s)", h.o.seed, grants, len(ended), m.writes)
	}
	if statuses != 2*len(ended) {
		h.t.Errorf("RESTART (seed %d): the new manager wrote %d statuses for %d hand-offs; want 2 each (writes: %s)", h.o.seed, statuses, len(ended), m.writes)
	}
	h.figure("restart: %d live locks; holders unchanged over the restart: %d of %d (changed %d); new manager started and synced in %.1fs; "+
		"%d holders ended right after: first hand-off %.2fs and last %.2fs after the cache synced; its writes: %s",
		len(locks), len(locks)-len(ended)-changed, len(locks)-len(ended), changed, startTook.Seconds(), len(ended), first.Seconds(), last.Seconds(), m.writes)
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

// ---------------------------------------------------------------------------
// Report

// report prints the figures and every violation with the events around it,
// and writes the history when asked or when the run failed.
func (h *harness) report() {
	h.mu.Lock()
	for _, e := range h.watchErr {
		h.t.Errorf("CHECKER GAP (seed %d): %s", h.o.seed, e)
	}
	h.mu.Unlock()
	st := h.check.Stats()
	violations := h.check.Violations()
	h.figure("injected faults: %d: %s", h.faults.plan.injected.total(), h.faults.plan.injected)
	h.figure("stale writes refused by the API server (409 Conflict): %d: %s", h.faults.refused.total(), h.faults.refused)
	h.figure("zombie: %s", h.faults.zombie)
	phases := newCounters()
	for k, v := range st.Phases {
		phases.add(k, v)
	}
	h.figure("checker: %d events checked (%d BuildLock, %d Lease); %d grants, %d holds, highest fencing token %d; deletions: %d by the owner, %d by the finished TTL",
		st.ClaimEvents+st.LeaseEvents, st.ClaimEvents, st.LeaseEvents, st.Grants, st.HeldTransitions, st.MaxToken, st.OwnerDeletes, st.TTLDeletes)
	h.figure("transitions: %s", phases)
	if n, examples := h.check.HoldsBehindTheGrant(); n > 0 {
		h.figure("holds shown after the grant had moved on (not a violation: no second holder was shown): %d, e.g. %s", n, strings.Join(examples, "; "))
	} else {
		h.figure("holds shown after the grant had moved on: 0 (every claim entered Held while the Lease named it with its token)")
	}
	h.figure("violations: %d", len(violations))

	var b strings.Builder
	fmt.Fprintf(&b, "chaos figures (seed %d, duration %s, %d targets in %d namespaces, fault rate %.0f%% per kind, pod-read faults %t, break=%q):\n",
		h.o.seed, h.o.duration, len(h.targets), len(h.namespaces), 100*h.o.faultRate, h.faults.plan.podReads, *flagBreak)
	h.mu.Lock()
	for _, f := range h.figures {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	h.mu.Unlock()
	h.t.Log(b.String())
	if *flagReport != "" {
		if err := os.WriteFile(*flagReport, []byte(b.String()), 0o644); err != nil {
			h.t.Errorf("writing the report: %v", err)
		}
	}

	for i, v := range violations {
		if i == 10 {
			h.t.Errorf("... and %d more violations", len(violations)-10)
			break
		}
		var ctx strings.Builder
		for _, e := range h.check.Around(v, 20, 8) {
			mark := "   "
			if e.Seq == v.Seq {
				mark = ">>>"
			}
			fmt.Fprintf(&ctx, "\n  %s %s", mark, e)
		}
		h.t.Errorf("VIOLATION (seed %d) %s\n  events of %s around it:%s", h.o.seed, v, v.Lock, ctx.String())
	}
	path := *flagHistory
	if path == "" && h.t.Failed() {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("buildlock-chaos-%d.history", h.o.seed))
	}
	if path != "" {
		var hist strings.Builder
		for _, e := range h.check.History() {
			hist.WriteString(e.String())
			hist.WriteByte('\n')
		}
		if err := os.WriteFile(path, []byte(hist.String()), 0o644); err != nil {
			h.t.Errorf("writing the history: %v", err)
		} else {
			h.t.Logf("history of %d events written to %s", len(h.check.History()), path)
		}
	}
}
