// Package release tests the release that a v* tag makes as far as it runs
// without building it: the workflows (.github/workflows), Dependabot's
// configuration, the one version the repository names, and the agreement
// of the tools' configurations (.goreleaser.yaml, .ko.yaml, the
// Dockerfiles, hack/release.mk). `make release-rehearsal` (test/rehearsal)
// builds the release itself, offline, and installs it.
package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// root is the repository, from this package's directory.
const root = "../.."

// workflow is as much of a GitHub workflow as the tests read.
type workflow struct {
	// On is the "on" key, which YAML 1.1 reads as true.
	On          map[string]any    `json:"true"`
	Permissions map[string]string `json:"permissions"`
	Jobs        map[string]job    `json:"jobs"`
}

type job struct {
	Needs       any               `json:"needs"`
	Uses        string            `json:"uses"`
	Permissions map[string]string `json:"permissions"`
	Steps       []struct {
		Name string            `json:"name"`
		Uses string            `json:"uses"`
		With map[string]string `json:"with"`
		Env  map[string]string `json:"env"`
		Run  string            `json:"run"`
	} `json:"steps"`
}

// needs lists a job's needs (a string or a list in YAML).
func (j job) needs() []string {
	switch n := j.Needs.(type) {
	case string:
		return []string{n}
	case []any:
		var out []string
		for _, s := range n {
			out = append(out, s.(string))
		}
		return out
	}
	return nil
}

// runs is every run: script of the job.
func (j job) runs() string {
	var b strings.Builder
	for _, s := range j.Steps {
		b.WriteString(s.Run + "\n")
	}
	return b.String()
}

func readWorkflow(t *testing.T, file string) workflow {
	t.Helper()
	var w workflow
	if err := yaml.Unmarshal([]byte(mustRead(t, ".github/workflows/"+file)), &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// makeTargets are the targets `make X` runs in a script (its words after
// make that are not variables or flags).
func makeTargets(script string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)\bmake((?: +[^\s|;&]+)+)`).FindAllStringSubmatch(script, -1) {
		for _, w := range strings.Fields(m[1]) {
			if !strings.Contains(w, "=") && !strings.HasPrefix(w, "-") {
				out = append(out, w)
			}
		}
	}
	return out
}

// prerequisites are a make target's prerequisites in hack/release.mk.
func prerequisites(t *testing.T, target string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + target + `: ([^#\n]*)`).FindStringSubmatch(mustRead(t, "hack/release.mk"))
	if m == nil {
		t.Fatalf("hack/release.mk has no target %s", target)
	}
	return strings.Fields(m[1])
}

// TestCIRunsDotCIRun: every push and pull request runs .ci/run, which runs
// the release rehearsal.
func TestCIRunsDotCIRun(t *testing.T) {
	w := readWorkflow(t, "ci.yml")
	for _, event := range []string{"push", "pull_request"} {
		if _, ok := w.On[event]; !ok {
			t.Errorf("ci.yml does not run on %s (on: %v)", event, w.On)
		}
	}
	if len(w.Permissions) != 1 || w.Permissions["contents"] != "read" {
		t.Errorf("ci.yml's permissions are %v, want contents: read", w.Permissions)
	}
	var runs string
	for _, j := range w.Jobs {
		runs += j.runs()
	}
	if !strings.Contains(runs, ".ci/run") {
		t.Error("no job of ci.yml runs .ci/run")
	}
	if !slices.Contains(makeTargets(mustRead(t, ".ci/run")), "release-rehearsal") {
		t.Error(".ci/run does not run make release-rehearsal")
	}
}

// TestTheReleasePublishesWhatWasRehearsed: a v* tag runs .ci/run first
// (the rehearsal included); the job that publishes needs it and runs the
// targets of `make release`, which the rehearsal runs, and no other build;
// only it may write, and provenance comes after it.
func TestTheReleasePublishesWhatWasRehearsed(t *testing.T) {
	w := readWorkflow(t, "release.yml")
	push, _ := w.On["push"].(map[string]any)
	if tags, _ := push["tags"].([]any); len(tags) != 1 || tags[0] != "v*" {
		t.Errorf("release.yml runs on %v, want a push of tags v*", w.On)
	}
	if len(w.Permissions) != 1 || w.Permissions["contents"] != "read" {
		t.Errorf("the workflow's default permissions are %v, want contents: read", w.Permissions)
	}
	check, release := w.Jobs["check"], w.Jobs["release"]
	rehearsesAll := false
	for _, s := range check.Steps {
		rehearsesAll = rehearsesAll || strings.Contains(s.Run, ".ci/run") && s.Env["REHEARSAL_PLATFORMS"] == "all"
	}
	if !rehearsesAll {
		t.Error("the check job does not run .ci/run with REHEARSAL_PLATFORMS=all (the rehearsal of every archive a tag publishes)")
	}
	if !slices.Equal(release.needs(), []string{"check"}) {
		t.Errorf("the release job needs %v, want [check]: nothing publishes before the checks pass", release.needs())
	}
	for _, p := range []string{"contents", "packages", "id-token"} {
		if release.Permissions[p] != "write" {
			t.Errorf("the release job needs %s: write, has %v", p, release.Permissions)
		}
	}
	for name, j := range w.Jobs {
		if name != "release" && name != "check" && !slices.Contains(j.needs(), "release") {
			t.Errorf("job %s does not wait for the release", name)
		}
		if name == "check" && len(j.Permissions) != 0 {
			t.Errorf("the check job asks for %v", j.Permissions)
		}
	}
	got := makeTargets(release.runs())
	slices.Sort(got)
	want := prerequisites(t, "release")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the release job runs make %v; `make release`, which the rehearsal runs, is %v", got, want)
	}
	if !slices.Contains(prerequisites(t, "release-rehearsal"), "$(GORELEASER)") || !strings.Contains(mustRead(t, "test/rehearsal/rehearsal_test.go"), `r.make(t, "release",`) {
		t.Error("the rehearsal does not run make release")
	}
	if m := regexp.MustCompile(`(?m)^\s*(goreleaser|ko|helm|docker|syft)\s`).FindString(release.runs()); m != "" {
		t.Errorf("the release job runs %s itself instead of through make", strings.TrimSpace(m))
	}
}

// TestActionsArePinnedByCommit: every action is pinned by a full commit,
// with its version in a comment for Dependabot and readers; the SLSA
// generator's reusable workflows are the exception, by tag, as they
// require.
func TestActionsArePinnedByCommit(t *testing.T) {
	pinned := regexp.MustCompile(`^\s*(?:-\s+)?uses:\s+([^@\s]+)@([0-9a-f]{40}) # v\d+\.\d+\.\d+$`)
	slsa := regexp.MustCompile(`^\s*uses:\s+slsa-framework/slsa-github-generator/\.github/workflows/generator_[a-z_]+_slsa3\.yml@v\d+\.\d+\.\d+$`)
	files, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("the workflows: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, "uses:") || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			if !pinned.MatchString(line) && !slsa.MatchString(line) {
				t.Errorf("%s:%d: not pinned by commit with its version in a comment: %s", filepath.Base(f), n+1, strings.TrimSpace(line))
			}
		}
	}
}

