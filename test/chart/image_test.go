package chart

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImage builds the manager's image as `make image` and the release do
// (hack/image, no Docker), pushes the OCI layout to an in-process registry,
// reads it back and checks what a cluster will run: both platforms, no
// base, the one binary as entrypoint, non-root, the OCI labels; the amd64
// binary runs. It also keeps the image and the Dockerfile in step, and
// checks that a second build gives the same digest.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the manager for two platforms; skipped with -short")
	}
	g := NewWithT(t)
	dir := buildImage(t, "")
	host := startRegistry(t)
	ref := pushImage(t, dir, host, "buildlock:test")

	idx, err := remote.Index(ref)
	g.Expect(err).NotTo(HaveOccurred(), "reading the image back from the registry")
	pushed, err := idx.Digest()
	g.Expect(err).NotTo(HaveOccurred())
	built, err := layoutIndex(t, dir).Digest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pushed).To(Equal(built), "the registry serves the image index that was built")
	manifest, err := idx.IndexManifest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(manifest.MediaType).To(Equal(types.OCIImageIndex))

	d := parseDockerfile(t)
	var platforms []string
	for _, desc := range manifest.Manifests {
		p := desc.Platform.OS + "/" + desc.Platform.Architecture
		platforms = append(platforms, p)
		t.Run(p, func(t *testing.T) {
			g := NewWithT(t)
			img, err := idx.Image(desc.Digest)
			g.Expect(err).NotTo(HaveOccurred())
			cf, err := img.ConfigFile()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cf.OS + "/" + cf.Architecture).To(Equal(p))
			g.Expect(cf.Config.User).To(Equal("65532:65532"), "non-root, numeric (the chart's runAsUser; runAsNonRoot needs a number)")
			g.Expect(cf.Config.Entrypoint).To(Equal([]string{"/manager"}))
			g.Expect(cf.Config.Cmd).To(BeEmpty())
			g.Expect(cf.Config.Labels).To(And(
				HaveKeyWithValue("org.opencontainers.image.source", "https://github.com/buildlock/buildlock"),
				HaveKeyWithValue("org.opencontainers.image.version", imageVersion),
				HaveKeyWithValue("org.opencontainers.image.revision", imageRevision),
				HaveKeyWithValue("org.opencontainers.image.licenses", "Apache-2.0"),
				HaveKeyWithValue("org.opencontainers.image.title", "buildlock"),
			))
			epoch, _ := strconv.ParseInt(imageEpoch, 10, 64)
			g.Expect(cf.Created.Time.Equal(time.Unix(epoch, 0))).To(BeTrue(), "the image is dated SOURCE_DATE_EPOCH, created %s", cf.Created)

			t.Run("the Dockerfile builds the same image", func(t *testing.T) {
				g := NewWithT(t)
				var user, entrypoint string
				labels := map[string]string{}
				for _, line := range d.final {
					instr, rest, _ := strings.Cut(line, " ")
					switch strings.ToUpper(instr) {
					case "USER":
						user = strings.TrimSpace(rest)
					case "ENTRYPOINT":
						entrypoint = strings.TrimSpace(rest)
					case "LABEL":
						for k, v := range dockerfileLabels(t, rest) {
							labels[k] = v
						}
					}
				}
				g.Expect(cf.Config.User).To(Equal(user), "the Dockerfile's USER")
				ep, _ := json.Marshal(cf.Config.Entrypoint)
				g.Expect(string(ep)).To(Equal(entrypoint), "the Dockerfile's ENTRYPOINT")
				g.Expect(labels).NotTo(BeEmpty(), "the Dockerfile labels its image as hack/image does")
				for k, v := range labels {
					g.Expect(cf.Config.Labels).To(HaveKeyWithValue(k, v), "the Dockerfile's LABEL %s", k)
				}
				g.Expect(imageBuildArgs(t)).To(Equal(dockerfileBuildArgs(t, d)), "hack/image's go build is the Dockerfile's")
			})

			layers, err := img.Layers()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(layers).To(HaveLen(1), "no base image: one layer with the binary")
			files := layerFiles(t, layers[0])
			g.Expect(files).To(HaveLen(1))
			g.Expect(files).To(HaveKey("manager"))

			if p != runtime.GOOS+"/"+runtime.GOARCH {
				return
			}
			t.Run("the binary runs", func(t *testing.T) {
				bin := filepath.Join(t.TempDir(), "manager")
				if err := os.WriteFile(bin, files["manager"], 0o755); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(bin, "--help").CombinedOutput()
				NewWithT(t).Expect(err).NotTo(HaveOccurred(), "%s", out)
				NewWithT(t).Expect(string(out)).To(ContainSubstring("-metrics-bind-address"))
			})
		})
	}
	g.Expect(platforms).To(ConsistOf("linux/amd64", "linux/arm64"))

	t.Run("the binary carries the time-zone database and CA roots", func(t *testing.T) {
		list := exec.Command("go", "list", "-deps", "./cmd/manager")
		list.Dir = repoRoot(t)
		out, err := list.Output()
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		NewWithT(t).Expect(strings.Fields(string(out))).To(ContainElements("time/tzdata", "golang.org/x/crypto/x509roots/fallback"),
			"an image without a base has no /usr/share/zoneinfo and no CA bundle")
	})

	t.Run("a second build of the same commit, pushed as the release pushes it, has the same digest", func(t *testing.T) {
		g := NewWithT(t)
		again, err := layoutIndex(t, buildImage(t, filepath.Join(t.TempDir(), "again"), "-push", host+"/buildlock:again", "-insecure")).Digest()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(again).To(Equal(built))
		desc, err := remote.Head(mustParseReference(t, host+"/buildlock:again"))
		g.Expect(err).NotTo(HaveOccurred(), "hack/image -push pushed the image")
		g.Expect(desc.Digest).To(Equal(built))
	})
}

