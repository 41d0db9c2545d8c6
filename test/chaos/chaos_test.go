package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

var (
	flagDuration     = flag.Duration("chaos.duration", 0, "how long the workload and faults run (env CHAOS_DURATION); 0 runs the short version that `make test` runs")
	flagSeed         = flag.Uint64("chaos.seed", 0, "seed of the workload and the fault schedule (env CHAOS_SEED); 0 picks one at random and prints it")
	flagTargets      = flag.Int("chaos.targets", 0, "targets (locks) the workload contends for; 0: 20 in a long run, 8 in the short one")
	flagLocks        = flag.Int("chaos.locks", 0, "live locks in the restart check; 0: 500 in a long run, 100 in the short one")
	flagFaults       = flag.Float64("chaos.faults", 0.02, "probability of each injected fault kind per write (four kinds) and per live read (two kinds)")
	flagBreak        = flag.String("chaos.break", "", "break the operator on purpose, to watch the checker fail: "+strings.Join(breakNames, ", "))
	flagHistory      = flag.String("chaos.history", "", "write every checked event to this file (a failing run writes it to the temp directory anyway)")
	flagReport       = flag.String("chaos.report", "", "write the figures to this file")
	flagPodReads     = flag.Bool("chaos.pod-read-faults", true, "fault the managers' live reads of pods too (a failed read must count as alive and be retried)")
	flagControlPlane = flag.Bool("chaos.control-plane", true, "run the control-plane episodes (API servers and etcd killed, compactions) and the partitions")
	flagPipelines    = flag.Int("chaos.pipelines", -1, "concurrent pkg/lock pipelines of the load run, over 20 targets, during the chaos; -1: 500 in a long run, none in the short one")
	flagManagerLog   = flag.String("chaos.manager-log", "", "write the in-process managers' logs (controller-runtime's, debug level) to this file, to see why the operator did what the checker reports")
)

// managersLogger is the logger of the in-process managers (TestMain sets
// it once, before any test runs): none, which keeps their logs out of the
// report, or with -chaos.manager-log, one that writes them to that file at
// debug level.
func managersLogger() logr.Logger {
	flag.Parse()
	if *flagManagerLog == "" {
		return logr.Discard()
	}
	f, err := os.Create(*flagManagerLog)
	if err != nil {
		panic(fmt.Sprintf("-chaos.manager-log: %v", err))
	}
	return zap.New(zap.WriteTo(f), zap.UseDevMode(true))
}

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
	// retention is the managers' grant retention (a line's memory, and when
	// an idle Lease goes); policyLag how long a policy change may take to
	// reach every manager; holdSlack how long a hold may outlive its end.
	retention, policyLag, holdSlack time.Duration
	controlPlane                    bool
	pipelines                       int
}

const shortDuration = 20 * time.Second

