//go:build bench

package bench

import (
	"context"
	"fmt"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// burstResult is the hand-off delay in one namespace while another
// namespace creates claims in a burst (issue 11, item 8): the same hand-offs
// measured first without the burst, then during it.
type burstResult struct {
	claims, targets  int
	created, settled time.Duration // the burst's: all created; every claim has a phase
	quiet, during    handoffRun
}

// burstHandoffs measures n hand-offs (claim deleted) in one namespace, then
// creates claims (two lines per target) in another namespace all at once,
// 32 clients in parallel, and measures hand-offs in the first namespace
// until every claim of the burst has a phase (at most n).
func (b *bench) burstHandoffs(n, claims int) (burstResult, error) {
	r := burstResult{claims: claims, targets: claims / 2}
	var err error
	if r.quiet, err = b.blHandoffs(n, handoffSpec{waiting: 1}); err != nil {
		return r, err
	}
	ns := b.namespace("burst")
	tr, err := trackClaims(b.ctx, b.c, ns)
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Minute)
	defer cancel()
	var burstErr error
	settled := make(chan struct{})
	t0 := time.Now()
	go func() {
		err := parallel(claims, func(i int) error {
			return b.c.Create(ctx, blClaim(ns, fmt.Sprintf("b-%d", i), fmt.Sprintf("t%d", i/2), fmt.Sprintf("acme/line-%d", i%2), 1, ""))
		})
		r.created = time.Since(t0)
		if err == nil {
			err = tr.waitUntil(ctx, func(phases map[string]buildlockv1.Phase) bool {
				decided := 0
				for _, p := range phases {
					if p != buildlockv1.PhasePending {
						decided++
					}
				}
				return decided == claims
			})
		}
		r.settled = time.Since(t0)
		burstErr = err
		close(settled)
	}()
	r.during, err = b.blHandoffs(n, handoffSpec{waiting: 1, until: settled})
	<-settled
	if err != nil {
		return r, err
	}
	return r, burstErr
}
