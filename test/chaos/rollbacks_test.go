package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/testenv"
)

// Rollbacks and second workflows in the chaos workload (issue 22): a person
// and a pipeline roll lines back, on locks whose policies say Anyone,
// PeopleOnly and Nobody; and second workflows of the workload's repos and
// branches (spec.workflow) claim the same locks with their own, lower,
// build numbers, while the first workflow's builds go on. The checker
// judges them with the rest: a rollback goes below its line only where its
// policy allows its requester, is refused RollbackNotAllowed where not, and
// a line (workflow included) never deploys backwards otherwise.

const (
	// rollbackAccount is the pipeline identity that rolls back (a service
	// account of each workload namespace, impersonated).
	rollbackAccount = "rollback"
	// secondWorkflow is the spec.workflow of the second workflows.
	secondWorkflow = "nightly"
)

// rollbacksOf is the spec.rollbacks of the policy of the workload's i-th
// target: the targets with a policy of their own (see createNamespaces)
// take Anyone (unset), PeopleOnly and Nobody in turn; the others have no
// policy, or the enforcement's, and allow anyone.
func rollbacksOf(i int) buildlockv1.Rollbacks {
	if i%4 == 0 {
		return ""
	}
	return []buildlockv1.Rollbacks{"", buildlockv1.RollbacksPeopleOnly, buildlockv1.RollbacksNobody}[i%3]
}

// rollbacker sends the rollbacks and the second workflows, with its own
// seeded source so that the workload's stream stays as it was.
type rollbacker struct {
	h        *harness
	rng      *rand.Rand
	person   client.Client // the administrator, a person
	pipeline map[string]client.Client
	targets  []LockKey // the targets it claims: not the enforced ones
	settings map[LockKey]buildlockv1.Rollbacks
	builds   map[line]int64 // the next build of each second workflow
	seq      int

	mu     sync.Mutex
	sent   []sentClaim
	failed *counters
}

// sentClaim is a claim the rollbacker created, and how its outcome is
// counted: kind "rollback <setting> by <identity>" or "second workflow".
type sentClaim struct {
	ns, name, kind string
}

// setupRollbacks lets the rollback pipeline of every workload namespace
// create claims (RBAC), so that what refuses its rollbacks is the policy.
func (h *harness) setupRollbacks(ctx context.Context, enforced []LockKey) *rollbacker {
	r := &rollbacker{h: h, rng: rand.New(rand.NewPCG(h.o.seed, 0x726f6c6c6261636b)), person: h.c, pipeline: map[string]client.Client{},
		settings: map[LockKey]buildlockv1.Rollbacks{}, builds: map[line]int64{}, failed: newCounters()}
	for i, k := range h.targets {
		if !slices.Contains(enforced, k) {
			r.targets = append(r.targets, k)
			r.settings[k] = rollbacksOf(i)
		}
	}
	for _, ns := range h.namespaces {
		user := "system:serviceaccount:" + ns + ":" + rollbackAccount
		objs := []client.Object{
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chaos-rollback"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{"buildlocks"},
					Verbs: []string{"create", "get", "list", "watch", "delete"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chaos-rollback"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "chaos-rollback"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}},
		}
		for _, o := range objs {
			if err := h.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				h.t.Fatalf("rollbacks: creating %T %s: %v", o, o.GetName(), err)
			}
		}
		cfg := rest.CopyConfig(h.cp.balancedConfig())
		cfg.Timeout = 10 * time.Second
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
		c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
		if err != nil {
			h.t.Fatal(err)
		}
		r.pipeline[ns] = c
	}
	return r
}

// run sends a rollback or a second workflow's build every so often until
// ctx is done: each kind once first, then at random.
func (r *rollbacker) run(ctx context.Context, every time.Duration) {
	firsts := []func(context.Context) bool{
		r.secondWorkflowBuild, func(ctx context.Context) bool { return r.rollback(ctx, true) },
		r.secondWorkflowBuild, func(ctx context.Context) bool { return r.rollback(ctx, false) },
	}
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every/2 + time.Duration(r.rng.Int64N(int64(every)))):
		}
		if len(firsts) > 0 {
			if firsts[0](ctx) {
				firsts = firsts[1:]
			}
			continue
		}
		switch r.rng.IntN(3) {
		case 0:
			r.secondWorkflowBuild(ctx)
		default:
			r.rollback(ctx, r.rng.IntN(2) == 0)
		}
	}
}

// target draws a target whose live claims are below maxLive.
func (r *rollbacker) target() (LockKey, bool) {
	for range 3 {
		k := r.targets[r.rng.IntN(len(r.targets))]
		if r.h.check.LiveClaims(k) < maxLive {
			return k, true
		}
	}
	return LockKey{}, false
}

