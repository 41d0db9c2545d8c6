package rehearsal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"

	"github.com/buildlock/buildlock/internal/testenv"
)

// TestRehearsal is the whole rehearsal; its steps are subtests, each
// logged with its duration. A step that fails stops the ones that need it.
func TestRehearsal(t *testing.T) {
	r := newRehearsal(t)
	ctx := t.Context()

	host := startRegistry(t)
	bases := step(t, "push stand-ins for the images' bases", func(t *testing.T) standIns { return pushStandIns(t, host) })

	step(t, "make release (to the in-process registry)", func(t *testing.T) struct{} {
		r.make(t, "release", "REGISTRY="+host, "HELM_PUSH_FLAGS=--plain-http",
			"MANAGER_BASE="+bases.manager, "PLUGIN_BASE="+bases.plugin, "GORELEASER_CONFIG="+r.goreleaserConfig(t))
		return struct{}{}
	})

	archives := step(t, "the archives and checksums.txt", func(t *testing.T) map[string]string { return r.checkArchives(t) })
	step(t, "the krew manifest", func(t *testing.T) struct{} { r.checkKrewManifest(t, archives); return struct{}{} })
	images := step(t, "the images and their SBOMs", func(t *testing.T) releaseImages { return r.checkImages(t, host, bases) })
	chart := step(t, "the chart in the registry", func(t *testing.T) name.Digest { return r.checkChart(t, host) })
	step(t, "the Tekton Task pins the plugin's image", func(t *testing.T) struct{} { r.checkTektonTask(t, host, images); return struct{}{} })
	step(t, "install.yaml names the release's image", func(t *testing.T) struct{} { r.checkInstaller(t, host); return struct{}{} })

	key := step(t, "sign the images, the chart and checksums.txt with a throwaway key, and verify them", func(t *testing.T) *signer {
		k := newSigner(t)
		other := newSigner(t)
		for _, ref := range []name.Digest{images.manager, images.plugin, chart} {
			if err := k.signImage(ctx, ref); err != nil {
				t.Fatalf("signing %s: %v", ref, err)
			}
			if err := k.verifyImage(ctx, ref); err != nil {
				t.Errorf("verifying %s with the signing key: %v", ref, err)
			}
			if err := other.verifyImage(ctx, ref); err == nil {
				t.Errorf("%s verifies with a key that did not sign it", ref)
			}
		}
		checksums := r.read(t, "dist/goreleaser/checksums.txt")
		sig := k.signBlob(t, checksums)
		if err := k.verifyBlob(sig, checksums); err != nil {
			t.Errorf("verifying checksums.txt: %v", err)
		}
		if err := k.verifyBlob(sig, append(slices.Clone(checksums), '\n')); err == nil {
			t.Error("a changed checksums.txt verifies")
		}
		return k
	})

	plugin := step(t, "krew install --manifest (this platform's archive)", func(t *testing.T) string { return r.krewInstall(t, archives) })

	step(t, "helm install oci://... after verifying the chart; a claim through it", func(t *testing.T) struct{} {
		r.installWithHelm(t, host, chart, key, plugin)
		return struct{}{}
	})
	step(t, "kubectl apply -f install.yaml; a claim through it", func(t *testing.T) struct{} {
		r.installWithKubectl(t, key, plugin)
		return struct{}{}
	})
}

// step runs f as the subtest name, logs its duration, and stops the
// rehearsal when it fails.
func step[T any](t *testing.T, name string, f func(t *testing.T) T) T {
	t.Helper()
	var out T
	start := time.Now()
	ok := t.Run(name, func(t *testing.T) { out = f(t) })
	t.Logf("step %q: %s (%v)", name, map[bool]string{true: "ok", false: "FAILED"}[ok], time.Since(start).Round(time.Second))
	if !ok {
		t.FailNow()
	}
	return out
}

