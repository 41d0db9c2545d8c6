package main

// Unit tests of the command lines: parsing, defaults from CI variables,
// usage errors and help, in-process and without a cluster.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

var githubEnv = map[string]string{
	"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42",
	"GITHUB_RUN_ID": "7001", "GITHUB_RUN_ATTEMPT": "1",
}

// useKubeconfig points KUBECONFIG at a kubeconfig whose context's namespace
// is ci and whose server does not exist: enough to parse command lines.
func useKubeconfig(t interface {
	TempDir() string
	Setenv(string, string)
}) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	config := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: ci}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		panic(err)
	}
	t.Setenv("KUBECONFIG", path)
}

// environ turns env into KEY=value pairs.
func environ(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// parseAcquire parses an acquire command line as the plugin does before it
// connects: cobra's flag parsing, then Complete and Validate.
func parseAcquire(args []string, env map[string]string) (*acquireOptions, error) {
	f := newFactory(genericiooptions.NewTestIOStreamsDiscard(), environ(env))
	o := &acquireOptions{f: f}
	cmd := newAcquireCommand(o)
	f.kube.AddFlags(cmd.Flags()) // the root's flags
	if err := cmd.ParseFlags(args); err != nil {
		return o, usageErr{err}
	}
	return o, prepare(o, cmd, cmd.Flags().Args())
}

func TestParseAcquire(t *testing.T) {
	useKubeconfig(t)
	inPod := merge(githubEnv, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "runner-0"})
	claim := func(change func(*lock.Claim)) lock.Claim {
		c := lock.Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "7001-1", StateDir: os.TempDir()}
		change(&c)
		return c
	}
	host, _ := os.Hostname()
	tests := map[string]struct {
		args        []string
		env         map[string]string
		wantClaim   lock.Claim
		wantCommand []string
		wantTimeout time.Duration
		wantNote    string
	}{
		"explicit flags, no CI: the run is this user's on this machine": {
			args: []string{"--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "42"}, env: map[string]string{"USER": "alice"},
			wantClaim: claim(func(c *lock.Claim) { c.RunID = lock.LocalRunID("alice", host) }), wantNote: "No CI variables name this run",
		},
		"a GitHub matrix job: its job and entry, its runner's temp directory": {
			args:      []string{"--target=staging"},
			env:       merge(githubEnv, map[string]string{"GITHUB_JOB": "deploy", "BUILDLOCK_JOB": "3", "RUNNER_TEMP": "/runner/_temp"}),
			wantClaim: claim(func(c *lock.Claim) { c.RunID, c.StateDir = "7001-1/deploy/3", "/runner/_temp" }),
		},
		"BUILDLOCK_RUN_ID and TMPDIR": {
			args: []string{"--target=staging"}, env: merge(githubEnv, map[string]string{"BUILDLOCK_RUN_ID": "mine", "TMPDIR": "/scratch"}),
			wantClaim: claim(func(c *lock.Claim) { c.RunID, c.StateDir = "mine", "/scratch" }),
		},
		"CI variables fill what flags leave out, the run id included": {
			args: []string{"--target=staging"}, env: githubEnv,
			wantClaim: claim(func(*lock.Claim) {}),
		},
		"explicit flags win over CI variables": {
			args: []string{"--target=staging", "--branch=hotfix", "--build=7", "--run-id=mine"}, env: githubEnv,
			wantClaim: claim(func(c *lock.Claim) { c.Branch, c.Build, c.RunID = "hotfix", 7, "mine" }),
		},
		"HOSTNAME in a pod is the pod, with POD_UID": {
			args: []string{"--target=staging"}, env: merge(inPod, map[string]string{"POD_UID": "6f1c7a2e-0000-4000-8000-000000000001"}),
			wantClaim: claim(func(c *lock.Claim) { c.PodName, c.PodUID = "runner-0", "6f1c7a2e-0000-4000-8000-000000000001" }),
		},
		"an empty --pod claims without a pod": {
			args: []string{"--target=staging", "--pod="}, env: inPod,
			wantClaim: claim(func(*lock.Claim) {}),
		},
		"a pod in another namespace is dropped, with a note": {
			args: []string{"--target=staging", "--", "deploy"}, env: merge(inPod, map[string]string{"POD_NAMESPACE": "runners"}),
			wantClaim:   claim(func(c *lock.Claim) { c.ExpiresAfter = defaultCommandExpiresAfter }),
			wantCommand: []string{"deploy"}, wantNote: "Not naming pod",
		},
		"an explicit pod is kept wherever this runs": {
			args: []string{"--target=staging", "--pod=other"}, env: merge(inPod, map[string]string{"POD_NAMESPACE": "runners"}),
			wantClaim: claim(func(c *lock.Claim) { c.PodName = "other" }),
		},
		"everything after -- is the command, flags and all": {
			args:        []string{"--target", "staging", "--timeout", "30m", "-n", "apps", "--", "./deploy.sh", "--target", "prod", "--"},
			env:         githubEnv,
			wantClaim:   claim(func(c *lock.Claim) { c.Namespace, c.ExpiresAfter = "apps", defaultCommandExpiresAfter }),
			wantCommand: []string{"./deploy.sh", "--target", "prod", "--"},
			wantTimeout: 30 * time.Minute,
		},
		"flags after the command's arguments are the command's": {
			args: []string{"--target=staging", "--", "echo", "-n", "x"}, env: githubEnv,
			wantClaim:   claim(func(c *lock.Claim) { c.ExpiresAfter = defaultCommandExpiresAfter }),
			wantCommand: []string{"echo", "-n", "x"},
		},
		"an explicit expires-after wins": {
			args: []string{"--target=staging", "--expires-after=10m", "--", "deploy"}, env: githubEnv,
			wantClaim:   claim(func(c *lock.Claim) { c.ExpiresAfter = 10 * time.Minute }),
			wantCommand: []string{"deploy"},
		},
		"a pod-less claim without a command keeps the API's default": {
			args: []string{"--target=staging", "--name=mine"}, env: githubEnv,
			wantClaim: claim(func(c *lock.Claim) { c.Name = "mine" }),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseAcquire(tc.args, tc.env)
			if err != nil {
				t.Fatalf("parseAcquire() = %v", err)
			}
			if o.claim != tc.wantClaim {
				t.Errorf("claim = %+v,\nwant    %+v", o.claim, tc.wantClaim)
			}
			// Besides "Found <CI> variables.", the note the case wants, or none.
			notes := slices.DeleteFunc(slices.Clone(o.notes), func(n string) bool { return strings.HasPrefix(n, "Found ") })
			noted := len(notes) == 0
			if tc.wantNote != "" {
				noted = len(notes) == 1 && strings.HasPrefix(notes[0], tc.wantNote)
			}
			if !slices.Equal(o.command, tc.wantCommand) || o.timeout != tc.wantTimeout || !noted {
				t.Errorf("command %q, timeout %s, notes %q", o.command, o.timeout, o.notes)
			}
		})
	}
}

