package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// The people around the locks, and the pipelines that overstep (issues 21
// and 31): a person (the administrator, in system:masters, which the
// grant-Lease guard lets through) deletes and edits grant Leases and the
// token floor, also while no manager runs (a Lease's token lowered, or the
// Lease deleted, and its holder's claim deleted: a new manager must not
// issue a token again); another person with the RBAC rights to write
// Leases (alice) tries the same and must be refused; a person withdraws a
// namespace's consent and gives it again, while pipelines try to change it
// and must be refused; a person creates a Lease of their own under a grant
// Lease's name; owners delete claims that a finalizer keeps; one pipeline
// identity floods a lock with short-lived fake lines against a victim line;
// and a person freezes a target of their own, a pipeline overrides its own
// claim there (refused by admission, or ignored by the operator where no
// admission policy checks who overrides), and a person overrides it.
// Everything goes into the ledger before it is sent, so that the checker
// can tell it from the operator's writes.

const (
	// alice is a person who may write Leases (RBAC) but is not buildlock's
	// operator: the grant-Lease guard must refuse her.
	alice = "alice@example.com"
	// keepFinalizer keeps a deleted claim until the workload removes it.
	keepFinalizer = "chaos.buildlock.io/keep"
	// unfencedNamespace is a namespace without consent, to which a
	// pipeline tries to give it.
	unfencedNamespace = "unfenced-0"
	// floodAccount is the pipeline identity that floods a lock with lines.
	floodAccount = "flood"
)

// people plays the people, and the pipelines that overstep, with their own
// seeded source: the workload's stream stays as it was.
type people struct {
	h      *harness
	dep    *deployer // nil without enforcement
	rng    *rand.Rand
	admin  client.Client
	alice  client.Client
	flood  client.Client // the flood's service account, in floodNS
	ops    *counters
	failed *counters

	// pipelineAs impersonates a pipeline of the enforced lock's namespace,
	// as the pod podUID (or no pod).
	pipelineAs func(podName, podUID string) client.Client

	// runCtx is the context of run: the run's, which ends when the run
	// stops its actors (context.Background before run).
	runCtx context.Context

	floodNS, floodTarget string
	seq                  int
	lastConsent          time.Time
	wg                   sync.WaitGroup
	// flood and victim figures
	mu         sync.Mutex
	figures    []string
	failedOnce map[string]bool

	// enforcedForeign: a foreign Lease was put under an enforced target.
	enforcedForeign bool
}

// setupPeople grants the people and pipelines what RBAC would let them do
// (so that what refuses them is admission), creates the flood's account
// and a namespace without consent, and returns the actor.
func (h *harness) setupPeople(ctx context.Context, dep *deployer) *people {
	p := &people{h: h, dep: dep, runCtx: context.Background(), rng: rand.New(rand.NewPCG(h.o.seed, 0x70656f706c65)), admin: h.c, ops: newCounters(), failed: newCounters(), failedOnce: map[string]bool{},
		floodNS: h.namespaces[len(h.namespaces)-1], floodTarget: "flood-0"}
	floodUser := "system:serviceaccount:" + p.floodNS + ":" + floodAccount
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unfencedNamespace}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "chaos-lease-writer"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"*"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "chaos-lease-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "chaos-lease-writer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: alice}}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: p.floodNS, Name: "chaos-flood"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{"buildlocks"},
				Verbs: []string{"create", "get", "list", "watch", "delete", "patch"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: p.floodNS, Name: "chaos-flood"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "chaos-flood"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: floodUser}}},
	}
	// A pipeline may patch the namespaces it deploys into (a namespaced
	// Role is enough): what stops it changing their consent is admission.
	namespaces := []string{unfencedNamespace}
	if dep != nil {
		for _, k := range dep.locks {
			namespaces = append(namespaces, k.Target)
		}
	}
	for _, ns := range namespaces {
		objs = append(objs,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chaos-namespace-patch"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "patch", "update"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chaos-namespace-patch"},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "chaos-namespace-patch"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName,
					Name: "system:serviceaccount:" + h.namespaces[0] + ":" + pipelineAccount}}})
	}
	for _, o := range objs {
		if err := h.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			h.t.Fatalf("people: creating %T %s: %v", o, o.GetName(), err)
		}
	}
	as := func(id rest.ImpersonationConfig) client.Client {
		cfg := rest.CopyConfig(h.cp.balancedConfig())
		cfg.Timeout = 10 * time.Second
		cfg.Impersonate = id
		c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
		if err != nil {
			h.t.Fatal(err)
		}
		return c
	}
	p.alice = as(rest.ImpersonationConfig{UserName: alice, Groups: []string{"system:authenticated"}})
	p.flood = as(rest.ImpersonationConfig{UserName: floodUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + p.floodNS, "system:authenticated"}})
	p.pipelineAs = func(podName, podUID string) client.Client {
		id := podIdentity(h.namespaces[0], podName, podUID)
		if podUID == "" {
			id.Extra = nil
		}
		return as(rest.ImpersonationConfig{UserName: id.UserName, Groups: id.Groups, Extra: id.Extra})
	}
	return p
}

