package chaos

// CI jobs that deploy through buildlock while the chaos runs (issue 21):
// pipelines run `kubectl buildlock acquire -- CMD` through the plugin's real
// binary (built once by the test), and some are SIGKILLed while CMD runs,
// the plugin alone or its whole process group, as a CI runner canceling a
// job does; matrix jobs of one CI run compute one run id at once, through
// the plugin or pkg/lock. CMD is deploycmd, which stamps from inside the
// process when it ran; a pkg/lock job records its deploy itself. The
// checker's activities rules judge them (activities.go). Like the load
// run, this file uses pkg/lock's public API only.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
	"github.com/buildlock/buildlock/pkg/lock"
)

// jobGrace is the plugin's --grace-period for the jobs: how long CMD has
// between SIGTERM and SIGKILL.
const jobGrace = 2 * time.Second

// tools are the binaries the jobs run.
type tools struct{ plugin, deploy string }

// buildTools builds the plugin and deploycmd into dir (once per test run,
// while the control plane starts).
func buildTools(dir string) (tools, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return tools{}, err
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/kubectl-buildlock", "./test/chaos/deploycmd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return tools{}, fmt.Errorf("building the plugin and deploycmd: %w: %s", err, out)
	}
	return tools{plugin: filepath.Join(dir, "kubectl-buildlock"), deploy: filepath.Join(dir, "deploycmd")}, nil
}

// recordingProxy stands between the plugins and the API servers, as the
// administrator: it writes what each plugin sends to its claims into the
// ledger before passing it on (the claims it creates, the renewals it
// sends, its deletions), so that the checker can tell the plugins' writes
// from anybody else's.
type recordingProxy struct {
	ln     net.Listener
	srv    *http.Server
	ledger *Ledger
	mu     sync.Mutex
	specs  map[string]buildlockv1.BuildLockSpec // ns/name → as created
}

func newRecordingProxy(cfg *rest.Config, ledger *Ledger) (*recordingProxy, error) {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &recordingProxy{ln: ln, ledger: ledger, specs: map[string]buildlockv1.BuildLockSpec{}}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, Transport: rt, FlushInterval: -1}
	// A killed API server breaks the connections in flight: the plugins
	// see it as their clients would, the log need not.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.record(r)
		rp.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *recordingProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *recordingProxy) close() { _ = p.srv.Close() }

