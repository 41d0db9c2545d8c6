package main

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// TestVersionOf: a release build reports its release; `go install ...@vX`
// reports the module's version from the build info; a build in a checkout
// its pseudo-version and commit; a build without any, "dev".
func TestVersionOf(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}
	for name, tc := range map[string]struct {
		release string
		bi      *debug.BuildInfo
		want    versionInfo
	}{
		"a release build (-X main.version) wins over the build info": {
			"v0.2.0", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			versionInfo{Version: "v0.2.0", GitCommit: "abc123", GitTreeState: "dirty", BuildDate: "2026-12-01T10:00:00Z"},
		},
		"go install ...@v0.3.1 reports the module's version": {
			"", &debug.BuildInfo{Main: debug.Module{Path: "github.com/buildlock/buildlock", Version: "v0.3.1"}},
			versionInfo{Version: "v0.3.1"},
		},
		"a build in a git checkout reports its pseudo-version and commit": {
			"", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.1-0.20261201100000-abc123abc123+dirty"}, Settings: vcs},
			versionInfo{Version: "v0.2.1-0.20261201100000-abc123abc123+dirty", GitCommit: "abc123", GitTreeState: "dirty", BuildDate: "2026-12-01T10:00:00Z"},
		},
		"a build without a version is dev": {
			"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "false"}}},
			versionInfo{Version: "dev", GitTreeState: "clean"},
		},
		"a binary without build info is dev": {"", nil, versionInfo{Version: "dev"}},
	} {
		t.Run(name, func(t *testing.T) {
			tc.want.GoVersion, tc.want.Platform = "go1.26.8", "linux/arm64"
			if got := versionOf(tc.release, tc.bi, "go1.26.8", "linux/arm64"); got != tc.want {
				t.Errorf("versionOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestVersionCommand: version prints the same fields as text, JSON and
// YAML, --version the version alone; a bad -o is a usage error.
func TestVersionCommand(t *testing.T) {
	want := currentVersion()
	code, stdout, stderr := runPlugin(t, "version", "-o", "json")
	var got versionInfo
	if code != exitOK || json.Unmarshal([]byte(stdout), &got) != nil || got != want {
		t.Errorf("version -o json exited %d: %s%s; want %+v", code, stdout, stderr, want)
	}
	code, stdout, _ = runPlugin(t, "version")
	if code != exitOK || !strings.HasPrefix(stdout, "Version:     "+want.Version+"\n") || !strings.Contains(stdout, "Go version:  "+want.GoVersion+"\n") {
		t.Errorf("version exited %d:\n%s", code, stdout)
	}
	code, stdout, _ = runPlugin(t, "version", "-o", "yaml")
	if code != exitOK || !strings.Contains(stdout, "version: "+want.Version+"\n") {
		t.Errorf("version -o yaml exited %d:\n%s", code, stdout)
	}
	code, stdout, _ = runPlugin(t, "--version")
	if code != exitOK || stdout != "kubectl buildlock version "+want.Version+"\n" {
		t.Errorf("--version exited %d: %q", code, stdout)
	}
	if code, _, stderr := runPlugin(t, "version", "-o", "wide"); code != exitUsage || !strings.Contains(stderr, "json or yaml") {
		t.Errorf("version -o wide exited %d, want 2: %s", code, stderr)
	}
}

// runPlugin runs the plugin in-process with args and no environment.
func runPlugin(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}, nil)
	return code, out.String(), errOut.String()
}
