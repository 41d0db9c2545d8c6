package main

// Integration tests: the built plugin against a real API server with the
// operator running (integration_setup_test.go), as a pipeline would run it.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

// github is a GitHub Actions run of build 42 of acme/shop@main; attempt
// tells runs of the same build apart.
func github(attempt int) map[string]string {
	return map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main",
		"GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ID": "5005", "GITHUB_RUN_ATTEMPT": strconv.Itoa(attempt)}
}

func TestAcquireOnAFreeLockHoldsWithToken1(t *testing.T) {
	f := newFixture(t)
	code, p := f.run(github(1), "acquire", "--target", "staging", "--timeout", "30s")
	if code != exitOK {
		t.Fatalf("acquire exited %d, want 0; stderr:\n%s", code, p.stderr)
	}
	if got := p.stdout.String(); got != "1\n" {
		t.Errorf("stdout = %q, want the fencing token %q", got, "1\n")
	}
	// The plugin returns on the operator's grant Lease; the claim's status
	// says so a write later.
	bl := f.waitForPhase("acme-shop-main-42-staging", buildlockv1.PhaseHeld)
	if bl == nil || bl.Status.Phase != buildlockv1.PhaseHeld || bl.Status.FencingToken != 1 {
		t.Fatalf("BuildLock = %+v, want it Held with token 1", bl)
	}
	if s := bl.Spec; s.Repo != "acme/shop" || s.Branch != "main" || s.Build != 42 || s.PodRef != nil || lock.RunIDOf(bl) != "5005-1" {
		t.Errorf("spec = %+v, run id %q; want the GitHub variables' build and run, and no pod", s, lock.RunIDOf(bl))
	}

	// Another run's --mine leaves this run's claim; this run's releases it.
	code, p = f.run(github(2), "release", "--target", "staging", "--mine")
	if code != exitOK || f.get("acme-shop-main-42-staging") == nil || !strings.Contains(p.stderr.String(), "another run's") {
		t.Errorf("another run's release --mine exited %d; stderr:\n%s", code, p.stderr)
	}
	code, p = f.run(github(1), "release", "--target", "staging", "--mine")
	if code != exitOK || f.get("acme-shop-main-42-staging") != nil {
		t.Errorf("release --mine exited %d and left the claim; stderr:\n%s", code, p.stderr)
	}
	code, p = f.run(nil, "release", "acme-shop-main-42-staging")
	if code != exitOK || !strings.Contains(p.stderr.String(), "nothing to release") {
		t.Errorf("releasing a released claim exited %d; stderr:\n%s", code, p.stderr)
	}
}

func TestTwoBuildsTakeTurnsOneAfterTheOther(t *testing.T) {
	f := newFixture(t)
	var procs []*proc
	for _, repo := range []string{"acme/web", "acme/api"} {
		env, cmd := f.helper(strings.ReplaceAll(repo, "/", "-"), time.Second, 0)
		args := append([]string{"acquire", "--target", "staging", "--repo", repo, "--branch", "main", "--build", "1"}, cmd...)
		procs = append(procs, f.plugin(env, args...))
	}
	for _, p := range procs {
		if code := p.wait(t, time.Minute); code != exitOK {
			t.Fatalf("%v exited %d; stderr:\n%s", p.cmd.Args[1:], code, p.stderr)
		}
	}
	web, ok1 := f.helperRun("acme-web")
	api, ok2 := f.helperRun("acme-api")
	if !ok1 || !ok2 {
		t.Fatal("a command did not run")
	}
	if web.start < api.end && api.start < web.end {
		t.Errorf("the commands overlapped: web ran %d..%d, api ran %d..%d", web.start, web.end, api.start, api.end)
	}
	first, second := web, api
	if api.start < web.start {
		first, second = api, web
	}
	if first.token != "1" || second.token != "2" {
		t.Errorf("the first to run had token %s, the second %s; want 1 and 2", first.token, second.token)
	}
	if web.name != "acme-web-main-1-staging" || api.name != "acme-api-main-1-staging" {
		t.Errorf("BUILDLOCK_NAME was %q and %q", web.name, api.name)
	}
	for _, name := range []string{web.name, api.name} {
		if f.get(name) != nil {
			t.Errorf("BuildLock %s was not released", name)
		}
	}
}

