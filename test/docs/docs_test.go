// Package docs holds the claims of README.md and docs/ that can drift from
// the code to the code: every relative link resolves, the reasons and phases
// are the API's, the plugin's platforms and release are the ones a release
// publishes, the metrics and alerts are the manager's and the chart's, and
// README's five minutes at the terminal run as written, in order, as do its
// other kubectl commands that read claims, one by one (readme_test.go). The
// flags (cmd/manager), exit codes (cmd/kubectl-buildlock) and what the
// manager watches (internal/controller) are held by tests next to that code.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/buildlock/buildlock/internal/doctest"
)

// docs returns the Markdown files at the repository's root (README.md,
// CONTRIBUTING.md, SECURITY.md, ...) and every one under docs/, relative to
// the root.
func docs(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	err = filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	link     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan = regexp.MustCompile("`[^`]*`")
)

// TestRelativeLinksResolve checks that every relative link of the root's
// Markdown files (README.md first) and of docs/ names a file or directory that exists, and, into a Markdown file,
// one of its headings.
func TestRelativeLinksResolve(t *testing.T) {
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(data))
		anchors[file] = a
		return a
	}
	for _, doc := range docs(t, root) {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range doctest.Headings(string(data)) {
			for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(h.Title+"\n"+h.Body, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := filepath.Join(root, doc)
				if path != "" {
					file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				}
				info, err := os.Stat(file)
				if err != nil {
					t.Errorf("%s: the link %q names nothing: %v", doc, target, err)
					continue
				}
				if anchor != "" && !info.IsDir() && strings.HasSuffix(file, ".md") && !anchorsOf(file)[anchor] {
					t.Errorf("%s: the link %q names no heading of %s", doc, target, filepath.Base(file))
				}
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown
// document: lowercased, punctuation dropped, spaces as hyphens, and -1, -2,
// ... for repeats.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, h := range doctest.Headings(doc)[1:] {
		var b strings.Builder
		for _, r := range strings.ToLower(strings.ReplaceAll(h.Title, "`", "")) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetter(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// isLetter reports whether a non-ASCII rune is kept in an anchor: letters
// are, symbols (arrows, dashes, ×) are not.
func isLetter(r rune) bool {
	return strings.ContainsRune("àáâäçèéêëíîïñóôöúûüß", r)
}

// TestReasonsAndPhasesAreTheAPIs holds docs/troubleshooting.md to
// api/v1alpha1: its tables of a claim's reasons, of a policy's conditions and
// of the windows' events have a row for every Reason* constant and none for another, and the phases
// of the claims' table are the API's phases, each at least once. README's
// table of phases names only the API's.
func TestReasonsAndPhasesAreTheAPIs(t *testing.T) {
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	reasons, phases := apiConstants(t, filepath.Join(root, "api", "v1alpha1"))

	claims, err := doctest.Table("docs/troubleshooting.md", "A claim's reasons")
	if err != nil {
		t.Fatal(err)
	}
	policies, err := doctest.Table("docs/troubleshooting.md", "A policy's conditions")
	if err != nil {
		t.Fatal(err)
	}
	events, err := doctest.Table("docs/troubleshooting.md", "Events of deploy windows")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	documentedPhases := map[string]bool{}
	for _, row := range slices.Concat(claims, policies, events) {
		reason, _ := doctest.CodeSpan(row[0])
		if !reasons[reason] {
			t.Errorf("docs/troubleshooting.md documents the reason %q, which api/v1alpha1 does not define", row[0])
		}
		if documented[reason] {
			t.Errorf("docs/troubleshooting.md documents the reason %q twice", reason)
		}
		documented[reason] = true
	}
	for _, row := range claims {
		phase, _ := doctest.CodeSpan(row[1])
		if !phases[phase] {
			t.Errorf("docs/troubleshooting.md: the reason %s has the phase %q, which api/v1alpha1 does not define", row[0], row[1])
		}
		documentedPhases[phase] = true
	}
	for reason := range reasons {
		if !documented[reason] {
			t.Errorf("docs/troubleshooting.md does not document the reason %q (api/v1alpha1)", reason)
		}
	}
	for phase := range phases {
		if !documentedPhases[phase] {
			t.Errorf("docs/troubleshooting.md: no reason of the phase %q (api/v1alpha1)", phase)
		}
	}

	readme, err := doctest.Table("README.md", "buildlock")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range readme {
		if phase, _ := doctest.CodeSpan(row[0]); !phases[phase] {
			t.Errorf("README.md's table of phases names %q, which api/v1alpha1 does not define", row[0])
		}
	}
}

// apiConstants reads the string values of api/v1alpha1's Reason* constants
// and of its constants of type Phase.
func apiConstants(t *testing.T, dir string) (reasons, phases map[string]bool) {
	t.Helper()
	reasons, phases = map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					value, _ := strconv.Unquote(lit.Value)
					if typ, ok := vs.Type.(*ast.Ident); ok && typ.Name == "Phase" {
						phases[value] = true
					}
					if strings.HasPrefix(name.Name, "Reason") {
						reasons[value] = true
					}
				}
			}
		}
	}
	if len(reasons) == 0 || len(phases) == 0 {
		t.Fatalf("found no reasons or no phases in %s", dir)
	}
	return reasons, phases
}