// rehearsal holds the tools (from make), the release's version and the
// plugin's platforms it builds.
type rehearsal struct {
	root    string
	version string // X.Y.Z
	tools   map[string]string
	// targets are the plugin's platforms (os_arch) whose archives it builds.
	targets []string
	// work is a directory for the whole rehearsal (the krew root).
	work string
}

func newRehearsal(t *testing.T) *rehearsal {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &rehearsal{root: root, version: os.Getenv("RELEASE_VERSION"), tools: map[string]string{}, work: t.TempDir()}
	for _, env := range []string{"GORELEASER", "KO", "HELM", "KUSTOMIZE", "KREW", "KREW_VALIDATE", "KUBECTL"} {
		r.tools[env] = os.Getenv(env)
		if r.tools[env] == "" {
			t.Skipf("%s is not set: run `make release-rehearsal`", env)
		}
	}
	if r.version == "" {
		t.Skip("RELEASE_VERSION is not set: run `make release-rehearsal`")
	}
	var cfg struct {
		Builds []struct {
			Targets []string `json:"targets"`
		} `json:"builds"`
	}
	if err := yaml.Unmarshal(r.read(t, ".goreleaser.yaml"), &cfg); err != nil || len(cfg.Builds) != 1 {
		t.Fatalf(".goreleaser.yaml: %v, %d builds", err, len(cfg.Builds))
	}
	r.targets = cfg.Builds[0].Targets
	switch p := os.Getenv("REHEARSAL_PLATFORMS"); p {
	case "", "all":
	case "linux":
		r.targets = slices.DeleteFunc(r.targets, func(s string) bool { return !strings.HasPrefix(s, "linux_") })
		t.Logf("REHEARSAL_PLATFORMS=linux: archives for %v only; a tag's rehearsal builds all of .goreleaser.yaml's", r.targets)
	default:
		t.Fatalf("REHEARSAL_PLATFORMS=%s: want all or linux", p)
	}
	return r
}

