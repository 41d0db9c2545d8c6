//go:build bench

package bench

import (
	"fmt"
	"image/color"
	"maps"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// latencyRow is one line of a latency table.
type latencyRow struct {
	row, release string
	lat          []time.Duration
}

func (r *results) handoffRows() []latencyRow {
	return []latencyRow{
		{rowFloor, "one ConfigMap update", r.floor},
		{rowTwoHop, "BuildLock delete → watch, then grant Lease update → watch", r.floors.twoHop},
		{rowLease, "holder cancels (ReleaseOnCancel) → next OnStartedLeading", r.lease.lat},
		{rowCM, "holder deletes the ConfigMap → waiter's create succeeds", r.cmDelete.lat},
		{rowCM, "holder's pod → Succeeded → waiter's create succeeds", r.cmPods.lat},
		{rowBL, "holder's claim deleted → waiter's grant Lease names it", r.blDelete.latLease},
		{rowBL, "holder's claim deleted → waiter's status shows Held", r.blDelete.lat},
		{rowBL, "holder's pod → Succeeded → waiter's grant Lease names it", r.blPods.latLease},
		{rowBL, "holder's pod → Succeeded → waiter's status shows Held", r.blPods.lat},
	}
}

func ms(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

func ratio(a, b time.Duration) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f×", float64(a)/float64(b))
}

// verdict is yesNo for a goal judged on samples: "not measured" when any
// of them is empty (a failed step), since empty samples compare as zero.
func verdict(ok bool, samples ...[]time.Duration) string {
	for _, s := range samples {
		if len(s) == 0 {
			return "**not measured**"
		}
	}
	return yesNo(ok)
}

func yesNo(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

// perOp renders counts divided by n, writes first: "update leases 1, get pods 2".
func perOp(c counts, n int) string {
	if n == 0 || len(c) == 0 {
		return "–"
	}
	var parts []string
	for _, k := range c.keys() {
		v := float64(c[k]) / float64(n)
		parts = append(parts, fmt.Sprintf("%s %s", k, strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")))
	}
	return strings.Join(parts, ", ")
}

func per(x, n int) string {
	if n == 0 {
		return "–"
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(x)/float64(n)), "0"), ".")
}

// msSigned is ms for a duration that may be negative (an event before the
// instant it is measured from).
func msSigned(d time.Duration) string {
	if d < 0 {
		return "−" + ms(-d)
	}
	return ms(d)
}

func perFloat(x, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(x) / float64(n)
}

func mib(x float64) string { return fmt.Sprintf("%.1f MiB", x/(1<<20)) }

// report renders the run as Markdown.
func report(r *results, plotFile string) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	// What pkg/lock (and so the plugin) sees: the grant Lease naming the
	// waiter; kubectl wait sees the status, one write later.
	bl, cm, lease := median(r.blDelete.latLease), median(r.cmDelete.lat), median(r.lease.lat)
	blPod, cmPod := median(r.blPods.latLease), median(r.cmPods.lat)
	blStatus, blPodStatus := median(r.blDelete.lat), median(r.blPods.lat)
	n := len(r.blDelete.lat)
	opWrites := r.blDelete.opHandoff.writes()
	opWritesPod := r.blPods.opHandoff.writes()
	twoHop, twoHop99 := median(r.floors.twoHop), percentile(r.floors.twoHop, 99)
	createFloor := median(r.floors.create)

	p("# Benchmarks")
	p("")
	p("Written by `make bench` (the harness is `test/bench`, built only with the `bench` tag) on %s; the run took %s.",
		r.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(r.started).Round(time.Second))
	p("Every number comes from that one run against one API server: envtest's etcd and kube-apiserver on this machine, with the")
	p("operator running in the harness's process (the memory runs use the `bin/manager` binary). The machine is shared and has two")
	p("cores, which the API server, etcd, the operator and the contenders all compete for; compare rows by their ratios within the")
	p("run rather than across runs.")
	p("")
	p("Nothing here is written by hand. What each row measures, how to read it and how to reproduce it:")
	p("[bench-method.md](bench-method.md); dated analyses of runs: [runs/](runs/README.md).")
	p("")
	p("## Machine and versions")
	p("")
	p("| | |")
	p("|---|---|")
	p("| buildlock | commit %s (`-dirty`: with the working tree's uncommitted changes) |", r.env.commit)
	p("| CPU | %s, %d cores |", r.env.cpu, r.env.cores)
	p("| Memory | %.1f GiB |", r.env.memGiB)
	p("| Kernel | Linux %s |", r.env.kernel)
	p("| Go | %s |", r.env.goVersion)
	p("| kube-apiserver | %s |", r.env.apiserver)
	p("| etcd | %s |", r.env.etcd)
	for _, m := range []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go"} {
		p("| %s | %s |", m, r.env.modules[m])
	}
	p("")

	if len(r.failed) > 0 {
		p("## Steps that failed")
		p("")
		p("These steps failed, and what they measure is missing below (a goal without its measurements reads *not measured*):")
		p("")
		for _, f := range r.failed {
			p("- %s", strings.ReplaceAll(f, "\n", " "))
		}
		p("")
	}

	writeGoals(r, p)
	writeFloorContender(r, p)
	p("## Earlier goals")
	p("")
	p("| Goal | Measured | |")
	p("|---|---|---|")
	p("| ≥ 50× faster than the plain Lease peer | %s (grant Lease; status %s) vs %s: %s faster | %s |", ms(bl), ms(blStatus), ms(lease), ratio(lease, bl), verdict(lease >= 50*bl, r.lease.lat, r.blDelete.latLease))
	p("| No slower than 2× the client-side protocol peer | grant Lease: claim deleted %s vs %s (%s), pod Succeeded %s vs %s (%s). Status: %s, %s | %s |",
		ms(bl), ms(cm), ratio(bl, cm), ms(blPod), ms(cmPod), ratio(blPod, cmPod), ratio(blStatus, cm), ratio(blPodStatus, cmPod),
		verdict(bl <= 2*cm && blPod <= 2*cmPod, r.blDelete.latLease, r.cmDelete.lat, r.blPods.latLease, r.cmPods.lat))
	lockWrites := func(c counts) int { return c.writes() - c["create events"] - c["patch events"] }
	writesVerdict := notMeasured
	if n > 0 && len(r.blPods.lat) > 0 {
		writesVerdict = map[bool]string{true: "**met**", false: "**met** without Events, **missed** with them"}[opWrites <= 4*n && opWritesPod <= 4*len(r.blPods.lat)]
	}
	p("| ≤ 4 API writes per hand-off | operator, claim deleted: %s (Lease and status %s, Events the rest); pod Succeeded: %s (Lease and statuses %s); the contender's own release is one more | %s |",
		per(opWrites, n), per(lockWrites(r.blDelete.opHandoff), n), per(opWritesPod, len(r.blPods.lat)), per(lockWrites(r.blPods.opHandoff), len(r.blPods.lat)),
		writesVerdict)
	idleVerdict := notMeasured
	if r.idle.locks > 0 {
		idleVerdict = yesNo(r.idle.ops.writes() == 0)
	}
	p("| Zero writes while idle | %d writes in %s with %d locks | %s |", r.idle.ops.writes(), r.idle.window, r.idle.locks, idleVerdict)
	if len(r.memory) >= 2 {
		grow := r.memory[1].heapAlloc - r.memory[0].heapAlloc
		p("| Memory flat against unrelated pods | live heap %s → %s with %d pods: %+.0f B per pod, %.0f%% of the %s these pods take as objects; RSS %s → %s | %s |",
			mib(r.memory[0].heapAlloc), mib(r.memory[1].heapAlloc), pods, grow/float64(pods), 100*grow/r.fullPodCache, mib(r.fullPodCache),
			mib(r.memory[0].rss), mib(r.memory[1].rss), yesNo(grow < r.fullPodCache/10))
	}
	if bq := r.burst; len(bq.during.latLease) > 0 {
		q, d := percentile(bq.quiet.latLease, 99), percentile(bq.during.latLease, 99)
		p("| Issue 11: a burst of %d claims in one namespace delays a hand-off in another by a small bound | p50 %s → %s, p99 %s → %s (section 8) | %s |",
			bq.claims, ms(median(bq.quiet.latLease)), ms(median(bq.during.latLease)), ms(q), ms(d), yesNo(d <= q+time.Second))
	}
	if len(r.queue50.lat) > 0 {
		w1, w50 := perFloat(r.queue1.opHandoff.writes(), len(r.queue1.lat)), perFloat(r.queue50.opHandoff.writes(), len(r.queue50.lat))
		p("| Issue 12: writes per Queue hand-off flat from 1 to %d waiting lines | %.2f with 1, %.2f with %d (section 9) | %s |", queueLines, w1, w50, queueLines, yesNo(w50 <= w1+0.05))
	}
	if e := r.enforce; len(e.firstRefused) > 0 {
		p("| Issue 13: measure the enforcement window | grant change → first refused write of the old holder: p50 %s, p99 %s (section 10) | measured |",
			ms(median(e.firstRefused)), ms(percentile(e.firstRefused, 99)))
	}
	p("")
	p("“Flat” is judged as growing by less than a tenth of what caching the pods would cost: the manager watches whole pods but")
	p("keeps only each pod's name, namespace, UID, resourceVersion, deletion time and phase (so that a pod's events map to its")
	p("claims, and a finished pod is known), never its spec. That small entry per pod is what remains.")
	p("")

	p("## 1. Hand-off latency")
	p("")
	p("From the instant the release is sent until the next holder observes its grant. Hand-offs run one at a time on one target,")
	p("after the next contender has been observed waiting; the first %d of each run are warm-up and not counted. buildlock's", warmup)
	p("waiter observes its grant twice: its grant Lease naming it with a fencing token (what `pkg/lock` and the plugin wait for),")
	p("and its status showing `Held` (what `kubectl wait --for=condition=Acquired` waits for).")
	p("The plain Lease peer's hand-offs run on %d targets at once (%s of wall time for %d hand-offs): each waits for the next", leaseTargets, r.leaseWall.Round(time.Second), len(r.lease.lat))
	p("contender's retry tick (RetryPeriod 2 s plus up to 120 %% jitter), so load barely matters to it, and one target alone would")
	p("take a quarter of an hour. Its holder holds for a random time of up to one retry cycle, so the release falls at a random")
	p("point of the waiter's cycle.")
	p("")
	p("The floors, measured on the real kinds cycle by cycle (a BuildLock is created, settled by the operator, deleted; then a")
	p("Lease with buildlock's label is updated), each until a watcher sees the write:")
	p("")
	p("| Floor | n | p50 | p90 | p99 |")
	p("|---|--:|--:|--:|--:|")
	for _, f := range []latencyRow{
		{"one ConfigMap update → watch", "", r.floor},
		{"one BuildLock create → watch (the floor of an acquire)", "", r.floors.create},
		{"one BuildLock delete → watch", "", r.floors.del},
		{"one grant Lease update → watch", "", r.floors.lease},
		{"**two-hop floor**: the delete, then the Lease update, summed per cycle", "", r.floors.twoHop},
	} {
		p("| %s | %d | %s | %s | %s |", f.row, len(f.lat), ms(median(f.lat)), ms(percentile(f.lat, 90)), ms(percentile(f.lat, 99)))
	}
	p("")
	p("| Row | Release → grant observed | n | p50 | p90 | p99 | p50 / two-hop p50 | p99 / two-hop p99 |")
	p("|---|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range r.handoffRows() {
		p("| %s | %s | %d | %s | %s | %s | %s | %s |", row.row, row.release, len(row.lat),
			ms(median(row.lat)), ms(percentile(row.lat, 90)), ms(percentile(row.lat, 99)),
			ratio(median(row.lat), twoHop), ratio(percentile(row.lat, 99), twoHop99))
	}
	p("")
	p("buildlock against the peers, p50, grant Lease: %s faster than the Lease peer; %s the client-side peer's time when the claim is", ratio(lease, bl), ratio(bl, cm))
	p("deleted, %s when the pod succeeds (status: %s and %s).", ratio(blPod, cmPod), ratio(blStatus, cm), ratio(blPodStatus, cmPod))
	p("")
	p("![Hand-off latency distributions](%s)", plotFile)
	p("")
	for _, c := range []struct {
		name string
		run  *handoffRun
	}{{"holder's claim deleted", &r.blDelete}, {"holder's pod Succeeded", &r.blPods}} {
		steps, share, released, observed, observedLease := breakdown(c.run.traces)
		p("### Where a buildlock hand-off spends its time: %s", c.name)
		p("")
		p("The operator's requests in the most common sequence (%d of %d hand-offs), at their median offsets from the release:", share, len(c.run.traces))
		p("")
		p("| | Request | Sent | Answered |")
		p("|--:|---|--:|--:|")
		p("| | the contender's release (%s) | 0 | %s |", map[bool]string{true: "delete buildlocks", false: "update pods/status"}[c.run == &r.blDelete], ms(released))
		for i, s := range steps {
			p("| %d | operator: %s | %s | %s |", i+1, s.what, ms(s.start), ms(s.end))
		}
		p("| | the waiter's grant Lease names it | | %s |", ms(observedLease))
		p("| | the waiter's status shows Held | | %s |", ms(observed))
		p("")
	}

	p("## 2. Acquire latency on a free lock, and learning Superseded")
	p("")
	p("From the instant the contender starts until it knows it holds: on a new target each time (the lock has no Lease yet), and")
	p("on one target whose previous holder released it (its Lease is kept, free). The floor is one BuildLock create → watch.")
	p("The harness's own contender creates the claim and watches the namespace's claims and grant Leases (opened beforehand);")
	p("`pkg/lock` is `AcquireHold` with one client for every call, as a long-lived process has; the plugin is")
	p("`kubectl-buildlock acquire` without a command, one process per claim, from its first connection to the API server (through")
	p("a TCP proxy that notes it: its TLS handshake and discovery count, its process's start does not) until it prints the")
	p("fencing token, or exits 3 when superseded. *Superseded on arrival*: a build below the one its line's holder holds with;")
	p("*while waiting*: a waiting claim, from the instant a newer build of its line is created until the client learns it.")
	p("")
	p("| Row | Acquire | n | p50 | p90 | p99 | p50 / create floor | p99 / create floor's p99 |")
	p("|---|---|--:|--:|--:|--:|--:|--:|")
	createFloor99 := percentile(r.floors.create, 99)
	rows := []latencyRow{
		{"Floor", "one BuildLock create → watch", r.floors.create},
		{rowLease, "Run → OnStartedLeading (get, create Lease)", r.acquireLease},
		{rowCM, "create the ConfigMap", r.acquireCM},
		{rowBL, "new target: create the BuildLock → grant Lease names it", r.acquireBL.latLease},
		{rowBL, "new target: create the BuildLock → status shows Held", r.acquireBL.lat},
		{rowBL, "kept Lease: create the BuildLock → grant Lease names it", r.acquireKept.latLease},
		{rowBL, "kept Lease: create the BuildLock → status shows Held", r.acquireKept.lat},
	}
	for _, c := range []struct {
		row, start, held, superseded string
		run                          clientRun
	}{
		{rowBL, "create", "", "status shows Superseded", r.acquireRaw},
		{rowBL + ", pkg/lock", "Acquire", "it returns the hold", "ErrSuperseded", r.acquireLock},
		{rowBL + ", plugin", "first connection", "token printed", "exit 3", r.acquirePlugin},
	} {
		for _, row := range []latencyRow{
			{c.row, "new target: " + c.start + " → " + c.held, c.run.free},
			{c.row, "kept Lease: " + c.start + " → " + c.held, c.run.freeKept},
			{c.row, "superseded on arrival: " + c.start + " → " + c.superseded, c.run.supersededNow},
			{c.row, "superseded while waiting: newer build's create → " + c.superseded, c.run.supersededWaiting},
		} {
			if len(row.lat) > 0 { // the harness's own free locks are above; a step that did not run
				rows = append(rows, row)
			}
		}
	}
	for _, row := range rows {
		p("| %s | %s | %d | %s | %s | %s | %s | %s |", row.row, row.release, len(row.lat), ms(median(row.lat)),
			ms(percentile(row.lat, 90)), ms(percentile(row.lat, 99)), ratio(median(row.lat), createFloor), ratio(percentile(row.lat, 99), createFloor99))
	}
	p("")
	if len(r.acquirePlugin.startup) > 0 {
		p("The plugin's process, from its start until its first connection (left out above): p50 %s, p99 %s.",
			ms(median(r.acquirePlugin.startup)), ms(percentile(r.acquirePlugin.startup, 99)))
	}
	if n := len(r.acquireLock.free); n > 0 {
		p("`pkg/lock`'s requests per acquire of a free lock on a new target: %s.", perOp(r.acquireLock.requests, n))
	}
	p("")

	p("## 3. Scale: %d targets × %d contenders", targets, contenders)
	p("")
	p("All %d contenders are started at once (the claims created by 32 concurrent clients); *settled* is when every lock has", targets*contenders)
	p("its final state; then every holder releases at once, and *released* is when every waiter holds.")
	p("")
	p("| Row | Created in | Settled in | Claims settled / s | Released → every waiter holds | Outcome |")
	p("|---|--:|--:|--:|--:|---|")
	for _, s := range r.scale {
		outcome := s.settledNote
		if len(s.counts) > 0 {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(s.counts)) {
				parts = append(parts, fmt.Sprintf("%s %d", k, s.counts[k]))
			}
			outcome = strings.Join(parts, ", ")
		}
		if strings.HasPrefix(s.row, rowBL) {
			outcome += fmt.Sprintf("; %d locks not exactly one Held/Waiting/Superseded", s.violations)
		}
		p("| %s | %s | %s | %.0f | %s | %s |", s.row, ms(s.created), ms(s.settled), float64(s.claims)/s.settled.Seconds(), ms(s.released), outcome)
	}
	p("")
	p("CPU used, as a share of the window's wall time (2.00 = both cores busy), and the API server's CPU time per claim settled")
	p("and per lock handed over, which other processes on the machine change much less than they change the wall times:")
	p("")
	p("| Row | While settling | While handing over | API server CPU per claim settled | per lock handed over |")
	p("|---|---|---|--:|--:|")
	for _, s := range r.scale {
		p("| %s | %s | %s | %.1f ms | %.1f ms |", s.row, s.cpuSettle, s.cpuRelease, s.cpuPerClaim(), s.cpuPerLock())
	}
	for _, s := range r.scale {
		if strings.HasPrefix(s.row, rowBL) {
			p("")
			p("%s decisions: %d reconciles to settle (%.0f per second), %d to hand %d locks over (%.0f per second).",
				s.row, s.reconcilesSettle, float64(s.reconcilesSettle)/s.settled.Seconds(), s.reconcilesRelease, targets, float64(s.reconcilesRelease)/s.released.Seconds())
		}
	}
	p("")

	p("## 4. API cost")
	p("")
	p("Requests counted by a wrapping transport on each client, by verb and resource, divided by the number of operations; a")
	p("*settle* is a new claim until it is observed waiting, a *hand-off* a release until the waiter holds. The operator's and the")
	p("contenders' requests are counted apart. Watch requests are (re)opened watches.")
	p("")
	p("| Row | Per | Who | Writes | All requests | By verb |")
	p("|---|---|---|--:|--:|---|")
	row := func(name, perWhat, who string, c counts, n int) {
		p("| %s | %s | %s | %s | %s | %s |", name, perWhat, who, per(c.writes(), n), per(c.total(), n), perOp(c, n))
	}
	row(rowFloor, "round trip", "client", counts{"update configmaps": 1}, 1)
	row(rowLease, "hand-off", "contenders", r.lease.handoff, len(r.lease.lat))
	for _, c := range []struct {
		name string
		run  *handoffRun
		op   bool
	}{{"claim deleted", &r.cmDelete, false}, {"pod Succeeded", &r.cmPods, false}, {"claim deleted", &r.blDelete, true}, {"pod Succeeded", &r.blPods, true}} {
		name := rowCM
		if c.op {
			name = rowBL
		}
		row(name, "settle", "contenders", c.run.settle, len(c.run.lat))
		if c.op {
			row(name, "settle", "operator", c.run.opSettle, len(c.run.lat))
		}
		row(name, "hand-off ("+c.name+")", "contenders", c.run.handoff, len(c.run.lat))
		if c.op {
			row(name, "hand-off ("+c.name+")", "operator", c.run.opHandoff, len(c.run.lat))
		}
	}
	row(rowBL, "acquire (free lock, new target)", "operator", r.acquireBL.ops, len(r.acquireBL.lat))
	row(rowBL+", pkg/lock", "acquire (free lock, new target)", "pkg/lock", r.acquireLock.requests, len(r.acquireLock.free))
	row(rowBL, "acquire (free lock, kept Lease)", "operator", r.acquireKept.ops, len(r.acquireKept.lat))
	for _, s := range r.scale {
		if strings.HasPrefix(s.row, rowBL) || s.row == rowFloorContender {
			who := map[bool]string{true: "operator", false: "floor contender"}[strings.HasPrefix(s.row, rowBL)]
			row(s.row, fmt.Sprintf("claim, scale settle (%d at once)", s.claims), who, s.opSettle, s.claims)
			row(s.row, fmt.Sprintf("hand-off, scale release (%d at once)", targets), who, s.opRelease, targets)
		}
	}
	p("")
	if len(r.costs) > 0 {
		p("What each kind of request costs the API server and etcd (CPU time per request, %d requests of each kind sent one after", r.costs[0].n)
		p("another before the operator starts, so that nothing else runs), and its median latency. A status of the operator's size")
		p("carries a message, a condition repeating it, holder, token and times:")
		p("")
		p("| Request | API server CPU | etcd CPU | Latency p50 |")
		p("|---|--:|--:|--:|")
		for _, c := range r.costs {
			p("| %s | %s | %s | %s |", c.what, ms(c.apiserver), ms(c.etcd), ms(c.latency))
		}
		p("")
	}
	p("The plain Lease peer's count includes what its contenders do while the lock is held (the holder renews every RetryPeriod,")
	p("the waiter polls every RetryPeriod plus jitter): it grows with hold time, where the other rows' costs do not.")
	p("")
	p("### Idle")
	p("")
	p("%d locks (from the scale run), nothing changing for %s; every lock is also decided once more at the start of the window, by",
		r.idle.locks, r.idle.window)
	p("an annotation change on its holder (what any repeated event or resync does). The operator ran %d reconciles and sent:", r.idle.reconciles)
	p("")
	p("| Writes | All requests | By verb |")
	p("|--:|--:|---|")
	p("| %d | %d | %s |", r.idle.ops.writes(), r.idle.ops.total(), perOp(r.idle.ops, 1))
	p("")

	p("## 5. Memory of the manager binary")
	p("")
	p("`bin/manager` (all namespaces, `--leader-elect=false`) started afresh against each cluster and measured once it had decided")
	p("every claim and gone idle: the heap from its `go_memstats_*` metrics just after a garbage collection (the harness scrapes the")
	p("metrics, which allocates a little, until one happens), RSS and peak RSS (VmHWM) from `/proc/<pid>/status`.")
	p("")
	p("| Cluster | Live heap | Heap in use | RSS | Peak RSS | |")
	p("|---|--:|--:|--:|--:|---|")
	for _, m := range r.memory {
		p("| %s | %s | %s | %s | %s | %s |", m.label, mib(m.heapAlloc), mib(m.heapInuse), mib(m.rss), mib(m.peakRSS), m.note)
	}
	p("")

	p("## 6. Arbiter: BenchmarkDecide")
	p("")
	p("`go test -run '^$' -bench BenchmarkDecide -benchmem ./internal/arbiter/`: one decision over a lock with that many claims.")
	p("")
	p("| Benchmark | Iterations | Time | Bytes | Allocations |")
	p("|---|--:|--:|--:|--:|")
	for _, l := range r.decide {
		f := strings.Fields(l)
		if len(f) >= 8 {
			p("| %s | %s | %s %s | %s %s | %s %s |", f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7])
		}
	}
	if len(r.decide) == 0 {
		p("| (no output found: run through `make bench`) | | | | |")
	}
	p("")

	if c := r.cold; c.locks > 0 {
		p("## 7. Cold start")
		p("")
		p("The manager binary over %d claims (%d locks), until every lock has been decided (no claim Pending, at least one", claims, c.locks)
		p("reconcile per lock, an empty workqueue), from the process's start. The manager's writes are its client's own count; the")
		p("breakdown is the API server's count of every write it served in the window, which also holds the API server's renewals")
		p("of its own identity Lease (an `update leases` every 10 s):")
		p("")
		p("| Start | Every lock decided in | Manager's writes | API server's writes, by verb |")
		p("|---|--:|--:|---|")
		if f := c.floor; f.decided > 0 {
			p("| the floor contender over as many Pending claims (its own count) | %.1f s | %d | %s |", f.decided.Seconds(), f.requests.writes(), perOp(f.requests, 1))
		}
		p("| first decision: every claim Pending | %.1f s | %d | %s |", c.firstDecision.Seconds(), c.firstManagerWrites, perOp(c.firstWrites, 1))
		p("| restart: every claim decided already | %.1f s | %d | %s |", c.restart.Seconds(), c.restartManagerWrites, perOp(c.restartWrites, 1))
		p("")
	}

	if bq := r.burst; len(bq.quiet.lat) > 0 {
		p("## 8. A burst in another namespace")
		p("")
		p("Hand-offs (claim deleted) in one namespace, first on their own, then while %d claims (%d targets, two lines each) are", bq.claims, bq.targets)
		p("created at once by 32 clients in another namespace, until every claim of the burst has a phase (created in %s, decided", ms(bq.created))
		p("in %s). The workqueue serves namespaces in turn (`internal/controller/queue.go`).", ms(bq.settled))
		p("")
		p("| Hand-offs | Observed by | n | p50 | p90 | p99 |")
		p("|---|---|--:|--:|--:|--:|")
		for _, row := range []struct {
			name string
			run  handoffRun
		}{{"without the burst", bq.quiet}, {"during the burst", bq.during}} {
			for _, obs := range []struct {
				what string
				lat  []time.Duration
			}{{"grant Lease", row.run.latLease}, {"status", row.run.lat}} {
				p("| %s | %s | %d | %s | %s | %s |", row.name, obs.what, len(obs.lat), ms(median(obs.lat)), ms(percentile(obs.lat, 90)), ms(percentile(obs.lat, 99)))
			}
		}
		p("")
	}

	if len(r.queue1.lat) > 0 {
		p("## 9. Queue ordering")
		p("")
		p("Hand-offs (claim deleted) on a target whose BuildLockPolicy says `ordering: Queue`, with 1 and with %d lines waiting", queueLines)
		p("(a new line joins at the back after each hand-off), beside the NewestWins hand-offs of section 1 (one waiting slot).")
		p("Writes are the operator's per hand-off, from the release until the next holder holds.")
		p("")
		p("| Ordering | Lines waiting | n | p50 grant Lease | p99 grant Lease | p50 status | p99 status | Operator writes | By verb |")
		p("|---|--:|--:|--:|--:|--:|--:|--:|---|")
		for _, row := range []struct {
			name    string
			waiting int
			run     handoffRun
		}{{"NewestWins", 1, r.blDelete}, {"Queue", 1, r.queue1}, {"Queue", queueLines, r.queue50}} {
			n := len(row.run.lat)
			p("| %s | %d | %d | %s | %s | %s | %s | %s | %s |", row.name, row.waiting, n, ms(median(row.run.latLease)), ms(percentile(row.run.latLease, 99)),
				ms(median(row.run.lat)), ms(percentile(row.run.lat, 99)), per(row.run.opHandoff.writes(), n), perOp(row.run.opHandoff, n))
		}
		p("")
	}

	if e := r.enforce; len(e.firstRefused) > 0 {
		p("## 10. The enforcement window")
		p("")
		p("The enforcement admission policies installed (`config/enforcement`, as the chart's `enforcement.enabled`), a target")
		p("namespace labelled `buildlock.io/locked-by=<claims namespace>`, a BuildLockPolicy with `spec.enforce`, and pipeline pods")
		p("acting with their pod-bound identity (impersonated with the token's pod name and UID). While the holder's pod deploys")
		p("without pause (%d writers, each writing again as soon as it is answered; creates of one ConfigMap, which admission judges in", deployers)
		p("full before storage answers AlreadyExists: not dry runs, which the fence admits from anyone but the operator's probe),")
		p("its claim is deleted; the grant changes when the operator's update of the grant Lease returns. The API server reads the")
		p("Lease, the policy's parameter, through its own informer, so the old holder stays admitted for that informer's lag.")
		p("%d writes of old holders in %d hand-offs.", e.writes, len(e.firstRefused))
		p("")
		p("| From the grant change to | n | p50 | p90 | p99 | max |")
		p("|---|--:|--:|--:|--:|--:|")
		for _, row := range []struct {
			what string
			lat  []time.Duration
		}{{"the first refused write of the old holder (sent at)", e.firstRefused}, {"the last admitted write of the old holder (sent at)", e.lastAdmitted}} {
			p("| %s | %d | %s | %s | %s | %s |", row.what, len(row.lat), msSigned(median(row.lat)), msSigned(percentile(row.lat, 90)),
				msSigned(percentile(row.lat, 99)), msSigned(percentile(row.lat, 100)))
		}
		p("")
	}

	reportPipelines(p, r.pipelines)

	p("## Profiles")
	p("")
	p("Left in `bin/bench/` by the run: the harness's process (the operator and the contenders) CPU-profiled during an extra run of")
	p("%d hand-offs and during the scale run, shown as the operator's reconciles, cumulative (`go tool pprof -top -cum -focus=...`);", profiled)
	p("the API server's CPU profile (its `/debug/pprof/profile`) during the scale run; the harness's live heap after the scale run.")
	for _, prof := range r.profiles {
		p("")
		p("```")
		p("%s", strings.TrimSpace(prof))
		p("```")
	}
	return w.String()
}

