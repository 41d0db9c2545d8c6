package main

// The integration tests run the built plugin against a real API server and
// etcd with the operator's manager running in-process (internal/testenv),
// once for the whole package; the cluster starts on the first test that
// needs it. The plugin runs as a pipeline user that has only the rules of
// the ClusterRole buildlock-pipeline (config/rbac/pipeline_role.yaml), which
// the examples bind. Each test works in a namespace of its own.

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

// helperEnv makes the test binary act as the command that acquire runs:
// it records when it started and ended (see helperMain).
const helperEnv = "BUILDLOCK_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the test cluster: %v\n", err)
	}
	os.Exit(code)
}

// helperMain writes $HELPER_DIR/$HELPER_ID.start with the start time and the
// lock's environment, sleeps $HELPER_SLEEP, writes .end and exits with
// $HELPER_EXIT.
func helperMain() int {
	write := func(suffix, content string) {
		path := filepath.Join(os.Getenv("HELPER_DIR"), os.Getenv("HELPER_ID")+suffix)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(99)
		}
	}
	write(".start", fmt.Sprintf("%d %s %s", time.Now().UnixNano(), os.Getenv("BUILDLOCK_FENCING_TOKEN"), os.Getenv("BUILDLOCK_NAME")))
	if d, err := time.ParseDuration(os.Getenv("HELPER_SLEEP")); err == nil {
		time.Sleep(d)
	}
	write(".end", strconv.FormatInt(time.Now().UnixNano(), 10))
	code, _ := strconv.Atoi(os.Getenv("HELPER_EXIT"))
	return code
}

// The cluster shared by the package's tests.
var (
	setupOnce sync.Once
	setupErr  error
	env       *envtest.Environment
	adminCfg  *rest.Config
	admin     client.WithWatch // direct, uncached
	manager   *testenv.Manager
	// pipelineCfg is the pipeline user's (read once: AuthenticatedUser.Config
	// is not safe for concurrent use).
	pipelineCfg *rest.Config
	pluginPath  string
	workDir     string
	managerLog  string
)

func setup() error {
	var err error
	if workDir, err = os.MkdirTemp("", "kubectl-buildlock-test-"); err != nil {
		return err
	}
	pluginPath = filepath.Join(workDir, "kubectl-buildlock")
	if out, err := exec.Command("go", "build", "-o", pluginPath, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("building the plugin: %w\n%s", err, out)
	}
	managerLog = filepath.Join(workDir, "manager.log")
	logFile, err := os.Create(managerLog)
	if err != nil {
		return err
	}
	logf.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))

	if env, err = testenv.New(); err != nil {
		return err
	}
	if adminCfg, err = env.Start(); err != nil {
		return fmt.Errorf("starting envtest (run `make envtest` to build bin/k8s): %w", err)
	}
	if admin, err = client.NewWithWatch(adminCfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
		return err
	}
	if manager, err = testenv.StartManager(context.Background(), adminCfg, testenv.ManagerOptions{}); err != nil {
		return err
	}
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
	logf.SetLogger(logr.Discard())
	if workDir != "" && os.Getenv("KEEP_TEST_DIR") == "" {
		errs = append(errs, os.RemoveAll(workDir))
	}
	return errors.Join(errs...)
}

// fixture is one test's namespace, with a kubeconfig whose context is that
// namespace, for the pipeline user (who has the example Role there).
type fixture struct {
	t          *testing.T
	ns         string
	dir        string
	kubeconfig string
	// adminKubeconfig is for commands a pipeline does not run
	// (force-release).
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
	role := exampleRole(t)
	role.Namespace = ns
	must(t, admin.Create(ctx, role))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "ci-pipeline"}},
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

// exampleRole is a Role with the rules of config/rbac/pipeline_role.yaml,
// the ClusterRole that the chart creates and the examples bind.
func exampleRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "pipeline_role.yaml"))
	must(t, err)
	cr := &rbacv1.ClusterRole{}
	must(t, yaml.UnmarshalStrict(data, cr))
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: cr.Name}, Rules: cr.Rules}
}

// writeKubeconfig writes a kubeconfig for cfg's server and credentials with
// namespace as its context's namespace.
func writeKubeconfig(t *testing.T, path string, cfg *rest.Config, namespace string) string {
	t.Helper()
	host, err := url.Parse(cfg.Host)
	must(t, err)
	if host.Scheme == "" {
		host = &url.URL{Scheme: "https", Host: cfg.Host}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: host.String(), CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user", Namespace: namespace}
	kc.CurrentContext = "envtest"
	must(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// proc is a running plugin.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *testenv.SyncBuffer
	done           chan struct{}
	code           int
}

// plugin starts the plugin with args, as the pipeline user, with a clean
// environment (no CI variables of the machine running the tests) plus env.
func (f *fixture) plugin(env map[string]string, args ...string) *proc {
	f.t.Helper()
	return f.pluginAs(f.kubeconfig, env, args...)
}

func (f *fixture) pluginAs(kubeconfig string, env map[string]string, args ...string) *proc {
	f.t.Helper()
	p := &proc{cmd: exec.Command(pluginPath, args...), stdout: &testenv.SyncBuffer{}, stderr: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + f.dir, "KUBECONFIG=" + kubeconfig}
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

// run runs the plugin to its end and returns its exit code.
func (f *fixture) run(env map[string]string, args ...string) (int, *proc) {
	f.t.Helper()
	p := f.plugin(env, args...)
	return p.wait(f.t, time.Minute), p
}

// helper returns the environment and the command line of a helper command
// that records its run under id.
func (f *fixture) helper(id string, sleep time.Duration, exitCode int) (map[string]string, []string) {
	return map[string]string{
		helperEnv: "1", "HELPER_DIR": f.dir, "HELPER_ID": id,
		"HELPER_SLEEP": sleep.String(), "HELPER_EXIT": strconv.Itoa(exitCode),
	}, []string{"--", os.Args[0]}
}

// helperRun is what a helper recorded: when it ran and with which lock.
type helperRun struct {
	start, end int64
	token      string
	name       string
}

func (f *fixture) helperRun(id string) (helperRun, bool) {
	f.t.Helper()
	start, err := os.ReadFile(filepath.Join(f.dir, id+".start"))
	if errors.Is(err, os.ErrNotExist) {
		return helperRun{}, false
	}
	must(f.t, err)
	end, err := os.ReadFile(filepath.Join(f.dir, id+".end"))
	must(f.t, err)
	var r helperRun
	if _, err := fmt.Sscanf(string(start), "%d %s %s", &r.start, &r.token, &r.name); err != nil {
		f.t.Fatalf("reading %s.start: %v", id, err)
	}
	r.end, err = strconv.ParseInt(string(end), 10, 64)
	must(f.t, err)
	return r, true
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// signalProcess sends sig to the plugin.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	must(t, p.cmd.Process.Signal(sig))
}
