package lock

// The tests in this file run against a real API server and etcd
// (internal/testenv: envtest with the CRDs of config/crd/bases), without an
// operator: where a test needs a verdict, it writes the claim's status
// itself, as the operator would. The server starts on the first test that
// needs it and stops in TestMain.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the API server: %v\n", err)
		}
	}
	os.Exit(code)
}

var (
	serverOnce sync.Once
	serverErr  error
	server     *testenv.Environment
	serverCfg  *rest.Config
)

// apiServer starts the API server once and returns a direct client to it
// and a namespace of the test's own.
func apiServer(t *testing.T) (client.WithWatch, string) {
	t.Helper()
	serverOnce.Do(func() {
		if server, serverErr = testenv.New(); serverErr != nil {
			return
		}
		serverCfg, serverErr = server.Start()
	})
	if serverErr != nil {
		t.Fatalf("starting the API server (run `make envtest` to build bin/k8s): %v", serverErr)
	}
	c, err := NewClient(serverCfg)
	must(t, err)
	ns := "lock-" + utilrand.String(6)
	must(t, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	return c, ns
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTheAPIServerAgreesWithValidate sends every validation case to the API
// server (a dry-run create) and checks that it accepts exactly the claims
// Validate accepts, and refuses the others as invalid.
func TestTheAPIServerAgreesWithValidate(t *testing.T) {
	c, ns := apiServer(t)
	for name, tc := range validationCases {
		t.Run(name, func(t *testing.T) {
			claim := validClaim
			tc.change(&claim)
			claim.Namespace = ns
			clientErr := claim.Validate()
			apiErr := c.Create(context.Background(), claim.BuildLock(), client.DryRunAll)
			switch {
			case clientErr == nil && apiErr != nil:
				t.Errorf("Validate accepts the claim; the API server refuses it: %v", apiErr)
			case clientErr != nil && apiErr == nil:
				t.Errorf("the API server accepts the claim; Validate refuses it: %v", clientErr)
			case apiErr != nil && !apierrors.IsInvalid(apiErr):
				t.Errorf("the API server refuses the claim for another reason than its content: %v", apiErr)
			}
		})
	}
}

// setStatus writes bl's status as the operator would.
func setStatus(t *testing.T, c client.Client, bl *buildlockv1.BuildLock, s buildlockv1.BuildLockStatus) {
	t.Helper()
	ctx := context.Background()
	for {
		must(t, c.Get(ctx, client.ObjectKeyFromObject(bl), bl))
		bl.Status = s
		err := c.Status().Update(ctx, bl)
		if !apierrors.IsConflict(err) {
			must(t, err)
			return
		}
	}
}

func held(token int64) buildlockv1.BuildLockStatus {
	now := metav1Now()
	return buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseHeld, Reason: buildlockv1.ReasonAcquired, FencingToken: token, AcquiredAt: &now}
}

func queued(ago time.Duration, ahead string) buildlockv1.BuildLockStatus {
	at := metav1Now()
	at.Time = at.Add(-ago)
	return buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseWaiting, Reason: buildlockv1.ReasonQueued, QueuedAt: &at,
		Message: "Queued behind " + ahead + "."}
}

// create creates the claim of build of repo on staging in ns, by run.
func create(t *testing.T, c client.Client, ns, repo string, build int64, run string) *buildlockv1.BuildLock {
	t.Helper()
	bl := Claim{Namespace: ns, Target: "staging", Repo: repo, Branch: "main", Build: build, RunID: run}.BuildLock()
	must(t, c.Create(context.Background(), bl))
	return bl
}

