//go:build bench

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
	"github.com/buildlock/buildlock/pkg/lock"
)

// What the clients users run take to learn a verdict, against the in-process
// operator, one claim at a time, beside the harness's own create → watch:
// pkg/lock's Acquire, and the plugin's `kubectl buildlock acquire`.

// clientRun is one client's samples, each from the instant it began to talk
// to the API server to the instant it knew its verdict.
type clientRun struct {
	// free: a free lock, on a new target each time; freeKept: on one target
	// whose Lease its last holder left free.
	free, freeKept []time.Duration
	// supersededNow: a claim of a build below the one its line's holder
	// holds with, superseded as soon as it is decided.
	supersededNow []time.Duration
	// supersededWaiting: a claim that waits, until a newer build of its
	// line arrives; from the instant the newer claim's create is sent.
	supersededWaiting []time.Duration
	// startup: the plugin's process start until its first connection to
	// the API server, which its samples leave out.
	startup []time.Duration
	// requests are the client's requests in its free samples (pkg/lock's;
	// nil when they cannot be counted).
	requests counts
	measured bool
}

// claimant is one way to claim a lock and learn the verdict.
type claimant interface {
	// claim claims c and returns once it knows the verdict: when it began
	// to talk to the API server, when it knew, and whether it holds.
	claim(ctx context.Context, c lock.Claim) (claimed, error)
}

type claimed struct {
	began, learned time.Time
	held           bool
	// release gives a hold back (deletes its claim); nil when not held.
	release func() error
}

// scenarios says which samples a clientRun takes.
type scenarios struct{ free bool }

// clientAcquires takes n samples (after the warm-up) of each scenario with
// the claimant newClaimant makes, in a namespace of its own, letting the
// operator go idle between them.
func (b *bench) clientAcquires(name string, n int, sc scenarios, newClaimant func(ns string, tr *claimTracker) (claimant, error)) (clientRun, error) {
	var r clientRun
	ns := b.namespace(name)
	tr, err := trackClaims(b.ctx, b.c, ns)
	if err != nil {
		return r, err
	}
	cl, err := newClaimant(ns, tr)
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Minute)
	defer cancel()
	s := &clientSession{b: b, ctx: ctx, ns: ns, tr: tr, cl: cl, n: n}
	if sc.free {
		if r.free, r.requests, err = s.freeLocks("free", false); err != nil {
			return r, err
		}
		if r.freeKept, _, err = s.freeLocks("kept", true); err != nil {
			return r, err
		}
	}
	if r.supersededNow, err = s.supersededOnArrival(); err != nil {
		return r, err
	}
	if r.supersededWaiting, err = s.supersededWhileWaiting(); err != nil {
		return r, err
	}
	if st, ok := cl.(interface{ startups() []time.Duration }); ok {
		r.startup = st.startups()
	}
	r.measured = true
	return r, nil
}

// clientSession is one claimant's samples in its namespace.
type clientSession struct {
	b   *bench
	ctx context.Context
	ns  string
	tr  *claimTracker
	cl  claimant
	n   int // samples after the warm-up
}

func (s *clientSession) claimOf(name, target, repo string, build int64) lock.Claim {
	return lock.Claim{Namespace: s.ns, Name: name, Target: target, Repo: repo, Branch: "main", Build: build,
		RunID: name, ExpiresAfter: 10 * time.Minute}
}

// idle waits until the operator is idle, so that one sample's work does not
// run into the next.
func (s *clientSession) idle() { s.b.ops.quiesce(quietFor, quietMax) }

// expect fails on an error or a verdict other than held says, giving back a
// hold it did not want.
func expect(got claimed, err error, held bool, what string) error {
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case got.held != held && got.release != nil:
		return errors.Join(fmt.Errorf("%s: held, where it should not", what), got.release())
	case got.held != held:
		return fmt.Errorf("%s: not held, where it should", what)
	}
	return nil
}

// keep adds sample i to into, unless it is a warm-up.
func keep(i int, into *[]time.Duration, d time.Duration) {
	if i >= warmup {
		*into = append(*into, d)
	}
}

// delete deletes the named claims, outside the samples.
func (s *clientSession) delete(names ...string) error {
	for _, name := range names {
		if err := s.b.deleteObject(&buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name}}); err != nil {
			return err
		}
	}
	return nil
}

// freeLocks acquires free locks: a new target each time, or, kept, one
// target whose Lease its last holder left free; and the claimant's requests
// within the samples, when it counts them.
func (s *clientSession) freeLocks(prefix string, kept bool) ([]time.Duration, counts, error) {
	var lat []time.Duration
	var requests counts
	counted, _ := s.cl.(interface{ counts() counts })
	for i := range warmup + s.n {
		target := fmt.Sprintf("%s-%d", prefix, i)
		if kept {
			target = prefix
		}
		var c0 counts
		if counted != nil {
			c0 = counted.counts()
		}
		got, err := s.cl.claim(s.ctx, s.claimOf(fmt.Sprintf("%s-%d", prefix, i), target, "acme/app", int64(i+1)))
		if err := expect(got, err, true, "a free lock on "+target); err != nil {
			return lat, requests, err
		}
		keep(i, &lat, got.learned.Sub(got.began))
		if i >= warmup && counted != nil {
			requests = requests.plus(counted.counts().minus(c0))
		}
		if err := got.release(); err != nil {
			return lat, requests, err
		}
		if kept {
			if err := s.b.waitFree(s.ns, target); err != nil {
				return lat, requests, err
			}
		}
		s.idle()
	}
	return lat, requests, nil
}

