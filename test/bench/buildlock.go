//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// blHandoffs measures hand-offs on one target through the operator: a new
// claim joins and is observed Waiting; then the holder's claim is deleted
// or, withPods, its pod succeeds; the hand-off ends when the waiter's watch
// shows it Held. The operator's requests of each step are counted and
// traced.
func (b *bench) blHandoffs(n int, withPods bool) (handoffRun, error) {
	mode := map[bool]string{false: "bl-delete", true: "bl-pods"}[withPods]
	run := handoffRun{}
	ns := b.namespace(mode)
	tr, err := trackClaims(b.ctx, b.blc, ns)
	if err != nil {
		return run, err
	}
	join := func(i int) (string, error) {
		name, pod := fmt.Sprintf("c-%d", i), ""
		if withPods {
			pod = fmt.Sprintf("p-%d", i)
			if _, err := b.createPod(ns, pod); err != nil {
				return "", err
			}
		}
		return name, b.blc.Create(b.ctx, blClaim(ns, name, "staging", fmt.Sprintf("acme/app-%d", i), int64(i+1), pod))
	}
	holder, err := join(0)
	if err != nil {
		return run, err
	}
	if _, err := tr.waitPhase(b.ctx, holder, buildlockv1.PhaseHeld); err != nil {
		return run, err
	}
	for i := 1; i <= warmup+n; i++ {
		o0, c0 := b.ops.snapshot(), b.blCount.snapshot()
		next, err := join(i)
		if err != nil {
			return run, err
		}
		if _, err := tr.waitPhase(b.ctx, next, buildlockv1.PhaseWaiting); err != nil {
			return run, err
		}
		b.ops.quiesce(quietFor, quietMax)
		o1, c1 := b.ops.snapshot(), b.blCount.snapshot()

		b.ops.startTrace()
		t0 := time.Now()
		if withPods {
			t0, err = b.succeedPod(ns, fmt.Sprintf("p-%d", i-1))
		} else {
			err = b.blc.Delete(b.ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder}})
		}
		if err != nil {
			return run, fmt.Errorf("releasing %s: %w", holder, err)
		}
		released := time.Now()
		t1, err := tr.waitPhase(b.ctx, next, buildlockv1.PhaseHeld)
		if err != nil {
			return run, err
		}
		b.ops.quiesce(quietFor, quietMax)
		trace := b.ops.stopTrace()
		if i > warmup {
			run.add(t1.Sub(t0), c1.minus(c0), b.blCount.snapshot().minus(c1))
			run.addOperator(o1.minus(o0), b.ops.snapshot().minus(o1))
			run.traces = append(run.traces, cycleTrace{t0: t0, released: released, observed: t1, requests: trace})
		}
		if withPods { // what --finished-ttl would do later; not part of the hand-off
			if err := b.c.Delete(b.ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder}}); err != nil {
				return run, err
			}
			if err := b.deletePod(ns, fmt.Sprintf("p-%d", i-1)); err != nil {
				return run, err
			}
			b.ops.quiesce(quietFor, quietMax)
		}
		holder = next
	}
	return run, nil
}

// blAcquires measures create → Held on free locks (a new target each), and
// the operator's requests per acquisition.
func (b *bench) blAcquires(n int) ([]time.Duration, counts, error) {
	ns := b.namespace("bl-acquire")
	tr, err := trackClaims(b.ctx, b.blc, ns)
	if err != nil {
		return nil, nil, err
	}
	var out []time.Duration
	var ops counts
	for i := range warmup + n {
		name := fmt.Sprintf("c-%d", i)
		o0 := b.ops.snapshot()
		t0 := time.Now()
		if err := b.blc.Create(b.ctx, blClaim(ns, name, fmt.Sprintf("t%d", i), "acme/app", 1, "")); err != nil {
			return nil, nil, err
		}
		t1, err := tr.waitPhase(b.ctx, name, buildlockv1.PhaseHeld)
		if err != nil {
			return nil, nil, err
		}
		b.ops.quiesce(quietFor, quietMax)
		if i >= warmup {
			out = append(out, t1.Sub(t0))
			ops = ops.plus(b.ops.snapshot().minus(o0))
		}
	}
	return out, ops, nil
}

