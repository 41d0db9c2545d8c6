package chart

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/localcluster"
)

// helmTest runs `helm test` on the release and stands in for the kubelet,
// which the local control plane lacks: when the test Pod appears, it runs
// the Pod's command here (sh and curl) with the Pod's environment and a
// token of the Pod's ServiceAccount, the one `helm test` creates and binds
// to metrics-reader, and reports the outcome as the Pod's phase. Only the
// URL differs: the running manager's address instead of the Service's,
// which has no endpoints here.
func helmTest(t *testing.T, h *helmRunner, c *localcluster.Cluster, admin client.Client, mgr *runningManager) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed; the helm test Pod's command needs it")
	}
	ctx := t.Context()
	g := newG(t)
	done, pod := startHelmTest(g, h, c, admin)
	container := pod.Spec.Containers[0]
	env := os.Environ()
	for _, e := range container.Env {
		value := e.Value
		switch e.Name {
		case "METRICS_URL":
			value = mgr.metricsURL()
		case "TOKEN_FILE":
			value = filepath.Join(t.TempDir(), "token")
			token := ""
			if pod.Spec.ServiceAccountName != "" {
				token = serviceAccountToken(ctx, g, admin, releaseNS, pod.Spec.ServiceAccountName)
			}
			g.Expect(os.WriteFile(value, []byte(token), 0o600)).To(Succeed())
		}
		env = append(env, e.Name+"="+value)
	}
	cmd := exec.Command(container.Command[0], container.Command[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("the helm test Pod's command: %v\n%s", err, out)
	pod.Status.Phase = corev1.PodSucceeded
	if err != nil {
		pod.Status.Phase = corev1.PodFailed
	}
	g.Expect(admin.Status().Update(ctx, pod)).To(Succeed())
	g.Expect(err).NotTo(HaveOccurred(), "the helm test Pod's command failed")
	g.Expect(<-done).To(Succeed(), "helm test")
}

// TestHelmTestCleansUpWhenItFails installs the chart (from its directory)
// on a local control plane and runs `helm test` as it fails: once whose Pod
// fails (a stand-in kubelet reports it Failed), once with nothing to run
// the Pod at all, as on a control plane without a kubelet, until a short
// --timeout. Each time helm test fails, and leaves neither the Pod nor the
// ServiceAccount and ClusterRoleBinding it created (they would outlive
// `helm uninstall`). The release's notes say that helm test needs a node.
func TestHelmTestCleansUpWhenItFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	h := requireHelm(t)
	c, admin := startCluster(t)
	h.run(t, "install", release, "charts/buildlock", "--namespace", releaseNS, "--create-namespace", "--kubeconfig", c.Kubeconfig)
	ctx := t.Context()
	g := newG(t)
	notes := h.run(t, "get", "notes", release, "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig)
	g.Expect(notes).To(ContainSubstring("helm test runs a Pod, which needs a node"))

	leftovers := func() []string {
		var left []string
		for _, obj := range []client.Object{&corev1.Pod{}, &corev1.ServiceAccount{}, &rbacv1.ClusterRoleBinding{}} {
			key := client.ObjectKey{Namespace: releaseNS, Name: "buildlock-test"}
			if _, cluster := obj.(*rbacv1.ClusterRoleBinding); cluster {
				key.Namespace = ""
			}
			err := admin.Get(ctx, key, obj)
			switch {
			case err == nil && obj.GetDeletionTimestamp() == nil:
				left = append(left, fmt.Sprintf("%T %s", obj, key.Name))
			case err != nil && !apierrors.IsNotFound(err):
				left = append(left, fmt.Sprintf("%T %s: %v", obj, key.Name, err))
			}
		}
		return left
	}

	t.Run("the Pod fails", func(t *testing.T) {
		g := newG(t)
		done, pod := startHelmTest(g, h, c, admin)
		pod.Status.Phase = corev1.PodFailed
		g.Expect(admin.Status().Update(ctx, pod)).To(Succeed())
		g.Expect(<-done).To(MatchError(ContainSubstring("buildlock-test")), "helm test fails with its Pod")
		g.Expect(leftovers()).To(BeEmpty(), "a failed helm test deletes what it created")
	})

	t.Run("no kubelet runs the Pod", func(t *testing.T) {
		g := newG(t)
		_, err := h.try("test", release, "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig, "--timeout", "15s")
		g.Expect(err).To(HaveOccurred(), "helm test fails when nothing runs its Pod")
		g.Expect(leftovers()).To(BeEmpty(), "a helm test that timed out deletes what it created")
	})
}

// startHelmTest starts `helm test` on the release and returns, once its Pod
// exists, the Pod and where helm test's outcome arrives.
func startHelmTest(g Gomega, h *helmRunner, c *localcluster.Cluster, admin client.Client) (<-chan error, *corev1.Pod) {
	done := make(chan error, 1)
	go func() {
		_, err := h.try("test", release, "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig, "--timeout", "2m")
		done <- err
	}()
	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return admin.Get(context.Background(), client.ObjectKey{Namespace: releaseNS, Name: "buildlock-test"}, pod)
	}).Should(Succeed(), "helm test creates its Pod")
	return done, pod
}
