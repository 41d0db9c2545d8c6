//go:build bench

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// memResult is what the manager binary used once it had caught up.
type memResult struct {
	label                string
	heapAlloc, heapInuse float64 // bytes, just after a garbage collection
	rss, peakRSS         float64 // bytes: VmRSS and VmHWM
	startup              time.Duration
	cpu                  cpuUse // from its start until it was idle
	writes               int    // the manager's write requests until it was idle
	note                 string
}

// claimsPerLock: each lock of the memory run ends with one claim Held, one
// Waiting and two Superseded.
const claimsPerLock = 4

// memory measures bin/manager against an empty cluster, with `pods`
// unrelated pods, and with `claims` claims on top.
func (b *bench) memory(pods, claims int) ([]memResult, error) {
	var out []memResult
	var tr *claimTracker // follows the claims, once there are some
	run := func(label, note string) error {
		r, err := b.runManagerBinary(label, 0, func() bool {
			ctx, cancel := context.WithTimeout(b.ctx, 10*time.Minute)
			defer cancel()
			return tr == nil || tr.waitUntil(ctx, func(phases map[string]buildlockv1.Phase) bool {
				return countPhases(phases)[buildlockv1.PhasePending] == 0
			}) == nil
		})
		r.note = note
		out = append(out, r)
		return err
	}
	if err := run("no pods, no claims", ""); err != nil {
		return out, err
	}

	podNS := b.namespace("unrelated")
	size := 0
	err := parallel(pods, func(i int) error {
		pod := unrelatedPod(podNS, i)
		if i == 0 {
			raw, _ := json.Marshal(pod)
			size = len(raw)
		}
		return b.c.Create(b.ctx, pod)
	})
	if err != nil {
		return out, fmt.Errorf("creating unrelated pods: %w", err)
	}
	full, err := b.fullPodCache(podNS)
	if err != nil {
		return out, err
	}
	b.res.fullPodCache = full
	if err := run(fmt.Sprintf("%d unrelated pods", pods), fmt.Sprintf("each pod ≈ %.1f KB of JSON; holding them all as Pod objects takes %s", float64(size)/1e3, mib(full))); err != nil {
		return out, err
	}

	// The cold start's floor: the same claims on the same cluster, decided
	// by the floor operator, then deleted. A floor that fails leaves the
	// operator's rows measured.
	var floorErr error
	if b.res.cold.floor, floorErr = b.floorColdStart(claims); floorErr != nil {
		floorErr = fmt.Errorf("the cold start's floor: %w", floorErr)
	}

	// The claims are created while no manager runs; the binary then decides
	// them all from a cold start.
	claimNS := b.namespace("mem-claims")
	if tr, err = b.createColdClaims(claimNS, claims); err != nil {
		return out, errors.Join(floorErr, err)
	}
	first0, err := b.apiserverWrites()
	if err != nil {
		return out, err
	}
	if err := run(fmt.Sprintf("%d claims (%d locks) and the pods", claims, claims/claimsPerLock), ""); err != nil {
		return out, err
	}
	first1, err := b.apiserverWrites()
	if err != nil {
		return out, err
	}
	b.res.cold.firstWrites = first1.minus(first0)
	out[len(out)-1].note = fmt.Sprintf("one Held, one Waiting, two Superseded per lock; decided from a cold start in %.0f s", out[len(out)-1].startup.Seconds())
	b.res.cold.firstDecision, b.res.cold.firstManagerWrites = out[len(out)-1].startup, out[len(out)-1].writes
	b.res.cold.firstCPU = out[len(out)-1].cpu

	// A restart over the same claims, all decided: every lock is decided
	// again, and none of them changes.
	locks := claims / claimsPerLock
	w0, err := b.apiserverWrites()
	if err != nil {
		return out, err
	}
	restart, err := b.runManagerBinary("restart", locks, func() bool { return true })
	if err != nil {
		return out, err
	}
	w1, err := b.apiserverWrites()
	if err != nil {
		return out, err
	}
	b.res.cold.locks, b.res.cold.restart, b.res.cold.restartWrites = locks, restart.startup, w1.minus(w0)
	b.res.cold.restartManagerWrites = restart.writes
	restart.label = fmt.Sprintf("restarted over the %d decided claims", claims)
	restart.note = fmt.Sprintf("every lock decided again in %.1f s; %d writes", restart.startup.Seconds(), restart.writes)
	out = append(out, restart)

	// Leave a clean cluster for the latency runs.
	if err := b.deleteClaimsAndLeases(claimNS); err != nil {
		return out, errors.Join(floorErr, err)
	}
	return out, errors.Join(floorErr, b.deletePods(podNS))
}

