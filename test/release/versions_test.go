package release

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The release's version has one source: the tag, vX.Y.Z. Before tagging,
// the repository names that release everywhere (CHANGELOG.md's newest
// section, the chart's version and appVersion, and every file that tells a
// user which release to take), so that what the tag builds and what the
// documents say are one thing. The tests below read the version from
// Chart.yaml and hold every other reference to it.

// semver matches a version, with or without its v, and a prerelease.
const semver = `v?\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?`

// versionRef is a kind of reference to a buildlock release: where it
// appears, and the form of the version there.
type versionRef struct {
	// what names the reference in a failure.
	what string
	// re matches it; its first group is the version.
	re *regexp.Regexp
	// tag is whether the version is written as the tag (v0.2.0) rather
	// than bare (0.2.0).
	tag bool
}

// versionRefs are the references to a buildlock release that files make.
// Each must match somewhere (TestEveryVersionReferenceIsTheRelease checks
// it), so that a pattern that no longer matches anything is noticed.
var versionRefs = []versionRef{
	{"a GitHub action or GitLab component reference (owner/repo@tag)", regexp.MustCompile(`buildlock/buildlock@(` + semver + `)`), true},
	{"a Jenkins shared library reference", regexp.MustCompile(`@Library\('buildlock@(` + semver + `)'\)`), true},
	{"a release file's URL", regexp.MustCompile(`github\.com/buildlock/buildlock/releases/download/(` + semver + `)/`), true},
	{"a file of the tagged tree", regexp.MustCompile(`raw\.githubusercontent\.com/buildlock/buildlock/(` + semver + `)/`), true},
	{"a `go install` of the plugin", regexp.MustCompile(`github\.com/buildlock/buildlock/cmd/kubectl-buildlock@(` + semver + `)`), true},
	{"an archive's name", regexp.MustCompile(`kubectl-buildlock_(` + semver + `)_`), true},
	{"a VERSION= line", regexp.MustCompile(`\bVERSION=(` + semver + `)\b`), true},
	{"a git resolver's revision", regexp.MustCompile(`revision(?:\W{1,4}|, value: )(` + semver + `)\b`), true},
	{"an image of the release (ghcr.io/buildlock/...:X.Y.Z)", regexp.MustCompile(`ghcr\.io/buildlock/(?:buildlock|kubectl-buildlock|charts/buildlock):(` + semver + `)\b`), false},
	{"a chart version (helm --version)", regexp.MustCompile(`charts/buildlock\b.*--version[ =](` + semver + `)\b`), false},
	{"an image a user builds from the release", regexp.MustCompile(`registry\.example\.com/tools/[a-z-]*buildlock:(` + semver + `)\b`), true},
}

// notBuildlock are versions of other software that appear on lines naming
// buildlock: the generated CRDs' controller-gen, Kubernetes, Tekton, the
// test image's curl.
var notBuildlock = regexp.MustCompile(`controller-gen\.kubebuilder\.io/version: v\d|kubeVersion: |pipelines\.minVersion: |curlimages/curl|tag: "8\.`)

// anyVersion finds a version on a line that names buildlock.
var anyVersion = regexp.MustCompile(`(?:^|[^\w.-])(` + semver + `)\b`)

// userFiles lists the tracked files a user reads or runs: everything but
// Go modules' sums, tests and their fixtures (which use versions of their
// own), the benchmark harness, and the CHANGELOG (checked on its own).
func userFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		switch {
		case f == "" || f == "CHANGELOG.md" || f == "go.mod" || f == "go.sum",
			strings.HasSuffix(f, "/go.mod"), strings.HasSuffix(f, "/go.sum"),
			strings.HasSuffix(f, "_test.go"), strings.Contains(f, "/testdata/"),
			strings.HasPrefix(f, "test/bench/"):
			continue
		}
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			continue // deleted in the work tree
		}
		files = append(files, f)
	}
	return files
}

// releaseVersion is the version the repository is prepared to release:
// charts/buildlock/Chart.yaml's version, without a v.
func releaseVersion(t *testing.T) string {
	t.Helper()
	chart := mustRead(t, "charts/buildlock/Chart.yaml")
	v := chartField(t, chart, "version")
	if !regexp.MustCompile(`^`+semver+`$`).MatchString(v) || strings.HasPrefix(v, "v") {
		t.Fatalf("charts/buildlock/Chart.yaml's version %q is not X.Y.Z", v)
	}
	return v
}

