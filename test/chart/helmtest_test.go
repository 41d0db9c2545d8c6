package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
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
	done := make(chan error, 1)
	go func() {
		_, err := h.try("test", release, "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig, "--timeout", "2m")
		done <- err
	}()

	var pod corev1.Pod
	g.Eventually(func() error {
		return admin.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "buildlock-test"}, &pod)
	}).Should(Succeed(), "helm test creates its Pod")
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
	g.Expect(admin.Status().Update(ctx, &pod)).To(Succeed())
	g.Expect(err).NotTo(HaveOccurred(), "the helm test Pod's command failed")
	g.Expect(<-done).To(Succeed(), "helm test")
}
