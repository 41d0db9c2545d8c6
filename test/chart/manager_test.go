package chart

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

// chartArgs returns the manager's arguments as the chart's Deployment sets
// them.
func chartArgs(t *testing.T, h *helmRunner, values ...string) []string {
	t.Helper()
	return managerArgs(t, parseObjects(t, h.template(t, values...)))
}

// runningManager is the manager binary running against the local control
// plane.
type runningManager struct {
	cmd                    *exec.Cmd
	done                   chan error
	logs                   *testenv.SyncBuffer
	metricsAddr, probeAddr string
	// secure is whether it serves metrics over HTTPS to authorized clients.
	secure  bool
	stopped bool
}

// startManager runs the manager binary with the arguments of a Deployment
// (the chart's or config/manager's), as cfg's identity. Three flags are
// added after them (the last occurrence of a flag wins): free local ports
// instead of the Deployment's, and the release namespace for leader
// election, which the manager would read from its pod's ServiceAccount
// mount in a cluster.
func startManager(t *testing.T, bin string, args []string, cfg *rest.Config) *runningManager {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "manager.kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, cfg, &cfg.Impersonate); err != nil {
		t.Fatal(err)
	}
	m := &runningManager{done: make(chan error, 1), logs: &testenv.SyncBuffer{}, metricsAddr: freeAddr(t), probeAddr: freeAddr(t)}
	args = append(args,
		"--metrics-bind-address="+m.metricsAddr,
		"--health-probe-bind-address="+m.probeAddr,
		"--leader-election-namespace="+releaseNS,
	)
	// --metrics-secure defaults to true.
	m.secure = !slices.Contains(args, "--metrics-secure=false")
	m.cmd = exec.Command(bin, args...)
	m.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	m.cmd.Stdout, m.cmd.Stderr = m.logs, m.logs
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("starting the manager: %v", err)
	}
	go func() { m.done <- m.cmd.Wait() }()
	t.Cleanup(func() {
		m.stop(t)
		if t.Failed() {
			t.Logf("manager logs:\n%s", m.logs.String())
		}
	})
	t.Logf("manager started: %s %s", bin, strings.Join(args, " "))
	return m
}

// metricsURL is where the manager serves its metrics.
func (m *runningManager) metricsURL() string {
	scheme := "http"
	if m.secure {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s/metrics", scheme, m.metricsAddr)
}

// scrape gets the manager's metrics as a scraper presenting token (none
// when empty) would, and returns the status code and body. The manager's
// certificate is self-signed, as in a cluster.
func (m *runningManager) scrape(g Gomega, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, m.metricsURL(), nil)
	g.Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the manager's certificate is self-signed
	}}
	resp, err := hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}

// stop ends the manager as the kubelet would, SIGTERM then SIGKILL, and
// fails the test if it had exited on its own.
func (m *runningManager) stop(t *testing.T) {
	t.Helper()
	if m.stopped {
		return
	}
	m.stopped = true
	select {
	case err := <-m.done:
		t.Errorf("the manager exited early: %v\n%s", err, m.logs.String())
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-m.done:
		if err != nil {
			t.Errorf("the manager failed to stop cleanly on SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = m.cmd.Process.Kill()
		t.Errorf("the manager did not stop within 20s of SIGTERM: %v", <-m.done)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serviceAccountToken creates the ServiceAccount namespace/name unless it
// exists (its namespace must) and returns a short-lived token for it, as the kubelet mounts one.
func serviceAccountToken(ctx context.Context, g Gomega, c client.Client, namespace, name string) string {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sa), sa); err != nil {
		g.Expect(c.Create(ctx, sa)).To(Succeed())
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	g.Expect(c.SubResource("token").Create(ctx, sa, req)).To(Succeed())
	g.Expect(req.Status.Token).NotTo(BeEmpty())
	return req.Status.Token
}