func TestStatusReadsPoliciesAndTheQueue(t *testing.T) {
	c, ns := apiServer(t)
	ctx := context.Background()
	shop := create(t, c, ns, "acme/shop", 41, "1")
	setStatus(t, c, shop, held(5))
	api := create(t, c, ns, "acme/api", 3, "2")
	setStatus(t, c, api, queued(4*time.Minute, shop.Name))
	web := create(t, c, ns, "acme/web", 7, "3")
	setStatus(t, c, web, queued(2*time.Minute, api.Name))
	create(t, c, ns, "acme/docs", 1, "4") // Pending: the operator has not decided yet
	must(t, c.Create(ctx, &buildlockv1.BuildLockPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"},
		Spec:       buildlockv1.BuildLockPolicySpec{Ordering: buildlockv1.OrderingQueue},
	}))

	for _, target := range []string{"", "staging"} {
		locks, err := Status(ctx, c, ns, target)
		must(t, err)
		if len(locks) != 1 {
			t.Fatalf("Status(%q) = %d locks, want 1", target, len(locks))
		}
		l := locks[0]
		var queue []string
		for _, q := range l.Queue {
			queue = append(queue, fmt.Sprintf("%d:%s", q.Position, q.Repo))
		}
		if l.Ordering != buildlockv1.OrderingQueue || l.Holder == nil || l.Holder.Name != shop.Name || l.Holder.FencingToken != 5 ||
			!slices.Equal(queue, []string{"1:acme/api", "2:acme/web", "3:acme/docs"}) || len(l.Claims) != 4 {
			t.Errorf("Status(%q) = ordering %s, holder %+v, queue %v, %d claims", target, l.Ordering, l.Holder, queue, len(l.Claims))
		}
	}
	if locks, err := Status(ctx, c, ns, "prod"); err != nil || len(locks) != 0 {
		t.Errorf("Status(prod) = %v, %v; want no lock", locks, err)
	}

	// A reader without rights on policies still sees the locks.
	user, err := server.AddUser(envtest.User{Name: "claims-only-" + ns}, nil)
	must(t, err)
	must(t, grant(ctx, ns, "claims-only-"+ns, "buildlocks"))
	reader, err := NewClient(user.Config())
	must(t, err)
	var warnings []error
	locks, err := Status(ctx, reader, ns, "staging", WithErrorHandler(func(err error) { warnings = append(warnings, err) }))
	must(t, err)
	if len(locks) != 1 || locks[0].Ordering != "" || len(warnings) != 2 || !apierrors.IsForbidden(warnings[0]) || !apierrors.IsForbidden(warnings[1]) {
		t.Errorf("without rights on policies and Leases: %d locks, ordering %q, warnings %v", len(locks), locks[0].Ordering, warnings)
	}
}

// TestStatusShowsTheAuditThatOutlivesTheClaims: the grant Lease's audit of
// force-releases, rollbacks and overrides comes with its lock's summary, and
// a lock whose claims are all gone is summarized for it.
func TestStatusShowsTheAuditThatOutlivesTheClaims(t *testing.T) {
	c, ns := apiServer(t)
	ctx := context.Background()
	entries := []buildlockv1.AuditEntry{
		{Kind: buildlockv1.AuditForceRelease, At: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC), Name: "shop-42", Repo: "acme/shop",
			Branch: "main", Build: 42, Token: 7, By: "alice@example.com", Reason: "alice@example.com: the deploy hangs"},
		{Kind: buildlockv1.AuditRollback, At: time.Date(2026, 3, 2, 9, 5, 0, 0, time.UTC), Name: "shop-41", Repo: "acme/shop",
			Branch: "main", Build: 41, Token: 8, Reason: "INC-7", From: 42},
	}
	data, err := json.Marshal(entries)
	must(t, err)
	for _, target := range []string{"staging", "prod"} {
		must(t, c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: buildlockv1.GrantLeaseName(target),
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": target},
			Annotations: map[string]string{buildlockv1.AuditAnnotation: string(data)}}}))
	}
	create(t, c, ns, "acme/shop", 43, "1")
	for _, target := range []string{"", "staging"} {
		locks, err := Status(ctx, c, ns, target)
		must(t, err)
		want := map[string]int{"staging": 1, "prod": 0} // prod has no claim left; its audit stays
		if target == "staging" {
			want = map[string]int{"staging": 1}
		}
		if len(locks) != len(want) {
			t.Fatalf("Status(%q) = %+v, want the locks %v", target, locks, want)
		}
		for _, l := range locks {
			if claims, ok := want[l.Target]; !ok || len(l.Claims) != claims || len(l.Audit) != 2 || l.Audit[1].From != 42 || l.Audit[0].By != "alice@example.com" {
				t.Errorf("Status(%q): %s with %d claims and audit %+v", target, l.Target, len(l.Claims), l.Audit)
			}
		}
	}
}

