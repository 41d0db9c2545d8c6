//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/pkg/lock"
)

// The pipeline load of the chaos run's shape, without its faults: pod-less
// pkg/lock pipelines that arrive over a minute on a few NewestWins targets,
// each holding a moment and releasing, against the manager binary (the
// operator users run, built without the race detector).
var (
	pipelineCount    = 500
	pipelineTargets  = 20
	pipelineArrivals = time.Minute // the pipelines start spread over this window
)

const (
	pipelineTimeout = 3 * time.Minute  // a pipeline gives up waiting after this (a timeout)
	pipelineExpiry  = 20 * time.Second // the claims' expiresAfter, as the chaos load's
	holdMin         = time.Second      // a pipeline deploys for holdMin + [0, holdSpread)
	holdSpread      = 4 * time.Second
)

// pipelineResult is one pipeline's run, as its own calls saw it.
type pipelineResult struct {
	target         int
	arrived        time.Time // Acquire called
	granted        time.Time // Acquire returned a hold; zero otherwise
	released       time.Time // its release returned
	ended          time.Time // Acquire returned without a hold
	token          int64
	outcome        string
	err            error // an outcome outside the documented ones
	releaseRetries int
}

// The documented outcomes of a pipeline (as the chaos load's).
const (
	pipelineDeployed   = "deployed"
	pipelineSuperseded = "superseded"
	pipelineTimedOut   = "timed out"
	pipelineEnded      = "ended before holding"
)

// pipelineRun is the step's result.
type pipelineRun struct {
	pipelines, targets int
	arrivals           time.Duration
	outcomes           map[string]int
	// handoffs: per lock, the end of a hold (its release returned) until
	// the next grant on that target was observed by its new holder (its
	// Acquire returned), for the holds that ended while that holder's
	// claim waited. The same samples, seen from the pipeline, are its turn
	// until its grant.
	handoffs     []time.Duration
	handoffsBy   []int           // hand-offs per target
	worstTarget  time.Duration   // the highest per-target p99
	freeAcquires []time.Duration // Acquire on a free lock: called until it returned
	superseded   []time.Duration // Acquire called until it returned Superseded
	idleEnds     int             // holds that ended with no pipeline waiting for the target
	wall         time.Duration   // first arrival until the last pipeline ended
	startup      time.Duration   // the manager binary's start until it was idle
	// The manager's requests and writes during the pipelines (its
	// rest_client_requests_total), and the grants they made.
	requests, writes float64
	grants           int
	failures         []string // undocumented outcomes, first few
	measured         bool     // the step ran to its end
}

// runPipelines starts the manager binary, waits until it has decided what
// the earlier steps left, and runs n pipelines over the given targets in a
// namespace of their own.
func (b *bench) runPipelines(n, targets int, arrivals time.Duration) (pipelineRun, error) {
	run := pipelineRun{pipelines: n, targets: targets, arrivals: arrivals, outcomes: map[string]int{}}
	proc, err := b.startManagerBinary("pipelines")
	if err != nil {
		return run, err
	}
	defer proc.stop()
	if run.startup, err = proc.waitIdle(0, func() bool { return true }); err != nil {
		return run, err
	}
	m0, err := scrape(proc.metricsAddr)
	if err != nil {
		return run, err
	}
	c, err := lock.NewClient(b.cfg)
	if err != nil {
		return run, err
	}
	ns := b.namespace("pipelines")
	results := make([]pipelineResult, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		rng := rand.New(rand.NewPCG(26, uint64(i)))
		target := rng.IntN(targets)
		claim := lock.Claim{
			Namespace: ns, Target: fmt.Sprintf("target-%d", target),
			Repo: fmt.Sprintf("load/app-%d", rng.IntN(10)), Branch: "main", Build: int64(1 + i),
			ExpiresAfter: pipelineExpiry, Name: fmt.Sprintf("pipeline-%d", i),
		}
		start := t0.Add(time.Duration(rng.Int64N(int64(arrivals))))
		hold := holdMin + time.Duration(rng.Int64N(int64(holdSpread)))
		wg.Go(func() {
			time.Sleep(time.Until(start))
			results[i] = runOnePipeline(b.ctx, c, claim, hold)
			results[i].target = target
		})
	}
	wg.Wait()
	run.wall = time.Since(t0)
	m1, err := scrape(proc.metricsAddr)
	if err != nil {
		return run, err
	}
	run.requests = m1["rest_client_requests_total"] - m0["rest_client_requests_total"]
	run.writes = m1[managerWrites] - m0[managerWrites]
	summarizePipelines(&run, results)
	if len(run.failures) > 0 {
		return run, fmt.Errorf("%d of %d pipelines ended with an undocumented outcome, first: %s", n-documented(run.outcomes), n, run.failures[0])
	}
	run.measured = true
	return run, nil
}

