package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

const (
	namespace = "demo"
	target    = "staging"
	// queueNamespace is where the second act's three apps take turns.
	queueNamespace = "apps"
)

// want is what a claim's status must show after a step. Zero fields are not
// checked.
type want struct {
	phase        buildlockv1.Phase
	reason       string
	holder       string
	waiting      string
	supersededBy string
	token        int64
}

// demo is one run of the scenario against a local control plane.
type demo struct {
	ns      string // the namespace of the claims of the current act
	out     io.Writer
	c       *localcluster.Cluster
	client  client.Client // direct, uncached: every read sees the API server's latest state
	timeout time.Duration
	step    int
}

// run starts a local control plane and the operator, and plays the scenario,
// narrating to out. It returns an error naming the first step whose expected
// state was not observed within timeout.
func run(ctx context.Context, out io.Writer, timeout time.Duration) (err error) {
	c, err := localcluster.Start(localcluster.Options{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Stop()) }()

	// The operator's defaults: finished claims are kept for an hour, so that
	// the last table still shows every build.
	m, err := testenv.StartManager(ctx, c.Config, testenv.DefaultManagerOptions())
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := m.Stop(); stopErr != nil && !errors.Is(stopErr, context.Canceled) {
			err = errors.Join(err, fmt.Errorf("stopping the operator: %w", stopErr))
		}
	}()

	cl, err := client.New(c.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	d := &demo{ns: namespace, out: out, c: c, client: cl, timeout: timeout}
	if err := d.play(ctx); err != nil {
		return err
	}
	if err := d.enforce(ctx); err != nil {
		return err
	}
	if err := d.queue(ctx); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "\nDemo passed: every step's expected state was observed.\n")
	return nil
}

func (d *demo) play(ctx context.Context) error {
	d.say("A local control plane and the buildlock operator are running. Three pipeline runs of two\n"+
		"repositories will take turns deploying into %q; each run creates a BuildLock in namespace %q\n"+
		"and deploys only while its claim is Held. There is no kubelet here, so the demo sets each\n"+
		"pipeline pod's phase itself.", target, namespace)
	if err := d.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}

	// Step 1: a free lock is granted at once, with the first fencing token.
	d.begin("Build 41 of acme/shop@main starts and asks for staging; the lock is free.")
	if err := d.startBuild(ctx, "shop-main-41", "acme/shop", 41); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseHeld, reason: buildlockv1.ReasonAcquired, holder: "shop-main-41", token: 1},
	}); err != nil {
		return err
	}

	// Step 2: another repository's build takes the single waiting slot.
	d.begin("Build 7 of acme/web@main asks for staging while shop #41 deploys: it waits.")
	if err := d.startBuild(ctx, "web-main-7", "acme/web", 7); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseHeld, holder: "shop-main-41", token: 1},
		"web-main-7":   {phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonWaitingForHolder, holder: "shop-main-41", waiting: "web-main-7"},
	}); err != nil {
		return err
	}

	// Step 3: a newer build of the waiting line replaces the older waiter.
	d.begin("Build 8 of acme/web@main arrives: deploying #7 after #8 exists would be wasted work,\n" +
		"so #8 takes the waiting slot and #7 is superseded (its pipeline stops without deploying).\n" +
		"The holder is never pre-empted.")
	if err := d.startBuild(ctx, "web-main-8", "acme/web", 8); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseHeld, holder: "shop-main-41", token: 1},
		"web-main-7":   {phase: buildlockv1.PhaseSuperseded, reason: buildlockv1.ReasonSupersededByNewerBuild, supersededBy: "web-main-8"},
		"web-main-8":   {phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonWaitingForHolder, holder: "shop-main-41", waiting: "web-main-8"},
	}); err != nil {
		return err
	}
	if err := d.showMessage(ctx, "web-main-7"); err != nil {
		return err
	}
	// The superseded pipeline exits; its claim stays Superseded.
	if err := d.setPodPhase(ctx, "web-main-7", corev1.PodSucceeded); err != nil {
		return err
	}

	// Step 4: the holder's pod ends, and the waiter takes over with the next
	// fencing token.
	d.begin("Build 41 has deployed and its pipeline pod Succeeds: the lock passes to web #8\n" +
		"with fencing token 2, which staging can use to refuse any late write from #41.")
	if err := d.setPodPhase(ctx, "shop-main-41", corev1.PodSucceeded); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseReleased, reason: buildlockv1.ReasonPodFinished},
		"web-main-7":   {phase: buildlockv1.PhaseSuperseded},
		"web-main-8":   {phase: buildlockv1.PhaseHeld, reason: buildlockv1.ReasonAcquired, holder: "web-main-8", token: 2},
	}); err != nil {
		return err
	}
	if err := d.showMessage(ctx, "web-main-8"); err != nil {
		return err
	}

	// Step 5: the last holder ends; the lock is free and keeps its token.
	d.begin("Build 8 has deployed and its pod Succeeds: staging is free again. The grant Lease keeps\n" +
		"the last fencing token, so the next build gets token 3.")
	if err := d.setPodPhase(ctx, "web-main-8", corev1.PodSucceeded); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseReleased},
		"web-main-7":   {phase: buildlockv1.PhaseSuperseded},
		"web-main-8":   {phase: buildlockv1.PhaseReleased, reason: buildlockv1.ReasonPodFinished, token: 2},
	}); err != nil {
		return err
	}
	if err := d.expectFreeLease(ctx, 2); err != nil {
		return err
	}
	return d.kubectl(ctx, "get", "leases", "-l", "buildlock.io/target="+target)
}

