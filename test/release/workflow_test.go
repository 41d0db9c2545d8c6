package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// workflow is as much of a GitHub workflow as the tests read.
type workflow struct {
	// On is the "on" key, which YAML 1.1 reads as true.
	On struct {
		Push struct {
			Tags []string `json:"tags"`
		} `json:"push"`
	} `json:"true"`
	Permissions map[string]string `json:"permissions"`
	Jobs        map[string]struct {
		Permissions map[string]string `json:"permissions"`
		Steps       []struct {
			Name string            `json:"name"`
			Uses string            `json:"uses"`
			With map[string]string `json:"with"`
			Run  string            `json:"run"`
		} `json:"steps"`
	} `json:"jobs"`
}

func readWorkflow(t *testing.T) workflow {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var w workflow
	if err := yaml.Unmarshal(data, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// makeVar reads a variable's default (NAME ?= value) from the Makefile or
// a file it includes.
func makeVar(t *testing.T, name string) string {
	t.Helper()
	for _, f := range []string{"Makefile", "hack/release.mk"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(`(?m)^` + name + ` \?= (\S+)$`).FindSubmatch(data); m != nil {
			return string(m[1])
		}
	}
	t.Fatalf("the Makefile sets no %s", name)
	return ""
}

// TestTheWorkflowReleasesWhatMakeChecks: a v* tag triggers it; only the
// release job may write, and it may sign (id-token); it runs the GoReleaser
// and Helm that the Makefile pins, and krew-release-bot.
func TestTheWorkflowReleasesWhatMakeChecks(t *testing.T) {
	w := readWorkflow(t)
	if strings.Join(w.On.Push.Tags, ",") != "v*" {
		t.Errorf("on.push.tags = %q, want [v*]", w.On.Push.Tags)
	}
	if len(w.Permissions) != 1 || w.Permissions["contents"] != "read" {
		t.Errorf("the workflow's default permissions are %v, want contents: read", w.Permissions)
	}
	release := w.Jobs["release"]
	for _, p := range []string{"contents", "packages", "id-token"} {
		if release.Permissions[p] != "write" {
			t.Errorf("the release job needs %s: write, has %v", p, release.Permissions)
		}
	}
	uses := map[string]map[string]string{}
	for _, s := range release.Steps {
		if name, _, ok := strings.Cut(s.Uses, "@"); ok {
			uses[name] = s.With
		}
	}
	if got, want := uses["goreleaser/goreleaser-action"]["version"], makeVar(t, "GORELEASER_VERSION"); got != want {
		t.Errorf("the workflow runs GoReleaser %q, the Makefile checks with %s", got, want)
	}
	if got, want := uses["azure/setup-helm"]["version"], makeVar(t, "HELM_VERSION"); got != want {
		t.Errorf("the workflow pushes the chart with helm %q, the Makefile tests it with %s", got, want)
	}
	bot := false
	for _, s := range w.Jobs["krew-index"].Steps {
		bot = bot || strings.HasPrefix(s.Uses, "rajatjindal/krew-release-bot@")
	}
	if !bot {
		t.Error("no job runs krew-release-bot")
	}
}

// TestTheTagCheck runs the workflow's first step, which refuses a tag the
// repository was not prepared for, in a copy of the files it reads.
func TestTheTagCheck(t *testing.T) {
	var script string
	for _, s := range readWorkflow(t).Jobs["release"].Steps {
		if s.Name == "Check that the tag is a release the repository was prepared for" {
			script = s.Run
		}
	}
	if script == "" {
		t.Fatal("the release job has no step that checks the tag")
	}
	chart, err := os.ReadFile(filepath.Join(root, "charts", "buildlock", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	setVersions := func(version, appVersion string) string {
		s := regexp.MustCompile(`(?m)^version: .*$`).ReplaceAllString(string(chart), "version: "+version)
		return regexp.MustCompile(`(?m)^appVersion: .*$`).ReplaceAllString(s, `appVersion: "`+appVersion+`"`)
	}
	const changelog = "# Changelog\n\n## [Unreleased]\n\n- Later.\n\n## [1.2.3] - 2026-12-01\n\n- The release.\n\n## [1.2.2]\n\n- Before.\n"
	for name, tc := range map[string]struct {
		tag, chart, changelog string
		ok                    bool
		notes, output         string
	}{
		"a prepared release":         {"v1.2.3", setVersions("1.2.3", "1.2.3"), changelog, true, "\n- The release.\n\n", "prerelease=false"},
		"a prepared prerelease":      {"v1.3.0-rc.1", setVersions("1.3.0-rc.1", "1.3.0-rc.1"), changelog + "## [1.3.0-rc.1]\n\n- Soon.\n", true, "\n- Soon.\n", "prerelease=true"},
		"a chart not bumped":         {"v1.2.3", setVersions("1.2.2", "1.2.3"), changelog, false, "", ""},
		"an appVersion not bumped":   {"v1.2.3", setVersions("1.2.3", "1.2.2"), changelog, false, "", ""},
		"no CHANGELOG section":       {"v1.2.4", setVersions("1.2.4", "1.2.4"), changelog, false, "", ""},
		"a tag that is not semver":   {"v1.2", setVersions("1.2", "1.2"), changelog, false, "", ""},
		"the repository's own files": {"v" + chartField(t, string(chart), "appVersion"), string(chart), mustRead(t, "CHANGELOG.md"), chartField(t, string(chart), "version") == chartField(t, string(chart), "appVersion"), "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.MkdirAll(filepath.Join(dir, "charts", "buildlock"), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "charts", "buildlock", "Chart.yaml"), []byte(tc.chart), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(tc.changelog), 0o644))
			runnerTemp := t.TempDir()
			output := filepath.Join(runnerTemp, "output")
			cmd := exec.Command("bash", "-e", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "TAG="+tc.tag, "RUNNER_TEMP="+runnerTemp, "GITHUB_OUTPUT="+output)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Fatalf("the tag check of %s: %v, want success %v:\n%s", tc.tag, err, tc.ok, out)
			}
			if !tc.ok || tc.output == "" {
				return
			}
			notes, _ := os.ReadFile(filepath.Join(runnerTemp, "notes.md"))
			outputs, _ := os.ReadFile(output)
			if string(notes) != tc.notes || !strings.Contains(string(outputs), tc.output+"\n") {
				t.Errorf("notes %q (want %q), outputs %q (want %s)", notes, tc.notes, outputs, tc.output)
			}
		})
	}
}

// chartField reads a top-level field of Chart.yaml.
func chartField(t *testing.T, chart, field string) string {
	t.Helper()
	var c map[string]any
	if err := yaml.Unmarshal([]byte(chart), &c); err != nil {
		t.Fatal(err)
	}
	s, _ := c[field].(string)
	return s
}

func mustRead(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
