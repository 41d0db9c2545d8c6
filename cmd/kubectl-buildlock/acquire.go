package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

const acquireLong = `Claim a target for this build and wait for the operator's verdict, printing the
claim's place in the queue when it changes. Without CMD, print the fencing token
once the lock is held; the claim stays until released, until its pod ends, or
(without a pod) --expires-after after its last renewal.

With -- CMD, run CMD while holding the lock (BUILDLOCK_FENCING_TOKEN, _NAME,
_NAMESPACE and _TARGET in its environment; a pod-less claim renewed), then release
it and exit with CMD's code. If the claim stops holding meanwhile (deleted,
force-released, expired, or not renewed in time), CMD is stopped (SIGTERM to its
process group, SIGKILL after --grace-period) and acquire exits 5. CMD dies with
the plugin: if the plugin is killed, even with SIGKILL, CMD's process group gets
SIGTERM, then SIGKILL after --grace-period. Signals while waiting delete the
claim; while CMD runs, they are passed on to it.

Repo, branch, build, pod and run id default from the variables of GitHub Actions,
GitLab CI, Tekton and Jenkins X, and Jenkins (see docs/pipelines.md). A claim is
re-used only by the job that created it: a step retried after the plugin died
waits on its claim again. Another run's claim of the build, or another job's that
computed the same run id, is never shared: acquire exits 6 while it is in the
running (give each job its own run id with --run-id or BUILDLOCK_RUN_ID), and
replaces another run's once it finished.

` + exitCodesHelp

const acquireExample = `  # Deploy to staging while holding its lock; exit 3 means this build must not deploy (the message says why)
  kubectl buildlock acquire --target staging --timeout 30m -- ./deploy.sh

  # Roll back on purpose to build 41, after 42 deployed
  kubectl buildlock acquire --target staging --build 41 --rollback --reason "INC-7: 42 breaks checkout" -- ./deploy.sh

  # Outside CI, say who you are
  kubectl buildlock acquire -n ci --target staging --repo acme/shop --branch main --build 42 -- make deploy

  # Hold the lock across several steps
  TOKEN=$(kubectl buildlock acquire --target staging --expires-after 45m)`

// defaultCommandExpiresAfter is a pod-less claim's expiresAfter while CMD
// runs (renewed every third of it): short, so that a hold whose plugin was
// killed ends soon.
const defaultCommandExpiresAfter = 2 * time.Minute

// acquireOptions is `kubectl buildlock acquire`.
type acquireOptions struct {
	f     *factory
	build buildFlags
	claim lock.Claim
	// command runs while the lock is held, when given after "--".
	command              []string
	timeout, gracePeriod time.Duration
	// rollback and reason are --rollback and --reason.
	rollback bool
	reason   string
	// failIfFrozen gives up when the target is frozen (exit 7).
	failIfFrozen bool
	// notes are worth telling the user before acquiring.
	notes []string
}

func newAcquireCommand(o *acquireOptions) *cobra.Command {
	cmd := newCommand(o, "acquire --target T [flags] [-- CMD ARGS...]",
		"Claim a target and wait until it is held; optionally run a command while holding it", acquireLong, acquireExample)
	fs := cmd.Flags()
	addTargetFlag(cmd, o.f, &o.claim.Target, "The namespace the build deploys into (required).")
	o.build.addFlags(fs)
	fs.StringVar(&o.claim.PodName, "pod", "", "The pipeline's pod, in the claims' namespace: while it runs the build is alive (default: $HOSTNAME when running in a pod of that namespace). --pod= claims without a pod.")
	fs.StringVar(&o.claim.PodUID, "pod-uid", "", "The pod's UID, so that a replaced pod of the same name does not count (default: $POD_UID for the pod from $HOSTNAME).")
	fs.StringVar(&o.claim.Name, "name", "", "The BuildLock's name (default: derived from repo, branch, build and target).")
	fs.DurationVar(&o.timeout, "timeout", 0, "How long to wait for the lock before giving up (exit 4, the claim is deleted); 0 waits until interrupted.")
	fs.DurationVar(&o.claim.ExpiresAfter, "expires-after", 0, "For a claim without a pod: how long the hold lasts without renewal (10s to 24h). Default: 2m with -- CMD (renewed every third of it while it runs), else the API's 1h.")
	fs.BoolVar(&o.rollback, "rollback", false, "Roll back on purpose: deploy this build even if a higher build of its line already deployed "+
		"(spec.rollback; the target's BuildLockPolicy says who may). Needs --reason, which is recorded.")
	fs.StringVar(&o.reason, "reason", "", fmt.Sprintf("With --rollback: why (an incident, a ticket), at most %d characters; recorded on the claim, "+
		"in its event and in the lock's audit.", buildlockv1.MaxRollbackReasonLength))
	fs.BoolVar(&o.failIfFrozen, "fail-if-frozen", false, "Give up at once (exit 7, the claim is deleted) when the target is frozen, rather than wait for it to open.")
	fs.DurationVar(&o.gracePeriod, "grace-period", 10*time.Second, "With -- CMD: how long CMD has to exit after SIGTERM when the claim stops holding or the plugin dies, before SIGKILL; "+
		"less than half of --expires-after for a claim without a pod.")
	return cmd
}

