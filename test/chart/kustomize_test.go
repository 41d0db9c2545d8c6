package chart

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
)

// installer renders the installer without Helm as `make deploy`, `make
// build-installer` and the release do (`make installer`: kustomize edit set
// image on a copy of config/), with image.
func installer(t *testing.T, image string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "install.yaml")
	cmd := exec.Command("make", "--no-print-directory", "-s", "installer", "IMG="+image, "INSTALLER="+out)
	cmd.Dir = repoRoot(t)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make installer: %v\n%s", err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestInstallWithoutHelm applies the installer of `make deploy`, `make
// build-installer` and the release (config/default) server-side to a local control plane and
// runs the manager binary under the identity and RBAC it creates, with the
// arguments of its Deployment, through a hand-off.
func TestInstallWithoutHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	manager := buildManager(t)
	manifests := installer(t, "registry.example/buildlock:v9.9.9")
	objs := parseObjects(t, manifests)
	var d appsv1.Deployment
	find(t, objs, "Deployment", "buildlock", &d)

	t.Run("it installs every CRD, under the names the chart uses, with the image asked for", func(t *testing.T) {
		g := NewWithT(t)
		for _, crd := range configCRDs(t) {
			findObj(t, objs, "CustomResourceDefinition", crd.Name)
		}
		g.Expect(kinds(objs)).To(HaveKeyWithValue("CustomResourceDefinition", len(configCRDs(t))),
			"config/crd/kustomization.yaml must list every CRD of config/crd/bases")
		for _, name := range []string{"buildlock-manager", "buildlock-pipeline", "buildlock-view", "buildlock-metrics-auth", "buildlock-metrics-reader"} {
			findObj(t, objs, "ClusterRole", name)
		}
		g.Expect(d.Namespace).To(Equal(releaseNS))
		g.Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal(managerSA))
		g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.example/buildlock:v9.9.9"))
		var ns corev1.Namespace
		find(t, objs, "Namespace", releaseNS, &ns)
		g.Expect(ns.Labels).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))
	})

	// Issue 31: verified by default.
	t.Run("it installs the identity admission policies of config/identity, and no fence", func(t *testing.T) {
		g := NewWithT(t)
		var got []string
		for _, o := range objs {
			if strings.HasSuffix(o.GetKind(), "AdmissionPolicy") || strings.HasSuffix(o.GetKind(), "AdmissionPolicyBinding") {
				got = append(got, o.GetKind()+" "+o.GetName())
				g.Expect(o.GetNamespace()).To(BeEmpty(), "%s %s is cluster-scoped", o.GetKind(), o.GetName())
			}
		}
		var want []string
		for _, o := range configPolicies(t, "identity") {
			u := unstructured.Unstructured{Object: o}
			want = append(want, u.GetKind()+" "+u.GetName())
		}
		g.Expect(got).To(ConsistOf(want))
	})

	t.Run("the manager runs with the chart's defaults", func(t *testing.T) {
		h := requireHelm(t)
		chart := chartArgs(t, h)
		for _, arg := range d.Spec.Template.Spec.Containers[0].Args {
			NewWithT(t).Expect(chart).To(ContainElement(arg), "the chart's manager runs with other flags than config/manager's")
		}
	})

	t.Run("config/prometheus scrapes the metrics Service over HTTPS with a token", func(t *testing.T) {
		g := NewWithT(t)
		out, err := exec.Command(localcluster.KubectlPath(repoRoot(t)), "kustomize", filepath.Join(repoRoot(t), "config", "prometheus")).Output()
		g.Expect(err).NotTo(HaveOccurred())
		var sm monitoringv1.ServiceMonitor
		strictly(t, findObj(t, parseObjects(t, string(out)), "ServiceMonitor", "buildlock"), &sm)
		var svc corev1.Service
		find(t, objs, "Service", "buildlock-metrics", &svc)
		for k, v := range sm.Spec.Selector.MatchLabels {
			g.Expect(svc.Labels).To(HaveKeyWithValue(k, v), "the ServiceMonitor must select the metrics Service")
		}
		g.Expect(sm.Spec.Endpoints).To(ConsistOf(And(
			HaveField("Port", svc.Spec.Ports[0].Name), HaveField("Scheme", HaveValue(BeEquivalentTo("https"))), HaveField("HonorLabels", true))))
	})

	t.Run("config/manager's image is the chart's appVersion", func(t *testing.T) {
		var chart struct {
			AppVersion string `json:"appVersion"`
		}
		readYAML(t, "charts/buildlock/Chart.yaml", &chart)
		data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "manager", "manager.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		find(t, parseObjects(t, string(data)), "Deployment", "buildlock", &d)
		NewWithT(t).Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal("ghcr.io/buildlock/buildlock:" + chart.AppVersion))
	})

	c, admin := startCluster(t)
	ctx := t.Context()
	g := newG(t)
	g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pipelineNS}})).To(Succeed())

	apply := c.Kubectl(ctx, "apply", "--server-side", "-f", "-")
	apply.Stdin = bytes.NewBufferString(manifests)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply --server-side refused the installer: %v\n%s", err, out)
	}
	for _, crd := range configCRDs(t) {
		g.Eventually(crdEstablished(ctx, admin, crd.Name)).Should(Succeed())
	}

	t.Run("the manager's pod passes Pod Security restricted", func(t *testing.T) {
		expectRestrictedPod(t, admin, objs)
	})

	// The API server compiles the mutating policy against the CRD's schema
	// a moment after both exist, and refuses BuildLocks until then.
	g.Eventually(func() error {
		return admin.Create(ctx, claim("probe", "staging", "acme/probe", 1), client.DryRunAll)
	}).Should(Succeed(), "the admission policies admit claims")
	asPipeline := bindPipeline(ctx, g, c, admin)
	mgr := startManager(t, manager, d.Spec.Template.Spec.Containers[0].Args, asServiceAccount(c.Config, releaseNS, managerSA))

	t.Run("its RBAC lets the manager hand a lock over and serve metrics to a reader", func(t *testing.T) {
		g := newG(t)
		handOff(ctx, g, admin, asPipeline, "staging", 7)
		bl := &buildlockv1.BuildLock{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: "shop-main-7"}, bl)).To(Succeed())
		g.Expect(bl.Spec.Requester).To(HaveValue(HaveField("Username", "system:serviceaccount:"+pipelineNS+":"+pipelineSA)),
			"config/identity's admission policy stamps who created the claim")

		g.Expect(mgr.secure).To(BeTrue(), "config/manager serves metrics securely")
		g.Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "prometheus-buildlock-metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "buildlock-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNS, Name: "prometheus"}},
		})).To(Succeed())
		token := serviceAccountToken(ctx, g, admin, releaseNS, "prometheus")
		g.Eventually(func(g Gomega) {
			code, body := mgr.scrape(g, token)
			g.Expect(code).To(Equal(http.StatusOK), body)
			g.Expect(body).To(ContainSubstring("buildlock_grants_total"))
		}).Should(Succeed())
		g.Expect(mgr.logs.String()).NotTo(ContainSubstring("forbidden"), "the manager was refused something it needs")

	})
}