// note counts a call of the people's that returned err, as classifyCall
// judges it (a call the run's end cut short counts for nothing), and
// returns the judgement.
func (p *people) note(kind string, err error) callResult {
	r := p.h.classify(p.runCtx, err)
	switch r.class {
	case callDone:
		p.ops.add(kind, 1)
		return r
	case callStopped:
		return r
	}
	p.mu.Lock()
	first := !p.failedOnce[kind]
	p.failedOnce[kind] = true
	p.mu.Unlock()
	if first && !strings.HasPrefix(kind, "alice") && !strings.HasPrefix(kind, "pipeline") {
		p.figure("people: %s failed first with: %v", kind, err)
	}
	p.failed.add(kind+"/"+r.why, 1)
	return r
}

func (p *people) figure(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.figures = append(p.figures, fmt.Sprintf(format, args...))
}

// run plays the people until ctx ends: each behavior once early (so that
// the short run has them all: one that finds nothing to act on, say no
// lock held, is tried again a moment later, after the others), then at
// random, one every half to whole of every. The flood runs on its own. The
// figures name the behaviors that never acted.
func (p *people) run(ctx context.Context, every time.Duration) {
	p.runCtx = ctx
	p.wg.Go(func() { p.floodLines(ctx) })
	type kind struct {
		name  string
		do    func(context.Context) bool
		tries int
	}
	firsts := []kind{
		{name: "delete grant Lease", do: p.deleteGrantLease}, {name: "edit the holder", do: p.editHolder},
		{name: "a finalizer", do: p.finalized}, {name: "edit the token", do: p.editToken},
		{name: "a pipeline changes consent", do: p.pipelineConsent}, {name: "edit the writer", do: p.editWriter},
		{name: "alice", do: p.aliceWrites}, {name: "a Lease of somebody else's", do: p.foreignLease},
		{name: "consent withdrawn and given", do: p.consent}, {name: "delete the token floor", do: p.deleteTokenFloor},
		{name: "edit the holder", do: p.editHolder}, {name: "a finalizer", do: p.finalized},
		{name: "edit while no manager runs", do: p.editWhileDown}, {name: "override a freeze", do: p.overrideFreeze},
		{name: "claim under a new workflow", do: p.newWorkflow},
	}
	type op struct {
		weight int
		do     func(context.Context) bool
	}
	ops := []op{
		{3, p.deleteGrantLease}, {3, p.editHolder}, {2, p.editToken}, {2, p.editWriter}, {1, p.deleteTokenFloor},
		{2, p.aliceWrites}, {2, p.pipelineConsent}, {1, p.consent}, {1, p.foreignLease}, {3, p.finalized},
		{1, p.editWhileDown}, {1, p.overrideFreeze}, {1, p.newWorkflow},
	}
	sleep := func(lo, hi time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(lo + time.Duration(p.rng.Int64N(int64(hi-lo)+1))):
			return true
		}
	}
	var given []kind // up after 40 tries
	defer func() {
		for _, k := range append(given, firsts...) {
			p.figure("people: %s never done (%d tries found nothing to act on)", k.name, k.tries)
		}
	}()
	if !sleep(2*time.Second, 3*time.Second) {
		return
	}
	for next := 0; ctx.Err() == nil; {
		acted := true
		if len(firsts) > 0 {
			// One that finds nothing to act on is tried again soon, after
			// the others, and given up after 40 tries.
			next %= len(firsts)
			k := &firsts[next]
			k.tries++
			switch acted = k.do(ctx); {
			case acted:
				firsts = slices.Delete(firsts, next, next+1)
			case k.tries == 40:
				given = append(given, *k)
				firsts = slices.Delete(firsts, next, next+1)
			default:
				next++
			}
		} else {
			pick(p.rng, ops, func(o op) int { return o.weight }).do(ctx)
		}
		lo, hi := every/2, every
		if !acted {
			lo, hi = 200*time.Millisecond, 400*time.Millisecond
		}
		if !sleep(lo, hi) {
			break
		}
	}
}

// stop waits for the sequences still running (finalizers, foreign Leases,
// the flood) and returns the figures.
func (p *people) stop() []string {
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{fmt.Sprintf("people: %s; refused or failed: %s", p.ops, p.failed)}, p.figures...)
}

// heldLock draws a lock of the workload whose holder the checker sees Held,
// with that holder, and its other live claims.
func (p *people) heldLock() (LockKey, ClaimRef, []ClaimRef, bool) {
	for _, i := range p.rng.Perm(len(p.h.targets)) {
		k := p.h.targets[i]
		claims := p.h.check.Claims(k)
		if j := slices.IndexFunc(claims, func(c ClaimRef) bool { return c.Phase == buildlockv1.PhaseHeld }); j >= 0 {
			// The holder first: slices.Delete shifts and clears the array
			// it shares.
			holder := claims[j]
			return k, holder, slices.Delete(claims, j, j+1), true
		}
	}
	return LockKey{}, ClaimRef{}, nil, false
}

// heldLease reads the grant Lease of a lock of the workload whose holder
// the checker sees Held.
func (p *people) heldLease(ctx context.Context) (LockKey, *coordinationv1.Lease, bool) {
	k, _, _, ok := p.heldLock()
	if !ok {
		return k, nil, false
	}
	l, ok := p.getLease(ctx, k.Namespace, LeasePrefix+k.Target)
	return k, l, ok
}

