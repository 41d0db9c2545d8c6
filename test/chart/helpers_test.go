// Package chart tests the Helm chart (charts/buildlock) and the image's build
// (Dockerfile): rendered manifests against config/ and the API server, and
// the chart installed on a local control plane with the manager running
// under the chart's own RBAC. The tests that need helm skip unless $HELM
// names its binary (`make test-chart` and `make test` set it).
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

const (
	release   = "buildlock"
	releaseNS = "buildlock-system"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helmRunner runs the helm binary named by $HELM with its cache, config and
// data kept in a temporary directory.
type helmRunner struct {
	bin, home, root string
}

// requireHelm returns a helm runner, or skips the test when $HELM is unset.
func requireHelm(t *testing.T) *helmRunner {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		t.Skip("HELM is not set: run `make test-chart` (or set HELM to a helm v3 binary) to test the chart")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("HELM=%s: %v", bin, err)
	}
	return &helmRunner{bin: bin, home: t.TempDir(), root: repoRoot(t)}
}

// run runs helm in the repository root and returns its standard output; a
// failure fails the test with helm's output.
func (h *helmRunner) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.try(args...)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (h *helmRunner) try(args ...string) (string, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Dir = h.root
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w\n%s%s", err, stderr.String(), stdout.String())
	}
	return stdout.String(), nil
}

// template renders the chart as release in releaseNS with the given --set
// values, for the control plane's Kubernetes version.
func (h *helmRunner) template(t *testing.T, extra ...string) string {
	t.Helper()
	args := append([]string{"template", release, "charts/buildlock", "--namespace", releaseNS,
		"--kube-version", testenv.K8sVersion}, extra...)
	return h.run(t, args...)
}

// parseObjects splits a multi-document YAML stream into objects.
func parseObjects(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("parsing rendered manifests: %v", err)
		}
		if m == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find converts the one object of kind and name (any namespace) into out;
// it fails the test when there is none.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	o := findObj(t, objs, kind, name)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("converting %s %s: %v", kind, name, err)
	}
}

// findObj returns the one object of kind and name (any namespace).
func findObj(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("the chart renders no %s %q", kind, name)
	return nil
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	n := map[string]int{}
	for _, o := range objs {
		n[o.GetKind()]++
	}
	return n
}

// readYAML reads one YAML document from a file in the repository into out.
func readYAML(t *testing.T, rel string, out any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatalf("reading %s (run `make manifests` if it is generated): %v", rel, err)
	}
	if err := utilyaml.Unmarshal(data, out); err != nil {
		t.Fatalf("parsing %s: %v", rel, err)
	}
}

// startCluster starts a local control plane without the CRDs (the chart or
// the installer under test installs them), stopped when the test ends, and
// returns it with an administrator's client.
func startCluster(t *testing.T) (*localcluster.Cluster, client.Client) {
	t.Helper()
	return startClusterWith(t, localcluster.Options{WithoutCRDs: true})
}

// startClusterWith starts a local control plane with o, as startCluster.
func startClusterWith(t *testing.T, o localcluster.Options) (*localcluster.Cluster, client.Client) {
	t.Helper()
	c, err := localcluster.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	scheme := testenv.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, admin
}

// crdEstablished returns a poller that succeeds once the API server serves
// the CRD name.
func crdEstablished(ctx context.Context, c client.Client, name string) func() error {
	return func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("CRD %s is not established yet", name)
	}
}

// configCRDs returns the CRDs generated from api/, config/crd/bases.
func configCRDs(t *testing.T) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(repoRoot(t), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (run `make manifests`): %v", err)
	}
	crds := make([]apiextensionsv1.CustomResourceDefinition, len(paths))
	for i, p := range paths {
		rel, _ := filepath.Rel(repoRoot(t), p)
		readYAML(t, rel, &crds[i])
	}
	return crds
}

// newG returns a Gomega for t whose Eventually waits up to 30 seconds, long
// enough for a loaded machine, polling every 100 ms.
func newG(t *testing.T) Gomega {
	g := NewWithT(t)
	g.SetDefaultEventuallyTimeout(30 * time.Second)
	g.SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	return g
}