func TestANewerBuildSupersedesAWaitingOlderOne(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")

	olderEnv, olderCmd := f.helper("older", 0, 0)
	older := f.plugin(olderEnv, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "5"}, olderCmd...)...)
	f.waitForPhase("acme-shop-main-5-staging", buildlockv1.PhaseWaiting)

	newerEnv, newerCmd := f.helper("newer", 0, 0)
	newer := f.plugin(newerEnv, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "6"}, newerCmd...)...)

	if code := older.wait(t, 30*time.Second); code != exitSuperseded {
		t.Fatalf("the older build exited %d, want %d; stderr:\n%s", code, exitSuperseded, older.stderr)
	}
	if !strings.Contains(older.stderr.String(), "A newer build (BuildLock acme-shop-main-6-staging) deploys instead of this one.") {
		t.Errorf("the older build's stderr does not name the newer build that deploys instead:\n%s", older.stderr)
	}
	if _, ran := f.helperRun("older"); ran {
		t.Error("the superseded build ran its command")
	}
	bl := f.get("acme-shop-main-5-staging")
	if bl == nil || bl.Status.Phase != buildlockv1.PhaseSuperseded || bl.Status.SupersededBy != "acme-shop-main-6-staging" {
		t.Errorf("the older claim is %+v, want it kept Superseded by the newer one", bl)
	}

	f.waitForPhase("acme-shop-main-6-staging", buildlockv1.PhaseWaiting)
	f.eventually(10*time.Second, "the newer build says its place", func() bool {
		return strings.Contains(newer.stderr.String(), "Place in the queue for staging: 1 of 1 (next); "+holder+" holds it with fencing token 1.")
	})
	if code, p := f.run(nil, "release", holder); code != exitOK {
		t.Fatalf("releasing the holder exited %d; stderr:\n%s", code, p.stderr)
	}
	if code := newer.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("the newer build exited %d; stderr:\n%s", code, newer.stderr)
	}
	t.Logf("The older build's stderr:\n%s\nThe newer build's stderr:\n%s", older.stderr, newer.stderr)
	if run, ran := f.helperRun("newer"); !ran || run.token != "2" {
		t.Errorf("the newer build's command ran: %v, with token %q, want 2", ran, run.token)
	}
}