func (p *people) getLease(ctx context.Context, ns, name string) (*coordinationv1.Lease, bool) {
	var l coordinationv1.Lease
	if err := p.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &l); err != nil {
		p.note("get Lease", err)
		return nil, false
	}
	return &l, true
}

// deleteGrantLease: a person deletes a held lock's grant Lease. The
// operator must write it again at once, naming the same holder with the
// same token; meanwhile an enforced target refuses every write.
func (p *people) deleteGrantLease(ctx context.Context) bool {
	_, l, ok := p.heldLease(ctx)
	if !ok {
		return false
	}
	p.h.ledger.PersonDeletesLease(l)
	err := p.admin.Delete(ctx, l, client.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion})
	p.note("delete grant Lease", err)
	return err == nil // a conflict: the Lease moved on meanwhile; try again
}

// edit updates a held lock's grant Lease as a person would (kubectl edit:
// an update of the version read), as c, and reports whether it sent the
// update (change says there was something to change).
func (p *people) edit(ctx context.Context, c client.Client, kind string, k LockKey, change func(*coordinationv1.Lease) bool) bool {
	l, ok := p.getLease(ctx, k.Namespace, LeasePrefix+k.Target)
	if !ok || !change(l) {
		return false
	}
	p.h.ledger.PersonWritesLease(l)
	err := c.Update(ctx, l)
	p.note(kind, err)
	return err == nil // a conflict: the Lease moved on meanwhile; try again
}

// editHeld is edit, as the administrator, of a lock of the workload whose
// holder the checker sees Held; change also gets the lock's other live
// claims.
func (p *people) editHeld(ctx context.Context, kind string, change func(l *coordinationv1.Lease, others []ClaimRef)) bool {
	k, _, others, ok := p.heldLock()
	if !ok {
		return false
	}
	return p.edit(ctx, p.admin, kind, k, func(l *coordinationv1.Lease) bool {
		change(l, others)
		return true
	})
}

// editHolder: a person writes another holder into a held lock's grant
// Lease, keeping the token: a waiter, a claim that does not exist, or
// nobody. The operator must write the holder back.
func (p *people) editHolder(ctx context.Context) bool {
	return p.editHeld(ctx, "edit grant Lease holder", func(l *coordinationv1.Lease, others []ClaimRef) {
		switch n := p.rng.IntN(3); {
		case n == 0 && len(others) > 0:
			w := others[p.rng.IntN(len(others))]
			l.Spec.HolderIdentity = ptr.To(w.Name + "/" + string(w.UID))
		case n == 1:
			l.Spec.HolderIdentity = ptr.To("no-such-claim/00000000-0000-0000-0000-0000000000ee")
		default:
			l.Spec.HolderIdentity = nil
		}
	})
}

// editToken: a person lowers a held lock's token to 1, or raises it by
// 50. The operator must write the holder's token back; later grants go
// above every token it gave.
func (p *people) editToken(ctx context.Context) bool {
	return p.editHeld(ctx, "edit grant Lease token", func(l *coordinationv1.Lease, _ []ClaimRef) {
		t := ptr.Deref(l.Spec.LeaseTransitions, 0)
		if p.rng.IntN(2) == 0 && t > 1 {
			t = 1
		} else {
			t += 50
		}
		l.Spec.LeaseTransitions = ptr.To(t)
	})
}

// editWriter: a person writes another pod into a held enforced lock's
// writer annotation (or adds it, when the holder has no pod): a waiter's,
// so that admission lets it write until the operator undoes it.
func (p *people) editWriter(ctx context.Context) bool {
	if p.dep == nil {
		return false
	}
	k := p.dep.locks[p.rng.IntN(len(p.dep.locks))]
	pod := "00000000-0000-0000-0000-0000000000ff"
	for _, c := range p.h.check.Claims(k) {
		if c.Phase != buildlockv1.PhaseHeld && c.PodUID != "" {
			pod = c.PodUID
		}
	}
	return p.edit(ctx, p.admin, "edit grant Lease writer", k, func(l *coordinationv1.Lease) bool {
		if l.Spec.HolderIdentity == nil {
			return false // nobody holds
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[WriterPodAnnotation] = pod
		return true
	})
}

// deleteTokenFloor: a person deletes a namespace's token floor.
func (p *people) deleteTokenFloor(ctx context.Context) bool {
	for _, ns := range p.h.namespaces {
		var l coordinationv1.Lease
		if err := p.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: TokenFloorLease}, &l); err != nil {
			continue
		}
		p.h.ledger.PersonDeletesLease(&l)
		p.note("delete token floor", p.admin.Delete(ctx, &l, client.Preconditions{UID: &l.UID}))
		return true
	}
	return false
}

