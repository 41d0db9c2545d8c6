package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

// releaseTimeout bounds the release of the lock after CMD.
const releaseTimeout = 30 * time.Second

// pendingHint is how long a claim may stay Pending before the plugin says
// that the operator may not be running.
const pendingHint = 30 * time.Second

// serviceAccountNamespaceFile holds the namespace of the pod this process
// runs in, when it runs in one.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func (a *app) acquire(ctx context.Context, args []string) int {
	env := a.env()
	o, err := parseAcquire(args, env)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.stdout, commandHelp["acquire"])
		return exitOK
	}
	if err != nil {
		return a.usageError("acquire", err)
	}
	kc, err := a.connect(o.kube)
	if err != nil {
		return a.fail(err)
	}
	for _, note := range o.resolve(kc.Namespace, podNamespace(env)) {
		fmt.Fprintln(a.stderr, note)
	}
	if err := o.claim.Validate(); err != nil {
		return a.usageError("acquire", err)
	}
	if o.ci.System != "" {
		fmt.Fprintf(a.stderr, "Found %s variables.\n", o.ci.System)
	}

	// Signals: while waiting, the first one cancels the wait (and the claim
	// is deleted); while CMD runs, they are passed on to it.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)

	waitCtx, cancelWait := context.WithCancelCause(ctx)
	defer cancelWait(nil)
	var caught os.Signal
	stopWatchingSignals := make(chan struct{})
	signalsWatched := make(chan struct{})
	go func() {
		defer close(signalsWatched)
		select {
		case sig := <-signals:
			caught = sig
			cancelWait(fmt.Errorf("received %s", sig))
		case <-stopWatchingSignals:
		}
	}()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(waitCtx, o.timeout)
		defer cancel()
	}

	p := &progress{out: a.stderr, claim: o.claim, pod: o.claim.PodName}
	defer p.stop()
	hold, err := lock.AcquireHold(waitCtx, kc, o.claim, lock.WithObserver(p.observe), lock.WithErrorHandler(p.warn))
	close(stopWatchingSignals)
	<-signalsWatched
	p.stop()

	if caught != nil {
		if hold != nil {
			// The lock came just as the signal did: give it back.
			releaseQuietly(a, hold)
		}
		fmt.Fprintf(a.stderr, "Received %s while waiting; deleted the claim %s.\n", caught, p.name())
		return signalExitCode(caught)
	}
	if err != nil {
		return a.reportOutcome(err, o.claim)
	}
	fmt.Fprintf(a.stderr, "Held %s with fencing token %d (BuildLock %s/%s).\n", o.claim.Target, hold.Token, hold.Namespace, hold.Name)

	if len(o.command) == 0 {
		fmt.Fprintln(a.stdout, hold.Token)
		if o.claim.PodName == "" {
			fmt.Fprintf(a.stderr, "The hold lasts until released (kubectl buildlock release %s -n %s) or %s without renewal.\n",
				hold.Name, hold.Namespace, expiresAfter(hold.BuildLock))
		} else {
			fmt.Fprintf(a.stderr, "The hold lasts until released (kubectl buildlock release %s -n %s) or pod %s ends.\n",
				hold.Name, hold.Namespace, o.claim.PodName)
		}
		return exitOK
	}
	return a.runHolding(hold, o, signals)
}

// runHolding runs the command while the lock is held, passes signals on to
// it, releases the lock when it ends, and returns the exit code.
func (a *app) runHolding(hold *lock.Hold, o acquireOptions, signals <-chan os.Signal) int {
	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = a.stdin, a.stdout, a.stderr
	cmd.Env = append(append([]string{}, a.environ...),
		"BUILDLOCK_FENCING_TOKEN="+strconv.FormatInt(hold.Token, 10),
		"BUILDLOCK_NAME="+hold.Name,
		"BUILDLOCK_NAMESPACE="+hold.Namespace,
		"BUILDLOCK_TARGET="+o.claim.Target,
	)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(a.stderr, "error: starting %s: %v\n", o.command[0], err)
		releaseQuietly(a, hold)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 127
		}
		return 126
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	var caught os.Signal
wait:
	for {
		select {
		case <-done:
			break wait
		case sig := <-signals:
			if caught != nil {
				fmt.Fprintf(a.stderr, "Received %s again; killing %s.\n", sig, o.command[0])
				_ = cmd.Process.Kill()
				continue
			}
			caught = sig
			fmt.Fprintf(a.stderr, "Received %s; passing it on to %s, then releasing the lock.\n", sig, o.command[0])
			_ = cmd.Process.Signal(sig)
		}
	}
	code := exitStatus(cmd.ProcessState)
	releaseQuietly(a, hold)
	if caught != nil {
		return signalExitCode(caught)
	}
	return code
}