// TestActionlint: both workflows pass actionlint ($ACTIONLINT; `make lint`
// runs it too).
func TestActionlint(t *testing.T) {
	actionlint := os.Getenv("ACTIONLINT")
	if actionlint == "" {
		t.Skip("ACTIONLINT is not set: `make lint` runs actionlint on the workflows")
	}
	cmd := exec.Command(actionlint, "-no-color", ".github/workflows/ci.yml", ".github/workflows/release.yml")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("actionlint: %v\n%s", err, out)
	}
}

// TestDependabotCoversEveryDependency: Dependabot updates the Go modules of
// every go.mod, the actions, the images of every Dockerfile, and the
// chart.
func TestDependabotCoversEveryDependency(t *testing.T) {
	var cfg struct {
		Updates []struct {
			Ecosystem   string   `json:"package-ecosystem"`
			Directory   string   `json:"directory"`
			Directories []string `json:"directories"`
		} `json:"updates"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(t, ".github/dependabot.yml")), &cfg); err != nil {
		t.Fatal(err)
	}
	dirs := map[string][]string{}
	for _, u := range cfg.Updates {
		if u.Directory != "" {
			dirs[u.Ecosystem] = append(dirs[u.Ecosystem], u.Directory)
		}
		dirs[u.Ecosystem] = append(dirs[u.Ecosystem], u.Directories...)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "*go.mod", "*Dockerfile", "*.Dockerfile").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, f := range strings.Fields(string(out)) {
		dir := "/" + filepath.ToSlash(filepath.Dir(f))
		if dir == "/." {
			dir = "/"
		}
		eco := "gomod"
		if strings.Contains(f, "Dockerfile") {
			eco = "docker"
		}
		if !slices.Contains(dirs[eco], dir) {
			t.Errorf("Dependabot's %s updates do not cover %s (%s)", eco, dir, f)
		}
	}
	if !slices.Contains(dirs["github-actions"], "/") {
		t.Error("Dependabot does not update the workflows' actions")
	}
	if !slices.Contains(dirs["helm"], "/charts/buildlock") {
		t.Error("Dependabot does not update the chart's images")
	}
}

// TestTheTagCheck runs the check job's first step, which refuses a tag the
// repository was not prepared for, in a copy of the files it reads.
func TestTheTagCheck(t *testing.T) {
	script := stepScript(t, "check", "Check that the tag is a release the repository was prepared for")
	chart := mustRead(t, "charts/buildlock/Chart.yaml")
	setVersions := func(version, appVersion string) string {
		s := regexp.MustCompile(`(?m)^version: .*$`).ReplaceAllString(chart, "version: "+version)
		return regexp.MustCompile(`(?m)^appVersion: .*$`).ReplaceAllString(s, `appVersion: "`+appVersion+`"`)
	}
	const changelog = "# Changelog\n\n## [Unreleased]\n\n- Later.\n\n## [1.2.3] - 2026-12-01\n\n- The release.\n\n## [1.2.2] - 2026-11-01\n\n- Before.\n"
	for name, tc := range map[string]struct {
		tag, chart, changelog string
		ok                    bool
	}{
		"a prepared release":         {"v1.2.3", setVersions("1.2.3", "1.2.3"), changelog, true},
		"a prepared prerelease":      {"v1.3.0-rc.1", setVersions("1.3.0-rc.1", "1.3.0-rc.1"), changelog + "## [1.3.0-rc.1] - 2026-12-02\n\n- Soon.\n", true},
		"a chart not bumped":         {"v1.2.3", setVersions("1.2.2", "1.2.3"), changelog, false},
		"an appVersion not bumped":   {"v1.2.3", setVersions("1.2.3", "1.2.2"), changelog, false},
		"no CHANGELOG section":       {"v1.2.4", setVersions("1.2.4", "1.2.4"), changelog, false},
		"an undated section":         {"v1.2.4", setVersions("1.2.4", "1.2.4"), changelog + "## [1.2.4]\n", false},
		"a tag that is not semver":   {"v1.2", setVersions("1.2", "1.2"), changelog, false},
		"the repository's own files": {"v" + releaseVersion(t), chart, mustRead(t, "CHANGELOG.md"), true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.MkdirAll(filepath.Join(dir, "charts", "buildlock"), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "charts", "buildlock", "Chart.yaml"), []byte(tc.chart), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(tc.changelog), 0o644))
			out, err := runStep(t, dir, script, "TAG="+tc.tag)
			if (err == nil) != tc.ok {
				t.Fatalf("the tag check of %s: %v, want success %v:\n%s", tc.tag, err, tc.ok, out)
			}
		})
	}
}

// TestTheReleaseNotes runs the release job's step that writes the notes:
// the tag's CHANGELOG section, without the next section or the links.
func TestTheReleaseNotes(t *testing.T) {
	script := stepScript(t, "release", "Release notes")
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte("# Changelog\n\n## [Unreleased]\n\n- Later.\n\n## [1.2.3] - 2026-12-01\n\n- The release.\n\n## [1.2.2] - 2026-11-01\n\n- Before.\n\n[1.2.3]: https://example.com/v1.2.3\n"), 0o644))
	for tag, want := range map[string]string{"v1.2.3": "\n- The release.\n\n", "v1.2.2": "\n- Before.\n\n"} {
		runnerTemp := t.TempDir()
		if out, err := runStep(t, dir, script, "TAG="+tag, "RUNNER_TEMP="+runnerTemp); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if notes, _ := os.ReadFile(filepath.Join(runnerTemp, "notes.md")); string(notes) != want {
			t.Errorf("the notes of %s are %q, want %q", tag, notes, want)
		}
	}
	// The repository's own release has notes.
	runnerTemp := t.TempDir()
	if out, err := runStep(t, root, script, "TAG=v"+releaseVersion(t), "RUNNER_TEMP="+runnerTemp); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if notes, _ := os.ReadFile(filepath.Join(runnerTemp, "notes.md")); !regexp.MustCompile(`\S`).Match(notes) || strings.Contains(string(notes), "]: https://") {
		t.Errorf("the notes of v%s: %q", releaseVersion(t), notes)
	}
}

// stepScript is the run: script of the step name of release.yml's job.
func stepScript(t *testing.T, jobName, name string) string {
	t.Helper()
	for _, s := range readWorkflow(t, "release.yml").Jobs[jobName].Steps {
		if s.Name == name {
			return s.Run
		}
	}
	t.Fatalf("release.yml's job %s has no step %q", jobName, name)
	return ""
}

// runStep runs a step's script with bash -e, as GitHub does, in dir.
func runStep(t *testing.T, dir, script string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
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
