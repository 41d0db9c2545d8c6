package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// warpClock is the workload's clock: real time plus a warp that only moves
// forward. Every manager's clock is this one plus its own skew, so a warp
// makes time pass for everybody at once (pod-less holds expire without
// waiting) while the skews keep the managers disagreeing.
type warpClock struct{ warp atomic.Int64 }

func (c *warpClock) Now() time.Time          { return time.Now().Add(time.Duration(c.warp.Load())) }
func (c *warpClock) advance(d time.Duration) { c.warp.Add(int64(d)) }

// skewClock is a manager's clock (a clock.PassiveClock).
type skewClock struct {
	base *warpClock
	skew time.Duration
}

func (c skewClock) Now() time.Time                  { return c.base.Now().Add(c.skew) }
func (c skewClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// counters count things by kind; safe for concurrent use.
type counters struct {
	mu sync.Mutex
	m  map[string]int
}

func newCounters() *counters { return &counters{m: map[string]int{}} }

func (c *counters) add(kind string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[kind] += n
}

func (c *counters) get(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[kind]
}

func (c *counters) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.m {
		n += v
	}
	return n
}

// String lists the counts sorted by kind: "a=1, b=2".
func (c *counters) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.m))
	for k := range c.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c.m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// wLine is a repository and branch whose builds replace each other, and the
// next build number it will run.
type wLine struct {
	repo, branch string
	next         int64
}

type wPod struct {
	ns, name string
	uid      types.UID
	finished bool
	running  bool
}

type wClaim struct {
	ns, name string
	spec     buildlockv1.BuildLockSpec
	pod      *wPod // nil for a pod-less claim or one whose pod never existed
	// renews: a pod-less claim whose pipeline keeps renewing; the others are
	// abandoned and must expire. A claim renewed into year 9999 can never be
	// renewed again (renewTime only moves forward).
	renews bool
}

// workload plays many pipelines, and the people around them: it creates
// claims and pods, finishes and deletes pods, renews, re-applies and deletes
// claims, force-releases, re-runs builds, sends late older builds and writes
// times the way people and CI systems do (without fractions, with offsets,
// far in the future), choosing each step from its seeded source. It writes
// everything it does into the ledger before doing it. It reads the
// checker's view of phases only to aim some steps at holders (finish the
// holder's pod, renew a holder), so that hand-offs happen often; which claim
// holds depends on the operator, so a seed fixes the stream of choices, not
// the history.
type workload struct {
	c       client.Client
	rng     *rand.Rand
	clock   *warpClock
	ledger  *Ledger
	checker *Checker
	targets []LockKey
	lines   []*wLine
	// retention is the operator's grant retention: a late older build is
	// sent while its line's newer build is remembered.
	retention time.Duration
	// policies are the orderings of the targets whose policy the workload
	// switches mid-run, and when each last changed.
	policies     map[LockKey]buildlockv1.Ordering
	policyChange map[LockKey]time.Time
	switchEvery  time.Duration

	claims []*wClaim
	pods   []*wPod
	seq    int
	steps  int
	// firsts are the hostile operations done once early in every run, so
	// that even the short run has them all.
	firsts []func(context.Context)

	ops    *counters // operations done, by kind
	failed *counters // operations the API server refused, by kind and reason
}

// maxLive bounds the claims of one target that are not terminal: a Fifo
// queue otherwise grows with every arrival.
const maxLive = 8

