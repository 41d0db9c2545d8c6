//go:build bench

package bench

import "time"

// contractFloors writes what the goals of scale, mass hand-off and cold
// start cost the API server at the least, whatever the operator does: the
// requests that the API itself makes necessary (a claim is a BuildLock, its
// verdict is its status, a grant is a compare-and-swap of a Lease), each at
// its CPU cost measured alone in section 4, against the peer's measured
// figure and the goal's bound. A floor above a goal's bound says that the
// goal cannot be met on this API server and machine by any operator that
// keeps the API.
func contractFloors(r *results, p func(string, ...any)) {
	cost, etcd := map[string]time.Duration{}, map[string]time.Duration{}
	for _, c := range r.costs {
		cost[c.what], etcd[c.what] = c.apiserver, c.etcd
	}
	need := []string{"create buildlocks", "update buildlocks/status", "delete buildlocks", "update leases", "create leases"}
	for _, k := range need {
		if _, ok := cost[k]; !ok {
			return
		}
	}
	msf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	create, status, del, leaseUpdate, leaseCreate := msf(cost[need[0]]), msf(cost[need[1]]), msf(cost[need[2]]), msf(cost[need[3]]), msf(cost[need[4]])
	p("## Floors of the API")
	p("")
	p("What a goal costs the API server at the least, whatever the operator does: only the requests the API itself makes")
	p("necessary (a claim is a BuildLock that its pipeline creates, its verdict is its status, a grant is a compare-and-swap of")
	p("its Lease), each at the CPU it took alone in section 4; no Events, no reads, no retries. A floor above a goal's bound")
	p("means no operator that keeps the API meets that goal on this API server and machine.")
	p("")
	p("| Goal | The least it needs | Floor | Bound | |")
	p("|---|---|--:|--:|---|")
	bound := func(floor, limit float64) string {
		if floor > limit {
			return "**out of reach**"
		}
		return "within reach"
	}
	if _, cms, ok := r.scaleRows(); ok {
		peerClaim, peerLock := cms.cpuPerClaim(), cms.cpuPerLock()
		perClaim := create + status
		p("| API server CPU per settled claim ≤ 1.2× the client-side peer's (%.1f ms) | per claim: its create (%.2f ms) and one status write (%.2f ms) | %.1f ms = %.1f× | 1.2× | %s |",
			peerClaim, create, status, perClaim, perClaim/peerClaim, bound(perClaim, 1.2*peerClaim))
		perLock := del + leaseUpdate + status
		p("| API server CPU per lock handed over ≤ 2× the peer's (%.1f ms) | per lock: the holder's delete (%.2f ms), the grant's Lease update (%.2f ms), the new holder's status (%.2f ms) | %.1f ms = %.1f× | 2× | %s |",
			peerLock, del, leaseUpdate, status, perLock, perLock/peerLock, bound(perLock, 2*peerLock))
	}
	if c := r.cold; c.locks > 0 {
		// A time, not a CPU share: the API server and etcd, which stores
		// each write, share the machine's cores.
		etcdStatus, etcdLease := msf(etcd["update buildlocks/status"]), msf(etcd["create leases"])
		cores := max(r.env.cores, 1)
		secs := (float64(claims)*(status+etcdStatus) + float64(c.locks)*(leaseCreate+etcdLease)) / 1000 / float64(cores)
		p("| Cold start over %d Pending claims ≤ 15 s | a status write per claim (%.2f ms of API server and %.2f ms of etcd CPU each) and a Lease create per lock (%d, %.2f ms and %.2f ms), on all %d cores with nothing else running | %.1f s | 15 s | %s |",
			claims, status, etcdStatus, c.locks, leaseCreate, etcdLease, cores, secs, bound(secs, 15))
	}
	p("")
	p("The peer's figures are its own, of section 3: its contenders' creates, reads and retries. buildlock's measured figures are")
	p("the Goals' above: the floor plus the Events, the token floor's reads and raises, and the reconciles' overlap.")
	p("")
}