// blScale creates contenders claims (one line each) on every target at once
// and waits until every lock has settled (one Held, one Waiting, the rest
// Superseded); then deletes every holder at once and waits until every
// waiter holds. The locks are left in place for the idle measurement.
func (b *bench) blScale(targets, contenders int) (scaleResult, string, error) {
	ns := b.namespace("bl-scale")
	r := scaleResult{row: rowBL, claims: targets * contenders, counts: map[string]int{}}
	tr, err := trackClaims(b.ctx, b.blc, ns)
	if err != nil {
		return r, ns, err
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
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()

	o0, rec0, cpu0 := b.ops.snapshot(), reconciles(), cpuSeconds()
	t0 := time.Now()
	profiled := make(chan string, 1)
	go func() { profiled <- b.apiserverProfile("apiserver-scale", 8*time.Second) }()
	err = parallel(targets*contenders, func(i int) error {
		t, k := i/contenders, i%contenders
		return b.blc.Create(ctx, blClaim(ns, fmt.Sprintf("t%d-%d", t, k), fmt.Sprintf("t%d", t), fmt.Sprintf("acme/line-%d", k), 1, ""))
	})
	if err != nil {
		return r, ns, err
	}
	r.created = time.Since(t0)
	settled := map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: targets, buildlockv1.PhaseWaiting: targets, buildlockv1.PhaseSuperseded: targets * (contenders - 2)}
	if err := tr.waitUntil(ctx, phaseCounts(settled)); err != nil {
		return r, ns, fmt.Errorf("settling %d claims: %w", targets*contenders, err)
	}
	r.settled = time.Since(t0)
	r.cpuSettle = cpuSince(cpu0, t0)
	b.ops.quiesce(quietFor, quietMax)
	r.opSettle, r.reconcilesSettle = b.ops.snapshot().minus(o0), reconciles()-rec0
	b.res.profiles = append(b.res.profiles, <-profiled)
	if r.violations, err = b.checkLocks(ns, map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: 1, buildlockv1.PhaseWaiting: 1, buildlockv1.PhaseSuperseded: contenders - 2}); err != nil {
		return r, ns, err
	}
	var holders []string
	for name, p := range tr.phases() {
		r.counts[string(p)]++
		if p == buildlockv1.PhaseHeld {
			holders = append(holders, name)
		}
	}

	o1, rec1, cpu1 := b.ops.snapshot(), reconciles(), cpuSeconds()
	t1 := time.Now()
	err = parallel(len(holders), func(i int) error {
		return b.blc.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holders[i]}})
	})
	if err != nil {
		return r, ns, err
	}
	if err := tr.waitUntil(ctx, phaseCounts(map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: targets, buildlockv1.PhaseWaiting: 0})); err != nil {
		return r, ns, fmt.Errorf("handing %d locks over: %w", targets, err)
	}
	r.released = time.Since(t1)
	r.cpuRelease = cpuSince(cpu1, t1)
	b.ops.quiesce(quietFor, quietMax)
	r.opRelease, r.reconcilesRelease = b.ops.snapshot().minus(o1), reconciles()-rec1
	v, err := b.checkLocks(ns, map[buildlockv1.Phase]int{buildlockv1.PhaseHeld: 1, buildlockv1.PhaseWaiting: 0, buildlockv1.PhaseSuperseded: contenders - 2})
	r.violations += v
	return r, ns, err
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

// apiserverProfile takes a CPU profile of the API server for d and returns
// its top functions.
func (b *bench) apiserverProfile(name string, d time.Duration) string {
	raw, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(d.Seconds()))).DoRaw(b.ctx)
	if err != nil {
		return fmt.Sprintf("%s: %v", name, err)
	}
	path := filepath.Join(b.outDir, name+".cpu.pprof")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return err.Error()
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: go tool pprof failed: %v\n%s", name, err, out)
	}
	return fmt.Sprintf("%s (%s, the first %s of the scale run)\n%s", name, filepath.Base(path), d, out)
}