func newWorkload(c client.Client, seed uint64, clock *warpClock, ledger *Ledger, checker *Checker, targets []LockKey) *workload {
	w := &workload{
		c: c, rng: rand.New(rand.NewPCG(seed, 0x776f726b6c6f6164)), clock: clock, ledger: ledger, checker: checker,
		targets: targets, ops: newCounters(), failed: newCounters(),
		retention: 30 * time.Second, policies: map[LockKey]buildlockv1.Ordering{}, policyChange: map[LockKey]time.Time{}, switchEvery: time.Minute,
	}
	for _, repo := range []string{"acme/shop", "acme/web", "acme/api", "beta/app"} {
		for _, branch := range []string{"main", "release-1"} {
			w.lines = append(w.lines, &wLine{repo: repo, branch: branch, next: 1 + int64(w.rng.IntN(100))})
		}
	}
	w.firsts = []func(context.Context){
		func(ctx context.Context) { w.arriveWith(ctx, timestampPlain) },
		func(ctx context.Context) { w.arriveWith(ctx, timestampFarFuture) },
		w.renewFar,
		w.forceRelease,
		w.rerun,
		w.lateLower,
		w.arriveThrowaway,
		func(ctx context.Context) { w.arriveWith(ctx, timestampOffset) },
		w.switchOrdering,
		w.forceRelease,
		w.lateLower,
	}
	return w
}

// run steps until ctx is done.
func (w *workload) run(ctx context.Context) {
	for ctx.Err() == nil {
		w.step(ctx)
		time.Sleep(time.Duration(w.rng.IntN(12)) * time.Millisecond)
	}
}

// step does one random operation. The weights keep a few claims per target
// at any time: arrivals are balanced by supersession, pod ends and deletes.
func (w *workload) step(ctx context.Context) {
	w.steps++
	if len(w.firsts) > 0 && w.steps >= 30 && w.steps%8 == 0 {
		first := w.firsts[0]
		w.firsts = w.firsts[1:]
		first(ctx)
		return
	}
	type op struct {
		weight int
		do     func(context.Context)
	}
	ops := []op{
		{28, w.arrive},
		{3, w.arriveGhost},
		{10, w.finishHolderPod},
		{4, w.finishRandomPod},
		{4, w.runPod},
		{4, w.deletePod},
		{6, w.deleteClaim},
		{14, w.renew},
		{6, w.reapply},
		{4, w.cleanup},
		{1, w.renewFar},
		{1, w.forceRelease},
		{2, w.rerun},
		{2, w.lateLower},
		{1, w.arriveThrowaway},
		{1, w.switchOrdering},
	}
	pick(w.rng, ops, func(o op) int { return o.weight }).do(ctx)
}

// pick draws one of items at random, each as likely as its weight (one
// draw from rng).
func pick[T any](rng *rand.Rand, items []T, weight func(T) int) T {
	total := 0
	for _, it := range items {
		total += weight(it)
	}
	n := rng.IntN(total)
	for _, it := range items {
		if n < weight(it) {
			return it
		}
		n -= weight(it)
	}
	return items[len(items)-1]
}

func (w *workload) note(kind string, err error) {
	if errors.Is(err, context.Canceled) {
		return // the workload was stopped mid-call
	}
	if err == nil {
		w.ops.add(kind, 1)
		return
	}
	w.failed.add(kind+"/"+failureReason(err), 1)
}

// failureReason names why a call failed: the API's reason, and which
// admission policy refused it (with enforcement installed, an API server
// just (re)started may refuse claims until it has compiled the requester
// policy).
func failureReason(err error) string {
	reason := string(apierrors.ReasonForError(err))
	if reason == "" || reason == string(metav1.StatusReasonUnknown) {
		reason = "error"
	}
	if _, rest, ok := strings.Cut(err.Error(), "ValidatingAdmissionPolicy '"); ok {
		name, _, _ := strings.Cut(rest, "'")
		reason += " by " + name
	}
	return reason
}

func micro(t time.Time) *buildlockv1.Timestamp {
	return buildlockv1.NewTimestamp(t.Truncate(time.Microsecond))
}

// newPod creates a pipeline pod (there is no kubelet: it stays Pending until
// the workload plays the kubelet).
func (w *workload) newPod(ctx context.Context, ns, name string) (*wPod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "pipeline"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}},
	}
	if err := w.c.Create(ctx, pod); err != nil {
		return nil, err
	}
	w.ledger.PodCreated(ns, name, pod.UID)
	p := &wPod{ns: ns, name: name, uid: pod.UID}
	w.pods = append(w.pods, p)
	return p, nil
}