// aliceWrites: alice, a person whom RBAC lets write Leases but who is not
// the operator, deletes or edits a held lock's grant Lease. With the
// enforcement policies installed, the grant-Lease guard must refuse her.
func (p *people) aliceWrites(ctx context.Context) bool {
	if p.dep == nil {
		return false
	}
	k, l, ok := p.heldLease(ctx)
	if !ok {
		return false
	}
	var err error
	kind := "alice deletes a grant Lease"
	if p.rng.IntN(2) == 0 {
		p.h.ledger.PersonDeletesLease(l)
		err = retry(ctx, func() error { return p.alice.Delete(ctx, l, client.Preconditions{UID: &l.UID}) })
	} else {
		kind = "alice edits a grant Lease"
		l.Spec.HolderIdentity = nil
		p.h.ledger.PersonWritesLease(l)
		err = retry(ctx, func() error { return p.alice.Update(ctx, l) })
	}
	switch r := p.note(kind, err); {
	case r.class == callDone:
		p.h.check.AddViolation(k, "grant-record-guarded", "%s was admitted: only the operator and system:masters may write a grant Lease (%s)", kind, l.Name)
	case r.wrongAuthority("buildlock-grant-leases"):
		p.h.t.Errorf("people: %s was refused, but not by the grant-Lease guard (RBAC set up wrong?): %v", kind, err)
	case r.class == callUnexplained:
		p.h.t.Logf("people: %s failed: %v", kind, err)
	}
	return true
}

// consent: a person withdraws the enforced target's consent (its label
// buildlock.io/locked-by), then gives it again. Meanwhile the target is
// not fenced, so the deployer waits until the fence is proven again.
func (p *people) consent(ctx context.Context) bool {
	if p.dep == nil || time.Since(p.lastConsent) < max(p.h.o.duration/6, 10*time.Second) {
		return false
	}
	p.lastConsent = time.Now()
	k := p.dep.locks[p.rng.IntN(len(p.dep.locks))]
	p.dep.pause()
	defer p.dep.resume()
	p.h.ledger.PersonSetsConsent(k.Target, "")
	p.note("withdraw consent", p.setConsent(ctx, p.admin, k.Target, ""))
	time.Sleep(time.Duration(1000+p.rng.IntN(1500)) * time.Millisecond)
	p.h.ledger.PersonSetsConsent(k.Target, k.Namespace)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := p.setConsent(ctx, p.admin, k.Target, k.Namespace)
		p.note("give consent", err)
		if err == nil || attempt == 10 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The fence holds again once the policy says Enforcing and both API
	// servers refuse a pod that never claims.
	p.dep.waitEnforcing(ctx, p.h)
	return true
}

// setConsent sets (or, with "", removes) namespace ns's consent label as c.
func (p *people) setConsent(ctx context.Context, c client.Client, ns, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{buildlockv1.LockedByLabel: v}}})
	return c.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, client.RawPatch(types.MergePatchType, patch))
}

// pipelineConsent: a pipeline (the enforced lock's holder's pod, when one
// holds: the fence admits its writes) removes or changes its target's
// consent, or gives consent to a namespace that has none. Admission must
// refuse all three: consent is people's.
func (p *people) pipelineConsent(ctx context.Context) bool {
	ns, value := unfencedNamespace, p.h.namespaces[0]
	podName, podUID := "", ""
	if p.dep != nil && p.rng.IntN(3) > 0 {
		k := p.dep.locks[p.rng.IntN(len(p.dep.locks))]
		ns, value = k.Target, ""
		if p.rng.IntN(2) == 0 {
			value = "chaos-other"
		}
		for _, c := range p.h.check.Claims(k) {
			if c.Phase == buildlockv1.PhaseHeld && c.PodUID != "" {
				podName, podUID = "pod-"+c.Name, c.PodUID
			}
		}
	}
	p.h.ledger.PipelineTriesConsent(ns, value)
	as := p.pipelineAs(podName, podUID)
	err := retry(ctx, func() error { return p.setConsent(ctx, as, ns, value) })
	kind := "pipeline changes consent"
	switch r := p.note(kind, err); {
	case r.class == callDone:
		// The checker's watch of the namespace reports it too.
		p.h.check.AddViolation(LockKey{Namespace: ns}, "consent-by-people", "a pipeline set namespace %s's consent label to %q, and admission let it", ns, value)
	case r.wrongAuthority("buildlock-"):
		p.h.t.Errorf("people: %s was refused by %q, not by admission (set up wrong?): %v", kind, r.by, err)
	}
	return true
}