// createColdClaims creates n Pending claims in ns, claimsPerLock per target
// (a line each), 32 clients at once, and returns a tracker of them that has
// seen them all.
func (b *bench) createColdClaims(ns string, n int) (*claimTracker, error) {
	tr, err := trackClaims(b.ctx, b.c, ns)
	if err != nil {
		return nil, err
	}
	err = parallel(n, func(i int) error {
		return b.c.Create(b.ctx, blClaim(ns, fmt.Sprintf("c-%d", i), fmt.Sprintf("t%d", i/claimsPerLock), fmt.Sprintf("acme/line-%d", i%claimsPerLock), 1, ""))
	})
	if err != nil {
		return nil, fmt.Errorf("creating claims: %w", err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	if err := tr.waitUntil(ctx, func(phases map[string]buildlockv1.Phase) bool { return len(phases) == n }); err != nil {
		return nil, fmt.Errorf("watching the %d claims created: %w", n, err)
	}
	return tr, nil
}

// coldFloor is the cold start's floor: the floor operator deciding every
// lock of Pending claims, from its list until every claim is seen decided.
type coldFloor struct {
	claims, locks int
	decided       time.Duration
	requests      counts
	cpu           cpuUse
}

// floorColdStart creates n Pending claims in a namespace of their own, as
// the cold start's, and lets the floor operator decide them; then deletes
// them. No manager runs meanwhile.
func (b *bench) floorColdStart(n int) (coldFloor, error) {
	r := coldFloor{claims: n, locks: n / claimsPerLock}
	ns := b.namespace("floor-cold")
	tr, err := b.createColdClaims(ns, n)
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithCancelCause(b.ctx)
	defer cancel(nil)
	f, err := b.startFloorOperator(ctx, cancel, ns, *flagWorkers)
	if err != nil {
		return r, err
	}
	cpu0, t0 := cpuSeconds(), time.Now()
	err = f.decideListed(ctx)
	if err == nil {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
		err = tr.waitUntil(wctx, func(phases map[string]buildlockv1.Phase) bool {
			return len(phases) == n && countPhases(phases)[buildlockv1.PhasePending] == 0
		})
		wcancel()
	}
	r.decided, r.cpu = time.Since(t0), cpuSince(cpu0, t0)
	if failed := f.stop(); failed != nil {
		err = failed
	}
	r.requests = f.count.snapshot()
	if err != nil {
		err = fmt.Errorf("deciding %d claims: %w", n, err)
	}
	return r, errors.Join(err, b.deleteClaimsAndLeases(ns))
}

// fullPodCache is how much heap the pods of ns take as typed objects: what a
// manager that cached full Pods would hold for them.
func (b *bench) fullPodCache(ns string) (float64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var list corev1.PodList
	if err := b.c.List(b.ctx, &list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(list)
	return float64(after.HeapAlloc) - float64(before.HeapAlloc), nil
}

// unrelatedPod is a pod of some other workload, of a realistic size.
func unrelatedPod(ns string, i int) *corev1.Pod {
	env := make([]corev1.EnvVar, 12)
	for k := range env {
		env[k] = corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", k), Value: strings.Repeat("v", 40)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: fmt.Sprintf("web-%05d", i),
			Labels: map[string]string{"app": "web", "tier": "frontend", "release": "r42", "pod-template-hash": "5d8f7c9b4",
				"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop"},
			Annotations: map[string]string{"checksum/config": strings.Repeat("a", 64), "prometheus.io/scrape": "true",
				"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 600)},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "web", Image: "registry.example/shop/web:1.2.3", Env: env, Args: []string{"--port=8080", "--log-level=info"}},
			{Name: "sidecar", Image: "registry.example/proxy:2.0", Args: []string{"--upstream=127.0.0.1:8080"}},
		}},
	}
}

// runManagerBinary runs bin/manager against the API server until it has
// decided every claim (and run at least minReconciles reconciles) and gone
// idle, then samples its memory and stops it.
func (b *bench) runManagerBinary(label string, minReconciles int, decided func() bool) (memResult, error) {
	r := memResult{label: label}
	cpu0 := cpuSeconds()
	proc, err := b.startManagerBinary(label)
	if err != nil {
		return r, err
	}
	defer proc.stop()
	if r.startup, err = proc.waitIdle(minReconciles, decided); err != nil {
		return r, err
	}
	r.cpu = cpuSince(cpu0, proc.started)
	metricsAddr := proc.metricsAddr
	// An idle process does not collect garbage: scrape (which allocates a
	// little each time) until the next GC, and read the heap just after it.
	m, err := scrape(metricsAddr)
	if err != nil {
		return r, err
	}
	for gcs, i := m["go_gc_duration_seconds_count"], 0; m["go_gc_duration_seconds_count"] == gcs; i++ {
		if i == 20000 {
			return r, fmt.Errorf("no garbage collection after %d scrapes", i)
		}
		if m, err = scrape(metricsAddr); err != nil {
			return r, err
		}
	}
	// Sweeping finishes in the background after the collection.
	time.Sleep(200 * time.Millisecond)
	if m, err = scrape(metricsAddr); err != nil {
		return r, err
	}
	r.heapAlloc, r.heapInuse = m["go_memstats_heap_alloc_bytes"], m["go_memstats_heap_inuse_bytes"]
	r.writes = int(m[managerWrites])
	r.rss, r.peakRSS, err = procMemory(proc.cmd.Process.Pid)
	return r, err
}

// managerProcess is bin/manager running against the API server, deciding
// every namespace, without leader election.
type managerProcess struct {
	cmd         *exec.Cmd
	logFile     *os.File
	metricsAddr string
	started     time.Time
}

// startManagerBinary starts bin/manager, its log in the work directory
// under the label's first word.
func (b *bench) startManagerBinary(label string) (*managerProcess, error) {
	kubeconfig := filepath.Join(b.outDir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, b.env.KubeConfig, 0o600); err != nil {
		return nil, err
	}
	metricsAddr, probeAddr := freeAddr(), freeAddr()
	logFile, err := os.Create(filepath.Join(b.outDir, "manager-"+strings.Fields(label)[0]+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(b.managerBin, "--metrics-bind-address="+metricsAddr, "--metrics-secure=false", "--health-probe-bind-address="+probeAddr,
		"--leader-elect=false", "--finished-ttl=0")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	m := &managerProcess{cmd: cmd, logFile: logFile, metricsAddr: metricsAddr, started: time.Now()}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", b.managerBin, err)
	}
	return m, nil
}

// stop ends the manager (SIGTERM) and waits for it.
func (p *managerProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
	p.logFile.Close()
}

// waitIdle waits until the manager has caught up: decided() holds, an empty
// workqueue, at least minReconciles reconciles, and none for two seconds. It
// returns how long after its start the manager was last busy.
func (p *managerProcess) waitIdle(minReconciles int, decided func() bool) (time.Duration, error) {
	var startup time.Duration
	var last float64 = -1
	stable := 0
	for deadline := time.Now().Add(5 * time.Minute); stable < 4; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("manager did not go idle within 5m")
		}
		m, err := scrape(p.metricsAddr)
		if err != nil {
			continue
		}
		done := m["controller_runtime_reconcile_total"]
		if m["workqueue_depth"] == 0 && done == last && done >= float64(minReconciles) && decided() {
			if stable == 0 {
				startup = time.Since(p.started) - 500*time.Millisecond
			}
			stable++
		} else {
			stable = 0
		}
		last = done
	}
	return startup, nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// managerWrites is the key under which scrape sums the manager's write
// requests.
const managerWrites = "manager writes"

// scrape reads the Prometheus text format, summing each metric's series.
func scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", addr, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = line[:i]
			_, rest, _ = strings.Cut(line[strings.LastIndexByte(line, '}'):], " ")
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
		// The manager's own writes: client-go counts its requests by method.
		if name == "rest_client_requests_total" {
			switch {
			case strings.Contains(line, `method="POST"`), strings.Contains(line, `method="PUT"`),
				strings.Contains(line, `method="PATCH"`), strings.Contains(line, `method="DELETE"`):
				out[managerWrites] += v
			}
		}
	}
	return out, sc.Err()
}

// apiserverWrites reads the API server's count of the writes it has served
// so far (apiserver_request_total), by verb and resource as the harness's
// counters name them: writes by any client, for windows in which only one
// client writes.
func (b *bench) apiserverWrites() (counts, error) {
	raw, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(b.ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	verbs := map[string]string{"POST": "create", "PUT": "update", "PATCH": "patch", "APPLY": "patch", "DELETE": "delete", "DELETECOLLECTION": "deletecollection"}
	out := counts{}
	label := func(series, name string) string {
		_, v, ok := strings.Cut(series, name+`="`)
		if !ok {
			return ""
		}
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		verb, ok := verbs[label(line, "verb")]
		if !ok || label(line, "dry_run") != "" {
			continue
		}
		resource := label(line, "resource")
		if sub := label(line, "subresource"); sub != "" {
			resource += "/" + sub
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		out[verb+" "+resource] += int(v)
	}
	return out, nil
}

// procMemory reads VmRSS and VmHWM (peak RSS) from /proc, in bytes.
func procMemory(pid int) (rss, peak float64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			peak = kb * 1024
		}
	}
	return rss, peak, nil
}