// createClaim writes spec into the ledger, then creates the claim. A
// non-empty timestamp text is written as it is (the typed client can only
// write microseconds in UTC), as kubectl apply of a hand-written manifest
// would.
func (w *workload) createClaim(ctx context.Context, ns, name string, spec buildlockv1.BuildLockSpec, timestampText string) error {
	w.ledger.WroteSpec(ns, name, spec)
	if timestampText == "" {
		bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
		return w.c.Create(ctx, bl)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	fields["timestamp"] = timestampText
	u := &unstructured.Unstructured{Object: map[string]any{"spec": fields}}
	u.SetGroupVersionKind(buildlockv1.GroupVersion.WithKind("BuildLock"))
	u.SetNamespace(ns)
	u.SetName(name)
	return w.c.Create(ctx, u)
}

// How an arrival writes spec.timestamp.
const (
	timestampMicro     = iota // the typed client: UTC, six fractional digits
	timestampNone             // absent: the creation time stands in
	timestampPast             // up to 5 s in the past
	timestampPlain            // "2026-11-30T22:45:00Z": no fraction
	timestampOffset           // "+14:00" or "-05:30", some with milliseconds
	timestampFarFuture        // year 9999, or an hour ahead
)

// stampText returns the timestamp an arrival writes, and its text when it
// is written raw ("" when the typed client writes it).
func (w *workload) stampText(kind int) (*buildlockv1.Timestamp, string) {
	now := w.clock.Now()
	switch kind {
	case timestampNone:
		return nil, ""
	case timestampPast:
		return micro(now.Add(-time.Duration(w.rng.IntN(5000)) * time.Millisecond)), ""
	case timestampPlain:
		t := now.Truncate(time.Second)
		return buildlockv1.NewTimestamp(t), t.UTC().Format(time.RFC3339)
	case timestampOffset:
		zone := time.FixedZone("+14:00", 14*3600)
		layout := time.RFC3339
		if w.rng.IntN(2) == 0 {
			zone, layout = time.FixedZone("-05:30", -(5*3600+1800)), "2006-01-02T15:04:05.000Z07:00"
		}
		t := now.In(zone)
		text := t.Format(layout)
		parsed, _ := time.Parse(time.RFC3339, text)
		return buildlockv1.NewTimestamp(parsed), text
	case timestampFarFuture:
		if w.rng.IntN(2) == 0 {
			return micro(now.Add(time.Hour)), ""
		}
		t := time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
		return buildlockv1.NewTimestamp(t), t.Format(time.RFC3339)
	}
	return micro(now), ""
}

// drawStamp draws how an arrival writes its timestamp: mostly as the typed
// client does; 2 in 10 without one, 1 in 10 in the past; 1 in 10 written by
// hand (no fraction, or an offset); 1 in 20 far in the future.
func (w *workload) drawStamp() int {
	switch r := w.rng.IntN(20); {
	case r < 4:
		return timestampNone
	case r < 6:
		return timestampPast
	case r < 7:
		return timestampPlain
	case r < 8:
		return timestampOffset
	case r < 9:
		return timestampFarFuture
	}
	return timestampMicro
}

// pickTarget draws a target whose live claims are below maxLive.
func (w *workload) pickTarget() (LockKey, bool) {
	for range 3 {
		t := w.targets[w.rng.IntN(len(w.targets))]
		if w.checker.LiveClaims(t) < maxLive {
			return t, true
		}
	}
	return LockKey{}, false
}

// arrive: a pipeline of a random line asks for a random target. Builds mostly
// increase; one in ten arrives out of order (an older or a duplicate build).
// Seven in ten run in a pod; the rest are pod-less, expiring after 10–20 s,
// and half of those keep renewing.
func (w *workload) arrive(ctx context.Context) { w.arriveWith(ctx, w.drawStamp()) }

func (w *workload) arriveWith(ctx context.Context, stamp int) {
	target, ok := w.pickTarget()
	if !ok {
		w.finishHolderPod(ctx)
		return
	}
	l := w.lines[w.rng.IntN(len(w.lines))]
	build := l.next
	l.next++
	if w.rng.IntN(10) == 0 {
		build = max(1, build-int64(w.rng.IntN(4)))
	}
	w.seq++
	name := fmt.Sprintf("%s-%s-%d-%d", strings.ReplaceAll(l.repo, "/", "-"), l.branch, build, w.seq)
	spec := buildlockv1.BuildLockSpec{Target: target.Target, Repo: l.repo, Branch: l.branch, Build: build}
	w.newClaim(ctx, "arrive/"+stampName[stamp], target.Namespace, name, spec, stamp)
}

var stampName = map[int]string{
	timestampMicro: "micro", timestampNone: "none", timestampPast: "past", timestampPlain: "plain",
	timestampOffset: "offset", timestampFarFuture: "far-future",
}

// newClaim completes spec (its timestamp, and a pod or an expiry) and
// creates the claim.
func (w *workload) newClaim(ctx context.Context, kind, ns, name string, spec buildlockv1.BuildLockSpec, stamp int) {
	var text string
	spec.Timestamp, text = w.stampText(stamp)
	c := &wClaim{ns: ns, name: name}
	if w.rng.IntN(10) < 7 {
		pod, err := w.newPod(ctx, ns, "pod-"+name)
		if err != nil {
			w.note(kind, err)
			return
		}
		c.pod = pod
		spec.PodRef = &buildlockv1.PodReference{Name: pod.name}
		if w.rng.IntN(5) > 0 {
			spec.PodRef.UID = string(pod.uid)
		}
	} else {
		spec.ExpiresAfter = &metav1.Duration{Duration: time.Duration(10+w.rng.IntN(11)) * time.Second}
		c.renews = w.rng.IntN(2) == 0
	}
	c.spec = spec
	err := w.createClaim(ctx, c.ns, c.name, spec, text)
	w.note(kind, err)
	if err == nil {
		w.claims = append(w.claims, c)
	}
}

// arriveGhost: a claim whose podRef names a pod that never existed, or an
// existing pod with another UID (the pipeline's pod was replaced). The
// operator must release it as PodGone, never hold the lock for it.
func (w *workload) arriveGhost(ctx context.Context) {
	target := w.targets[w.rng.IntN(len(w.targets))]
	l := w.lines[w.rng.IntN(len(w.lines))]
	w.seq++
	name := fmt.Sprintf("ghost-%d", w.seq)
	spec := buildlockv1.BuildLockSpec{Target: target.Target, Repo: l.repo, Branch: l.branch, Build: l.next, Timestamp: micro(w.clock.Now())}
	l.next++
	spec.PodRef = &buildlockv1.PodReference{Name: "never-" + name}
	if p := w.randomPod(target.Namespace, false); p != nil && w.rng.IntN(2) == 0 {
		spec.PodRef = &buildlockv1.PodReference{Name: p.name, UID: "00000000-0000-0000-0000-000000000000"}
	}
	err := w.createClaim(ctx, target.Namespace, name, spec, "")
	w.note("arrive-ghost", err)
	if err == nil {
		w.claims = append(w.claims, &wClaim{ns: target.Namespace, name: name, spec: spec})
	}
}

// arriveThrowaway: a pod-less claim on a target of its own that nobody
// claims again: it expires, the finished TTL deletes it, and after the
// grant retention the operator deletes the target's Lease (keeping its
// token in the namespace's floor).
func (w *workload) arriveThrowaway(ctx context.Context) {
	ns := w.targets[w.rng.IntN(len(w.targets))].Namespace
	w.seq++
	l := w.lines[w.rng.IntN(len(w.lines))]
	name := fmt.Sprintf("throwaway-%d", w.seq)
	spec := buildlockv1.BuildLockSpec{Target: fmt.Sprintf("tmp-%d", w.seq), Repo: l.repo, Branch: l.branch, Build: l.next,
		Timestamp: micro(w.clock.Now()), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
	l.next++
	err := w.createClaim(ctx, ns, name, spec, "")
	w.note("arrive-throwaway", err)
	if err == nil {
		w.claims = append(w.claims, &wClaim{ns: ns, name: name, spec: spec})
	}
}

// rerun: a pipeline runs again with the build number of a claim that
// exists (a CI re-run keeps its run number): another claim, another name,
// the same repo, branch and build. At most one of them may ever deploy.
func (w *workload) rerun(ctx context.Context) {
	var candidates []*wClaim
	for _, c := range w.claims {
		if phase, _, ok := w.checker.Claim(c.ns, c.name); ok && !isTerminal(phase) && !strings.HasPrefix(c.spec.Target, "tmp-") {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		return
	}
	orig := candidates[w.rng.IntN(len(candidates))]
	w.seq++
	spec := buildlockv1.BuildLockSpec{Target: orig.spec.Target, Repo: orig.spec.Repo, Branch: orig.spec.Branch, Build: orig.spec.Build}
	w.newClaim(ctx, "rerun", orig.ns, fmt.Sprintf("%s-rerun-%d", orig.name, w.seq), spec, timestampMicro)
}

// lateLower: an older build of a line arrives after a newer build of that
// line held the lock and its claim is gone (or ended): it must never be
// granted while the lock remembers the newer one.
func (w *workload) lateLower(ctx context.Context) {
	type late struct {
		target LockKey
		held   HeldLine
	}
	var candidates []late
	now := w.clock.Now()
	for _, t := range w.targets {
		for _, h := range w.checker.LinesHeld(t) {
			if now.Sub(h.At) > w.retention/2 {
				continue
			}
			if phase, _, exists := w.checker.Claim(t.Namespace, h.Name); exists && !isTerminal(phase) {
				continue
			}
			candidates = append(candidates, late{t, h})
		}
	}
	if len(candidates) == 0 {
		w.arrive(ctx)
		return
	}
	pick := candidates[w.rng.IntN(len(candidates))]
	build := max(1, pick.held.Build-int64(w.rng.IntN(3)))
	w.seq++
	name := fmt.Sprintf("%s-%s-%d-late-%d", strings.ReplaceAll(pick.held.Repo, "/", "-"), pick.held.Branch, build, w.seq)
	spec := buildlockv1.BuildLockSpec{Target: pick.target.Target, Repo: pick.held.Repo, Branch: pick.held.Branch, Workflow: pick.held.Workflow, Build: build}
	w.newClaim(ctx, "late-lower", pick.target.Namespace, name, spec, timestampMicro)
}

// switchOrdering changes the ordering of a target whose policy the workload
// owns, Queue → Fifo → NewestWins → Queue, at most once per switchEvery
// (real time) per target.
func (w *workload) switchOrdering(ctx context.Context) {
	var due []LockKey
	for k := range w.policies {
		if time.Since(w.policyChange[k]) >= w.switchEvery {
			due = append(due, k)
		}
	}
	if len(due) == 0 {
		return
	}
	sort.Slice(due, func(i, j int) bool { return due[i].String() < due[j].String() })
	k := due[w.rng.IntN(len(due))]
	next := map[buildlockv1.Ordering]buildlockv1.Ordering{
		buildlockv1.OrderingQueue: buildlockv1.OrderingFifo, buildlockv1.OrderingFifo: buildlockv1.OrderingNewestWins,
		buildlockv1.OrderingNewestWins: buildlockv1.OrderingQueue,
	}[w.policies[k]]
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"ordering": next}})
	err := w.c.Patch(ctx, &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Target}}, client.RawPatch(types.MergePatchType, patch))
	w.note("switch-ordering", err)
	if err == nil {
		w.policies[k] = next
		w.policyChange[k] = time.Now()
	}
}