// layerFiles returns the regular files of a layer by path.
func layerFiles(t *testing.T, l v1.Layer) map[string][]byte {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if hdr.Uid != 0 || hdr.Mode&0o755 != 0o755 {
			t.Errorf("%s: uid %d, mode %o; want root's, executable by all", hdr.Name, hdr.Uid, hdr.Mode)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = data
	}
}

// dockerfileLabels parses a LABEL instruction's key="value" pairs.
func dockerfileLabels(t *testing.T, rest string) map[string]string {
	t.Helper()
	out, err := exec.Command("sh", "-c", `for kv in `+rest+`; do printf '%s\n' "$kv"; done`).Output()
	if err != nil {
		t.Fatalf("LABEL %s: %v", rest, err)
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("LABEL %s: %q is not key=value", rest, kv)
		}
		labels[k] = v
	}
	return labels
}

// imageBuildArgs is hack/image's go build command line, less the platform
// and the output path.
func imageBuildArgs(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "run", "./hack/image", "-print-build")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/image -print-build: %v", err)
	}
	var args []string
	if err := json.Unmarshal(out, &args); err != nil {
		t.Fatal(err)
	}
	return withoutPlatformAndOutput(args)
}

// dockerfileBuildArgs is the Dockerfile's go build line as the shell splits
// it, less the platform and the output path.
func dockerfileBuildArgs(t *testing.T, d dockerfile) []string {
	t.Helper()
	script := `set -- ` + d.buildCommand + `; for a; do printf '%s\0' "$a"; done`
	cmd := exec.Command("sh", "-c", strings.NewReplacer("${TARGETOS}", "linux", "${TARGETARCH}", "amd64").Replace(script))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("splitting the Dockerfile's build line: %v", err)
	}
	return withoutPlatformAndOutput(strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"))
}

func withoutPlatformAndOutput(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch {
		case strings.HasPrefix(args[i], "GOOS="), strings.HasPrefix(args[i], "GOARCH="):
		case args[i] == "-o":
			i++
		default:
			out = append(out, args[i])
		}
	}
	return slices.Clip(out)
}