// Complete fills the claim from the flags, the CI variables and the
// kubeconfig's namespace.
func (o *acquireOptions) Complete(cmd *cobra.Command, args []string) error {
	if dash := cmd.ArgsLenAtDash(); dash >= 0 {
		if dash == len(args) {
			return usagef("nothing after --: give the command to run while the lock is held")
		}
		args, o.command = args[:dash], args[dash:]
	}
	if len(args) > 0 {
		return usagef("acquire takes no arguments, got %q; put the command to run after --", args)
	}
	fs, ci := cmd.Flags(), lock.DetectCI(o.f.env)
	o.build.complete(fs, ci, o.f)
	o.claim.Repo, o.claim.Branch, o.claim.Build, o.claim.RunID = o.build.repo, o.build.branch, o.build.build, o.build.runID
	o.claim.Workflow = o.build.workflow
	if err := o.completeRollback(fs.Changed("reason")); err != nil {
		return err
	}
	o.claim.StateDir = o.build.stateDir
	podFromEnv := !fs.Changed("pod") && ci.Pod != ""
	if podFromEnv {
		o.claim.PodName = ci.Pod
		defaultFrom(fs, "pod-uid", &o.claim.PodUID, ci.PodUID)
	}
	switch missing := o.build.missing(); {
	case o.claim.Target == "":
		return usagef("missing --target: the namespace the build deploys into")
	case len(missing) > 0:
		return usagef("missing %s: pass them, or run in GitHub Actions, GitLab CI, Tekton or Jenkins X, or Jenkins, whose variables say them",
			strings.Join(missing, ", "))
	}
	if ci.System != "" {
		o.notes = append(o.notes, fmt.Sprintf("Found %s variables.", ci.System))
	}
	if o.build.localRunID {
		o.notes = append(o.notes, fmt.Sprintf("No CI variables name this run: it is run %s, this user on this machine (--run-id to choose another).", o.claim.RunID))
	}
	var err error
	if o.claim.Namespace, err = o.f.namespace(); err != nil {
		return err
	}
	// podRef names a pod of the claims' namespace: a pod found in HOSTNAME
	// counts only there (its namespace is POD_NAMESPACE, else its service
	// account's).
	podNS := o.f.env["POD_NAMESPACE"]
	if podNS == "" && podFromEnv {
		data, _ := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		podNS = strings.TrimSpace(string(data))
	}
	if podFromEnv && podNS != "" && podNS != o.claim.Namespace {
		o.notes = append(o.notes, fmt.Sprintf("Not naming pod %s: it runs in namespace %s, not in %s where the claim is; the claim lives by renewal instead.",
			o.claim.PodName, podNS, o.claim.Namespace))
		o.claim.PodName, o.claim.PodUID = "", ""
	}
	if !fs.Changed("expires-after") && o.claim.PodName == "" && len(o.command) > 0 {
		o.claim.ExpiresAfter = defaultCommandExpiresAfter
	}
	return nil
}

// completeRollback makes the claim a rollback with --rollback, which needs
// --reason; reasonGiven says --reason was given.
func (o *acquireOptions) completeRollback(reasonGiven bool) error {
	switch {
	case o.rollback && strings.TrimSpace(o.reason) == "":
		return usagef("--rollback needs --reason: say why this build deploys again (an incident, a ticket); it is recorded")
	case !o.rollback && reasonGiven:
		return usagef("--reason goes with --rollback (force-release has a --reason of its own)")
	case o.rollback:
		o.claim.Rollback = &buildlockv1.Rollback{Reason: o.reason}
	}
	return nil
}

