package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
	"github.com/buildlock/buildlock/pkg/lock"
)

func TestAcquireOnAFreeLockHoldsWithToken1(t *testing.T) {
	f := newFixture(t)
	ci := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42"}

	code, p := f.run(ci, "acquire", "--target", "staging", "--timeout", "30s")
	if code != exitOK {
		t.Fatalf("acquire exited %d, want 0; stderr:\n%s", code, p.stderr)
	}
	if got := p.stdout.String(); got != "1\n" {
		t.Errorf("stdout = %q, want the fencing token %q", got, "1\n")
	}
	bl := f.get("acme-shop-main-42-staging")
	if bl == nil || bl.Status.Phase != buildlockv1.PhaseHeld || bl.Status.FencingToken != 1 {
		t.Fatalf("BuildLock = %+v, want it Held with token 1", bl)
	}
	if s := bl.Spec; s.Repo != "acme/shop" || s.Branch != "main" || s.Build != 42 || s.PodRef != nil {
		t.Errorf("spec = %+v, want the GitHub variables' build and no pod", s)
	}

	code, p = f.run(ci, "release", "--target", "staging", "--mine")
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
	tokens := map[string]bool{web.token: true, api.token: true}
	if !tokens["1"] || !tokens["2"] {
		t.Errorf("tokens %q and %q, want 1 and 2", web.token, api.token)
	}
	first, second := web, api
	if api.start < web.start {
		first, second = api, web
	}
	if first.token != "1" || second.token != "2" {
		t.Errorf("the first to run had token %s, the second %s", first.token, second.token)
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
	if !strings.Contains(older.stderr.String(), "A newer build will deploy") {
		t.Errorf("the older build's stderr does not say a newer build will deploy:\n%s", older.stderr)
	}
	if _, ran := f.helperRun("older"); ran {
		t.Error("the superseded build ran its command")
	}
	bl := f.get("acme-shop-main-5-staging")
	if bl == nil || bl.Status.Phase != buildlockv1.PhaseSuperseded || bl.Status.SupersededBy != "acme-shop-main-6-staging" {
		t.Errorf("the older claim is %+v, want it kept Superseded by the newer one", bl)
	}

	f.waitForPhase("acme-shop-main-6-staging", buildlockv1.PhaseWaiting)
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
	t.Logf("stderr:\n%s", p.stderr)
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
		build := string(rune('1' + i))
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

func TestStatusShowsHolderWaitingAndToken(t *testing.T) {
	f := newFixture(t)
	f.hold("staging")
	waiter := f.plugin(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "9")
	f.waitForPhase("acme-shop-main-9-staging", buildlockv1.PhaseWaiting)

	code, p := f.run(nil, "status")
	if code != exitOK {
		t.Fatalf("status exited %d; stderr:\n%s", code, p.stderr)
	}
	lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "TARGET") ||
		!strings.Contains(lines[1], "acme/holder@main #1") || !strings.Contains(lines[1], "acme/shop@main #9") || !strings.HasSuffix(lines[1], " 1") {
		t.Errorf("status table:\n%s", p.stdout)
	}

	code, p = f.run(nil, "status", "--target", "staging", "-o", "json")
	var out struct{ Locks []lockStatus }
	if code != exitOK || json.Unmarshal([]byte(p.stdout.String()), &out) != nil || len(out.Locks) != 1 {
		t.Fatalf("status -o json exited %d:\n%s%s", code, p.stdout, p.stderr)
	}
	if l := out.Locks[0]; l.Namespace != f.ns || l.Holder == nil || l.Holder.Build != 1 || l.Holder.FencingToken != 1 || l.Waiting == nil || l.Waiting.Build != 9 {
		t.Errorf("status -o json = %+v", l)
	}
	waiter.signal(t, syscall.SIGTERM)
	waiter.wait(t, 30*time.Second)
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
	value := bl.Annotations[lock.ForceReleaseAnnotation]
	who, reason, _ := strings.Cut(value, ": ")
	if who == "" || who == "unknown" || reason != "deploy hangs, INC-1" {
		t.Errorf("annotation %s = %q, want \"<user>: deploy hangs, INC-1\"", lock.ForceReleaseAnnotation, value)
	}
	var events corev1.EventList
	must(t, admin.List(context.Background(), &events, client.InNamespace(f.ns)))
	found := false
	for _, ev := range events.Items {
		if ev.Reason == eventReasonForceRelease && ev.InvolvedObject.Name == holder && ev.InvolvedObject.UID == bl.UID &&
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
		"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "deploy-pod-0", "POD_NAMESPACE": f.ns}
	code, p := f.run(env, "acquire", "--target", "staging")
	if code != exitOK {
		t.Fatalf("acquire exited %d; stderr:\n%s", code, p.stderr)
	}
	bl := f.get("acme-shop-main-3-staging")
	if bl.Spec.PodRef == nil || bl.Spec.PodRef.Name != "deploy-pod-0" || bl.Status.Phase != buildlockv1.PhaseHeld {
		t.Errorf("claim = %+v / %+v, want it Held with pod deploy-pod-0", bl.Spec, bl.Status)
	}
}

// The Go client, as the pipeline user.

func pipelineClient(t *testing.T) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(pipelineCfg, client.Options{Scheme: testenv.Scheme()})
	must(t, err)
	return c
}

func TestARetriedAcquireAttachesToItsClaim(t *testing.T) {
	f := newFixture(t)
	c := pipelineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := lock.Claim{Namespace: f.ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}

	release, token, err := lock.Acquire(ctx, c, claim)
	must(t, err)
	var attached bool
	again, err := lock.AcquireHold(ctx, c, claim, lock.WithObserver(func(ev lock.Event) {
		attached = attached || ev.Type == lock.EventAttached
	}))
	must(t, err)
	if !attached || again.Token != token || again.Name != lock.Name(claim) {
		t.Errorf("the retry attached: %v, token %d (want %d), name %s", attached, again.Token, token, again.Name)
	}

	// Another pod's claim of the same build takes the fallback name and is
	// a duplicate of the holder. (The pod must exist, or its claim is
	// released as PodGone; envtest's pods stay Pending, which is alive.)
	must(t, admin.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "another-pod"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}))
	other := claim
	other.PodName = "another-pod"
	_, _, err = lock.Acquire(ctx, c, other)
	var superseded *lock.SupersededError
	if !errors.As(err, &superseded) || superseded.Reason != buildlockv1.ReasonDuplicateBuild || superseded.Name == lock.Name(claim) {
		t.Errorf("the other pod's claim: %v, want a DuplicateBuild supersession under another name", err)
	}

	must(t, release(ctx))
	must(t, again.Release(ctx))
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
	time.Sleep(14 * time.Second)
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