func (w *workload) randomPod(ns string, unfinished bool) *wPod {
	var candidates []*wPod
	for _, p := range w.pods {
		if (ns == "" || p.ns == ns) && (!unfinished || !p.finished) {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	return candidates[w.rng.IntN(len(candidates))]
}

// holders are the workload's claims the checker last saw Held.
func (w *workload) holders(podless bool) []*wClaim {
	var out []*wClaim
	for _, c := range w.claims {
		if phase, _, ok := w.checker.Claim(c.ns, c.name); ok && phase == buildlockv1.PhaseHeld && (c.spec.PodRef == nil) == podless {
			out = append(out, c)
		}
	}
	return out
}

// setPodPhase plays the kubelet through the status subresource.
func (w *workload) setPodPhase(ctx context.Context, p *wPod, phase corev1.PodPhase) error {
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": phase}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}}
	return w.c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch))
}

func (w *workload) finishPod(ctx context.Context, p *wPod) {
	phase := corev1.PodSucceeded
	if w.rng.IntN(10) < 3 {
		phase = corev1.PodFailed
	}
	w.ledger.PodFinishing(p.ns, p.name, true)
	err := w.setPodPhase(ctx, p, phase)
	if err != nil && !isUncertain(err) {
		w.ledger.PodFinishing(p.ns, p.name, false)
	} else {
		p.finished = true
	}
	w.note("finish-pod/"+string(phase), err)
}