// foreignLease: a person creates a Lease of their own under the name of a
// new target's grant Lease; a claim of that target must stay Pending
// (ForeignLease) and the Lease untouched, until the person deletes it.
// The first time, and then every other time, the target is enforced too
// (a policy with spec.enforce, and a target namespace that consents), and
// the claim comes only after the operator's first create of the enforced
// lock's Lease (refused: the name is taken) and 2 s more: the operator must
// not retry that create in a loop meanwhile (foreign-lease-quiet: the
// managers' creates of a Lease refused as existing, over those 2 s), and
// with the admission policies installed the policy's Enforced condition
// must name that Lease (foreign-lease-said).
func (p *people) foreignLease(ctx context.Context) bool {
	p.seq++
	ns, target := p.floodNS, fmt.Sprintf("foreign-%d", p.seq)
	enforced := !p.enforcedForeign || p.rng.IntN(2) == 0
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + target},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("deploy-bot"), LeaseTransitions: ptr.To(int32(7))}}
	p.h.ledger.PersonCreatesForeignLease(ns, lease.Name)
	if err := p.admin.Create(ctx, lease); err != nil {
		p.note("create a foreign Lease", err)
		return false
	}
	p.note("create a foreign Lease", nil)
	var policy *buildlockv1.BuildLockPolicy
	if enforced {
		p.enforcedForeign = true
		p.h.ledger.PersonSetsConsent(target, ns)
		p.note("create a consenting target for a foreign Lease", client.IgnoreAlreadyExists(retry(ctx, func() error {
			return p.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target, Labels: map[string]string{buildlockv1.LockedByLabel: ns}}})
		})))
		policy = &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target},
			Spec: buildlockv1.BuildLockPolicySpec{Enforce: &buildlockv1.Enforcement{ServiceAccounts: []string{pipelineAccount}}}}
		p.note("enforce a foreign Lease's target", retry(ctx, func() error { return client.IgnoreAlreadyExists(p.admin.Create(ctx, policy)) }))
	}
	name := "claim-of-" + target
	claim := func() {
		spec := buildlockv1.BuildLockSpec{Target: target, Repo: "acme/shop", Branch: "foreign", Build: int64(p.seq),
			Timestamp: micro(p.h.clock.Now()), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
		p.h.ledger.WroteSpec(ns, name, spec)
		if err := p.admin.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}); err != nil {
			p.note("claim a foreign Lease's target", err)
		}
	}
	if !enforced {
		claim()
	}
	wait := time.Duration(2000+p.rng.IntN(1000)) * time.Millisecond
	p.wg.Go(func() {
		if enforced {
			// The enforced lock without claims first: its Lease is written
			// for the enforcement alone, without a decision that grants.
			// From the first create that finds the Lease there (a manager
			// may take a while to come to the lock: an episode, a busy
			// queue), over 2 s.
			const quiet = 2 * time.Second
			creates := func() int { return p.h.faults.refused.get("create lease (already exists)") }
			first := creates()
			for deadline := time.Now().Add(10 * time.Second); creates() == first && time.Now().Before(deadline) && ctx.Err() == nil; {
				time.Sleep(50 * time.Millisecond)
			}
			if creates() == first {
				p.ops.add("an enforced target's foreign Lease: no create of its grant Lease seen within 10 s (not judged)", 1)
			} else {
				before := creates()
				time.Sleep(quiet)
				n := creates() - before
				p.ops.add(fmt.Sprintf("grant Lease creates refused as existing in the %s after the first, while an enforced target's foreign Lease waited unclaimed: %d", quiet, n), 1)
				if n > 4 {
					p.h.check.AddViolation(LockKey{Namespace: ns, Target: target}, "foreign-lease-quiet",
						"the managers tried %d more creates of grant Leases that exist in %s while %s was somebody else's Lease: a write retried in a loop", n, quiet, lease.Name)
				}
			}
			claim()
		}
		time.Sleep(wait)
		var bl buildlockv1.BuildLock
		if err := p.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &bl); err == nil {
			p.ops.add(fmt.Sprintf("claim of a foreign Lease's target after 2 s: %s/%s", phaseOf(bl.Status.Phase), bl.Status.Reason), 1)
		}
		if policy != nil && p.dep != nil {
			p.checkForeignSaid(ctx, ns, target, lease.Name)
		}
		p.h.ledger.PersonDeletesLease(lease)
		p.note("delete a foreign Lease", p.admin.Delete(context.WithoutCancel(ctx), lease, client.Preconditions{UID: &lease.UID}))
		if policy != nil {
			p.note("remove the foreign Lease's target's policy", client.IgnoreNotFound(p.admin.Delete(context.WithoutCancel(ctx), policy)))
		}
	})
	return true
}

// checkForeignSaid: the policy that enforces a target whose grant Lease
// name a Lease of somebody else's takes says so on its Enforced condition,
// naming that Lease (foreign-lease-said).
func (p *people) checkForeignSaid(ctx context.Context, ns, target, lease string) {
	var got *metav1.Condition
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		var bp buildlockv1.BuildLockPolicy
		if err := p.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: target}, &bp); err != nil {
			continue
		}
		if got = meta.FindStatusCondition(bp.Status.Conditions, buildlockv1.ConditionEnforced); got != nil &&
			got.Reason == buildlockv1.ReasonForeignLease && strings.Contains(got.Message, ns+"/"+lease) {
			p.ops.add("the policy of a foreign Lease's target says ForeignLease", 1)
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	said := "no Enforced condition"
	if got != nil {
		said = fmt.Sprintf("%s: %s", got.Reason, got.Message)
	}
	p.h.check.AddViolation(LockKey{Namespace: ns, Target: target}, "foreign-lease-said",
		"the BuildLockPolicy of %s, whose grant Lease name %s takes, does not say so on its Enforced condition (%s)", target, lease, said)
}