func documented(outcomes map[string]int) int {
	return outcomes[pipelineDeployed] + outcomes[pipelineSuperseded] + outcomes[pipelineTimedOut] + outcomes[pipelineEnded]
}

// runOnePipeline plays one pipeline as a user's would: Acquire with its own
// timeout, deploy for hold, release. Unlike the chaos load it does not retry
// Acquire after an API error: there are no faults here, so an error is an
// outcome to report.
func runOnePipeline(ctx context.Context, c client.WithWatch, claim lock.Claim, hold time.Duration) pipelineResult {
	r := pipelineResult{arrived: time.Now()}
	actx, cancel := context.WithTimeout(ctx, pipelineTimeout)
	defer cancel()
	release, token, err := lock.Acquire(actx, c, claim)
	switch {
	case err == nil:
		r.granted, r.token = time.Now(), token
	case errors.Is(err, lock.ErrSuperseded):
		r.ended, r.outcome = time.Now(), pipelineSuperseded
		return r
	case errors.Is(err, lock.ErrTimeout), actx.Err() != nil:
		r.ended, r.outcome = time.Now(), pipelineTimedOut
		return r
	case errors.Is(err, lock.ErrEnded):
		r.ended, r.outcome = time.Now(), pipelineEnded
		return r
	default:
		r.ended, r.err = time.Now(), fmt.Errorf("acquire of %s: %w", claim.Name, err)
		return r
	}
	time.Sleep(hold) // deploy
	for {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := release(rctx)
		rcancel()
		if err == nil {
			r.released, r.outcome = time.Now(), pipelineDeployed
			return r
		}
		if r.releaseRetries == 10 {
			r.err = fmt.Errorf("release of %s: %w", claim.Name, err)
			return r
		}
		r.releaseRetries++
		time.Sleep(time.Second)
	}
}

// summarizePipelines pairs, on each target, every hold's end with the next
// grant (the next higher token: tokens count a lock's grants) and keeps the
// pair when the new holder had arrived before the hold ended: the hand-off
// it waited for. A grant with no hold before it that its holder waited for
// is an acquire of a free lock.
func summarizePipelines(run *pipelineRun, results []pipelineResult) {
	byTarget := make([][]pipelineResult, run.targets)
	for _, r := range results {
		if r.err != nil {
			if len(run.failures) < 5 {
				run.failures = append(run.failures, r.err.Error())
			}
			run.outcomes["failed"]++
			continue
		}
		run.outcomes[r.outcome]++
		switch {
		case !r.granted.IsZero():
			run.grants++
			byTarget[r.target] = append(byTarget[r.target], r)
		case r.outcome == pipelineSuperseded:
			run.superseded = append(run.superseded, r.ended.Sub(r.arrived))
		}
	}
	run.handoffsBy = make([]int, run.targets)
	for t, holds := range byTarget {
		slices.SortFunc(holds, func(a, b pipelineResult) int { return int(a.token - b.token) })
		var onTarget []time.Duration
		for k, next := range holds {
			if k == 0 || holds[k-1].released.IsZero() || !next.arrived.Before(holds[k-1].released) {
				run.freeAcquires = append(run.freeAcquires, next.granted.Sub(next.arrived))
				if k > 0 {
					run.idleEnds++
				}
				continue
			}
			onTarget = append(onTarget, next.granted.Sub(holds[k-1].released))
		}
		if len(holds) > 0 {
			run.idleEnds++ // the target's last hold
		}
		run.handoffs = append(run.handoffs, onTarget...)
		run.handoffsBy[t] = len(onTarget)
		run.worstTarget = max(run.worstTarget, percentile(onTarget, 99))
	}
}