func TestParseAcquireErrors(t *testing.T) {
	useKubeconfig(t)
	tests := map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
	}{
		"no target":                     {args: []string{"--repo=a/b", "--branch=b", "--build=1"}, wantErr: "missing --target"},
		"nothing known outside CI":      {args: []string{"--target=t"}, wantErr: "missing --branch, --build, --repo: pass them"},
		"a build that is not numeric":   {args: []string{"--target=t", "--build=abc"}, wantErr: `invalid argument "abc" for "--build"`},
		"an unknown flag":               {args: []string{"--target=t", "--verbose"}, wantErr: "unknown flag: --verbose"},
		"a stray argument":              {args: []string{"--target=t", "deploy.sh"}, env: githubEnv, wantErr: "put the command to run after --"},
		"nothing after --":              {args: []string{"--target=t", "--"}, env: githubEnv, wantErr: "nothing after --"},
		"a negative timeout":            {args: []string{"--target=t", "--timeout=-1s"}, env: githubEnv, wantErr: "--timeout must not be negative"},
		"an invalid claim":              {args: []string{"--target=Staging"}, env: githubEnv, wantErr: `target "Staging"`},
		"expires-after with a pod":      {args: []string{"--target=t", "--pod=p", "--expires-after=1m"}, env: githubEnv, wantErr: "only to a claim without a pod"},
		"a run id with a newline":       {args: []string{"--target=t", "--run-id", "a\nb"}, env: githubEnv, wantErr: "without control characters"},
		"a pod UID that is not a UID":   {args: []string{"--target=t", "--pod=p", "--pod-uid=abc"}, env: githubEnv, wantErr: `pod UID "abc"`},
		"a branch with escape sequence": {args: []string{"--target=t", "--branch", "main\x1b[2J"}, env: githubEnv, wantErr: "control characters"},
		// Issue 31: look-alike text is refused before the API server does,
		// in its words.
		"a branch that reads like main": {args: []string{"--target=t", "--branch", "ma\u200bin"}, env: githubEnv,
			wantErr: "spec.branch must not contain invisible, bidirectional or control characters: it has U+200B at character 3; write it without that character"},
		"a workflow with a bidi mark": {args: []string{"--target=t", "--workflow", "deploy\u200e.yml"}, env: githubEnv,
			wantErr: "spec.workflow must not contain invisible, bidirectional or control characters: it has U+200E at character 7"},
		"a grace period the claim's expiry cannot cover": {args: []string{"--target=t", "--expires-after=30s", "--grace-period=15s", "--", "deploy"},
			env: githubEnv, wantErr: "--grace-period 15s must be less than half of --expires-after 30s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parseAcquire(tc.args, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseAcquire() = %v, want an error containing %q", err, tc.wantErr)
			}
			if exitCode(err) != exitUsage {
				t.Errorf("exit code %d, want %d", exitCode(err), exitUsage)
			}
		})
	}
}

