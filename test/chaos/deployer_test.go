package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// The deployer: with the admission policies of config/enforcement installed
// and one or more chaos targets enforced (a BuildLockPolicy with
// spec.enforce, the target namespace labeled buildlock.io/locked-by), it
// writes into those target namespaces as the pipelines' pods would, through
// clients impersonating each pod's service-account token (user
// system:serviceaccount:<ns>:pipeline with the token's pod-name and pod-uid
// extras): as the claim that shows Held (it believes it holds), as claims
// that showed Held a moment ago (they have not noticed yet), and as claims
// that wait. At the end it judges every admitted write against the grant
// Lease's history: a write is admitted from the holder, or from a holder the
// grant moved away from less than the window ago (the API server reads the
// Lease through its own informer, so admission lags the grant).

var (
	flagEnforced = flag.Int("chaos.enforced", 1, "chaos targets whose lock the API server enforces, with a deployer writing into them as holders and non-holders (0: none)")
	flagWindow   = flag.Duration("chaos.enforce-window", 2*time.Second, "how long after the grant moved away from a pipeline a write of it may still be admitted (the admission informer's lag)")
)

// pipelineAccount is the service account the deployer's pipelines run as;
// the enforced policies name it.
const pipelineAccount = "pipeline"

// deployer writes into the enforced targets and records what admission did.
type deployer struct {
	c      client.Client // the administrator's
	writer client.Client // impersonates whoever the request's context names
	locks  []LockKey
	window time.Duration
	rng    *rand.Rand
	ledger *Ledger
	// paused stops the writes while a person has withdrawn a target's
	// consent (the target is not fenced then) until the fence is proven
	// again; writing is held during each write, so that pause can wait for
	// the one in flight.
	paused  atomic.Bool
	writing sync.Mutex

	mu     sync.Mutex
	grants map[LockKey][]grantVersion
	writes []deployWrite
	// recent are the claims last listed Held, with when they were.
	recent map[LockKey]map[string]heldPipeline
}

// grantVersion is a version of an enforced lock's Lease, as the checker's
// watch delivered it (at: the deployer's clock, which no warp moves).
type grantVersion struct {
	rv  uint64
	at  time.Time
	pod string // buildlock.io/writer-pod-uid: whose pod may write
	// user and run are a pod-less holder's (buildlock.io/writer-username,
	// buildlock.io/writer-run): every token of that user, of that run if
	// one is named, may write.
	user, run string
	relisted  bool // seen in a re-list: versions before it may be missing
	person    bool // written by a person, not the operator
}

type heldPipeline struct {
	pod, podName string
	at           time.Time
}

// deployWrite is one write into a target as a claim's pod.
type deployWrite struct {
	lock       LockKey
	claim, pod string
	kind       string // holder, old holder, waiter
	sent, done time.Time
	admitted   bool
	refused    bool   // by buildlock-enforce
	rv         uint64 // of the admitted write
	err        string
}

type impersonateKey struct{}

// impersonating makes requests carry the impersonation in their context: one
// client and one connection pool for every pipeline, where a rest.Config
// per pod would open a transport per pod. The headers are client-go's
// (transport.NewImpersonatingRoundTripper), as rest.ImpersonationConfig
// would set them.
type impersonating struct{ delegate http.RoundTripper }

func (t impersonating) RoundTrip(req *http.Request) (*http.Response, error) {
	if id, ok := req.Context().Value(impersonateKey{}).(transport.ImpersonationConfig); ok {
		return transport.NewImpersonatingRoundTripper(id, t.delegate).RoundTrip(req)
	}
	return t.delegate.RoundTrip(req)
}

// podIdentity is how the API server authenticates a token bound to pod
// (name, uid) of service account pipeline in namespace ns.
func podIdentity(ns, podName, podUID string) transport.ImpersonationConfig {
	return transport.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + pipelineAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		Extra: map[string][]string{
			"authentication.kubernetes.io/pod-name": {podName},
			"authentication.kubernetes.io/pod-uid":  {podUID},
		},
	}
}

