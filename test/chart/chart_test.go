package chart

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/localcluster"
)

const (
	// pipelineNS is where the pipelines' claims and pods live.
	pipelineNS = "ci"
	// managerSA is the ServiceAccount the chart creates for release.
	managerSA = "buildlock"
	// pipelineSA is a pipeline's ServiceAccount, bound to the chart's
	// pipeline ClusterRole in pipelineNS.
	pipelineSA = "pipeline"
	// fencedNS is a target namespace that consents to pipelineNS's lock.
	fencedNS = "fenced"
)

// TestChart installs the chart from an OCI registry on a local control
// plane, runs the manager binary as the chart's ServiceAccount, and drives a
// hand-off: the chart's
// RBAC is enough. Then it shows that RBAC is not more than enough, and that
// `helm uninstall` leaves nothing cluster-wide but the CRDs (crds.keep).
func TestChart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	h := requireHelm(t)
	manager := buildManager(t)
	// Prometheus's ServiceAccount may read the metrics (metrics.readers);
	// the admission policies stamp and check every claim.
	values := []string{
		"--set", "enforcement.enabled=true",
		"--set", "metrics.readers[0].kind=ServiceAccount", "--set", "metrics.readers[0].name=prometheus",
		"--set", "metrics.readers[0].namespace=monitoring",
	}

	// No CRD from config/: the chart installs them.
	c, admin := startCluster(t)
	ctx := t.Context()
	g := newG(t)
	scheme := admin.Scheme()

	// The release namespace enforces Pod Security "restricted", as a careful
	// cluster would.
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: releaseNS, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted",
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: pipelineNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		// A target that consents to ci's lock.
		{ObjectMeta: metav1.ObjectMeta{Name: fencedNS, Labels: map[string]string{buildlockv1.LockedByLabel: pipelineNS}}},
		// Prometheus's.
		{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}},
	} {
		g.Expect(admin.Create(ctx, ns)).To(Succeed())
	}
	before := clusterScopedObjects(t, c.Config)

	t.Run("the rendered chart is accepted by the API server", func(t *testing.T) {
		for name, values := range map[string][]string{
			"defaults":           nil,
			"watched namespaces": {"--set", "watchNamespaces={ci,team-a}", "--set", "replicaCount=2", "--set", "podDisruptionBudget.enabled=true"},
			"enforcement":        {"--set", "enforcement.enabled=true"},
		} {
			t.Run(name, func(t *testing.T) { serverDryRun(t, c, h.template(t, values...)) })
		}
	})

	t.Run("the manager's pod passes Pod Security restricted", func(t *testing.T) {
		expectRestrictedPod(t, admin, parseObjects(t, h.template(t)))
	})

	// Installed as a user would: the chart from an OCI registry (helm
	// package and push, then helm install oci://), with the Deployment's
	// image in the same registry (the image test's build). Nothing runs the
	// image here (no kubelet): the manager binary below stands for it.
	registry := startRegistry(t)
	chartRef, chartVersion := pushChart(t, h, registry)
	image := pushImage(t, buildImage(t, ""), registry, "buildlock:"+chartField(t, "appVersion"))
	values = append(values, "--set", "image.repository="+registry+"/buildlock")
	fromRegistry := []string{chartRef, "--version", chartVersion, "--plain-http"}
	h.run(t, slices.Concat([]string{"install", release}, fromRegistry, []string{"--namespace", releaseNS, "--kubeconfig", c.Kubeconfig}, values)...)

	t.Run("the Deployment's image is the one in the registry", func(t *testing.T) {
		g := NewWithT(t)
		var d appsv1.Deployment
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "buildlock"}, &d)).To(Succeed())
		g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(image.String()))
		want, err := remote.Head(image)
		g.Expect(err).NotTo(HaveOccurred())
		got, err := remote.Head(mustParseReference(t, d.Spec.Template.Spec.Containers[0].Image))
		g.Expect(err).NotTo(HaveOccurred(), "the Deployment's image resolves in the registry")
		g.Expect(got.Digest).To(Equal(want.Digest))
	})

	for _, crd := range configCRDs(t) {
		g.Eventually(crdEstablished(ctx, admin, crd.Name)).Should(Succeed(), "helm installs the chart's CRDs")
	}
	// The API server compiles the mutating policy against the CRD's schema
	// a moment after both exist, and refuses BuildLocks until then.
	g.Eventually(func() error {
		return admin.Create(ctx, claim("probe", "staging", "acme/probe", 1), client.DryRunAll)
	}).Should(Succeed(), "the admission policies admit claims")

	asPipeline := bindPipeline(ctx, g, c, admin)
	managerCfg := asServiceAccount(c.Config, releaseNS, managerSA)
	asManager, err := client.New(managerCfg, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())

	// The manager runs with the chart's arguments, as the chart's
	// ServiceAccount.
	mgr := startManager(t, manager, chartArgs(t, h, values...), managerCfg)

	t.Run("the chart's RBAC lets the manager elect a leader and hand a lock over", func(t *testing.T) {
		g := newG(t)

		g.Eventually(func(g Gomega) {
			lease := &coordinationv1.Lease{}
			g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "buildlock-manager.buildlock.io"}, lease)).To(Succeed())
			g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).NotTo(BeEmpty())
		}).Should(Succeed(), "the manager holds the leader-election Lease in the release namespace")

		handOff(ctx, g, admin, asPipeline, "staging", 41)
		bl := &buildlockv1.BuildLock{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: "shop-main-41"}, bl)).To(Succeed())
		g.Expect(bl.Spec.Requester).To(HaveValue(HaveField("Username", "system:serviceaccount:"+pipelineNS+":"+pipelineSA)),
			"enforcement.enabled: the chart's admission policy stamps who created the claim")

		g.Eventually(func(g Gomega) {
			var events eventsv1.EventList
			g.Expect(admin.List(ctx, &events, client.InNamespace(pipelineNS))).To(Succeed())
			g.Expect(events.Items).To(ContainElement(And(
				HaveField("Regarding.Name", "web-main-41"), HaveField("Reason", buildlockv1.ReasonAcquired))))
		}).Should(Succeed(), "the manager records events")

		g.Expect(get(g, fmt.Sprintf("http://%s/readyz", mgr.probeAddr))).To(Equal("ok"))

		g.Expect(mgr.logs.String()).NotTo(ContainSubstring("forbidden"), "the manager was refused something it needs")
	})

	t.Run("the metrics endpoint serves the alerts' metrics, to Prometheus only", func(t *testing.T) {
		g := newG(t)
		// A build waits for staging, so that the per-lock gauges have a
		// waiter to show.
		waiter := claim("api-main-41", "staging", "acme/api", 41)
		waiter.Spec.PodRef = nil
		g.Expect(asPipeline.Create(ctx, waiter)).To(Succeed())
		g.Eventually(phaseOf(ctx, admin, waiter.Name)).Should(Equal("Waiting"))

		g.Expect(mgr.secure).To(BeTrue(), "the chart's default: metrics.secure")
		prometheus := serviceAccountToken(ctx, g, admin, "monitoring", "prometheus")
		stranger := serviceAccountToken(ctx, g, admin, "monitoring", "stranger")
		for token, want := range map[string]int{"": http.StatusUnauthorized, stranger: http.StatusForbidden} {
			code, body := mgr.scrape(g, token)
			g.Expect(code).To(Equal(want), "a scrape without the right to get /metrics: %s", body)
		}
		var body string
		g.Eventually(func(g Gomega) {
			var code int
			code, body = mgr.scrape(g, prometheus)
			g.Expect(code).To(Equal(http.StatusOK), body)
			g.Expect(body).To(ContainSubstring("buildlock_grants_total"))
		}).Should(Succeed(), "the metrics endpoint serves the operator's metrics to Prometheus")

		exposed := exposedMetrics(body)
		for _, name := range alertMetrics(t, h) {
			g.Expect(exposed).To(HaveKey(name), "the alerts use %s, which the manager does not expose", name)
		}
		g.Expect(asPipeline.Delete(ctx, waiter)).To(Succeed())
	})

	t.Run("helm test passes", func(t *testing.T) {
		helmTest(t, h, c, admin, mgr)
	})

	t.Run("the chart's RBAC refuses the manager what it does not need", func(t *testing.T) {
		g := NewWithT(t)
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "get", Resource: "secrets", Namespace: pipelineNS},
			{Verb: "list", Resource: "secrets"},
			{Verb: "get", Resource: "configmaps", Namespace: pipelineNS},
			{Verb: "create", Resource: "pods", Namespace: pipelineNS},
			{Verb: "update", Resource: "pods", Namespace: pipelineNS},
			{Verb: "patch", Resource: "pods", Namespace: pipelineNS},
			{Verb: "delete", Resource: "pods", Namespace: pipelineNS},
			{Verb: "update", Resource: "pods", Subresource: "status", Namespace: pipelineNS},
			{Verb: "create", Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS},
			{Verb: "update", Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS},
			{Verb: "patch", Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS},
			{Verb: "get", Group: "apps", Resource: "deployments", Namespace: pipelineNS},
			{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Namespace: pipelineNS},
			{Verb: "update", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
		} {
			g.Expect(allowed(ctx, g, asManager, a)).To(BeFalse(), "the manager must not %s", describe(a))
		}
		// It may impersonate the enforcement probe, and no one else.
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "impersonate", Resource: "users", Name: "alice"},
			{Verb: "impersonate", Resource: "users", Name: "system:admin"},
			{Verb: "impersonate", Resource: "groups", Name: "system:masters"},
			{Verb: "impersonate", Resource: "serviceaccounts", Name: pipelineSA, Namespace: pipelineNS},
			{Verb: "impersonate", Group: "authentication.k8s.io", Resource: "userextras", Subresource: "authentication.kubernetes.io/pod-uid"},
		} {
			g.Expect(allowed(ctx, g, asManager, a)).To(BeFalse(), "the manager must not %s %s", describe(a), a.Name)
		}
		g.Expect(allowed(ctx, g, asManager, authorizationv1.ResourceAttributes{
			Verb: "impersonate", Resource: "users", Name: buildlockv1.EnforcementProbeUser,
		})).To(BeTrue(), "the manager impersonates its probe")
		// The same question answers yes where the chart grants the right, so
		// the noes above are the chart's.
		g.Expect(allowed(ctx, g, asManager, authorizationv1.ResourceAttributes{
			Verb: "update", Group: "buildlock.io", Resource: "buildlocks", Subresource: "status", Namespace: pipelineNS,
		})).To(BeTrue())

		// And real calls are refused.
		err := asManager.List(ctx, &corev1.SecretList{}, client.InNamespace(pipelineNS))
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing secrets: %v", err)
		err = asManager.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "not-mine"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}},
		})
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "creating a pod: %v", err)
	})

	t.Run("whoever may view a namespace sees its locks, whoever may edit it takes turns", func(t *testing.T) {
		g := newG(t)
		aggregateClusterRoles(ctx, g, admin)
		for user, role := range map[string]string{"viewer": "view", "editor": "edit"} {
			g.Expect(admin.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: user},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
			})).To(Succeed())
		}
		asViewer, err := client.New(asUser(c.Config, "viewer"), client.Options{Scheme: scheme})
		g.Expect(err).NotTo(HaveOccurred())
		asEditor, err := client.New(asUser(c.Config, "editor"), client.Options{Scheme: scheme})
		g.Expect(err).NotTo(HaveOccurred())

		bl := &buildlockv1.BuildLock{}
		g.Expect(asViewer.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: "web-main-41"}, bl)).To(Succeed())
		g.Expect(bl.Status.Holder).To(Equal("web-main-41"), "a viewer sees who holds staging")
		g.Expect(asViewer.List(ctx, &buildlockv1.BuildLockPolicyList{}, client.InNamespace(pipelineNS))).To(Succeed())
		for _, verb := range []string{"create", "patch", "delete"} {
			g.Expect(allowed(ctx, g, asViewer, authorizationv1.ResourceAttributes{
				Verb: verb, Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS,
			})).To(BeFalse(), "a viewer must not %s buildlocks", verb)
		}
		g.Expect(allowed(ctx, g, asViewer, authorizationv1.ResourceAttributes{
			Verb: "list", Group: "buildlock.io", Resource: "buildlocks", Namespace: "team-a",
		})).To(BeFalse(), "view is bound in %s only", pipelineNS)
		g.Expect(allowed(ctx, g, asEditor, authorizationv1.ResourceAttributes{
			Verb: "create", Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS,
		})).To(BeTrue(), "an editor may take turns")
	})

	t.Run("the pipeline role may take turns but not write verdicts", func(t *testing.T) {
		g := NewWithT(t)
		for _, verb := range []string{"create", "get", "list", "watch", "patch", "delete"} {
			g.Expect(allowed(ctx, g, asPipeline, authorizationv1.ResourceAttributes{
				Verb: verb, Group: "buildlock.io", Resource: "buildlocks", Namespace: pipelineNS,
			})).To(BeTrue(), "a pipeline must be able to %s buildlocks", verb)
		}
		for _, verb := range []string{"get", "list", "watch"} {
			g.Expect(allowed(ctx, g, asPipeline, authorizationv1.ResourceAttributes{
				Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Namespace: pipelineNS,
			})).To(BeTrue(), "a pipeline must be able to %s the grant Leases", verb)
		}
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "update", Group: "buildlock.io", Resource: "buildlocks", Subresource: "status", Namespace: pipelineNS},
			{Verb: "patch", Group: "buildlock.io", Resource: "buildlocks", Subresource: "status", Namespace: pipelineNS},
			{Verb: "create", Group: "buildlock.io", Resource: "buildlocks", Namespace: "team-a"},
			{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: pipelineNS},
			{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: pipelineNS},
			{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: pipelineNS},
			{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: "team-a"},
		} {
			g.Expect(allowed(ctx, g, asPipeline, a)).To(BeFalse(), "a pipeline must not %s", describe(a))
		}
		bl := &buildlockv1.BuildLock{}
		g.Expect(asPipeline.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: "web-main-41"}, bl)).To(Succeed())
		bl.Status.Phase = buildlockv1.PhaseReleased
		err := asPipeline.Status().Update(ctx, bl)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a pipeline writing a status: %v", err)
	})

	t.Run("the chart's RBAC lets the manager fence a target and prove it with its probe", func(t *testing.T) {
		g := newG(t)
		fenced := fencedNS
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: fenced}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{pipelineSA}}
		g.Expect(admin.Create(ctx, policy)).To(Succeed())
		g.Eventually(func(g Gomega) {
			g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			g.Expect(meta.FindStatusCondition(policy.Status.Conditions, buildlockv1.ConditionEnforced)).
				To(HaveValue(HaveField("Reason", buildlockv1.ReasonEnforcing)))
		}).Should(Succeed(), "the probe, impersonated under the chart's RBAC, was refused by the fence")
		lease := &coordinationv1.Lease{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: buildlockv1.GrantLeaseName(fenced)}, lease)).To(Succeed())
		asPerson, err := client.New(asUser(c.Config, "editor-of-ci"), client.Options{Scheme: scheme})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "editor-of-ci"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "editor-of-ci"}},
		})).To(Succeed())
		g.Expect(asPerson.Delete(ctx, lease)).To(MatchError(ContainSubstring("written by the buildlock operator (system:serviceaccount:"+
			releaseNS+":"+managerSA+") only")), "only the chart's ServiceAccount writes a lock's Lease")
		g.Expect(mgr.logs.String()).NotTo(ContainSubstring("forbidden"), "the manager was refused something it needs")

		g.Expect(admin.Delete(ctx, policy)).To(Succeed())
		g.Eventually(func() error {
			return admin.Get(ctx, client.ObjectKey{Name: "buildlock-enforce." + pipelineNS + "." + fenced}, &admissionv1.ValidatingAdmissionPolicyBinding{})
		}).Should(WithTransform(apierrors.IsNotFound, BeTrue()), "the operator deletes the binding of a lock that no longer enforces")
	})

	mgr.stop(t)

	t.Run("turning enforcement off and on again keeps the Lease informer's keep-alive", func(t *testing.T) {
		g := newG(t)
		keepAlive := func() types.UID {
			vap := &metav1.PartialObjectMetadata{}
			vap.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicy"))
			g.Expect(admin.Get(ctx, client.ObjectKey{Name: "buildlock-lease-informer"}, vap)).To(Succeed())
			return vap.UID
		}
		before := keepAlive()
		off := append(slices.Clone(values), "--set", "enforcement.enabled=false")
		h.run(t, append([]string{"upgrade", release, "charts/buildlock", "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig}, off...)...)
		enforce := &metav1.PartialObjectMetadata{}
		enforce.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicy"))
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: "buildlock-enforce"}, enforce)).
			To(WithTransform(apierrors.IsNotFound, BeTrue()), "enforcement is off")
		g.Expect(keepAlive()).To(Equal(before), "enforcement off keeps it")
		h.run(t, append([]string{"upgrade", release, "charts/buildlock", "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig}, values...)...)
		g.Expect(keepAlive()).To(Equal(before), "enforcement on again adopts it")
	})

	t.Run("with watchNamespaces the manager's rules on cluster-scoped resources are bound cluster-wide", func(t *testing.T) {
		g := NewWithT(t)
		disc, err := discovery.NewDiscoveryClientForConfig(c.Config)
		g.Expect(err).NotTo(HaveOccurred())
		lists, err := disc.ServerPreferredResources()
		g.Expect(err).NotTo(HaveOccurred())
		namespaced := map[string]bool{} // "group/resource"
		for _, list := range lists {
			gv, err := schema.ParseGroupVersion(list.GroupVersion)
			g.Expect(err).NotTo(HaveOccurred())
			for _, r := range list.APIResources {
				namespaced[gv.Group+"/"+r.Name] = r.Namespaced
			}
		}
		var role rbacv1.ClusterRole
		readYAML(t, "config/rbac/role.yaml", &role)
		var want []string
		for _, r := range role.Rules {
			for _, group := range r.APIGroups {
				for _, resource := range r.Resources {
					if group == "" && resource == "users" { // impersonation's, not served: cluster-wide
						want = append(want, "/users")
						continue
					}
					base, _, _ := strings.Cut(resource, "/") // a subresource has its resource's scope
					scoped, known := namespaced[group+"/"+base]
					g.Expect(known).To(BeTrue(), "the API server serves no %s/%s", group, resource)
					if !scoped {
						want = append(want, group+"/"+resource)
					}
				}
			}
		}
		var got []string
		objs := parseObjects(t, h.template(t, "--set", "watchNamespaces={"+pipelineNS+"}"))
		if len(want) > 0 {
			var cluster rbacv1.ClusterRole
			find(t, objs, "ClusterRole", "buildlock-manager-cluster", &cluster)
			for _, r := range cluster.Rules {
				for _, group := range r.APIGroups {
					for _, resource := range r.Resources {
						got = append(got, group+"/"+resource)
					}
				}
			}
		}
		g.Expect(got).To(ConsistOf(want), "buildlock.clusterScopedManagerRules must pick exactly the cluster-scoped resources of role.yaml")
	})

	t.Run("with watchNamespaces the manager works on RoleBindings alone", func(t *testing.T) {
		g := newG(t)
		values := append(values, "--set", "watchNamespaces={"+pipelineNS+"}")
		h.run(t, slices.Concat([]string{"upgrade", release}, fromRegistry, []string{"--namespace", releaseNS, "--kubeconfig", c.Kubeconfig}, values)...)
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: "buildlock-manager"}, &rbacv1.ClusterRoleBinding{})).
			To(WithTransform(apierrors.IsNotFound, BeTrue()), "no ClusterRoleBinding when namespaces are watched")
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "list", Group: "buildlock.io", Resource: "buildlocks"},
			{Verb: "list", Resource: "pods", Namespace: "team-a"},
			{Verb: "update", Group: "buildlock.io", Resource: "buildlocks", Subresource: "status", Namespace: "team-a"},
		} {
			g.Expect(allowed(ctx, g, asManager, a)).To(BeFalse(), "a namespace-scoped manager must not %s", describe(a))
		}

		scoped := startManager(t, manager, chartArgs(t, h, values...), managerCfg)
		handOff(ctx, g, admin, asPipeline, "production", 42)
		g.Expect(scoped.logs.String()).NotTo(ContainSubstring("forbidden"), "the manager was refused something it needs")
		scoped.stop(t)
	})

	t.Run("helm uninstall leaves nothing cluster-wide but the CRDs", func(t *testing.T) {
		g := NewWithT(t)
		h.run(t, "uninstall", release, "--namespace", releaseNS, "--kubeconfig", c.Kubeconfig, "--wait")
		// The API server registers every CRD's group version; the Lease
		// informer's keep-alive stays on purpose (helm.sh/resource-policy).
		want := []string{"apiregistration.k8s.io/apiservices/v1alpha1.buildlock.io",
			"admissionregistration.k8s.io/validatingadmissionpolicies/buildlock-lease-informer",
			"admissionregistration.k8s.io/validatingadmissionpolicybindings/buildlock-lease-informer"}
		for _, crd := range configCRDs(t) {
			want = append(want, "apiextensions.k8s.io/customresourcedefinitions/"+crd.Name)
		}
		after := clusterScopedObjects(t, c.Config)
		var leftovers []string
		for key := range after {
			if !before[key] {
				leftovers = append(leftovers, key)
			}
		}
		sort.Strings(leftovers)
		g.Expect(leftovers).To(ConsistOf(want), "crds.keep keeps the CRDs, and nothing else stays but the Lease informer's keep-alive")
		var sas corev1.ServiceAccountList
		g.Expect(admin.List(ctx, &sas, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/instance": release})).To(Succeed())
		g.Expect(sas.Items).To(BeEmpty())
	})
}

// asServiceAccount is cfg (an administrator's) impersonating a
// ServiceAccount, with the groups the API server gives a ServiceAccount's
// token (it adds system:authenticated itself).
func asServiceAccount(cfg *rest.Config, namespace, name string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace},
	}
	return c
}

