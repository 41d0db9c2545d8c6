//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// blClaim is the BuildLock a pipeline creates: target, line, build, and
// optionally its pod.
func blClaim(ns, name, target, repo string, build int64, pod string) *buildlockv1.BuildLock {
	bl := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       buildlockv1.BuildLockSpec{Target: target, Repo: repo, Branch: "main", Build: build},
	}
	if pod != "" {
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod}
	}
	return bl
}

// handoffSpec says how one row's hand-offs run.
type handoffSpec struct {
	withPods bool // the holder's pod succeeds, rather than its claim being deleted
	// ordering is the target's BuildLockPolicy's; "" runs without a policy
	// (NewestWins).
	ordering buildlockv1.Ordering
	// waiting is how many lines wait behind the holder at each hand-off
	// (NewestWins has one waiting slot).
	waiting int
	// until, when set, ends the run at the first hand-off that would start
	// after it is closed (at most n hand-offs); every hand-off counts, none
	// is a warm-up.
	until <-chan struct{}
}

// blHandoffs measures hand-offs on one target through the operator. Before
// each hand-off, new claims (a new line each) join until spec.waiting wait,
// each observed Waiting; then the holder's claim is deleted or, withPods,
// its pod succeeds; the hand-off ends when the first waiting claim is seen
// holding: by its grant Lease naming it (as pkg/lock sees it) and by its
// status (as kubectl wait sees it). The operator's requests of each step are
// counted and traced.
func (b *bench) blHandoffs(n int, spec handoffSpec) (handoffRun, error) {
	prefix := map[bool]string{false: "bl-delete", true: "bl-pods"}[spec.withPods]
	if spec.ordering != "" {
		prefix = fmt.Sprintf("bl-%s-%d", strings.ToLower(string(spec.ordering)), spec.waiting)
	}
	run := handoffRun{}
	ns := b.namespace(prefix)
	if spec.ordering != "" {
		if err := b.setOrdering(ns, "staging", spec.ordering); err != nil {
			return run, err
		}
	}
	tr, err := trackClaims(b.ctx, b.blc, ns)
	if err != nil {
		return run, err
	}
	joined := 0
	join := func() (string, error) {
		i := joined
		joined++
		name, pod := fmt.Sprintf("c-%d", i), ""
		if spec.withPods {
			pod = fmt.Sprintf("p-%d", i)
			if _, err := b.createPod(ns, pod); err != nil {
				return "", err
			}
		}
		return name, b.blc.Create(b.ctx, blClaim(ns, name, "staging", fmt.Sprintf("acme/app-%d", i), int64(i+1), pod))
	}
	holder, err := join()
	if err != nil {
		return run, err
	}
	if _, err := tr.waitPhase(b.ctx, holder, buildlockv1.PhaseHeld); err != nil {
		return run, err
	}
	// quiesce lets the operator finish what a step caused, so that its
	// requests are counted in that step; not during a burst elsewhere,
	// which keeps the operator busy throughout.
	quiesce := func() {
		if spec.until == nil {
			b.ops.quiesce(quietFor, quietMax)
		}
	}
	var queue []string // the waiting claims, first in line first
	skip := warmup
	if spec.until != nil {
		skip = 0
	}
	for i := 1; i <= skip+n; i++ {
		o0, c0 := b.ops.snapshot(), b.blCount.snapshot()
		for len(queue) < spec.waiting {
			next, err := join()
			if err != nil {
				return run, err
			}
			if _, err := tr.waitPhase(b.ctx, next, buildlockv1.PhaseWaiting); err != nil {
				return run, err
			}
			queue = append(queue, next)
		}
		quiesce()
		o1, c1 := b.ops.snapshot(), b.blCount.snapshot()
		if closed(spec.until) {
			break
		}

		next := queue[0]
		b.ops.startTrace()
		t0 := time.Now()
		if spec.withPods {
			t0, err = b.succeedPod(ns, podOf(holder))
		} else {
			err = b.blc.Delete(b.ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder}})
		}
		if err != nil {
			return run, fmt.Errorf("releasing %s: %w", holder, err)
		}
		released := time.Now()
		held, err := tr.waitPhase(b.ctx, next, buildlockv1.PhaseHeld)
		if err != nil {
			return run, err
		}
		granted, err := tr.waitGranted(b.ctx, next)
		if err != nil {
			return run, err
		}
		quiesce()
		trace := b.ops.stopTrace()
		if i > skip {
			run.add(held.Sub(t0), c1.minus(c0), b.blCount.snapshot().minus(c1))
			run.latLease = append(run.latLease, granted.Sub(t0))
			run.addOperator(o1.minus(o0), b.ops.snapshot().minus(o1))
			run.traces = append(run.traces, cycleTrace{t0: t0, released: released, observed: held, observedLease: granted, requests: trace})
		}
		if spec.withPods { // what --finished-ttl would do later; not part of the hand-off
			if err := b.deleteObject(&buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder}}); err != nil {
				return run, err
			}
			if err := b.deletePod(ns, podOf(holder)); err != nil {
				return run, err
			}
			quiesce()
		}
		holder, queue = next, queue[1:]
	}
	return run, nil
}

