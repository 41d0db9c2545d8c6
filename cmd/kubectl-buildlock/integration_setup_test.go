package main

// The cluster the integration tests (integration_test.go) run the built
// plugin against: a real API server and etcd with the operator's manager
// running in-process (internal/testenv), once for the whole package; it
// starts on the first test that needs it and stops in TestMain. The plugin
// runs as a pipeline user bound to the buildlock-pipeline ClusterRole of
// config/rbac/pipeline_role.yaml, with the admission policies of
// config/enforcement installed. Each test works in a namespace of its own.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// The cluster shared by the package's integration tests.
var (
	setupOnce sync.Once
	setupErr  error
	env       *testenv.Environment
	adminCfg  *rest.Config
	admin     client.WithWatch // direct, uncached
	manager   *testenv.Manager
	// pipelineCfg is the pipeline user's (read once: AuthenticatedUser.Config
	// is not safe for concurrent use).
	pipelineCfg *rest.Config
	// pipelineRole is the ClusterRole of config/rbac/pipeline_role.yaml.
	pipelineRole string
	pluginPath   string
	workDir      string
	managerLog   string
	// githubIssuer signs the OIDC tokens of GitHub Actions jobs, which the
	// API server trusts as examples/github-actions/authentication.yaml
	// configures it.
	githubIssuer *testenv.OIDCIssuer
)

func setup() error {
	var err error
	if workDir, err = os.MkdirTemp("", "kubectl-buildlock-test-"); err != nil {
		return err
	}
	// BUILDLOCK_TEST_PLUGIN runs these tests against another build of the
	// plugin (another release, say) instead of this one.
	pluginPath = os.Getenv("BUILDLOCK_TEST_PLUGIN")
	if pluginPath == "" {
		pluginPath = filepath.Join(workDir, "kubectl-buildlock")
		if out, err := exec.Command("go", "build", "-o", pluginPath, ".").CombinedOutput(); err != nil {
			return fmt.Errorf("building the plugin: %w\n%s", err, out)
		}
	}
	managerLog = filepath.Join(workDir, "manager.log")
	logFile, err := os.Create(managerLog)
	if err != nil {
		return err
	}
	logf.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))

	if githubIssuer, err = testenv.StartOIDCIssuer("https://token.actions.githubusercontent.com"); err != nil {
		return err
	}
	authn, err := testenv.AuthenticationFrom([]*testenv.OIDCIssuer{githubIssuer}, "examples/github-actions/authentication.yaml")
	if err != nil {
		return err
	}
	if env, err = testenv.New(testenv.WithAuthentication(workDir, authn)); err != nil {
		return err
	}
	if adminCfg, err = env.Start(); err != nil {
		return fmt.Errorf("starting envtest (run `make envtest` to build bin/k8s): %w", err)
	}
	if admin, err = client.NewWithWatch(adminCfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
		return err
	}
	// As in a cluster with enforcement installed: every claim carries its
	// requester, which acquire compares with its own identity.
	if err := testenv.InstallEnforcement(context.Background(), adminCfg); err != nil {
		return fmt.Errorf("installing the admission policies: %w", err)
	}
	if manager, err = testenv.StartManager(context.Background(), adminCfg, testenv.ManagerOptions{}); err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{}
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "pipeline_role.yaml"))
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(data, role); err != nil {
		return fmt.Errorf("reading config/rbac/pipeline_role.yaml: %w", err)
	}
	if err := admin.Create(context.Background(), role); err != nil {
		return err
	}
	pipelineRole = role.Name
	pipeline, err := env.AddUser(envtest.User{Name: "ci-pipeline", Groups: []string{"ci"}}, nil)
	if err != nil {
		return err
	}
	pipelineCfg = pipeline.Config()
	return nil
}