func TestTimeoutDeletesTheClaim(t *testing.T) {
	f := newFixture(t)
	f.hold("staging")
	start := time.Now()
	code, p := f.run(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1", "--timeout", "2s")
	if code != exitTimeout {
		t.Fatalf("acquire exited %d, want %d; stderr:\n%s", code, exitTimeout, p.stderr)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Errorf("the timeout of 2s took %s", waited)
	}
	if !strings.Contains(p.stderr.String(), "Timed out after") || !strings.Contains(p.stderr.String(), "Deleted the claim") {
		t.Errorf("stderr does not report the timeout and the deletion:\n%s", p.stderr)
	}
	if bl := f.get("acme-shop-main-1-staging"); bl != nil {
		t.Errorf("the timed-out claim is still there: %+v", bl.Status)
	}
}

func TestASignalWhileWaitingDeletesTheClaim(t *testing.T) {
	for _, tc := range []struct {
		signal syscall.Signal
		want   int
	}{{syscall.SIGTERM, 143}, {syscall.SIGINT, 130}} {
		t.Run(tc.signal.String(), func(t *testing.T) {
			f := newFixture(t)
			f.hold("staging")
			env, cmd := f.helper("waiter", 0, 0)
			p := f.plugin(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1"}, cmd...)...)
			f.waitForPhase("acme-shop-main-1-staging", buildlockv1.PhaseWaiting)
			p.signal(t, tc.signal)
			if code := p.wait(t, 30*time.Second); code != tc.want {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, tc.want, p.stderr)
			}
			if bl := f.get("acme-shop-main-1-staging"); bl != nil {
				t.Errorf("the claim is still there after %s: %+v", tc.signal, bl.Status)
			}
			if _, ran := f.helperRun("waiter"); ran {
				t.Error("the command ran although the lock was never held")
			}
		})
	}
}

func TestTheCommandsExitCodeIsPassedThroughAndTheLockReleased(t *testing.T) {
	f := newFixture(t)
	for i, tc := range []struct {
		name    string
		command func() (map[string]string, []string)
		want    int
	}{
		{"a failing command", func() (map[string]string, []string) { return f.helper("fails", 0, 7) }, 7},
		{"a succeeding command", func() (map[string]string, []string) { return f.helper("succeeds", 0, 0) }, 0},
		{"a command that does not exist", func() (map[string]string, []string) {
			return nil, []string{"--", "/nonexistent/deploy.sh"}
		}, 127},
	} {
		build := strconv.Itoa(i + 1)
		env, cmd := tc.command()
		code, p := f.run(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", build}, cmd...)...)
		if code != tc.want {
			t.Errorf("%s: exit code %d, want %d; stderr:\n%s", tc.name, code, tc.want, p.stderr)
		}
		if bl := f.get("acme-shop-main-" + build + "-staging"); bl != nil {
			t.Errorf("%s: the lock was not released: %+v", tc.name, bl.Status)
		}
	}
}

func TestStatusShowsTheHolderTheQueueAndTheOrdering(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")
	waiter := f.plugin(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "9")
	f.waitForPhase("acme-shop-main-9-staging", buildlockv1.PhaseWaiting)
	must(t, admin.Create(context.Background(), &buildlockv1.BuildLockPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "prod"},
		Spec:       buildlockv1.BuildLockPolicySpec{Ordering: buildlockv1.OrderingFifo},
	}))
	f.hold("prod")

	code, p := f.run(nil, "status")
	lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
	if code != exitOK || len(lines) != 4 || !strings.HasPrefix(lines[0], "TARGET") ||
		!strings.Contains(lines[1], "prod      Fifo") || !strings.Contains(lines[1], "holder") ||
		!strings.Contains(lines[2], "staging   NewestWins   holder     acme/holder@main #1   Held      1") ||
		!strings.Contains(lines[3], "1 (next)   acme/shop@main #9     Waiting") {
		t.Errorf("status exited %d:\n%s%s", code, p.stdout, p.stderr)
	}

	code, p = f.run(nil, "status", "--target", "staging", "-o", "json")
	var out struct {
		Kind  string
		Items []lock.Summary
	}
	if code != exitOK || json.Unmarshal([]byte(p.stdout.String()), &out) != nil || len(out.Items) != 1 {
		t.Fatalf("status -o json exited %d:\n%s%s", code, p.stdout, p.stderr)
	}
	if l := out.Items[0]; out.Kind != "LockStatusList" || l.Namespace != f.ns || l.Ordering != buildlockv1.OrderingNewestWins ||
		l.Holder == nil || l.Holder.Build != 1 || l.Holder.FencingToken != 1 || len(l.Queue) != 1 || l.Queue[0].Build != 9 || l.Queue[0].Position != 1 {
		t.Errorf("status -o json = %+v", out)
	}

	code, p = f.run(nil, "status", "--target", "staging", "-o", "jsonpath={.items[0].holder.fencingToken} {.items[0].queue[0].name}")
	if code != exitOK || p.stdout.String() != "1 acme-shop-main-9-staging" {
		t.Errorf("status -o jsonpath exited %d: %q%s", code, p.stdout, p.stderr)
	}
	code, p = f.run(nil, "status", "--target", "staging", "-o", "name")
	if want := "buildlock.buildlock.io/" + holder + "\nbuildlock.buildlock.io/acme-shop-main-9-staging\n"; code != exitOK || p.stdout.String() != want {
		t.Errorf("status -o name exited %d:\n%s%s", code, p.stdout, p.stderr)
	}
	code, p = f.run(nil, "status", "-o", "name")
	if want := "buildlock.buildlock.io/acme-holder-main-1-prod\nbuildlock.buildlock.io/" + holder + "\nbuildlock.buildlock.io/acme-shop-main-9-staging\n"; code != exitOK || p.stdout.String() != want {
		t.Errorf("status -o name (every target) exited %d:\n%s%s", code, p.stdout, p.stderr)
	}
	code, p = f.run(nil, "status", "--target", "nothing-here", "-o", "name")
	if code != exitOK || p.stdout.String() != "" || !strings.Contains(p.stderr.String(), "No BuildLocks hold or wait on nothing-here in namespace "+f.ns) {
		t.Errorf("status -o name with nothing to show exited %d, printed %q; it says so on stderr:\n%s", code, p.stdout, p.stderr)
	}
	code, p = f.run(nil, "status", "-A")
	if code != exitError || !strings.Contains(p.stderr.String(), "forbidden") {
		t.Errorf("status -A as a pipeline of one namespace exited %d, want 1 (forbidden):\n%s", code, p.stderr)
	}
	waiter.signal(t, syscall.SIGTERM)
	waiter.wait(t, 30*time.Second)
}