// writePlot draws the empirical distribution of each hand-off row on a
// logarithmic time axis.
func writePlot(path string, r *results) error {
	if len(r.floor) == 0 {
		return nil // a partial run (-bench.only)
	}
	p := plot.New()
	p.Title.Text = "Hand-off latency: release sent → next holder observes its grant"
	p.X.Label.Text = "milliseconds (log scale)"
	p.Y.Label.Text = "fraction of hand-offs"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	// The legend sits bottom right, in room made beyond the slowest row.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(6), vg.Points(8)
	p.Legend.Padding = vg.Points(2)
	for i, row := range r.handoffRows() {
		if len(row.lat) == 0 {
			continue
		}
		s := slices.Clone(row.lat)
		slices.Sort(s)
		xys := make(plotter.XYs, len(s))
		for k, d := range s {
			xys[k] = plotter.XY{X: float64(d) / 1e6, Y: float64(k+1) / float64(len(s))}
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.StepStyle = plotter.PostStep
		line.Color = plotutil.Color(i)
		if i == 0 {
			line.Color = color.Black
		}
		line.Width = vg.Points(1.5)
		if strings.Contains(row.release, "pod") {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(line)
		label := row.row
		switch {
		case strings.Contains(row.release, "pod"):
			label += ", pod Succeeded"
		case row.row == rowCM || row.row == rowBL:
			label += ", claim deleted"
		}
		switch {
		case strings.Contains(row.release, "grant Lease names"):
			label += " (grant Lease)"
		case strings.Contains(row.release, "status shows"):
			label += " (status)"
		}
		p.Legend.Add(fmt.Sprintf("%s (p50 %s)", label, ms(median(row.lat))), line)
	}
	var slowest time.Duration
	for _, row := range r.handoffRows() {
		slowest = max(slowest, slices.Max(append([]time.Duration{1}, row.lat...)))
	}
	p.X.Max = float64(slowest) / 1e6 * 300
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