func teardown() error {
	var errs []error
	if manager != nil {
		errs = append(errs, manager.Stop())
	}
	if env != nil {
		errs = append(errs, env.Stop())
	}
	if githubIssuer != nil {
		githubIssuer.Close()
	}
	logf.SetLogger(logr.Discard())
	if workDir != "" && os.Getenv("KEEP_TEST_DIR") == "" {
		errs = append(errs, os.RemoveAll(workDir))
	}
	return errors.Join(errs...)
}

// fixture is one test's namespace, with a kubeconfig whose context is that
// namespace, for the pipeline user and the service account "pipeline", who
// are bound to the pipeline ClusterRole there.
type fixture struct {
	t          *testing.T
	ns         string
	dir        string
	kubeconfig string
	// adminKubeconfig is for what a pipeline may not do (force-release).
	adminKubeconfig string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	setupOnce.Do(func() { setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("setting up the test cluster: %v", setupErr)
	}
	t.Parallel()
	name := regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(t.Name()), "-")
	ns := strings.Trim(name[:min(len(name), 40)], "-") + "-" + utilrand.String(5)
	f := &fixture{t: t, ns: ns, dir: t.TempDir()}
	ctx := context.Background()
	must(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pipeline"}}))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pipeline"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: pipelineRole},
		Subjects: []rbacv1.Subject{
			{APIGroup: rbacv1.GroupName, Kind: "User", Name: "ci-pipeline"},
			{Kind: "ServiceAccount", Name: "pipeline", Namespace: ns},
		},
	}))
	f.kubeconfig = writeKubeconfig(t, filepath.Join(f.dir, "pipeline.kubeconfig"), pipelineCfg, ns)
	f.adminKubeconfig = writeKubeconfig(t, filepath.Join(f.dir, "admin.kubeconfig"), adminCfg, ns)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the manager's log is %s (kept with KEEP_TEST_DIR=1)", managerLog)
		}
	})
	return f
}

// serviceAccountToken returns a token of the namespace's service account
// "pipeline", as a pipeline running outside the cluster is given one.
func (f *fixture) serviceAccountToken() string {
	f.t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "pipeline"}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}
	must(f.t, admin.SubResource("token").Create(context.Background(), sa, tr))
	return tr.Status.Token
}

func ptrTo[T any](v T) *T { return &v }

// writeKubeconfig writes a kubeconfig for cfg's server and credentials with
// namespace as its context's namespace.
func writeKubeconfig(t *testing.T, path string, cfg *rest.Config, namespace string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: serverURL(t, cfg), CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user", Namespace: namespace}
	kc.CurrentContext = "envtest"
	must(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func serverURL(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	host, err := url.Parse(cfg.Host)
	must(t, err)
	if host.Scheme == "" {
		host = &url.URL{Scheme: "https", Host: cfg.Host}
	}
	return host.String()
}

// proc is a running plugin.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *testenv.SyncBuffer
	done           chan struct{}
	code           int
}

// plugin starts the plugin with args, as the pipeline user, with a clean
// environment (no CI variables of the machine running the tests; the
// test's directory as TMPDIR, where acquire keeps its proofs outside CI)
// plus env.
func (f *fixture) plugin(env map[string]string, args ...string) *proc {
	f.t.Helper()
	return f.pluginAs(f.kubeconfig, env, args...)
}

func (f *fixture) pluginAs(kubeconfig string, env map[string]string, args ...string) *proc {
	f.t.Helper()
	return f.start(exec.Command(pluginPath, args...), kubeconfig, env)
}

// pluginInGroup is plugin in a process group of its own, as a CI runner
// starts a job's steps, so that the test can signal that group.
func (f *fixture) pluginInGroup(env map[string]string, args ...string) *proc {
	f.t.Helper()
	cmd := exec.Command(pluginPath, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return f.start(cmd, f.kubeconfig, env)
}

func (f *fixture) start(cmd *exec.Cmd, kubeconfig string, env map[string]string) *proc {
	f.t.Helper()
	p := &proc{cmd: cmd, stdout: &testenv.SyncBuffer{}, stderr: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + f.dir, "KUBECONFIG=" + kubeconfig, "TMPDIR=" + f.dir, "USER=ci"}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	must(f.t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		p.code = exitStatus(p.cmd.ProcessState)
		close(p.done)
	}()
	f.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait returns the plugin's exit code, failing the test if it runs longer
// than timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v still ran after %s; stderr:\n%s", p.cmd.Args[1:], timeout, p.stderr)
		return -1
	}
}

// signal sends sig to the plugin.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	must(t, p.cmd.Process.Signal(sig))
}