// TestTheReleaseIsOneVersion: the chart's version and appVersion, the
// newest section of CHANGELOG.md (under an [Unreleased] one), its link, and
// config/manager's image are one release.
func TestTheReleaseIsOneVersion(t *testing.T) {
	v := releaseVersion(t)
	chart := mustRead(t, "charts/buildlock/Chart.yaml")
	if got := chartField(t, chart, "appVersion"); got != v {
		t.Errorf("Chart.yaml: version %s, appVersion %s; the operator and its chart are released together, set both to the release", v, got)
	}
	changelog := mustRead(t, "CHANGELOG.md")
	sections := regexp.MustCompile(`(?m)^## \[([^\]]+)\](.*)$`).FindAllStringSubmatch(changelog, 2)
	if len(sections) < 2 || sections[0][1] != "Unreleased" || strings.TrimSpace(sections[0][2]) != "" {
		t.Fatalf("CHANGELOG.md must start with an ## [Unreleased] section, then the newest release; has %q", sections)
	}
	if sections[1][1] != v || !regexp.MustCompile(`^ - \d{4}-\d{2}-\d{2}$`).MatchString(sections[1][2]) {
		t.Errorf("CHANGELOG.md's newest release is %q%s, want ## [%s] - YYYY-MM-DD", sections[1][1], sections[1][2], v)
	}
	if link := "[" + v + "]: https://github.com/buildlock/buildlock/releases/tag/v" + v; !strings.Contains(changelog, "\n"+link+"\n") {
		t.Errorf("CHANGELOG.md lacks the link %q", link)
	}
	if want := "image: ghcr.io/buildlock/buildlock:" + v; !strings.Contains(mustRead(t, "config/manager/manager.yaml"), want) {
		t.Errorf("config/manager/manager.yaml does not say %q", want)
	}
}

// TestEveryVersionReferenceIsTheRelease reads every file a user reads or
// runs: each reference to a buildlock release names the release of
// Chart.yaml in the form its place needs (the tag vX.Y.Z for git refs,
// release URLs and the plugin's version; X.Y.Z for the images and the
// chart), and a line that names buildlock names no other version.
func TestEveryVersionReferenceIsTheRelease(t *testing.T) {
	v := releaseVersion(t)
	matched := make([]int, len(versionRefs))
	for _, f := range userFiles(t) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			for _, problem := range checkLine(sc.Text(), v, matched) {
				t.Errorf("%s:%d: %s: %s", f, n, problem, strings.TrimSpace(sc.Text()))
			}
		}
	}
	for i, r := range versionRefs {
		if matched[i] == 0 {
			t.Errorf("no file has %s (%s): drop the pattern or fix it", r.what, r.re)
		}
	}
}

// TestTheVersionCheckCatchesAStaleReference feeds the check lines that
// name another release, as the files did before 0.2.0.
func TestTheVersionCheckCatchesAStaleReference(t *testing.T) {
	const v = "0.2.0"
	for _, line := range []string{
		"  - uses: buildlock/buildlock@v0.1.0",
		"  - component: $CI_SERVER_FQDN/platform/buildlock/buildlock@0.2.0",
		"@Library('buildlock@v0.1.0') _",
		"        image: ghcr.io/buildlock/buildlock:0.1.0",
		"        image: ghcr.io/buildlock/buildlock:v0.2.0",
		"kubectl krew install --manifest-url=https://github.com/buildlock/buildlock/releases/download/0.2.0/buildlock.yaml",
		"helm install buildlock oci://ghcr.io/buildlock/charts/buildlock --version 0.1.0",
		"VERSION=v0.1.0 OS=linux ARCH=amd64",
		"The kubectl-buildlock release to install, such as v0.1.0",
		"# {name: revision, value: v0.1.0}, {name: pathInRepo, value:",
	} {
		if len(checkLine(line, v, nil)) == 0 {
			t.Errorf("the check passes %q", line)
		}
	}
	for _, line := range []string{
		"  - uses: buildlock/buildlock@v0.2.0",
		"        image: ghcr.io/buildlock/buildlock:0.2.0",
		"    controller-gen.kubebuilder.io/version: v0.23.0",
	} {
		if s := checkLine(line, v, nil); len(s) != 0 {
			t.Errorf("the check refuses %q: %s", line, s)
		}
	}
}

// checkLine returns what is wrong with the version references of one
// line, for the release v (X.Y.Z), and counts the matches of each of
// versionRefs in matched (when not nil).
func checkLine(line, v string, matched []int) []string {
	var problems []string
	known := map[string]bool{}
	for i, r := range versionRefs {
		for _, m := range r.re.FindAllStringSubmatch(line, -1) {
			if matched != nil {
				matched[i]++
			}
			known[m[1]] = true
			want := v
			if r.tag {
				want = "v" + v
			}
			if m[1] != want {
				problems = append(problems, fmt.Sprintf("%s names %s, want %s", r.what, m[1], want))
			}
		}
	}
	if !strings.Contains(strings.ToLower(line), "buildlock") || notBuildlock.MatchString(line) {
		return problems
	}
	for _, m := range anyVersion.FindAllStringSubmatch(line, -1) {
		if !known[m[1]] && strings.TrimPrefix(m[1], "v") != v {
			problems = append(problems, fmt.Sprintf("names version %s beside buildlock, not the release %s", m[1], v))
		}
	}
	return problems
}
