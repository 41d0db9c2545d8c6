//go:build bench

package bench

import (
	"fmt"
	"strings"
	"time"
)

// goalRow is one line of the Goals table: what the goal asks, the floor it
// is judged against (measured in the same run), what buildlock measured,
// the client-side peer's figure (information only, never judged), and the
// verdict.
type goalRow struct {
	goal, floor, measured, peer, verdict string
}

// goals are the Goals table's rows in order: each function returns its
// goal's rows, with *not measured* for what a failed or skipped step left
// out. A new goal is one more function here.
var goals = []func(*results) []goalRow{
	handoffGoal,
	acquireGoals,
	settleGoal,
	massHandoffGoal,
	coldStartGoals,
	decideGoal,
	pipelineGoals,
	safetyGoal,
}

const notMeasured = "**not measured**"

// writeGoals writes the Goals table.
func writeGoals(r *results, p func(string, ...any)) {
	p("## Goals")
	p("")
	p("Each goal against its floor, measured in this run: what the API itself makes necessary, at the same time and under the")
	p("same load (the two-hop floor and one create → watch of section 1; the floor contender of the scale, mass hand-off and cold")
	p("start loads, which sends only the requests the API makes necessary: see *The floor contender* below). The client-side")
	p("peer's figures are beside them for information; no goal is judged against them. A hand-off or acquire ends when the")
	p("client learns it holds: from its grant Lease (`holderIdentity` names the claim, `leaseTransitions` is the fencing token),")
	p("as `pkg/lock` and the plugin do.")
	p("")
	p("| Goal | Floor (this run) | buildlock | Client-side peer (information) | |")
	p("|---|---|---|---|---|")
	for _, g := range goals {
		for _, row := range g(r) {
			p("| %s | %s | %s | %s | %s |", row.goal, row.floor, row.measured, cmpOr(row.peer, "–"), row.verdict)
		}
	}
	p("")
}

func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// latencyBound says how samples compare with a floor's p50 and p99: "p50 X
// = r×, p99 Y = r×", and whether p50 ≤ k50 × the floor's p50 and p99 ≤ k99
// × its p99.
func latencyBound(lat, floor []time.Duration, k50, k99 float64) (string, bool) {
	if len(lat) == 0 || len(floor) == 0 {
		return notMeasuredText, false
	}
	p50, p99 := median(lat), percentile(lat, 99)
	f50, f99 := median(floor), percentile(floor, 99)
	return fmt.Sprintf("p50 %s = %s, p99 %s = %s", ms(p50), ratio(p50, f50), ms(p99), ratio(p99, f99)),
		float64(p50) <= k50*float64(f50) && float64(p99) <= k99*float64(f99)
}

func p50p99(lat []time.Duration) string {
	if len(lat) == 0 {
		return ""
	}
	return fmt.Sprintf("p50 %s, p99 %s", ms(median(lat)), ms(percentile(lat, 99)))
}

func handoffGoal(r *results) []goalRow {
	floor := r.floors.twoHop
	delLease, okDel := latencyBound(r.blDelete.latLease, floor, 1.5, 3)
	podLease, okPod := latencyBound(r.blPods.latLease, floor, 1.5, 3)
	delStatus, _ := latencyBound(r.blDelete.lat, floor, 1.5, 3)
	podStatus, _ := latencyBound(r.blPods.lat, floor, 1.5, 3)
	var peer []string
	if len(r.cmDelete.lat) > 0 {
		peer = append(peer, "claim deleted "+p50p99(r.cmDelete.lat))
	}
	if len(r.cmPods.lat) > 0 {
		peer = append(peer, "pod Succeeded "+p50p99(r.cmPods.lat))
	}
	return []goalRow{{
		goal:  "Hand-off p50 ≤ 1.5× the two-hop floor, p99 ≤ 3×",
		floor: "two-hop (a delete → watch, then a Lease update → watch): " + cmpOr(p50p99(floor), notMeasuredText),
		measured: fmt.Sprintf("grant Lease: claim deleted %s; pod Succeeded %s. Status (`kubectl wait`, one write later): claim deleted %s; pod Succeeded %s",
			delLease, podLease, delStatus, podStatus),
		peer:    strings.Join(peer, "; "),
		verdict: verdict(okDel && okPod, floor, r.blDelete.latLease, r.blPods.latLease),
	}}
}