// run runs the plugin to its end and returns its exit code.
func (f *fixture) run(env map[string]string, args ...string) (int, *proc) {
	f.t.Helper()
	p := f.plugin(env, args...)
	return p.wait(f.t, time.Minute), p
}

// helper returns the environment and the command line of a helper command
// (helperMain) that records its run under id, plus extra environment.
func (f *fixture) helper(id string, sleep time.Duration, exitCode int, extra ...string) (map[string]string, []string) {
	env := map[string]string{
		helperEnv: "1", "HELPER_DIR": f.dir, "HELPER_ID": id,
		"HELPER_SLEEP": sleep.String(), "HELPER_EXIT": strconv.Itoa(exitCode),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env, []string{"--", os.Args[0]}
}

// helperRun is what a helper recorded: when it ran and with which lock.
type helperRun struct {
	start, end int64
	token      string
	name       string
}

// helperRun reads what helper id recorded; ran is false when it never
// started, and end is 0 when it did not run to its end.
func (f *fixture) helperRun(id string) (r helperRun, ran bool) {
	f.t.Helper()
	start, err := os.ReadFile(filepath.Join(f.dir, id+".start"))
	if errors.Is(err, os.ErrNotExist) {
		return helperRun{}, false
	}
	must(f.t, err)
	if _, err := fmt.Sscanf(string(start), "%d %s %s", &r.start, &r.token, &r.name); err != nil {
		f.t.Fatalf("reading %s.start: %v", id, err)
	}
	if end, err := os.ReadFile(filepath.Join(f.dir, id+".end")); err == nil {
		r.end, err = strconv.ParseInt(string(end), 10, 64)
		must(f.t, err)
	}
	return r, true
}

// pidOf reads the pid helper id wrote to its file of suffix (.pid, .child,
// .escaped).
func (f *fixture) pidOf(id, suffix string) string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, id+suffix))
	must(f.t, err)
	return string(data)
}

// started waits until helper id has started.
func (f *fixture) started(id string) {
	f.t.Helper()
	f.eventually(30*time.Second, id+" started", func() bool {
		_, ran := f.helperRun(id)
		return ran
	})
}

// get reads a BuildLock live; nil when it does not exist.
func (f *fixture) get(name string) *buildlockv1.BuildLock {
	f.t.Helper()
	bl := &buildlockv1.BuildLock{}
	err := admin.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: name}, bl)
	if apierrors.IsNotFound(err) {
		return nil
	}
	must(f.t, err)
	return bl
}

// eventually polls cond every 50ms until it holds, failing after timeout.
func (f *fixture) eventually(timeout time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitForPhase waits until the BuildLock exists in phase.
func (f *fixture) waitForPhase(name string, phase buildlockv1.Phase) *buildlockv1.BuildLock {
	f.t.Helper()
	var bl *buildlockv1.BuildLock
	f.eventually(30*time.Second, fmt.Sprintf("BuildLock %s is %s", name, phase), func() bool {
		bl = f.get(name)
		return bl != nil && bl.Status.Phase == phase
	})
	return bl
}

// hold takes the lock on target for a build of another repo and leaves it
// held (no command, no pod: it lasts an hour unless released).
func (f *fixture) hold(target string) string {
	f.t.Helper()
	code, p := f.run(nil, "acquire", "--target", target, "--repo", "acme/holder", "--branch", "main", "--build", "1")
	if code != exitOK {
		f.t.Fatalf("the holder's acquire exited %d; stderr:\n%s", code, p.stderr)
	}
	return "acme-holder-main-1-" + target
}