func metav1Now() metav1.MicroTime { return metav1.NewMicroTime(time.Now()) }

// grant gives user get, list and watch on resource of buildlock.io in ns.
func grant(ctx context.Context, ns, user, resource string) error {
	c, err := client.New(serverCfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return err
	}
	return errors.Join(
		c.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{resource}, Verbs: []string{"get", "list", "watch"}}},
		}),
		c.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
		}),
	)
}

// TestAcquireFollowsItsPlaceAndTheRunsOfItsBuild drives one acquisition by
// hand: its place in a queue as the claims ahead leave, a second run of the
// same build refused while the first waits, the hold, and the hold lost to
// a force-release.
func TestAcquireFollowsItsPlaceAndTheRunsOfItsBuild(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shop := create(t, c, ns, "acme/shop", 41, "1")
	setStatus(t, c, shop, held(5))
	api := create(t, c, ns, "acme/api", 3, "2")
	setStatus(t, c, api, queued(4*time.Minute, shop.Name))

	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: "run-1"}
	places := make(chan Place, 10)
	type result struct {
		h   *Hold
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := AcquireHold(ctx, c, claim, WithObserver(func(ev Event) {
			if ev.Place != nil {
				places <- *ev.Place
			}
		}))
		done <- result{h, err}
	}()
	nextPlace := func(want Place) {
		t.Helper()
		select {
		case got := <-places:
			if got != want {
				t.Errorf("place %+v, want %+v", got, want)
			}
		case r := <-done:
			t.Fatalf("AcquireHold returned %v, %v while it should wait", r.h, r.err)
		case <-ctx.Done():
			t.Fatalf("no place %+v", want)
		}
	}
	web := &buildlockv1.BuildLock{}
	web.Namespace, web.Name = ns, Name(claim)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(web), web) == nil })
	if RunIDOf(web) != "run-1" {
		t.Errorf("the claim's run id is %q, want run-1", RunIDOf(web))
	}
	setStatus(t, c, web, queued(0, api.Name))
	nextPlace(Place{Position: 2, Waiting: 2, Ahead: api.Name, Holder: shop.Name, Token: 5})
	must(t, c.Delete(ctx, api))
	nextPlace(Place{Position: 1, Waiting: 1, Holder: shop.Name, Token: 5})

	// Another run of build 7 is refused while this one waits.
	rerun := claim
	rerun.RunID = "run-2"
	_, err := AcquireHold(ctx, c, rerun)
	var other *ClaimedByAnotherRunError
	if !errors.As(err, &other) || other.BuildLock.Name != web.Name || RunIDOf(other.BuildLock) != "run-1" || other.SameRunID() {
		t.Errorf("a second run: %v, want ErrClaimedByAnotherRun naming %s", err, web.Name)
	}

	operatorGrant(t, c, ns, "staging", web, 6)
	setStatus(t, c, web, held(6))
	r := <-done
	must(t, r.err)
	if r.h.Token != 6 || r.h.UID != web.UID {
		t.Errorf("hold %+v, want token 6 on %s", r.h, web.UID)
	}

	lost := make(chan error, 1)
	go func() { lost <- r.h.WaitLost(ctx) }()
	holdCtx, stop := r.h.Context(ctx)
	defer stop()
	s := held(6)
	s.Phase, s.Reason, s.Message = buildlockv1.PhaseReleased, buildlockv1.ReasonForceReleased, "alice: stuck"
	setStatus(t, c, web, s)
	var lostErr *LostError
	if err := <-lost; !errors.As(err, &lostErr) || lostErr.Reason != buildlockv1.ReasonForceReleased {
		t.Errorf("WaitLost() = %v, want a LostError with reason ForceReleased", err)
	}
	<-holdCtx.Done()
	if cause := context.Cause(holdCtx); !errors.Is(cause, ErrLost) {
		t.Errorf("the hold's context ended with %v, want ErrLost", cause)
	}
	must(t, r.h.Release(ctx))
	if err := c.Get(ctx, client.ObjectKeyFromObject(web), &buildlockv1.BuildLock{}); !apierrors.IsNotFound(err) {
		t.Errorf("after Release, reading the claim: %v, want NotFound", err)
	}
}