// closed reports whether ch is closed; a nil channel never is.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// podOf is the pod of claim c-<i>: p-<i>.
func podOf(claim string) string { return "p-" + strings.TrimPrefix(claim, "c-") }

// setOrdering creates the BuildLockPolicy of target in ns with ordering, and
// waits until the operator applies it.
func (b *bench) setOrdering(ns, target string, ordering buildlockv1.Ordering) error {
	policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target}}
	policy.Spec.Ordering = ordering
	return b.createPolicy(policy)
}

// createPolicy creates a BuildLockPolicy and waits until its Ready
// condition says the operator applies it (so that the operator's cache
// has it).
func (b *bench) createPolicy(policy *buildlockv1.BuildLockPolicy) error {
	if err := b.c.Create(b.ctx, policy); err != nil {
		return fmt.Errorf("creating BuildLockPolicy %s/%s: %w", policy.Namespace, policy.Name, err)
	}
	return wait.PollUntilContextTimeout(b.ctx, 20*time.Millisecond, waitLimit, true, func(ctx context.Context) (bool, error) {
		var p buildlockv1.BuildLockPolicy
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(policy), &p); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(p.Status.Conditions, buildlockv1.ConditionReady), nil
	})
}

// acquireRun is one row of acquisitions of a free lock: until the status
// shows Held, until the grant Lease names the claim, and the operator's
// requests per acquisition.
type acquireRun struct {
	lat, latLease []time.Duration
	ops           counts
}

// blAcquires measures create → Held on free locks: a new target each time
// (the lock has no Lease yet), or, kept, one target whose previous holder
// released it (its Lease is kept, free).
func (b *bench) blAcquires(n int, kept bool) (acquireRun, error) {
	var r acquireRun
	ns := b.namespace(map[bool]string{false: "bl-acquire", true: "bl-acquire-kept"}[kept])
	tr, err := trackClaims(b.ctx, b.blc, ns)
	if err != nil {
		return r, err
	}
	for i := range warmup + n {
		name, target := fmt.Sprintf("c-%d", i), fmt.Sprintf("t%d", i)
		if kept {
			target = "staging"
		}
		o0 := b.ops.snapshot()
		t0 := time.Now()
		if err := b.blc.Create(b.ctx, blClaim(ns, name, target, "acme/app", int64(i+1), "")); err != nil {
			return r, err
		}
		held, err := tr.waitPhase(b.ctx, name, buildlockv1.PhaseHeld)
		if err != nil {
			return r, err
		}
		granted, err := tr.waitGranted(b.ctx, name)
		if err != nil {
			return r, err
		}
		b.ops.quiesce(quietFor, quietMax)
		if i >= warmup {
			r.lat = append(r.lat, held.Sub(t0))
			r.latLease = append(r.latLease, granted.Sub(t0))
			r.ops = r.ops.plus(b.ops.snapshot().minus(o0))
		}
		if kept { // free the lock again for the next one, outside the measurement
			if err := b.deleteObject(&buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
				return r, err
			}
			if err := b.waitFree(ns, target); err != nil {
				return r, err
			}
			b.ops.quiesce(quietFor, quietMax)
		}
	}
	return r, nil
}

