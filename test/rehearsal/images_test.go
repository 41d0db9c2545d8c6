package rehearsal

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	ociremote "github.com/sigstore/cosign/v3/pkg/oci/remote"
)

// startRegistry starts go-containerregistry's registry on a loopback port
// for the test and returns its host:port. Clients speak plain HTTP to it:
// go-containerregistry (ko, cosign's library) does so for loopback
// addresses by itself, helm with --plain-http.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// platforms are the images' platforms (.ko.yaml's defaultPlatforms).
var platforms = []string{"linux/amd64", "linux/arm64"}

// standIns are the references, by digest, of the bases the rehearsal
// builds the images on.
type standIns struct{ manager, plugin string }

// pushStandIns pushes two-platform stand-ins for the images' bases:
// distroless static:nonroot's user and /etc/passwd for the manager, a
// /bin/sh for the plugin (busybox). The release builds on the real ones,
// which need the network.
func pushStandIns(t *testing.T, host string) standIns {
	return standIns{
		manager: pushBase(t, host+"/stand-in/static:nonroot", "65532", map[string]string{"etc/passwd": "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"}),
		plugin:  pushBase(t, host+"/stand-in/busybox:musl", "", map[string]string{"bin/sh": "#!stand-in for busybox's sh\n"}),
	}
}

func pushBase(t *testing.T, ref, user string, files map[string]string) string {
	t.Helper()
	layer := tarLayer(t, files)
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		img, err := mutate.AppendLayers(empty.Image, layer)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, _ = strings.Cut(p, "/")
		cf.Config.User = user
		cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture}}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, "application/vnd.oci.image.index.v1+json"), adds...)
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return r.Context().Digest(d.String()).String()
}

func tarLayer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	names := keys(files)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
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

// releaseImages are the images ko pushed, by digest.
type releaseImages struct{ manager, plugin name.Digest }