// TestAnotherRunsFinishedClaimIsReplaced checks that a run takes over the
// name of a finished claim of its build left by another run, deleting
// exactly the version it read.
func TestAnotherRunsFinishedClaimIsReplaced(t *testing.T) {
	c, ns := apiServer(t)
	ctx := context.Background()
	first := create(t, c, ns, "acme/shop", 8, "run-1")
	setStatus(t, c, first, buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseSuperseded, Reason: buildlockv1.ReasonDuplicateBuild})

	var replaced []*buildlockv1.BuildLock
	o := newOptions([]Option{WithObserver(func(ev Event) {
		if ev.Type == EventReplaced {
			replaced = append(replaced, ev.BuildLock)
		}
	})})
	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 8, RunID: "run-2"}
	bl, attached, err := createOrAttach(ctx, c, claim, &proof{}, o)
	must(t, err)
	if attached || bl.UID == first.UID || bl.Name != first.Name || RunIDOf(bl) != "run-2" {
		t.Errorf("claimed %s/%s (uid %s, run %q, attached %v), want a new claim of run-2 under %s", bl.Namespace, bl.Name, bl.UID, RunIDOf(bl), attached, first.Name)
	}
	if len(replaced) != 1 || replaced[0].UID != first.UID {
		t.Errorf("replaced %v, want the first run's claim", replaced)
	}

	// A delete guarded by an old resourceVersion does not happen.
	stale := bl.DeepCopy()
	must(t, Renew(ctx, c, bl))
	if _, err := deleteClaim(ctx, c, stale, true); !apierrors.IsConflict(err) {
		t.Errorf("deleting a changed claim by its old version: %v, want a conflict", err)
	}
	if c.Get(ctx, client.ObjectKeyFromObject(bl), &buildlockv1.BuildLock{}) != nil {
		t.Error("the claim was deleted although it changed")
	}
}

// waitFor polls cond every 20ms for up to 30s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAcquireLearnsItsGrantFromTheLease checks that a claim holds as soon as
// its lock's grant Lease names it (name and UID), before its status says
// so, that a grant to another claim of the same name does not count, and
// that a hold learned that way is not lost while its status catches up.
func TestAcquireLearnsItsGrantFromTheLease(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: "run-1"}
	type result struct {
		h   *Hold
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := AcquireHold(ctx, c, claim)
		done <- result{h, err}
	}()
	web := &buildlockv1.BuildLock{}
	web.Namespace, web.Name = ns, Name(claim)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(web), web) == nil })

	deleted := web.DeepCopy()
	deleted.UID = "a-deleted-claim-of-that-name"
	operatorGrant(t, c, ns, "staging", deleted, 8)
	select {
	case r := <-done:
		t.Fatalf("AcquireHold returned %+v, %v on a grant to another claim of its name", r.h, r.err)
	case <-time.After(time.Second):
	}

	operatorGrant(t, c, ns, "staging", web, 9)
	r := <-done
	must(t, r.err)
	if r.h.Token != 9 || r.h.UID != web.UID {
		t.Errorf("hold %+v, want token 9 on %s", r.h, web.UID)
	}
	if phase := r.h.BuildLock.Status.Phase; phase.IsTerminal() || phase == buildlockv1.PhaseHeld {
		t.Errorf("the hold's claim shows %q; this test never wrote its status", phase)
	}

	lost := make(chan error, 1)
	go func() { lost <- r.h.WaitLost(ctx) }()
	setStatus(t, c, web, queued(0, "nobody"))
	setStatus(t, c, web, held(9))
	select {
	case err := <-lost:
		t.Fatalf("WaitLost() = %v while the status caught up with the grant", err)
	case <-time.After(time.Second):
	}
	s := held(9)
	s.Phase, s.Reason = buildlockv1.PhaseReleased, buildlockv1.ReasonLockLost
	setStatus(t, c, web, s)
	var lostErr *LostError
	if err := <-lost; !errors.As(err, &lostErr) || lostErr.Reason != buildlockv1.ReasonLockLost {
		t.Errorf("WaitLost() = %v, want a LostError with reason LockLost", err)
	}
	must(t, r.h.Release(ctx))
}