// FuzzParseAcquire checks that no command line makes the parser panic, that
// an accepted one has a valid claim and a command only after "--", and
// that its errors are usage errors.
func FuzzParseAcquire(f *testing.F) {
	useKubeconfig(f)
	f.Add("--target staging --repo acme/shop --branch main --build 42 -- ./deploy.sh")
	f.Add("--target= --build=-1 -- --")
	f.Add("-n ci --timeout 1h30m --pod= --expires-after 10s --target t")
	f.Add("--help --target")
	f.Add("--target t --grace-period 1s --run-id x")
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Fields(line)
		o, err := parseAcquire(args, githubEnv)
		if err != nil {
			if code := exitCode(err); code != exitUsage && !strings.Contains(err.Error(), "namespace") {
				t.Errorf("parseAcquire(%q) = %v, exit code %d, not a usage error", args, err, code)
			}
			return
		}
		if err := o.claim.Validate(); err != nil {
			t.Errorf("parseAcquire(%q) accepted an invalid claim: %v", args, err)
		}
		if len(o.command) > 0 && !slices.Contains(args, "--") {
			t.Errorf("parseAcquire(%q) found command %q without --", args, o.command)
		}
	})
}

// TestRunWithoutACluster runs the plugin in-process for what needs no
// cluster: help, usage errors and their exit codes, and a connection that
// fails.
func TestRunWithoutACluster(t *testing.T) {
	useKubeconfig(t)
	long := strings.Repeat("x", buildlockv1.MaxForceReleaseReasonLength+1)
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"no arguments print help":                 {args: nil, wantCode: exitOK, wantStdout: "Available Commands:"},
		"--help lists exit codes":                 {args: []string{"--help"}, wantCode: exitOK, wantStdout: "3         superseded"},
		"help for a command":                      {args: []string{"help", "force-release"}, wantCode: exitOK, wantStdout: buildlockv1.ForceReleaseAnnotation},
		"a command's help has examples":           {args: []string{"acquire", "--help"}, wantCode: exitOK, wantStdout: "Examples:"},
		"help shows the flags' own text":          {args: []string{"status", "-h"}, wantCode: exitOK, wantStdout: "Show the locks of every namespace."},
		"help shows kubectl's flags":              {args: []string{"release", "--help"}, wantCode: exitOK, wantStdout: "--as string"},
		"an unknown command":                      {args: []string{"lock"}, wantCode: exitUsage, wantStderr: `unknown command "lock"`},
		"a usage error names the command":         {args: []string{"-n", "ci", "status", "-o", "xml"}, wantCode: exitUsage, wantStderr: "kubectl buildlock status --help"},
		"an unknown flag is a usage error":        {args: []string{"status", "--verbose"}, wantCode: exitUsage, wantStderr: "unknown flag: --verbose"},
		"status takes no arguments":               {args: []string{"status", "staging"}, wantCode: exitUsage, wantStderr: `unknown command "staging"`},
		"force-release needs a reason first":      {args: []string{"force-release", "--target=s"}, wantCode: exitUsage, wantStderr: "say why"},
		"force-release refuses a long reason":     {args: []string{"force-release", "--target=s", "--reason", long}, wantCode: exitUsage, wantStderr: "more than the 256 allowed"},
		"force-release refuses control chars":     {args: []string{"force-release", "--target=s", "--reason", "a\x1b[31mb"}, wantCode: exitUsage, wantStderr: "control characters"},
		"release needs a name or --target":        {args: []string{"release"}, wantCode: exitUsage, wantStderr: "give a BuildLock name"},
		"release by name and by build conflict":   {args: []string{"release", "x", "--target=t", "--mine"}, wantCode: exitUsage, wantStderr: "not both"},
		"release --mine outside CI needs a build": {args: []string{"release", "--target=t", "--mine"}, wantCode: exitUsage, wantStderr: "needs the build's repo"},
		"a failed connection is an error":         {args: []string{"status", "--request-timeout=2s"}, wantCode: exitError, wantStderr: "127.0.0.1:1"},
		"completion writes a script":              {args: []string{"completion", "bash"}, wantCode: exitOK, wantStdout: "bash completion V2 for kubectl-buildlock"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			streams := genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &stdout, ErrOut: &stderr}
			code := run(context.Background(), tc.args, streams, nil)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout does not contain %q:\n%s", tc.wantStdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr does not contain %q:\n%s", tc.wantStderr, stderr.String())
			}
		})
	}
}