// Validate checks the claim as the API server would, and that a command
// under a pod-less claim can be stopped before the claim expires.
func (o *acquireOptions) Validate() error {
	switch {
	case o.timeout < 0:
		return errors.New("--timeout must not be negative")
	case o.gracePeriod < 0:
		return errors.New("--grace-period must not be negative")
	case len(o.command) > 0 && o.claim.PodName == "" && o.claim.ExpiresAfter > 0 && o.gracePeriod >= o.claim.ExpiresAfter/2:
		return fmt.Errorf("--grace-period %s must be less than half of --expires-after %s: CMD must be stopped before a claim that is not renewed expires",
			o.gracePeriod, o.claim.ExpiresAfter)
	}
	return o.claim.Validate()
}

// renewDeadline is how long a pod-less claim may go without a successful
// renewal while CMD runs before CMD is stopped: so that SIGTERM, the grace
// period and a tenth of expiresAfter (for the clocks) fit before the claim
// can expire.
func (o *acquireOptions) renewDeadline() time.Duration {
	e := o.claim.ExpiresAfter
	if e == 0 {
		e = buildlockv1.DefaultExpiresAfter
	}
	return e - o.gracePeriod - e/10
}

// Run acquires the lock and, with a command, runs it while holding it.
func (o *acquireOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	stderr := o.f.streams.ErrOut
	for _, note := range o.notes {
		fmt.Fprintln(stderr, note)
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	// While waiting, a signal ends the wait (the claim is deleted); while
	// CMD runs, signals are passed on to it.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	var caught os.Signal
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case caught = <-signals:
			stopWaiting()
		case <-waitCtx.Done():
		}
	})
	p := &progress{out: stderr}
	opts := []lock.Option{lock.WithObserver(p.observe), lock.WithErrorHandler(warnOnce(stderr))}
	if len(o.command) > 0 {
		opts = append(opts, lock.WithRenewDeadline(o.renewDeadline()))
	}
	if o.failIfFrozen {
		opts = append(opts, lock.WithFailIfFrozen())
	}
	hold, err := lock.AcquireHold(waitCtx, c, o.claim, opts...)
	stopWaiting()
	wg.Wait()
	p.stop()
	switch {
	case caught != nil:
		if hold != nil {
			releaseAndSay(stderr, hold) // the lock came just as the signal did: give it back
		}
		fmt.Fprintf(stderr, "Received %s while waiting; deleted the claim.\n", caught)
		return codeErr(signalExitCode(caught))
	case err != nil:
		return reportOutcome(stderr, err)
	}
	fmt.Fprintf(stderr, "Held %s with fencing token %d (BuildLock %s/%s).\n", o.claim.Target, hold.Token, hold.Namespace, hold.Name)
	if len(o.command) > 0 {
		return o.runHolding(hold, signals)
	}
	_, err = fmt.Fprintln(o.f.streams.Out, hold.Token)
	if detachErr := hold.Detach(); detachErr != nil {
		fmt.Fprintf(stderr, "warning: %v; release --mine may not find the claim, release it by name\n", detachErr)
	}
	fmt.Fprintf(stderr, "The hold ends when released (kubectl buildlock release %s -n %s), or %s.\n", hold.Name, hold.Namespace, howItEnds(hold.BuildLock))
	return err
}

// howItEnds says when a hold ends unless released.
func howItEnds(bl *buildlockv1.BuildLock) string {
	if bl.Spec.PodRef != nil {
		return "when pod " + bl.Spec.PodRef.Name + " ends"
	}
	return "after " + lock.ExpiresAfter(bl).String() + " without renewal"
}

// reportOutcome says why the lock is not held and what to do, and returns
// the exit code as a codeErr; other errors it returns as they are.
func reportOutcome(stderr io.Writer, err error) error {
	var (
		ended    *lock.EndedError
		otherRun *lock.ClaimedByAnotherRunError
		timeout  *lock.TimeoutError
		hint     string
	)
	var superseded *lock.SupersededError
	switch {
	case errors.As(err, &superseded):
		hint = supersededHint(superseded)
	case errors.As(err, &ended) && ended.Reason != lock.ReasonDeleted:
		hint = fmt.Sprintf("To try again, delete it first: kubectl buildlock release %s -n %s", ended.Name, ended.Namespace)
	case errors.As(err, &otherRun):
		hint = otherRunHint(otherRun)
	case errors.As(err, &timeout) && timeout.CleanupErr == nil:
		hint = "Deleted the claim."
	case errors.Is(err, lock.ErrFrozen):
		hint = "Deleted the claim (--fail-if-frozen). A person can let a build through: kubectl buildlock override."

	case !errors.Is(err, lock.ErrEnded) && !errors.Is(err, lock.ErrTimeout) && !errors.Is(err, lock.ErrFrozen):
		return err
	}
	msg := err.Error()
	fmt.Fprintln(stderr, strings.TrimSpace(strings.ToUpper(msg[:1])+msg[1:]+"\n"+hint))
	return codeErr(exitCode(err))
}