// record writes a request to a BuildLock into the ledger.
func (p *recordingProxy) record(r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// apis/buildlock.io/v1alpha1/namespaces/<ns>/buildlocks[/<name>]
	if len(parts) < 6 || parts[0] != "apis" || parts[1] != buildlockv1.GroupVersion.Group || parts[3] != "namespaces" || parts[5] != "buildlocks" {
		return
	}
	ns, name := parts[4], ""
	if len(parts) > 6 {
		name = parts[6]
	}
	var body []byte
	if r.Body != nil && (r.Method == http.MethodPost || r.Method == http.MethodPatch) {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.Method {
	case http.MethodPost:
		var bl buildlockv1.BuildLock
		if json.Unmarshal(body, &bl) == nil {
			p.specs[ns+"/"+bl.Name] = *bl.Spec.DeepCopy()
			p.ledger.WroteSpec(ns, bl.Name, bl.Spec)
		}
	case http.MethodPatch:
		var patch struct {
			Spec struct {
				RenewTime *buildlockv1.Timestamp `json:"renewTime"`
			} `json:"spec"`
		}
		if json.Unmarshal(body, &patch) == nil && patch.Spec.RenewTime != nil {
			spec := p.specs[ns+"/"+name]
			spec.RenewTime = patch.Spec.RenewTime
			p.specs[ns+"/"+name] = spec
			p.ledger.WroteSpec(ns, name, spec)
		}
	case http.MethodDelete:
		if name != "" {
			p.ledger.RequestDelete(ns, name)
		}
	}
}

// jobSpec is one CI job.
type jobSpec struct {
	name             string // for the records
	target           string
	repo             string
	build            int64
	runID, stateDir  string
	pod, plugin      bool
	kill             string        // "", killPlugin or killGroup
	killAfter        time.Duration // after CMD started
	ignoreTerm       bool
	deploy           time.Duration
	expiresAfter     time.Duration // pod-less
	matrix           string        // the matrix group, if any
	matrixSharedDirs bool
}

// How a CI runner kills a plugin while CMD runs.
const (
	killPlugin = "the plugin alone"
	killGroup  = "its process group"
)

// jobs runs the CI jobs of a chaos run.
type jobs struct {
	h          *harness
	tools      tools
	proxy      *recordingProxy
	kubeconfig string
	dir        string
	owner      client.WithWatch // pkg/lock jobs' client, recorded in the ledger
	ns         string
	targets    []string
	rng        *rand.Rand
	seq        int
	builds     map[string]int64
	wg         sync.WaitGroup

	mu       sync.Mutex
	running  int
	procs    map[*exec.Cmd]bool
	acts     []Activity
	outcomes *counters
}

// setupJobs prepares the jobs' targets (one NewestWins, one Queue), the
// recording proxy and the plugins' kubeconfig.
func (h *harness) setupJobs(ctx context.Context, t tools) *jobs {
	j := &jobs{h: h, tools: t, dir: h.t.TempDir(), ns: h.namespaces[len(h.namespaces)-1], targets: []string{"cmd-0", "cmd-1"},
		rng: rand.New(rand.NewPCG(h.o.seed, 0x6a6f6273)), builds: map[string]int64{}, procs: map[*exec.Cmd]bool{}, outcomes: newCounters()}
	h.createPolicy(ctx, LockKey{j.ns, "cmd-1"}, buildlockv1.OrderingQueue, 0)
	p, err := newRecordingProxy(h.cp.balancedConfig(), h.ledger)
	if err != nil {
		h.t.Fatalf("jobs: starting the recording proxy: %v", err)
	}
	j.proxy = p
	h.t.Cleanup(p.close)
	j.kubeconfig = filepath.Join(j.dir, "kubeconfig")
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: chaos, cluster: {server: %q}}]
users: [{name: chaos, user: {}}]
contexts: [{name: chaos, context: {cluster: chaos, user: chaos, namespace: %s}}]
current-context: chaos
`, p.url(), j.ns)
	if err := os.WriteFile(j.kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		h.t.Fatal(err)
	}
	c, err := client.NewWithWatch(h.cp.balancedConfig(), client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		h.t.Fatal(err)
	}
	j.owner = h.ownerClient(c)
	return j
}

// run starts jobs until ctx ends, at most three at a time: each kind once
// early (so that the short run has them all), then at random.
func (j *jobs) run(ctx context.Context) {
	firsts := []func(context.Context){
		func(ctx context.Context) { j.start(ctx, j.pluginJob(killPlugin, false, false)) },
		func(ctx context.Context) { j.startMatrix(ctx, false) },
		func(ctx context.Context) { j.start(ctx, j.pluginJob(killGroup, true, true)) },
		func(ctx context.Context) { j.startMatrix(ctx, true) },
		func(ctx context.Context) { j.start(ctx, j.pluginJob("", false, false)) },
		func(ctx context.Context) { j.start(ctx, j.libraryJob()) },
	}
	for i := 0; ctx.Err() == nil; i++ {
		j.mu.Lock()
		busy := j.running >= 3
		j.mu.Unlock()
		switch n := j.rng.IntN(12); {
		case busy:
		case i < len(firsts):
			firsts[i](ctx)
		case n < 4:
			j.start(ctx, j.pluginJob("", j.rng.IntN(3) == 0, false))
		case n < 7:
			kill := []string{killPlugin, killGroup}[j.rng.IntN(2)]
			j.start(ctx, j.pluginJob(kill, j.rng.IntN(2) == 0, j.rng.IntN(3) == 0))
		case n < 9:
			j.startMatrix(ctx, j.rng.IntN(2) == 0)
		default:
			j.start(ctx, j.libraryJob())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(200+j.rng.IntN(400)) * time.Millisecond):
		}
	}
}

// stop waits for the jobs in flight (their plugins got SIGTERM when the
// run ended, as canceled CI jobs), killing what is left after a minute, and
// returns the figures.
func (j *jobs) stop() string {
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		j.mu.Lock()
		for cmd := range j.procs {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		j.mu.Unlock()
		<-done
	}
	return fmt.Sprintf("jobs (%s of %s; plugin: exit codes, or how it was killed): %s", strings.Join(j.targets, ", "), j.ns, j.outcomes)
}

// activities returns what the jobs deployed.
func (j *jobs) activities() []Activity {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]Activity(nil), j.acts...)
}

// next draws a job's target and line, and its line's next build.
func (j *jobs) next() (target, repo string, build int64) {
	target = j.targets[j.rng.IntN(len(j.targets))]
	repo = fmt.Sprintf("jobs/app-%d", j.rng.IntN(4))
	j.builds[repo]++
	j.seq++
	return target, repo, j.builds[repo]
}

func (j *jobs) pluginJob(kill string, pod, ignoreTerm bool) jobSpec {
	target, repo, build := j.next()
	js := jobSpec{name: fmt.Sprintf("plugin-%d", j.seq), target: target, repo: repo, build: build, runID: fmt.Sprintf("run-%d", j.seq),
		pod: pod, plugin: true, kill: kill, ignoreTerm: ignoreTerm, deploy: time.Duration(300+j.rng.IntN(1200)) * time.Millisecond, expiresAfter: 30 * time.Second}
	if kill != "" {
		// Killed while CMD runs; its claim, never renewed again, expires soon.
		js.deploy, js.expiresAfter = 5*time.Second, 10*time.Second
		js.killAfter = time.Duration(100+j.rng.IntN(600)) * time.Millisecond
	}
	return js
}

func (j *jobs) libraryJob() jobSpec {
	target, repo, build := j.next()
	return jobSpec{name: fmt.Sprintf("job-%d", j.seq), target: target, repo: repo, build: build, runID: fmt.Sprintf("run-%d", j.seq),
		pod: j.rng.IntN(3) == 0, deploy: time.Duration(300+j.rng.IntN(1200)) * time.Millisecond, expiresAfter: 30 * time.Second}
}

// startMatrix starts 2–3 jobs of one CI run at once (a matrix, or
// parallel stages): one build, one run id. Each runs on a runner of its
// own (its own state directory), but for one in four groups two share a
// workspace. Only one of them may deploy under a claim; the others must
// exit 6 (ErrClaimedByAnotherRun) or deploy under claims of their own.
func (j *jobs) startMatrix(ctx context.Context, plugin bool) {
	target, repo, build := j.next()
	group := fmt.Sprintf("matrix-%d", j.seq)
	shared := j.rng.IntN(4) == 0
	n := 2 + j.rng.IntN(2)
	for i := range n {
		js := jobSpec{name: fmt.Sprintf("%s/job-%d", group, i), target: target, repo: repo, build: build, runID: group,
			plugin: plugin, deploy: time.Duration(500+j.rng.IntN(1000)) * time.Millisecond, expiresAfter: 30 * time.Second,
			matrix: group, matrixSharedDirs: shared}
		j.start(ctx, js)
	}
}

// start runs js in the background.
func (j *jobs) start(ctx context.Context, js jobSpec) {
	dir := js.name
	if js.matrixSharedDirs {
		dir = js.matrix // the jobs' shared workspace
	}
	js.stateDir = filepath.Join(j.dir, "state", strings.ReplaceAll(dir, "/", "-"))
	if err := os.MkdirAll(js.stateDir, 0o700); err != nil {
		j.h.t.Errorf("jobs: %v", err)
		return
	}
	j.mu.Lock()
	j.running++
	j.mu.Unlock()
	j.wg.Go(func() {
		defer func() {
			j.mu.Lock()
			j.running--
			j.mu.Unlock()
		}()
		var pod *corev1.Pod
		if js.pod {
			pod = j.createPod(ctx, js)
			if pod == nil {
				return
			}
			defer j.deletePod(pod)
		}
		if js.plugin {
			j.runPlugin(ctx, js, pod)
		} else {
			j.runLibrary(ctx, js, pod)
		}
	})
}

func (j *jobs) createPod(ctx context.Context, js jobSpec) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: j.ns, Name: "pod-" + strings.ReplaceAll(js.name, "/", "-")},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
	err := retry(ctx, func() error {
		err := j.h.c.Create(ctx, pod)
		if apierrors.IsAlreadyExists(err) { // an earlier try went through
			err = j.h.c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		}
		return err
	})
	if err != nil {
		if r := j.h.classify(ctx, err); r.class != callStopped {
			j.outcomes.add("pod not created: "+r.why, 1)
		}
		return nil
	}
	j.h.ledger.PodCreated(pod.Namespace, pod.Name, pod.UID)
	return pod
}

// deletePod ends a job's pod, as its runner does when the job ends or is
// canceled.
func (j *jobs) deletePod(pod *corev1.Pod) {
	j.h.ledger.PodDeleting(pod.Namespace, pod.Name)
	_ = j.h.c.Delete(context.Background(), pod, client.GracePeriodSeconds(0))
}

func (j *jobs) record(a Activity) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.acts = append(j.acts, a)
}

// runPlugin runs js through `kubectl buildlock acquire -- deploycmd`, and
// kills the plugin while CMD runs when js says so. A killed job's pod goes
// once CMD is gone, as a canceled job's pod does.
func (j *jobs) runPlugin(ctx context.Context, js jobSpec, pod *corev1.Pod) {
	stamps := filepath.Join(j.dir, strings.ReplaceAll(js.name, "/", "-")+".stamps")
	args := []string{"acquire", "--target", js.target, "--repo", js.repo, "--branch", "main", "--build", strconv.FormatInt(js.build, 10),
		"--run-id", js.runID, "--timeout", "40s", "--grace-period", jobGrace.String()}
	if pod != nil {
		args = append(args, "--pod", pod.Name, "--pod-uid", string(pod.UID))
	} else {
		args = append(args, "--expires-after", js.expiresAfter.String())
	}
	args = append(args, "--", j.tools.deploy, "-out", stamps, "-for", js.deploy.String())
	if js.ignoreTerm {
		args = append(args, "-ignore-term")
	}
	logFile, err := os.Create(filepath.Join(j.dir, strings.ReplaceAll(js.name, "/", "-")+".log"))
	if err != nil {
		j.h.t.Errorf("jobs: %v", err)
		return
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(j.tools.plugin, args...)
	cmd.Env = []string{"KUBECONFIG=" + j.kubeconfig, "HOME=" + j.dir, "BUILDLOCK_STATE_DIR=" + js.stateDir, "PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job's process group, as a CI runner starts it
	if err := cmd.Start(); err != nil {
		j.h.t.Errorf("jobs: starting the plugin: %v", err)
		return
	}
	j.mu.Lock()
	j.procs[cmd] = true
	j.mu.Unlock()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var killed time.Time
	select {
	case <-exited:
	case <-j.killWhenRunning(ctx, js, stamps, exited):
		killed = time.Now()
		pid := cmd.Process.Pid
		if js.kill == killGroup {
			pid = -pid
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM) // the run ends: the job is canceled
		<-exited
	}
	j.mu.Lock()
	delete(j.procs, cmd)
	j.mu.Unlock()
	outcome := fmt.Sprintf("plugin exit %d", cmd.ProcessState.ExitCode())
	if !killed.IsZero() {
		outcome = "plugin killed (" + js.kill + ")"
		time.Sleep(jobGrace + killSlack) // CMD is gone by then, or the rule says so
	}
	if js.matrix != "" {
		outcome = "matrix " + outcome
	}
	j.outcomes.add(outcome, 1)
	if a, ok := readStamps(stamps); ok {
		a.Lock, a.Job, a.Killed, a.Grace = LockKey{j.ns, js.target}, js.name, killed, jobGrace
		j.record(a)
	}
}

// killWhenRunning returns a channel closed a moment after CMD started, when
// js is to be killed (never otherwise, or when the plugin exited first).
func (j *jobs) killWhenRunning(ctx context.Context, js jobSpec, stamps string, exited <-chan struct{}) <-chan struct{} {
	fire := make(chan struct{})
	if js.kill == "" {
		return fire
	}
	go func() {
		for {
			select {
			case <-exited:
				return
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, ok := readStamps(stamps); ok {
				time.Sleep(js.killAfter)
				close(fire)
				return
			}
		}
	}()
	return fire
}

// readStamps reads what deploycmd stamped: when it started (its claim and
// token) and when it was last seen running.
func readStamps(path string) (Activity, bool) {
	f, err := os.Open(path)
	if err != nil {
		return Activity{}, false
	}
	defer func() { _ = f.Close() }()
	var a Activity
	a.Kind = ActivityCommand
	started, ended := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		switch fields[0] {
		case "start":
			started = true
			a.Start, a.End = at, at
			if len(fields) >= 4 {
				a.Claim = fields[2]
				a.Token, _ = strconv.ParseInt(fields[3], 10, 64)
			}
		case "end":
			ended = true
			a.End = at
		default:
			a.End = at
		}
	}
	if started && !ended {
		a.End = a.End.Add(20 * time.Millisecond) // it may have run until its next beat
	}
	return a, started
}

// runLibrary runs js as a pkg/lock job: acquire, deploy while the hold
// lasts (recording when), release.
func (j *jobs) runLibrary(ctx context.Context, js jobSpec, pod *corev1.Pod) {
	claim := lock.Claim{Namespace: j.ns, Target: js.target, Repo: js.repo, Branch: "main", Build: js.build, RunID: js.runID, StateDir: js.stateDir}
	if pod != nil {
		claim.PodName, claim.PodUID = pod.Name, string(pod.UID)
	} else {
		claim.ExpiresAfter = js.expiresAfter
	}
	actx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	prefix := "job"
	if js.matrix != "" {
		prefix = "matrix job"
	}
	hold, err := lock.AcquireHold(actx, j.owner, claim)
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrClaimedByAnotherRun):
		j.outcomes.add(prefix+": claimed by another run (exit 6)", 1)
		return
	case errors.Is(err, lock.ErrSuperseded):
		j.outcomes.add(prefix+": superseded (exit 3)", 1)
		return
	case errors.Is(err, lock.ErrEnded):
		j.outcomes.add(prefix+": ended before holding (exit 5)", 1)
		return
	default:
		j.outcomes.add(prefix+": not held (timeout, error or the run's end)", 1)
		return
	}
	hctx, stop := hold.Context(ctx)
	start := time.Now()
	select {
	case <-time.After(js.deploy):
	case <-hctx.Done():
	}
	end := time.Now()
	lost := context.Cause(hctx) != nil && ctx.Err() == nil && errors.Is(context.Cause(hctx), lock.ErrLost)
	stop()
	j.record(Activity{Kind: ActivityJob, Lock: LockKey{j.ns, js.target}, Claim: hold.Name, Token: hold.Token, Job: js.name, Start: start, End: end})
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	if err := hold.Release(rctx); err != nil {
		j.outcomes.add(prefix+": release failed", 1)
		return
	}
	if lost {
		j.outcomes.add(prefix+": held, lost the hold (exit 5)", 1)
		return
	}
	j.outcomes.add(prefix+": held, deployed and released", 1)
}
