package chart

import (
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// startRegistry starts an in-process OCI registry (go-containerregistry's)
// on a loopback port, stopped when the test ends, and returns its host:port.
// It speaks plain HTTP: clients pass --plain-http (helm) or name.Insecure.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// The manager's image, as `make image` builds it (hack/image), for the
// tests' version and commit; built once per test binary.
const (
	imageVersion  = "v0.0.0-test.1"
	imageRevision = "0123456789abcdef0123456789abcdef01234567"
	// imageEpoch is the SOURCE_DATE_EPOCH of the build.
	imageEpoch = "1764590400"
)

var (
	imageOnce   sync.Once
	imageLayout string
	imageErr    error
)

// buildImage builds the manager's image into an OCI layout with hack/image
// (into dir, or a directory of its own once per test binary when dir is
// ""), with hack/image's extra flags (only with dir), and returns the
// layout's directory.
func buildImage(t *testing.T, dir string, extra ...string) string {
	t.Helper()
	build := func(out string) error {
		cmd := exec.Command("go", append([]string{"run", "./hack/image", "-version", imageVersion, "-revision", imageRevision, "-out", out}, extra...)...)
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+imageEpoch)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go run ./hack/image: %w\n%s", err, out)
		}
		return nil
	}
	if dir != "" {
		if err := build(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	imageOnce.Do(func() {
		tmp, err := os.MkdirTemp("", "buildlock-image-")
		if err != nil {
			imageErr = err
			return
		}
		imageLayout = filepath.Join(tmp, "layout")
		imageErr = build(imageLayout)
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageLayout
}

// layoutIndex is the one image index of an OCI layout.
func layoutIndex(t *testing.T, dir string) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("the layout %s holds %d entries, want one image index", dir, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatalf("the layout's entry is not an image index: %v", err)
	}
	return idx
}

// pushImage pushes the image index of the layout dir to host/repo:tag and
// returns the reference.
func pushImage(t *testing.T, dir, host, repoTag string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, layoutIndex(t, dir)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// pushChart packages charts/buildlock and pushes it to the registry at host
// (helm package, helm push), and returns its oci:// reference and version.
func pushChart(t *testing.T, h *helmRunner, host string) (ref, version string) {
	t.Helper()
	dir := t.TempDir()
	h.run(t, "package", "charts/buildlock", "--destination", dir)
	version = chartField(t, "version")
	h.run(t, "push", filepath.Join(dir, "buildlock-"+version+".tgz"), "oci://"+host+"/charts", "--plain-http")
	return "oci://" + host + "/charts/buildlock", version
}

// chartField is a top-level string field of charts/buildlock/Chart.yaml.
func chartField(t *testing.T, field string) string {
	t.Helper()
	var chart map[string]any
	readYAML(t, "charts/buildlock/Chart.yaml", &chart)
	v, ok := chart[field].(string)
	if !ok {
		t.Fatalf("charts/buildlock/Chart.yaml has no %s", field)
	}
	return v
}

func mustParseReference(t *testing.T, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}