// TestPluginImage builds the plugin's image as the release does for the
// Tekton Task (hack/image -cmd ./cmd/kubectl-buildlock on a base with a
// shell), on a stand-in base in the in-process registry: the base's layers
// come first, the labels record the base's digest, the entrypoint is
// /usr/local/bin/kubectl-buildlock, and it reports the release's version.
func TestPluginImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin; skipped with -short")
	}
	g := NewWithT(t)
	host := startRegistry(t)
	files, err := random.Layer(512, types.DockerLayer)
	g.Expect(err).NotTo(HaveOccurred())
	base, err := mutate.AppendLayers(empty.Image, files, mustLayer(t))
	g.Expect(err).NotTo(HaveOccurred())
	cf, err := base.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	base, err = mutate.ConfigFile(base, cf)
	g.Expect(err).NotTo(HaveOccurred())
	baseRef := mustParseReference(t, host+"/busybox:stand-in")
	g.Expect(remote.Write(baseRef, base)).To(Succeed())
	baseDigest, err := base.Digest()
	g.Expect(err).NotTo(HaveOccurred())
	baseLayers, err := base.Layers()
	g.Expect(err).NotTo(HaveOccurred())

	dir := filepath.Join(t.TempDir(), "plugin")
	cmd := exec.Command("go", "run", "./hack/image", "-cmd", "./cmd/kubectl-buildlock", "-dir", "/usr/local/bin",
		"-base", baseRef.String(), "-insecure", "-platforms", "linux/amd64", "-title", "kubectl-buildlock",
		"-version", imageVersion, "-revision", imageRevision, "-out", dir)
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)

	m, err := layoutIndex(t, dir).IndexManifest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.Manifests).To(HaveLen(1))
	img, err := layoutIndex(t, dir).Image(m.Manifests[0].Digest)
	g.Expect(err).NotTo(HaveOccurred())
	cf, err = img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.Config.Entrypoint).To(Equal([]string{"/usr/local/bin/kubectl-buildlock"}))
	g.Expect(cf.Config.User).To(Equal("65532:65532"))
	g.Expect(cf.Config.Labels).To(And(
		HaveKeyWithValue("org.opencontainers.image.base.name", baseRef.String()),
		HaveKeyWithValue("org.opencontainers.image.base.digest", baseDigest.String()),
		HaveKeyWithValue("org.opencontainers.image.title", "kubectl-buildlock"),
	))
	layers, err := img.Layers()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(layers).To(HaveLen(len(baseLayers) + 1))
	for i, l := range baseLayers {
		want, _ := l.Digest()
		got, _ := layers[i].Digest()
		g.Expect(got).To(Equal(want), "the base's layer %d comes first, unchanged", i)
	}
	added := layerFiles(t, layers[len(layers)-1])
	g.Expect(added).To(HaveKey("usr/local/bin/kubectl-buildlock"))
	if runtime.GOOS+"/"+runtime.GOARCH != "linux/amd64" {
		return
	}
	bin := filepath.Join(t.TempDir(), "kubectl-buildlock")
	g.Expect(os.WriteFile(bin, added["usr/local/bin/kubectl-buildlock"], 0o755)).To(Succeed())
	out, err = exec.Command(bin, "version", "-o", "json").Output()
	g.Expect(err).NotTo(HaveOccurred())
	var v struct {
		Version string `json:"version"`
	}
	g.Expect(json.Unmarshal(out, &v)).To(Succeed())
	g.Expect(v.Version).To(Equal(imageVersion), "the image's plugin reports the release")
}

// mustLayer is a layer with /bin/sh, standing for a base's shell.
func mustLayer(t *testing.T) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	script := []byte("#!/stand-in\n")
	if err := tw.WriteHeader(&tar.Header{Name: "bin/sh", Mode: 0o755, Size: int64(len(script)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(script); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := b.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}
