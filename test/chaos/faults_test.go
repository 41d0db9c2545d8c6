package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// The kinds of injected fault.
const (
	faultConflict  = "409 Conflict (write not sent)"
	fault500       = "500 InternalError (write not sent)"
	fault429       = "429 TooManyRequests (write not sent)"
	faultCommitted = "write committed, 500 reported"
	faultRead500   = "live read 500"
	faultRead429   = "live read 429"
)

// faultPlan decides whether a manager's call fails. Its source is seeded; the
// order of the calls is the scheduler's, so the seed fixes the odds and the
// sequence of draws, not which call gets which draw.
type faultPlan struct {
	mu  sync.Mutex
	rng *rand.Rand
	// on is cleared when the faults stop, before the liveness check.
	on atomic.Bool
	// writeRate is the probability of each of the four write faults;
	// readRate of each of the two live-read faults.
	writeRate, readRate float64
	// podReads also faults live reads of pods (-chaos.pod-read-faults,
	// on by default).
	podReads bool
	injected *counters
}

func (p *faultPlan) draw() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

func (p *faultPlan) writeFault() string {
	if !p.on.Load() {
		return ""
	}
	switch x := p.draw(); {
	case x < p.writeRate:
		return faultConflict
	case x < 2*p.writeRate:
		return fault500
	case x < 3*p.writeRate:
		return fault429
	case x < 4*p.writeRate:
		return faultCommitted
	}
	return ""
}

func (p *faultPlan) readFault() string {
	if !p.on.Load() {
		return ""
	}
	switch x := p.draw(); {
	case x < p.readRate:
		return faultRead500
	case x < 2*p.readRate:
		return faultRead429
	}
	return ""
}

// Where a zombie freezes: in Decide (its reconcilers stop after reading
// the lock, before deciding) or at its writes (they stop after deciding,
// before writing).
const (
	freezeAtDecide = "decide"
	freezeAtWrite  = "write"
)

// freezer is a zombie manager's switch: while frozen, its reconcilers stop
// at the freeze point, holding on to what they read and decided; thawed,
// they carry on with it.
type freezer struct {
	point   string
	mu      sync.Mutex
	thaw    chan struct{} // non-nil while frozen
	woken   bool          // thawed after a freeze
	stopped chan struct{} // closed when the manager is being killed
}

func newFreezer(point string) *freezer { return &freezer{point: point, stopped: make(chan struct{})} }

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw == nil {
		f.thaw = make(chan struct{})
	}
}

func (f *freezer) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
		f.woken = true
	}
}

// wait blocks while frozen at point and reports whether it did.
func (f *freezer) wait(point string) bool {
	if f == nil || f.point != point {
		return false
	}
	f.mu.Lock()
	thaw := f.thaw
	f.mu.Unlock()
	if thaw == nil {
		return false
	}
	select {
	case <-thaw:
	case <-f.stopped:
	}
	return true
}

// awake reports whether the zombie was frozen and thawed.
func (f *freezer) awake() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.woken
}

// managerCtl is one running manager of the chaos run.
type managerCtl struct {
	id      int
	skew    time.Duration
	server  int      // the API server it talks to
	zombie  *freezer // nil for a healthy manager
	started time.Time
	stop    func() error
	// writes counts the writes that reached the API server, by kind, and
	// restartWrites those in the restart check's namespaces.
	writes, restartWrites *counters
	// proxy stands between the manager and its API server; partitioned is
	// set while a partition episode makes it slow or blackholes it, and
	// episode marks the manager that episode started.
	proxy       *partitionProxy
	partitioned atomic.Bool
	episode     bool
	// synced is set once its cache synced: later lists are re-lists.
	synced atomic.Bool
	// elected is closed when it leads (at once without leader election).
	elected <-chan struct{}
}

// name is how the run and the checker call m.
func (m *managerCtl) name() string { return fmt.Sprintf("manager %d", m.id) }

// wrote counts a write of m that reached the API server.
func (m *managerCtl) wrote(kind string, obj client.Object) {
	m.writes.add(kind, 1)
	if strings.HasPrefix(obj.GetNamespace(), "restart-") {
		m.restartWrites.add(kind, 1)
	}
}

// faultSet gathers what every manager's faults add up to.
type faultSet struct {
	plan *faultPlan
	// refused counts writes the API server refused as stale (409 Conflict, or
	// a failed delete precondition), by resource.
	refused *counters
	// zombie counts the zombie's writes held back while frozen and what the
	// API server made of them after the thaw, and its frozen decisions.
	zombie *counters
	// partition counts the partitions and what came of the writes a
	// partition held back.
	partition *counters
	// lists counts the managers' informer lists after their caches synced:
	// re-lists, after a watch failed with 410 Gone or a reconnection.
	lists *counters
	// broken names how the operator is broken on purpose (-chaos.break), to
	// show that the checker notices; "" for none. See breakNames.
	broken string
	// ledger tells the repair break which Leases people touched.
	ledger *Ledger
}