// supersededHint says, truthfully for each reason, why this build stops
// without deploying and what to do; the operator's message above names the
// build that goes instead, or the one that already deployed.
func supersededHint(e *lock.SupersededError) string {
	const stopping = "Stopping without deploying (exit 3), so that the rest of this pipeline does not run for this build."
	switch {
	case e.Reason == buildlockv1.ReasonSupersededByNewerBuild && e.SupersededBy != "":
		return "A newer build (BuildLock " + e.SupersededBy + ") deploys instead of this one. " + stopping
	case e.Reason == buildlockv1.ReasonSupersededByNewerBuild:
		return "A higher build of this line already deployed. " + stopping +
			" To deploy this build again on purpose: kubectl buildlock acquire --rollback --reason \"...\"."
	case e.Reason == buildlockv1.ReasonDuplicateBuild && e.SupersededBy != "":
		return "Another run of this build (BuildLock " + e.SupersededBy + ") waits or holds: two runs of one build never deploy at once. " +
			stopping + " Re-run this job once that run has ended, if it must deploy again."
	case e.Reason == buildlockv1.ReasonDuplicateBuild:
		return "This build already deployed, and the target's policy refuses re-runs. " + stopping +
			" Deploy a new build, or roll back on purpose: --rollback --reason \"...\"."
	}
	return "This build may not deploy (the reason is above). " + stopping
}

// otherRunHint says what to do about a claim of another run, or of another
// job with the same run id, that stands in the way.
func otherRunHint(e *lock.ClaimedByAnotherRunError) string {
	hint := "This run claimed nothing."
	switch {
	case e.HandedOver:
		bl := e.BuildLock
		return hint + fmt.Sprintf(" The job holds it with fencing token %d: use that, or release it first: kubectl buildlock release %s -n %s.",
			bl.Status.FencingToken, bl.Name, bl.Namespace)
	case e.SameRunID():
		return hint + " Two jobs (or two processes) compute the same run id: give each job its own, with --run-id or the variable " +
			"BUILDLOCK_RUN_ID (or BUILDLOCK_JOB, appended to the CI system's run id: in a GitHub matrix, ${{ strategy.job-index }}; " +
			"the buildlock action sets it), and see docs/pipelines.md."
	}
	bl := e.BuildLock
	return hint + fmt.Sprintf(" Wait until the other run has finished, or end its claim: "+
		"kubectl buildlock release %s -n %s (force-release --target %s if it holds).", bl.Name, bl.Namespace, bl.Spec.Target)
}

// progress tells the user how the claim stands while it waits: each new
// phase and message, and place in the queue, once; and a hint when the
// operator does not answer.
type progress struct {
	out         io.Writer
	mu          sync.Mutex
	last, place string // what was printed last
	phase       buildlockv1.Phase
	hint        *time.Timer
}

func (p *progress) observe(ev lock.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	bl := ev.BuildLock
	switch ev.Type {
	case lock.EventReplaced:
		fmt.Fprintf(p.out, "Deleted BuildLock %s/%s, a finished claim (%s) of this build left by another run (%s), to claim its name.\n",
			bl.Namespace, bl.Name, bl.Status.Phase, lock.RunIDOf(bl))
		return
	case lock.EventNameTaken:
		fmt.Fprintf(p.out, "BuildLock %s/%s, the name this claim would have, is not this job's (%s%s); claiming under another name.\n",
			bl.Namespace, bl.Name, lock.Describe(bl), requestedBy(bl))
		return
	case lock.EventCreated, lock.EventAttached:
		verb, life := "Created", "no pod: renewed while this runs"
		if ev.Type == lock.EventAttached {
			verb = "Found this run's"
		}
		if bl.Spec.PodRef != nil {
			life = "pod " + bl.Spec.PodRef.Name
		}
		fmt.Fprintf(p.out, "%s BuildLock %s/%s for %s (%s; run %s).\n", verb, bl.Namespace, bl.Name, lock.Describe(bl), life, lock.RunIDOf(bl))
		p.hint = time.AfterFunc(30*time.Second, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.phase == "" || p.phase == buildlockv1.PhasePending {
				fmt.Fprintf(p.out, "Still Pending after 30s: is the buildlock operator running and watching namespace %s?\n", bl.Namespace)
			}
		})
	}
	p.phase = bl.Status.Phase
	if p.phase == "" || p.phase == buildlockv1.PhaseHeld || p.phase.IsTerminal() {
		return // not decided yet, or the outcome, reported once Acquire returns
	}
	p.say(&p.last, phaseLine(p.phase, bl.Status.Message))
	if ev.Place != nil {
		p.say(&p.place, fmt.Sprintf("Place in the queue for %s: %s.", bl.Spec.Target, ev.Place))
	}
}

