//go:build bench

// Package bench measures buildlock side by side with the floor of the API
// server and with what teams use instead, in one run against one API server,
// and writes docs/benchmarks.md. It runs only with the bench build tag:
//
//	make bench
//	cd test/bench && go test -tags bench -run TestBench -timeout 30m . -args -bench.quick
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/testenv"
)

var (
	flagOut      = flag.String("bench.out", "docs/benchmarks.md", "report to write (a relative path is relative to the repository root, as for the other paths)")
	flagPlot     = flag.String("bench.plot", "docs/benchmarks-handoff.png", "plot to write, relative to the repository root")
	flagWork     = flag.String("bench.work", "bin/bench", "directory for logs, profiles and the kubeconfig")
	flagManager  = flag.String("bench.manager", "bin/manager", "manager binary for the memory runs")
	flagPlugin   = flag.String("bench.plugin", "bin/kubectl-buildlock", "kubectl-buildlock binary for the plugin's acquire rows")
	flagDecide   = flag.String("bench.decide", "bin/bench/decide.txt", "output of the arbiter's BenchmarkDecide")
	flagQuick    = flag.Bool("bench.quick", false, "small sizes, to try the harness")
	flagHandoffs = flag.Int("bench.handoffs", 300, "hand-offs per row")
	flagWorkers  = flag.Int("bench.workers", controller.DefaultOptions().Workers, "the in-process manager's MaxConcurrentReconciles (the binary's default)")
	flagOnly     = flag.String("bench.only", "", "run only the steps whose names match this regular expression (to work on the harness); "+
		"the report then goes to the work directory unless -bench.out and -bench.plot say otherwise")
)

// Sizes; -bench.quick shrinks them.
var (
	handoffs     = 300
	targets      = 1000 // scale and idle
	contenders   = 3
	leaseTargets = 60 // the Lease peer's hand-offs run on this many targets at once
	pods         = 10000
	claims       = 10000
	idleWindow   = 60 * time.Second
	profiled     = 100  // hand-offs of the extra, CPU-profiled run
	burstClaims  = 4000 // created at once in another namespace during hand-offs (issue 11)
	queueLines   = 50   // lines waiting in the long Queue row (issue 12)
)

const (
	warmup   = 5                     // first cycles of each run, not recorded
	quietFor = 30 * time.Millisecond // a client counts as idle after this long without a request
	quietMax = 2 * time.Second
	// waitLimit bounds a wait for one observation that has no deadline of
	// its own, so that a stuck run fails rather than hangs.
	waitLimit = 2 * time.Minute
)

// Row names, as in the report.
const (
	rowFloor  = "Floor (write → watch)"
	rowTwoHop = "Two-hop floor"
	rowLease  = "Plain Lease peer"
	rowCM     = "Client-side protocol peer"
	rowBL     = "buildlock"
	// rowFloorContender stands in for the operator with only the requests
	// the API makes necessary (floorcontender.go).
	rowFloorContender = "Floor contender"
)

// stepPipelines names the pipeline step, for -bench.only.
const stepPipelines = "pkg/lock pipelines"

// bench holds the API server and the clients every row shares.
type bench struct {
	ctx        context.Context
	env        *testenv.Environment
	cfg        *rest.Config     // admin, not rate-limited
	c          client.WithWatch // the harness's own client: pods, cleanup (not counted)
	cs         kubernetes.Interface
	blc        client.WithWatch // buildlock contenders' client, counted by blCount
	blCount    *counter
	ops        *counter // the in-process operator's requests
	outDir     string
	managerBin string
	pluginBin  string
	mgr        *testenv.Manager // the in-process operator, while it runs
	res        results
}