// TestKubectlsConnectionFlags runs the plugin as a pipeline outside the
// cluster does (no kubeconfig: --server, --token and
// --certificate-authority), and as an administrator impersonating others
// (--as, --as-group).
func TestKubectlsConnectionFlags(t *testing.T) {
	f := newFixture(t)
	ca := filepath.Join(f.dir, "ca.crt")
	must(t, os.WriteFile(ca, adminCfg.CAData, 0o600))
	noKubeconfig := filepath.Join(f.dir, "none")
	token := f.serviceAccountToken()

	p := f.pluginAs(noKubeconfig, github(1), "acquire", "--server", serverURL(t, adminCfg), "--token", token,
		"--certificate-authority", ca, "-n", f.ns, "--target", "staging", "--request-timeout", "20s")
	if code := p.wait(t, time.Minute); code != exitOK || p.stdout.String() != "1\n" {
		t.Fatalf("acquire with --server and --token exited %d: %q\n%s", code, p.stdout, p.stderr)
	}

	asPipeline := []string{"--as", "system:serviceaccount:" + f.ns + ":pipeline", "--as-group", "system:serviceaccounts"}
	p = f.pluginAs(f.adminKubeconfig, nil, append(asPipeline, "status", "-o", "jsonpath={.items[0].holder.name}")...)
	if code := p.wait(t, time.Minute); code != exitOK || p.stdout.String() != "acme-shop-main-42-staging" {
		t.Errorf("status --as the pipeline exited %d: %q\n%s", code, p.stdout, p.stderr)
	}
	p = f.pluginAs(f.adminKubeconfig, nil, "status", "--as", "nobody")
	if code := p.wait(t, time.Minute); code != exitError || !strings.Contains(p.stderr.String(), `User "nobody" cannot list resource "buildlocks"`) {
		t.Errorf("status --as nobody exited %d, want 1 (forbidden):\n%s", code, p.stderr)
	}
	p = f.pluginAs(noKubeconfig, nil, "release", "acme-shop-main-42-staging", "-s", serverURL(t, adminCfg), "--token", token,
		"--insecure-skip-tls-verify", "-n", f.ns)
	if code := p.wait(t, time.Minute); code != exitOK || f.get("acme-shop-main-42-staging") != nil {
		t.Errorf("release with -s, --token and --insecure-skip-tls-verify exited %d:\n%s", code, p.stderr)
	}
}

func TestShellCompletion(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")

	code, p := f.run(nil, "completion", "bash")
	if code != exitOK || !strings.Contains(p.stdout.String(), "__start_kubectl-buildlock") {
		t.Errorf("completion bash exited %d:\n%.300s%s", code, p.stdout, p.stderr)
	}
	for _, tc := range []struct{ args, want []string }{
		{args: []string{"__complete", "release", ""}, want: []string{holder + "\tacme/holder@main #1 on staging, Held"}},
		{args: []string{"__complete", "acquire", "--target", ""}, want: []string{"staging\theld by acme/holder@main #1, 0 waiting (NewestWins)"}},
		{args: []string{"__complete", "status", "-o", ""}, want: []string{"wide", "json", "name", "jsonpath", "go-template"}},
		{args: []string{"__complete", "freeze", ""}, want: []string{"staging\theld by acme/holder@main #1, 0 waiting (NewestWins)"}},
		{args: []string{"__complete", "unfreeze", ""}, want: []string{"staging\theld by acme/holder@main #1, 0 waiting (NewestWins)"}},
		{args: []string{"__complete", "override", ""}, want: []string{holder + "\tacme/holder@main #1 on staging, Held"}},
	} {
		code, p := f.run(nil, tc.args...)
		lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
		if code != exitOK || !isSubset(tc.want, lines) {
			t.Errorf("%q exited %d:\n%s", tc.args, code, p.stdout)
		}
	}
}