// acquireGoals: a free lock, and Superseded, learned within 2× (p50) and 3×
// (p99) one BuildLock create → watch, by the harness's own create → watch
// (the operator's share), by pkg/lock and by the plugin.
func acquireGoals(r *results) []goalRow {
	floor := r.floors.create
	floorText := "one BuildLock create → watch: " + cmpOr(p50p99(floor), notMeasuredText)
	peer := ""
	if len(r.acquireCM) > 0 {
		peer = "create the ConfigMap: " + p50p99(r.acquireCM)
	}
	// judge renders the named samples against the bound; a verdict needs
	// every one of them.
	judge := func(parts ...any) (string, string) {
		var texts []string
		ok, samples := true, [][]time.Duration{floor}
		for i := 0; i < len(parts); i += 2 {
			name, lat := parts[i].(string), parts[i+1].([]time.Duration)
			samples = append(samples, lat)
			text, met := latencyBound(lat, floor, 2, 3)
			texts, ok = append(texts, name+" "+text), ok && met
		}
		return strings.Join(texts, "; "), verdict(ok, samples...)
	}
	var rows []goalRow
	own, ownVerdict := judge("new target", r.acquireBL.latLease, "target whose Lease is kept", r.acquireKept.latLease)
	if len(r.acquireBL.lat) > 0 {
		own += fmt.Sprintf(". Status shows Held: new target p50 %s, kept %s", ms(median(r.acquireBL.lat)), ms(median(r.acquireKept.lat)))
	}
	rows = append(rows, goalRow{
		goal:  "Acquire a free lock, p50 ≤ 2× the floor, p99 ≤ 3×: the harness's own create → grant Lease seen (the operator's share of every client's acquire)",
		floor: floorText, measured: own, peer: peer, verdict: ownVerdict,
	})
	lockFree, lockVerdict := judge("new target", r.acquireLock.free, "kept Lease", r.acquireLock.freeKept)
	if pr := r.pipelines; len(pr.freeAcquires) > 0 {
		lockFree += fmt.Sprintf(". Under the load of section 11 (information): %s", p50p99(pr.freeAcquires))
	}
	rows = append(rows, goalRow{
		goal:  "Acquire a free lock through `pkg/lock` (Acquire called → it returns the hold), p50 ≤ 2× the floor, p99 ≤ 3×",
		floor: floorText, measured: lockFree, peer: peer, verdict: lockVerdict,
	})
	pluginFree, pluginVerdict := judge("new target", r.acquirePlugin.free, "kept Lease", r.acquirePlugin.freeKept)
	if len(r.acquirePlugin.startup) > 0 {
		pluginFree += fmt.Sprintf(". Left out: the process's start until its first connection, p50 %s", ms(median(r.acquirePlugin.startup)))
	}
	rows = append(rows, goalRow{
		goal:  "Acquire a free lock through the plugin (`kubectl buildlock acquire`: its first connection → the token printed), p50 ≤ 2× the floor, p99 ≤ 3×",
		floor: floorText, measured: pluginFree, peer: peer, verdict: pluginVerdict,
	})
	for _, c := range []struct {
		who string
		run clientRun
	}{
		{"the harness's own create → status Superseded seen", r.acquireRaw},
		{"`pkg/lock` (Acquire returns ErrSuperseded)", r.acquireLock},
		{"the plugin (it exits 3)", r.acquirePlugin},
	} {
		text, v := judge("on arrival (a build below its line's holder)", c.run.supersededNow,
			"while waiting (from a newer build's create)", c.run.supersededWaiting)
		rows = append(rows, goalRow{
			goal:  "Learn `Superseded` as fast: " + c.who + ", p50 ≤ 2× the floor, p99 ≤ 3×",
			floor: floorText, measured: text, verdict: v,
		})
	}
	return rows
}

// scaleRuns returns the scale rows of buildlock, of the floor contender and
// of the client-side peer, and which of them ran.
func (r *results) scaleRuns() (bl, floor, cm scaleResult, haveBL, haveFloor, haveCM bool) {
	for _, s := range r.scale {
		switch {
		case strings.HasPrefix(s.row, rowBL):
			bl, haveBL = s, s.settled > 0
		case s.row == rowFloorContender:
			floor, haveFloor = s, s.settled > 0
		case s.row == rowCM:
			cm, haveCM = s, s.settled > 0
		}
	}
	return
}