// isUncertain reports whether a failed call may have taken effect anyway
// (the connection broke, or the API server timed out waiting for etcd):
// the ledger must then keep the intent.
func isUncertain(err error) bool {
	return !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && !apierrors.IsInvalid(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err)
}

// finishHolderPod ends a holding build: the usual way a lock changes hands.
func (w *workload) finishHolderPod(ctx context.Context) {
	var candidates []*wClaim
	for _, c := range w.holders(false) {
		if c.pod != nil && !c.pod.finished {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		w.finishRandomPod(ctx)
		return
	}
	w.finishPod(ctx, candidates[w.rng.IntN(len(candidates))].pod)
}

func (w *workload) finishRandomPod(ctx context.Context) {
	if p := w.randomPod("", true); p != nil {
		w.finishPod(ctx, p)
	}
}

// runPod moves a Pending pod to Running (it was alive already: noise the
// operator must not act on).
func (w *workload) runPod(ctx context.Context) {
	p := w.randomPod("", true)
	if p == nil || p.running {
		return
	}
	err := w.setPodPhase(ctx, p, corev1.PodRunning)
	p.running = err == nil
	w.note("run-pod", err)
}

func (w *workload) removePod(ctx context.Context, p *wPod, kind string) {
	w.ledger.PodDeleting(p.ns, p.name)
	err := w.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}}, client.GracePeriodSeconds(0))
	if apierrors.IsNotFound(err) {
		err = nil
	}
	w.note(kind, err)
	for i, q := range w.pods {
		if q == p {
			w.pods = append(w.pods[:i], w.pods[i+1:]...)
			break
		}
	}
	p.finished = true
}