// startBuild creates a running pipeline pod and the BuildLock that names it,
// as a pipeline's first step would.
func (d *demo) startBuild(ctx context.Context, name, repo string, build int64) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name, Labels: map[string]string{"app": "pipeline"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "pipeline", Image: "registry.example/" + repo + "/pipeline:" + fmt.Sprint(build)}},
		},
	}
	if err := d.client.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating pod %s: %w", name, err)
	}
	if err := d.setPodPhase(ctx, name, corev1.PodRunning); err != nil {
		return err
	}
	bl := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
		Spec: buildlockv1.BuildLockSpec{
			Target: target, Repo: repo, Branch: "main", Build: build,
			PodRef: &buildlockv1.PodReference{Name: name, UID: string(pod.UID)},
		},
	}
	if err := d.client.Create(ctx, bl); err != nil {
		return fmt.Errorf("creating BuildLock %s: %w", name, err)
	}
	fmt.Fprintf(d.out, "  created pod %s (Running) and BuildLock %s (%s@main #%d, target %s)\n", name, name, repo, build, target)
	return nil
}

// setPodPhase sets a pod's status.phase through the status subresource, as
// the kubelet would.
func (d *demo) setPodPhase(ctx context.Context, name string, phase corev1.PodPhase) error {
	pod := &corev1.Pod{}
	if err := d.client.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: name}, pod); err != nil {
		return fmt.Errorf("reading pod %s: %w", name, err)
	}
	pod.Status.Phase = phase
	if err := d.client.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting pod %s to %s: %w", name, phase, err)
	}
	if phase != corev1.PodRunning {
		fmt.Fprintf(d.out, "  pod %s is now %s\n", name, phase)
	}
	return nil
}

// expect waits until every named claim shows its wanted status, then prints
// the table. After the timeout it prints the table anyway and fails with the
// differences it saw last.
func (d *demo) expect(ctx context.Context, wants map[string]want) error {
	err := d.expectQuietly(ctx, wants)
	if kerr := d.kubectl(ctx, "get", "buildlocks", "-o", "wide"); kerr != nil {
		return errors.Join(err, kerr)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  ✓ step %d: %s\n", d.step, summary(wants))
	return nil
}

// expectQuietly waits as expect does, printing nothing.
func (d *demo) expectQuietly(ctx context.Context, wants map[string]want) error {
	var diffs []string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, d.timeout, true, func(ctx context.Context) (bool, error) {
		diffs = diffs[:0]
		for _, name := range sortedKeys(wants) {
			bl := &buildlockv1.BuildLock{}
			if err := d.client.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: name}, bl); err != nil {
				if apierrors.IsNotFound(err) {
					diffs = append(diffs, name+": not found")
					continue
				}
				return false, err
			}
			diffs = append(diffs, compare(name, &bl.Status, wants[name])...)
		}
		return len(diffs) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("step %d: the expected state was not observed within %s:\n  %s", d.step, d.timeout, strings.Join(diffs, "\n  "))
	}
	return nil
}

// expectFreeLease waits until the lock's grant Lease names no holder and
// keeps token as its leaseTransitions.
func (d *demo) expectFreeLease(ctx context.Context, token int64) error {
	var got string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, d.timeout, true, func(ctx context.Context) (bool, error) {
		lease := &coordinationv1.Lease{}
		if err := d.client.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: buildlockv1.GrantLeaseName(target)}, lease); err != nil {
			got = err.Error()
			return false, nil
		}
		got = fmt.Sprintf("holder %q, leaseTransitions %d", ptr.Deref(lease.Spec.HolderIdentity, ""), buildlockv1.GrantToken(lease))
		return ptr.Deref(lease.Spec.HolderIdentity, "") == "" && buildlockv1.GrantToken(lease) == token, nil
	})
	if err != nil {
		return fmt.Errorf("step %d: the grant Lease buildlock-%s should be free with leaseTransitions %d; it shows %s", d.step, target, token, got)
	}
	fmt.Fprintf(d.out, "  ✓ step %d: the grant Lease buildlock-%s is free, fencing token floor %d\n", d.step, target, token)
	return nil
}

