package release

import (
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// goBuild is a build of .ko.yaml or .goreleaser.yaml.
type goBuild struct {
	ID      string   `json:"id"`
	Main    string   `json:"main"`
	Env     []string `json:"env"`
	Flags   []string `json:"flags"`
	Ldflags []string `json:"ldflags"`
}

func readBuilds(t *testing.T, file string) map[string]goBuild {
	t.Helper()
	var cfg struct {
		Builds []goBuild `json:"builds"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(t, file)), &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]goBuild{}
	for _, b := range cfg.Builds {
		out[b.Main] = b
	}
	return out
}

// makeVar is a variable as make computes it (hack/release.mk's print-%).
func makeVar(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "-s", "print-"+name)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make print-%s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// TestOneBuildOfEachBinary: ko builds the plugin's image with GoReleaser's
// build of the plugin (so that ko finds the linux builds in the Go build
// cache and the image's binary is the archive's, which the rehearsal
// checks byte for byte), and the manager's with the Dockerfile's build.
func TestOneBuildOfEachBinary(t *testing.T) {
	ko := readBuilds(t, ".ko.yaml")
	gr := readBuilds(t, ".goreleaser.yaml")
	plugin, manager := ko["./cmd/kubectl-buildlock"], ko["./cmd/manager"]
	release := gr["./cmd/kubectl-buildlock"]
	if len(ko) != 2 || len(gr) != 1 {
		t.Fatalf(".ko.yaml builds %d commands and .goreleaser.yaml %d; want the manager and the plugin, and the plugin", len(ko), len(gr))
	}
	// The version: ko's template reads RELEASE_TAG (from make), GoReleaser's
	// the tag.
	normalize := func(s []string) []string {
		return strings.Fields(strings.NewReplacer("{{.Env.RELEASE_TAG}}", "TAG", "{{ .Tag }}", "TAG").Replace(strings.Join(s, " ")))
	}
	if !slices.Equal(plugin.Env, release.Env) || !slices.Equal(plugin.Flags, release.Flags) || !slices.Equal(normalize(plugin.Ldflags), normalize(release.Ldflags)) {
		t.Errorf("ko builds the plugin with %v %v %v, GoReleaser with %v %v %v", plugin.Env, plugin.Flags, plugin.Ldflags, release.Env, release.Flags, release.Ldflags)
	}
	if !strings.Contains(strings.Join(release.Ldflags, " "), "-X main.version={{ .Tag }}") {
		t.Errorf("GoReleaser's plugin does not report the tag: %v", release.Ldflags)
	}
	// The Dockerfile's line: CGO_ENABLED=0 ... go build -trimpath -ldflags="-s -w" -o /out/manager ./cmd/manager
	line := regexp.MustCompile(`(?m)^RUN .*go build.*$`).FindString(mustRead(t, "Dockerfile"))
	for _, want := range append(append([]string{"go build"}, manager.Env...), manager.Flags...) {
		if !strings.Contains(line, want) {
			t.Errorf("ko builds the manager with %s, the Dockerfile does not: %s", want, line)
		}
	}
	if want := `-ldflags="` + strings.Join(manager.Ldflags, " ") + `"`; !strings.Contains(line, want) {
		t.Errorf("ko builds the manager with %s, the Dockerfile with: %s", want, line)
	}
}

// TestTheImagesBasesArePinned: the manager's image is built on the
// Dockerfile's final base and the plugin's on
// hack/images/plugin-base.Dockerfile's, each pinned by digest (Dependabot
// updates both files).
func TestTheImagesBasesArePinned(t *testing.T) {
	digest := regexp.MustCompile(`^[a-z0-9./-]+:[a-z0-9._-]+@sha256:[0-9a-f]{64}$`)
	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(mustRead(t, "Dockerfile"), -1)
	final := froms[len(froms)-1][1]
	if got := makeVar(t, "MANAGER_BASE"); got != final || !digest.MatchString(got) {
		t.Errorf("make's MANAGER_BASE is %q; want the Dockerfile's final base %q, pinned by digest", got, final)
	}
	if got := makeVar(t, "PLUGIN_BASE"); !digest.MatchString(got) || !strings.Contains(mustRead(t, "hack/images/plugin-base.Dockerfile"), "FROM "+got+"\n") {
		t.Errorf("make's PLUGIN_BASE is %q; want hack/images/plugin-base.Dockerfile's, pinned by digest", got)
	}
	if got := makeVar(t, "RELEASE_VERSION"); got != releaseVersion(t) {
		t.Errorf("make releases %q, Chart.yaml says %s", got, releaseVersion(t))
	}
}

// TestTheInstallStepsNameWhatTheReleasePublishes: the files README and
// docs/install.md download from the release page are files the release
// attaches (GoReleaser's archives, checksums.txt and its bundle, and the
// extra files of the other targets), and the chart and images they name
// are where make pushes them.
func TestTheInstallStepsNameWhatTheReleasePublishes(t *testing.T) {
	var cfg struct {
		Release struct {
			ExtraFiles []struct {
				Glob string `json:"glob"`
			} `json:"extra_files"`
		} `json:"release"`
		Checksum struct {
			NameTemplate string `json:"name_template"`
		} `json:"checksum"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(t, ".goreleaser.yaml")), &cfg); err != nil {
		t.Fatal(err)
	}
	published := map[string]bool{cfg.Checksum.NameTemplate: true, cfg.Checksum.NameTemplate + ".sigstore.json": true}
	for _, f := range cfg.Release.ExtraFiles {
		published[path.Base(f.Glob)] = true
	}
	archive := regexp.MustCompile(`^kubectl-buildlock_(v\d+\.\d+\.\d+|\$\{VERSION\})_(\w+|\$\{OS\})_(\w+|\$\{ARCH\})\.(tar\.gz|zip)$`)
	registry := makeVar(t, "REGISTRY")
	download := regexp.MustCompile(`releases/download/[^/\s]+/([^\s"')]+)`)
	for _, doc := range []string{"README.md", "docs/install.md"} {
		text := mustRead(t, doc)
		for _, m := range download.FindAllStringSubmatch(text, -1) {
			if !published[m[1]] && !archive.MatchString(m[1]) {
				t.Errorf("%s downloads %s, which no release publishes (it publishes %v and the archives)", doc, m[1], keysOf(published))
			}
		}
		for _, m := range regexp.MustCompile(`(?:oci://)?ghcr\.io/buildlock/[a-z/-]+`).FindAllString(text, -1) {
			ref := strings.TrimPrefix(m, "oci://")
			if !slices.Contains([]string{registry + "/buildlock", registry + "/kubectl-buildlock", registry + "/charts/buildlock"}, ref) {
				t.Errorf("%s names %s; make pushes the release to %s/{buildlock,kubectl-buildlock,charts/buildlock}", doc, m, registry)
			}
		}
	}
	if !strings.Contains(mustRead(t, "README.md"), "releases/download/v"+releaseVersion(t)+"/install.yaml") {
		t.Error("README's install section does not install the release's install.yaml")
	}
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestEachTargetWritesItsOwnFolder: GoReleaser's --clean wipes only its
// own folder of dist/, so that it keeps what the other release targets
// wrote (install.yaml, the Tekton Task), which it attaches to the release.
func TestEachTargetWritesItsOwnFolder(t *testing.T) {
	var cfg struct {
		Dist    string `json:"dist"`
		Release struct {
			ExtraFiles []struct {
				Glob string `json:"glob"`
			} `json:"extra_files"`
		} `json:"release"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(t, ".goreleaser.yaml")), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Dist != "dist/goreleaser" {
		t.Errorf(".goreleaser.yaml's dist is %q, want dist/goreleaser: --clean wipes it whole", cfg.Dist)
	}
	folders := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\t.*\b(dist/[a-z]+)/`).FindAllStringSubmatch(mustRead(t, "hack/release.mk"), -1) {
		folders[m[1]] = true
	}
	for _, f := range cfg.Release.ExtraFiles {
		dir := path.Dir(f.Glob)
		if dir != cfg.Dist+"/krew" && (dir == cfg.Dist || strings.HasPrefix(dir, cfg.Dist+"/") || !folders[dir]) {
			t.Errorf("the release attaches %s, which no release target of hack/release.mk writes outside GoReleaser's folder", f.Glob)
		}
	}
}