// bindPipeline creates the pipeline's ServiceAccount in pipelineNS, binds
// it there to the buildlock-pipeline ClusterRole (the chart's and
// config/rbac's), and returns a client acting as it.
func bindPipeline(ctx context.Context, g Gomega, c *localcluster.Cluster, admin client.Client) client.Client {
	g.Expect(admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: pipelineSA}})).To(Succeed())
	g.Expect(admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: "pipeline-buildlock"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "buildlock-pipeline"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: pipelineNS, Name: pipelineSA}},
	})).To(Succeed())
	asPipeline, err := client.New(asServiceAccount(c.Config, pipelineNS, pipelineSA), client.Options{Scheme: admin.Scheme()})
	g.Expect(err).NotTo(HaveOccurred())
	return asPipeline
}

// serverDryRun applies manifests with `kubectl apply --dry-run=server`: the
// API server validates and admits every object (schemas, Pod Security)
// without keeping them. A refusal or a warning fails the test.
func serverDryRun(t *testing.T, c *localcluster.Cluster, manifests string) {
	t.Helper()
	cmd := c.Kubectl(t.Context(), "apply", "--dry-run=server", "-f", "-")
	cmd.Stdin = strings.NewReader(manifests)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl apply --dry-run=server refused the manifests: %v\n%s%s", err, stderr.String(), stdout.String())
	}
	if strings.Contains(stderr.String(), "Warning") {
		t.Errorf("kubectl apply --dry-run=server warned:\n%s", stderr.String())
	}
}