// TestAcquireWithoutLeaseRights checks that a pipeline whose role does not
// let it read Leases still acquires, from its claim's status, and is told
// once why it learns later.
func TestAcquireWithoutLeaseRights(t *testing.T) {
	admin, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user := "pipeline-without-leases"
	rbac, err := client.New(serverCfg, client.Options{Scheme: testenv.Scheme()})
	must(t, err)
	must(t, errors.Join(
		rbac.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{"buildlocks"},
				Verbs: []string{"create", "delete", "get", "list", "patch", "watch"}}},
		}),
		rbac.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
		}),
	))
	cfg := rest.CopyConfig(serverCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := NewClient(cfg)
	must(t, err)

	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: "run-1"}
	var (
		mu   sync.Mutex
		errs []error
	)
	done := make(chan error, 1)
	var hold *Hold
	go func() {
		var err error
		hold, err = AcquireHold(ctx, c, claim, WithErrorHandler(func(err error) {
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
		}))
		done <- err
	}()
	web := &buildlockv1.BuildLock{}
	web.Namespace, web.Name = ns, Name(claim)
	waitFor(t, func() bool { return admin.Get(ctx, client.ObjectKeyFromObject(web), web) == nil })
	setStatus(t, admin, web, held(3))
	must(t, <-done)
	if hold.Token != 3 {
		t.Errorf("hold %+v, want token 3", hold)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1 || !apierrors.IsForbidden(errs[0]) {
		t.Errorf("errors reported: %v, want one saying that Leases may not be read", errs)
	}
	must(t, hold.Release(ctx))
}

// TestAClaimIsReusedOnlyByTheJobThatMadeIt runs one job's acquisitions of
// one claim, and another job's that computes the same run id: a second
// process of the job is refused while the first works on the claim, the
// other job is refused whatever it computes, the job's restart after its
// process died attaches, a claim handed over to the job's later steps is
// not taken again, and only the job's own release deletes it.
func TestAClaimIsReusedOnlyByTheJobThatMadeIt(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job := Claim{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: "5005-1", StateDir: t.TempDir()}
	otherJob := job
	otherJob.StateDir = t.TempDir()
	type result struct {
		h   *Hold
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := AcquireHold(ctx, c, job)
		done <- result{h, err}
	}()
	web := &buildlockv1.BuildLock{}
	web.Namespace, web.Name = ns, Name(job)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(web), web) == nil })

	var other *ClaimedByAnotherRunError
	if _, err := AcquireHold(ctx, c, job); !errors.As(err, &other) || other.Busy == "" || !other.SameRunID() {
		t.Errorf("a second process of the job while the first waits: %v, want ErrClaimedByAnotherRun, busy", err)
	}
	if _, err := AcquireHold(ctx, c, otherJob); !errors.As(err, &other) || other.BuildLock == nil || other.BuildLock.UID != web.UID || !other.SameRunID() {
		t.Errorf("another job with the same run id: %v, want ErrClaimedByAnotherRun naming %s", err, web.Name)
	}
	var list buildlockv1.BuildLockList
	must(t, c.List(ctx, &list, client.InNamespace(ns)))
	if len(list.Items) != 1 {
		t.Errorf("%d claims, want the first process's alone", len(list.Items))
	}

	setStatus(t, c, web, held(4))
	r := <-done
	must(t, r.err)
	// The process dies: its renewals stop and the kernel frees its proof.
	r.h.renewer.stop()
	r.h.proof.close()
	var attached bool
	again, err := AcquireHold(ctx, c, job, WithObserver(func(ev Event) { attached = attached || ev.Type == EventAttached }))
	must(t, err)
	if !attached || again.UID != web.UID || again.Token != 4 {
		t.Errorf("the job's restart: attached %v to %s with token %d, want its claim %s with token 4", attached, again.UID, again.Token, web.UID)
	}
	if _, err := AcquireHold(ctx, c, otherJob); !errors.As(err, &other) || !other.SameRunID() {
		t.Errorf("another job with the same run id, after the restart: %v, want ErrClaimedByAnotherRun", err)
	}

	must(t, again.Detach())
	if _, err := AcquireHold(ctx, c, job); !errors.As(err, &other) || !other.HandedOver {
		t.Errorf("an acquire after the claim was handed over: %v, want ErrClaimedByAnotherRun, handed over", err)
	}
	ref := BuildRef{Namespace: ns, Target: "staging", Repo: "acme/web", Branch: "main", Build: 7, RunID: job.RunID}
	ref.StateDir = otherJob.StateDir
	released, others, err := ReleaseBuild(ctx, c, ref)
	must(t, err)
	if len(released) != 0 || len(others) != 1 {
		t.Errorf("the other job's release: released %d, left %d; want the claim left", len(released), len(others))
	}
	ref.StateDir = job.StateDir
	released, _, err = ReleaseBuild(ctx, c, ref)
	must(t, err)
	if len(released) != 1 || released[0].BuildLock.UID != web.UID {
		t.Errorf("the job's release: released %v, want its claim", released)
	}
	if _, err := os.Stat(proofPath(job.StateDir, job)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released claim's proof is still there: %v", err)
	}
}