// The ways -chaos.break breaks the operator, through the test's hooks only
// (nothing in internal/ changes):
//   - cas: grant Lease updates become blind merge patches, without a
//     resourceVersion: the last writer wins whatever it read;
//   - decide: the waiting claim is shown Held next to the holder;
//   - renew-clock: a renewal counts from the client's renewTime (its
//     clock), not from when the operator saw it;
//   - rollback: the grant record forgets the builds of each line that held;
//   - queue: locks whose policy says Queue are decided as NewestWins;
//   - token-restart: a lock whose grant Lease is gone restarts its tokens
//     (the arbiter gets neither the floor, the namespace's reservation, nor
//     the claims' tokens);
//   - repair: the operator never writes again a Lease that a person
//     deleted or edited (its writes of it fail);
//   - window: the arbiter is never told of a freeze (it ignores the
//     policies' deploy windows);
//   - workflow: lines are keyed without spec.workflow (a second workflow's
//     builds replace the first's).
var breakNames = []string{"cas", "decide", "renew-clock", "rollback", "queue", "token-restart", "repair", "window", "workflow"}

func validBreak(name string) bool {
	return name == "" || slices.Contains(breakNames, name)
}

func resourceOf(obj client.Object) string {
	if _, isLease := obj.(*coordinationv1.Lease); isLease && obj.GetName() == TokenFloorLease {
		return "token-floor lease"
	}
	t := reflect.TypeOf(obj)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return strings.ToLower(t.Name())
}

// write runs one write of manager m through the faults: the zombie's freeze,
// an injected fault, or the real call; it counts the outcome, and what came
// of a write that a partition held back.
func (fs *faultSet) write(m *managerCtl, verb string, obj client.Object, do func() error) error {
	if !m.partitioned.Load() {
		return fs.write1(m, verb, obj, do)
	}
	err := fs.write1(m, verb, obj, do)
	switch {
	case err == nil:
		fs.partition.add("writes sent during a partition: accepted", 1)
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		fs.partition.add("writes sent during a partition: refused (409/404)", 1)
	default:
		fs.partition.add("writes sent during a partition: failed otherwise", 1)
	}
	return err
}

func (fs *faultSet) write1(m *managerCtl, verb string, obj client.Object, do func() error) error {
	kind := verb + " " + resourceOf(obj)
	if _, isLease := obj.(*coordinationv1.Lease); isLease && fs.broken == "repair" && verb != "delete" && fs.ledger.PersonTouchedLease(obj.GetNamespace(), obj.GetName()) {
		// BROKEN ON PURPOSE: what a person deleted or edited stays so.
		return apierrors.NewInternalError(errors.New("broken by the chaos test: no repair"))
	}
	if held := m.zombie.wait(freezeAtWrite); held || m.zombie.awake() {
		// The zombie woke up and writes what it read or decided before it
		// froze. No fault is injected: the API server alone must refuse
		// what is stale.
		if held {
			fs.zombie.add("writes held while frozen", 1)
		}
		fs.zombie.add("writes after waking", 1)
		err := do()
		switch {
		case err == nil:
			fs.zombie.add("accepted after waking (precondition still true)", 1)
			m.wrote(kind, obj)
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			fs.zombie.add("refused after waking (409/404)", 1)
			fs.refused.add(kind, 1)
		default:
			fs.zombie.add("failed otherwise after waking", 1)
		}
		return err
	}
	gr := schema.GroupResource{Resource: resourceOf(obj)}
	switch fs.plan.writeFault() {
	case faultConflict:
		fs.plan.injected.add(faultConflict, 1)
		return apierrors.NewConflict(gr, obj.GetName(), errors.New("injected by the chaos test"))
	case fault500:
		fs.plan.injected.add(fault500, 1)
		return apierrors.NewInternalError(errors.New("injected by the chaos test"))
	case fault429:
		fs.plan.injected.add(fault429, 1)
		return apierrors.NewTooManyRequests("injected by the chaos test", 0)
	case faultCommitted:
		err := do()
		if err != nil {
			fs.count(m, kind, obj, err)
			return err
		}
		m.wrote(kind, obj)
		fs.plan.injected.add(faultCommitted, 1)
		return apierrors.NewInternalError(errors.New("injected by the chaos test after the write committed"))
	}
	err := do()
	fs.count(m, kind, obj, err)
	return err
}

func (fs *faultSet) count(m *managerCtl, kind string, obj client.Object, err error) {
	switch {
	case err == nil:
		m.wrote(kind, obj)
	case apierrors.IsConflict(err):
		fs.refused.add(kind, 1)
	case apierrors.IsAlreadyExists(err):
		// Also a 409: a create that lost to another writer's (or hit a
		// Lease of somebody else's: the people's foreign Leases count them).
		fs.refused.add(kind+" (already exists)", 1)
	}
}