// rollback: a person (byPerson) or the namespace's rollback pipeline rolls
// a line of a target back below the latest build of it that held. It
// reports whether there was a line to roll back.
func (r *rollbacker) rollback(ctx context.Context, byPerson bool) bool {
	k, ok := r.target()
	if !ok {
		return false
	}
	var lines []HeldLine
	for _, l := range r.h.check.LinesHeld(k) {
		if l.Build >= 2 {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return false
	}
	l := lines[r.rng.IntN(len(lines))]
	build := max(1, l.Build-1-int64(r.rng.IntN(3)))
	spec := buildlockv1.BuildLockSpec{Target: k.Target, Repo: l.Repo, Branch: l.Branch, Workflow: l.Workflow, Build: build,
		Rollback: &buildlockv1.Rollback{Reason: fmt.Sprintf("INC-%d: build %d breaks checkout", 4700+r.rng.IntN(100), l.Build)}}
	c, who := r.person, "a person"
	if !byPerson {
		c, who = r.pipeline[k.Namespace], "a pipeline"
	}
	setting := r.settings[k]
	if setting == "" {
		setting = buildlockv1.RollbacksAnyone
	}
	r.create(ctx, c, k.Namespace, "rollback", spec, fmt.Sprintf("rollbacks %s, by %s", setting, who))
	return true
}

// secondWorkflowBuild: the next build of the second workflow of a line that
// held a target (its own numbers, from 1: below the first workflow's).
func (r *rollbacker) secondWorkflowBuild(ctx context.Context) bool {
	k, ok := r.target()
	if !ok {
		return false
	}
	var lines []HeldLine
	for _, l := range r.h.check.LinesHeld(k) {
		if l.Workflow == "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return false
	}
	l := lines[r.rng.IntN(len(lines))]
	second := line{l.Repo, l.Branch, secondWorkflow}
	r.builds[second]++
	spec := buildlockv1.BuildLockSpec{Target: k.Target, Repo: l.Repo, Branch: l.Branch, Workflow: secondWorkflow, Build: r.builds[second]}
	r.create(ctx, r.person, k.Namespace, "wf2", spec, "second workflow")
	return true
}

// create sends a pod-less claim (it expires 10–20 s after its grant; the
// rollbacker never renews it), recorded in the ledger first.
func (r *rollbacker) create(ctx context.Context, c client.Client, ns, prefix string, spec buildlockv1.BuildLockSpec, kind string) {
	r.seq++
	name := fmt.Sprintf("%s-%s-%s-%d-%d", prefix, strings.ReplaceAll(spec.Repo, "/", "-"), spec.Branch, spec.Build, r.seq)
	spec.ExpiresAfter = &metav1.Duration{Duration: time.Duration(10+r.rng.IntN(11)) * time.Second}
	spec.Timestamp = micro(r.h.clock.Now())
	r.h.ledger.WroteSpec(ns, name, spec)
	err := retry(ctx, func() error {
		err := c.Create(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
		if apierrors.IsAlreadyExists(err) {
			return nil // an earlier try went through
		}
		return err
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if res := r.h.classify(ctx, err); res.class != callStopped {
			r.failed.add(kind+": "+res.why, 1)
		}
		return
	}
	r.sent = append(r.sent, sentClaim{ns: ns, name: name, kind: kind})
}

// figures counts, per kind, the claims sent, granted (the grant Lease named
// them), refused as rollbacks (RollbackNotAllowed), and otherwise ended or
// still live.
func (r *rollbacker) figures() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type outcome struct{ sent, granted, refused, other int }
	byKind := map[string]*outcome{}
	var kinds []string
	for _, s := range r.sent {
		o := byKind[s.kind]
		if o == nil {
			o = &outcome{}
			byKind[s.kind] = o
			kinds = append(kinds, s.kind)
		}
		o.sent++
		_, reason, granted, _ := r.h.check.ClaimEnd(s.ns, s.name)
		switch {
		case granted:
			o.granted++
		case reason == buildlockv1.ReasonRollbackNotAllowed:
			o.refused++
		default:
			o.other++
		}
	}
	slices.Sort(kinds)
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		o := byKind[k]
		parts = append(parts, fmt.Sprintf("%s: %d sent, %d granted, %d refused RollbackNotAllowed, %d neither", k, o.sent, o.granted, o.refused, o.other))
	}
	return fmt.Sprintf("rollbacks and second workflows: %s; failed to send: %s", strings.Join(parts, "; "), r.failed)
}

// requesterVerification is the checker's view of which claims' requesters
// the operator verifies: none without the enforcement policies; else those
// created the operator's RequesterSettle after the requester policy (and
// its binding), which were created between installing and installed. A
// creationTimestamp has whole seconds: a second either side is uncertain.
func requesterVerification(enforced bool, installing, installed time.Time) func(time.Time) (verified, certain bool) {
	settle := controller.DefaultOptions().RequesterSettle
	from, to := installing.Add(settle-time.Second), installed.Add(settle+time.Second)
	return func(created time.Time) (bool, bool) {
		switch {
		case !enforced || created.Before(from):
			return false, true
		case created.After(to):
			return true, true
		}
		return false, false
	}
}