// requestedBy is ", created by <user>" when bl says who created it.
func requestedBy(bl *buildlockv1.BuildLock) string {
	if r := bl.Spec.Requester; r != nil && r.Username != "" {
		return ", created by " + r.Username
	}
	return ""
}

// say prints line unless *last says it already.
func (p *progress) say(last *string, line string) {
	if line != *last {
		*last = line
		fmt.Fprintln(p.out, line)
	}
}

func (p *progress) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hint != nil {
		p.hint.Stop()
	}
}

// releaseAndSay releases the hold and says so. A failure is reported with
// how the lock ends anyway, but leaves the exit code alone: the command's
// result matters more.
func releaseAndSay(stderr io.Writer, hold *lock.Hold) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hold.Release(ctx); err != nil {
		fmt.Fprintf(stderr, "warning: releasing the lock failed: %v; it ends %s, or run: kubectl buildlock release %s -n %s\n",
			err, howItEnds(hold.BuildLock), hold.Name, hold.Namespace)
		return
	}
	fmt.Fprintf(stderr, "Released %s (BuildLock %s/%s).\n", hold.BuildLock.Spec.Target, hold.Namespace, hold.Name)
}

// runHolding runs the command while the lock is held: it passes signals on
// to it, stops it when the claim stops holding, releases the lock when it
// ends, and returns the exit code as a codeErr. The command dies with the
// plugin (see process_unix.go).
func (o *acquireOptions) runHolding(hold *lock.Hold, signals <-chan os.Signal) error {
	stderr, name := o.f.streams.ErrOut, o.command[0]
	env := append(slices.Clone(o.f.environ), "BUILDLOCK_FENCING_TOKEN="+strconv.FormatInt(hold.Token, 10),
		"BUILDLOCK_NAME="+hold.Name, "BUILDLOCK_NAMESPACE="+hold.Namespace, "BUILDLOCK_TARGET="+o.claim.Target)
	cmd, err := startCommand(name, o.command[1:], env, o.f.streams, o.gracePeriod)
	if err != nil {
		fmt.Fprintf(stderr, "error: starting %s: %v\n", name, err)
		releaseAndSay(stderr, hold)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return codeErr(127)
		}
		return codeErr(126)
	}
	exited := make(chan *os.ProcessState)
	go func() { exited <- cmd.wait() }()
	watchCtx, stopWatching := context.WithCancel(context.Background())
	defer stopWatching()
	lost := make(chan error, 1)
	go func() { lost <- hold.WaitLost(watchCtx) }()

	var (
		caught  os.Signal
		lostErr error
		kill    <-chan time.Time
		state   *os.ProcessState
	)
	for state == nil {
		select {
		case state = <-exited:
		case sig := <-signals:
			if caught != nil {
				sig = os.Kill
			}
			caught = cmp.Or(caught, sig)
			fmt.Fprintf(stderr, "Received a signal; sending %s to %s.\n", sig, name)
			cmd.signal(sig)
		case err := <-lost:
			lost = nil
			if !errors.Is(err, lock.ErrLost) {
				fmt.Fprintf(stderr, "warning: cannot watch the claim while %s runs: %v\n", name, err)
				continue
			}
			lostErr, kill = err, time.After(o.gracePeriod)
			fmt.Fprintf(stderr, "error: %v\nStopping %s: the lock may be someone else's now (SIGTERM; SIGKILL after %s).\n", err, name, o.gracePeriod)
			cmd.signal(syscall.SIGTERM)
		case <-kill:
			fmt.Fprintf(stderr, "%s still runs %s after SIGTERM; killing it.\n", name, o.gracePeriod)
			cmd.signal(os.Kill)
		}
	}
	stopWatching()
	code := exitStatus(state)
	releaseAndSay(stderr, hold)
	switch {
	case lostErr != nil:
		fmt.Fprintf(stderr, "%s was stopped (exit code %d): the claim stopped holding the lock (exit %d).\n", name, code, exitEnded)
		return codeErr(exitEnded)
	case caught != nil:
		return codeErr(signalExitCode(caught))
	}
	return codeErr(code)
}

// exitStatus is a finished process's exit code, or 128 plus the signal that
// ended it, as a shell reports it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
