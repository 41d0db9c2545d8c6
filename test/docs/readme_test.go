// What the README tells people to type runs against a real kube-apiserver
// and etcd, with the operator running: a command the README shows must work
// as written.

package docs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

// readmeCommand is one kubectl command of the README, as written.
type readmeCommand struct {
	line int
	text string
}

// readmeVerbs are the kubectl verbs whose commands the test runs: those
// that read claims and policies, or wait for them. The README's writes
// (apply, patch, delete, label) act on objects of its own stories, and the
// plugin's commands have tests of their own.
var readmeVerbs = []string{"get", "describe", "wait"}

// kubectlCommands returns the README's kubectl commands with one of verbs:
// the lines of its console blocks after "$ ", and the lines of its sh blocks,
// without a trailing comment. A command with a shell variable or a
// placeholder is left out: it cannot be run as written.
func kubectlCommands(t *testing.T, readme string, verbs []string) []readmeCommand {
	t.Helper()
	var out []readmeCommand
	fence := ""
	for i, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "```") {
			if fence == "" {
				fence = cmpOr(strings.TrimPrefix(line, "```"), "text")
			} else {
				fence = ""
			}
			continue
		}
		var cmd string
		switch fence {
		case "console":
			cmd, _ = strings.CutPrefix(line, "$ ")
		case "sh", "bash", "shell":
			cmd = line
		default:
			continue
		}
		cmd = strings.TrimSpace(cmd)
		if c, _, found := strings.Cut(cmd, " #"); found {
			cmd = strings.TrimSpace(c)
		}
		fields := strings.Fields(cmd)
		if len(fields) < 2 || fields[0] != "kubectl" || strings.ContainsAny(cmd, "$<>") {
			continue
		}
		if slices.Contains(verbs, verbOf(fields)) {
			out = append(out, readmeCommand{line: i + 1, text: cmd})
		}
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// verbOf is the first argument of a kubectl command line that is no flag or
// flag value (kubectl's global flags may come first: --namespace apps get).
func verbOf(fields []string) string {
	for i := 1; i < len(fields); i++ {
		switch f := fields[i]; {
		case f == "-n" || f == "--namespace" || f == "--context":
			i++
		case strings.HasPrefix(f, "-"):
		default:
			return f
		}
	}
	return ""
}

// mentioned is what a command names: its namespace and the BuildLocks it
// reads by name.
var (
	namespaceFlag = regexp.MustCompile(`(?:-n|--namespace)[ =]([a-z0-9-]+)`)
	claimArg      = regexp.MustCompile(`\b(?:buildlock|buildlocks|bl)(?:/| +)([a-z0-9][-a-z0-9.]*)`)
	policyKind    = regexp.MustCompile(`\b(?:buildlockpolic(?:y|ies)|blp)\b`)
)

// TestREADMECommandsWork runs every kubectl command of the README that reads
// or waits for claims and policies, as written (a shell parses it), against
// the objects it names: each exits 0 and prints no error. Issue 22, item 5:
// with the CRD's category named "buildlock", `kubectl get buildlock NAME`
// resolved to the category and failed with "you must specify only one
// resource".
func TestREADMECommandsWork(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The walk-through's commands depend on each other's state (a claim
	// waits behind another): TestReadmeWalkthroughRuns runs them in order.
	from, to := sectionLines(string(readme), walkthrough)
	all := kubectlCommands(t, string(readme), readmeVerbs)
	commands := slices.DeleteFunc(slices.Clone(all), func(c readmeCommand) bool {
		return c.line > from && c.line < to
	})
	if len(all) == 0 {
		t.Fatal("the README shows no kubectl command to read claims")
	}
	// Beyond the README: the other forms that resolve a kind by its name.
	extra := []readmeCommand{
		{text: "kubectl describe buildlock probe-1"},
		{text: "kubectl get buildlock-all"},
		{text: "kubectl get bl probe-1 -o name"},
	}

	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest (make envtest builds bin/k8s/%s): %v", testenv.K8sVersion, err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := t.Context()
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Stop() })

	for _, cmd := range slices.Concat(commands, extra) {
		ns := "default"
		if m := namespaceFlag.FindStringSubmatch(cmd.text); m != nil {
			ns = m[1]
		}
		ensureNamespace(ctx, t, c, ns)
		for _, m := range claimArg.FindAllStringSubmatch(cmd.text, -1) {
			ensureClaim(ctx, t, c, ns, m[1])
		}
		if policyKind.MatchString(cmd.text) {
			ensurePolicy(ctx, t, c, ns)
		}
	}
	ensureClaim(ctx, t, c, "default", "probe-1")
	kubeconfig := writeKubeconfig(t, env)
	kubectl := localcluster.KubectlPath(root)
	for _, cmd := range slices.Concat(commands, extra) {
		t.Run(fmt.Sprintf("README.md:%d %s", cmd.line, cmd.text), func(t *testing.T) {
			out, err := runShell(ctx, kubectl, kubeconfig, cmd.text)
			if err != nil || strings.Contains(out, "error:") {
				t.Errorf("%s: %v\n%s", cmd.text, err, out)
			}
		})
	}
}