func resolveOptions(t *testing.T) options {
	o := options{duration: *flagDuration, seed: *flagSeed, faultRate: *flagFaults, maxSkew: 2 * time.Second, ttl: 5 * time.Second,
		settleBound: 30 * time.Second, handOffTime: 10 * time.Second, firstHandOff: 5 * time.Second,
		retention: 15 * time.Second, policyLag: 20 * time.Second, holdSlack: 20 * time.Second,
		controlPlane: *flagControlPlane, pipelines: *flagPipelines}
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
	o.namespaces, o.targets, o.locks = 2, 8, 50
	if o.long {
		o.namespaces, o.targets, o.locks = 4, 20, 500
		o.handOffTime = 20 * time.Second // behind the new manager's first pass over 500 locks
		o.retention = 30 * time.Second
	}
	if o.pipelines < 0 {
		o.pipelines = 0
		if o.long {
			o.pipelines = 500
		}
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

// harness is one chaos run: the control plane, the checker and its watches,
// the workload, and the managers the fault schedule starts and kills.
type harness struct {
	t      *testing.T
	o      options
	cp     *controlPlane
	c      client.Client // uncached, fault-free, through either API server: the workload's and the test's
	clock  *warpClock
	ledger *Ledger
	check  *Checker
	faults *faultSet
	// watchers are the checker's connections, one per API server: its
	// watches alternate between them.
	watchers []client.WithWatch

	namespaces []string // the workload's
	targets    []LockKey
	switching  map[LockKey]buildlockv1.Ordering // targets whose ordering the workload switches

	// episodes is held by an episode of the fault schedule, and by the
	// people while they edit with every manager stopped (people_test.go):
	// one changes the set of managers at a time.
	episodes sync.Mutex

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
	// cut, while not nil, stops the checker's watches (closed when they may
	// go on); cancels ends the watches in progress; prefer sends each
	// kind's next watch to one API server.
	cut     chan struct{}
	cancels map[string]context.CancelFunc
	prefer  map[string]int
	figures []string
	plane   *counters // control-plane episodes and what came of them
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos test runs against a real API server; skipped with -short")
	}
	t.Parallel() // with the regression tests, which mostly wait
	o := resolveOptions(t)
	t.Logf("chaos seed %d: rerun with `make chaos SEED=%d DURATION=%s` or `go test ./test/chaos -run TestChaos -chaos.seed=%d -chaos.duration=%s`",
		o.seed, o.seed, o.duration, o.seed, o.duration)
	begin := time.Now()

	// The CI jobs' binaries build while the control plane starts.
	type built struct {
		tools tools
		err   error
	}
	toolsDir, toolsBuilt := t.TempDir(), make(chan built, 1)
	go func() {
		tl, err := buildTools(toolsDir)
		toolsBuilt <- built{tl, err}
	}()

	cp, err := startControlPlane(2)
	if err != nil {
		t.Fatalf("starting the control plane (run `make envtest`): %v", err)
	}
	t.Cleanup(func() {
		cp.stop(t.Failed())
		if t.Failed() {
			t.Logf("control-plane logs kept in %s", cp.dir)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	h := newHarness(t, cp, o)
	defer h.stopAll() // also when a phase fails the test
	h.createNamespaces(ctx)
	installing := time.Now()
	dep := h.setupEnforcement(ctx)
	h.check.o.RequesterVerified = requesterVerification(dep != nil, installing, time.Now())
	if dep != nil {
		h.check.o.OnLease = dep.observeLease // before the watches start
	}
	crowd := h.setupPeople(ctx, dep)
	freezer := newWindowsActor(h, crowd)
	var enforced []LockKey
	if dep != nil {
		enforced = dep.locks
	}
	rollbacks := h.setupRollbacks(ctx, enforced)
	b := <-toolsBuilt
	if b.err != nil {
		t.Fatal(b.err)
	}
	ci := h.setupJobs(ctx, b.tools)
	h.startWatches(ctx)
	go h.watchDeadlines(ctx)
	defer h.report()

	phases := newCounters()
	phase := func(name string, began time.Time) { phases.add(name, int(time.Since(began).Milliseconds())) }
	defer func() { h.figure("phases (ms): %s", phases) }()
	phase("control plane start", begin)

	// 1. The workload and the faults, together.
	began := time.Now()
	depCtx, stopDeployer := context.WithCancel(ctx)
	depDone := make(chan struct{})
	go func() {
		defer close(depDone)
		if dep != nil && dep.waitEnforcing(depCtx, h) {
			dep.run(depCtx)
		}
	}()
	// Counted once the locks settled, so that fewer claims are still live.
	defer func() { h.figure("%s", rollbacks.figures()) }()
	h.chaos(ctx, func(ctx context.Context) { crowd.run(ctx, 3*time.Second) }, ci.run, freezer.run,
		func(ctx context.Context) { rollbacks.run(ctx, time.Second) })
	stopDeployer()
	<-depDone
	for _, f := range crowd.stop() {
		h.figure("%s", f)
	}
	h.figure("%s", ci.stop())
	h.barrier(ctx)
	activities := ci.activities()
	if dep != nil {
		h.figure("%s", dep.judge(h.check))
		activities = append(activities, dep.activities()...)
	}
	h.figure("deployers (commands of the plugin's pipelines, pkg/lock jobs, the deployer's admitted writes): %s", h.check.CheckActivities(activities, *flagWindow))
	phase("1 chaos", began)
	h.check.CheckWindows()
	if len(h.check.Violations()) > 0 {
		h.figure("%s", freezer.figures())
		h.stopAll()
		h.barrier(ctx)
		return // the report shows them; the later phases would add noise
	}
	// 2. Liveness: with the faults and the workload stopped, every lock
	// settles within a bound, under the one manager left.
	began = time.Now()
	h.settleAfterChaos(ctx)
	phase("2 liveness", began)
	// 3. Every lock hands over to its next claim until it is free.
	began = time.Now()
	h.drain(ctx)
	phase("3 drain", began)
	// 4. A new manager over many live locks keeps every holder and hands over
	// at once.
	began = time.Now()
	h.restartCheck(ctx)
	phase("4 restart check", began)

	h.stopAll()
	h.barrier(ctx)
	h.check.CheckGrantsCoverHolds()
	h.check.CheckMemorySupersessions()
	h.check.CheckLeaseDeletions()
	h.check.CheckRestores()
	h.check.CheckForeignLeases()
	h.check.CheckWindows()
	h.figure("%s", freezer.figures())
	h.figure("run: %s in total (chaos %s)", time.Since(begin).Round(time.Second), o.duration)
}

func newHarness(t *testing.T, cp *controlPlane, o options) *harness {
	cfg := cp.balancedConfig()
	cfg.Timeout = 20 * time.Second // a call in flight when etcd dies must not stall the run
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	clock := &warpClock{}
	ledger := NewLedger(clock.Now)
	h := &harness{
		t: t, o: o, cp: cp, c: c, clock: clock, ledger: ledger,
		// Managers' clocks run up to maxSkew off; 100ms more for the
		// microsecond truncation of stored times and the reconcile's own
		// reading of its clock before it writes.
		check: NewChecker(ledger, CheckerOptions{TTL: o.ttl, Tolerance: o.maxSkew + 100*time.Millisecond, Retention: o.retention,
			PolicyLag: o.policyLag, HoldSlack: o.holdSlack, Now: clock.Now}),
		faults: &faultSet{
			plan:    &faultPlan{rng: rand.New(rand.NewPCG(o.seed, 0x6661756c7473)), writeRate: o.faultRate, readRate: o.faultRate, podReads: *flagPodReads, injected: newCounters()},
			refused: newCounters(), zombie: newCounters(), partition: newCounters(), lists: newCounters(), broken: *flagBreak, ledger: ledger,
		},
		watchRV: map[string]uint64{}, plane: newCounters(), switching: map[LockKey]buildlockv1.Ordering{},
		cancels: map[string]context.CancelFunc{}, prefer: map[string]int{},
	}
	if !validBreak(*flagBreak) {
		t.Fatalf("-chaos.break=%q: want one of %s", *flagBreak, strings.Join(breakNames, ", "))
	}
	for i := range cp.apiservers {
		wc, err := client.NewWithWatch(cp.config(i), client.Options{Scheme: testenv.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		h.watchers = append(h.watchers, wc)
	}
	return h
}

func (h *harness) figure(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.figures = append(h.figures, fmt.Sprintf(format, args...))
}

// createNamespaces creates the workload's namespaces and targets, and the
// targets' policies: targets are split over the orderings, a quarter each
// with no policy (NewestWins), Queue and Fifo; the last quarter is Queue
// with a maximum hold of a minute, and its ordering is switched mid-run.
// The policies' spec.rollbacks vary too (rollbacksOf).
func (h *harness) createNamespaces(ctx context.Context) {
	for i := range h.o.namespaces {
		ns := fmt.Sprintf("chaos-%d", i)
		h.createNamespace(ctx, ns)
		h.namespaces = append(h.namespaces, ns)
	}
	for i := range h.o.targets {
		ns := h.namespaces[i%len(h.namespaces)]
		k := LockKey{Namespace: ns, Target: fmt.Sprintf("env-%d", i)}
		h.targets = append(h.targets, k)
		switch i % 4 {
		case 1:
			h.createPolicy(ctx, k, buildlockv1.OrderingQueue, 0, rollbacksOf(i))
		case 2:
			h.createPolicy(ctx, k, buildlockv1.OrderingFifo, 0, rollbacksOf(i))
		case 3:
			h.createPolicy(ctx, k, buildlockv1.OrderingQueue, time.Minute, rollbacksOf(i))
			h.switching[k] = buildlockv1.OrderingQueue
		}
	}
}

// createPolicy creates the policy of lock k; rollbacks, when given, is its
// spec.rollbacks.
func (h *harness) createPolicy(ctx context.Context, k LockKey, ordering buildlockv1.Ordering, maxHold time.Duration, rollbacks ...buildlockv1.Rollbacks) {
	p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Target}, Spec: buildlockv1.BuildLockPolicySpec{Ordering: ordering}}
	if len(rollbacks) > 0 {
		p.Spec.Rollbacks = rollbacks[0]
	}
	if maxHold > 0 {
		p.Spec.MaxHold = &metav1.Duration{Duration: maxHold}
	}
	if err := h.c.Create(ctx, p); err != nil {
		h.t.Fatalf("creating the policy of %s: %v", k, err)
	}
}

func (h *harness) createNamespace(ctx context.Context, ns string) {
	if err := h.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		h.t.Fatalf("creating namespace %s: %v", ns, err)
	}
}

// workloadNamespace reports whether the checker judges the Leases of ns.
func workloadNamespace(ns string) bool {
	for _, prefix := range []string{"chaos-", "restart-", "load-"} {
		if strings.HasPrefix(ns, prefix) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Watches

// startWatches feeds the checker: one watch on all BuildLocks, one on all
// Leases, one on all BuildLockPolicies and one on all namespaces (their
// consent labels), each from the resourceVersion of
// an initial list, so that every event arrives once and in the API server's
// order. A watch that fails with 410 Gone (etcd compacted what it had not
// read) re-lists, and the checker reconciles its history with the list.
func (h *harness) startWatches(ctx context.Context) {
	var policies buildlockv1.BuildLockPolicyList
	if err := h.c.List(ctx, &policies); err != nil {
		h.t.Fatal(err)
	}
	for i := range policies.Items {
		h.check.mu.Lock()
		h.check.observePolicy(watch.Added, &policies.Items[i], true)
		h.check.mu.Unlock()
	}
	var claims buildlockv1.BuildLockList
	if err := h.c.List(ctx, &claims); err != nil {
		h.t.Fatal(err)
	}
	for i := range claims.Items {
		h.check.ObserveClaim(watch.Added, &claims.Items[i])
	}
	var leases coordinationv1.LeaseList
	if err := h.c.List(ctx, &leases); err != nil {
		h.t.Fatal(err)
	}
	var namespaces corev1.NamespaceList
	if err := h.c.List(ctx, &namespaces); err != nil {
		h.t.Fatal(err)
	}
	h.check.ObserveInitialNamespaces(namespaces.Items)
	go h.watchLoop(ctx, "Namespace", func() client.ObjectList { return &corev1.NamespaceList{} }, namespaces.ResourceVersion,
		func(typ watch.EventType, obj runtime.Object) {
			if n, ok := obj.(*corev1.Namespace); ok {
				h.check.ObserveNamespace(typ, n)
			}
		},
		func(list client.ObjectList) {
			h.check.RelistNamespaces(list.(*corev1.NamespaceList).Items, list.GetResourceVersion())
		})
	go h.watchLoop(ctx, "BuildLockPolicy", func() client.ObjectList { return &buildlockv1.BuildLockPolicyList{} }, policies.ResourceVersion,
		func(typ watch.EventType, obj runtime.Object) {
			if p, ok := obj.(*buildlockv1.BuildLockPolicy); ok {
				h.check.ObservePolicy(typ, p)
			}
		},
		func(list client.ObjectList) {
			h.check.RelistPolicies(list.(*buildlockv1.BuildLockPolicyList).Items, list.GetResourceVersion())
		})
	go h.watchLoop(ctx, "BuildLock", func() client.ObjectList { return &buildlockv1.BuildLockList{} }, claims.ResourceVersion,
		func(typ watch.EventType, obj runtime.Object) {
			if bl, ok := obj.(*buildlockv1.BuildLock); ok {
				h.check.ObserveClaim(typ, bl)
			}
		},
		func(list client.ObjectList) {
			h.check.RelistClaims(list.(*buildlockv1.BuildLockList).Items, list.GetResourceVersion())
		})
	go h.watchLoop(ctx, "Lease", func() client.ObjectList { return &coordinationv1.LeaseList{} }, leases.ResourceVersion,
		func(typ watch.EventType, obj runtime.Object) {
			l, ok := obj.(*coordinationv1.Lease)
			switch {
			case ok && workloadNamespace(l.Namespace):
				h.check.ObserveLease(typ, l)
			case ok && isElectionLease(l):
				h.check.ObserveElection(typ, l)
			}
		},
		func(list client.ObjectList) {
			var mine []coordinationv1.Lease
			for _, l := range list.(*coordinationv1.LeaseList).Items {
				if workloadNamespace(l.Namespace) {
					mine = append(mine, l)
				} else if isElectionLease(&l) {
					h.check.ObserveElection(Relisted, &l)
				}
			}
			h.check.RelistLeases(mine, list.GetResourceVersion())
		})
}

// isElectionLease reports whether l is the in-process managers'
// leader-election Lease (testenv puts it in namespace default).
func isElectionLease(l *coordinationv1.Lease) bool {
	return l.Namespace == metav1.NamespaceDefault && l.Name == ElectionLease
}

// watchLoop watches one kind from rv until ctx ends. Each watch goes to the
// next API server in turn and lasts 5–20 s (so that the checker's view is
// built from both API servers, and its watches resume often from where they
// were, as informers do after a disconnection). A watch refused with 410
// Gone re-lists.
func (h *harness) watchLoop(ctx context.Context, kind string, newList func() client.ObjectList, rv string,
	handle func(watch.EventType, runtime.Object), relist func(client.ObjectList)) {
	rng := rand.New(rand.NewPCG(h.o.seed, uint64(len(kind))))
	// The checker's view of the claims and the Leases is stale while their
	// watch is down: the time-bound rules allow for it.
	tracked := kind == "BuildLock" || kind == "Lease"
	for i := 0; ctx.Err() == nil; i++ {
		if tracked {
			h.check.WatchDown(kind)
		}
		wctx, wc := h.nextWatch(ctx, kind, i)
		if wctx == nil {
			return
		}
		timeout := int64(5 + rng.IntN(16))
		w, err := wc.Watch(wctx, newList(), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}})
		if err == nil && tracked {
			h.check.WatchUp(kind)
		}
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = h.relist(ctx, kind, newList, relist)
			} else if ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		expired := false
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if status, ok := ev.Object.(*metav1.Status); ok && status.Code == 410 {
					expired = true
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
			h.noteRV(kind, rv)
		}
		w.Stop()
		if expired {
			h.plane.add("checker watches refused with 410 Gone", 1)
			rv = h.relist(ctx, kind, newList, relist)
		}
	}
}

// nextWatch waits while the checker is cut off, and returns the context and
// the connection of kind's next watch: the API servers in turn, or the one
// preferred after a cut. Its context ends when the checker is cut off.
func (h *harness) nextWatch(ctx context.Context, kind string, i int) (context.Context, client.WithWatch) {
	for {
		h.mu.Lock()
		cut := h.cut
		h.mu.Unlock()
		if cut == nil {
			break
		}
		select {
		case <-cut:
		case <-ctx.Done():
			return nil, nil
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	server := i % len(h.watchers)
	if p, ok := h.prefer[kind]; ok {
		server = p
		delete(h.prefer, kind)
	}
	if !h.cp.apiservers[server].ready.Load() {
		// As the workload's connection does, leave an API server the run
		// killed aside until it is ready: one that is starting accepts a
		// watch and may hold it for long before it answers.
		for j, p := range h.cp.apiservers {
			if p.ready.Load() {
				server = j
				break
			}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	if old := h.cancels[kind]; old != nil {
		old()
	}
	h.cancels[kind] = cancel
	return wctx, h.watchers[server]
}

// cutChecker ends the checker's watches and holds them back until
// healChecker, as if its connection were down.
func (h *harness) cutChecker() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut == nil {
		h.cut = make(chan struct{})
	}
	for _, cancel := range h.cancels {
		cancel()
	}
}

// healChecker lets the checker's watches resume, each on API server server
// first.
func (h *harness) healChecker(server int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, kind := range []string{"BuildLock", "Lease", "BuildLockPolicy", "Namespace"} {
		h.prefer[kind] = server
	}
	if h.cut != nil {
		close(h.cut)
		h.cut = nil
	}
}

// relist lists kind (through whichever API server answers) until it
// succeeds, hands the list to apply, and returns its resourceVersion.
func (h *harness) relist(ctx context.Context, kind string, newList func() client.ObjectList, apply func(client.ObjectList)) string {
	for ctx.Err() == nil {
		list := newList()
		if err := h.c.List(ctx, list); err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		apply(list)
		h.plane.add("checker re-list ("+kind+")", 1)
		h.noteRV(kind, list.GetResourceVersion())
		return list.GetResourceVersion()
	}
	return ""
}

func (h *harness) noteRV(kind, rv string) {
	if n, err := strconv.ParseUint(rv, 10, 64); err == nil {
		h.mu.Lock()
		h.watchRV[kind] = max(h.watchRV[kind], n)
		h.mu.Unlock()
	}
}

// watchDeadlines judges holds against time until ctx ends.
func (h *harness) watchDeadlines(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			h.check.CheckHoldDeadlines(time.Now())
		}
	}
}

// barrier returns once both watches delivered a write made after everything
// before it, so that the checker has judged the whole history. It relies on
// resourceVersions of one etcd growing, which the control plane's single
// etcd gives (whichever API server serves them).
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
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		done := h.watchRV["Lease"] >= want && h.watchRV["BuildLock"] >= claimWant
		h.mu.Unlock()
		if done {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Errorf("the checker's watches did not catch up within 30s")
}

// ---------------------------------------------------------------------------
// Managers

// managerSpec is how a manager is started.
type managerSpec struct {
	skew time.Duration
	// freeze is "" for a healthy manager, else where the zombie freezes.
	freeze string
	// server is the API server it talks to (managers are spread over both),
	// always through a partition proxy of its own.
	server int
	// episode: the manager of a partition episode, which kills it.
	episode bool
	// leaderElection: it decides only while it leads.
	leaderElection bool
}

// startManager starts a healthy or zombie manager on the next API server.
func (h *harness) startManager(ctx context.Context, skew time.Duration, freezePoint string) *managerCtl {
	h.mu.Lock()
	server := h.nextID % len(h.cp.apiservers)
	h.mu.Unlock()
	return h.startManagerWith(ctx, managerSpec{skew: skew, freeze: freezePoint, server: server})
}

// startManagerWith starts a manager with its own clock skew, API faults,
// and, for a zombie, a freezer; through a partition proxy of its own, so
// that the test can cut it off.
func (h *harness) startManagerWith(ctx context.Context, ms managerSpec) *managerCtl {
	h.mu.Lock()
	h.nextID++
	m := &managerCtl{id: h.nextID, skew: ms.skew, server: ms.server, writes: newCounters(), restartWrites: newCounters(), episode: ms.episode}
	h.mu.Unlock()
	zombie := ms.freeze != ""
	workers := 4
	if zombie {
		m.zombie = newFreezer(ms.freeze)
		workers = 8 // more reconcilers caught mid-flight
	}
	p, err := newPartitionProxy(fmt.Sprintf("127.0.0.1:%d", h.cp.ports[ms.server]))
	if err != nil {
		h.t.Fatalf("starting a partition proxy: %v", err)
	}
	m.proxy = p
	cfg := h.cp.configFor(p.addr())
	opts := testenv.ManagerOptions{
		Clock:          skewClock{base: h.clock, skew: ms.skew},
		NewClient:      testenv.InterceptClient(*h.faults.interceptor(m)),
		Decide:         h.faults.decide(m),
		FinishedTTL:    h.o.ttl,
		GrantRetention: h.o.retention,
		Workers:        workers,
		LeaderElection: ms.leaderElection,
	}
	var mgr *testenv.Manager
	for attempt := 0; attempt < 5; attempt++ {
		if mgr, err = testenv.StartManager(ctx, h.faults.transport(cfg, m), opts); err == nil {
			break
		}
		time.Sleep(time.Second) // its API server may be restarting
	}
	if err != nil {
		h.t.Fatalf("starting manager %d: %v", m.id, err)
	}
	m.started = time.Now()
	m.synced.Store(true)
	h.check.ManagerUp(m.name(), h.cp.apiservers[ms.server].name, ms.leaderElection)
	m.elected = mgr.Elected()
	m.stop = func() error {
		if m.zombie != nil {
			close(m.zombie.stopped)
		}
		err := mgr.Stop()
		m.proxy.close()
		return err
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
	h.check.ManagerDown(m.name())
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

// healthy returns the managers that are neither zombies nor partition
// episodes'.
func (h *harness) healthy() []*managerCtl {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*managerCtl
	for _, m := range h.running {
		if m.zombie == nil && !m.episode {
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
// Report

// report prints the figures and every violation with the events around it,
// and writes the history when asked or when the run failed.
func (h *harness) report() {
	st := h.check.Stats()
	violations := h.check.Violations()
	h.figure("control plane: %s", h.plane)
	h.figure("managers' informers: %s", h.faults.lists)
	h.figure("partitions: %s", h.faults.partition)
	h.figure("injected faults: %d: %s", h.faults.plan.injected.total(), h.faults.plan.injected)
	h.figure("stale writes refused by the API server (409 Conflict): %d: %s", h.faults.refused.total(), h.faults.refused)
	h.figure("zombie: %s", h.faults.zombie)
	phases := newCounters()
	for k, v := range st.Phases {
		phases.add(k, v)
	}
	relists := newCounters()
	for k, v := range st.Relists {
		relists.add(k, v)
	}
	h.figure("checker: %d events checked (%d BuildLock, %d Lease, %d BuildLockPolicy); %d grants, %d holds, highest fencing token %d; deletions: %d by the owner, %d by the finished TTL, %d idle Leases",
		st.ClaimEvents+st.LeaseEvents+st.PolicyEvents, st.ClaimEvents, st.LeaseEvents, st.PolicyEvents, st.Grants, st.HeldTransitions, st.MaxToken, st.OwnerDeletes, st.TTLDeletes, st.LeaseDeletes)
	h.figure("checker re-lists after 410 Gone: %s; objects found changed %d, gone %d (deletions explained by the time the watch was down: %d; holds granted unseen: %d, claims that held unseen: %d; supersessions by claims never seen, judged by their specs: %d; by the line memory of a hold only the Lease showed: %d; grant Leases found gone whose holder had ended unseen: %d)",
		relists, st.RelistChanged, st.RelistGone, st.GapDeletes, st.GapHold, st.UnseenHolds, st.GapSupersessions, st.MemorySupersessions, st.GapLeaseDeletes)
	h.figure("renewals: %d (%d stamped more than a minute ahead); holds that ended LockLost after their expiry: %d, once a freeze released them: %d; longest a hold was seen past its end: %s (slack %s); "+
		"longest a reaction went past the slack within the time no manager could act: %s (the longest such allowance: %s)",
		st.Renewals, st.FarRenewals, st.LockLostExpired, st.LockLostFrozen, st.LongestOverrun.Round(time.Millisecond), h.o.holdSlack,
		st.LongestExcused.Round(time.Millisecond), st.LongestAllowance.Round(time.Millisecond))
	h.figure("%s", h.check.OutageFigures())
	h.figure("orderings: %d grants judged by queue order, %d queue joins followed for fairness, %d ordering changes, %d waiting claims moved up to their line's place",
		st.QueueGrants, st.FairnessTracked, st.OrderingChanges, st.LinePlacesTaken)
	h.figure("records people touched: %d grant Lease versions written and %d grant Leases deleted by a person, %d token floors deleted; the operator's versions after them: %d (longest %s after), grants written again to their holder: %d, grants of what a person's edit named: %d, grants again to the holder after an edit: %d, tokens restarted after people deleted a Lease and its floor: %d; line records kept by later versions: %d",
		st.PersonLeaseEdits, st.PersonLeaseDeletes, st.FloorDeletes, st.Repairs, st.LongestRepair.Round(time.Millisecond), st.Restores, st.FollowedEdits, st.Regrants, st.TokensRestarted, st.MemoryChecked)
	h.figure("claims deleted while a finalizer kept them that ended: %d (longest seen being deleted before it ended: %s); Leases of somebody else's under a grant Lease's name: %d; consent labels changed: %d",
		st.DeletingEnded, st.LongestDeleting.Round(time.Millisecond), st.ForeignLeases, st.ConsentChanges)
	h.figure("transitions: %s", phases)
	if n, examples := h.check.HoldsBehindTheGrant(); n > 0 {
		h.figure("holds shown after the grant had moved on (not a violation: no second holder was shown): %d, e.g. %s", n, strings.Join(examples, "; "))
	} else {
		h.figure("holds shown after the grant had moved on: 0 (every claim entered Held while the Lease named it with its token)")
	}
	h.figure("violations: %d", len(violations))

	var b strings.Builder
	fmt.Fprintf(&b, "chaos figures (seed %d, duration %s, %d targets in %d namespaces, fault rate %.0f%% per kind, pod-read faults %t, control plane %t, break=%q):\n",
		h.o.seed, h.o.duration, len(h.targets), len(h.namespaces), 100*h.o.faultRate, h.faults.plan.podReads, h.o.controlPlane, *flagBreak)
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