// deletePod deletes a pod, finished or not (a pipeline canceled, a node
// lost).
func (w *workload) deletePod(ctx context.Context) {
	if p := w.randomPod("", false); p != nil {
		w.removePod(ctx, p, "delete-pod")
	}
}

// deleteClaim: the owner deletes its claim, half the time a holder's.
func (w *workload) deleteClaim(ctx context.Context) {
	candidates := w.claims
	if h := append(w.holders(false), w.holders(true)...); len(h) > 0 && w.rng.IntN(2) == 0 {
		candidates = h
	}
	if len(candidates) == 0 {
		return
	}
	c := candidates[w.rng.IntN(len(candidates))]
	w.ledger.RequestDelete(c.ns, c.name)
	err := w.c.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}})
	w.note("delete-claim", err)
	w.forget(c)
	// Half the time the pipeline's pod goes too (a canceled pipeline).
	if c.pod != nil && w.hasPod(c.pod) && w.rng.IntN(2) == 0 {
		w.removePod(ctx, c.pod, "delete-pod")
	}
}

func (w *workload) forget(c *wClaim) {
	for i, d := range w.claims {
		if d == c {
			w.claims = append(w.claims[:i], w.claims[i+1:]...)
			return
		}
	}
}

// renew bumps spec.renewTime of a pod-less claim whose pipeline renews,
// mostly a holder's. Most renewals are written as the typed client writes
// them; 1 in 5 by hand, with no fraction (rounded up to the next second) or
// with an offset.
func (w *workload) renew(ctx context.Context) {
	var candidates []*wClaim
	for _, c := range w.holders(true) {
		if c.renews {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 || w.rng.IntN(4) == 0 {
		candidates = candidates[:0]
		for _, c := range w.claims {
			if c.renews {
				candidates = append(candidates, c)
			}
		}
	}
	if len(candidates) == 0 {
		return
	}
	c := candidates[w.rng.IntN(len(candidates))]
	now := w.clock.Now()
	at, text, kind := now.Truncate(time.Microsecond), "", "renew"
	switch w.rng.IntN(10) {
	case 0:
		at = now.Truncate(time.Second).Add(time.Second)
		text, kind = at.UTC().Format(time.RFC3339), "renew/plain"
	case 1:
		text, kind = at.In(time.FixedZone("+14:00", 14*3600)).Format("2006-01-02T15:04:05.999999Z07:00"), "renew/offset"
	}
	if c.spec.RenewTime != nil && at.Before(c.spec.RenewTime.Time) {
		return // renewTime only moves forward
	}
	w.patchRenewTime(ctx, c, kind, at, text)
}

// renewFar: a pipeline (the holder's, or any other of the namespace on
// another's claim) renews a pod-less claim into year 9999. The renewal
// counts from when the operator sees it, so the hold still ends
// expiresAfter later; and the claim can never be renewed again.
func (w *workload) renewFar(ctx context.Context) {
	candidates := w.holders(true)
	if len(candidates) == 0 {
		for _, c := range w.claims {
			if c.spec.PodRef == nil && !strings.HasPrefix(c.spec.Target, "tmp-") {
				candidates = append(candidates, c)
			}
		}
	}
	if len(candidates) == 0 {
		return
	}
	c := candidates[w.rng.IntN(len(candidates))]
	at := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if w.patchRenewTime(ctx, c, "renew/year-9999", at, at.Format(time.RFC3339)) {
		c.renews = false
	}
}

// patchRenewTime sets c's renewTime to at, written as text when not empty,
// and reports whether the API server took it.
func (w *workload) patchRenewTime(ctx context.Context, c *wClaim, kind string, at time.Time, text string) bool {
	spec := *c.spec.DeepCopy()
	spec.RenewTime = buildlockv1.NewTimestamp(at)
	w.ledger.WroteSpec(c.ns, c.name, spec)
	var value any = spec.RenewTime
	if text != "" {
		value = text
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": value}})
	err := w.c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}}, client.RawPatch(types.MergePatchType, patch))
	w.note(kind, err)
	if err == nil {
		c.spec = spec
	}
	return err == nil
}