// TestAClaimThatIsNotThisJobsTakesNoName: claims created under this
// build's name by others (another build's; another identity's, of this
// very build; and every name a client could derive) do not keep it out: it
// claims under a name nobody could predict, and finds that claim again
// through its proof. The same build's live claim by the same identity is
// another run of it, refused.
func TestAClaimThatIsNotThisJobsTakesNoName(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	me := whoAmI(ctx, c)
	if me == "" {
		t.Fatal("the API server does not say who the test is")
	}
	victim := Claim{Namespace: ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "9-1", StateDir: t.TempDir()}
	// squat creates a claim under the victim's name, as requester (the
	// API server stamps spec.requester with who creates it).
	squat := func(spec Claim, requester string) *buildlockv1.BuildLock {
		bl := spec.BuildLock()
		bl.Name = Name(victim)
		as := c
		if requester != "" && requester != me {
			cfg := rest.CopyConfig(serverCfg)
			// With the rights of the administrator that creates it here.
			cfg.Impersonate = rest.ImpersonationConfig{UserName: requester, Groups: []string{"system:masters", "system:authenticated"}}
			impersonated, err := NewClient(cfg)
			must(t, err)
			as = impersonated
		}
		must(t, as.Create(ctx, bl))
		setStatus(t, c, bl, queued(0, "nobody"))
		return bl
	}
	claimed := func() (*buildlockv1.BuildLock, []EventType) {
		t.Helper()
		var events []EventType
		bl, attached, err := createOrAttach(ctx, c, victim, &proof{}, newOptions([]Option{WithObserver(func(ev Event) { events = append(events, ev.Type) })}))
		if err != nil || attached {
			t.Fatalf("createOrAttach: %v (attached %v), want a claim of its own", err, attached)
		}
		return bl, events
	}

	another := squat(Claim{Namespace: ns, Target: "staging", Repo: "evil/thing", Branch: "main", Build: 1}, "")
	bl, events := claimed()
	if bl.Name == another.Name || !strings.HasPrefix(bl.Name, Name(victim)+"-") || !slices.Equal(events, []EventType{EventNameTaken}) {
		t.Errorf("with another build under its name: claimed %s (events %v), want a fallback name and NameTaken", bl.Name, events)
	}
	must(t, c.Delete(ctx, bl))
	must(t, c.Delete(ctx, another))

	identity := squat(victim, "system:serviceaccount:"+ns+":squatter")
	bl, _ = claimed()
	if bl.Name == identity.Name || RunIDOf(bl) != victim.RunID {
		t.Errorf("with another identity's claim of this build under its name: claimed %s, want a claim of its own", bl.Name)
	}
	must(t, c.Delete(ctx, bl))
	must(t, c.Delete(ctx, identity))

	rerun := victim
	rerun.RunID = "9-2"
	mine := squat(rerun, me)
	var other *ClaimedByAnotherRunError
	if _, _, err := createOrAttach(ctx, c, victim, &proof{}, newOptions(nil)); !errors.As(err, &other) || other.BuildLock.UID != mine.UID {
		t.Errorf("with this identity's claim of another run of this build: %v, want ErrClaimedByAnotherRun", err)
	}
	must(t, c.Delete(ctx, mine))

	// A restart finds its claim under its fallback name through its proof.
	squat(Claim{Namespace: ns, Target: "staging", Repo: "evil/thing", Branch: "main", Build: 1}, "")
	p, err := openProof(victim)
	must(t, err)
	first, _, err := createOrAttach(ctx, c, victim, p, newOptions(nil))
	must(t, err)
	p.close()
	p, err = openProof(victim)
	must(t, err)
	defer p.close()
	found, attached, err := createOrAttach(ctx, c, victim, p, newOptions(nil))
	must(t, err)
	if !attached || found.UID != first.UID || found.Name == Name(victim) {
		t.Errorf("the restart: attached %v to %s (%s), want its claim under its fallback name %s", attached, found.Name, found.UID, first.Name)
	}
}

