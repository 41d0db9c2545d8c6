//go:build bench

package bench

import (
	"fmt"
	"time"
)

// writeFloorContender writes what the floor contender measured beside what
// the operator did under the same loads: the floors of the scale, mass
// hand-off and cold start goals.
func writeFloorContender(r *results, p func(string, ...any)) {
	bl, floor, _, haveBL, haveFloor, _ := r.scaleRuns()
	f := r.cold.floor
	if !haveFloor && f.decided == 0 {
		return
	}
	p("## The floor contender")
	p("")
	p("The loads of sections 3 and 7 run twice in this run: decided by the operator, and by a stand-in that sends only the")
	p("requests the API makes necessary (`test/bench/floorcontender.go`). The same contenders create the same claims with the")
	p("same 32 clients; the stand-in watches them, as any operator must, and writes on %d workers (the operator's reconciles):", *flagWorkers)
	p("a status per claim with its verdict (of the operator's shape and size), a Lease create per lock naming its first claim,")
	p("and, when a holder's claim is deleted, the Lease's update to its waiter (a compare-and-swap on the version it wrote) and")
	p("the waiter's status. It knows the verdicts ahead, so it reads nothing else, records no Event, keeps no token floor,")
	p("retries nothing and writes no claim twice. The operator stops while it runs. What buildlock spends above it is the")
	p("operator's own: Events, the token floor's reads and raises, reads, retries, and reconciles that overlap.")
	p("")
	p("| Load | Measure | Floor contender | buildlock | buildlock / floor |")
	p("|---|---|--:|--:|--:|")
	row := func(load, measure string, floorV, blV float64, format string, haveF, haveB bool) {
		fv, bv, rv := "–", "–", "–"
		if haveF {
			fv = fmt.Sprintf(format, floorV)
		}
		if haveB {
			bv = fmt.Sprintf(format, blV)
		}
		if haveF && haveB && floorV > 0 {
			rv = fmt.Sprintf("%.2f×", blV/floorV)
		}
		p("| %s | %s | %s | %s | %s |", load, measure, fv, bv, rv)
	}
	secs := func(d time.Duration) float64 { return d.Seconds() }
	settle := fmt.Sprintf("scale: %d claims settle", targets*contenders)
	row(settle, "API server CPU per claim", floor.cpuPerClaim(), bl.cpuPerClaim(), "%.2f ms", haveFloor, haveBL)
	row(settle, "etcd CPU per claim", floor.cpuSecsPer("etcd", floor.claims, true), bl.cpuSecsPer("etcd", bl.claims, true), "%.2f ms", haveFloor, haveBL)
	row(settle, "time to settle", secs(floor.settled), secs(bl.settled), "%.2f s", haveFloor, haveBL)
	row(settle, "writes per claim", perFloat(floor.opSettle.writes(), floor.claims), perFloat(bl.opSettle.writes(), bl.claims), "%.2f", haveFloor, haveBL)
	row(settle, "requests per claim", perFloat(floor.opSettle.total(), floor.claims), perFloat(bl.opSettle.total(), bl.claims), "%.2f", haveFloor, haveBL)
	release := fmt.Sprintf("mass hand-off of %d locks", targets)
	row(release, "API server CPU per lock", floor.cpuPerLock(), bl.cpuPerLock(), "%.2f ms", haveFloor, haveBL)
	row(release, "etcd CPU per lock", floor.cpuSecsPer("etcd", floor.locksHandedOver(), false), bl.cpuSecsPer("etcd", bl.locksHandedOver(), false), "%.2f ms", haveFloor, haveBL)
	row(release, "CPU of the API server, etcd and the harness", floor.cpuRelease.busy(), bl.cpuRelease.busy(), "%.2f s", haveFloor, haveBL)
	row(release, "time until every waiter holds", secs(floor.released), secs(bl.released), "%.2f s", haveFloor, haveBL)
	row(release, "writes per lock", perFloat(floor.opRelease.writes(), floor.locksHandedOver()), perFloat(bl.opRelease.writes(), bl.locksHandedOver()), "%.2f", haveFloor, haveBL)
	c := r.cold
	cold := fmt.Sprintf("cold start: %d Pending claims, %d locks", claims, claims/claimsPerLock)
	haveCold := c.locks > 0
	row(cold, "time until every lock is decided", secs(f.decided), secs(c.firstDecision), "%.1f s", f.decided > 0, haveCold)
	row(cold, "writes", float64(f.requests.writes()), float64(c.firstManagerWrites), "%.0f", f.decided > 0, haveCold)
	row(cold, "API server CPU", f.cpu.secs["kube-apiserver"], c.firstCPU.secs["kube-apiserver"], "%.1f s", f.decided > 0, haveCold)
	row(cold, "etcd CPU", f.cpu.secs["etcd"], c.firstCPU.secs["etcd"], "%.1f s", f.decided > 0, haveCold)
	p("")
	p("The floor contender's requests, by verb: per claim settled %s; per lock handed over %s; cold start %s.",
		perOp(floor.opSettle, floor.claims), perOp(floor.opRelease, floor.locksHandedOver()), perOp(f.requests, 1))
	p("buildlock's cold start is the manager binary's, from its process's start (its informers list every claim and the")
	p("unrelated pods) until it is idle, polled every 0.5 s; the floor contender's from its list until the harness's watch saw")
	p("every claim decided.")
	p("")
}