// supersededOnArrival claims builds below the one the holder of "held", of
// the same line, holds with: each is superseded as soon as it is decided.
func (s *clientSession) supersededOnArrival() ([]time.Duration, error) {
	if err := s.b.holdWithRawClaim(s.ctx, s.tr, s.ns, "holder-held", "held", "acme/app", 1<<40); err != nil {
		return nil, err
	}
	var lat []time.Duration
	for i := range warmup + s.n {
		c := s.claimOf(fmt.Sprintf("late-%d", i), "held", "acme/app", int64(i+1))
		got, err := s.cl.claim(s.ctx, c)
		if err := expect(got, err, false, "a build below its line's holder"); err != nil {
			return lat, err
		}
		keep(i, &lat, got.learned.Sub(got.began))
		if err := s.delete(c.Name); err != nil {
			return lat, err
		}
		s.idle()
	}
	return lat, nil
}

// supersededWhileWaiting claims "waited", held by another line: the claim
// waits until a newer build of its line, created by the harness, takes its
// place. A sample runs from the newer claim's create.
func (s *clientSession) supersededWhileWaiting() ([]time.Duration, error) {
	if err := s.b.holdWithRawClaim(s.ctx, s.tr, s.ns, "holder-waited", "waited", "acme/holder", 1); err != nil {
		return nil, err
	}
	type outcome struct {
		got claimed
		err error
	}
	var lat []time.Duration
	for i := range warmup + s.n {
		c := s.claimOf(fmt.Sprintf("waiting-%d", i), "waited", "acme/app", int64(2*i+1))
		ctx, cancel := context.WithCancel(s.ctx)
		done := make(chan outcome, 1)
		go func() {
			got, err := s.cl.claim(ctx, c)
			done <- outcome{got, err}
		}()
		newer := blClaim(s.ns, fmt.Sprintf("newer-%d", i), "waited", "acme/app", int64(2*i+2), "")
		_, err := s.tr.waitPhase(ctx, c.Name, buildlockv1.PhaseWaiting)
		var t0 time.Time
		if err == nil {
			s.idle()
			t0 = time.Now()
			err = s.b.c.Create(ctx, newer)
		}
		if err != nil {
			cancel()
			return lat, errors.Join(err, (<-done).err)
		}
		o := <-done
		cancel()
		if err := expect(o.got, o.err, false, "a waiting claim when a newer build of its line arrives"); err != nil {
			return lat, err
		}
		keep(i, &lat, o.got.learned.Sub(t0))
		if err := s.delete(newer.Name, c.Name); err != nil {
			return lat, err
		}
		s.idle()
	}
	return lat, nil
}

// holdWithRawClaim creates a claim as the harness's contenders do and waits
// until it holds.
func (b *bench) holdWithRawClaim(ctx context.Context, tr *claimTracker, ns, name, target, repo string, build int64) error {
	if err := b.c.Create(ctx, blClaim(ns, name, target, repo, build, "")); err != nil {
		return err
	}
	_, err := tr.waitPhase(ctx, name, buildlockv1.PhaseHeld)
	return err
}

// rawClaimant is the harness's own: it creates the BuildLock and learns the
// verdict from its watches of the namespace's claims and grant Leases.
type rawClaimant struct {
	b  *bench
	tr *claimTracker
}

func (r rawClaimant) claim(ctx context.Context, c lock.Claim) (claimed, error) {
	got := claimed{began: time.Now()}
	if err := r.b.blc.Create(ctx, blClaim(c.Namespace, c.Name, c.Target, c.Repo, c.Build, "")); err != nil {
		return got, err
	}
	err := r.tr.waitUntil(ctx, func(map[string]buildlockv1.Phase) bool {
		if at, ok := r.tr.granted[c.Name]; ok {
			got.learned, got.held = at, true
			return true
		}
		at, ok := r.tr.seen[c.Name][buildlockv1.PhaseSuperseded]
		got.learned = at
		return ok
	})
	if got.held {
		got.release = func() error {
			return r.b.deleteObject(&buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}})
		}
	}
	return got, err
}

// lockClaimant calls pkg/lock's AcquireHold with one client, as a long-lived
// process would, and counts its requests.
type lockClaimant struct {
	c     client.WithWatch
	count *counter
}

func (b *bench) newLockClaimant(string, *claimTracker) (claimant, error) {
	l := lockClaimant{count: newCounter()}
	var err error
	l.c, err = lock.NewClient(l.count.wrap(b.cfg))
	return l, err
}

func (l lockClaimant) counts() counts { return l.count.snapshot() }