func TestForceReleaseAnnotatesTheHolderAndRecordsAnEvent(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")

	code, p := f.run(nil, "force-release", "--target", "prod", "--reason", "x")
	if code != exitError || !strings.Contains(p.stderr.String(), "no claim holds prod") {
		t.Errorf("force-release of a free target exited %d; stderr:\n%s", code, p.stderr)
	}

	p = f.pluginAs(f.adminKubeconfig, nil, "force-release", "--target", "staging", "--reason", "deploy hangs, INC-1")
	if code := p.wait(t, time.Minute); code != exitOK {
		t.Fatalf("force-release exited %d; stderr:\n%s", code, p.stderr)
	}
	bl := f.get(holder)
	value := bl.Annotations[buildlockv1.ForceReleaseAnnotation]
	who, reason, _ := strings.Cut(value, ": ")
	if who == "" || who == "unknown" || reason != "deploy hangs, INC-1" {
		t.Errorf("annotation %s = %q, want \"<user>: deploy hangs, INC-1\"", buildlockv1.ForceReleaseAnnotation, value)
	}
	var events corev1.EventList
	must(t, admin.List(context.Background(), &events, client.InNamespace(f.ns)))
	found := false
	for _, ev := range events.Items {
		if ev.Reason == lock.EventReasonForceRelease && ev.InvolvedObject.Name == holder && ev.InvolvedObject.UID == bl.UID &&
			strings.Contains(ev.Message, who) && strings.Contains(ev.Message, "deploy hangs, INC-1") {
			found = true
		}
	}
	if !found {
		t.Errorf("no ForceRelease event on %s among %d events", holder, len(events.Items))
	}
}

func TestAPodFromHostnameIsTheClaimsPod(t *testing.T) {
	f := newFixture(t)
	// envtest runs no kubelet: the pod stays Pending, which counts as alive.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "deploy-pod-0"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	must(t, admin.Create(context.Background(), pod))
	env := map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
		"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "deploy-pod-0", "POD_NAMESPACE": f.ns, "POD_UID": string(pod.UID)}
	code, p := f.run(env, "acquire", "--target", "staging")
	if code != exitOK {
		t.Fatalf("acquire exited %d; stderr:\n%s", code, p.stderr)
	}
	bl := f.waitForPhase("acme-shop-main-3-staging", buildlockv1.PhaseHeld) // a write after the grant Lease
	if bl.Spec.PodRef == nil || bl.Spec.PodRef.Name != "deploy-pod-0" || bl.Spec.PodRef.UID != string(pod.UID) ||
		bl.Status.Phase != buildlockv1.PhaseHeld || lock.RunIDOf(bl) != string(pod.UID) {
		t.Errorf("claim = %+v / %+v, run %q; want it Held by pod deploy-pod-0 and its UID", bl.Spec, bl.Status, lock.RunIDOf(bl))
	}
	// A later step of the same pod (the same run) finds its claim.
	code, p = f.run(env, "acquire", "--target", "staging")
	if code != exitOK || !strings.Contains(p.stderr.String(), "Found this run's BuildLock") {
		t.Errorf("acquire again in the same pod exited %d; stderr:\n%s", code, p.stderr)
	}
}

// TestASecondRunOfTheSameBuildNeverDeploysAtTheSameTime re-runs a CI job
// (the same build number, another run) while the first run deploys: the
// second claims nothing and says whose claim is in the way; the first runs
// on, untouched.
func TestASecondRunOfTheSameBuildNeverDeploysAtTheSameTime(t *testing.T) {
	f := newFixture(t)
	env, cmd := f.helper("first", 5*time.Second, 0)
	first := f.plugin(merge(github(1), env), append([]string{"acquire", "--target", "staging"}, cmd...)...)
	f.started("first")
	claim := f.get("acme-shop-main-42-staging")

	env, cmd = f.helper("second", 0, 0)
	code, second := f.run(merge(github(2), env), append([]string{"acquire", "--target", "staging"}, cmd...)...)
	if code != exitOtherRun {
		t.Fatalf("the second run exited %d, want %d; stderr:\n%s", code, exitOtherRun, second.stderr)
	}
	for _, want := range []string{"BuildLock " + f.ns + "/acme-shop-main-42-staging", "(run 5005-1, this is run 5005-2)", "kubectl buildlock release acme-shop-main-42-staging"} {
		if !strings.Contains(second.stderr.String(), want) {
			t.Errorf("the second run's stderr does not say %q:\n%s", want, second.stderr)
		}
	}
	if _, ran := f.helperRun("second"); ran {
		t.Error("the second run ran its command")
	}
	f.ranUntouched(first, "first", claim)
}

// ranUntouched checks that the plugin p, whose command is helper id,
// held claim untouched by what the test did meanwhile, and that its command
// ran to its end and p exited 0.
func (f *fixture) ranUntouched(p *proc, id string, claim *buildlockv1.BuildLock) {
	f.t.Helper()
	if bl := f.get(claim.Name); bl == nil || bl.UID != claim.UID || bl.Status.Phase != buildlockv1.PhaseHeld {
		f.t.Errorf("%s's claim changed: %+v", id, bl)
	}
	if code := p.wait(f.t, time.Minute); code != exitOK {
		f.t.Errorf("%s exited %d; stderr:\n%s", id, code, p.stderr)
	}
	if run, _ := f.helperRun(id); run.end == 0 {
		f.t.Errorf("%s's command did not run to its end", id)
	}
}

