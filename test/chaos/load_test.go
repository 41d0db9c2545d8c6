package chaos

// The load run: many concurrent pipelines, each a pkg/lock client doing a
// whole acquire → deploy → release cycle, while the chaos episodes run. It
// uses pkg/lock's public API only (lock.Acquire with a lock.Claim and its
// typed errors), and is kept to this file (and the CI jobs to jobs_test.go)
// so that a change of that API touches nothing else.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
	"github.com/buildlock/buildlock/pkg/lock"
)

// The documented outcomes of a pipeline.
const (
	outcomeReleased   = "held, deployed and released"
	outcomeSuperseded = "superseded (a newer build deploys)"
	outcomeTimeout    = "its own timeout while waiting"
	outcomeEnded      = "ended before holding (released or expired)"
)

// loadTargets is how many targets the pipelines share.
const loadTargets = 20

// loadRun is the load run's setup: its namespace, targets and client.
type loadRun struct {
	ns      string
	targets []string
	c       client.WithWatch
}

// prepareLoad creates the load run's namespace load-0 and its 20 targets'
// policies, split over the orderings like the workload's (a quarter each
// NewestWins, Queue, Fifo, Queue); nil when the run has no pipelines.
func (h *harness) prepareLoad(ctx context.Context) *loadRun {
	if h.o.pipelines == 0 {
		return nil
	}
	l := &loadRun{ns: "load-0"}
	h.createNamespace(ctx, l.ns)
	for i := range loadTargets {
		l.targets = append(l.targets, fmt.Sprintf("load-%d", i))
		k := LockKey{l.ns, l.targets[i]}
		switch i % 4 {
		case 1, 3:
			h.createPolicy(ctx, k, buildlockv1.OrderingQueue, 0)
		case 2:
			h.createPolicy(ctx, k, buildlockv1.OrderingFifo, 0)
		}
	}
	c, err := client.NewWithWatch(h.cp.balancedConfig(), client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		h.t.Fatal(err)
	}
	l.c = h.ownerClient(c)
	return l
}

// runLoad starts every pipeline at once and returns when all have ended.
// The run fails if one has not ended well after its own timeout (it waits
// forever), or ended with an outcome that is not a documented one.
func (h *harness) runLoad(ctx context.Context, l *loadRun) {
	n := h.o.pipelines
	outcomes, retries := newCounters(), newCounters()
	const timeout = 3 * time.Minute
	var wg sync.WaitGroup
	started := time.Now()
	var mu sync.Mutex
	var slowest time.Duration
	for i := range n {
		rng := rand.New(rand.NewPCG(h.o.seed, uint64(i)))
		claim := lock.Claim{
			Namespace: l.ns, Target: l.targets[rng.IntN(len(l.targets))],
			Repo: fmt.Sprintf("load/app-%d", rng.IntN(10)), Branch: "main", Build: int64(1 + i),
			ExpiresAfter: 20 * time.Second, Name: fmt.Sprintf("pipeline-%d", i),
		}
		wg.Go(func() {
			began := time.Now()
			out := runPipeline(ctx, l.c, claim, timeout, rng, retries)
			outcomes.add(out, 1)
			mu.Lock()
			slowest = max(slowest, time.Since(began))
			mu.Unlock()
		})
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(timeout + 2*time.Minute):
		h.t.Errorf("LOAD (seed %d): pipelines still running %s after they started, beyond their own timeout of %s: outcomes so far %s",
			h.o.seed, time.Since(started).Round(time.Second), timeout, outcomes)
		<-ended
	}
	documented := 0
	for _, o := range []string{outcomeReleased, outcomeSuperseded, outcomeTimeout, outcomeEnded} {
		documented += outcomes.get(o)
	}
	if documented != n {
		h.t.Errorf("LOAD (seed %d): %d of %d pipelines ended with a documented outcome: %s", h.o.seed, documented, n, outcomes)
	}
	mu.Lock()
	defer mu.Unlock()
	h.figure("load: %d concurrent pipelines over %d targets (pkg/lock, acquire → deploy → release, own timeout %s): %s; all ended within %s of the start (slowest %s); retried after API errors: %s",
		n, loadTargets, timeout, outcomes, time.Since(started).Round(time.Second), slowest.Round(time.Second), retries)
}

// runPipeline plays one pipeline: acquire (retrying after API errors, which
// a control-plane restart causes, until its own timeout), deploy for a
// moment, release. It returns the documented outcome it ended with; an
// outcome outside them is returned as its error text, which fails the run.
func runPipeline(ctx context.Context, c client.WithWatch, claim lock.Claim, timeout time.Duration, rng *rand.Rand, retries *counters) string {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		release, _, err := lock.Acquire(actx, c, claim)
		switch {
		case err == nil:
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond) // deploy
			for attempt := 0; ; attempt++ {
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				err := release(rctx)
				rcancel()
				if err == nil {
					return outcomeReleased
				}
				if attempt == 10 {
					return "release failed: " + err.Error()
				}
				retries.add("release", 1)
				time.Sleep(time.Second)
			}
		case errors.Is(err, lock.ErrSuperseded):
			return outcomeSuperseded
		case errors.Is(err, lock.ErrTimeout):
			return outcomeTimeout
		case errors.Is(err, lock.ErrEnded):
			return outcomeEnded
		case ctx.Err() != nil:
			return outcomeTimeout
		case actx.Err() != nil:
			return outcomeTimeout
		}
		retries.add("acquire", 1)
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
	}
}

// ownerClient wraps the pipelines' client so that the ledger records, before
// each call, what the pipelines (their pkg/lock) write: the claims they
// create, the renewals their pkg/lock sends, and their deletions.
func (h *harness) ownerClient(c client.WithWatch) client.WithWatch {
	var mu sync.Mutex
	specs := map[string]buildlockv1.BuildLockSpec{}
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if bl, ok := obj.(*buildlockv1.BuildLock); ok {
				h.ledger.WroteSpec(bl.Namespace, bl.Name, bl.Spec)
				mu.Lock()
				specs[bl.Namespace+"/"+bl.Name] = *bl.Spec.DeepCopy()
				mu.Unlock()
			}
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*buildlockv1.BuildLock); ok && patch.Type() == types.MergePatchType {
				data, err := patch.Data(obj)
				if err != nil {
					return err
				}
				var body struct {
					Spec struct {
						RenewTime *buildlockv1.Timestamp `json:"renewTime"`
					} `json:"spec"`
				}
				if json.Unmarshal(data, &body) == nil && body.Spec.RenewTime != nil {
					key := obj.GetNamespace() + "/" + obj.GetName()
					mu.Lock()
					spec := specs[key]
					spec.RenewTime = body.Spec.RenewTime
					specs[key] = spec
					mu.Unlock()
					h.ledger.WroteSpec(obj.GetNamespace(), obj.GetName(), spec)
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, ok := obj.(*buildlockv1.BuildLock); ok {
				h.ledger.RequestDelete(obj.GetNamespace(), obj.GetName())
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
}
