package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/buildlock/buildlock/pkg/lock"
)

var githubEnv = map[string]string{
	"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42",
}

func TestParseAcquire(t *testing.T) {
	tests := map[string]struct {
		args        []string
		env         map[string]string
		wantClaim   lock.Claim
		wantCommand []string
		wantTimeout time.Duration
		wantKube    kubeFlags
	}{
		"explicit flags": {
			args:      []string{"--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "42"},
			wantClaim: lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42},
		},
		"CI variables fill what flags leave out": {
			args:      []string{"--target=staging"},
			env:       githubEnv,
			wantClaim: lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42},
		},
		"explicit flags win over CI variables": {
			args:      []string{"--target=staging", "--branch=hotfix", "--build=7"},
			env:       githubEnv,
			wantClaim: lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "hotfix", Build: 7},
		},
		"HOSTNAME in a pod is the pod": {
			args:      []string{"--target=staging"},
			env:       merge(githubEnv, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "runner-0"}),
			wantClaim: lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, PodName: "runner-0"},
		},
		"an empty --pod claims without a pod": {
			args:      []string{"--target=staging", "--pod="},
			env:       merge(githubEnv, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "runner-0"}),
			wantClaim: lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42},
		},
		"everything after -- is the command, flags and all": {
			args:        []string{"--target", "staging", "--timeout", "30m", "-n", "ci", "--", "./deploy.sh", "--target", "prod", "--"},
			env:         githubEnv,
			wantClaim:   lock.Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42},
			wantCommand: []string{"./deploy.sh", "--target", "prod", "--"},
			wantTimeout: 30 * time.Minute,
			wantKube:    kubeFlags{namespace: "ci"},
		},
		"kube flags in both spellings": {
			args:      []string{"--kubeconfig", "/k", "--context=dev", "--namespace", "ci", "--target=t", "--repo=a/b", "--branch=b", "--build=1"},
			wantClaim: lock.Claim{Target: "t", Repo: "a/b", Branch: "b", Build: 1},
			wantKube:  kubeFlags{kubeconfig: "/k", context: "dev", namespace: "ci"},
		},
		"expires-after, pod UID and name": {
			args:      []string{"--target=t", "--repo=a/b", "--branch=b", "--build=1", "--pod=p", "--pod-uid=abc", "--name=mine", "--expires-after=5m"},
			wantClaim: lock.Claim{Target: "t", Repo: "a/b", Branch: "b", Build: 1, PodName: "p", PodUID: "abc", Name: "mine", ExpiresAfter: 5 * time.Minute},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseAcquire(tc.args, tc.env)
			if err != nil {
				t.Fatalf("parseAcquire() = %v", err)
			}
			if o.claim != tc.wantClaim {
				t.Errorf("claim = %+v, want %+v", o.claim, tc.wantClaim)
			}
			if !slices.Equal(o.command, tc.wantCommand) {
				t.Errorf("command = %q, want %q", o.command, tc.wantCommand)
			}
			if o.timeout != tc.wantTimeout {
				t.Errorf("timeout = %s, want %s", o.timeout, tc.wantTimeout)
			}
			if o.kube != tc.wantKube {
				t.Errorf("kube flags = %+v, want %+v", o.kube, tc.wantKube)
			}
		})
	}
}

func TestParseAcquireErrors(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
	}{
		"no target":                   {args: []string{"--repo=a/b", "--branch=b", "--build=1"}, wantErr: "missing --target"},
		"nothing known outside CI":    {args: []string{"--target=t"}, wantErr: "--repo (no GITHUB_REPOSITORY"},
		"a build that is not numeric": {args: []string{"--target=t", "--build=abc"}, wantErr: `invalid value "abc" for flag -build`},
		"an unknown flag":             {args: []string{"--target=t", "--verbose"}, wantErr: "flag provided but not defined: -verbose"},
		"a stray argument":            {args: []string{"--target=t", "deploy.sh"}, env: githubEnv, wantErr: "put the command to run after --"},
		"nothing after --":            {args: []string{"--target=t", "--"}, env: githubEnv, wantErr: "nothing after --"},
		"a negative timeout":          {args: []string{"--target=t", "--timeout=-1s"}, env: githubEnv, wantErr: "--timeout must not be negative"},
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
	if _, err := parseAcquire([]string{"--help"}, nil); !errors.Is(err, errHelp) {
		t.Errorf("--help gives %v, want errHelp", err)
	}
}