// TestPluginPlatformsAndRelease holds the docs to what a release publishes:
// the krew manifest (GoReleaser's krews:) offers the archives of every
// platform GoReleaser builds (.goreleaser.yaml); docs/install.md and docs/pipelines.md name those
// platforms in one phrase ("Linux, macOS and Windows, on amd64 and arm64");
// and every release the docs install or pin is the chart's version.
func TestPluginPlatformsAndRelease(t *testing.T) {
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		data, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}

	var goreleaser struct {
		Builds []struct {
			ID      string   `json:"id"`
			Targets []string `json:"targets"`
		} `json:"builds"`
	}
	if err := yaml.Unmarshal([]byte(read(".goreleaser.yaml")), &goreleaser); err != nil {
		t.Fatal(err)
	}
	var built []string
	for _, b := range goreleaser.Builds {
		if b.ID == "kubectl-buildlock" {
			built = b.Targets
		}
	}
	// GoReleaser writes the krew manifest from the archives of the plugin's
	// build (krews: ids), one platform each.
	var krews struct {
		Krews []struct {
			IDs []string `json:"ids"`
		} `json:"krews"`
	}
	if err := yaml.Unmarshal([]byte(read(".goreleaser.yaml")), &krews); err != nil {
		t.Fatal(err)
	}
	if len(built) == 0 || len(krews.Krews) != 1 || !slices.Equal(krews.Krews[0].IDs, []string{"kubectl-buildlock"}) {
		t.Errorf(".goreleaser.yaml's krew manifest must offer the archives of the build kubectl-buildlock (targets %v): %+v", built, krews.Krews)
	}

	phrase := platformsPhrase(built)
	for _, doc := range []string{"docs/install.md", "docs/pipelines.md"} {
		if !strings.Contains(strings.Join(strings.Fields(read(doc)), " "), phrase) {
			t.Errorf("%s does not say that the plugin is published for %q (.goreleaser.yaml's targets)", doc, phrase)
		}
	}

	var chart struct {
		Version string `json:"version"`
	}
	if err := yaml.Unmarshal([]byte(read("charts/buildlock/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	release := regexp.MustCompile(`releases/download/v([0-9][^/\s]*)/|kubectl-buildlock@v([0-9][^\s"'` + "`" + `]*)|buildlock/buildlock@v([0-9][^\s"'` + "`" + `]*)|VERSION=v([0-9]\S*)|charts/buildlock --version ([0-9]\S*)`)
	for _, doc := range docs(t, root) {
		if strings.HasPrefix(doc, "docs/runs/") {
			continue // records of their day
		}
		for _, m := range release.FindAllStringSubmatch(read(doc), -1) {
			if version := strings.Join(m[1:], ""); version != chart.Version {
				t.Errorf("%s installs or pins release %s (%q); the release is %s (charts/buildlock/Chart.yaml)", doc, version, m[0], chart.Version)
			}
		}
	}
}

// platformsPhrase says targets (os_arch) in words: "Linux, macOS and
// Windows, on amd64 and arm64". Every operating system must be built for
// every architecture, or the phrase would lie.
func platformsPhrase(targets []string) string {
	names := map[string]string{"linux": "Linux", "darwin": "macOS", "windows": "Windows"}
	var oses, arches []string
	for _, target := range targets {
		goos, goarch, _ := strings.Cut(target, "_")
		if !slices.Contains(oses, names[goos]) {
			oses = append(oses, names[goos])
		}
		if !slices.Contains(arches, goarch) {
			arches = append(arches, goarch)
		}
	}
	if len(oses)*len(arches) != len(targets) {
		return "every operating system on every architecture, which " + strings.Join(targets, " ") + " are not"
	}
	and := func(words []string) string {
		if len(words) == 1 {
			return words[0]
		}
		return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
	}
	return and(oses) + ", on " + and(arches)
}

// TestMetricsAndAlertsAreDocumented holds docs/operations.md's tables of
// metrics and alerts to the code: a row for every metric the manager
// defines (a "buildlock_..." name in internal/) and for every alert of the
// chart's PrometheusRule, and none for another.
func TestMetricsAndAlertsAreDocumented(t *testing.T) {
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var metrics []string
	name := regexp.MustCompile(`"(buildlock_[a-z_]+)"`)
	err = filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		for _, m := range name.FindAllStringSubmatch(string(data), -1) {
			metrics = append(metrics, m[1])
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rule, err := os.ReadFile(filepath.Join(root, "charts", "buildlock", "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllStringSubmatch(string(rule), -1) {
		alerts = append(alerts, m[1])
	}
	for _, tc := range []struct {
		heading, source string
		want            []string
	}{
		{"Metrics", "internal/", metrics},
		{"Alerts", "charts/buildlock/templates/prometheusrule.yaml", alerts},
	} {
		rows, err := doctest.Table("docs/operations.md", tc.heading)
		if err != nil {
			t.Fatal(err)
		}
		var documented []string
		for _, row := range rows {
			n, _ := doctest.CodeSpan(row[0])
			documented = append(documented, n)
		}
		slices.Sort(documented)
		want := slices.Compact(slices.Sorted(slices.Values(tc.want)))
		if len(want) == 0 || !slices.Equal(documented, want) {
			t.Errorf("docs/operations.md's %s table lists %v; %s defines %v", tc.heading, documented, tc.source, want)
		}
	}
}