func compare(name string, got *buildlockv1.BuildLockStatus, w want) []string {
	var diffs []string
	check := func(field string, got, want any, zero bool) {
		if !zero && got != want {
			diffs = append(diffs, fmt.Sprintf("%s: %s is %v, want %v", name, field, got, want))
		}
	}
	check("phase", got.Phase, w.phase, w.phase == "")
	check("reason", got.Reason, w.reason, w.reason == "")
	check("holder", got.Holder, w.holder, w.holder == "")
	check("waiting", got.Waiting, w.waiting, w.waiting == "")
	check("supersededBy", got.SupersededBy, w.supersededBy, w.supersededBy == "")
	check("fencingToken", got.FencingToken, w.token, w.token == 0)
	return diffs
}

func summary(wants map[string]want) string {
	parts := make([]string, 0, len(wants))
	for _, name := range sortedKeys(wants) {
		w := wants[name]
		s := fmt.Sprintf("%s %s", name, w.phase)
		if w.token != 0 && w.phase == buildlockv1.PhaseHeld {
			s += fmt.Sprintf(" (token %d)", w.token)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func (d *demo) showMessage(ctx context.Context, name string) error {
	bl := &buildlockv1.BuildLock{}
	if err := d.client.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: name}, bl); err != nil {
		return fmt.Errorf("reading BuildLock %s: %w", name, err)
	}
	fmt.Fprintf(d.out, "  %s says: %s\n", name, bl.Status.Message)
	return nil
}

func (d *demo) begin(narration string) {
	d.step++
	fmt.Fprintf(d.out, "\n── Step %d ─────────────────────────────────────────────────────────────\n", d.step)
	d.say("%s", narration)
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
}

// kubectl runs kubectl against the local control plane in the demo's
// namespace and prints what it prints, command line first.
func (d *demo) kubectl(ctx context.Context, args ...string) error {
	args = append([]string{"--namespace", d.ns}, args...)
	fmt.Fprintf(d.out, "\n$ kubectl %s\n", strings.Join(args, " "))
	cmd := d.c.Kubectl(ctx, args...)
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("step %d: running %s (build it with `make envtest`): %w", d.step, cmd.Path, err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// enforce is the second act: the target namespace consents to the lock's
// enforcement, and a pipeline that does not hold the lock is refused by the
// API server itself.
func (d *demo) enforce(ctx context.Context) error {
	d.begin("Enforcement: namespace staging consents (label buildlock.io/locked-by=demo) and the\n" +
		"BuildLockPolicy for staging sets spec.enforce: now the API server itself refuses writes into\n" +
		"staging by the demo namespace's pipelines, unless they come from the holder's pod.")
	if err := d.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: target, Labels: map[string]string{buildlockv1.LockedByLabel: namespace},
	}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", target, err)
	}
	// The pipelines may deploy into staging as far as RBAC goes, as a
	// deploy job's service account usually may.
	if err := d.client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "deploy"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}}},
	}); err != nil {
		return fmt.Errorf("creating the deploy Role in %s: %w", target, err)
	}
	if err := d.client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "pipelines-deploy"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "deploy"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "pipeline"}},
	}); err != nil {
		return fmt.Errorf("letting the pipelines deploy into %s: %w", target, err)
	}
	policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: target}}
	policy.Spec.Enforce = &buildlockv1.Enforcement{}
	if err := d.client.Create(ctx, policy); err != nil {
		return fmt.Errorf("creating BuildLockPolicy %s: %w", target, err)
	}
	if err := d.startBuild(ctx, "shop-main-42", "acme/shop", 42); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-42": {phase: buildlockv1.PhaseHeld, token: 3},
	}); err != nil {
		return err
	}
	// The operator says Enforcing once the API server refused its probe.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, d.timeout, true, func(ctx context.Context) (bool, error) {
		if err := d.client.Get(ctx, client.ObjectKeyFromObject(policy), policy); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(policy.Status.Conditions, buildlockv1.ConditionEnforced)
		return c != nil && c.Reason == buildlockv1.ReasonEnforcing, nil
	}); err != nil {
		return fmt.Errorf("step %d: the policy of %s never said Enforcing: %w", d.step, target, err)
	}
	if err := d.kubectl(ctx, "get", "buildlockpolicies"); err != nil {
		return err
	}

	d.begin("The pipeline of web #7, which was superseded, tries to deploy anyway; shop #42's pipeline,\n" +
		"which holds the lock, deploys.")
	// Enforcing means the API server refused a write already; should a
	// write still be admitted, it is removed again here.
	var last error
	attempt := 0
	refused := func(ctx context.Context) (bool, error) {
		attempt++
		name := fmt.Sprintf("web-7-was-here-%d", attempt)
		err := d.deployAs(ctx, "web-main-7", name)
		if err == nil {
			return false, d.client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: name}})
		}
		if ctx.Err() == nil {
			last = err
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "buildlock:") {
			return false, nil
		}
		fmt.Fprintf(d.out, "  web #7's deploy is refused: %s\n", err)
		return true, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, d.timeout, true, refused); err != nil {
		return fmt.Errorf("step %d: the deploy of a pipeline that does not hold the lock was not refused by buildlock (last answer: %w): %w", d.step, last, err)
	}
	if err := d.deployAs(ctx, "shop-main-42", "shop-42-release"); err != nil {
		return fmt.Errorf("step %d: the holder's deploy was refused: %w", d.step, err)
	}
	fmt.Fprintf(d.out, "  shop #42's deploy is admitted\n  ✓ step %d: only the holder's pipeline deploys\n", d.step)
	return d.setPodPhase(ctx, "shop-main-42", corev1.PodSucceeded)
}

