package examples

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/buildlock/buildlock/pkg/lock"
)

// The test binary doubles as the stub of every program the examples call:
// started under one of these names (a link in the stub directory), it records
// its arguments, environment and working directory as one JSON line in
// $STUB_LOG and acts out the outcome the test asked for.
const (
	stubPlugin = "kubectl-buildlock"
	stubCurl   = "curl"
	stubDeploy = "deploy.sh"
	stubMake   = "make" // a build step before the deploys
)

// stubToken is the fencing token the stub plugin grants.
const stubToken = "7"

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case stubPlugin, stubCurl, stubDeploy, stubMake:
		os.Exit(runStub(filepath.Base(os.Args[0]), os.Args[1:]))
	}
	os.Exit(m.Run())
}

// call is one recorded start of a stubbed program.
type call struct {
	Name string            `json:"name"`
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
	Dir  string            `json:"dir"`
	// Executors are the Jenkins emulation's executors (their labels) held
	// when the program started ($JENKINS_EXECUTORS).
	Executors []string `json:"executors,omitempty"`
	// Holding are the targets whose stub acquire was running its command
	// (holding the lock) when the program started.
	Holding []string `json:"holding,omitempty"`
}

// flag returns the value that follows name in the arguments (before any
// "--"), as the plugin would parse "--name value" or "--name=value".
func (c call) flag(name string) (string, bool) {
	args := c.Args
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// command returns what follows "--" in the arguments.
func (c call) command() []string {
	if i := slices.Index(c.Args, "--"); i >= 0 {
		return c.Args[i+1:]
	}
	return nil
}

func runStub(name string, args []string) int {
	dir, _ := os.Getwd()
	c := call{Name: name, Args: args, Env: map[string]string{}, Dir: dir}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		c.Env[k] = v
	}
	if path := os.Getenv("JENKINS_EXECUTORS"); path != "" {
		data, _ := os.ReadFile(path)
		c.Executors = strings.Fields(string(data))
	}
	holding, _ := filepath.Glob(os.Getenv("STUB_LOG") + ".holding-*")
	for _, h := range holding {
		c.Holding = append(c.Holding, strings.TrimPrefix(h, os.Getenv("STUB_LOG")+".holding-"))
	}
	if err := record(c); err != nil {
		fmt.Fprintf(os.Stderr, "stub %s: %v\n", name, err)
		return 99
	}
	switch name {
	case stubPlugin:
		if len(args) > 0 && strings.HasPrefix(args[0], "oidc-") {
			return stubOIDC(c)
		}
		return stubAcquire(c)
	case stubCurl:
		return stubDownload(c)
	}
	if name == stubMake {
		return 0
	}
	if d, err := time.ParseDuration(os.Getenv("STUB_DEPLOY_SLEEP")); err == nil {
		time.Sleep(d)
	}
	if os.Getenv("STUB_DEPLOY_CONNECTS") != "" {
		if err := connect(); err != nil {
			fmt.Fprintf(os.Stderr, "deploy.sh stub: reaching the cluster: %v\n", err)
			return 97
		}
	}
	return envInt("STUB_DEPLOY_EXIT", 0)
}

// stubOIDC acts out `kubectl-buildlock oidc-kubeconfig` and `oidc-token`
// as the plugin does, with pkg/lock's own functions: the kubeconfig runs
// this stub again (by the path it was started as) for each token, which it
// fetches from the job's environment.
func stubOIDC(c call) int {
	audience, _ := c.flag("--audience")
	tokenEnv, _ := c.flag("--token-env")
	source := []string{"--audience", audience}
	if tokenEnv != "" {
		source = []string{"--token-env", tokenEnv}
	}
	if c.Args[0] == "oidc-token" {
		t, err := lock.FetchIDToken(context.Background(), c.Env, lock.IDTokenSource{Audience: audience, TokenEnv: tokenEnv}, http.DefaultClient)
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
			return 1
		}
		data, err := t.ExecCredential()
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
			return 1
		}
		fmt.Println(string(data))
		return 0
	}
	server, _ := c.flag("--server")
	namespace, _ := c.flag("--namespace")
	ca, _ := c.flag("--certificate-authority-data")
	caData, err := base64.StdEncoding.DecodeString(ca)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: --certificate-authority-data is not base64: %v\n", err)
		return 2
	}
	data, err := lock.OIDCKubeconfig(lock.OIDCCluster{Server: server, CAData: caData, Namespace: namespace}, os.Args[0], append([]string{"oidc-token"}, source...))
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		return 2
	}
	_, _ = os.Stdout.Write(data)
	return 0
}

// connect reaches the cluster of $KUBECONFIG, as a deploy's kubectl would.
func connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = dc.ServerVersion()
	return err
}