func TestBench(t *testing.T) {
	handoffs = *flagHandoffs
	if *flagQuick {
		handoffs, targets, leaseTargets, pods, claims, idleWindow, profiled, burstClaims = 30, 100, 10, 1000, 1000, 5*time.Second, 20, 1000
		pipelineCount, pipelineArrivals = 100, 15*time.Second
	}
	root, err := testenv.RepoRoot()
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inRepo := func(path string) string {
		if filepath.IsAbs(path) {
			return path
		}
		return filepath.Join(root, path)
	}
	b := &bench{ctx: ctx, outDir: inRepo(*flagWork), managerBin: inRepo(*flagManager), pluginBin: inRepo(*flagPlugin)}
	out, plotOut := *flagOut, *flagPlot
	if *flagOnly != "" {
		// A partial run never overwrites the full run's report by default.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["bench.out"] {
			out = filepath.Join(b.outDir, "report.md")
		}
		if !set["bench.plot"] {
			plotOut = filepath.Join(b.outDir, "benchmarks-handoff.png")
		}
	}
	must(t, os.MkdirAll(b.outDir, 0o755))
	logFile, err := os.Create(filepath.Join(b.outDir, "operator.log"))
	must(t, err)
	defer logFile.Close()
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.Level(zapcore.Level(-1))))
	klog.SetLogger(logr.Discard()) // client-go's leader election logs every failed try

	b.env, err = testenv.New()
	must(t, err)
	cfg, err := b.env.Start()
	must(t, err)
	defer func() { _ = b.env.Stop() }()
	b.cfg = rest.CopyConfig(cfg)
	b.cfg.QPS, b.cfg.Burst = -1, 0
	b.c, err = client.NewWithWatch(b.cfg, client.Options{Scheme: testenv.Scheme()})
	must(t, err)
	b.cs = kubernetes.NewForConfigOrDie(b.cfg)
	b.blCount = newCounter()
	b.blc, err = client.NewWithWatch(b.blCount.wrap(b.cfg), client.Options{Scheme: testenv.Scheme()})
	must(t, err)
	b.ops = newCounter()
	b.res.started, b.res.commit = time.Now(), gitDescribe()

	only := regexp.MustCompile(*flagOnly)
	step := func(name string, f func() error) {
		if !only.MatchString(name) && name != "report" {
			return
		}
		t0 := time.Now()
		if err := f(); err != nil {
			// Go on: a step that fails must not take the other steps'
			// measurements with it. The report names the failed steps.
			t.Errorf("%s: %v", name, err)
			b.res.failed = append(b.res.failed, fmt.Sprintf("%s: %v", name, err))
			return
		}
		t.Logf("%-40s %6.1fs", name, time.Since(t0).Seconds())
	}

	step("memory (manager binary)", func() (err error) {
		b.res.memory, err = b.memory(pods, claims)
		return err
	})
	step("request costs", func() (err error) {
		if b.res.costs, err = b.requestCosts(handoffs); err != nil {
			return err
		}
		prof, err := b.statusWriteProfile()
		b.res.profiles = append(b.res.profiles, prof)
		return err
	})
	must(t, b.startOperator())
	defer func() { _ = b.stopOperator() }()

	step("floor", func() (err error) { b.res.floor, err = b.floor(handoffs); return err })
	step("two-hop floor", func() (err error) { b.res.floors, err = b.twoHopFloor(handoffs); return err })
	step("Lease peer hand-offs", func() error {
		cnt := newCounter()
		t0 := time.Now()
		lat, err := b.leaseHandoffs(kubernetes.NewForConfigOrDie(cnt.wrap(b.cfg)), leaseTargets, (handoffs+leaseTargets-1)/leaseTargets)
		b.res.lease = handoffRun{lat: lat, handoff: cnt.snapshot()}
		b.res.leaseWall = time.Since(t0)
		return err
	})
	step("client-side peer hand-offs (delete)", func() (err error) { b.res.cmDelete, err = b.cmHandoffs(handoffs, false); return err })
	step("client-side peer hand-offs (pod)", func() (err error) { b.res.cmPods, err = b.cmHandoffs(handoffs, true); return err })
	step("buildlock hand-offs (delete)", func() (err error) {
		b.res.blDelete, err = b.blHandoffs(handoffs, handoffSpec{waiting: 1})
		return err
	})
	step("buildlock hand-offs (pod)", func() (err error) {
		b.res.blPods, err = b.blHandoffs(handoffs, handoffSpec{withPods: true, waiting: 1})
		return err
	})
	step("buildlock hand-offs (Queue, 1 waiting)", func() (err error) {
		b.res.queue1, err = b.blHandoffs(handoffs, handoffSpec{ordering: buildlockv1.OrderingQueue, waiting: 1})
		return err
	})
	step(fmt.Sprintf("buildlock hand-offs (Queue, %d waiting)", queueLines), func() (err error) {
		b.res.queue50, err = b.blHandoffs(handoffs, handoffSpec{ordering: buildlockv1.OrderingQueue, waiting: queueLines})
		return err
	})
	step("acquire", func() (err error) {
		if b.res.acquireLease, err = b.leaseAcquires(b.cs, handoffs); err != nil {
			return err
		}
		if b.res.acquireCM, err = b.cmAcquires(handoffs); err != nil {
			return err
		}
		if b.res.acquireBL, err = b.blAcquires(handoffs, false); err != nil {
			return err
		}
		b.res.acquireKept, err = b.blAcquires(handoffs, true)
		return err
	})
	step("acquire: superseded, the harness's own", func() (err error) {
		b.res.acquireRaw, err = b.clientAcquires("raw-acquire", handoffs, scenarios{}, func(_ string, tr *claimTracker) (claimant, error) {
			return rawClaimant{b, tr}, nil
		})
		return err
	})
	step("acquire: pkg/lock", func() (err error) {
		b.res.acquireLock, err = b.clientAcquires("lock-acquire", handoffs, scenarios{free: true}, b.newLockClaimant)
		return err
	})
	step("acquire: plugin", func() (err error) {
		b.res.acquirePlugin, err = b.clientAcquires("plugin-acquire", pluginSamples(), scenarios{free: true}, b.newPluginClaimant)
		return err
	})
	step("buildlock hand-offs, CPU-profiled", func() error {
		return b.profile("handoff", func() error { _, err := b.blHandoffs(profiled, handoffSpec{waiting: 1}); return err })
	})
	var scaleNS string
	// The floor contender runs the scale load just before the operator
	// does, with the operator stopped (it would decide the claims too).
	step("floor contender scale", func() error {
		return b.withoutOperator(func() error {
			r, err := b.floorScale(targets, contenders)
			b.res.scale = append(b.res.scale, r)
			return err
		})
	})
	step("buildlock scale", func() error {
		return b.profile("scale", func() error {
			r, ns, err := b.blScale(targets, contenders)
			r.row = fmt.Sprintf("%s, %d workers", rowBL, *flagWorkers)
			b.res.scale, scaleNS = append(b.res.scale, r), ns
			return err
		})
	})
	step("heap profile", func() error { return b.heapProfile("heap-after-scale") })
	step("buildlock idle", func() (err error) { b.res.idle, err = b.blIdle(scaleNS, idleWindow); return err })
	step("client-side peer scale", func() error {
		r, err := b.cmScale(targets, contenders)
		b.res.scale = append(b.res.scale, r)
		return err
	})
	step("Lease peer scale", func() error {
		r, err := b.leaseScale(b.cs, targets, contenders)
		b.res.scale = append(b.res.scale, r)
		return err
	})
	step("burst in another namespace", func() (err error) { b.res.burst, err = b.burstHandoffs(handoffs, burstClaims); return err })
	step(stepPipelines, func() error {
		// The binary decides every namespace, and so does the in-process
		// manager (it has to see the namespaces every step creates): the
		// binary alone decides the pipelines.
		return b.withoutOperator(func() (err error) {
			b.res.pipelines, err = b.runPipelines(pipelineCount, pipelineTargets, pipelineArrivals)
			return err
		})
	})
	// Last: the admission policies it installs apply to every later write.
	step("enforcement window", func() (err error) { b.res.enforce, err = b.enforcementWindow(handoffs); return err })
	step("report", func() error {
		b.res.decide = readDecide(inRepo(*flagDecide))
		b.res.env = b.environment()
		b.res.env.commit = b.res.commit
		if err := writePlot(inRepo(plotOut), &b.res); err != nil {
			return err
		}
		return os.WriteFile(inRepo(out), []byte(report(&b.res, filepath.Base(plotOut))), 0o644)
	})
}