// expectRestrictedPod creates, as a dry run, a pod of the manager
// Deployment among objs in releaseNS, which enforces Pod Security
// restricted.
func expectRestrictedPod(t *testing.T, admin client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	var d appsv1.Deployment
	find(t, objs, "Deployment", "buildlock", &d)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: releaseNS, GenerateName: "buildlock-", Labels: d.Spec.Template.Labels},
		Spec:       d.Spec.Template.Spec,
	}
	// The ServiceAccount need not exist: the local control plane admits
	// pods without checking it, and checks their security all the same.
	if err := admin.Create(t.Context(), pod, client.DryRunAll); err != nil {
		t.Fatalf("the manager's pod, in a namespace that enforces restricted: %v", err)
	}
}

// asUser is cfg (an administrator's) impersonating a user.
func asUser(cfg *rest.Config, name string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: name}
	return c
}

// aggregateClusterRoles does what kube-controller-manager's
// clusterrole-aggregation controller does, which a bare control plane does
// not run: it sets the rules of every ClusterRole with an aggregationRule
// (view, edit, admin) to the rules of the ClusterRoles its selectors pick,
// until nothing changes (view is aggregated into edit, edit into admin).
func aggregateClusterRoles(ctx context.Context, g Gomega, c client.Client) {
	for changed := true; changed; {
		changed = false
		var roles rbacv1.ClusterRoleList
		g.Expect(c.List(ctx, &roles)).To(Succeed())
		for i := range roles.Items {
			role := &roles.Items[i]
			if role.AggregationRule == nil {
				continue
			}
			var rules []rbacv1.PolicyRule
			for _, sel := range role.AggregationRule.ClusterRoleSelectors {
				selector, err := metav1.LabelSelectorAsSelector(&sel)
				g.Expect(err).NotTo(HaveOccurred())
				for _, other := range roles.Items {
					if other.Name != role.Name && selector.Matches(labels.Set(other.Labels)) {
						rules = append(rules, other.Rules...)
					}
				}
			}
			if !equality.Semantic.DeepEqual(normalizeRules(rules), normalizeRules(role.Rules)) {
				role.Rules = rules
				g.Expect(c.Update(ctx, role)).To(Succeed())
				changed = true
			}
		}
	}
}