// enforcedTargets picks the locks to enforce: targets with no policy of
// their own (the workload never switches their ordering), first ones first.
func (h *harness) enforcedTargets() []LockKey {
	var out []LockKey
	for i, k := range h.targets {
		if i%4 == 0 && len(out) < *flagEnforced {
			out = append(out, k)
		}
	}
	return out
}

// setupEnforcement installs the admission policies as the chart does, and
// for each enforced lock: the target namespace (named as the target) with
// its consent label, the pipelines' right to write there (RBAC comes before
// admission), the ConfigMap they deploy to, and the policy that enforces the
// lock. It returns nil when nothing is enforced.
func (h *harness) setupEnforcement(ctx context.Context) *deployer {
	locks := h.enforcedTargets()
	if len(locks) == 0 {
		return nil
	}
	if err := testenv.InstallEnforcement(ctx, h.cp.config(0)); err != nil {
		h.t.Fatalf("installing the enforcement policies: %v", err)
	}
	for _, k := range locks {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.Target, Labels: map[string]string{buildlockv1.LockedByLabel: k.Namespace}}}
		user := "system:serviceaccount:" + k.Namespace + ":" + pipelineAccount
		objs := []client.Object{ns,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: k.Target, Name: "deploy"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "patch", "update"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: k.Target, Name: "deploy"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "deploy"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Target, Name: "deployed"}},
			&buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Target},
				Spec: buildlockv1.BuildLockPolicySpec{Enforce: &buildlockv1.Enforcement{ServiceAccounts: []string{pipelineAccount}}}},
		}
		for _, o := range objs {
			if err := h.c.Create(ctx, o); err != nil {
				h.t.Fatalf("enforcing %s: creating %T: %v", k, o, err)
			}
		}
	}
	cfg := rest.CopyConfig(h.cp.balancedConfig())
	cfg.Timeout = 10 * time.Second
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return impersonating{rt} })
	writer, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, k := range locks {
		h.ledger.PersonSetsConsent(k.Target, k.Namespace)
	}
	return &deployer{c: h.c, writer: writer, locks: locks, window: *flagWindow, rng: rand.New(rand.NewPCG(h.o.seed, 0x6465706c6f79)), ledger: h.ledger,
		grants: map[LockKey][]grantVersion{}, recent: map[LockKey]map[string]heldPipeline{}}
}

// observeLease records a version of an enforced lock's Lease (the checker
// calls it for every Lease it judges).
func (d *deployer) observeLease(typ watch.EventType, l *coordinationv1.Lease) {
	k := LockKey{l.Namespace, strings.TrimPrefix(l.Name, LeasePrefix)}
	if typ == watch.Deleted || !slices.Contains(d.locks, k) {
		return
	}
	rv, _ := strconv.ParseUint(l.ResourceVersion, 10, 64)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.grants[k] = append(d.grants[k], grantVersion{rv: rv, at: time.Now(), pod: l.Annotations[WriterPodAnnotation],
		user: l.Annotations[WriterUserAnnotation], run: l.Annotations[WriterRunAnnotation], relisted: typ == Relisted,
		person: d.ledger != nil && d.ledger.PersonWroteLease(l)})
}

// pause stops the writes until resume, and returns once the write in
// flight (if any) has its reply: none is sent while the fence is off.
func (d *deployer) pause() {
	d.paused.Store(true)
	d.writing.Lock()
	defer d.writing.Unlock()
}

func (d *deployer) resume() { d.paused.Store(false) }