// forceRelease: a person force-releases a claim (the holder half the time)
// with a reason of up to 40,000 characters, with control characters, escape
// sequences and a bidirectional override in it, as `kubectl annotate` lets
// anyone write. The lock must go on: the claim ends, the next one holds.
func (w *workload) forceRelease(ctx context.Context) {
	candidates := append(w.holders(false), w.holders(true)...)
	if len(candidates) == 0 || w.rng.IntN(2) == 0 {
		candidates = candidates[:0]
		for _, c := range w.claims {
			if phase, _, ok := w.checker.Claim(c.ns, c.name); ok && !isTerminal(phase) {
				candidates = append(candidates, c)
			}
		}
	}
	if len(candidates) == 0 {
		return
	}
	c := candidates[w.rng.IntN(len(candidates))]
	size := []int{24, 300, 1000 + w.rng.IntN(39000)}[w.rng.IntN(3)]
	reason := "chaos-admin: " + hostileText(w.rng, size)
	w.ledger.RequestForceRelease(c.ns, c.name)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{buildlockv1.ForceReleaseAnnotation: reason}}})
	err := w.c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}}, client.RawPatch(types.MergePatchType, patch))
	kind := "force-release/short"
	if size >= 1000 {
		kind = "force-release/long"
	}
	w.note(kind, err)
}