// deployAs creates a ConfigMap in the target namespace as the pipeline
// service account, with the pod-bound token of the named pipeline pod (by
// impersonation: the same identity the API server derives from the token).
func (d *demo) deployAs(ctx context.Context, pod, name string) error {
	var p corev1.Pod
	if err := d.client.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: pod}, &p); err != nil {
		return fmt.Errorf("reading pod %s: %w", pod, err)
	}
	cfg := rest.CopyConfig(d.c.Config)
	cfg.QPS, cfg.Burst = 50, 100
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + d.ns + ":pipeline",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + d.ns, "system:authenticated"},
		Extra: map[string][]string{
			"authentication.kubernetes.io/pod-name": {p.Name},
			"authentication.kubernetes.io/pod-uid":  {string(p.UID)},
		},
	}
	pipeline, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return fmt.Errorf("creating the pipeline's client: %w", err)
	}
	return pipeline.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: name}})
}

// queue is the third act: with the ordering Queue, three apps deploying into
// one shared namespace take turns, and none supersedes another.
func (d *demo) queue(ctx context.Context) error {
	d.ns = queueNamespace
	d.begin("Queue: three apps deploy into one shared namespace. With the default ordering a newer\n" +
		"build of one app would supersede another app's waiting build; a BuildLockPolicy with\n" +
		"spec.ordering: Queue gives each app a place in line instead, in namespace apps.")
	if err := d.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: queueNamespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", queueNamespace, err)
	}
	policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: queueNamespace, Name: target}}
	policy.Spec.Ordering = buildlockv1.OrderingQueue
	if err := d.client.Create(ctx, policy); err != nil {
		return fmt.Errorf("creating BuildLockPolicy %s: %w", target, err)
	}
	for _, b := range []struct {
		name, repo string
		build      int64
		want       want
	}{
		{"shop-main-41", "acme/shop", 41, want{phase: buildlockv1.PhaseHeld, token: 1}},
		{"web-main-7", "acme/web", 7, want{phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonQueued}},
		{"api-main-3", "acme/api", 3, want{phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonQueued}},
	} {
		if err := d.startBuild(ctx, b.name, b.repo, b.build); err != nil {
			return err
		}
		if err := d.expectQuietly(ctx, map[string]want{b.name: b.want}); err != nil {
			return err
		}
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseHeld, token: 1},
		"web-main-7":   {phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonQueued},
		"api-main-3":   {phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonQueued},
	}); err != nil {
		return err
	}
	if err := d.showMessage(ctx, "api-main-3"); err != nil {
		return err
	}

	d.begin("shop #41 finishes: web #7, first in line, holds; api #3 waits its turn.")
	if err := d.setPodPhase(ctx, "shop-main-41", corev1.PodSucceeded); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"shop-main-41": {phase: buildlockv1.PhaseReleased},
		"web-main-7":   {phase: buildlockv1.PhaseHeld, token: 2},
		"api-main-3":   {phase: buildlockv1.PhaseWaiting, reason: buildlockv1.ReasonQueued},
	}); err != nil {
		return err
	}

	d.begin("web #7 finishes: api #3 holds. Every app's build deployed, in the order they asked.")
	if err := d.setPodPhase(ctx, "web-main-7", corev1.PodSucceeded); err != nil {
		return err
	}
	if err := d.expect(ctx, map[string]want{
		"web-main-7": {phase: buildlockv1.PhaseReleased},
		"api-main-3": {phase: buildlockv1.PhaseHeld, token: 3},
	}); err != nil {
		return err
	}
	return d.kubectl(ctx, "get", "buildlockpolicies")
}