// TestAcquireWatchesByNameAndRecoversFromBrokenWatches breaks the client's
// first watches (one ends with 410 Gone, one closes at once) and checks that
// Acquire reads the claim again, watches again from where it was, and still
// gets the lock, watching one claim by name from a resourceVersion.
func TestAcquireWatchesByNameAndRecoversFromBrokenWatches(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")
	var (
		mu      sync.Mutex
		watches []metav1.ListOptions
	)
	c := interceptor.NewClient(pipelineClient(t), interceptor.Funcs{
		Watch: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
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
		if w.FieldSelector != "metadata.name="+lock.Name(claim) || w.ResourceVersion == "" {
			t.Errorf("watch %d: fieldSelector %q, resourceVersion %q", i, w.FieldSelector, w.ResourceVersion)
		}
	}
}

func TestASignalWhileTheCommandRunsReachesItAndReleasesTheLock(t *testing.T) {
	f := newFixture(t)
	env, cmd := f.helper("deploy", time.Minute, 0)
	p := f.plugin(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1"}, cmd...)...)
	f.eventually(30*time.Second, "the command started", func() bool {
		_, err := os.Stat(filepath.Join(f.dir, "deploy.start"))
		return err == nil
	})
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 30*time.Second); code != 143 {
		t.Fatalf("exit code %d, want 143; stderr:\n%s", code, p.stderr)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "deploy.end")); err == nil {
		t.Error("the command ran to its end: the signal did not reach it")
	}
	if bl := f.get("acme-shop-main-1-staging"); bl != nil {
		t.Errorf("the lock was not released: %+v", bl.Status)
	}
}