// waitFree waits until the grant Lease of target names no holder.
func (b *bench) waitFree(ns, target string) error {
	return wait.PollUntilContextTimeout(b.ctx, 5*time.Millisecond, waitLimit, true, func(ctx context.Context) (bool, error) {
		var lease coordinationv1.Lease
		if err := b.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock-" + target}, &lease); err != nil {
			return false, err
		}
		return lease.Spec.HolderIdentity == nil, nil
	})
}

// blScale creates contenders claims (one line each) on every target at once
// and waits until every lock has settled (one Held, one Waiting, the rest
// Superseded); then deletes every holder at once and waits until every
// waiter holds. The locks are left in place for the idle measurement.
func (b *bench) blScale(targets, contenders int) (scaleResult, string, error) {
	ns := b.namespace("bl-scale")
	r := scaleResult{row: rowBL, claims: targets * contenders, counts: map[string]int{}}
	err := b.scaleLoad(b.ctx, ns, targets, contenders, &r, scaleDecider{ops: b.ops, reconciles: reconciles, profile: true})
	return r, ns, err
}

// scaleDecider is who decides a scale load: its requests, its reconciles
// when it counts them, and whether the API server is profiled meanwhile.
type scaleDecider struct {
	ops        *counter
	reconciles func() int
	profile    bool
}

// scaleLoad is the scale load in ns, decided by d: contenders claims (one
// line each) on every target created at once by 32 clients, until every
// lock has settled (one Held, one Waiting, the rest Superseded); then every
// holder's claim deleted at once, until every waiter holds. ctx ends the
// load early (a decider that failed).
func (b *bench) scaleLoad(ctx context.Context, ns string, targets, contenders int, r *scaleResult, d scaleDecider) error {
	count := func() int {
		if d.reconciles == nil {
			return 0
		}
		return d.reconciles()
	}
	tr, err := trackClaims(ctx, b.blc, ns)
	if err != nil {
		return err
	}
	phaseCounts := func(want map[buildlockv1.Phase]int) func(map[string]buildlockv1.Phase) bool {
		return func(phases map[string]buildlockv1.Phase) bool {
			got := countPhases(phases)
			for p, n := range want {
				if got[p] != n {
					return false
				}
			}
			return true
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	o0, rec0, cpu0 := d.ops.snapshot(), count(), cpuSeconds()
	t0 := time.Now()
	profiled := make(chan string, 1)
	if d.profile {
		go func() {
			profiled <- b.apiserverProfile("apiserver-scale", "the first 8s of the scale run", 8*time.Second)
		}()
	}
	err = parallel(targets*contenders, func(i int) error {
		t, k := i/contenders, i%contenders
		return b.blc.Create(ctx, blClaim(ns, fmt.Sprintf("t%d-%d", t, k), fmt.Sprintf("t%d", t), fmt.Sprintf("acme/line-%d", k), 1, ""))
	})
	if err != nil {
		return err
	}
	r.created = time.Since(t0)
	settled := map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: targets, buildlockv1.PhaseWaiting: targets, buildlockv1.PhaseSuperseded: targets * (contenders - 2)}
	if err := tr.waitUntil(ctx, phaseCounts(settled)); err != nil {
		return fmt.Errorf("settling %d claims: %w", targets*contenders, err)
	}
	r.settled = time.Since(t0)
	r.cpuSettle = cpuSince(cpu0, t0)
	d.ops.quiesce(quietFor, quietMax)
	r.opSettle, r.reconcilesSettle = d.ops.snapshot().minus(o0), count()-rec0
	if d.profile {
		b.res.profiles = append(b.res.profiles, <-profiled)
	}
	if r.violations, err = b.checkLocks(ns, map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: 1, buildlockv1.PhaseWaiting: 1, buildlockv1.PhaseSuperseded: contenders - 2}); err != nil {
		return err
	}
	var holders []string
	for name, p := range tr.phases() {
		r.counts[string(p)]++
		if p == buildlockv1.PhaseHeld {
			holders = append(holders, name)
		}
	}

	o1, rec1, cpu1 := d.ops.snapshot(), count(), cpuSeconds()
	t1 := time.Now()
	err = parallel(len(holders), func(i int) error {
		return b.blc.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holders[i]}})
	})
	if err != nil {
		return err
	}
	if err := tr.waitUntil(ctx, phaseCounts(map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: targets, buildlockv1.PhaseWaiting: 0})); err != nil {
		return fmt.Errorf("handing %d locks over: %w", targets, err)
	}
	r.released = time.Since(t1)
	r.cpuRelease = cpuSince(cpu1, t1)
	d.ops.quiesce(quietFor, quietMax)
	r.opRelease, r.reconcilesRelease = d.ops.snapshot().minus(o1), count()-rec1
	v, err := b.checkLocks(ns, map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: 1, buildlockv1.PhaseWaiting: 0, buildlockv1.PhaseSuperseded: contenders - 2})
	r.violations += v
	return err
}

