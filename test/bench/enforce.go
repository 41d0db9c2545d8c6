//go:build bench

package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// deployers is how many writers play the old holder's deploy at once, so
// that its writes reach the API server about a millisecond apart.
const deployers = 3

// enforceResult is the enforcement window (issue 13): from a grant change
// (the operator's update of the grant Lease returned) to the first write of
// the old holder's pod that admission refused, and to the last one it still
// admitted (negative: none was sent after the grant changed).
type enforceResult struct {
	firstRefused, lastAdmitted []time.Duration
	writes                     int // the old holders' writes, admitted or refused
}

// enforcementWindow installs the enforcement admission policies (as the
// chart's enforcement.enabled does), enforces a lock whose target namespace
// consents, and measures n hand-offs between pipeline pods (impersonated
// with their pod-bound token's identity, as the API server authenticates
// one): while the holder's pod deploys without pause, its claim is deleted;
// the hand-off's window ends at its first refused write. The writes are
// creates of one ConfigMap (see deploy).
func (b *bench) enforcementWindow(n int) (enforceResult, error) {
	var r enforceResult
	if err := testenv.InstallEnforcement(b.ctx, b.cfg); err != nil {
		return r, fmt.Errorf("installing the enforcement policies: %w", err)
	}
	ci := b.namespace("enf")
	target := "target-" + strings.TrimPrefix(ci, "enf-")
	pipeline := "system:serviceaccount:" + ci + ":pipeline"
	if err := b.c.Create(b.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target,
		Labels: map[string]string{buildlockv1.LockedByLabel: ci}}}); err != nil {
		return r, err
	}
	for _, ns := range []string{ci, target} {
		if err := b.grantAll(ns, pipeline); err != nil {
			return r, err
		}
	}
	policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
	policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
	if err := b.createPolicy(policy); err != nil {
		return r, err
	}
	err := wait.PollUntilContextTimeout(b.ctx, 20*time.Millisecond, waitLimit, true, func(ctx context.Context) (bool, error) {
		var p buildlockv1.BuildLockPolicy
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(policy), &p); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionEnforced)
		return c != nil && c.Reason == buildlockv1.ReasonEnforcing, nil
	})
	if err != nil {
		return r, fmt.Errorf("waiting for the lock of %s to be enforced: %w", target, err)
	}
	tr, err := trackClaims(b.ctx, b.c, ci)
	if err != nil {
		return r, err
	}

	type pipelinePod struct {
		claim string
		c     client.Client
	}
	// pipelineOf starts build i's pod and returns its pipeline's client;
	// claim creates the build's claim as that pipeline.
	pipelineOf := func(i int) (pipelinePod, *buildlockv1.BuildLock, error) {
		pod, err := b.createPod(ci, fmt.Sprintf("p-%d", i))
		if err != nil {
			return pipelinePod{}, nil, err
		}
		as, err := b.asPod(pipeline, pod)
		if err != nil {
			return pipelinePod{}, nil, err
		}
		bl := blClaim(ci, fmt.Sprintf("c-%d", i), target, fmt.Sprintf("acme/app-%d", i), int64(i+1), "")
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		return pipelinePod{claim: bl.Name, c: as}, bl, nil
	}
	join := func(i int) (pipelinePod, error) {
		pp, bl, err := pipelineOf(i)
		if err != nil {
			return pp, err
		}
		return pp, pp.c.Create(b.ctx, bl)
	}
	holder, first, err := pipelineOf(0)
	if err != nil {
		return r, err
	}
	// The binding reaches the API server's admission some time after the
	// operator created it: a pipeline's write is refused once it has, while
	// nobody holds the lock.
	err = wait.PollUntilContextTimeout(b.ctx, 20*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) {
		refused, err := deploy(b.ctx, holder.c, target)
		return err == nil && refused, nil
	})
	if err != nil {
		return r, fmt.Errorf("a pipeline's write into %s was never refused while nobody held its lock: %w", target, err)
	}
	if err := holder.c.Create(b.ctx, first); err != nil {
		return r, err
	}
	if _, err := tr.waitPhase(b.ctx, holder.claim, buildlockv1.PhaseHeld); err != nil {
		return r, err
	}
	for i := 1; i <= warmup+n; i++ {
		next, err := join(i)
		if err != nil {
			return r, err
		}
		if _, err := tr.waitPhase(b.ctx, next.claim, buildlockv1.PhaseWaiting); err != nil {
			return r, err
		}
		b.ops.quiesce(quietFor, quietMax)

		d := startDeploying(b.ctx, holder.c, target)
		if err := d.waitAdmitted(); err != nil {
			return r, fmt.Errorf("the holder %s: %w", holder.claim, err)
		}
		b.ops.startTrace()
		if err := holder.c.Delete(b.ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: holder.claim}}); err != nil {
			return r, fmt.Errorf("releasing %s: %w", holder.claim, err)
		}
		if _, err := tr.waitPhase(b.ctx, next.claim, buildlockv1.PhaseHeld); err != nil {
			return r, err
		}
		writes, err := d.stopAfterRefusal()
		b.ops.quiesce(quietFor, quietMax)
		trace := b.ops.stopTrace()
		if err != nil {
			return r, fmt.Errorf("the old holder %s: %w", holder.claim, err)
		}
		var granted time.Time
		for _, req := range trace {
			if req.what == "update leases" {
				granted = req.done
				break
			}
		}
		if granted.IsZero() {
			return r, fmt.Errorf("no grant Lease update in the hand-off from %s", holder.claim)
		}
		if i > warmup {
			first, last := time.Time{}, time.Time{}
			for _, w := range writes {
				switch {
				case w.refused && (first.IsZero() || w.sent.Before(first)):
					first = w.sent
				case !w.refused && w.sent.After(last):
					last = w.sent
				}
			}
			r.firstRefused = append(r.firstRefused, first.Sub(granted))
			r.lastAdmitted = append(r.lastAdmitted, last.Sub(granted))
			r.writes += len(writes)
		}
		holder = next
	}
	return r, nil
}