// goreleaserConfig is .goreleaser.yaml with the plugin's targets narrowed
// to r.targets (itself when they are all of them).
func (r *rehearsal) goreleaserConfig(t *testing.T) string {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal(r.read(t, ".goreleaser.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	build := cfg["builds"].([]any)[0].(map[string]any)
	if len(build["targets"].([]any)) == len(r.targets) {
		return r.path(".goreleaser.yaml")
	}
	build["targets"] = r.targets
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// In the rehearsal's directory: a subtest's TempDir has the subtest's
	// name in it, parentheses included, which the shell of make's recipe
	// would read as syntax.
	file := filepath.Join(r.work, "goreleaser.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func (r *rehearsal) tag() string { return "v" + r.version }

// make runs a make target in the repository with the rehearsal's tools.
func (r *rehearsal) make(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = r.root
	for env, path := range r.tools {
		cmd.Args = append(cmd.Args, env+"="+path)
	}
	cmd.Args = append(cmd.Args, "RELEASE_VERSION="+r.version)
	cmd.Env = append(os.Environ(), r.gitRemote(t)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("make %s (%v):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), tail(out.String(), 60))
	if err != nil {
		t.Fatalf("make %s: %v", args[0], err)
	}
}

// gitRemote is the environment that gives git a remote where the checkout
// has none (a local clone or worktree): GoReleaser asks git for the remote's
// URL and stops without one, though it publishes where .goreleaser.yaml
// says. CI's checkout and a clone of GitHub's have theirs.
func (r *rehearsal) gitRemote(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-remote", "--get-url")
	cmd.Dir = r.root
	if err := cmd.Run(); err == nil {
		return nil
	}
	const url = "https://github.com/buildlock/buildlock.git"
	t.Logf("the checkout has no git remote: GoReleaser gets %s", url)
	return []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=remote.origin.url", "GIT_CONFIG_VALUE_0=" + url}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

func (r *rehearsal) path(rel string) string { return filepath.Join(r.root, filepath.FromSlash(rel)) }

func (r *rehearsal) read(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(r.path(rel))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkArchives: checksums.txt lists one archive per platform of
// .goreleaser.yaml, named for the tag, and each file's sum is right; each
// archive holds the plugin, LICENSE and README.md. It returns the sums by
// file name.
func (r *rehearsal) checkArchives(t *testing.T) map[string]string {
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(r.read(t, "dist/goreleaser/checksums.txt"))), "\n") {
		sum, file, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("checksums.txt: %q is not sha256sum's format", line)
		}
		data := r.read(t, "dist/goreleaser/"+file)
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			t.Errorf("checksums.txt's sum of %s is wrong", file)
		}
		sums[file] = sum
	}
	for _, platform := range r.targets {
		ext := ".tar.gz"
		if strings.HasPrefix(platform, "windows") {
			ext = ".zip"
		}
		file := "kubectl-buildlock_" + r.tag() + "_" + platform + ext
		if _, ok := sums[file]; !ok {
			t.Errorf("checksums.txt lists no %s (it lists %v)", file, keys(sums))
			continue
		}
		want := []string{"LICENSE", "README.md", "kubectl-buildlock"}
		if ext == ".zip" {
			want[2] += ".exe"
		}
		if got := archiveFiles(t, r.path("dist/goreleaser/"+file)); !slices.Equal(got, want) {
			t.Errorf("%s holds %q, want %q (krew installs only archives with a license)", file, got, want)
		}
	}
	if len(sums) != len(r.targets) {
		t.Errorf("checksums.txt lists %d files, want the archives of %v: %v", len(sums), r.targets, keys(sums))
	}
	return sums
}

// krewManifest is as much of krew's index.Plugin as the rehearsal reads.
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

// checkKrewManifest: krew's validator accepts GoReleaser's manifest, which
// points every platform at its archive on the release page with the sum of
// checksums.txt; the release attaches it as buildlock.yaml.
func (r *rehearsal) checkKrewManifest(t *testing.T, sums map[string]string) {
	manifest := r.path("dist/goreleaser/krew/buildlock.yaml")
	if out, err := exec.Command(r.tools["KREW_VALIDATE"], "-manifest", manifest, "-skip-install").CombinedOutput(); err != nil {
		t.Fatalf("validate-krew-manifest: %v\n%s", err, out)
	}
	var m krewManifest
	if err := yaml.Unmarshal(r.read(t, "dist/goreleaser/krew/buildlock.yaml"), &m); err != nil {
		t.Fatal(err)
	}
	if m.Metadata.Name != "buildlock" || m.Spec.Version != r.tag() {
		t.Errorf("the manifest is of %s %s, want buildlock %s", m.Metadata.Name, m.Spec.Version, r.tag())
	}
	seen := map[string]bool{}
	for _, p := range m.Spec.Platforms {
		file := filepath.Base(p.URI)
		if want := "https://github.com/buildlock/buildlock/releases/download/" + r.tag() + "/" + file; p.URI != want {
			t.Errorf("%s/%s: uri %s, want %s", p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"], p.URI, want)
		}
		if p.SHA256 != sums[file] {
			t.Errorf("%s: sha256 %s, checksums.txt says %s", file, p.SHA256, sums[file])
		}
		if !strings.Contains(file, "_"+p.Selector.MatchLabels["os"]+"_"+p.Selector.MatchLabels["arch"]+".") {
			t.Errorf("%s is offered for %v", file, p.Selector.MatchLabels)
		}
		seen[file] = true
	}
	if len(seen) != len(sums) {
		t.Errorf("the manifest offers %v, the release has %v", keys(seen), keys(sums))
	}
	if !strings.Contains(string(r.read(t, ".goreleaser.yaml")), "glob: dist/goreleaser/krew/buildlock.yaml") {
		t.Error(".goreleaser.yaml does not attach the krew manifest to the release")
	}
}

// krewInstall installs the plugin as `kubectl krew install --manifest`
// does, from this platform's archive (krew checks its sum against the
// manifest's), into a krew root of its own; the plugin reports the release.
// It returns the installed plugin's path.
func (r *rehearsal) krewInstall(t *testing.T, sums map[string]string) string {
	platform := runtime.GOOS + "_" + runtime.GOARCH
	archive := ""
	for file := range sums {
		if strings.Contains(file, "_"+platform+".") {
			archive = r.path("dist/goreleaser/" + file)
		}
	}
	if archive == "" {
		t.Skipf("the release has no archive for %s", platform)
	}
	krewRoot := filepath.Join(r.work, "krew")
	cmd := exec.Command(r.tools["KREW"], "install", "--manifest="+r.path("dist/goreleaser/krew/buildlock.yaml"), "--archive="+archive)
	cmd.Env = append(os.Environ(), "KREW_ROOT="+krewRoot, "KREW_OS="+runtime.GOOS, "KREW_ARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("krew install: %v\n%s", err, out)
	}
	plugin := filepath.Join(krewRoot, "bin", "kubectl-buildlock")
	out, err := exec.Command(plugin, "version", "-o", "json").Output()
	var v struct {
		Version string `json:"version"`
	}
	if err != nil || json.Unmarshal(out, &v) != nil || v.Version != r.tag() {
		t.Fatalf("the plugin krew installed says %s (%v), want version %s", out, err, r.tag())
	}
	return plugin
}

// checkChart: the chart is in the registry under its version, with the
// release's version and appVersion, as Helm's OCI artifact.
func (r *rehearsal) checkChart(t *testing.T, host string) name.Digest {
	ref, err := name.ParseReference(host + "/charts/buildlock:" + r.version)
	if err != nil {
		t.Fatal(err)
	}
	m, err := remote.Get(ref)
	if err != nil {
		t.Fatalf("the registry has no chart %s: %v", ref, err)
	}
	img, err := m.Image()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if manifest.Config.MediaType != "application/vnd.cncf.helm.config.v1+json" {
		t.Errorf("%s's config is %s, not a Helm chart's", ref, manifest.Config.MediaType)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version != r.version || meta.AppVersion != r.version {
		t.Errorf("the chart says version %s, appVersion %s; want %s", meta.Version, meta.AppVersion, r.version)
	}
	if _, err := os.Stat(r.path("dist/chart/buildlock-" + r.version + ".tgz")); err != nil {
		t.Error(err)
	}
	return ref.Context().Digest(m.Digest.String())
}

// checkTektonTask: the rendered Task defaults its image to the plugin's,
// by the digest ko pushed, and is the repository's Task otherwise.
func (r *rehearsal) checkTektonTask(t *testing.T, host string, images releaseImages) {
	rendered := string(r.read(t, "dist/tekton/buildlock-deploy.yaml"))
	want := fmt.Sprintf("default: %s/kubectl-buildlock:%s@%s", host, r.version, images.plugin.DigestStr())
	if !strings.Contains(rendered, want) {
		t.Errorf("dist/tekton/buildlock-deploy.yaml lacks %q", want)
	}
	if strings.Count(rendered, "\n") != strings.Count(string(r.read(t, "tekton/task/buildlock-deploy/0.1/buildlock-deploy.yaml")), "\n") {
		t.Error("the rendered Task is not the repository's with its image pinned")
	}
}

// checkInstaller: install.yaml runs the release's image.
func (r *rehearsal) checkInstaller(t *testing.T, host string) {
	want := "image: " + host + "/buildlock:" + r.version
	if !strings.Contains(string(r.read(t, "dist/install/install.yaml")), want) {
		t.Errorf("dist/install/install.yaml lacks %q", want)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// resolve is the digest a reference names in the registry.
func resolve(ctx context.Context, t *testing.T, ref string) name.Digest {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(r, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("resolving %s: %v", ref, err)
	}
	if desc.MediaType != types.OCIImageIndex && desc.MediaType != types.DockerManifestList && !desc.MediaType.IsImage() {
		t.Fatalf("%s is a %s", ref, desc.MediaType)
	}
	return r.Context().Digest(desc.Digest.String())
}
