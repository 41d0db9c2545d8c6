// Package release tests the release that a v* tag makes
// (.github/workflows/release.yml) as far as it runs without the network:
// GoReleaser's archives (a snapshot of this platform, with $GORELEASER),
// the krew manifest that krew-release-bot renders from .krew.yaml
// (validated with krew's validator, $KREW_VALIDATE, and installed with
// krew, $KREW), and the workflow's own checks of a tag. `make lint-release`
// sets all three; `make test` sets the krew tools only, and the snapshot
// test skips.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"
)

// root is the repository, from this package's directory.
const root = "../.."

// goreleaserConfig is as much of .goreleaser.yaml as the tests read.
type goreleaserConfig struct {
	Builds []struct {
		Targets []string `json:"targets"`
		Binary  string   `json:"binary"`
	} `json:"builds"`
	Archives []struct {
		NameTemplate    string   `json:"name_template"`
		Formats         []string `json:"formats"`
		FormatOverrides []struct {
			Goos    string   `json:"goos"`
			Formats []string `json:"formats"`
		} `json:"format_overrides"`
	} `json:"archives"`
}

func readConfig(t *testing.T) (goreleaserConfig, map[string]any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg goreleaserConfig
	var raw map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Builds) != 1 || len(cfg.Archives) != 1 {
		t.Fatalf(".goreleaser.yaml: want one build and one archive, have %d and %d", len(cfg.Builds), len(cfg.Archives))
	}
	return cfg, raw
}

