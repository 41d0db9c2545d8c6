package main

// The release is checked with krew's own tools when `make test` provides
// them (KREW_VALIDATE, its validate-krew-manifest; KREW, krew itself, which
// installs the archive from the manifest), and always with the rules of
// krew's validator written out here (krew v0.4.3's
// internal/index/validation and cmd/validate-krew-manifest). Only the
// host's platform is built, to keep `make test` fast; the manifest of all
// six platforms is checked with made-up sums.

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"
)

// krewPlugin is krew's index.Plugin, as much of it as the rules read.
type krewPlugin struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Version          string `json:"version"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Homepage         string `json:"homepage"`
		Platforms        []struct {
			Selector *metav1.LabelSelector `json:"selector"`
			URI      string                `json:"uri"`
			SHA256   string                `json:"sha256"`
			Bin      string                `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// krewPlatforms are the os/arch pairs krew's validator knows.
var krewPlatforms = []string{"windows/386", "windows/amd64", "windows/arm64", "linux/386", "linux/amd64", "linux/arm",
	"linux/arm64", "darwin/386", "darwin/amd64", "darwin/arm64"}

// validateManifest checks the manifest at path as krew's validator does:
// the plugin named after its file, a one-line short description, a v-prefixed
// semantic version, and platforms with a URI, a SHA-256, a binary and an
// os/arch selector that picks at least one platform krew knows and no
// platform another entry picks too.
func validateManifest(path string) (*krewPlugin, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(filepath.Base(path), ".yaml")
	switch {
	case p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin":
		return nil, fmt.Errorf("apiVersion %q, kind %q", p.APIVersion, p.Kind)
	case !regexp.MustCompile(`^[\w-]+$`).MatchString(name) || p.Metadata.Name != name:
		return nil, fmt.Errorf("plugin %q in %s", p.Metadata.Name, path)
	case p.Spec.ShortDescription == "" || strings.ContainsAny(p.Spec.ShortDescription, "\r\n"):
		return nil, fmt.Errorf("short description %q", p.Spec.ShortDescription)
	case len(p.Spec.Platforms) == 0:
		return nil, errors.New("no platforms")
	}
	if _, err := version.ParseSemantic(p.Spec.Version); err != nil || !strings.HasPrefix(p.Spec.Version, "v") {
		return nil, fmt.Errorf("version %q is not v and a semantic version: %w", p.Spec.Version, err)
	}
	taken := map[string]int{}
	for i, pl := range p.Spec.Platforms {
		if pl.URI == "" || !regexp.MustCompile(`^[a-f0-9]{64}$`).MatchString(pl.SHA256) || pl.Bin == "" || pl.Selector == nil || len(pl.Selector.MatchLabels) == 0 {
			return nil, fmt.Errorf("platform %d is incomplete: %+v", i, pl)
		}
		for key := range pl.Selector.MatchLabels {
			if key != "os" && key != "arch" {
				return nil, fmt.Errorf("platform %d selects by %q", i, key)
			}
		}
		selector, err := metav1.LabelSelectorAsSelector(pl.Selector)
		if err != nil {
			return nil, err
		}
		picked := 0
		for _, osArch := range krewPlatforms {
			goos, goarch, _ := strings.Cut(osArch, "/")
			if selector.Matches(labels.Set{"os": goos, "arch": goarch}) {
				picked++
				if j, dup := taken[osArch]; dup {
					return nil, fmt.Errorf("platforms %d and %d both pick %s", j, i, osArch)
				}
				taken[osArch] = i
			}
		}
		if picked == 0 {
			return nil, fmt.Errorf("platform %d picks no platform krew knows", i)
		}
	}
	return &p, nil
}

// krewTool runs a krew tool that `make test` installed (env names it), and
// reports whether it was there.
func krewTool(t *testing.T, env string, extraEnv []string, args ...string) bool {
	t.Helper()
	tool := os.Getenv(env)
	if tool == "" {
		t.Logf("%s is not set: not running krew's own tool (make test sets it)", env)
		return false
	}
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", filepath.Base(tool), args, err, out)
	}
	return true
}