// interceptor wraps manager m's client: every write goes through write.
// Reads from the informer cache are left alone: they cannot fail in a real
// manager, and the operator rightly does not plan for it. Live reads are
// faulted in the transport instead (see transport).
func (fs *faultSet) interceptor(m *managerCtl) *interceptor.Funcs {
	return &interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return fs.write(m, "create", obj, func() error { return c.Create(ctx, obj, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, isLease := obj.(*coordinationv1.Lease); isLease && fs.broken == "cas" {
				// BROKEN ON PURPOSE: overwrite the Lease whatever it holds now.
				obj.SetResourceVersion("")
				obj.SetManagedFields(nil)
				return fs.write(m, "update", obj, func() error { return c.Patch(ctx, obj, client.Merge) })
			}
			return fs.write(m, "update", obj, func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return fs.write(m, "patch", obj, func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return fs.write(m, "delete", obj, func() error { return c.Delete(ctx, obj, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return fs.write(m, "update/"+sub, obj, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return fs.write(m, "patch/"+sub, obj, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	}
}

// decide is manager m's arbiter: the real one, frozen with the zombie, or
// broken on purpose.
func (fs *faultSet) decide(m *managerCtl) func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision {
	return func(l arbiter.Lock, claims []arbiter.Claim, g arbiter.Grant, now time.Time, p arbiter.Policy) arbiter.Decision {
		if m.zombie.wait(freezeAtDecide) {
			fs.zombie.add("decisions held while frozen", 1)
		}
		switch fs.broken {
		case "renew-clock":
			// BROKEN ON PURPOSE: a renewal counts from the client's clock.
			claims = slices.Clone(claims)
			for i := range claims {
				if c := &claims[i]; !c.RenewTime.IsZero() {
					c.RenewedAt, c.RenewTime = c.RenewTime, time.Time{}
				}
			}
		case "rollback":
			// BROKEN ON PURPOSE: the grant record remembers no line.
			g.Lines = nil
		case "queue":
			// BROKEN ON PURPOSE: Queue is ignored.
			if p.Ordering == arbiter.Queue {
				p.Ordering = arbiter.NewestWins
			}
		case "window":
			// BROKEN ON PURPOSE: no window ever freezes the target.
			p.Freeze = arbiter.Freeze{}
		case "workflow":
			// BROKEN ON PURPOSE: a line is its repo and branch only.
			claims = slices.Clone(claims)
			for i := range claims {
				claims[i].Workflow = ""
			}
			g.Lines = slices.Clone(g.Lines)
			for i := range g.Lines {
				g.Lines[i].Workflow = ""
			}
		case "token-restart":
			// BROKEN ON PURPOSE: a lock without its record forgets its
			// tokens.
			if g.Absent {
				g.Floor, g.Reserved = 0, 0
				claims = slices.Clone(claims)
				for i := range claims {
					claims[i].FencingToken = 0
				}
			}
		}
		d := arbiter.Decide(l, claims, g, now, p)
		if fs.broken == "decide" && d.Holder != "" && d.Waiting != "" {
			// BROKEN ON PURPOSE: the waiting claim is shown Held as well.
			for i := range d.Verdicts {
				if v := &d.Verdicts[i]; v.Name == d.Waiting {
					v.Phase, v.Reason, v.FencingToken = arbiter.Held, arbiter.ReasonAcquired, d.Grant.Token
				}
			}
		}
		return d
	}
}

// transport faults the manager's live reads (the uncached reader's GETs of
// a Lease or a pod, and its field-selected lists of claims), which the
// interceptor cannot reach: the manager's APIReader is built from the rest
// config, not from NewClient. Informer lists and watches are left alone,
// and counted once the cache synced.
func (fs *faultSet) transport(cfg *rest.Config, m *managerCtl) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if m.synced.Load() && isInformerList(req) {
				fs.lists.add("re-lists after the cache synced", 1)
			}
			if !isLiveRead(req) || (!fs.plan.podReads && isPodPath(req.URL.Path)) {
				return rt.RoundTrip(req)
			}
			switch f := fs.plan.readFault(); f {
			case faultRead500:
				fs.plan.injected.add(f, 1)
				return statusResponse(req, http.StatusInternalServerError, metav1.StatusReasonInternalError), nil
			case faultRead429:
				fs.plan.injected.add(f, 1)
				return statusResponse(req, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests), nil
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// isInformerList: a list of a whole collection (no field selector: the
// live reads select by target), or a watch that starts with the current
// objects (a streaming list).
func isInformerList(req *http.Request) bool {
	q := req.URL.Query()
	if req.Method != http.MethodGet || q.Get("fieldSelector") != "" {
		return false
	}
	if q.Get("watch") != "" {
		return q.Get("sendInitialEvents") == "true"
	}
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	last := parts[len(parts)-1]
	return last == "buildlocks" || last == "buildlockpolicies" || last == "leases" || last == "pods"
}

// isLiveRead: a GET of one pod or Lease, or a list with a field selector.
func isLiveRead(req *http.Request) bool {
	if req.Method != http.MethodGet || req.URL.Query().Get("watch") != "" {
		return false
	}
	if req.URL.Query().Get("fieldSelector") != "" {
		return true
	}
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	return len(parts) >= 2 && (parts[len(parts)-2] == "pods" || parts[len(parts)-2] == "leases")
}

func statusResponse(req *http.Request, code int, reason metav1.StatusReason) *http.Response {
	body, _ := json.Marshal(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: "injected by the chaos test",
	})
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Request: req,
		Header: http.Header{"Content-Type": []string{"application/json"}},
		Body:   io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
	}
}