// archiveName is the name GoReleaser gives the archive of goos/goarch for
// the release of version (without its v), from the config's template.
func (c goreleaserConfig) archiveName(t *testing.T, version, goos, goarch string) string {
	t.Helper()
	a := c.Archives[0]
	tmpl, err := template.New("name").Parse(a.NameTemplate)
	if err != nil {
		t.Fatalf("archives[0].name_template: %v", err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, map[string]string{"Version": version, "Os": goos, "Arch": goarch}); err != nil {
		t.Fatalf("archives[0].name_template: %v", err)
	}
	format := a.Formats[0]
	for _, o := range a.FormatOverrides {
		if o.Goos == goos {
			format = o.Formats[0]
		}
	}
	return b.String() + "." + format
}

// renderKrew renders .krew.yaml as krew-release-bot v0.0.50 does
// (pkg/source/template.go: the values {TagName}, the functions indent and
// addURIAndSha), except that addURIAndSha takes each archive's sha256 from
// sha (by the URL's file name) instead of downloading it.
func renderKrew(t *testing.T, tag string, sha func(file string) string) []byte {
	t.Helper()
	tmpl, err := template.New(".krew.yaml").Funcs(template.FuncMap{
		"indent": func(spaces int, v string) string {
			pad := strings.Repeat(" ", spaces)
			return strings.TrimSpace(pad + strings.ReplaceAll(v, "\n", "\n"+pad))
		},
		"addURIAndSha": func(url, tag string) (string, error) {
			u, err := template.New("url").Parse(url)
			if err != nil {
				return "", err
			}
			var b strings.Builder
			if err := u.Execute(&b, map[string]string{"TagName": tag}); err != nil {
				return "", err
			}
			return fmt.Sprintf("uri: %s\n    sha256: %s", b.String(), sha(path.Base(b.String()))), nil
		},
	}).ParseFiles(filepath.Join(root, ".krew.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]string{"TagName": tag}); err != nil {
		t.Fatalf("rendering .krew.yaml: %v", err)
	}
	return b.Bytes()
}

// krewManifest is as much of krew's index.Plugin as the tests read.
type krewManifest struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// tool runs a tool named by env with args, or reports that it is not set.
func tool(t *testing.T, env string, extraEnv []string, args ...string) (string, bool) {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		t.Logf("%s is not set: not running it (make lint-release sets it)", env)
		return "", false
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return string(out), true
}

// TestTheKrewManifestCoversEveryArchive renders .krew.yaml for a release
// with made-up sums: one platform per GoReleaser target, each pointing at
// the archive GoReleaser names for it on the release page, with the right
// binary; krew's validator accepts it.
func TestTheKrewManifestCoversEveryArchive(t *testing.T) {
	cfg, _ := readConfig(t)
	const tag = "v1.2.3"
	data := renderKrew(t, tag, func(file string) string {
		sum := sha256.Sum256([]byte(file))
		return hex.EncodeToString(sum[:])
	})
	var m krewManifest
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("the rendered manifest: %v\n%s", err, data)
	}
	if m.Metadata.Name != "buildlock" || m.Spec.Version != tag {
		t.Errorf("plugin %q version %q, want buildlock %s", m.Metadata.Name, m.Spec.Version, tag)
	}
	var got, want []string
	for _, p := range m.Spec.Platforms {
		got = append(got, fmt.Sprintf("%s/%s %s %s", p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"], p.URI, p.Bin))
	}
	for _, target := range cfg.Builds[0].Targets {
		goos, goarch, _ := strings.Cut(target, "_")
		bin := cfg.Builds[0].Binary
		if goos == "windows" {
			bin += ".exe"
		}
		want = append(want, fmt.Sprintf("%s/%s https://github.com/buildlock/buildlock/releases/download/%s/%s %s",
			goos, goarch, tag, cfg.archiveName(t, strings.TrimPrefix(tag, "v"), goos, goarch), bin))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf(".krew.yaml's platforms:\n%s\nGoReleaser's archives:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	manifest := filepath.Join(t.TempDir(), "buildlock.yaml")
	if err := os.WriteFile(manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tool(t, "KREW_VALIDATE", nil, "-manifest", manifest, "-skip-install")
}

// TestTheSnapshotInstallsWithKrew builds GoReleaser's snapshot of this
// platform (the real config, its targets narrowed to this platform, so that
// the test builds one binary): the archive holds the plugin, LICENSE and
// README.md, checksums.txt lists it, and krew installs the plugin from the
// manifest krew-release-bot would render; the installed plugin reports the
// snapshot's version.
func TestTheSnapshotInstallsWithKrew(t *testing.T) {
	goreleaser := os.Getenv("GORELEASER")
	if goreleaser == "" {
		t.Skip("GORELEASER is not set: `make lint-release` builds GoReleaser and runs this test")
	}
	cfg, raw := readConfig(t)
	target := runtime.GOOS + "_" + runtime.GOARCH
	if !slices.Contains(cfg.Builds[0].Targets, target) {
		t.Skipf("GoReleaser builds no release for %s", target)
	}
	dist := t.TempDir()
	raw["builds"].([]any)[0].(map[string]any)["targets"] = []string{target}
	raw["dist"] = dist
	narrowed, err := yaml.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "goreleaser.yaml")
	if err := os.WriteFile(config, narrowed, 0o644); err != nil {
		t.Fatal(err)
	}
	snapshot := exec.Command(goreleaser, "release", "--snapshot", "--clean", "--skip=sign,sbom,publish", "--config", config)
	snapshot.Dir = root
	if out, err := snapshot.CombinedOutput(); err != nil {
		t.Fatalf("goreleaser release --snapshot: %v\n%s", err, out)
	}

	var meta struct {
		Version string `json:"version"`
	}
	readJSON(t, filepath.Join(dist, "metadata.json"), &meta)
	archive := cfg.archiveName(t, meta.Version, runtime.GOOS, runtime.GOARCH)
	data, err := os.ReadFile(filepath.Join(dist, archive))
	if err != nil {
		t.Fatalf("the snapshot has no %s: %v", archive, err)
	}
	sum := sha256.Sum256(data)
	checksums, err := os.ReadFile(filepath.Join(dist, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if want := hex.EncodeToString(sum[:]) + "  " + archive; !strings.Contains(string(checksums), want+"\n") {
		t.Errorf("checksums.txt lacks %q (sha256sum's format, which action.yml and README's steps check):\n%s", want, checksums)
	}
	if runtime.GOOS != "windows" {
		if files := tarFiles(t, data); !slices.Equal(files, []string{"LICENSE", "README.md", "kubectl-buildlock"}) {
			t.Errorf("%s holds %q, want the plugin, LICENSE (krew installs only archives with one) and README.md", archive, files)
		}
	}

	tag := "v" + meta.Version
	manifest := filepath.Join(t.TempDir(), "buildlock.yaml")
	rendered := renderKrew(t, tag, func(file string) string {
		if file == archive {
			return hex.EncodeToString(sum[:])
		}
		return strings.Repeat("ab", 32) // another platform's, not built here (hex with letters: YAML reads digits alone as a number)
	})
	if err := os.WriteFile(manifest, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	tool(t, "KREW_VALIDATE", nil, "-manifest", manifest, "-skip-install")
	krewRoot := t.TempDir()
	if _, ok := tool(t, "KREW", []string{"KREW_ROOT=" + krewRoot, "KREW_OS=" + runtime.GOOS, "KREW_ARCH=" + runtime.GOARCH},
		"install", "--manifest="+manifest, "--archive="+filepath.Join(dist, archive)); !ok {
		return
	}
	out, err := exec.Command(filepath.Join(krewRoot, "bin", "kubectl-buildlock"), "version", "-o", "json").Output()
	var v struct {
		Version string `json:"version"`
	}
	if err != nil || json.Unmarshal(out, &v) != nil || v.Version != tag {
		t.Errorf("the plugin krew installed says %s (%v), want version %s", out, err, tag)
	}
}

func readJSON(t *testing.T, file string, out any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// tarFiles lists a .tar.gz's files, sorted.
func tarFiles(t *testing.T, data []byte) []string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			slices.Sort(names)
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
}
