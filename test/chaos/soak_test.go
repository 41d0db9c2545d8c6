package chaos

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
)

var (
	flagSoak        = flag.Duration("chaos.soak", 0, "run TestSoak for this long (env SOAK_DURATION; 0 skips it)")
	flagSoakManager = flag.String("chaos.soak-manager", "", "the manager binary TestSoak runs (`make soak` builds bin/manager)")
	flagSoakCSV     = flag.String("chaos.soak-csv", "", "write TestSoak's samples to this CSV file")
)

// sample is one reading of the manager process.
type sample struct {
	at                  time.Duration // since the start
	heapMiB, rssMiB     float64
	goroutines, conns   int
	openFDs, reconciles int
	// objects counts the pods, BuildLocks and Leases in the workload's
	// namespaces: what the manager's caches hold.
	objects int
}

// TestSoak runs the chaos workload for a long time against the manager as
// a separate process (bin/manager, as deployed: leader election off, one
// replica), reaching the API server through a partition proxy, while the
// control plane's episodes run (API servers and etcd killed, compactions,
// the manager partitioned and healed); it samples the process's heap,
// goroutines and open TCP connections, and fails when they grow instead of
// staying flat, when the checker finds a violation, or when the locks do
// not settle at the end. `make soak DURATION=30m`.
func TestSoak(t *testing.T) {
	d := *flagSoak
	if v := os.Getenv("SOAK_DURATION"); d == 0 && v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SOAK_DURATION=%q: %v", v, err)
		}
	}
	if d == 0 {
		t.Skip("the soak runs only when asked: make soak DURATION=30m (or -chaos.soak=30m)")
	}
	bin := *flagSoakManager
	if bin == "" {
		t.Fatal("-chaos.soak-manager: the manager binary to run (make soak builds it)")
	}
	o := resolveOptions(t)
	o.duration, o.long, o.namespaces, o.targets = d, true, 4, 20
	o.retention = 30 * time.Second
	t.Logf("soak seed %d for %s", o.seed, d)

	cp, err := startControlPlane(2)
	if err != nil {
		t.Fatalf("starting the control plane (run `make envtest`): %v", err)
	}
	t.Cleanup(func() { cp.stop(t.Failed()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newHarness(t, cp, o)
	h.createNamespaces(ctx)
	h.startWatches(ctx)
	go h.watchDeadlines(ctx)
	defer h.report()

	mgr := startManagerProcess(t, cp, bin, o)
	defer mgr.stop()
	const mgrName = "the manager process"
	h.check.ManagerUp(mgrName, cp.apiservers[0].name, false)

	rng := rand.New(rand.NewPCG(o.seed, 0x736f616b))
	sleep := func(lo, hi time.Duration) { time.Sleep(lo + time.Duration(rng.Int64N(int64(hi-lo)+1))) }
	wctx, stopWorkload := context.WithCancel(ctx)
	work := newWorkload(h.c, o.seed, h.clock, h.ledger, h.check, h.targets)
	work.retention = o.retention
	for k, ord := range h.switching {
		work.policies[k], work.policyChange[k] = ord, time.Now()
	}
	workDone := make(chan struct{})
	go func() { defer close(workDone); work.run(wctx) }()

	// Sample every interval; the first tenth is warm-up.
	interval := max(2*time.Second, d/180)
	var samples []sample
	began := time.Now()
	episodes := newCounters()
	nextEpisode := time.Now().Add(time.Minute)
	for time.Since(began) < d {
		if s, err := mgr.sample(time.Since(began)); err == nil {
			s.objects = h.countObjects(ctx)
			samples = append(samples, s)
		} else {
			t.Logf("sampling the manager: %v", err)
		}
		if time.Now().After(nextEpisode) {
			nextEpisode = time.Now().Add(time.Minute + time.Duration(rng.Int64N(int64(time.Minute))))
			switch rng.IntN(5) {
			case 0:
				episodes.add("API server killed", 1)
				h.killAPIServer(rng.IntN(2), sleep)
			case 1:
				episodes.add("etcd killed", 1)
				h.killEtcd(sleep)
			case 2:
				episodes.add("compaction", 1)
				h.compact(ctx, sleep)
			case 3:
				episodes.add("manager partitioned (blackhole)", 1)
				h.check.ManagerCut(mgrName, true)
				mgr.proxy.blackhole()
				sleep(2*time.Second, 8*time.Second)
				mgr.proxy.heal(rng.IntN(2) == 0)
				h.check.ManagerCut(mgrName, false)
			default:
				episodes.add("manager partitioned (slow)", 1)
				mgr.proxy.slow(200*time.Millisecond + time.Duration(rng.Int64N(int64(1800*time.Millisecond))))
				sleep(2*time.Second, 8*time.Second)
				mgr.proxy.heal(false)
			}
		}
		time.Sleep(interval)
	}
	stopWorkload()
	<-workDone
	h.figure("soak: %s with the manager as a process; workload: %d operations: %s; episodes: %s", d, work.ops.total(), work.ops, episodes)
	h.figure("soak: %s", h.plane)
	h.settleAfterChaos(ctx)
	h.barrier(ctx)
	h.check.CheckGrantsCoverHolds()
	h.check.CheckMemorySupersessions()
	h.check.CheckLeaseDeletions()

	flat := judgeFlat(t, samples)
	h.figure("soak samples (every %s): %s", interval, flat)
	if *flagSoakCSV != "" {
		writeSamplesCSV(t, *flagSoakCSV, samples)
	}
}

// countObjects counts the pods, BuildLocks and Leases of the workload's
// namespaces (-1 when a list fails).
func (h *harness) countObjects(ctx context.Context) int {
	n := 0
	for _, ns := range h.namespaces {
		for _, list := range []client.ObjectList{&corev1.PodList{}, &buildlockv1.BuildLockList{}, &coordinationv1.LeaseList{}} {
			if err := h.c.List(ctx, list, client.InNamespace(ns)); err != nil {
				return -1
			}
			n += meta.LenList(list)
		}
	}
	return n
}

// judgeFlat compares the second quarter of the samples (after the warm-up)
// with the last quarter, and fails the test when the manager grew: more
// than 25 % more heap, 10 % (and 20) more goroutines, or 5 more open
// connections, by the medians. It returns the figures.
func judgeFlat(t *testing.T, samples []sample) string {
	if len(samples) < 8 {
		t.Errorf("SOAK: only %d samples", len(samples))
		return "too few samples"
	}
	q := len(samples) / 4
	early, late := samples[q:2*q], samples[len(samples)-q:]
	med := func(ss []sample, f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	peak := func(f func(sample) float64) float64 {
		m := 0.0
		for _, s := range samples {
			m = max(m, f(s))
		}
		return m
	}
	heap := func(s sample) float64 { return s.heapMiB }
	rss := func(s sample) float64 { return s.rssMiB }
	gor := func(s sample) float64 { return float64(s.goroutines) }
	conns := func(s sample) float64 { return float64(s.conns) }
	objects := func(s sample) float64 { return float64(s.objects) }
	out := fmt.Sprintf("%d samples; median of the 2nd quarter → last quarter (peak): heap %.1f → %.1f MiB (%.1f), RSS %.1f → %.1f MiB (%.1f), goroutines %.0f → %.0f (%.0f), open connections %.0f → %.0f (%.0f), objects in the workload's namespaces %.0f → %.0f (%.0f); reconciles %d",
		len(samples), med(early, heap), med(late, heap), peak(heap), med(early, rss), med(late, rss), peak(rss),
		med(early, gor), med(late, gor), peak(gor), med(early, conns), med(late, conns), peak(conns),
		med(early, objects), med(late, objects), peak(objects), samples[len(samples)-1].reconciles)
	if e, l := med(early, heap), med(late, heap); l > 1.25*e+1 {
		t.Errorf("SOAK: the heap grew from %.1f to %.1f MiB", e, l)
	}
	if e, l := med(early, gor), med(late, gor); l > 1.1*e+20 {
		t.Errorf("SOAK: goroutines grew from %.0f to %.0f", e, l)
	}
	if e, l := med(early, conns), med(late, conns); l > e+5 {
		t.Errorf("SOAK: open connections grew from %.0f to %.0f", e, l)
	}
	return out
}

// managerProcess is bin/manager running against the control plane through
// a partition proxy.
type managerProcess struct {
	cmd     *exec.Cmd
	proxy   *partitionProxy
	metrics string
	exited  chan struct{}
}

func startManagerProcess(t *testing.T, cp *controlPlane, bin string, o options) *managerProcess {
	proxy, err := newPartitionProxy(fmt.Sprintf("127.0.0.1:%d", cp.ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(cp.dir, "manager.kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, cp.configFor(proxy.addr()), nil); err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort())
	logPath := filepath.Join(cp.dir, "manager.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--leader-elect=false", "--metrics-bind-address="+metrics, "--metrics-secure=false",
		"--health-probe-bind-address=0", fmt.Sprintf("--finished-ttl=%s", o.ttl), fmt.Sprintf("--grant-retention=%s", o.retention))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	m := &managerProcess{cmd: cmd, proxy: proxy, metrics: metrics, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = out.Close(); close(m.exited) }()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := m.scrape(); err == nil {
			return m
		}
		select {
		case <-m.exited:
			t.Fatalf("the manager exited (log: %s)", logPath)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager's metrics did not answer within a minute (log: %s)", logPath)
		}
	}
}

func (m *managerProcess) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.proxy.close()
}

// scrape reads the manager's Prometheus metrics: the Go runtime's and the
// process's collectors, which controller-runtime registers.
func (m *managerProcess) scrape() (map[string]float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + m.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			if !strings.HasPrefix(name, "controller_runtime_reconcile_total") {
				continue
			}
			name = "controller_runtime_reconcile_total"
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}

func (m *managerProcess) sample(at time.Duration) (sample, error) {
	metrics, err := m.scrape()
	if err != nil {
		return sample{}, err
	}
	return sample{
		at:         at,
		heapMiB:    metrics["go_memstats_heap_inuse_bytes"] / (1 << 20),
		rssMiB:     metrics["process_resident_memory_bytes"] / (1 << 20),
		goroutines: int(metrics["go_goroutines"]),
		openFDs:    int(metrics["process_open_fds"]),
		reconciles: int(metrics["controller_runtime_reconcile_total"]),
		conns:      establishedConns(m.cmd.Process.Pid),
	}, nil
}

// establishedConns counts the process's established TCP connections: its
// socket file descriptors whose inodes /proc/net/tcp{,6} lists in state 01.
func establishedConns(pid int) int {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 9 && f[3] == "01" && inodes[f[9]] {
				n++
			}
		}
	}
	return n
}

func writeSamplesCSV(t *testing.T, path string, samples []sample) {
	var b strings.Builder
	b.WriteString("seconds,heap_inuse_mib,rss_mib,goroutines,established_connections,open_fds,reconciles,objects\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%.0f,%.2f,%.2f,%d,%d,%d,%d,%d\n", s.at.Seconds(), s.heapMiB, s.rssMiB, s.goroutines, s.conns, s.openFDs, s.reconciles, s.objects)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("writing the samples: %v", err)
	}
}
