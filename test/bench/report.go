//go:build bench

package bench

import (
	_ "embed"
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

// notes is the hand-written analysis appended to the report: what limits
// each number and what to change. It does not quote numbers, which change
// from run to run.
//
//go:embed notes.md
var notes string

// latencyRow is one line of a latency table.
type latencyRow struct {
	row, release string
	lat          []time.Duration
}

func (r *results) handoffRows() []latencyRow {
	return []latencyRow{
		{rowFloor, "one ConfigMap update", r.floor},
		{rowLease, "holder cancels (ReleaseOnCancel) → next OnStartedLeading", r.lease.lat},
		{rowCM, "holder deletes the ConfigMap → waiter's create succeeds", r.cmDelete.lat},
		{rowCM, "holder's pod → Succeeded → waiter's create succeeds", r.cmPods.lat},
		{rowBL, "holder's claim deleted → waiter's watch shows Held", r.blDelete.lat},
		{rowBL, "holder's pod → Succeeded → waiter's watch shows Held", r.blPods.lat},
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

func mib(x float64) string { return fmt.Sprintf("%.1f MiB", x/(1<<20)) }

// report renders the run as Markdown.
func report(r *results, plotFile string) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	floor := median(r.floor)
	bl, cm, lease := median(r.blDelete.lat), median(r.cmDelete.lat), median(r.lease.lat)
	blPod, cmPod := median(r.blPods.lat), median(r.cmPods.lat)
	n := len(r.blDelete.lat)
	opWrites := r.blDelete.opHandoff.writes()
	opWritesPod := r.blPods.opHandoff.writes()

	p("# Benchmarks")
	p("")
	p("Written by `make bench` (the harness is `test/bench`, built only with the `bench` tag) on %s; the run took %s.",
		r.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(r.started).Round(time.Second))
	p("Every number comes from that one run against one API server: envtest's etcd and kube-apiserver on this machine, with the")
	p("operator running in the harness's process (the memory runs use the `bin/manager` binary). The machine is shared and has two")
	p("cores, which the API server, etcd, the operator and the contenders all compete for; compare rows by their ratios within the")
	p("run rather than across runs.")
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

	p("## Goals")
	p("")
	p("| Goal | Measured | |")
	p("|---|---|---|")
	p("| Hand-off p50 within 3× the floor | claim deleted: %s = %s the floor's %s; pod Succeeded: %s = %s | %s |",
		ms(bl), ratio(bl, floor), ms(floor), ms(blPod), ratio(blPod, floor), yesNo(bl <= 3*floor))
	p("| ≥ 50× faster than the plain Lease peer | %s vs %s: %s faster | %s |", ms(bl), ms(lease), ratio(lease, bl), yesNo(lease >= 50*bl))
	p("| No slower than 2× the client-side protocol peer | claim deleted: %s vs %s (%s); pod Succeeded: %s vs %s (%s) | %s |",
		ms(bl), ms(cm), ratio(bl, cm), ms(blPod), ms(cmPod), ratio(blPod, cmPod), yesNo(bl <= 2*cm && blPod <= 2*cmPod))
	lockWrites := func(c counts) int { return c.writes() - c["create events"] - c["patch events"] }
	p("| ≤ 4 API writes per hand-off | operator, claim deleted: %s (Lease and status %s, Events the rest); pod Succeeded: %s (Lease and statuses %s); the contender's own release is one more | %s |",
		per(opWrites, n), per(lockWrites(r.blDelete.opHandoff), n), per(opWritesPod, len(r.blPods.lat)), per(lockWrites(r.blPods.opHandoff), len(r.blPods.lat)),
		map[bool]string{true: "**met**", false: "**met** without Events, **missed** with them"}[opWrites <= 4*n && opWritesPod <= 4*len(r.blPods.lat)])
	p("| Zero writes while idle | %d writes in %s with %d locks | %s |", r.idle.ops.writes(), r.idle.window, r.idle.locks, yesNo(r.idle.ops.writes() == 0))
	if len(r.memory) >= 2 {
		grow := r.memory[1].heapAlloc - r.memory[0].heapAlloc
		p("| Memory flat against unrelated pods | live heap %s → %s with %d pods: %+.0f B per pod, %.0f%% of the %s these pods take as objects; RSS %s → %s | %s |",
			mib(r.memory[0].heapAlloc), mib(r.memory[1].heapAlloc), pods, grow/float64(pods), 100*grow/r.fullPodCache, mib(r.fullPodCache),
			mib(r.memory[0].rss), mib(r.memory[1].rss), yesNo(grow < r.fullPodCache/10))
	}
	p("")
	p("“Flat” is judged as growing by less than a tenth of what caching the pods would cost: the manager watches pods as metadata")
	p("and keeps only each pod's name, namespace, UID and resourceVersion (so that a pod's events map to its claims), never its spec")
	p("or status. That small entry per pod is what remains; see the analysis for how to remove it too.")
	p("")

	p("## 1. Hand-off latency")
	p("")
	p("From the instant the release is sent until the next holder observes its grant. Hand-offs run one at a time on one target,")
	p("after the next contender has been observed waiting; the first %d of each run are warm-up and not counted.", warmup)
	p("The plain Lease peer's hand-offs run on %d targets at once (%s of wall time for %d hand-offs): each waits for the next", leaseTargets, r.leaseWall.Round(time.Second), len(r.lease.lat))
	p("contender's retry tick (RetryPeriod 2 s plus up to 120 %% jitter), so load barely matters to it, and one target alone would")
	p("take a quarter of an hour. Its holder holds for a random time of up to one retry cycle, so the release falls at a random")
	p("point of the waiter's cycle.")
	p("")
	p("| Row | Release → grant observed | n | p50 | p90 | p99 | p50 / floor | p99 / floor |")
	p("|---|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range r.handoffRows() {
		p("| %s | %s | %d | %s | %s | %s | %s | %s |", row.row, row.release, len(row.lat),
			ms(median(row.lat)), ms(percentile(row.lat, 90)), ms(percentile(row.lat, 99)),
			ratio(median(row.lat), floor), ratio(percentile(row.lat, 99), percentile(r.floor, 99)))
	}
	p("")
	p("buildlock against the peers, p50: %s faster than the Lease peer; %s the client-side peer's time when the claim is deleted,", ratio(lease, bl), ratio(bl, cm))
	p("%s when the pod succeeds.", ratio(blPod, cmPod))
	p("")
	p("![Hand-off latency distributions](%s)", plotFile)
	p("")
	for _, c := range []struct {
		name string
		run  *handoffRun
	}{{"holder's claim deleted", &r.blDelete}, {"holder's pod Succeeded", &r.blPods}} {
		steps, share, released, observed := breakdown(c.run.traces)
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
		p("| | the waiter's watch shows Held | | %s |", ms(observed))
		p("")
	}

	p("## 2. Acquire latency on a free lock")
	p("")
	p("From the instant the contender starts until it knows it holds; a new target each time.")
	p("")
	p("| Row | Acquire | n | p50 | p90 | p99 | p50 / floor |")
	p("|---|---|--:|--:|--:|--:|--:|")
	for _, row := range []latencyRow{
		{rowLease, "Run → OnStartedLeading (get, create Lease)", r.acquireLease},
		{rowCM, "create the ConfigMap", r.acquireCM},
		{rowBL, "create the BuildLock → watch shows Held", r.acquireBL},
	} {
		p("| %s | %s | %d | %s | %s | %s | %s |", row.row, row.release, len(row.lat), ms(median(row.lat)),
			ms(percentile(row.lat, 90)), ms(percentile(row.lat, 99)), ratio(median(row.lat), floor))
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
		p("| %s | %s | %s | %.1f ms | %.1f ms |", s.row, s.cpuSettle, s.cpuRelease,
			1000*s.cpuSettle.secs["kube-apiserver"]/float64(s.claims), 1000*s.cpuRelease.secs["kube-apiserver"]/float64(targets))
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
	row(rowBL, "acquire (free lock)", "operator", r.acquireOps, len(r.acquireBL))
	for _, s := range r.scale {
		if strings.HasPrefix(s.row, rowBL) {
			row(s.row, fmt.Sprintf("claim, scale settle (%d at once)", s.claims), "operator", s.opSettle, s.claims)
			row(s.row, fmt.Sprintf("hand-off, scale release (%d at once)", targets), "operator", s.opRelease, targets)
		}
	}
	p("")
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
	p("")
	p("%s", strings.TrimSpace(notes))
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
		p.Legend.Add(fmt.Sprintf("%s (p50 %s)", label, ms(median(row.lat))), line)
	}
	var slowest time.Duration
	for _, row := range r.handoffRows() {
		slowest = max(slowest, slices.Max(append([]time.Duration{1}, row.lat...)))
	}
	p.X.Max = float64(slowest) / 1e6 * 300
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