// checkLocks lists the claims live and counts the targets whose phases are
// not exactly want.
func (b *bench) checkLocks(ns string, want map[buildlockv1.Phase]int) (int, error) {
	var list buildlockv1.BuildLockList
	if err := b.c.List(b.ctx, &list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	byTarget := map[string]map[buildlockv1.Phase]int{}
	for _, bl := range list.Items {
		if byTarget[bl.Spec.Target] == nil {
			byTarget[bl.Spec.Target] = map[buildlockv1.Phase]int{}
		}
		byTarget[bl.Spec.Target][bl.Status.Phase]++
	}
	bad := 0
	for _, got := range byTarget {
		for p, n := range want {
			if got[p] != n {
				bad++
				break
			}
		}
	}
	return bad, nil
}

// blIdle counts the operator's requests while nothing changes for d: every
// lock of ns is also decided once more, by an annotation change on its
// holder (what any repeated event does), which must write nothing.
func (b *bench) blIdle(ns string, d time.Duration) (idleResult, error) {
	var list buildlockv1.BuildLockList
	if err := b.c.List(b.ctx, &list, client.InNamespace(ns)); err != nil {
		return idleResult{}, err
	}
	var holders []string
	for _, bl := range list.Items {
		if bl.Status.Phase == buildlockv1.PhaseHeld {
			holders = append(holders, bl.Name)
		}
	}
	b.ops.quiesce(quietFor, quietMax)
	r := idleResult{locks: len(holders), window: d}
	o0, rec0 := b.ops.snapshot(), reconciles()
	t0 := time.Now()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"bench.buildlock.io/poke":%q}}}`, t0.Format(time.RFC3339Nano))
	err := parallel(len(holders), func(i int) error {
		bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holders[i]}}
		return b.c.Patch(b.ctx, bl, client.RawPatch(types.MergePatchType, []byte(patch)))
	})
	if err != nil {
		return r, err
	}
	time.Sleep(time.Until(t0.Add(d)))
	r.ops, r.reconciles = b.ops.snapshot().minus(o0), reconciles()-rec0
	return r, nil
}

// reconciles is how many reconciles the in-process controller has run.
func reconciles() int {
	families, _ := ctrlmetrics.Registry.Gather()
	n := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "buildlock" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}

// apiserverProfile takes a CPU profile of the API server for d, while what
// runs, and returns its top functions (pprof's -top with args, if any).
func (b *bench) apiserverProfile(name, what string, d time.Duration, args ...string) string {
	raw, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(d.Seconds()))).DoRaw(b.ctx)
	if err != nil {
		return fmt.Sprintf("%s: %v", name, err)
	}
	path := filepath.Join(b.outDir, name+".cpu.pprof")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return err.Error()
	}
	if len(args) == 0 {
		args = []string{"-nodecount=25"}
	}
	out, err := exec.Command("go", append(append([]string{"tool", "pprof", "-top"}, args...), path)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: go tool pprof failed: %v\n%s", name, err, out)
	}
	return fmt.Sprintf("%s (%s, %s)\n%s", name, filepath.Base(path), what, out)
}
