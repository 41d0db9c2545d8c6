package chart

import (
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
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

// pushImage pushes a stand-in for the manager's image (a random
// two-platform index: nothing runs it here, there is no kubelet) to
// host/repoTag and returns its reference. make release-rehearsal
// (test/rehearsal) installs the chart with the image the release builds.
func pushImage(t *testing.T, host, repoTag string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
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