func record(c call) error {
	path := os.Getenv("STUB_LOG")
	if path == "" {
		return errors.New("STUB_LOG is not set")
	}
	line, err := json.Marshal(c)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// stubBuildNumber is what the stub's `build-number` prints: a PipelineRun's
// creation time.
const stubBuildNumber = "1764669600"

// stubAcquire acts out `kubectl-buildlock acquire`: the exit code for the
// target comes from $STUB_ACQUIRE ("staging=3,production=0"; default 0).
// Held with "-- CMD", it runs CMD with the variables the plugin sets and
// exits with CMD's code; held without, it prints the fencing token.
// Superseded, it prints what the plugin prints. build-number prints
// stubBuildNumber; other commands succeed.
func stubAcquire(c call) int {
	if len(c.Args) > 0 && c.Args[0] == "build-number" {
		fmt.Println(stubBuildNumber)
		return 0
	}
	if len(c.Args) == 0 || c.Args[0] != "acquire" {
		return 0
	}
	target, _ := c.flag("--target")
	code := 0
	for _, pair := range strings.Split(os.Getenv("STUB_ACQUIRE"), ",") {
		if t, v, ok := strings.Cut(pair, "="); ok && t == target {
			code, _ = strconv.Atoi(v)
		}
	}
	switch code {
	case 0:
	case 3:
		// What the plugin prints when a higher build of the line already
		// deployed: no newer build will deploy, and the integration must
		// not say one will.
		fmt.Fprintf(os.Stderr, "BuildLock ci/stub-%s was superseded: Build 43 of acme/shop@main already deployed: it held %s at "+
			"2026-03-02T09:10:00Z, and a line never deploys backwards, so this older build 42 will not deploy. Stop this pipeline; "+
			"to deploy build 42 again on purpose, roll back: kubectl buildlock acquire --rollback --reason \"...\" (spec.rollback).\n"+
			"A higher build of this line already deployed. Stopping without deploying (exit 3), so that the rest of this pipeline "+
			"does not run for this build.\n", target, target)
		return code
	default:
		fmt.Fprintf(os.Stderr, "stub: acquire %s ends with exit code %d\n", target, code)
		return code
	}
	fmt.Fprintf(os.Stderr, "Held %s with fencing token %s (BuildLock ci/stub-%s).\n", target, stubToken, target)
	cmdline := c.command()
	if len(cmdline) == 0 {
		fmt.Println(stubToken)
		return 0
	}
	cmd := exec.Command(cmdline[0], cmdline[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"BUILDLOCK_FENCING_TOKEN="+stubToken,
		"BUILDLOCK_NAME=stub-"+target,
		"BUILDLOCK_NAMESPACE=ci",
		"BUILDLOCK_TARGET="+target,
	)
	// While CMD runs the lock is held: programs started meanwhile record it.
	holding := os.Getenv("STUB_LOG") + ".holding-" + target
	if err := os.WriteFile(holding, nil, 0o600); err != nil {
		fmt.Fprintf(os.Stderr, "stub: %v\n", err)
		return 99
	}
	defer os.Remove(holding)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "error: starting %s: %v\n", cmdline[0], err)
		return 127
	}
	if lose := os.Getenv("STUB_LOSE"); lose == target {
		// The claim stops holding once the deploy has started: as the
		// plugin does, stop CMD and exit 5.
		for !deployStarted(target) {
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Fprintf(os.Stderr, "error: the hold was lost: BuildLock ci/stub-%s was force-released\n", target)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		return 5
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return 0
}

// deployStarted reports whether ./deploy.sh has started for target.
func deployStarted(target string) bool {
	f, err := os.Open(os.Getenv("STUB_LOG"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var c call
		if json.Unmarshal(sc.Bytes(), &c) == nil && c.Name == stubDeploy && slices.Contains(c.Args, target) {
			return true
		}
	}
	return false
}

// stubDownload acts out `curl -o FILE URL` for release downloads: it copies
// the file named by the URL's path after /releases/download/ from
// $STUB_RELEASES, or fails as curl -f does on a 404.
func stubDownload(c call) int {
	var url, out string
	for i, a := range c.Args {
		switch {
		case (a == "-o" || a == "--output") && i+1 < len(c.Args):
			out = c.Args[i+1]
		case strings.HasPrefix(a, "https://"):
			url = a
		}
	}
	_, rel, ok := strings.Cut(url, "/releases/download/")
	if !ok || out == "" {
		fmt.Fprintf(os.Stderr, "curl stub: want -o FILE and a release URL, got %q\n", c.Args)
		return 2
	}
	data, err := os.ReadFile(filepath.Join(os.Getenv("STUB_RELEASES"), filepath.FromSlash(rel)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "curl: (22) The requested URL returned error: 404\n")
		return 22
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "curl: (23) %v\n", err)
		return 23
	}
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// stubs is a directory of links to the stub, first on PATH, and the log they
// write.
type stubs struct {
	bin, log, home string
}

func newStubs(t *testing.T) *stubs {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &stubs{bin: filepath.Join(dir, "bin"), log: filepath.Join(dir, "calls.jsonl"), home: filepath.Join(dir, "home")}
	for _, d := range []string{s.bin, s.home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{stubPlugin, stubCurl, stubMake} {
		if err := os.Symlink(exe, filepath.Join(s.bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// deployScript puts the stub deploy script, ./deploy.sh, into dir.
func (s *stubs) deployScript(t *testing.T, dir string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(dir, stubDeploy)); err != nil {
		t.Fatal(err)
	}
}

// env is the environment a CI system's shell starts with: the stubs first on
// PATH, then the system's tools; and the outcomes the test asked for.
func (s *stubs) env(extra ...string) []string {
	return append([]string{
		"PATH=" + s.bin + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + s.home,
		"LANG=C.UTF-8",
		"STUB_LOG=" + s.log,
		// A test binary built with -race sleeps a second before it exits,
		// which every stub call would pay.
		"GORACE=atexit_sleep_ms=0",
	}, extra...)
}

// calls returns what the stubs recorded, in order.
func (s *stubs) calls(t *testing.T) []call {
	t.Helper()
	f, err := os.Open(s.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var calls []call
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var c call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s: %v", s.log, err)
		}
		calls = append(calls, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// acquires returns the recorded `kubectl-buildlock acquire` calls.
func acquires(calls []call) []call {
	var out []call
	for _, c := range calls {
		if c.Name == stubPlugin && len(c.Args) > 0 && c.Args[0] == "acquire" {
			out = append(out, c)
		}
	}
	return out
}

// named returns the recorded calls of one stub.
func named(calls []call, name string) []call {
	var out []call
	for _, c := range calls {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}