// handOff plays a hand-off on target in pipelineNS: the pipeline's identity
// claims the target for build n of acme/shop@main (shop-main-<n>) and of
// acme/web@main (web-main-<n>), each with a running pod; shop holds with
// some token and web waits; shop's pod succeeds, and web holds with the
// next token.
func handOff(ctx context.Context, g Gomega, admin, asPipeline client.Client, target string, n int64) {
	first, second := fmt.Sprintf("shop-main-%d", n), fmt.Sprintf("web-main-%d", n)
	for _, name := range []string{first, second} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: name},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "pipeline", Image: "pipeline"}}},
		}
		g.Expect(admin.Create(ctx, pod)).To(Succeed())
		pod.Status.Phase = corev1.PodRunning
		g.Expect(admin.Status().Update(ctx, pod)).To(Succeed())
	}
	g.Expect(asPipeline.Create(ctx, claim(first, target, "acme/shop", n))).To(Succeed())
	// The first token of a target's Lease is above its namespace's token
	// floor: 1 in a namespace that has issued none.
	g.Eventually(phaseOf(ctx, admin, first)).Should(HavePrefix("Held token "))
	var token int64
	_, err := fmt.Sscanf(phaseOf(ctx, admin, first)(), "Held token %d", &token)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(asPipeline.Create(ctx, claim(second, target, "acme/web", n))).To(Succeed())
	g.Eventually(phaseOf(ctx, admin, second)).Should(Equal("Waiting"))

	pod := &corev1.Pod{}
	g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: first}, pod)).To(Succeed())
	pod.Status.Phase = corev1.PodSucceeded
	g.Expect(admin.Status().Update(ctx, pod)).To(Succeed())

	g.Eventually(phaseOf(ctx, admin, second)).Should(Equal(held(token+1)), "the waiter takes over with the next token")
	g.Expect(phaseOf(ctx, admin, first)()).To(Equal("Released"))
}