func TestResolve(t *testing.T) {
	inPod := merge(githubEnv, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "runner-0"})
	tests := map[string]struct {
		args             []string
		env              map[string]string
		podNamespace     string
		wantPod          string
		wantExpiresAfter time.Duration
		wantNote         bool
	}{
		"a pod in the claims' namespace is kept": {
			args: []string{"--target=t"}, env: inPod, podNamespace: "ci", wantPod: "runner-0",
		},
		"a pod of unknown namespace is kept": {
			args: []string{"--target=t"}, env: inPod, wantPod: "runner-0",
		},
		"a pod in another namespace is dropped, with a note": {
			args: []string{"--target=t", "--", "deploy"}, env: inPod, podNamespace: "runners",
			wantExpiresAfter: defaultCommandExpiresAfter, wantNote: true,
		},
		"an explicit pod is kept wherever this runs": {
			args: []string{"--target=t", "--pod=other"}, env: inPod, podNamespace: "runners", wantPod: "other",
		},
		"a pod-less claim with a command expires soon when not renewed": {
			args: []string{"--target=t", "--", "deploy"}, env: githubEnv, wantExpiresAfter: defaultCommandExpiresAfter,
		},
		"a pod-less claim without a command keeps the API's default": {
			args: []string{"--target=t"}, env: githubEnv,
		},
		"an explicit expires-after wins": {
			args: []string{"--target=t", "--expires-after=10m", "--", "deploy"}, env: githubEnv, wantExpiresAfter: 10 * time.Minute,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseAcquire(tc.args, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			notes := o.resolve("ci", tc.podNamespace)
			if o.claim.Namespace != "ci" || o.claim.PodName != tc.wantPod || o.claim.ExpiresAfter != tc.wantExpiresAfter {
				t.Errorf("claim = %+v, want pod %q and expiresAfter %s", o.claim, tc.wantPod, tc.wantExpiresAfter)
			}
			if (len(notes) > 0) != tc.wantNote {
				t.Errorf("notes = %q", notes)
			}
		})
	}
}

func TestParseRelease(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    releaseOptions
		wantErr string
	}{
		"by name, with flags after it": {
			args: []string{"acme-shop-main-42-staging", "-n", "ci"},
			want: releaseOptions{name: "acme-shop-main-42-staging", kube: kubeFlags{namespace: "ci"}},
		},
		"mine, from CI variables": {
			args: []string{"--target", "staging", "--mine"}, env: githubEnv,
			want: releaseOptions{target: "staging", mine: true, repo: "acme/shop", branch: "main", build: 42},
		},
		"mine, flags win": {
			args: []string{"--target", "staging", "--mine", "--build", "41"}, env: githubEnv,
			want: releaseOptions{target: "staging", mine: true, repo: "acme/shop", branch: "main", build: 41},
		},
		"mine outside CI needs the build": {args: []string{"--target=staging", "--mine"}, wantErr: "--mine needs this build's"},
		"a target without mine":           {args: []string{"--target=staging"}, wantErr: "use force-release"},
		"nothing":                         {args: nil, wantErr: "give a BuildLock name"},
		"a name and a target":             {args: []string{"x", "--target=t", "--mine"}, wantErr: "not both"},
		"two names":                       {args: []string{"x", "y"}, wantErr: "one BuildLock name"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseRelease(tc.args, tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || exitCode(err) != exitUsage {
					t.Fatalf("parseRelease() = %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("parseRelease() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseStatusAndForceRelease(t *testing.T) {
	s, err := parseStatus([]string{"-A", "--target", "staging", "-o", "yaml"})
	if err != nil || !s.allNamespaces || s.target != "staging" || s.output != "yaml" {
		t.Errorf("parseStatus() = %+v, %v", s, err)
	}
	if s, err := parseStatus(nil); err != nil || s.output != "table" || s.allNamespaces {
		t.Errorf("parseStatus(nil) = %+v, %v", s, err)
	}
	for _, args := range [][]string{{"-o", "wide"}, {"staging"}} {
		if _, err := parseStatus(args); exitCode(err) != exitUsage {
			t.Errorf("parseStatus(%q) = %v, want a usage error", args, err)
		}
	}
	f, err := parseForceRelease([]string{"--target", "staging", "--reason", "  hangs  ", "-n", "ci"})
	if err != nil || f.target != "staging" || f.reason != "hangs" || f.kube.namespace != "ci" {
		t.Errorf("parseForceRelease() = %+v, %v", f, err)
	}
	for args, want := range map[string]string{
		"--target=staging":           "--reason is required",
		"--reason=x":                 "--target is required",
		"--target=staging --reason=": "--reason is required",
		"":                           "--target and --reason are required",
	} {
		if _, err := parseForceRelease(strings.Fields(args)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseForceRelease(%q) = %v, want %q", args, err, want)
		}
	}
}

// FuzzParseAcquire checks that no command line makes the parser panic, that
// an accepted one has a target and a command only after "--", and that its
// errors are usage errors.
func FuzzParseAcquire(f *testing.F) {
	f.Add("--target staging --repo acme/shop --branch main --build 42 -- ./deploy.sh")
	f.Add("--target= --build=-1 -- --")
	f.Add("-n ci --timeout 1h30m --pod= --expires-after 10s --target t")
	f.Add("--help --target")
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Fields(line)
		o, err := parseAcquire(args, githubEnv)
		if err != nil {
			if !errors.Is(err, errHelp) && exitCode(err) != exitUsage {
				t.Errorf("parseAcquire(%q) = %v, not a usage error", args, err)
			}
			return
		}
		if o.claim.Target == "" {
			t.Errorf("parseAcquire(%q) accepted no target", args)
		}
		if len(o.command) > 0 && !slices.Contains(args, "--") {
			t.Errorf("parseAcquire(%q) found command %q without --", args, o.command)
		}
	})
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