// waitEnforcing waits until every enforced policy says Enforcing and both
// API servers refuse a write from a pod that never claims anything: from
// then on, every admitted pipeline write is the holder's or within the
// window. It gives up after a minute, but only once every API server and
// etcd have answered for a while (an API server the run restarts takes a
// minute or more to be ready on a loaded machine, and fails discovery
// meanwhile): only then is a fence not proven a wrong setup.
func (d *deployer) waitEnforcing(ctx context.Context, h *harness) bool {
	start := time.Now()
	expired := func() bool { return time.Since(start) > 60*time.Second && h.check.ControlPlaneSteady(steadyFor) }
	for _, k := range d.locks {
		for {
			var p buildlockv1.BuildLockPolicy
			err := d.c.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Target}, &p)
			if c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionEnforced); err == nil && c != nil && c.Reason == buildlockv1.ReasonEnforcing {
				break
			}
			if ctx.Err() != nil {
				return false
			}
			if expired() {
				h.t.Errorf("deployer: the policy of %s never said Enforcing", k)
				return false
			}
			time.Sleep(200 * time.Millisecond)
		}
		for i := range h.cp.apiservers {
			cfg := rest.CopyConfig(h.cp.config(i))
			id := podIdentity(k.Namespace, "nobody", "00000000-0000-0000-0000-00000000dead")
			cfg.Impersonate = rest.ImpersonationConfig{UserName: id.UserName, Groups: id.Groups, Extra: id.Extra}
			c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
			if err != nil {
				h.t.Errorf("deployer: %v", err)
				return false
			}
			for {
				err := deployTo(ctx, c, k, "nobody")
				if isEnforcementRefusal(err) {
					break
				}
				if ctx.Err() != nil {
					return false
				}
				if expired() {
					h.t.Errorf("deployer: API server %d did not start refusing non-holders' writes into %s: %v", i, k.Target, err)
					return false
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	return true
}

// deployTo is a pipeline's deploy: a patch of the target's ConfigMap.
func deployTo(ctx context.Context, c client.Client, k LockKey, by string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Target, Name: "deployed"}}
	patch := fmt.Appendf(nil, `{"data":{"by":%q}}`, by)
	return c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
}

func isEnforcementRefusal(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "buildlock-enforce")
}