// startOperator starts the in-process operator and lets it decide every
// lock the cluster has before anything is measured.
func (b *bench) startOperator() error {
	mgr, err := testenv.StartManager(b.ctx, b.ops.wrap(b.cfg), testenv.ManagerOptions{Workers: *flagWorkers})
	if err != nil {
		return fmt.Errorf("starting the in-process manager: %w", err)
	}
	b.mgr = mgr
	b.ops.quiesce(500*time.Millisecond, 3*time.Minute)
	return nil
}

// stopOperator stops the in-process operator, if it runs.
func (b *bench) stopOperator() error {
	if b.mgr == nil {
		return nil
	}
	err := b.mgr.Stop()
	b.mgr = nil
	if err != nil {
		return fmt.Errorf("stopping the in-process manager: %w", err)
	}
	return nil
}

// withoutOperator runs f with the in-process operator stopped (it decides
// every namespace: it has to see those every step creates), and starts it
// again after.
func (b *bench) withoutOperator(f func() error) error {
	if err := b.stopOperator(); err != nil {
		return err
	}
	err := f()
	return errors.Join(err, b.startOperator())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// profile runs f under the CPU profiler and keeps the operator's share of
// the profile for the report.
func (b *bench) profile(name string, f func() error) error {
	path := filepath.Join(b.outDir, name+".cpu.pprof")
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	err = f()
	pprof.StopCPUProfile()
	out.Close()
	b.res.profiles = append(b.res.profiles, profileTop(name, path))
	return err
}

// heapProfile writes the harness process's live heap (the in-process
// operator's cache is most of it) and keeps its top for the report.
func (b *bench) heapProfile(name string) error {
	path := filepath.Join(b.outDir, name+".pprof")
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	err = pprof.Lookup("heap").WriteTo(out, 0)
	out.Close()
	if err != nil {
		return err
	}
	top, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=15", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go tool pprof: %v\n%s", err, top)
	}
	b.res.profiles = append(b.res.profiles, fmt.Sprintf("%s (%s, the harness process after the scale run, live heap)\n%s", name, filepath.Base(path), top))
	return nil
}

// namespace creates a namespace for one row's objects.
func (b *bench) namespace(name string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}
	if err := b.c.Create(b.ctx, ns); err != nil {
		panic(fmt.Sprintf("creating namespace %s: %v", ns.Name, err))
	}
	return ns.Name
}

// createPod creates a build pod. There is no kubelet: it stays Pending
// (alive) until succeedPod plays the kubelet.
func (b *bench) createPod(ns, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}},
	}
	return pod, b.c.Create(b.ctx, pod)
}

// succeedPod plays the kubelet: the pod's phase becomes Succeeded. It returns
// the instant just before the write.
func (b *bench) succeedPod(ns, name string) (time.Time, error) {
	var pod corev1.Pod
	if err := b.c.Get(b.ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		return time.Time{}, err
	}
	pod.Status.Phase = corev1.PodSucceeded
	t0 := time.Now()
	return t0, b.c.Status().Update(b.ctx, &pod)
}

func (b *bench) deletePod(ns, name string) error {
	return b.deleteObject(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.GracePeriodSeconds(0))
}

// parallel runs f(0..n-1) on 32 workers and returns the first error.
func parallel(n int, f func(int) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range min(n, 32) {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}
