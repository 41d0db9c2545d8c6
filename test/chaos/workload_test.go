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

// line is a repository and branch whose builds replace each other.
type line struct {
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
	// abandoned and must expire.
	renews bool
}

// workload plays many pipelines: it creates claims and pods, finishes and
// deletes pods, renews, re-applies and deletes claims, choosing each step from
// its seeded source. It writes everything it does into the ledger before
// doing it. It reads the checker's view of phases only to aim some steps at
// holders (finish the holder's pod, renew a holder), so that hand-offs
// happen often; which claim holds depends on the operator, so a seed fixes
// the stream of choices, not the history.
type workload struct {
	c       client.Client
	rng     *rand.Rand
	clock   *warpClock
	ledger  *Ledger
	checker *Checker
	targets []LockKey
	lines   []*line

	claims []*wClaim
	pods   []*wPod
	seq    int

	ops    *counters // operations done, by kind
	failed *counters // operations the API server refused, by kind and reason
}

func newWorkload(c client.Client, seed uint64, clock *warpClock, ledger *Ledger, checker *Checker, targets []LockKey) *workload {
	w := &workload{
		c: c, rng: rand.New(rand.NewPCG(seed, 0x776f726b6c6f6164)), clock: clock, ledger: ledger, checker: checker,
		targets: targets, ops: newCounters(), failed: newCounters(),
	}
	for _, repo := range []string{"acme/shop", "acme/web", "acme/api", "beta/app"} {
		for _, branch := range []string{"main", "release-1"} {
			w.lines = append(w.lines, &line{repo: repo, branch: branch, next: 1 + int64(w.rng.IntN(100))})
		}
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
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	n := w.rng.IntN(total)
	for _, o := range ops {
		if n < o.weight {
			o.do(ctx)
			return
		}
		n -= o.weight
	}
}

func (w *workload) note(kind string, err error) {
	if errors.Is(err, context.Canceled) {
		return // the workload was stopped mid-call
	}
	if err == nil {
		w.ops.add(kind, 1)
		return
	}
	reason := string(apierrors.ReasonForError(err))
	if reason == "" {
		reason = "error"
	}
	w.failed.add(kind+"/"+reason, 1)
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

// createClaim writes spec into the ledger, then creates the claim.
func (w *workload) createClaim(ctx context.Context, ns, name string, spec buildlockv1.BuildLockSpec) error {
	w.ledger.WroteSpec(ns, name, spec)
	bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	return w.c.Create(ctx, bl)
}

// arrive: a pipeline of a random line asks for a random target. Builds mostly
// increase; one in ten arrives out of order (an older or a duplicate build);
// some have no timestamp (creation time stands in) and some are stamped a
// little in the past. Seven in ten run in a pod; the rest are pod-less,
// expiring after 10–20 s, and half of those keep renewing.
func (w *workload) arrive(ctx context.Context) {
	target := w.targets[w.rng.IntN(len(w.targets))]
	l := w.lines[w.rng.IntN(len(w.lines))]
	build := l.next
	l.next++
	if w.rng.IntN(10) == 0 {
		build = max(1, build-int64(w.rng.IntN(4)))
	}
	w.seq++
	name := fmt.Sprintf("%s-%s-%d-%d", strings.ReplaceAll(l.repo, "/", "-"), l.branch, build, w.seq)
	spec := buildlockv1.BuildLockSpec{Target: target.Target, Repo: l.repo, Branch: l.branch, Build: build}
	switch r := w.rng.IntN(10); {
	case r < 2: // no timestamp
	case r < 3:
		spec.Timestamp = micro(w.clock.Now().Add(-time.Duration(w.rng.IntN(5000)) * time.Millisecond))
	default:
		spec.Timestamp = micro(w.clock.Now())
	}
	c := &wClaim{ns: target.Namespace, name: name}
	if w.rng.IntN(10) < 7 {
		pod, err := w.newPod(ctx, target.Namespace, "pod-"+name)
		if err != nil {
			w.note("arrive", err)
			return
		}
		c.pod = pod
		spec.PodRef = &buildlockv1.PodReference{Name: pod.name}
		if w.rng.IntN(5) > 0 {
			spec.PodRef.UID = string(pod.uid)
		}
		if w.rng.IntN(2) == 0 {
			spec.ExpiresAfter = &metav1.Duration{Duration: time.Hour}
		}
	} else {
		spec.ExpiresAfter = &metav1.Duration{Duration: time.Duration(10+w.rng.IntN(11)) * time.Second}
		c.renews = w.rng.IntN(2) == 0
	}
	c.spec = spec
	err := w.createClaim(ctx, c.ns, c.name, spec)
	w.note("arrive", err)
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
	err := w.createClaim(ctx, target.Namespace, name, spec)
	w.note("arrive-ghost", err)
	if err == nil {
		w.claims = append(w.claims, &wClaim{ns: target.Namespace, name: name, spec: spec})
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
	if err != nil {
		w.ledger.PodFinishing(p.ns, p.name, false)
	} else {
		p.finished = true
	}
	w.note("finish-pod/"+string(phase), err)
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
// mostly a holder's.
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
	spec := *c.spec.DeepCopy()
	spec.RenewTime = buildlockv1.NewTimestamp(w.clock.Now().Truncate(time.Microsecond))
	if c.spec.RenewTime != nil && spec.RenewTime.Before(c.spec.RenewTime.Time) {
		return
	}
	w.ledger.WroteSpec(c.ns, c.name, spec)
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": spec.RenewTime}})
	err := w.c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name}}, client.RawPatch(types.MergePatchType, patch))
	w.note("renew", err)
	if err == nil {
		c.spec = spec
	}
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
		err := w.createClaim(ctx, c.ns, c.name, c.spec)
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
