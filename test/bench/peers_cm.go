//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// cmContender runs one bid of the client-side protocol in the background.
type cmContender struct {
	bid    cmBid
	states chan cmReport
	result chan cmResult
}

type cmReport struct {
	state cmState
	at    time.Time
}

type cmResult struct {
	release func(context.Context) error
	err     error
}

func (l *cmLocker) start(ctx context.Context, bid cmBid) *cmContender {
	c := &cmContender{bid: bid, states: make(chan cmReport, 16), result: make(chan cmResult, 1)}
	go func() {
		release, err := l.acquire(ctx, bid, func(s cmState, at time.Time) { c.states <- cmReport{s, at} }, failOnError)
		c.result <- cmResult{release, err}
	}()
	return c
}

// failOnError makes a latency run's contender fail at its first failed
// request rather than retry it: a retried cycle would be a sample of the
// retry's pause.
func failOnError(error) bool { return false }

// await waits for the contender to report state and returns when it did.
func (c *cmContender) await(state cmState) (time.Time, error) {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r := <-c.states:
			if r.state == state {
				return r.at, nil
			}
		case res := <-c.result:
			c.result <- res
			if res.err != nil {
				return time.Time{}, fmt.Errorf("bid %d of %s ended: %w", c.bid.Build, c.bid.Repo, res.err)
			}
		case <-timeout:
			return time.Time{}, fmt.Errorf("bid %d of %s did not reach state %d within 30s", c.bid.Build, c.bid.Repo, state)
		}
	}
}

// cmHandoffs measures hand-offs on one target: a waiter joins and waits,
// then the holder releases (deletes the ConfigMap) or, withPods, its pod
// succeeds; the hand-off ends when the waiter's create succeeds.
func (b *bench) cmHandoffs(n int, withPods bool) (handoffRun, error) {
	mode := map[bool]string{false: "cm-delete", true: "cm-pods"}[withPods]
	run := handoffRun{}
	ns := b.namespace(mode)
	cnt := newCounter()
	l := &cmLocker{cs: kubernetes.NewForConfigOrDie(cnt.wrap(b.cfg)), ns: ns}
	join := func(i int) (*cmContender, error) {
		bid := cmBid{Target: "staging", Repo: fmt.Sprintf("acme/app-%d", i), Branch: "main", Build: int64(i + 1), Stamp: time.Now()}
		if withPods {
			pod, err := b.createPod(ns, fmt.Sprintf("p-%d", i))
			if err != nil {
				return nil, err
			}
			bid.Pod = pod
		}
		return l.start(b.ctx, bid), nil
	}
	holder, err := join(0)
	if err != nil {
		return run, err
	}
	if _, err := holder.await(cmHolding); err != nil {
		return run, err
	}
	for i := 1; i <= warmup+n; i++ {
		c0 := cnt.snapshot()
		next, err := join(i)
		if err != nil {
			return run, err
		}
		if _, err := next.await(cmWaiting); err != nil {
			return run, err
		}
		cnt.quiesce(quietFor, quietMax)
		c1 := cnt.snapshot()
		t0 := time.Now()
		if withPods {
			t0, err = b.succeedPod(ns, holder.bid.Pod.Name)
		} else {
			err = (<-holder.result).release(b.ctx)
		}
		if err != nil {
			return run, fmt.Errorf("releasing: %w", err)
		}
		t1, err := next.await(cmHolding)
		if err != nil {
			return run, err
		}
		cnt.quiesce(quietFor, quietMax)
		if i > warmup {
			run.add(t1.Sub(t0), c1.minus(c0), cnt.snapshot().minus(c1))
		}
		if withPods {
			if err := b.deletePod(ns, holder.bid.Pod.Name); err != nil {
				return run, err
			}
		}
		holder = next
	}
	return run, nil
}

