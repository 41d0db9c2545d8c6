package chart

import (
	"testing"

	. "github.com/onsi/gomega"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/internal/localcluster"
)

// TestHelmInstallOnTheLocalControlPlane: `make run`'s local control plane
// installs the CRDs and the admission policies itself, so `helm install`
// of the chart is refused ("invalid ownership metadata") and succeeds with
// --take-ownership, which docs/install.md tells a newcomer to add; the CRDs
// are then the release's.
func TestHelmInstallOnTheLocalControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	h := requireHelm(t)
	c, admin := startClusterWith(t, localcluster.Options{}) // as make run starts it
	ref, version := pushChart(t, h, startRegistry(t))
	install := []string{"install", release, ref, "--version", version, "--plain-http", "--namespace", releaseNS,
		"--create-namespace", "--kubeconfig", c.Kubeconfig, "--set", "enforcement.enabled=true"}

	g := NewWithT(t)
	_, err := h.try(install...)
	g.Expect(err).To(MatchError(ContainSubstring("invalid ownership metadata")), "helm refuses the CRDs that the local control plane installed")
	h.run(t, append(install, "--take-ownership")...)

	for _, crd := range configCRDs(t) {
		var got apiextensionsv1.CustomResourceDefinition
		g.Expect(admin.Get(t.Context(), client.ObjectKey{Name: crd.Name}, &got)).To(Succeed())
		g.Expect(got.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"), "%s is the release's", crd.Name)
		g.Expect(got.Annotations).To(HaveKeyWithValue("meta.helm.sh/release-name", release))
	}
}