func claim(name, target, repo string, build int64) *buildlockv1.BuildLock {
	return &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: pipelineNS, Name: name},
		Spec: buildlockv1.BuildLockSpec{
			Target: target, Repo: repo, Branch: "main", Build: build,
			PodRef: &buildlockv1.PodReference{Name: name},
		},
	}
}

func held(token int64) string { return fmt.Sprintf("Held token %d", token) }

// phaseOf returns a poller of a claim's phase, with its token when Held.
func phaseOf(ctx context.Context, c client.Client, name string) func() string {
	return func() string {
		bl := &buildlockv1.BuildLock{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: pipelineNS, Name: name}, bl); err != nil {
			return err.Error()
		}
		if bl.Status.Phase == buildlockv1.PhaseHeld {
			return held(bl.Status.FencingToken)
		}
		return string(bl.Status.Phase)
	}
}

// allowed asks the API server whether c's identity may do a.
func allowed(ctx context.Context, g Gomega, c client.Client, a authorizationv1.ResourceAttributes) bool {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
	g.Expect(c.Create(ctx, review)).To(Succeed())
	return review.Status.Allowed
}

func describe(a authorizationv1.ResourceAttributes) string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	where := "in every namespace"
	if a.Namespace != "" {
		where = "in " + a.Namespace
	}
	return fmt.Sprintf("%s %s %s", a.Verb, r, where)
}

func get(g Gomega, url string) string {
	resp, err := http.Get(url)
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
	return string(body)
}

// allocatedByAPIServer are cluster-scoped resources that the API server
// fills itself, at its own pace after it starts (the IP address of the
// kubernetes Service, for one); no chart creates them.
var allocatedByAPIServer = map[string]bool{"networking.k8s.io/ipaddresses": true, "networking.k8s.io/servicecidrs": true}

// clusterScopedObjects lists every cluster-scoped object the API server
// serves, as "group/resource/name".
func clusterScopedObjects(t *testing.T, cfg *rest.Config) map[string]bool {
	t.Helper()
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disc.ServerPreferredResources()
	if err != nil {
		t.Fatalf("discovering resources: %v", err)
	}
	objects := map[string]bool{}
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			if r.Namespaced || strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") || r.Name == "componentstatuses" ||
				allocatedByAPIServer[gv.Group+"/"+r.Name] {
				continue
			}
			items, err := dyn.Resource(gv.WithResource(r.Name)).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, item := range items.Items {
				objects[gv.Group+"/"+r.Name+"/"+item.GetName()] = true
			}
		}
	}
	return objects
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