// cmAcquires measures acquisitions of free locks (a new target each).
func (b *bench) cmAcquires(n int) ([]time.Duration, error) {
	l := &cmLocker{cs: b.cs, ns: b.namespace("cm-acquire")}
	var out []time.Duration
	for i := range warmup + n {
		bid := cmBid{Target: fmt.Sprintf("t%d", i), Repo: "acme/app", Branch: "main", Build: 1, Stamp: time.Now()}
		t0 := time.Now()
		release, err := l.acquire(b.ctx, bid, func(cmState, time.Time) {}, failOnError)
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			out = append(out, time.Since(t0))
		}
		if err := release(b.ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// cmScale starts contenders (one line each) on every target at once and
// waits until every target has settled: every contender decided, one
// holding, at most one waiting. Who waits depends on who created the
// ConfigMap first (when the newest build wins the create, both others give
// up). Then every holder releases at once, until every waiter holds.
//
// Contenders retry the requests that fail: with 3,000 of them started at
// once some creates fail ("unexpected EOF": the connection they were sent
// on closed under them), and a contender that stopped there would never
// decide, so the run could never settle. A contender that still ends with
// an error fails the run at once.
func (b *bench) cmScale(targets, contenders int) (scaleResult, error) {
	const released cmState = -1
	ns := b.namespace("cm-scale")
	r := scaleResult{row: rowCM, claims: targets * contenders, counts: map[string]int{}}
	l := &cmLocker{cs: b.cs, ns: ns}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()

	var (
		mu       sync.Mutex
		last     time.Time
		state    = make([]cmState, targets*contenders)
		decided  = make([]bool, targets*contenders)
		releases = make([]func(context.Context) error, targets*contenders)
		changed  = make(chan struct{}, 1)
		retried  int   // failed requests the contenders retried
		ended    error // the first contender that ended with an error
	)
	wake := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	set := func(i int, s cmState, at time.Time) {
		mu.Lock()
		state[i], decided[i] = s, true
		if !at.IsZero() {
			last = at
		}
		mu.Unlock()
		wake()
	}
	// wait waits until cond holds for the per-target counts of holding and
	// waiting contenders (false while any contender has not decided).
	wait := func(cond func(holding, waiting []int) bool) error {
		timeout := time.After(5 * time.Minute)
		for {
			mu.Lock()
			holding, waiting := make([]int, targets), make([]int, targets)
			all := true
			for i, s := range state {
				all = all && decided[i]
				switch s {
				case cmHolding:
					holding[i/contenders]++
				case cmWaiting:
					waiting[i/contenders]++
				}
			}
			failed := ended
			mu.Unlock()
			if failed != nil {
				return failed
			}
			if all && cond(holding, waiting) {
				return nil
			}
			select {
			case <-changed:
			case <-timeout:
				return fmt.Errorf("client-side protocol did not settle within 5m")
			}
		}
	}

	t0, cpu0 := time.Now(), cpuSeconds()
	for i := range targets * contenders {
		bid := cmBid{Target: fmt.Sprintf("t%d", i/contenders), Repo: fmt.Sprintf("acme/line-%d", i%contenders), Branch: "main", Build: 1, Stamp: time.Now()}
		go func() {
			retry := func(error) bool {
				mu.Lock()
				retried++
				mu.Unlock()
				return true
			}
			release, err := l.acquire(ctx, bid, func(s cmState, at time.Time) { set(i, s, at) }, retry)
			mu.Lock()
			releases[i] = release
			if err != nil && !errors.Is(err, errNewerWaits) && ctx.Err() == nil && ended == nil {
				ended = fmt.Errorf("contender %d of %s ended: %w", i%contenders, bid.Target, err)
			}
			mu.Unlock()
			wake()
		}()
	}
	r.created = time.Since(t0)
	waiters := 0
	err := wait(func(holding, waiting []int) bool {
		waiters = 0
		for t := range targets {
			if holding[t] != 1 || waiting[t] > 1 {
				return false
			}
			waiters += waiting[t]
		}
		return true
	})
	if err != nil {
		return r, err
	}
	r.cpuSettle = cpuSince(cpu0, t0)
	mu.Lock()
	r.settled = last.Sub(t0)
	var holders []int
	for i, s := range state {
		r.counts[[]string{"waiting", "holding", "gave up"}[s]]++
		if s == cmHolding {
			holders = append(holders, i)
		}
	}
	mu.Unlock()

	t1, cpu1 := time.Now(), cpuSeconds()
	err = parallel(len(holders), func(k int) error {
		i := holders[k]
		for { // the release function is stored just after the holding report
			mu.Lock()
			release := releases[i]
			mu.Unlock()
			if release != nil {
				err := release(b.ctx)
				set(i, released, time.Time{})
				return err
			}
			time.Sleep(time.Millisecond)
		}
	})
	if err != nil {
		return r, err
	}
	err = wait(func(holding, waiting []int) bool {
		n := 0
		for t := range targets {
			if waiting[t] > 0 {
				return false
			}
			n += holding[t]
		}
		return n == waiters
	})
	if err != nil {
		return r, err
	}
	r.cpuRelease = cpuSince(cpu1, t1)
	mu.Lock()
	r.released, r.handedOver = last.Sub(t1), waiters
	if retried > 0 {
		r.counts["requests retried after an error"] = retried
	}
	mu.Unlock()
	return r, nil
}
