package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// TestHandOffSurvivesAFailedPodRead: the holder's pod finishes while the
// manager's live reads of pods fail (500s from the API server). The arbiter
// rightly counts the unknown pod as alive, but the lock must be looked at
// again: the waiter must get the lock once the API server answers, without
// any other event on the lock. No finished TTL, whose requeues would hide a
// dropped hand-off.
//
// Regression test for a bug the chaos work found: the reconcile neither
// returned an error nor requeued when a pod's state was unknown, so the
// hand-off waited for the next unrelated event on the lock, the next
// finished claim's TTL, or the 10-hour resync (fixed in e1b88e5).
func TestHandOffSurvivesAFailedPodRead(t *testing.T) {
	cfg, c := regressionTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := testNamespace(ctx, t, c, "podread")

	// failPods makes every live GET of a pod fail with a 500 while set.
	var failPods atomic.Bool
	faulty := rest.CopyConfig(cfg)
	faulty.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if failPods.Load() && isLiveRead(req) && req.URL.Query().Get("fieldSelector") == "" && isPodPath(req.URL.Path) {
				return statusResponse(req, http.StatusInternalServerError, metav1.StatusReasonInternalError), nil
			}
			return rt.RoundTrip(req)
		})
	})
	mgr, err := testenv.StartManager(ctx, faulty, testenv.ManagerOptions{Namespaces: []string{ns}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mgr.Stop() }()

	for i, name := range []string{"shop-41", "web-7"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: buildlockv1.BuildLockSpec{
			Target: "staging", Repo: []string{"acme/shop", "acme/web"}[i], Branch: "main", Build: 1, PodRef: &buildlockv1.PodReference{Name: name}}}
		if err := c.Create(ctx, bl); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, c, ns, name, []buildlockv1.Phase{buildlockv1.PhaseHeld, buildlockv1.PhaseWaiting}[i], 10*time.Second)
	}

	failPods.Store(true)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-41"}}
	if err := c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Succeeded"}}`))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the pod event is reconciled, and its read fails
	failPods.Store(false)
	waitPhase(t, c, ns, "web-7", buildlockv1.PhaseHeld, 15*time.Second)
}

// shared is the control plane of the regression tests (not TestChaos's,
// which has its own): started once, by the first test that needs it, and
// stopped by TestMain.
var shared struct {
	once sync.Once
	env  *testenv.Environment
	cfg  *rest.Config
	err  error
}

// sharedControlPlane returns a connection to the regression tests' control
// plane. Each test keeps to its own namespaces, with managers scoped to
// them.
func sharedControlPlane(t *testing.T) *rest.Config {
	t.Helper()
	shared.once.Do(func() {
		if shared.env, shared.err = testenv.New(); shared.err == nil {
			shared.cfg, shared.err = shared.env.Start()
		}
	})
	if shared.err != nil {
		t.Fatalf("starting the API server (run `make envtest`): %v", shared.err)
	}
	return shared.cfg
}

// regressionTest begins a regression test on the shared control plane: it
// is skipped with -short, runs beside the others, and gets an
// administrator's client.
func regressionTest(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs against a real API server; skipped with -short")
	}
	t.Parallel()
	cfg := sharedControlPlane(t)
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c
}

// testNamespace creates a namespace of the test's own: prefix and a
// number, so that tests and repeated runs (-count) never share one.
func testNamespace(ctx context.Context, t *testing.T, c client.Client, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func TestMain(m *testing.M) {
	// The managers' logs, and client-go's (leader election, events), would
	// drown the report; set once, before any test runs.
	logf.SetLogger(managersLogger())
	klog.SetLogger(logr.Discard())
	code := m.Run()
	if shared.env != nil {
		_ = shared.env.Stop()
	}
	os.Exit(code)
}

func isPodPath(path string) bool {
	return len(path) > 0 && (pathSegment(path, 2) == "pods")
}

// pathSegment returns the n-th segment from the end of a URL path (1 is the
// last).
func pathSegment(path string, n int) string {
	var segs []string
	start := 0
	for i := 0; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			if i > start {
				segs = append(segs, path[start:i])
			}
			start = i + 1
		}
	}
	if n > len(segs) {
		return ""
	}
	return segs[len(segs)-n]
}

func waitPhase(t *testing.T, c client.Client, ns, name string, want buildlockv1.Phase, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	var bl buildlockv1.BuildLock
	for time.Now().Before(deadline) {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &bl); err == nil && bl.Status.Phase == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s/%s is %q (%s: %s), not %s after %s", ns, name, bl.Status.Phase, bl.Status.Reason, bl.Status.Message, want, bound)
}