// TestARunReplacesAnotherRunsFinishedClaim re-runs a build whose first
// run's claim ended (force-released): the re-run deletes that claim and
// claims anew under its own run id.
func TestARunReplacesAnotherRunsFinishedClaim(t *testing.T) {
	f := newFixture(t)
	if code, p := f.run(github(1), "acquire", "--target", "staging"); code != exitOK {
		t.Fatalf("the first run exited %d; stderr:\n%s", code, p.stderr)
	}
	p := f.pluginAs(f.adminKubeconfig, nil, "force-release", "--target", "staging", "--reason", "stuck")
	if code := p.wait(t, time.Minute); code != exitOK {
		t.Fatalf("force-release exited %d; stderr:\n%s", code, p.stderr)
	}
	old := f.waitForPhase("acme-shop-main-42-staging", buildlockv1.PhaseReleased)

	code, p := f.run(github(2), "acquire", "--target", "staging", "--timeout", "30s")
	// The operator may hold that build already granted once (exit 3).
	if code != exitOK && code != exitSuperseded {
		t.Fatalf("the re-run exited %d, want 0 or 3; stderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "Deleted BuildLock "+f.ns+"/acme-shop-main-42-staging, a finished claim (Released)") {
		t.Errorf("the re-run does not say it replaced the first run's claim:\n%s", p.stderr)
	}
	if bl := f.get("acme-shop-main-42-staging"); bl == nil || bl.UID == old.UID || lock.RunIDOf(bl) != "5005-2" {
		t.Errorf("the claim is %+v, want a new one of run 5005-2", bl)
	}
}

// TestTheCommandIsStoppedWhenTheClaimStopsHolding ends a hold in each way a
// pipeline cannot see from its command, while the command runs: the plugin
// stops the command's whole process group and exits 5, saying why.
func TestTheCommandIsStoppedWhenTheClaimStopsHolding(t *testing.T) {
	for _, tc := range []struct {
		name       string
		end        func(f *fixture, claim string)
		ignoreTerm bool
		// want is what stderr must say of the end, one of them (the
		// operator frees the grant Lease before it writes the claim's
		// status, and the command stops on whichever the plugin sees
		// first).
		want []string
	}{
		{name: "force-released", want: []string{"it is Released (ForceReleased)", "names no holder"}, end: func(f *fixture, _ string) {
			p := f.pluginAs(f.adminKubeconfig, nil, "force-release", "--target", "staging", "--reason", "INC-7")
			if code := p.wait(f.t, time.Minute); code != exitOK {
				f.t.Errorf("force-release exited %d:\n%s", code, p.stderr)
			}
		}},
		{name: "deleted", want: []string{"it was deleted"}, end: func(f *fixture, claim string) {
			must(f.t, admin.Delete(context.Background(), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: claim}}))
		}},
		{name: "deleted, and the command ignores SIGTERM", ignoreTerm: true, want: []string{"killing it"}, end: func(f *fixture, claim string) {
			must(f.t, admin.Delete(context.Background(), &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: claim}}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			extra := []string{"HELPER_CHILD", "1"}
			if tc.ignoreTerm {
				extra = append(extra, "HELPER_IGNORE_TERM", "1")
			}
			env, cmd := f.helper("deploy", time.Minute, 0, extra...)
			p := f.plugin(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1", "--grace-period", "1s"}, cmd...)...)
			f.started("deploy")
			start := time.Now()
			tc.end(f, "acme-shop-main-1-staging")
			if code := p.wait(t, 30*time.Second); code != exitEnded {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, exitEnded, p.stderr)
			}
			t.Logf("stopped %s after the end; stderr:\n%s", time.Since(start).Round(time.Millisecond), p.stderr)
			for _, want := range []string{"no longer holds its lock", "Stopping " + os.Args[0]} {
				if !strings.Contains(p.stderr.String(), want) {
					t.Errorf("stderr does not say %q", want)
				}
			}
			if !slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(p.stderr.String(), w) }) {
				t.Errorf("stderr says none of %q", tc.want)
			}
			if run, _ := f.helperRun("deploy"); run.end != 0 {
				t.Error("the command ran to its end")
			}
			child, err := os.ReadFile(filepath.Join(f.dir, "deploy.child"))
			must(t, err)
			f.eventually(10*time.Second, "the command's child is gone", func() bool { return !alive(string(child)) })
		})
	}
}