// editWhileDown: with every manager stopped, a person lowers a held lock's
// grant Lease token to 1, or deletes the Lease, and deletes the holder's
// claim (bug 15's shape, and bug 10's: nothing left shows the holder's
// token but the namespace's floor); then a manager starts, with no memory
// of the lock. Its next grant of the lock must go above every token the
// lock issued (fencing-token-increases, tokens-reserved). Not on an
// enforced lock, whose holder's deployer would go on writing.
func (p *people) editWhileDown(ctx context.Context) bool {
	k, holder, _, ok := p.heldLock()
	if !ok || slices.Contains(p.h.enforcedTargets(), k) {
		return false
	}
	p.h.episodes.Lock()
	defer p.h.episodes.Unlock()
	if ctx.Err() != nil {
		return false
	}
	p.h.stopAll()
	// The manager outlives the workload's context: the phases after it
	// need one.
	defer p.h.startManager(context.WithoutCancel(ctx), 0, "")
	l, ok := p.getLease(ctx, k.Namespace, LeasePrefix+k.Target)
	if !ok {
		return false
	}
	kind := "while no manager runs: lower the token"
	var err error
	if p.rng.IntN(3) == 0 {
		kind = "while no manager runs: delete the grant Lease"
		p.h.ledger.PersonDeletesLease(l)
		err = retry(ctx, func() error { return p.admin.Delete(ctx, l, client.Preconditions{UID: &l.UID}) })
	} else {
		l.Spec.LeaseTransitions = ptr.To(int32(1))
		p.h.ledger.PersonWritesLease(l)
		err = retry(ctx, func() error { return p.admin.Update(ctx, l) })
	}
	p.note(kind, err)
	if err != nil {
		return false // the Lease moved on meanwhile: try again
	}
	p.h.ledger.RequestDelete(k.Namespace, holder.Name)
	uid := holder.UID
	p.note("while no manager runs: delete the holder's claim", client.IgnoreNotFound(retry(ctx, func() error {
		return p.admin.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: holder.Name}},
			client.Preconditions{UID: &uid})
	})))
	return true
}

// overrideFreeze: a person freezes a target of their own (a Deny window
// from a moment ahead, 12 s long); once it is in effect, a pipeline (the
// flood's service account) claims the target and overrides its own claim.
// Admission must refuse that override (buildlock-override); where no
// admission policy checks it (no enforcement installed), the operator must
// ignore it, since nothing verified who set it: a grant in the freeze
// without a person's override in the ledger is a window-closed violation.
// Then a person overrides the claim: verified (the API server stamps the
// person), it goes through the freeze at once (window-closed,
// override-recorded, and its audit entry); unverified (no policies), it
// is ignored too, and the claim waits for the freeze's end.
func (p *people) overrideFreeze(ctx context.Context) bool {
	p.seq++
	ns, target := p.floodNS, fmt.Sprintf("frozen-%d", p.seq)
	start := p.h.clock.Now().Add(windowLag + time.Second)
	policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target},
		Spec: buildlockv1.BuildLockPolicySpec{Windows: []buildlockv1.Window{{Name: "people-freeze", Kind: buildlockv1.WindowDeny,
			Start: &buildlockv1.Timestamp{Time: start}, End: &buildlockv1.Timestamp{Time: start.Add(12 * time.Second)},
			Reason: "chaos: a person's freeze"}}}}
	if err := retry(ctx, func() error { return client.IgnoreAlreadyExists(p.admin.Create(ctx, policy)) }); err != nil {
		p.note("freeze a target of their own", err)
		return false
	}
	p.note("freeze a target of their own", nil)
	name := "frozen-claim-" + strconv.Itoa(p.seq)
	margin := p.h.check.o.Tolerance + time.Second
	p.wg.Go(func() {
		ended := ctx.Done()
		ctx := context.WithoutCancel(ctx)
		wait := func(d time.Duration) {
			select {
			case <-time.After(d):
			case <-ended:
			}
		}
		defer func() {
			p.h.ledger.RequestDelete(ns, name)
			p.note("delete the frozen target's claim", client.IgnoreNotFound(retry(ctx, func() error {
				return p.flood.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
			})))
			wait(start.Add(13 * time.Second).Sub(p.h.clock.Now()))
			p.note("remove the freeze", client.IgnoreNotFound(retry(ctx, func() error { return p.admin.Delete(ctx, policy) })))
		}()
		wait(start.Add(margin).Sub(p.h.clock.Now()))
		spec := buildlockv1.BuildLockSpec{Target: target, Repo: "flood/frozen", Branch: "main", Build: int64(p.seq),
			Timestamp: micro(p.h.clock.Now()), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
		p.h.ledger.WroteSpec(ns, name, spec)
		if err := retry(ctx, func() error {
			return client.IgnoreAlreadyExists(p.flood.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}))
		}); err != nil {
			p.note("a pipeline claims a frozen target", err)
			return
		}
		wait(time.Second)
		overrideOf := func(c client.Client, reason string) error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
				buildlockv1.OverrideAnnotation: reason, buildlockv1.OverrideExpiresAnnotation: p.h.clock.Now().Add(30 * time.Second).UTC().Format(time.RFC3339)}}})
			return retry(ctx, func() error {
				return c.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch))
			})
		}
		kind := "a pipeline overrides its own frozen claim"
		switch err := overrideOf(p.flood, "chaos: a pipeline lets itself through"); {
		case err == nil && p.dep != nil:
			p.h.check.AddViolation(LockKey{Namespace: ns, Target: target}, "override-by-people",
				"the pipeline %s overrode its claim %s, and admission let it", floodAccount, name)
		case err == nil:
			p.ops.add(kind+": admitted (no admission policies): the operator must ignore it", 1)
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "buildlock-override"):
			p.ops.add(kind+": refused", 1)
		default:
			p.note(kind, err)
		}
		wait(1500 * time.Millisecond)
		p.h.ledger.PersonOverrides(ns, name)
		p.note("a person overrides a frozen claim", overrideOf(p.admin, "chaos: a person's hotfix"))
		phase := buildlockv1.Phase("")
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && phase != buildlockv1.PhaseHeld; wait(200 * time.Millisecond) {
			phase, _, _ = p.h.check.Claim(ns, name)
			select {
			case <-ended:
				return
			default:
			}
		}
		p.ops.add("a person's override of a frozen claim, within 5 s: "+string(phaseOf(phase)), 1)
	})
	return true
}