func settleGoal(r *results) []goalRow {
	bl, floor, cm, haveBL, haveFloor, haveCM := r.scaleRuns()
	row := goalRow{goal: fmt.Sprintf("Scale, %d claims at once: API server CPU per settled claim ≤ 1.2× the floor contender's", targets*contenders),
		floor: notMeasuredText, measured: notMeasuredText, verdict: notMeasured}
	if haveFloor {
		row.floor = fmt.Sprintf("%.1f ms per claim (its create, one status write; one Lease create per lock); %.0f claims settled per second",
			floor.cpuPerClaim(), floor.settleRate())
	}
	if haveBL {
		row.measured = fmt.Sprintf("%.1f ms per claim; %.0f claims settled per second", bl.cpuPerClaim(), bl.settleRate())
	}
	if haveBL && haveFloor {
		row.measured = fmt.Sprintf("%.1f ms per claim = %.2f×; %.0f claims settled per second = %.2f×",
			bl.cpuPerClaim(), bl.cpuPerClaim()/floor.cpuPerClaim(), bl.settleRate(), bl.settleRate()/floor.settleRate())
		row.verdict = yesNo(bl.cpuPerClaim() <= 1.2*floor.cpuPerClaim())
	}
	if haveCM {
		row.peer = fmt.Sprintf("%.1f ms per claim; %.0f claims settled per second", cm.cpuPerClaim(), cm.settleRate())
	}
	return []goalRow{row}
}

const notMeasuredText = "not measured"

func massHandoffGoal(r *results) []goalRow {
	bl, floor, cm, haveBL, haveFloor, haveCM := r.scaleRuns()
	row := goalRow{goal: fmt.Sprintf("Mass hand-off of %d locks: API server CPU per lock ≤ 1.25× the floor contender's, its time ≤ 1.5× what the floor's CPU takes on this machine, "+
		"no request per hand-off that grows with the namespace", targets),
		floor: notMeasuredText, measured: notMeasuredText, verdict: notMeasured}
	cores := float64(max(r.env.cores, 1))
	floorTime := time.Duration(floor.cpuRelease.busy() / cores * float64(time.Second))
	if haveFloor {
		row.floor = fmt.Sprintf("%.1f ms per lock (the holder's delete, the grant's Lease update, the new holder's status); its CPU (API server, etcd, "+
			"harness: %.1f s) takes %s on %d cores; its own time %s", floor.cpuPerLock(), floor.cpuRelease.busy(), ms(floorTime), int(cores), ms(floor.released))
	}
	lists := 0.0
	if haveBL {
		lists = float64(bl.opRelease["list buildlocks"]) / float64(targets)
		row.measured = fmt.Sprintf("%.1f ms per lock; %s; live lists of claims per hand-off: %.2f", bl.cpuPerLock(), ms(bl.released), lists)
	}
	if haveBL && haveFloor {
		row.measured = fmt.Sprintf("%.1f ms per lock = %.2f×; %s = %s the floor's CPU time (%s its own time; other processes used %.2f of the cores meanwhile); "+
			"live lists of claims per hand-off: %.2f",
			bl.cpuPerLock(), bl.cpuPerLock()/floor.cpuPerLock(), ms(bl.released), ratio(bl.released, floorTime), ratio(bl.released, floor.released),
			bl.cpuRelease.others(), lists)
		row.verdict = yesNo(bl.cpuPerLock() <= 1.25*floor.cpuPerLock() && float64(bl.released) <= 1.5*float64(floorTime) && lists < 0.05)
	}
	if haveCM {
		row.peer = fmt.Sprintf("%.1f ms per lock; %s", cm.cpuPerLock(), ms(cm.released))
	}
	return []goalRow{row}
}