// alive reports whether the process pid runs (and is not a zombie).
func alive(pid string) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

func TestASignalWhileTheCommandRunsReachesItAndReleasesTheLock(t *testing.T) {
	f := newFixture(t)
	env, cmd := f.helper("deploy", time.Minute, 0)
	p := f.plugin(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1"}, cmd...)...)
	f.started("deploy")
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 30*time.Second); code != 143 {
		t.Fatalf("exit code %d, want 143; stderr:\n%s", code, p.stderr)
	}
	if run, _ := f.helperRun("deploy"); run.end != 0 {
		t.Error("the command ran to its end: the signal did not reach it")
	}
	if bl := f.get("acme-shop-main-1-staging"); bl != nil {
		t.Errorf("the lock was not released: %+v", bl.Status)
	}
}

// The Go client (pkg/lock), as the pipeline user.

func pipelineClient(t *testing.T) client.WithWatch {
	t.Helper()
	c, err := lock.NewClient(pipelineCfg)
	must(t, err)
	return c
}

// TestTheGoClientNeverHandsOneClaimToTwoAcquisitions: a second Acquire of
// the same claim while the first holds (the same run id; no proof of the
// first's) is refused, whatever the run id says; another pod's claim of
// the same build takes a fallback name and is a duplicate of the holder.
func TestTheGoClientNeverHandsOneClaimToTwoAcquisitions(t *testing.T) {
	f := newFixture(t)
	c := pipelineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := lock.Claim{Namespace: f.ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "run-1"}

	release, _, err := lock.Acquire(ctx, c, claim)
	must(t, err)
	_, err = lock.AcquireHold(ctx, c, claim)
	var other *lock.ClaimedByAnotherRunError
	if !errors.As(err, &other) || !other.SameRunID() || other.BuildLock.Name != lock.Name(claim) {
		t.Errorf("a second acquisition of the claim: %v, want ErrClaimedByAnotherRun with this run id", err)
	}

	// (The pod must exist, or its claim is released as PodGone; envtest's
	// pods stay Pending, which is alive.)
	must(t, admin.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "another-pod"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}))
	pod := claim
	pod.PodName = "another-pod"
	_, _, err = lock.Acquire(ctx, c, pod)
	var superseded *lock.SupersededError
	if !errors.As(err, &superseded) || superseded.Reason != buildlockv1.ReasonDuplicateBuild || superseded.Name == lock.Name(claim) {
		t.Errorf("the other pod's claim: %v, want a DuplicateBuild supersession under another name", err)
	}

	must(t, release(ctx))
	if f.get(lock.Name(claim)) != nil {
		t.Error("the claim was not released")
	}
}

func TestAPodlessHoldIsRenewedAndOutlivesItsExpiresAfter(t *testing.T) {
	f := newFixture(t)
	c := pipelineClient(t)
	ctx := context.Background()
	claim := lock.Claim{Namespace: f.ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1, ExpiresAfter: 10 * time.Second}
	var (
		mu        sync.Mutex
		renewErrs []error
	)
	h, err := lock.AcquireHold(ctx, c, claim, lock.WithErrorHandler(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		renewErrs = append(renewErrs, err)
	}))
	must(t, err)
	// The renew deadline (five sixths of expiresAfter) moves with every
	// renewal: the hold is not given up while renewals succeed.
	lostCtx, stopWatching := context.WithCancel(ctx)
	lost := make(chan error, 1)
	go func() { lost <- h.WaitLost(lostCtx) }()
	time.Sleep(14 * time.Second)
	stopWatching()
	if err := <-lost; errors.Is(err, lock.ErrLost) {
		t.Errorf("the renewed hold was given up: %v", err)
	}
	bl := f.get(h.Name)
	mu.Lock()
	defer mu.Unlock()
	if bl.Status.Phase != buildlockv1.PhaseHeld || bl.Spec.RenewTime == nil || time.Since(bl.Spec.RenewTime.Time) > 5*time.Second {
		t.Errorf("after 14s of a 10s hold: phase %s, renewTime %v; renewal errors %v", bl.Status.Phase, bl.Spec.RenewTime, renewErrs)
	}
	must(t, h.Release(ctx))

	// Without renewal, the same kind of hold expires.
	claim.Build = 2
	h, err = lock.AcquireHold(ctx, c, claim, lock.WithRenewInterval(time.Hour))
	must(t, err)
	f.waitForPhase(h.Name, buildlockv1.PhaseExpired)
	must(t, h.Release(ctx))
}

