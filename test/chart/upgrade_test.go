package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// firstChartCommit is the commit of the first chart, 0.1.0: its CRD sat in
// crds/, had no BuildLockPolicy next to it and an older BuildLock schema.
// The upgrade test upgrades from it, so it must stay in the history CI
// checks out (a full clone, not --depth 1).
const firstChartCommit = "de55fa0c3041628570b3629f96d12e9438d6758b"

// extractChart writes charts/buildlock as it was at commit into a
// temporary directory and returns the chart's path.
func extractChart(t *testing.T, commit string) string {
	t.Helper()
	dir := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", commit, "charts/buildlock")
	archive.Dir = repoRoot(t)
	var tarball, stderr bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s (the upgrade test needs the full history: git fetch --unshallow): %v\n%s", commit, err, stderr.String())
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("extracting the chart of %s: %v\n%s", commit, err, out)
	}
	chart := filepath.Join(dir, "charts", "buildlock")
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		t.Fatalf("no chart at %s: %v", commit, err)
	}
	return chart
}

// TestChartUpgrade installs the first chart (0.1.0) on a local control
// plane, takes a lock with it, and upgrades the release to this chart as
// docs/install.md says: the CRDs become the release's own and take this
// chart's schemas (the BuildLockPolicy CRD appears, the BuildLock schema is
// the one generated from api/), and no BuildLock is lost. Then it checks
// that turning crds.install off, or uninstalling, keeps the CRDs.
func TestChartUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	h := requireHelm(t)
	previous := extractChart(t, firstChartCommit)
	c, admin := startCluster(t)
	ctx := t.Context()
	g := newG(t)
	kubeconfig := []string{"--namespace", releaseNS, "--kubeconfig", c.Kubeconfig}

	h.run(t, append([]string{"install", release, previous, "--create-namespace"}, kubeconfig...)...)
	g.Eventually(crdEstablished(ctx, admin, "buildlocks.buildlock.io")).Should(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKey{Name: "buildlockpolicies.buildlock.io"}, &apiextensionsv1.CustomResourceDefinition{})).
		To(WithTransform(apierrors.IsNotFound, BeTrue()), "0.1.0 has no BuildLockPolicy CRD")

	// A claim taken under 0.1.0, with the status its operator wrote.
	g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pipelineNS}})).To(Succeed())
	before := claim("shop-main-41", "staging", "acme/shop", 41)
	g.Expect(admin.Create(ctx, before)).To(Succeed())
	before.Status = buildlockv1.BuildLockStatus{Phase: buildlockv1.PhaseHeld, FencingToken: 7, Holder: "shop-main-41"}
	g.Expect(admin.Status().Update(ctx, before)).To(Succeed())
	tooBig := claim("web-main-big", "staging", "acme/web", 1<<53)
	g.Expect(admin.Create(ctx, tooBig, client.DryRunAll)).To(Succeed(), "0.1.0's schema has no bound on spec.build")

	t.Run("helm upgrade refuses to adopt CRDs it did not install, and says how", func(t *testing.T) {
		_, err := h.try(append([]string{"upgrade", release, "charts/buildlock"}, kubeconfig...)...)
		if err == nil {
			t.Skip("helm adopted the CRDs on its own; --take-ownership is no longer needed")
		}
		t.Logf("helm upgrade without --take-ownership: %v", err)
		newG(t).Expect(err.Error()).To(ContainSubstring("invalid ownership metadata"))
	})

	// docs/install.md: the first upgrade from 0.1.x takes ownership of the
	// CRDs that 0.1.x installed from crds/.
	h.run(t, append([]string{"upgrade", release, "charts/buildlock", "--take-ownership"}, kubeconfig...)...)

	t.Run("the upgrade installs this chart's CRDs", func(t *testing.T) {
		g := newG(t)
		for _, want := range configCRDs(t) {
			g.Eventually(crdEstablished(ctx, admin, want.Name)).Should(Succeed())
			var got apiextensionsv1.CustomResourceDefinition
			g.Expect(admin.Get(ctx, client.ObjectKey{Name: want.Name}, &got)).To(Succeed())
			g.Expect(got.Spec.Versions).To(HaveLen(len(want.Spec.Versions)))
			for i := range want.Spec.Versions {
				g.Expect(got.Spec.Versions[i].Schema).To(Equal(want.Spec.Versions[i].Schema),
					"%s %s: the served schema must be config/crd/bases'", want.Name, want.Spec.Versions[i].Name)
				g.Expect(got.Spec.Versions[i].AdditionalPrinterColumns).To(Equal(want.Spec.Versions[i].AdditionalPrinterColumns))
			}
			g.Expect(got.Annotations).To(HaveKeyWithValue("meta.helm.sh/release-name", release), "the release owns %s now", want.Name)
			g.Expect(got.Annotations).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
		}
		g.Eventually(func() error { return admin.Create(ctx, tooBig, client.DryRunAll) }).
			Should(WithTransform(apierrors.IsInvalid, BeTrue()), "the new schema bounds spec.build at 2^53-1")
		g.Expect(admin.Create(ctx, &buildlockv1.BuildLockPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "staging"},
		})).To(Succeed(), "BuildLockPolicies are served")
	})

	t.Run("no BuildLock is lost", func(t *testing.T) {
		expectClaimKept(ctx, newG(t), admin, before)
	})

	t.Run("turning crds.install off keeps the CRDs", func(t *testing.T) {
		h.run(t, append([]string{"upgrade", release, "charts/buildlock", "--set", "crds.install=false"}, kubeconfig...)...)
		g := newG(t)
		for _, want := range configCRDs(t) {
			var got apiextensionsv1.CustomResourceDefinition
			g.Expect(admin.Get(ctx, client.ObjectKey{Name: want.Name}, &got)).To(Succeed())
			g.Expect(got.DeletionTimestamp).To(BeNil(), "%s is being deleted", want.Name)
		}
		expectClaimKept(ctx, g, admin, before)
	})

	t.Run("helm uninstall keeps the CRDs and the claims", func(t *testing.T) {
		h.run(t, append([]string{"upgrade", release, "charts/buildlock"}, kubeconfig...)...)
		h.run(t, append([]string{"uninstall", release, "--wait"}, kubeconfig...)...)
		expectClaimKept(ctx, newG(t), admin, before)
	})
}

// expectClaimKept checks that the claim still exists, with its spec and
// status.
func expectClaimKept(ctx context.Context, g Gomega, c client.Client, want *buildlockv1.BuildLock) {
	var got buildlockv1.BuildLock
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(want), &got)).To(Succeed())
	g.Expect(got.UID).To(Equal(want.UID), "the same object, not a new one")
	g.Expect(got.DeletionTimestamp).To(BeNil())
	g.Expect(got.Spec).To(Equal(want.Spec))
	g.Expect(got.Status.Phase).To(Equal(want.Status.Phase))
	g.Expect(got.Status.FencingToken).To(Equal(want.Status.FencingToken))
}
