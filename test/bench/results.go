//go:build bench

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// results is everything one run measured.
type results struct {
	started time.Time
	commit  string // of the operator under test, when the run started
	// failed lists the steps that failed, with their errors: the report
	// is written anyway, with what the other steps measured.
	failed                  []string
	env                     envInfo
	floor                   []time.Duration
	floors                  floorRun
	lease, cmDelete, cmPods handoffRun
	blDelete, blPods        handoffRun
	queue1, queue50         handoffRun
	leaseWall               time.Duration
	acquireLease, acquireCM []time.Duration
	acquireBL, acquireKept  acquireRun
	burst                   burstResult
	enforce                 enforceResult
	cold                    coldStart
	pipelines               pipelineRun
	costs                   []requestCost
	scale                   []scaleResult
	idle                    idleResult
	memory                  []memResult
	fullPodCache            float64 // bytes the unrelated pods take as typed objects
	decide                  []string
	profiles                []string

	// acquireRaw, acquireLock and acquirePlugin: the harness's own claims
	// (superseded only), pkg/lock's and the plugin's (clients.go).
	acquireRaw, acquireLock, acquirePlugin clientRun
}

// handoffRun is one row's hand-offs: latencies, and the requests of the
// contenders (and of the operator) in each step, summed over the run.
type handoffRun struct {
	lat                 []time.Duration // until the waiter's status shows it Held
	latLease            []time.Duration // until the grant Lease names the waiter (buildlock only)
	settle, handoff     counts          // contenders': a new claim until it waits; a release until the waiter holds
	opSettle, opHandoff counts          // the operator's, in the same windows
	traces              []cycleTrace
}

func (r *handoffRun) add(d time.Duration, settle, handoff counts) {
	r.lat = append(r.lat, d)
	r.settle, r.handoff = r.settle.plus(settle), r.handoff.plus(handoff)
}

func (r *handoffRun) addOperator(settle, handoff counts) {
	r.opSettle, r.opHandoff = r.opSettle.plus(settle), r.opHandoff.plus(handoff)
}

// cycleTrace is one traced hand-off: when the release was sent and
// returned, when the waiter saw its grant, and the operator's requests.
type cycleTrace struct {
	t0, released, observed time.Time
	observedLease          time.Time
	requests               []traced
}

type scaleResult struct {
	row                                 string
	claims                              int
	created, settled, released          time.Duration
	handedOver                          int // locks handed over in the release; every target's when zero
	counts                              map[string]int
	settledNote                         string
	opSettle, opRelease                 counts
	reconcilesSettle, reconcilesRelease int
	violations                          int
	cpuSettle, cpuRelease               cpuUse
}

// coldStart is the manager binary starting over 10,000 claims: all Pending
// (the first decision of every lock), then all decided (a restart).
type coldStart struct {
	locks                                    int
	firstDecision, restart                   time.Duration
	firstManagerWrites, restartManagerWrites int    // the manager's own
	firstWrites, restartWrites               counts // every write the API server served in the window
	firstCPU                                 cpuUse // the first decision's: from the manager's start until it was idle
	floor                                    coldFloor
}

// cpuPerClaim is the API server's CPU time per claim settled, in
// milliseconds.
func (s scaleResult) cpuPerClaim() float64 {
	return 1000 * s.cpuSettle.secs["kube-apiserver"] / float64(s.claims)
}

// cpuPerLock is the API server's CPU time per lock handed over, in
// milliseconds.
func (s scaleResult) cpuPerLock() float64 {
	return 1000 * s.cpuRelease.secs["kube-apiserver"] / float64(s.locksHandedOver())
}

// locksHandedOver is how many locks the release handed over: the client-side
// peer's targets whose newest build won the create have no waiter.
func (s scaleResult) locksHandedOver() int {
	if s.handedOver > 0 {
		return s.handedOver
	}
	return targets
}

// settleRate is how many claims settled per second.
func (s scaleResult) settleRate() float64 {
	if s.settled <= 0 {
		return 0
	}
	return float64(s.claims) / s.settled.Seconds()
}

// cpuSecsPer is proc's CPU time per unit (n of them) in the settle window
// or the release window, in milliseconds.
func (s scaleResult) cpuSecsPer(proc string, n int, settle bool) float64 {
	u := s.cpuRelease
	if settle {
		u = s.cpuSettle
	}
	if n == 0 {
		return 0
	}
	return 1000 * u.secs[proc] / float64(n)
}