// TestAcquireRecoversFromBrokenWatches breaks the client's first watches
// of claims (one ends with 410 Gone, one closes at once) and checks that
// Acquire (client-go's UntilWithSync) lists again, watches again, and still
// gets the lock, watching only its lock's claims. The grant Lease may not be
// watched here (Forbidden, as with a role from before pipelines could read
// Leases), so that the lock can only be learned from the claims' watch.
func TestAcquireRecoversFromBrokenWatches(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")
	var (
		mu         sync.Mutex
		watches    []metav1.ListOptions
		leaseWatch []string
	)
	c := interceptor.NewClient(pipelineClient(t), interceptor.Funcs{
		Watch: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			if _, ok := list.(*coordinationv1.LeaseList); ok {
				mu.Lock()
				leaseWatch = append(leaseWatch, lo.AsListOptions().FieldSelector)
				mu.Unlock()
				return nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("this test's pipeline may not watch Leases"))
			}
			mu.Lock()
			watches = append(watches, *lo.AsListOptions())
			n := len(watches)
			mu.Unlock()
			switch n {
			case 1:
				fw := watch.NewFakeWithChanSize(1, false)
				fw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
				return fw, nil
			case 2:
				fw := watch.NewFake()
				fw.Stop()
				return fw, nil
			}
			return c.Watch(ctx, list, opts...)
		},
	})
	claim := lock.Claim{Namespace: f.ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 7}
	type result struct {
		h   *lock.Hold
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := lock.AcquireHold(context.Background(), c, claim)
		done <- result{h, err}
	}()
	f.waitForPhase(lock.Name(claim), buildlockv1.PhaseWaiting)
	if code, p := f.run(nil, "release", holder); code != exitOK {
		t.Fatalf("releasing the holder exited %d; stderr:\n%s", code, p.stderr)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire did not return within 30s of the hand-off")
	}
	must(t, r.err)
	if r.h.Token != 2 {
		t.Errorf("token %d, want 2", r.h.Token)
	}
	must(t, r.h.Release(context.Background()))

	mu.Lock()
	defer mu.Unlock()
	if len(watches) < 3 {
		t.Fatalf("%d watches, want at least 3 (two broken ones and a working one)", len(watches))
	}
	for i, w := range watches {
		if w.FieldSelector != "spec.target=staging" {
			t.Errorf("watch %d: fieldSelector %q, want the lock's claims", i, w.FieldSelector)
		}
	}
	if want := []string{"metadata.name=buildlock-staging"}; !slices.Equal(leaseWatch, want) {
		t.Errorf("watches of Leases %q, want %q: one, refused, and not retried", leaseWatch, want)
	}
}

// isSubset reports whether every element of sub is in set.
func isSubset(sub, set []string) bool {
	for _, s := range sub {
		if !slices.Contains(set, s) {
			return false
		}
	}
	return true
}

// TestVerbosityFollowsKubectl: -v (--v) is kubectl's verbosity: at 6 the
// plugin logs every API request (method, URL, status), as kubectl does; by
// default it logs none. --version still prints the version.
func TestVerbosityFollowsKubectl(t *testing.T) {
	f := newFixture(t)
	request := regexp.MustCompile(`verb="GET" url="https://\S+/apis/buildlock\.io/v1alpha1/namespaces/` + f.ns + `/buildlocks" status="200 OK"`)
	for _, args := range [][]string{{"-v=6", "status"}, {"status", "-v", "6"}, {"--v=6", "status"}} {
		code, p := f.run(nil, args...)
		if code != exitOK || !request.MatchString(p.stderr.String()) {
			t.Errorf("%q exited %d; stderr lacks the request log:\n%s", args, code, p.stderr)
		}
	}
	code, p := f.run(nil, "status")
	if code != exitOK || strings.Contains(p.stderr.String(), "verb=") {
		t.Errorf("status without -v exited %d and logged requests:\n%s", code, p.stderr)
	}
	code, p = f.run(nil, "--version")
	if code != exitOK || !strings.HasPrefix(p.stdout.String(), "kubectl buildlock version ") {
		t.Errorf("--version exited %d: %q\n%s", code, p.stdout, p.stderr)
	}
}