func coldStartGoals(r *results) []goalRow {
	c := r.cold
	first := goalRow{goal: fmt.Sprintf("Cold start over %d Pending claims: every lock decided within 1.25× the floor contender's time, at most one write per claim and one per lock", claims),
		floor: notMeasuredText, measured: notMeasuredText, verdict: notMeasured}
	f := c.floor
	if f.decided > 0 {
		first.floor = fmt.Sprintf("%.1f s: one list, %d writes (a status per claim, a Lease create per lock)", f.decided.Seconds(), f.requests.writes())
	}
	if c.locks > 0 {
		most := claims + c.locks
		first.measured = fmt.Sprintf("%.1f s, %d writes (at most %d)", c.firstDecision.Seconds(), c.firstManagerWrites, most)
		if f.decided > 0 {
			first.measured = fmt.Sprintf("%.1f s = %s, %d writes (at most %d)", c.firstDecision.Seconds(), ratio(c.firstDecision, f.decided), c.firstManagerWrites, most)
			first.verdict = yesNo(float64(c.firstDecision) <= 1.25*float64(f.decided) && c.firstManagerWrites <= most)
		}
	}
	restart := goalRow{goal: fmt.Sprintf("Restart over the %d decided claims: every lock decided within 15 s, zero writes", claims),
		floor: "nothing to write", measured: notMeasuredText, verdict: notMeasured}
	if c.locks > 0 {
		restart.measured = fmt.Sprintf("%.1f s, %d writes", c.restart.Seconds(), c.restartManagerWrites)
		restart.verdict = yesNo(c.restart <= 15*time.Second && c.restartManagerWrites == 0)
	}
	return []goalRow{first, restart}
}

func decideGoal(r *results) []goalRow {
	row := goalRow{goal: "`Decide` over 1,000 claims < 1 ms, a constant number of allocations per claim", floor: "–",
		measured: notMeasuredText, verdict: notMeasured}
	if d, ok := decideLine(r.decide, 1000); ok {
		big, okBig := decideLine(r.decide, 10000)
		row.measured = fmt.Sprintf("%s; %.2f allocations per claim at 1,000 claims, %.2f at 10,000", ms(d.perOp), d.allocs/1000, big.allocs/10000)
		row.verdict = yesNo(d.perOp < time.Millisecond && okBig && d.allocs/1000 <= 1 && big.allocs/10000 <= 1)
	}
	return []goalRow{row}
}

func pipelineGoals(r *results) []goalRow {
	pr := r.pipelines
	if pr.pipelines == 0 {
		return nil
	}
	latency := goalRow{goal: fmt.Sprintf("%d `pkg/lock` pipelines over %d targets, the manager binary: p99 end of a hold → next grant ≤ 1 s, no pipeline times out",
		pr.pipelines, pr.targets), floor: "–"}
	writes := goalRow{goal: "The same pipelines: the manager's writes per grant ≤ 3"}
	switch {
	case !pr.measured:
		latency.measured, latency.verdict = "the step failed: see above", notMeasured
		writes.floor, writes.measured, writes.verdict = notMeasuredText, "the step failed: see above", notMeasured
		return []goalRow{latency, writes}
	case len(pr.handoffs) == 0:
		latency.measured, latency.verdict = "no hold ended while a pipeline waited for its target", notMeasured
	default:
		latency.measured = fmt.Sprintf("p99 %s, max %s over %d hand-offs; timed out %d of %d (section 11)",
			ms(percentile(pr.handoffs, 99)), ms(percentile(pr.handoffs, 100)), len(pr.handoffs), pr.outcomes[pipelineTimedOut], pr.pipelines)
		latency.verdict = yesNo(pr.goalMet())
	}
	least := pr.leastWrites()
	leastPerGrant := float64(least) / float64(max(pr.grants, 1))
	writes.floor = fmt.Sprintf("%d writes = %.2f per grant: a status per claim (%d), a Lease write per grant (%d), a second status per waiter granted (%d)",
		least, leastPerGrant, pr.pipelines, pr.grants, len(pr.handoffs))
	if leastPerGrant > 3 {
		writes.floor += "; above the bound: out of reach on this draw"
	}
	writes.measured, writes.verdict = notMeasuredText, notMeasured
	if pr.grants > 0 {
		perGrant := pr.writes / float64(pr.grants)
		writes.measured = fmt.Sprintf("%.0f writes = %.2f per grant (%.1f requests per grant)", pr.writes, perGrant, pr.requests/float64(pr.grants))
		writes.verdict = yesNo(perGrant <= 3)
	}
	return []goalRow{latency, writes}
}

func safetyGoal(*results) []goalRow {
	return []goalRow{{goal: "Safety unchanged: the 5-minute chaos run finds 0 violations, with three seeds", floor: "–",
		measured: "not measured here: see [reliability.md](reliability.md)"}}
}