// leastWrites is what the pipelines' claims cost in writes at the least: a
// status per claim (its verdict), a Lease write per grant, and a second
// status for each claim that waited before its grant (Waiting, then Held).
// A claim that waited and was then superseded also takes two, which this
// leaves out.
func (r pipelineRun) leastWrites() int {
	return r.pipelines + r.grants + len(r.handoffs)
}

// goalMet is the row's goal: p99 end of a hold → next grant ≤ 1 s, and no
// pipeline timed out.
func (r pipelineRun) goalMet() bool {
	return percentile(r.handoffs, 99) <= time.Second && r.outcomes[pipelineTimedOut] == 0
}

// reportPipelines writes section 11 of the report.
func reportPipelines(p func(string, ...any), pr pipelineRun) {
	if pr.pipelines == 0 {
		return
	}
	p("## 11. pkg/lock pipelines on the manager binary")
	p("")
	p("%d pipelines, each `pkg/lock.Acquire` with a pod-less claim (expiresAfter %s, NewestWins: no policy) on one of %d", pr.pipelines, pipelineExpiry, pr.targets)
	p("targets at random, arriving at random over %s, holding %s–%s and releasing; a pipeline gives up after %s. The", pr.arrivals, holdMin, holdMin+holdSpread, pipelineTimeout)
	p("manager binary (`bin/manager`, no race detector, `--leader-elect=false`, every namespace) decides alone: the in-process")
	p("operator is stopped for the step. A *hand-off* is the end of a hold (its release returned) until the next grant on that")
	p("target is observed by its new holder (its Acquire returned), for the holds that ended while that holder waited: the same")
	p("samples are each such pipeline's time from its turn to its grant. The manager was idle %s after its start (it first decides", ms(pr.startup))
	p("what the earlier steps left); the pipelines ran for %s.", ms(pr.wall))
	if !pr.measured {
		p("")
		p("The step failed (see above): the figures below are what it measured before that.")
	}
	p("")
	p("| Per pipeline | |")
	p("|---|--:|")
	for _, o := range []string{pipelineDeployed, pipelineSuperseded, pipelineTimedOut, pipelineEnded, "failed"} {
		p("| %s | %d |", o, pr.outcomes[o])
	}
	p("")
	p("| Samples | n | p50 | p90 | p99 | max |")
	p("|---|--:|--:|--:|--:|--:|")
	row := func(what string, lat []time.Duration) {
		p("| %s | %d | %s | %s | %s | %s |", what, len(lat), msSigned(median(lat)), msSigned(percentile(lat, 90)), msSigned(percentile(lat, 99)), msSigned(percentile(lat, 100)))
	}
	row("per lock: end of a hold → next grant observed by its holder", pr.handoffs)
	row("per pipeline that waited: its turn (the hold before its grant ended) → its grant", pr.handoffs)
	row("per pipeline on a free lock: Acquire called → it holds", pr.freeAcquires)
	row("per superseded pipeline: Acquire called → Superseded", pr.superseded)
	p("")
	lo, hi := 0, 0
	if len(pr.handoffsBy) > 0 {
		lo, hi = slices.Min(pr.handoffsBy), slices.Max(pr.handoffsBy)
	}
	p("Hand-offs per target: %d to %d; the worst target's p99: %s. Holds that ended with no pipeline waiting for their target: %d.",
		lo, hi, msSigned(pr.worstTarget), pr.idleEnds)
	if pr.grants > 0 {
		p("The manager's requests while the pipelines ran (its `rest_client_requests_total`): %.0f, %.0f of them writes, over %d grants:",
			pr.requests, pr.writes, pr.grants)
		p("%.1f requests and %.1f writes per grant, deciding %d claims (%.1f writes per claim).",
			pr.requests/float64(pr.grants), pr.writes/float64(pr.grants), pr.pipelines, pr.writes/float64(pr.pipelines))
	}
	p("")
}