// ensureNamespace creates namespace ns unless it exists.
func ensureNamespace(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// ensureClaim creates BuildLock name in ns unless it exists: a pod-less
// claim on a target of its own, so that the operator grants it and every
// condition a README command waits for comes true.
func ensureClaim(ctx context.Context, t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	bl := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       buildlockv1.BuildLockSpec{Target: strings.ReplaceAll(name, ".", "-"), Repo: "acme/readme", Branch: "main", Build: 1},
	}
	if err := c.Create(ctx, bl); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// ensurePolicy creates the BuildLockPolicy of target staging in ns unless
// it exists.
func ensurePolicy(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"}}
	if err := c.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig of an administrator of env.
func writeKubeconfig(t *testing.T, env *testenv.Environment) string {
	t.Helper()
	user, err := env.AddUser(envtest.User{Name: "readme", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runShell runs command with bash, as a person pastes it, with kubectl (the
// binary at kubectl) first on PATH and kubeconfig as KUBECONFIG; a command
// that waits is given a minute.
func runShell(ctx context.Context, kubectl, kubeconfig, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	cmd.Env = []string{"PATH=" + filepath.Dir(kubectl) + ":/usr/bin:/bin", "KUBECONFIG=" + kubeconfig, "HOME=" + filepath.Dir(kubeconfig)}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// sectionLines returns the line numbers (1-based) of the level-2 heading
// titled heading in readme and of the next level-2 heading (or the end).
func sectionLines(readme, heading string) (from, to int) {
	lines := strings.Split(readme, "\n")
	to = len(lines) + 1
	for i, line := range lines {
		switch {
		case line == "## "+heading:
			from = i + 1
		case from > 0 && strings.HasPrefix(line, "## "):
			return from, i + 1
		}
	}
	return from, to
}

// TestKubectlCommandsAreFound keeps the README parser honest: it finds the
// commands of console and sh blocks, with kubectl's global flags first,
// and leaves out comments, placeholders and other verbs.
func TestKubectlCommandsAreFound(t *testing.T) {
	readme := "text\n```console\n$ kubectl get buildlock web-main-7 -o jsonpath='{.status.message}'\nBuild 8 ...\n" +
		"$ kubectl --namespace apps get buildlocks -o wide\n$ kubectl patch pod x\n```\n" +
		"```sh\nkubectl wait -n ci buildlock/acme-shop-main-42 --for=condition=Decided --timeout=30m   # wait\n" +
		"kubectl wait -n ci \"buildlock/$LOCK\" --for=condition=Decided\n```\n" +
		"```yaml\nkubectl get x\n```\n"
	var got []string
	for _, c := range kubectlCommands(t, readme, readmeVerbs) {
		got = append(got, c.text)
	}
	want := []string{
		"kubectl get buildlock web-main-7 -o jsonpath='{.status.message}'",
		"kubectl --namespace apps get buildlocks -o wide",
		"kubectl wait -n ci buildlock/acme-shop-main-42 --for=condition=Decided --timeout=30m",
	}
	if !slices.Equal(got, want) {
		t.Errorf("commands %q, want %q", got, want)
	}
}