// TestReleaseBuildProvesAClaimOfAnyName: the job's release finds the proof
// of its claim whatever name the claim took (an explicit one, here), since
// it knows the build and the run, not the name.
func TestReleaseBuildProvesAClaimOfAnyName(t *testing.T) {
	c, ns := apiServer(t)
	ctx := context.Background()
	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 3, RunID: "7-1", Name: "my-lock", StateDir: t.TempDir()}
	p, err := openProof(claim)
	must(t, err)
	bl, _, err := createOrAttach(ctx, c, claim, p, newOptions(nil))
	must(t, err)
	p.close()
	released, others, err := ReleaseBuild(ctx, c, BuildRef{Namespace: ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 3,
		RunID: claim.RunID, StateDir: claim.StateDir})
	must(t, err)
	if len(released) != 1 || released[0].BuildLock.UID != bl.UID || len(others) != 0 {
		t.Errorf("released %v, left %v; want my-lock released", released, others)
	}
}

// TestAWaitingClaimIsRenewedOnlyOnceGranted checks that a pod-less claim's
// spec.renewTime is not bumped while it waits (each bump is a status write
// for the operator), and is once the grant names it.
func TestAWaitingClaimIsRenewedOnlyOnceGranted(t *testing.T) {
	c, ns := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim := Claim{Namespace: ns, Target: "staging", Repo: "acme/cli", Branch: "main", Build: 3, RunID: "run-1"}
	done := make(chan error, 1)
	go func() {
		h, err := AcquireHold(ctx, c, claim, WithRenewInterval(50*time.Millisecond))
		if err == nil {
			defer func() { _ = h.Release(context.WithoutCancel(ctx)) }()
			<-ctx.Done()
		}
		done <- err
	}()
	bl := &buildlockv1.BuildLock{}
	bl.Namespace, bl.Name = ns, Name(claim)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(bl), bl) == nil })
	time.Sleep(time.Second) // twenty renew intervals, waiting
	must(t, c.Get(ctx, client.ObjectKeyFromObject(bl), bl))
	if bl.Spec.RenewTime != nil || bl.Generation != 1 {
		t.Fatalf("a waiting claim was renewed: renewTime %v, generation %d", bl.Spec.RenewTime, bl.Generation)
	}

	operatorGrant(t, c, ns, "staging", bl, 1)
	waitFor(t, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(bl), bl) == nil && bl.Spec.RenewTime != nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