type idleResult struct {
	locks      int
	window     time.Duration
	ops        counts
	reconciles int
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(ds []time.Duration) time.Duration { return percentile(ds, 50) }

// step is one request of the typical hand-off, at its median offsets after
// the release was sent.
type step struct {
	what       string
	start, end time.Duration
}

// breakdown finds the most common sequence of operator requests among the
// traced hand-offs and returns its steps at their median offsets, how many
// hand-offs followed it, and the median instants the release returned and
// the waiter saw its grant.
func breakdown(traces []cycleTrace) (steps []step, share int, released, observed, observedLease time.Duration) {
	bySig := map[string][]cycleTrace{}
	best := ""
	for _, tr := range traces {
		var whats []string
		for _, r := range tr.requests {
			whats = append(whats, r.what)
		}
		sig := strings.Join(whats, ",")
		bySig[sig] = append(bySig[sig], tr)
		if len(bySig[sig]) > len(bySig[best]) {
			best = sig
		}
	}
	group := bySig[best]
	if len(group) == 0 {
		return nil, 0, 0, 0, 0
	}
	var rel, obs, obsLease []time.Duration
	for _, tr := range group {
		rel, obs = append(rel, tr.released.Sub(tr.t0)), append(obs, tr.observed.Sub(tr.t0))
		obsLease = append(obsLease, tr.observedLease.Sub(tr.t0))
	}
	for k, r := range group[0].requests {
		var starts, ends []time.Duration
		for _, tr := range group {
			starts, ends = append(starts, tr.requests[k].start.Sub(tr.t0)), append(ends, tr.requests[k].done.Sub(tr.t0))
		}
		steps = append(steps, step{r.what, median(starts), median(ends)})
	}
	return steps, len(group), median(rel), median(obs), median(obsLease)
}

// profileTop summarizes a CPU profile: the operator's reconcile, cumulative.
func profileTop(name, path string) string {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=22",
		"-focus=LockReconciler|controller-runtime/pkg/internal/controller", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: go tool pprof failed: %v\n%s", name, err, out)
	}
	return fmt.Sprintf("%s (%s)\n%s", name, filepath.Base(path), out)
}

// gitDescribe names the commit the operator under test was built from.
func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// decideResult is one line of BenchmarkDecide's output.
type decideResult struct {
	perOp  time.Duration
	allocs float64
}

// decideLine finds the result for a lock of n claims in BenchmarkDecide's
// output.
func decideLine(lines []string, n int) (decideResult, bool) {
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 8 || !strings.HasPrefix(f[0], fmt.Sprintf("BenchmarkDecide/claims=%d-", n)) {
			continue
		}
		ns, err1 := strconv.ParseFloat(f[2], 64)
		allocs, err2 := strconv.ParseFloat(f[6], 64)
		if err1 == nil && err2 == nil {
			return decideResult{time.Duration(ns), allocs}, true
		}
	}
	return decideResult{}, false
}

// readDecide keeps the benchmark lines of BenchmarkDecide's output.
func readDecide(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "BenchmarkDecide") {
			lines = append(lines, l)
		}
	}
	return lines
}

type envInfo struct {
	cpu, kernel, goVersion, apiserver, etcd, commit string
	cores                                           int
	memGiB                                          float64
	modules                                         map[string]string
}

func (b *bench) environment() envInfo {
	e := envInfo{cores: runtime.NumCPU(), goVersion: runtime.Version(), modules: map[string]string{}}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`model name\s*:\s*(.*)`).FindStringSubmatch(string(raw)); m != nil {
			e.cpu = m[1]
		}
	}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		if m := regexp.MustCompile(`MemTotal:\s*(\d+)`).FindStringSubmatch(string(raw)); m != nil {
			kb, _ := strconv.ParseFloat(m[1], 64)
			e.memGiB = kb / (1 << 20)
		}
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.kernel = strings.TrimSpace(string(raw))
	}
	if v, err := b.cs.Discovery().ServerVersion(); err == nil {
		e.apiserver = v.GitVersion
	}
	assets := b.env.BinaryAssetsDirectory
	if assets == "" {
		assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if out, err := exec.Command(filepath.Join(assets, "etcd"), "--version").Output(); err == nil {
		e.etcd = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "etcd Version: ")
	}
	for _, m := range []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go"} {
		if out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", m).Output(); err == nil {
			e.modules[m] = strings.TrimSpace(string(out))
		}
	}
	return e
}