// checkImages: each image's reference (dist/images/NAME.ref) is an index of
// both platforms in the registry, also under the release's tag; each
// platform's image runs its binary from the base's stand-in, records the
// base and carries the labels; ko's SBOM is attached; the binary of this
// platform runs and, for the plugin, is the archive's byte for byte (built
// once, with one set of flags).
func (r *rehearsal) checkImages(t *testing.T, host string, bases standIns) releaseImages {
	var out releaseImages
	for _, img := range []struct {
		name, base, entrypoint string
		into                   *name.Digest
	}{
		{"buildlock", bases.manager, "/ko-app/manager", &out.manager},
		{"kubectl-buildlock", bases.plugin, "/ko-app/kubectl-buildlock", &out.plugin},
	} {
		t.Run(img.name, func(t *testing.T) {
			// ko's first line is the index; the platforms' images follow.
			refText, _, _ := strings.Cut(strings.TrimSpace(string(r.read(t, "dist/images/"+img.name+".ref"))), "\n")
			ref, err := name.NewDigest(refText)
			if err != nil {
				t.Fatalf("dist/images/%s.ref: %v", img.name, err)
			}
			*img.into = ref
			if ref.Context().String() != host+"/"+img.name {
				t.Errorf("ko pushed %s, want it in %s/%s", ref, host, img.name)
			}
			if tagged := resolve(t.Context(), t, host+"/"+img.name+":"+r.version); tagged.DigestStr() != ref.DigestStr() {
				t.Errorf("the tag %s is %s, ko built %s", r.version, tagged.DigestStr(), ref.DigestStr())
			}
			idx, err := remote.Index(ref)
			if err != nil {
				t.Fatalf("%s is not an image index: %v", ref, err)
			}
			m, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, desc := range m.Manifests {
				p := desc.Platform.OS + "/" + desc.Platform.Architecture
				got = append(got, p)
				image, err := idx.Image(desc.Digest)
				if err != nil {
					t.Fatal(err)
				}
				checkImage(t, image, p, img.entrypoint, img.base, img.name, r.tag())
				if p != runtime.GOOS+"/"+runtime.GOARCH {
					continue
				}
				bin := extractFile(t, image, img.entrypoint)
				if img.name == "kubectl-buildlock" {
					archive := r.path("dist/goreleaser/kubectl-buildlock_" + r.tag() + "_" + runtime.GOOS + "_" + runtime.GOARCH + ".tar.gz")
					if !bytes.Equal(bin, archiveFile(t, archive, "kubectl-buildlock")) {
						t.Errorf("the image's plugin differs from the archive's (%s): the two builds' flags differ", archive)
					}
				} else {
					file := filepath.Join(t.TempDir(), "manager")
					if err := os.WriteFile(file, bin, 0o755); err != nil {
						t.Fatal(err)
					}
					if out, err := exec.Command(file, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "-metrics-bind-address") {
						t.Errorf("the image's manager --help: %v\n%s", err, out)
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, platforms) {
				t.Errorf("%s has platforms %v, want %v", ref, got, platforms)
			}
			checkSBOM(t, ref)
		})
	}
	return out
}

// checkImage checks one platform's image of the release.
func checkImage(t *testing.T, img v1.Image, platform, entrypoint, base, title, tag string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.OS + "/" + cf.Architecture; got != platform {
		t.Errorf("%s: the image is for %s", platform, got)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{entrypoint}) {
		t.Errorf("%s: entrypoint %q, want [%s]", platform, cf.Config.Entrypoint, entrypoint)
	}
	// The CI steps run the plugin by name in its image (a shell's PATH).
	onPath := false
	for _, e := range cf.Config.Env {
		if p, ok := strings.CutPrefix(e, "PATH="); ok {
			onPath = slices.Contains(strings.Split(p, ":"), path.Dir(entrypoint))
		}
	}
	if !onPath {
		t.Errorf("%s: PATH (%q) lacks %s", platform, cf.Config.Env, path.Dir(entrypoint))
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/buildlock/buildlock",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  tag,
		"org.opencontainers.image.title":    title,
	} {
		if cf.Config.Labels[k] != v {
			t.Errorf("%s: label %s is %q, want %q", platform, k, cf.Config.Labels[k], v)
		}
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	baseRef, _ := name.NewDigest(base)
	if got := m.Annotations["org.opencontainers.image.base.name"]; !strings.HasPrefix(got, baseRef.Context().String()) {
		t.Errorf("%s: the image records base %q, want %s", platform, got, base)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) < 2 {
		t.Errorf("%s: %d layers; want the base's, then the binary's", platform, len(layers))
	}
}

// checkSBOM: ko attached an SPDX SBOM to the image index (cosign's
// convention: the tag sha256-<digest>.sbom).
func checkSBOM(t *testing.T, ref name.Digest) {
	t.Helper()
	tag, err := ociremote.SBOMTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(tag)
	if err != nil {
		t.Fatalf("no SBOM at %s: %v", tag, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("the SBOM %s has %d layers (%v), want one", tag, len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name string `json:"name"`
		} `json:"packages"`
	}
	if err := json.NewDecoder(rc).Decode(&doc); err != nil {
		t.Fatalf("the SBOM %s is not SPDX JSON: %v", tag, err)
	}
	if !strings.HasPrefix(doc.SPDXVersion, "SPDX-") || len(doc.Packages) == 0 {
		t.Errorf("the SBOM %s: version %q, %d packages", tag, doc.SPDXVersion, len(doc.Packages))
	}
}

// extractFile returns the file at path from an image's flattened layers.
func extractFile(t *testing.T, img v1.Image, file string) []byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	want := strings.TrimPrefix(path.Clean(file), "/")
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("the image has no %s", file)
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(path.Clean(hdr.Name), "/") == want && hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}

// archiveFiles lists a release archive's files (.tar.gz or .zip), sorted.
func archiveFiles(t *testing.T, file string) []string {
	t.Helper()
	var names []string
	walkArchive(t, file, func(n string, _ io.Reader) { names = append(names, n) })
	slices.Sort(names)
	return names
}

// archiveFile is one file of a release archive.
func archiveFile(t *testing.T, file, member string) []byte {
	t.Helper()
	var data []byte
	walkArchive(t, file, func(n string, r io.Reader) {
		if n == member {
			var err error
			if data, err = io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
		}
	})
	if data == nil {
		t.Fatalf("%s has no %s", file, member)
	}
	return data
}

func walkArchive(t *testing.T, file string, f func(name string, r io.Reader)) {
	t.Helper()
	if strings.HasSuffix(file, ".zip") {
		z, err := zip.OpenReader(file)
		if err != nil {
			t.Fatal(err)
		}
		defer z.Close()
		for _, e := range z.File {
			rc, err := e.Open()
			if err != nil {
				t.Fatal(err)
			}
			f(e.Name, rc)
			rc.Close()
		}
		return
	}
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	gz, err := gzip.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		f(hdr.Name, tr)
	}
}