func TestParseRelease(t *testing.T) {
	useKubeconfig(t)
	host, _ := os.Hostname()
	parse := func(args []string, env map[string]string) (*releaseOptions, error) {
		f := newFactory(genericiooptions.NewTestIOStreamsDiscard(), environ(env))
		o := &releaseOptions{f: f}
		cmd := newReleaseCommand(o)
		f.kube.AddFlags(cmd.Flags())
		if err := cmd.ParseFlags(args); err != nil {
			return o, err
		}
		return o, prepare(o, cmd, cmd.Flags().Args())
	}
	tests := map[string]struct {
		args      []string
		env       map[string]string
		wantNames []string
		wantBuild buildFlags
	}{
		"by name, with flags after it": {args: []string{"a", "b", "-n", "ci"}, env: map[string]string{"USER": "alice"}, wantNames: []string{"a", "b"},
			wantBuild: buildFlags{runID: lock.LocalRunID("alice", host), localRunID: true, stateDir: os.TempDir()}},
		"mine, from CI variables, with the run": {args: []string{"--target", "staging", "--mine"}, env: githubEnv,
			wantBuild: buildFlags{repo: "acme/shop", branch: "main", build: 42, runID: "7001-1", stateDir: os.TempDir()}},
		"mine, flags win": {args: []string{"--target", "staging", "--mine", "--build", "41"}, env: merge(githubEnv, map[string]string{"RUNNER_TEMP": "/t"}),
			wantBuild: buildFlags{repo: "acme/shop", branch: "main", build: 41, runID: "7001-1", stateDir: "/t"}},
		"mine, every run of the build": {args: []string{"--target", "staging", "--mine", "--build", "41", "--run-id="}, env: githubEnv,
			wantBuild: buildFlags{repo: "acme/shop", branch: "main", build: 41, stateDir: os.TempDir()}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parse(tc.args, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.names, tc.wantNames) || o.build != tc.wantBuild {
				t.Errorf("names %q, build %+v; want %q, %+v", o.names, o.build, tc.wantNames, tc.wantBuild)
			}
		})
	}
	if _, err := parse([]string{"--target=staging"}, githubEnv); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "use force-release") {
		t.Errorf("a target alone: %v, want a usage error pointing to force-release", err)
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}