// newWorkflow: build 50+n of a line (acme/hotfix@main, a person's claim)
// holds a target of its own and goes; then the flood's pipeline identity
// claims the same repository and branch under a workflow nobody used
// before, with an older build and source an hour older (issue 31, breaks 5
// and 6: a workflow's line escaping the branch's memory, or squatted).
// Every rule of the checker judges it as any claim, and once the
// branch's newer build held, the older one must never be granted, whatever
// its workflow (branch-never-backwards: across the workflows of a branch,
// a build that started before one the branch deployed does not deploy
// after it). What became of it is a figure.
func (p *people) newWorkflow(ctx context.Context) bool {
	p.seq++
	ns, target, seq := p.floodNS, "workflows-0", p.seq
	p.wg.Go(func() {
		ended := ctx.Done()
		ctx := context.WithoutCancel(ctx)
		claim := func(c client.Client, name, workflow string, build int64, stamp time.Time) bool {
			spec := buildlockv1.BuildLockSpec{Target: target, Repo: "acme/hotfix", Branch: "main", Workflow: workflow, Build: build,
				Timestamp: micro(stamp), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
			p.h.ledger.WroteSpec(ns, name, spec)
			err := retry(ctx, func() error {
				return client.IgnoreAlreadyExists(c.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}))
			})
			p.note("claim under a workflow", err)
			return err == nil
		}
		settle := func(name string) buildlockv1.Phase {
			phase := buildlockv1.Phase("")
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				select {
				case <-ended:
					return phase
				default:
				}
				if phase, _, _ = p.h.check.Claim(ns, name); phase != "" && phase != buildlockv1.PhasePending && phase != buildlockv1.PhaseWaiting {
					break
				}
			}
			return phase
		}
		release := func(c client.Client, name string) {
			p.h.ledger.RequestDelete(ns, name)
			p.note("release a workflow's claim", client.IgnoreNotFound(retry(ctx, func() error {
				return c.Delete(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
			})))
		}
		now := p.h.clock.Now()
		held := fmt.Sprintf("hotfix-%d", seq)
		if !claim(p.admin, held, "acme/hotfix/.github/workflows/deploy.yml", int64(50+seq), now) {
			return
		}
		settle(held)
		release(p.admin, held)
		other := fmt.Sprintf("hotfix-%d-other-workflow", seq)
		if !claim(p.flood, other, fmt.Sprintf("acme/hotfix/.github/workflows/new-%d.yml", seq), int64(49+seq), now.Add(-time.Hour)) {
			return
		}
		settle(other)
		var bl buildlockv1.BuildLock
		if err := p.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: other}, &bl); err == nil {
			p.ops.add(fmt.Sprintf("an older build under a new workflow, after the branch's newer build held: %s/%s", phaseOf(bl.Status.Phase), bl.Status.Reason), 1)
		}
		release(p.flood, other)
		// Judged once both are gone, by what the checker saw of the grant
		// Lease: a grant it missed while its watch was down is a grant too.
		if _, _, newerHeld, _ := p.h.check.ClaimEnd(ns, held); newerHeld {
			if _, _, olderHeld, _ := p.h.check.ClaimEnd(ns, other); olderHeld {
				p.h.check.AddViolation(LockKey{Namespace: ns, Target: target}, "branch-never-backwards",
					"build %d of acme/hotfix@main under workflow new-%d (started an hour before) was granted after build %d of the branch held",
					49+seq, seq, 50+seq)
			}
		}
	})
	return true
}