// hostileText returns n characters of words mixed with what a terminal
// interprets: newlines, tabs, an ANSI escape sequence, DEL, a C1 control
// and a right-to-left override.
func hostileText(rng *rand.Rand, n int) string {
	pieces := []string{"deploy ", "rollback ", "incident-42 ", "\n", "\t", "\x1b[31mRED\x1b[0m ", "\x7f", "\u0085", "\u202e", "é ", "\r"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(pieces[rng.IntN(len(pieces))])
	}
	runes := []rune(b.String())
	if len(runes) > n {
		runes = runes[:n]
	}
	return string(runes)
}

// reapply sends a claim's manifest again, as a pipeline retrying its step
// would: a create (AlreadyExists) or a merge patch with the same spec (no
// change). Only claims the checker saw alive and not finished are re-applied,
// so that a re-create after the finished TTL stays rare.
func (w *workload) reapply(ctx context.Context) {
	if len(w.claims) == 0 {
		return
	}
	c := w.claims[w.rng.IntN(len(w.claims))]
	if phase, _, ok := w.checker.Claim(c.ns, c.name); !ok || isTerminal(phase) {
		return
	}
	if w.rng.IntN(2) == 0 {
		err := w.createClaim(ctx, c.ns, c.name, c.spec, "")
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		w.note("reapply-create", err)
		return
	}
	patch, _ := json.Marshal(map[string]any{"spec": c.spec})
	err := w.c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}}, client.RawPatch(types.MergePatchType, patch))
	w.note("reapply-patch", err)
}

// cleanup forgets claims the operator deleted after the finished TTL and
// deletes the pods of finished claims, so that the run's size stays bounded.
func (w *workload) cleanup(ctx context.Context) {
	keep := w.claims[:0]
	var podsOfEnded []*wPod
	for _, c := range w.claims {
		phase, _, ok := w.checker.Claim(c.ns, c.name)
		switch {
		case !ok && phase != "":
			if c.pod != nil {
				podsOfEnded = append(podsOfEnded, c.pod)
			}
		case isTerminal(phase):
			if c.pod != nil && w.rng.IntN(3) == 0 {
				podsOfEnded = append(podsOfEnded, c.pod)
			}
			keep = append(keep, c)
		default:
			keep = append(keep, c)
		}
	}
	w.claims = keep
	// A pod whose claim the workload no longer knows (its owner deleted the
	// claim and left the pod, or the claim's create failed) finishes some
	// day too: the number of pods stays bounded however long the run.
	referenced := map[*wPod]bool{}
	for _, c := range w.claims {
		referenced[c.pod] = true
	}
	for _, p := range w.pods {
		if !referenced[p] && w.rng.IntN(4) == 0 {
			podsOfEnded = append(podsOfEnded, p)
		}
	}
	for _, p := range podsOfEnded {
		if w.hasPod(p) {
			w.removePod(ctx, p, "cleanup-pod")
		}
	}
	w.ops.add("cleanup", 1)
}

func (w *workload) hasPod(p *wPod) bool {
	for _, q := range w.pods {
		if q == p {
			return true
		}
	}
	return false
}

// endHolders ends every build the checker last saw holding one of targets:
// its pod Succeeds, or the owner deletes a pod-less claim. It returns how
// many.
func (w *workload) endHolders(ctx context.Context, targets map[LockKey]bool) int {
	n := 0
	for _, c := range append(w.holders(false), w.holders(true)...) {
		switch {
		case !targets[LockKey{c.ns, c.spec.Target}]:
			continue
		case c.pod != nil && !c.pod.finished && w.hasPod(c.pod):
			w.finishPod(ctx, c.pod)
		case c.spec.PodRef == nil:
			w.ledger.RequestDelete(c.ns, c.name)
			w.note("delete-claim", w.c.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}}))
			w.forget(c)
		default:
			continue
		}
		n++
	}
	return n
}