// run writes every 100 ms or so, in turn as a holder, an old holder and a
// waiter of a random enforced lock, until ctx ends. The claims are listed
// every quarter second: what a pipeline believes is what its claim's status
// last said.
func (d *deployer) run(ctx context.Context) {
	var claims map[LockKey][]buildlockv1.BuildLock
	listed := time.Time{}
	for turn := 0; ctx.Err() == nil; turn++ {
		time.Sleep(time.Duration(70+d.rng.IntN(60)) * time.Millisecond)
		if d.paused.Load() {
			continue
		}
		if time.Since(listed) > 250*time.Millisecond {
			claims = d.list(ctx)
			listed = time.Now()
		}
		k := d.locks[d.rng.IntN(len(d.locks))]
		var pick *heldPipeline
		var name, kind string
		switch turn % 3 {
		case 0:
			kind = "holder"
			for _, bl := range claims[k] {
				if bl.Status.Phase == buildlockv1.PhaseHeld {
					name, pick = bl.Name, &heldPipeline{pod: bl.Spec.PodRef.UID, podName: bl.Spec.PodRef.Name}
				}
			}
		case 1:
			kind = "old holder"
			d.mu.Lock()
			for n, p := range d.recent[k] {
				if time.Since(p.at) < 2*d.window && !slices.ContainsFunc(claims[k], func(bl buildlockv1.BuildLock) bool {
					return bl.Name == n && bl.Status.Phase == buildlockv1.PhaseHeld
				}) {
					name, pick = n, &p
					break
				}
			}
			d.mu.Unlock()
		case 2:
			kind = "waiter"
			var waiting []buildlockv1.BuildLock
			for _, bl := range claims[k] {
				if p := bl.Status.Phase; p == buildlockv1.PhaseWaiting || p == buildlockv1.PhasePending || p == "" {
					waiting = append(waiting, bl)
				}
			}
			if len(waiting) > 0 {
				bl := waiting[d.rng.IntN(len(waiting))]
				name, pick = bl.Name, &heldPipeline{pod: bl.Spec.PodRef.UID, podName: bl.Spec.PodRef.Name}
			}
		}
		if pick == nil {
			continue
		}
		d.writing.Lock()
		if d.paused.Load() {
			d.writing.Unlock()
			continue
		}
		w := deployWrite{lock: k, claim: name, pod: pick.pod, kind: kind, sent: time.Now()}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Target, Name: "deployed"}}
		wctx := context.WithValue(ctx, impersonateKey{}, podIdentity(k.Namespace, pick.podName, pick.pod))
		err := d.writer.Patch(wctx, cm, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"data":{"by":%q}}`, name)))
		w.done = time.Now()
		d.writing.Unlock()
		switch {
		case err == nil:
			w.admitted = true
			w.rv, _ = strconv.ParseUint(cm.ResourceVersion, 10, 64)
		case isEnforcementRefusal(err):
			w.refused = true
		case ctx.Err() != nil:
			return
		default:
			w.err = reasonOf(err)
		}
		d.mu.Lock()
		d.writes = append(d.writes, w)
		d.mu.Unlock()
	}
}

// list reads the enforced locks' claims that have a pod with a UID (an
// enforced target refuses the others at creation), and remembers which
// showed Held.
func (d *deployer) list(ctx context.Context) map[LockKey][]buildlockv1.BuildLock {
	out := map[LockKey][]buildlockv1.BuildLock{}
	for _, k := range d.locks {
		var list buildlockv1.BuildLockList
		if err := d.c.List(ctx, &list, client.InNamespace(k.Namespace)); err != nil {
			continue
		}
		for _, bl := range list.Items {
			if bl.Spec.Target != k.Target || bl.Spec.PodRef == nil || bl.Spec.PodRef.UID == "" {
				continue
			}
			out[k] = append(out[k], bl)
			if bl.Status.Phase == buildlockv1.PhaseHeld {
				d.mu.Lock()
				if d.recent[k] == nil {
					d.recent[k] = map[string]heldPipeline{}
				}
				d.recent[k][bl.Name] = heldPipeline{pod: bl.Spec.PodRef.UID, podName: bl.Spec.PodRef.Name, at: time.Now()}
				d.mu.Unlock()
			}
		}
	}
	return out
}

func reasonOf(err error) string {
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		return string(r)
	}
	return "error"
}

// activities returns the admitted writes, as what the pipelines deployed.
func (d *deployer) activities() []Activity {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Activity
	for _, w := range d.writes {
		if w.admitted {
			out = append(out, Activity{Kind: ActivityWrite, Lock: w.lock, Claim: w.claim, Job: "pod " + w.pod, Start: w.sent, End: w.done})
		}
	}
	return out
}

// judge checks every admitted write against its lock's grant history (in
// etcd's order: the write's resourceVersion against the Lease's), reports
// violations to the checker, and returns the figures. Run it once the
// checker's Lease watch has caught up (barrier).
//
// A write admitted while the last Lease version before it named its pod is
// the holder's. Otherwise the grant had moved away from that pod, at the
// version after the last one that named it: the write must have been sent
// less than the window after the checker saw that version, else admission
// let a non-holder write later than the window. A pod no version named
// before the write is a violation, unless the Lease watch was re-listed
// before it, or re-listed right after the last version seen before it
// (the naming version may be one it missed).
//
// The window measured, per move of the grant away from a pod that then
// tried to write: from when the checker saw the move to the reply of the
// old holder's last admitted write (0 if all its writes after the move were
// refused). It includes the checker's watch delay (making it shorter) and
// the write's round trip (making it longer).
func (d *deployer) judge(c *Checker) string {
	// The checker calls observeLease with its lock held: report to it only
	// after letting go of the deployer's.
	type violation struct {
		k   LockKey
		msg string
	}
	var violations []violation
	defer func() {
		for _, v := range violations {
			c.AddViolation(v.k, "enforced-holder-only", "%s", v.msg)
		}
	}()
	d.mu.Lock()
	defer d.mu.Unlock()
	counts := newCounters()
	for _, w := range d.writes {
		switch {
		case w.admitted:
			counts.add(w.kind+" admitted", 1)
		case w.refused:
			counts.add(w.kind+" refused", 1)
		default:
			counts.add(w.kind+" failed ("+w.err+")", 1)
		}
	}
	var samples []time.Duration
	late := 0
	for _, k := range d.locks {
		hist := d.grants[k]
		sort.Slice(hist, func(i, j int) bool { return hist[i].rv < hist[j].rv })
		var writes []deployWrite
		for _, w := range d.writes {
			if w.lock == k {
				writes = append(writes, w)
			}
		}
		for _, w := range writes {
			if !w.admitted {
				continue
			}
			i := sort.Search(len(hist), func(i int) bool { return hist[i].rv >= w.rv }) - 1
			if i >= 0 && hist[i].pod == w.pod {
				if hist[i].person {
					counts.add("admitted as a person's edit of the writer said", 1)
				}
				continue
			}
			if i >= 0 && hist[i].pod == "" && hist[i].run == "" && hist[i].user == podIdentity(k.Namespace, "", "").UserName {
				// A pod-less holder whose requester is the pipelines'
				// service account: the fence admits every token of that
				// account (docs/enforcement.md), the deployer's pods too.
				counts.add("admitted as the pod-less holder's service account", 1)
				continue
			}
			j := i
			for j >= 0 && hist[j].pod != w.pod {
				j--
			}
			if j < 0 {
				// The versions missed are those before a re-listed one:
				// any before the write, or the gap the write falls in.
				if i >= 0 && slices.ContainsFunc(hist[:i+1], func(g grantVersion) bool { return g.relisted }) || i+1 < len(hist) && hist[i+1].relisted {
					counts.add("admitted, holder unseen (Lease re-listed)", 1)
					continue
				}
				violations = append(violations, violation{k, fmt.Sprintf("the write of %s's pod %s (%s) at rv %d was admitted, but no version of the Lease before it named that pod", w.claim, w.pod, w.kind, w.rv)})
				continue
			}
			moved := hist[j+1]
			if after := w.sent.Sub(moved.at); after > d.window {
				late++
				violations = append(violations, violation{k, fmt.Sprintf("the write of %s's pod %s (%s) at rv %d was sent %s after the grant moved away from it (Lease rv %d) and was admitted; the window is %s",
					w.claim, w.pod, w.kind, w.rv, after.Round(time.Millisecond), moved.rv, d.window)})
			}
		}
		// The window, per move of the operator's grant away from a pod.
		var moves []grantVersion
		for _, g := range hist {
			if !g.person {
				moves = append(moves, g)
			}
		}
		for m := 1; m < len(moves); m++ {
			old := moves[m-1].pod
			if old == "" || moves[m].pod == old {
				continue
			}
			tried, window := false, time.Duration(0)
			for _, w := range writes {
				if w.pod != old || (w.rv <= moves[m].rv && w.sent.Before(moves[m].at)) {
					continue
				}
				if !w.admitted && !w.refused {
					continue
				}
				tried = true
				if w.admitted {
					window = max(window, w.done.Sub(moves[m].at))
				}
			}
			if tried {
				samples = append(samples, window)
			}
		}
	}
	slices.Sort(samples)
	q := func(p float64) time.Duration {
		if len(samples) == 0 {
			return 0
		}
		return samples[min(len(samples)-1, int(p*float64(len(samples))))].Round(time.Millisecond)
	}
	var grants int
	for _, k := range d.locks {
		grants += len(d.grants[k])
	}
	return fmt.Sprintf("enforced %s: %d writes: %s; %d Lease versions seen; window (grant moved → last admitted write of the old holder, over %d moves whose old holder wrote after): p50 %s, p99 %s, max %s; admitted later than %s after the move: %d",
		d.locks, len(d.writes), counts, grants, len(samples), q(0.5), q(0.99), q(1), d.window, late)
}

// TestDeployerJudge feeds the deployer's judgement synthetic histories: a
// write admitted from the holder, or from an old holder within the window,
// passes; later than the window, or from a pod the grant never named, it is
// a violation.
func TestDeployerJudge(t *testing.T) {
	k := LockKey{"chaos-0", "env-0"}
	t1 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t1.Add(time.Duration(ms) * time.Millisecond) }
	// The grant: pod a from rv 10, pod b from rv 20 (seen 1 s in), free
	// from rv 30 (seen 5 s in).
	grants := []grantVersion{{rv: 10, at: at(0), pod: "a"}, {rv: 20, at: at(1000), pod: "b"}, {rv: 30, at: at(5000)}}
	admitted := func(pod string, sentMs int, rv uint64) deployWrite {
		return deployWrite{lock: k, claim: "claim-" + pod, pod: pod, kind: "holder", sent: at(sentMs), done: at(sentMs + 20), admitted: true, rv: rv}
	}
	cases := map[string]struct {
		writes  []deployWrite
		grants  []grantVersion
		want    int
		figures string
	}{
		"the holder's writes":                         {writes: []deployWrite{admitted("a", 100, 11), admitted("b", 1500, 21)}, want: 0},
		"an old holder's write within the window":     {writes: []deployWrite{admitted("a", 2500, 22)}, want: 0, figures: "p50 1.52s"},
		"an old holder's write later than the window": {writes: []deployWrite{admitted("a", 3500, 23)}, want: 1},
		"a write from a pod the grant never named":    {writes: []deployWrite{admitted("c", 1500, 24)}, want: 1},
		"a pod the grant may have named while the Lease watch was down": {
			writes: []deployWrite{admitted("c", 1500, 24)},
			grants: []grantVersion{{rv: 10, at: at(0), pod: "a"}, {rv: 20, at: at(1000), pod: "b", relisted: true}}, want: 0,
		},
		"a pod the grant may have named in the gap a later re-list closed": {
			writes: []deployWrite{admitted("c", 1500, 24)},
			grants: []grantVersion{{rv: 10, at: at(0), pod: "a"}, {rv: 20, at: at(1000), pod: "b"}, {rv: 40, at: at(9000), pod: "d", relisted: true}}, want: 0,
		},
		// The short run of seed 1 (2026-12-03): a pod-less claim of the
		// pipelines' service account held the enforced lock, and the fence
		// let the pods of that account write, as docs/enforcement.md says.
		"a pod-less holder of the pipelines' service account: its account's pods write": {
			writes: []deployWrite{admitted("c", 1500, 24)},
			grants: []grantVersion{{rv: 10, at: at(0), pod: "a"}, {rv: 20, at: at(1000), user: podIdentity(k.Namespace, "", "").UserName}}, want: 0,
		},
		"a pod-less holder of another identity, or pinned to a run: no pod writes": {
			writes: []deployWrite{admitted("c", 1500, 24), admitted("c", 1600, 34)},
			grants: []grantVersion{{rv: 10, at: at(0), pod: "a"}, {rv: 20, at: at(1000), user: "alice@example.com"},
				{rv: 30, at: at(1550), user: podIdentity(k.Namespace, "", "").UserName, run: "run-7"}}, want: 2,
		},
		"a refused old holder": {
			writes: []deployWrite{{lock: k, pod: "a", kind: "old holder", sent: at(1200), done: at(1210), refused: true}}, want: 0, figures: "over 1 moves",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := NewChecker(NewLedger(time.Now), CheckerOptions{Now: time.Now})
			d := &deployer{locks: []LockKey{k}, window: 2 * time.Second, grants: map[LockKey][]grantVersion{k: grants}, writes: tc.writes}
			if tc.grants != nil {
				d.grants[k] = tc.grants
			}
			figures := d.judge(c)
			if got := len(c.Violations()); got != tc.want {
				t.Errorf("violations: got %v, want %d", c.Violations(), tc.want)
			}
			if !strings.Contains(figures, tc.figures) {
				t.Errorf("figures %q do not say %q", figures, tc.figures)
			}
		})
	}
}