// exitStatus is a finished process's exit code, or 128 plus the signal that
// ended it, as a shell reports it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// releaseQuietly releases the hold and says so; a failure is reported with
// how the lock will end anyway, but does not change the exit code (the
// command's result matters more).
func releaseQuietly(a *app, hold *lock.Hold) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := hold.Release(ctx); err != nil {
		how := "when its pod ends"
		if hold.BuildLock.Spec.PodRef == nil {
			how = "after " + expiresAfter(hold.BuildLock) + " without renewal"
		}
		fmt.Fprintf(a.stderr, "warning: releasing the lock failed: %v; it ends %s, or run: kubectl buildlock release %s -n %s\n",
			err, how, hold.Name, hold.Namespace)
		return
	}
	fmt.Fprintf(a.stderr, "Released %s (deleted BuildLock %s/%s).\n", hold.BuildLock.Spec.Target, hold.Namespace, hold.Name)
}

func expiresAfter(bl *buildlockv1.BuildLock) string {
	if bl.Spec.ExpiresAfter != nil {
		return bl.Spec.ExpiresAfter.Duration.String()
	}
	return "1h"
}

// reportOutcome explains why the lock is not held and returns the exit code.
func (a *app) reportOutcome(err error, claim lock.Claim) int {
	var (
		superseded *lock.SupersededError
		ended      *lock.EndedError
		timeout    *lock.TimeoutError
	)
	switch {
	case errors.As(err, &superseded):
		msg := superseded.Message
		if msg == "" {
			msg = fmt.Sprintf("BuildLock %s superseded it.", superseded.SupersededBy)
		}
		fmt.Fprintf(a.stderr, "Superseded (%s): %s\nA newer build will deploy to %s; stopping without deploying (exit %d).\n",
			superseded.Reason, msg, claim.Target, exitSuperseded)
	case errors.As(err, &ended):
		fmt.Fprintf(a.stderr, "The claim ended before it held the lock: %v\n", ended)
		if ended.Reason != lock.ReasonDeleted {
			fmt.Fprintf(a.stderr, "To try again, delete it first: kubectl buildlock release %s -n %s\n", ended.Name, ended.Namespace)
		}
	case errors.As(err, &timeout):
		msg := timeout.Error()
		fmt.Fprintf(a.stderr, "%s%s.\n", strings.ToUpper(msg[:1]), msg[1:])
		if timeout.CleanupErr == nil {
			fmt.Fprintf(a.stderr, "Deleted the claim %s/%s.\n", timeout.Namespace, timeout.Name)
		}
	default:
		fmt.Fprintf(a.stderr, "error: %v\n", explain(err))
	}
	return exitCode(err)
}

// podNamespace is the namespace of the pod this process runs in, "" when it
// is not known.
func podNamespace(env map[string]string) string {
	if ns := env["POD_NAMESPACE"]; ns != "" {
		return ns
	}
	if env["KUBERNETES_SERVICE_HOST"] == "" {
		return ""
	}
	data, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// progress tells the user how the claim stands while it waits: each new
// phase and message once, and a hint when the operator does not answer.
type progress struct {
	out   interface{ Write([]byte) (int, error) }
	claim lock.Claim
	pod   string

	mu       sync.Mutex
	bl       string // namespace/name, once known
	last     string // phase and message last printed
	phase    buildlockv1.Phase
	hint     *time.Timer
	stopped  bool
	warnings map[string]bool
}

func (p *progress) observe(ev lock.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	bl := ev.BuildLock
	p.bl = bl.Namespace + "/" + bl.Name
	switch ev.Type {
	case lock.EventCreated, lock.EventAttached:
		verb := "Created"
		if ev.Type == lock.EventAttached {
			verb = "Found existing"
		}
		life := "its pod " + p.pod
		if p.pod == "" {
			life = "no pod: renewed while this runs"
		}
		fmt.Fprintf(p.out, "%s BuildLock %s: build %d of %s@%s claims %s (%s).\n",
			verb, p.bl, bl.Spec.Build, bl.Spec.Repo, bl.Spec.Branch, bl.Spec.Target, life)
		p.hint = time.AfterFunc(pendingHint, p.pendingTooLong)
	}
	p.phase = bl.Status.Phase
	if p.phase == buildlockv1.PhaseHeld || p.phase.IsTerminal() {
		return // the outcome is reported once Acquire returns
	}
	if p.phase == "" {
		return // not decided yet: nothing to tell
	}
	line := string(bl.Status.Phase)
	if bl.Status.Message != "" {
		line += ": " + bl.Status.Message
	}
	if line != p.last {
		p.last = line
		fmt.Fprintln(p.out, line)
	}
}

func (p *progress) pendingTooLong() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped && (p.phase == "" || p.phase == buildlockv1.PhasePending) {
		fmt.Fprintf(p.out, "Still Pending after %s: is the buildlock operator running and watching namespace %s?\n",
			pendingHint, p.claim.Namespace)
	}
}

func (p *progress) warn(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.warnings == nil {
		p.warnings = map[string]bool{}
	}
	if msg := err.Error(); !p.warnings[msg] {
		p.warnings[msg] = true
		fmt.Fprintf(p.out, "warning: %v\n", err)
	}
}

// name is the claim's namespace/name, or what it would be.
func (p *progress) name() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bl != "" {
		return p.bl
	}
	return p.claim.Namespace + "/" + lock.Name(p.claim)
}

func (p *progress) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.hint != nil {
		p.hint.Stop()
	}
}