// TestTheReleaseOfThisPlatformInstallsWithKrew builds the release for the
// host's platform only and checks its archive, checksums and manifest; with
// krew at hand, it installs the plugin from them as `kubectl krew install`
// would and runs it.
func TestTheReleaseOfThisPlatformInstallsWithKrew(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	must(t, err)
	r := Release{Version: "v0.0.0-test.1", Root: root, Out: t.TempDir(), License: "LICENSE", Readme: "README.md"}
	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err != nil {
		// The repository has no LICENSE yet; `make dist` refuses to run
		// without one, but the packaging can be tested with a stand-in.
		r.License = filepath.Join(t.TempDir(), "LICENSE")
		must(t, os.WriteFile(r.License, []byte("stand-in license for the test\n"), 0o644))
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	must(t, r.Dist([]string{platform}))

	manifestPath := filepath.Join(r.Out, "buildlock.yaml")
	m, err := validateManifest(manifestPath)
	must(t, err)
	archive := fmt.Sprintf("kubectl-buildlock_%s_%s_%s.tar.gz", r.Version, runtime.GOOS, runtime.GOARCH)
	data, err := os.ReadFile(filepath.Join(r.Out, archive))
	must(t, err)
	sum := sha256.Sum256(data)
	pl := m.Spec.Platforms[0]
	if want := "https://github.com/buildlock/buildlock/releases/download/" + r.Version + "/" + archive; pl.URI != want || pl.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("manifest platform %+v, want uri %s and the archive's sum", pl, want)
	}
	checksums, err := os.ReadFile(filepath.Join(r.Out, "checksums.txt"))
	must(t, err)
	if want := hex.EncodeToString(sum[:]) + "  " + archive + "\n"; string(checksums) != want {
		t.Errorf("checksums.txt = %q, want %q (sha256sum's format)", checksums, want)
	}
	if files := tarFiles(t, data); !slices.Equal(files, []string{"kubectl-buildlock", "LICENSE", "README.md"}) {
		t.Errorf("the archive holds %q", files)
	}

	krewTool(t, "KREW_VALIDATE", nil, "-manifest", manifestPath, "-skip-install")
	krewRoot := t.TempDir()
	if krewTool(t, "KREW", []string{"KREW_ROOT=" + krewRoot, "KREW_OS=" + runtime.GOOS, "KREW_ARCH=" + runtime.GOARCH},
		"install", "--manifest="+manifestPath, "--archive="+filepath.Join(r.Out, archive)) {
		out, err := exec.Command(filepath.Join(krewRoot, "bin", "kubectl-buildlock"), "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), r.Version) {
			t.Errorf("the plugin krew installed says %q, %v", out, err)
		}
	}
}

// TestTheManifestOfAllPlatformsIsValid renders the manifest of a whole
// release (with made-up sums) and validates it.
func TestTheManifestOfAllPlatformsIsValid(t *testing.T) {
	var artifacts []Artifact
	for i, p := range Platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		a := Artifact{OS: goos, Arch: goarch, File: "kubectl-buildlock_v1.2.3_" + goos + "_" + goarch + ".tar.gz", SHA256: strings.Repeat(fmt.Sprint(i), 64)}
		artifacts = append(artifacts, a)
	}
	data, err := Manifest("v1.2.3", artifacts)
	must(t, err)
	path := filepath.Join(t.TempDir(), "buildlock.yaml")
	must(t, os.WriteFile(path, data, 0o644))
	m, err := validateManifest(path)
	must(t, err)
	if len(m.Spec.Platforms) != 6 || m.Spec.Platforms[4].Bin != "kubectl-buildlock.exe" {
		t.Errorf("platforms %+v", m.Spec.Platforms)
	}
	krewTool(t, "KREW_VALIDATE", nil, "-manifest", path, "-skip-install")

	if err := (Release{Version: "1.2.3"}).Dist(nil); err == nil {
		t.Error("a version without v was accepted")
	}
}

// tarFiles lists a .tar.gz's files.
func tarFiles(t *testing.T, data []byte) []string {
	t.Helper()
	gz, err := gzip.NewReader(strings.NewReader(string(data)))
	must(t, err)
	tr := tar.NewReader(gz)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		must(t, err)
		names = append(names, hdr.Name)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
