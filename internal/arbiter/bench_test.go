package arbiter

import (
	"fmt"
	"testing"
	"time"
)

// benchInput is a busy lock: n claims over n/4+1 lines, most pending, one
// holding, one waiting, a tenth already terminal.
func benchInput(n int) input {
	ch := seeded(uint64(n))
	in := input{now: at(60), policy: Policy{MaxHold: 2 * time.Hour}}
	for k := range n {
		c := claim(fmt.Sprintf("bl-%05d", k), fmt.Sprintf("acme/repo-%d@main", ch.intn(n/4+1)), int64(1+ch.intn(1000)), ch.intn(60))
		if ch.intn(10) == 0 {
			c.Phase = Superseded
		}
		in.claims = append(in.claims, c)
	}
	in.claims[0].Phase = Held
	in.grant = grantTo(in.claims[0], 7, 30)
	if n > 1 {
		in.claims[1].Phase = Waiting
	}
	return in
}

func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000, 10000} {
		in := benchInput(n)
		b.Run(fmt.Sprintf("claims=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Decide(staging, in.claims, in.grant, in.now, in.policy)
			}
		})
	}
}

// TestDecideAllocatesAConstantPerClaim guards the cost's growth where timing
// would be flaky: at most one allocation per claim (a message that changed,
// plus a few per decision), however many claims.
func TestDecideAllocatesAConstantPerClaim(t *testing.T) {
	for _, n := range []int{1000, 10000} {
		in := benchInput(n)
		allocs := testing.AllocsPerRun(3, func() { in.decide() })
		if perClaim := allocs / float64(n); perClaim > 1 {
			t.Errorf("%.0f allocations for %d claims: %.2f per claim, want at most 1", allocs, n, perClaim)
		}
	}
}