func (l lockClaimant) claim(ctx context.Context, c lock.Claim) (claimed, error) {
	got := claimed{began: time.Now()}
	h, err := lock.AcquireHold(ctx, l.c, c)
	got.learned = time.Now()
	switch {
	case errors.Is(err, lock.ErrSuperseded):
		return got, nil
	case err != nil:
		return got, err
	}
	got.held = true
	got.release = func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return h.Release(rctx)
	}
	return got, nil
}

// pluginClaimant runs `kubectl-buildlock acquire` (without a command: it
// prints the fencing token once held, and leaves the claim) against the API
// server through a TCP proxy that notes when each connection opens: a sample
// starts at the process's first connection, so that the process's own start
// (its exec, its Go runtime and its kubeconfig) is left out, as it is from
// the other rows; its TLS handshake and discovery stay in.
type pluginClaimant struct {
	b          *bench
	bin        string
	kubeconfig string
	env        []string
	proxy      *connProxy
	mu         sync.Mutex
	started    []time.Duration
}

func (b *bench) newPluginClaimant(string, *claimTracker) (claimant, error) {
	if _, err := os.Stat(b.pluginBin); err != nil {
		return nil, fmt.Errorf("the plugin's binary (-bench.plugin; make bench builds it): %w", err)
	}
	cfg, err := clientcmd.Load(b.env.KubeConfig)
	if err != nil {
		return nil, err
	}
	var server string
	for _, cluster := range cfg.Clusters {
		server = cluster.Server
	}
	proxy, err := startProxy(server)
	if err != nil {
		return nil, err
	}
	for _, cluster := range cfg.Clusters {
		cluster.Server = "https://" + proxy.addr()
	}
	dir := filepath.Join(b.outDir, "plugin")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pluginClaimant{b: b, bin: b.pluginBin, kubeconfig: filepath.Join(dir, "kubeconfig"), proxy: proxy}
	if err := clientcmd.WriteToFile(*cfg, p.kubeconfig); err != nil {
		return nil, err
	}
	// No CI variables: the claim says who it is with flags.
	p.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TMPDIR=" + dir, "KUBECONFIG=" + p.kubeconfig}
	go func() {
		<-b.ctx.Done()
		proxy.close()
	}()
	return p, nil
}

func (p *pluginClaimant) startups() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

func (p *pluginClaimant) claim(ctx context.Context, c lock.Claim) (claimed, error) {
	var got claimed
	cmd := exec.CommandContext(ctx, p.bin, "acquire", "-n", c.Namespace, "--target", c.Target, "--name", c.Name,
		"--repo", c.Repo, "--branch", c.Branch, "--build", strconv.FormatInt(c.Build, 10), "--run-id", c.RunID,
		"--pod=", "--expires-after", c.ExpiresAfter.String())
	cmd.Env = p.env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return got, err
	}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return got, err
	}
	token := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			token <- time.Now()
		}
		close(token)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	learned, printed := <-token
	err = cmd.Wait()
	exited := time.Now()
	began, ok := p.proxy.firstSince(start)
	if !ok {
		return got, fmt.Errorf("kubectl-buildlock acquire never connected to the API server: %v\n%s", err, stderr.String())
	}
	got.began = began
	p.mu.Lock()
	p.started = append(p.started, began.Sub(start))
	p.mu.Unlock()
	var exit *exec.ExitError
	switch {
	case err == nil && printed:
		got.learned, got.held = learned, true
		got.release = func() error {
			return p.b.deleteObject(&buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}})
		}
	case errors.As(err, &exit) && exit.ExitCode() == 3: // superseded
		got.learned = exited
	default:
		return got, fmt.Errorf("kubectl-buildlock acquire: %v\n%s", err, stderr.String())
	}
	return got, nil
}

// connProxy forwards TCP connections to an address and notes when each one
// was accepted.
type connProxy struct {
	l        net.Listener
	target   string
	mu       sync.Mutex
	accepted []time.Time
}

// startProxy proxies to the host and port of the URL server.
func startProxy(server string) (*connProxy, error) {
	u, err := urlHost(server)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &connProxy{l: l, target: u}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.accepted = append(p.accepted, time.Now())
			p.mu.Unlock()
			go p.forward(in)
		}
	}()
	return p, nil
}

func (p *connProxy) addr() string { return p.l.Addr().String() }

func (p *connProxy) close() { _ = p.l.Close() }

func (p *connProxy) forward(in net.Conn) {
	defer in.Close()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer out.Close()
	go func() {
		_, _ = io.Copy(out, in)
		_ = out.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(in, out)
}

// firstSince is the first connection accepted at or after t.
func (p *connProxy) firstSince(t time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, at := range p.accepted {
		if !at.Before(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// urlHost is the host:port of an https URL.
func urlHost(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", fmt.Errorf("the kubeconfig's server %q: %w", server, err)
	}
	return u.Host, nil
}

// pluginSamples is how many claims of each kind the plugin makes: a third
// of the other rows', as each starts a process.
func pluginSamples() int { return max(handoffs/3, 10) }