// finalized: a claim that a finalizer keeps is deleted by its owner while
// it holds or waits: it has ended (Released, Deleted) and the lock goes on.
// A few seconds later the finalizer is removed and the claim goes.
func (p *people) finalized(ctx context.Context) bool {
	k := p.h.targets[p.rng.IntN(len(p.h.targets))]
	if p.h.check.LiveClaims(k) >= maxLive {
		return false
	}
	p.seq++
	name := fmt.Sprintf("finalized-%d", p.seq)
	spec := buildlockv1.BuildLockSpec{Target: k.Target, Repo: "acme/final", Branch: "main", Build: int64(p.seq), Timestamp: micro(p.h.clock.Now())}
	var pod *corev1.Pod
	if p.rng.IntN(2) == 0 {
		pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: "pod-" + name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
		if err := p.admin.Create(ctx, pod); err != nil {
			p.note("create a finalized claim's pod", err)
			return false
		}
		p.h.ledger.PodCreated(pod.Namespace, pod.Name, pod.UID)
		spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
	} else {
		spec.ExpiresAfter = &metav1.Duration{Duration: 20 * time.Second}
	}
	bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: name, Finalizers: []string{keepFinalizer}}, Spec: spec}
	p.h.ledger.WroteSpec(k.Namespace, name, spec)
	if err := p.admin.Create(ctx, bl); err != nil {
		p.note("create a finalized claim", err)
		return false
	}
	p.note("create a finalized claim", nil)
	keep := time.Duration(2000+p.rng.IntN(2000)) * time.Millisecond
	p.wg.Go(func() {
		// When the run ends meanwhile, the sequence goes on, but quickly.
		ended := ctx.Done()
		ctx := context.WithoutCancel(ctx)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			select {
			case <-ended:
				deadline = time.Now()
				continue
			default:
			}
			if phase, _, _ := p.h.check.Claim(k.Namespace, name); phase == buildlockv1.PhaseHeld || phase == buildlockv1.PhaseWaiting || isTerminal(phase) {
				p.ops.add("finalized claim deleted while "+string(phase), 1)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.h.ledger.RequestDelete(k.Namespace, name)
		p.note("delete a finalized claim", client.IgnoreNotFound(retry(ctx, func() error { return p.admin.Delete(ctx, bl) })))
		select {
		case <-time.After(keep):
		case <-ended:
			time.Sleep(500 * time.Millisecond)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		p.note("remove a deleted claim's finalizer", client.IgnoreNotFound(retry(ctx, func() error {
			return p.admin.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: name}}, patch)
		})))
		if pod != nil {
			p.h.ledger.PodDeleting(pod.Namespace, pod.Name)
			p.note("delete a finalized claim's pod", client.IgnoreNotFound(p.admin.Delete(ctx, pod, client.GracePeriodSeconds(0))))
		}
	})
	return true
}

// floodLines: a pipeline identity holds a lock with many short-lived fake
// lines, one after another (each claims, is granted, and is deleted once
// the next one waits behind it), while a victim line (a person's) holds now
// and then. The victim's memory must survive: the checker's
// line-memory-kept rule judges every version of the Lease, and after each
// hold of the victim line, and at the end, a build of it below its latest
// must not deploy (no-rollback).
func (p *people) floodLines(ctx context.Context) {
	ns, target := p.floodNS, p.floodTarget
	lines := 70 // more than the 64 records that flushed a line's memory before issue 21
	if p.h.o.long {
		lines = 200
	}
	type claimed struct {
		c    client.Client
		name string
	}
	var prev *claimed
	// claim creates a pod-less claim as c, ends the previous one, and waits
	// until the new one is granted or ended.
	claim := func(c client.Client, name, repo string, build int64) (buildlockv1.Phase, bool) {
		spec := buildlockv1.BuildLockSpec{Target: target, Repo: repo, Branch: "main", Build: build,
			Timestamp: micro(p.h.clock.Now()), ExpiresAfter: &metav1.Duration{Duration: 10 * time.Second}}
		p.h.ledger.WroteSpec(ns, name, spec)
		err := retry(ctx, func() error {
			err := c.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
			if apierrors.IsAlreadyExists(err) {
				return nil // an earlier try went through
			}
			return err
		})
		p.note("flood: claim", err)
		if prev != nil {
			p.h.ledger.RequestDelete(ns, prev.name)
			old := prev
			p.note("flood: release", client.IgnoreNotFound(retry(ctx, func() error {
				return old.c.Delete(context.WithoutCancel(ctx), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: old.name}})
			})))
			prev = nil
		}
		if err != nil {
			return "", false
		}
		prev = &claimed{c, name}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			phase, _, _ := p.h.check.Claim(ns, name)
			if p.h.check.Granted(ns, name) {
				return buildlockv1.PhaseHeld, true
			}
			if isTerminal(phase) {
				return phase, true
			}
			time.Sleep(20 * time.Millisecond)
		}
		phase, _, _ := p.h.check.Claim(ns, name)
		return phase, true
	}
	began := time.Now()
	held := 0
	victim := int64(100)
	late := newCounters() // what became of the victim's lower builds
	probes := 0
	probe := func() {
		probes++
		if phase, ok := claim(p.admin, fmt.Sprintf("victim-%d-late-%d", victim-1, probes), "victim/app", victim-1); ok {
			late.add(string(phase), 1)
		}
	}
	claim(p.admin, fmt.Sprintf("victim-%d", victim), "victim/app", victim)
	for i := 0; i < lines && ctx.Err() == nil; i++ {
		if phase, ok := claim(p.flood, fmt.Sprintf("flood-%d", i), fmt.Sprintf("flood/l-%d", i), 1); ok && phase == buildlockv1.PhaseHeld {
			held++
		}
		if i%20 == 19 {
			victim++ // the victim line deploys now and then
			claim(p.admin, fmt.Sprintf("victim-%d", victim), "victim/app", victim)
			probe()
		}
	}
	if ctx.Err() == nil {
		// Judged even if the run ends meanwhile: a grant would show within
		// seconds.
		ctx = context.WithoutCancel(ctx)
		probe()
	}
	if prev != nil {
		p.h.ledger.RequestDelete(ns, prev.name)
		_ = client.IgnoreNotFound(prev.c.Delete(context.WithoutCancel(ctx), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prev.name}}))
	}
	p.figure("flood: %d of %d fake lines of %s held in %s; the victim line's builds below its latest that held, claimed after each of its holds: %s",
		held, lines, floodAccount, time.Since(began).Round(time.Millisecond), late)
}
