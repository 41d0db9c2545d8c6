//go:build bench

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// floor measures the fastest anything can change hands through this API
// server: one write of an object until a watcher sees it.
func (b *bench) floor(n int) ([]time.Duration, error) {
	ns := b.namespace("floor")
	cms := b.cs.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(b.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "floor"}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the floor ConfigMap: %w", err)
	}
	w, err := cms.Watch(b.ctx, metav1.SingleObject(cm.ObjectMeta))
	if err != nil {
		return nil, fmt.Errorf("watching the floor ConfigMap: %w", err)
	}
	defer w.Stop()
	var out []time.Duration
	for i := range warmup + n {
		cm.Data = map[string]string{"i": strconv.Itoa(i)}
		t0 := time.Now()
		if cm, err = cms.Update(b.ctx, cm, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("updating the floor ConfigMap: %w", err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified && ev.Object.(*corev1.ConfigMap).ResourceVersion == cm.ResourceVersion {
				break
			}
		}
		if i >= warmup {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// The plain Lease peer: each contender runs client-go's leader election on
// the target's Lease with the settings teams use.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// elector is one contender's leader-election run.
type elector struct {
	cancel  context.CancelFunc
	started chan time.Time // receives when OnStartedLeading runs
	done    chan struct{}  // closed when Run returned (after the release)
}

func startElector(ctx context.Context, cs kubernetes.Interface, ns, target, id string) (*elector, error) {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, target, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &elector{cancel: cancel, started: make(chan time.Time, 1), done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		ReleaseOnCancel: true, Name: target,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { e.started <- time.Now() },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { defer close(e.done); le.Run(ctx) }()
	return e, nil
}

// leaseHandoffs measures hand-offs between two contenders per target, on
// targets in parallel (a hand-off waits for the next contender's retry tick,
// up to RetryPeriod plus jitter, so one target alone would take an hour for
// 300). The holder holds for a random time before releasing, so that the
// release falls at a random point of the waiter's retry cycle.
func (b *bench) leaseHandoffs(cs kubernetes.Interface, targets, perTarget int) ([]time.Duration, error) {
	ns := b.namespace("lease-handoff")
	var (
		mu   sync.Mutex
		out  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	maxHold := retryPeriod + time.Duration(float64(retryPeriod)*leaderelection.JitterFactor)
	for t := range targets {
		wg.Go(func() {
			target := fmt.Sprintf("t%d", t)
			err := func() error {
				holder, err := startElector(b.ctx, cs, ns, target, "c0")
				if err != nil {
					return err
				}
				<-holder.started
				for i := 1; i <= perTarget; i++ {
					next, err := startElector(b.ctx, cs, ns, target, fmt.Sprintf("c%d", i))
					if err != nil {
						return err
					}
					time.Sleep(rand.N(maxHold))
					t0 := time.Now()
					holder.cancel() // ReleaseOnCancel: the holder empties the Lease
					select {
					case t1 := <-next.started:
						mu.Lock()
						out = append(out, t1.Sub(t0))
						mu.Unlock()
					case <-time.After(leaseDuration + retryPeriod*3):
						return fmt.Errorf("no hand-off on %s within %v", target, leaseDuration+retryPeriod*3)
					}
					<-holder.done
					holder = next
				}
				holder.cancel()
				<-holder.done
				return nil
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return out, fmt.Errorf("%d of %d targets failed, first: %w", len(errs), targets, errs[0])
	}
	return out, nil
}

// leaseAcquires measures acquisitions of free Leases (each target new).
func (b *bench) leaseAcquires(cs kubernetes.Interface, n int) ([]time.Duration, error) {
	ns := b.namespace("lease-acquire")
	var out []time.Duration
	for i := range warmup + n {
		t0 := time.Now()
		e, err := startElector(b.ctx, cs, ns, fmt.Sprintf("t%d", i), "c")
		if err != nil {
			return nil, err
		}
		t1 := <-e.started
		e.cancel()
		<-e.done
		if i >= warmup {
			out = append(out, t1.Sub(t0))
		}
	}
	return out, nil
}

// leaseScale starts contenders on every target at once, waits until each
// target has a leader, then cancels every leader at once and waits until
// each target has a new one.
func (b *bench) leaseScale(cs kubernetes.Interface, targets, contenders int) (scaleResult, error) {
	ns := b.namespace("lease-scale")
	r := scaleResult{row: rowLease, claims: targets * contenders, settledNote: "every target has a leader; the others poll"}
	type led struct {
		e *elector
		t time.Time
	}
	leaders := make(chan led, targets*contenders)
	all := make([]*elector, 0, targets*contenders)
	t0, cpu0 := time.Now(), cpuSeconds()
	for t := range targets {
		for k := range contenders {
			e, err := startElector(b.ctx, cs, ns, fmt.Sprintf("t%d", t), fmt.Sprintf("c%d", k))
			if err != nil {
				return r, err
			}
			all = append(all, e)
			go func() {
				select {
				case at := <-e.started:
					leaders <- led{e, at}
				case <-e.done:
				}
			}()
		}
	}
	r.created = time.Since(t0)
	first := make([]*elector, 0, targets)
	deadline := time.After(5 * time.Minute)
	for len(first) < targets {
		select {
		case l := <-leaders:
			first = append(first, l.e)
			r.settled = l.t.Sub(t0)
		case <-deadline:
			return r, fmt.Errorf("only %d of %d targets had a leader after 5m", len(first), targets)
		}
	}
	r.cpuSettle = cpuSince(cpu0, t0)
	t1, cpu1 := time.Now(), cpuSeconds()
	for _, e := range first {
		e.cancel()
	}
	for n := 0; n < targets; n++ {
		select {
		case l := <-leaders:
			r.released = l.t.Sub(t1)
		case <-deadline:
			return r, fmt.Errorf("only %d of %d targets had a new leader after 5m", n, targets)
		}
	}
	r.cpuRelease = cpuSince(cpu1, t1)
	for _, e := range all {
		e.cancel()
	}
	for _, e := range all {
		<-e.done
	}
	return r, nil
}
