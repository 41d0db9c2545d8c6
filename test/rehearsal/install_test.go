package rehearsal

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

const (
	// releaseNS is where both installs put the operator.
	releaseNS = "buildlock-system"
	// pipelineNS is where the pipeline's claim lives.
	pipelineNS = "ci"
)

// cluster is a local control plane without the CRDs (the install under
// rehearsal brings them) and an administrator's client.
type cluster struct {
	*localcluster.Cluster
	admin client.Client
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c, err := localcluster.Start(localcluster.Options{WithoutCRDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	scheme := testenv.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{Cluster: c, admin: admin}
}

// installWithHelm installs the chart as a user would, from the registry,
// after verifying the signature of what its tag names; runs the manager
// from the image the chart's Deployment names; and takes a claim.
func (r *rehearsal) installWithHelm(t *testing.T, host string, chart name.Digest, key *signer, plugin string) {
	ctx := t.Context()
	tagged := host + "/charts/buildlock:" + r.version
	if got := resolve(ctx, t, tagged); got.DigestStr() != chart.DigestStr() {
		t.Fatalf("%s is %s now, %s was signed", tagged, got.DigestStr(), chart.DigestStr())
	}
	if err := key.verifyImage(ctx, mustRef(t, tagged)); err != nil {
		t.Fatalf("the chart's signature does not verify: %v", err)
	}
	c := startCluster(t)
	home := t.TempDir()
	helm := exec.Command(r.tools["HELM"], "install", "buildlock", "oci://"+host+"/charts/buildlock", "--version", r.version, "--plain-http",
		"--namespace", releaseNS, "--create-namespace", "--kubeconfig", c.Kubeconfig,
		"--set", "image.repository="+host+"/buildlock")
	helm.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	if out, err := helm.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	c.waitForCRDs(t)
	c.runManager(t, key)
	c.claim(t, plugin, 1)
}

// installWithKubectl applies install.yaml server-side as a user would, runs
// the manager from the image it names, and takes a claim.
func (r *rehearsal) installWithKubectl(t *testing.T, key *signer, plugin string) {
	c := startCluster(t)
	apply := c.Kubectl(t.Context(), "apply", "--server-side", "-f", r.path("dist/install/install.yaml"))
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply --server-side -f install.yaml: %v\n%s", err, out)
	}
	c.waitForCRDs(t)
	c.runManager(t, key)
	c.claim(t, plugin, 2)
}

func (c *cluster) waitForCRDs(t *testing.T) {
	t.Helper()
	for _, crd := range []string{"buildlocks.buildlock.io", "buildlockpolicies.buildlock.io"} {
		poll(t, "CRD "+crd+" established", time.Minute, func(ctx context.Context) (bool, error) {
			var o apiextensionsv1.CustomResourceDefinition
			if err := c.admin.Get(ctx, client.ObjectKey{Name: crd}, &o); err != nil {
				return false, nil //nolint:nilerr // not created yet
			}
			for _, cond := range o.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	}
}

// runManager does what the kubelet would for the install's Deployment:
// it verifies the image's signature, takes the manager's binary for this
// platform out of it, and runs it with the container's arguments and
// environment as the pod's ServiceAccount (a token of the TokenRequest
// API). Three flags follow the Deployment's (the last of a flag wins): free
// loopback ports for metrics and probes, and the release namespace for
// leader election, which a pod reads from its ServiceAccount mount.
func (c *cluster) runManager(t *testing.T, key *signer) {
	t.Helper()
	ctx := t.Context()
	var d appsv1.Deployment
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "buildlock"}, &d); err != nil {
		t.Fatalf("the install has no Deployment buildlock: %v", err)
	}
	container := d.Spec.Template.Spec.Containers[0]
	ref := mustRef(t, container.Image)
	if err := key.verifyImage(ctx, ref); err != nil {
		t.Fatalf("the Deployment's image %s: %v", ref, err)
	}
	idx, err := remote.Index(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("the Deployment's image %s: %v", ref, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var bin []byte
	for _, desc := range m.Manifests {
		if desc.Platform.OS == runtime.GOOS && desc.Platform.Architecture == runtime.GOARCH {
			img, err := idx.Image(desc.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			bin = extractFile(t, img, cf.Config.Entrypoint[0])
		}
	}
	if bin == nil {
		t.Skipf("the image has no %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	dir := t.TempDir()
	manager := filepath.Join(dir, "manager")
	if err := os.WriteFile(manager, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := c.serviceAccountKubeconfig(t, releaseNS, d.Spec.Template.Spec.ServiceAccountName)

	args := append(append([]string{}, container.Args...),
		"--metrics-bind-address="+freeAddr(t), "--health-probe-bind-address="+freeAddr(t),
		"--leader-election-namespace="+releaseNS)
	cmd := exec.Command(manager, args...)
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "HOME=" + dir, "PATH=/usr/bin:/bin"}
	for _, e := range container.Env {
		switch {
		case e.ValueFrom == nil:
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			cmd.Env = append(cmd.Env, e.Name+"="+releaseNS)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			cmd.Env = append(cmd.Env, e.Name+"=buildlock-rehearsal")
		}
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Logf("manager from %s: %s", ref, strings.Join(args, " "))
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the manager did not stop cleanly: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the manager did not stop within 30s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("manager logs:\n%s", tail(logs.String(), 80))
		}
	})
}

// claim lets a pipeline (a ServiceAccount bound to buildlock-pipeline in
// pipelineNS) take staging with the plugin krew installed, as a pipeline
// outside a pod would: the plugin runs its command once the claim is Held.
// While the command runs, the claim must be Held by the operator with the
// token the command was given; when it ends, the plugin releases the claim
// (it deletes it).
func (c *cluster) claim(t *testing.T, plugin string, build int64) {
	t.Helper()
	ctx := t.Context()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pipelineNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "pipeline"}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "pipeline-buildlock"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "buildlock-pipeline"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: pipelineNS, Name: "pipeline"}},
		},
	} {
		if err := c.admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := c.serviceAccountKubeconfig(t, pipelineNS, "pipeline")
	dir := t.TempDir()
	// The command says what it holds, then waits until the test has seen
	// the claim (the file done).
	done := filepath.Join(dir, "done")
	cmd := exec.CommandContext(ctx, plugin, "acquire", "-n", pipelineNS, "--target", "staging",
		"--repo", "acme/shop", "--branch", "main", "--build", fmt.Sprint(build), "--timeout", "3m",
		"--", "sh", "-c", `echo "held $BUILDLOCK_NAME with token $BUILDLOCK_FENCING_TOKEN"; until [ -e "$DONE" ]; do sleep 0.2; done`)
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "HOME=" + dir, "PATH=/usr/bin:/bin", "DONE=" + done}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var claimName string
	var token int64
	// The plugin's --timeout bounds the wait.
	poll(t, "the command to run holding the lock", 3*time.Minute+10*time.Second, func(context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("kubectl buildlock acquire ended before its command held the lock: %v\n%s", err, out.String())
		default:
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if _, err := fmt.Sscanf(line, "held %s with token %d", &claimName, &token); err == nil {
				return true, nil
			}
		}
		return false, nil
	})
	var bl buildlockv1.BuildLock
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: claimName}, &bl); err != nil {
		t.Fatalf("the claim %s while its command runs: %v", claimName, err)
	}
	if bl.Status.Phase != buildlockv1.PhaseHeld || bl.Status.FencingToken != token || token <= 0 {
		t.Errorf("while its command runs, the claim %s is %s with token %d; want Held with the command's token %d", claimName, bl.Status.Phase, bl.Status.FencingToken, token)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("kubectl buildlock acquire: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("kubectl buildlock acquire did not end within a minute of its command:\n%s", out.String())
	}
	err := c.admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: claimName}, &bl)
	if !apierrors.IsNotFound(err) {
		t.Errorf("after its command ended, the claim %s is still there (%v): the plugin releases a claim by deleting it", claimName, err)
	}
	t.Logf("claim %s/%s: Held with token %d while its command ran, then released", pipelineNS, claimName, token)
}

// syncBuffer is a bytes.Buffer that a process writes to while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serviceAccountKubeconfig writes a kubeconfig with a token for the
// ServiceAccount namespace/name, as the kubelet mounts one.
func (c *cluster) serviceAccountKubeconfig(t *testing.T, namespace, sa string) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	obj := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sa}}
	if err := c.admin.SubResource("token").Create(t.Context(), obj, req); err != nil {
		t.Fatalf("a token for %s/%s: %v", namespace, sa, err)
	}
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	cfg := &rest.Config{Host: c.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: c.Config.CAData}, BearerToken: req.Status.Token}
	if err := localcluster.WriteKubeconfig(path, cfg, nil); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return ref
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

// poll waits up to within for done, failing the test with what.
func poll(t *testing.T, what string, within time.Duration, done func(context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, within, true, done); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