// grantAll gives user every right in namespace ns.
func (b *bench) grantAll(ns, user string) error {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench-all"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench-all"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := b.c.Create(b.ctx, obj); err != nil {
			return fmt.Errorf("granting %s everything in %s: %w", user, ns, err)
		}
	}
	return nil
}

// asPod returns a client that acts as the service account user with a token
// bound to pod: impersonated with the extras the API server takes from such
// a token.
func (b *bench) asPod(user string, pod *corev1.Pod) (client.Client, error) {
	cfg := rest.CopyConfig(b.cfg)
	ns, _, _ := strings.Cut(strings.TrimPrefix(user, "system:serviceaccount:"), ":")
	cfg.Impersonate.UserName = user
	cfg.Impersonate.Groups = []string{"system:authenticated", "system:serviceaccounts", "system:serviceaccounts:" + ns}
	cfg.Impersonate.Extra = map[string][]string{
		"authentication.kubernetes.io/pod-name": {pod.Name},
		"authentication.kubernetes.io/pod-uid":  {string(pod.UID)},
	}
	return client.New(cfg, client.Options{Scheme: testenv.Scheme()})
}

// deploy is one write of a deploy into ns: whether admission refused it
// (buildlock's policy), or another error. It is a real create, not a dry
// run: buildlock-enforce admits every server-side dry run but the probe's
// (kubectl diff writes nothing). Every write creates the same ConfigMap,
// so only the first admitted one stores it; the API server runs validating
// admission before storage, so each later write is judged in full and,
// once admitted, answered AlreadyExists.
func deploy(ctx context.Context, c client.Client, ns string) (refused bool, err error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deploy"}}
	err = c.Create(ctx, cm)
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		return false, nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "buildlock:"):
		return true, nil
	}
	return false, err
}

// deployWrite is one of the old holder's writes.
type deployWrite struct {
	sent    time.Time
	refused bool
}

// deploying is a holder's deploy in progress: deployers writers, each
// writing again as soon as its previous write is answered.
type deploying struct {
	mu       sync.Mutex
	writes   []deployWrite
	err      error
	admitted chan struct{} // closed at the first admitted write
	refused  chan struct{} // closed at the first refused write
	stop     chan struct{}
	done     sync.WaitGroup
}

func startDeploying(ctx context.Context, c client.Client, ns string) *deploying {
	d := &deploying{admitted: make(chan struct{}), refused: make(chan struct{}), stop: make(chan struct{})}
	var once [2]sync.Once
	for range deployers {
		d.done.Go(func() {
			for !closed(d.stop) {
				sent := time.Now()
				refused, err := deploy(ctx, c, ns)
				d.mu.Lock()
				if err != nil && d.err == nil {
					d.err = err
				}
				d.writes = append(d.writes, deployWrite{sent, refused})
				d.mu.Unlock()
				if err != nil {
					return
				}
				if refused {
					once[1].Do(func() { close(d.refused) })
				} else {
					once[0].Do(func() { close(d.admitted) })
				}
			}
		})
	}
	return d
}

// waitAdmitted waits until one of the writes was admitted.
func (d *deploying) waitAdmitted() error {
	select {
	case <-d.admitted:
		return nil
	case <-d.refused:
		close(d.stop)
		d.done.Wait()
		return fmt.Errorf("its deploy was refused while it held the lock")
	case <-time.After(waitLimit):
		return fmt.Errorf("no write of its deploy admitted within %s", waitLimit)
	}
}

// stopAfterRefusal waits for the first refused write, stops, and returns
// every write.
func (d *deploying) stopAfterRefusal() ([]deployWrite, error) {
	var err error
	select {
	case <-d.refused:
	case <-time.After(waitLimit):
		err = fmt.Errorf("its deploy was still admitted %s after it released the lock", waitLimit)
	}
	close(d.stop)
	d.done.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		err = d.err
	}
	return d.writes, err
}
