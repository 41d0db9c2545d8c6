package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// normalizeRules sorts each rule's lists and the rules themselves, so that
// two rule sets compare equal when they grant the same verbs on the same
// resources however they are written.
func normalizeRules(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 0, len(rules))
	for _, r := range rules {
		r = *r.DeepCopy()
		for _, l := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
			slices.Sort(l)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b rbacv1.PolicyRule) int {
		return strings.Compare(ruleKey(a), ruleKey(b))
	})
	return out
}

func ruleKey(r rbacv1.PolicyRule) string {
	return strings.Join([]string{
		strings.Join(r.APIGroups, ","), strings.Join(r.Resources, ","), strings.Join(r.ResourceNames, ","),
		strings.Join(r.NonResourceURLs, ","), strings.Join(r.Verbs, ","),
	}, "|")
}

// TestRenderedRBACMatchesConfig proves that the chart grants the manager
// exactly the rules generated from the reconciler's RBAC markers
// (config/rbac/role.yaml), and pipelines exactly config/rbac/pipeline_role.yaml's,
// in every namespace mode. `make verify-chart` runs it.
func TestRenderedRBACMatchesConfig(t *testing.T) {
	h := requireHelm(t)
	var generated, pipeline, view rbacv1.ClusterRole
	readYAML(t, "config/rbac/role.yaml", &generated)
	readYAML(t, "config/rbac/pipeline_role.yaml", &pipeline)
	readYAML(t, "config/rbac/view_role.yaml", &view)

	for name, values := range map[string][]string{
		"all namespaces":       nil,
		"watched namespaces":   {"--set", "watchNamespaces={ci,team-a}"},
		"another release name": {"--set", "fullnameOverride=lock-operator"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			objs := parseObjects(t, h.template(t, values...))
			fullname := "buildlock"
			if slices.Contains(values, "fullnameOverride=lock-operator") {
				fullname = "lock-operator"
			}

			var manager, pipe rbacv1.ClusterRole
			find(t, objs, "ClusterRole", fullname+"-manager", &manager)
			g.Expect(normalizeRules(manager.Rules)).To(Equal(normalizeRules(generated.Rules)),
				"the chart's manager ClusterRole must grant exactly config/rbac/role.yaml's rules; run `make chart-sync`")
			find(t, objs, "ClusterRole", fullname+"-pipeline", &pipe)
			g.Expect(normalizeRules(pipe.Rules)).To(Equal(normalizeRules(pipeline.Rules)),
				"the chart's pipeline ClusterRole must grant exactly config/rbac/pipeline_role.yaml's rules; run `make chart-sync`")
			for _, r := range pipe.Rules {
				g.Expect(r.Resources).NotTo(ContainElement(HaveSuffix("/status")), "pipelines must not write verdicts")
			}
			var election, electionWant rbacv1.Role
			readYAML(t, "config/rbac/leader_election_role.yaml", &electionWant)
			find(t, objs, "Role", fullname+"-leader-election", &election)
			g.Expect(normalizeRules(election.Rules)).To(Equal(normalizeRules(electionWant.Rules)),
				"the chart's leader-election Role must grant exactly config/rbac/leader_election_role.yaml's rules")
			var viewer rbacv1.ClusterRole
			find(t, objs, "ClusterRole", fullname+"-view", &viewer)
			g.Expect(normalizeRules(viewer.Rules)).To(Equal(normalizeRules(view.Rules)),
				"the chart's view ClusterRole must grant exactly config/rbac/view_role.yaml's rules; run `make chart-sync`")
		})
	}
}

// TestRenderedChartCRDsMatchConfig proves that the chart's copies of the
// CRDs are config/crd/bases' (byte for byte, as `make chart-sync` copies
// them), that the chart renders them as templates (so that `helm upgrade`
// updates them) with the same spec, kept on uninstall unless crds.keep is
// false, and not at all with crds.install false.
func TestRenderedChartCRDsMatchConfig(t *testing.T) {
	root := repoRoot(t)
	want := configCRDs(t)
	got, _ := filepath.Glob(filepath.Join(root, "charts", "buildlock", "files", "crds", "*.yaml"))
	if len(got) != len(want) {
		t.Fatalf("charts/buildlock/files/crds has %d files, config/crd/bases %d; run `make chart-sync`", len(got), len(want))
	}
	bases, _ := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	for _, w := range bases {
		a, _ := os.ReadFile(w)
		b, err := os.ReadFile(filepath.Join(root, "charts", "buildlock", "files", "crds", filepath.Base(w)))
		if err != nil || string(a) != string(b) {
			t.Errorf("charts/buildlock/files/crds/%s differs from config/crd/bases; run `make chart-sync`", filepath.Base(w))
		}
	}
	if _, err := os.Stat(filepath.Join(root, "charts", "buildlock", "crds")); err == nil {
		t.Error("charts/buildlock/crds exists: Helm installs CRDs from there once and never upgrades them")
	}

	h := requireHelm(t)
	for name, tc := range map[string]struct {
		set  []string
		keep bool
	}{
		"by default, kept on uninstall": {nil, true},
		"with crds.keep=false":          {[]string{"--set", "crds.keep=false"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			objs := parseObjects(t, h.template(t, tc.set...))
			for _, w := range want {
				var crd apiextensionsv1.CustomResourceDefinition
				find(t, objs, "CustomResourceDefinition", w.Name, &crd)
				g.Expect(crd.Spec).To(Equal(w.Spec), "%s: the rendered spec must be config/crd/bases'", w.Name)
				if tc.keep {
					g.Expect(crd.Annotations).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
				} else {
					g.Expect(crd.Annotations).NotTo(HaveKey("helm.sh/resource-policy"))
				}
				for k, v := range w.Annotations {
					g.Expect(crd.Annotations).To(HaveKeyWithValue(k, v))
				}
			}
			g.Expect(kinds(objs)).To(HaveKeyWithValue("CustomResourceDefinition", len(want)))
		})
	}
	t.Run("crds.install=false renders none", func(t *testing.T) {
		NewWithT(t).Expect(kinds(parseObjects(t, h.template(t, "--set", "crds.install=false")))).
			NotTo(HaveKey("CustomResourceDefinition"))
	})
}

// TestRenderedChartValues checks what each value is for, on the rendered
// manifests.
func TestRenderedChartValues(t *testing.T) {
	h := requireHelm(t)

	t.Run("defaults: one leader-elected replica, restricted security context, probes, cluster-wide binding", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t))
		g.Expect(kinds(objs)).To(Equal(map[string]int{
			// manager, pipeline, view, metrics-auth, metrics-reader
			"ClusterRole": 5,
			// manager, metrics-auth; and the helm test's binding to metrics-reader
			"ClusterRoleBinding": 3,
			// the manager's; and the helm test's
			"ServiceAccount": 2, "Pod": 1,
			"Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1, "CustomResourceDefinition": 2,
			// config/identity (requester, force-release, override; claim
			// identity, consent, force-release, freezes, grant-leases,
			// override, text) and the bindings guard, each with its binding
			"MutatingAdmissionPolicy": 3, "MutatingAdmissionPolicyBinding": 3,
			"ValidatingAdmissionPolicy": 8, "ValidatingAdmissionPolicyBinding": 8,
		}))
		var d appsv1.Deployment
		find(t, objs, "Deployment", "buildlock", &d)
		g.Expect(d.Spec.Replicas).To(Equal(ptr.To[int32](1)))
		pod := d.Spec.Template.Spec
		g.Expect(pod.ServiceAccountName).To(Equal("buildlock"))
		g.Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		g.Expect(c.Args).To(ContainElements("--leader-elect=true", "--metrics-bind-address=:8443", "--health-probe-bind-address=:8081"))
		g.Expect(c.Args).NotTo(ContainElement(HavePrefix("--namespaces")))
		g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		g.Expect(c.Ports).To(ContainElement(corev1.ContainerPort{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP}))
		g.Expect(c.Resources.Requests).NotTo(BeEmpty())
		g.Expect(c.Resources.Limits).NotTo(BeEmpty())

		sc := c.SecurityContext
		g.Expect(sc.RunAsNonRoot).To(Equal(ptr.To(true)))
		g.Expect(sc.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
		g.Expect(sc.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
		g.Expect(sc.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		g.Expect(sc.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		g.Expect(pod.SecurityContext.RunAsUser).To(Equal(ptr.To[int64](65532)), "the image's USER")

		var crb rbacv1.ClusterRoleBinding
		find(t, objs, "ClusterRoleBinding", "buildlock-manager", &crb)
		g.Expect(crb.RoleRef.Name).To(Equal("buildlock-manager"))
		g.Expect(crb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "buildlock", Namespace: releaseNS}}))

		var svc corev1.Service
		find(t, objs, "Service", "buildlock-metrics", &svc)
		g.Expect(svc.Spec.Selector).To(Equal(d.Spec.Selector.MatchLabels))
		g.Expect(d.Spec.Template.Labels).To(HaveKeyWithValue("app.kubernetes.io/name", "buildlock"))
	})

	t.Run("watchNamespaces: --namespaces and a RoleBinding per namespace instead of a ClusterRoleBinding", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t, "--set", "watchNamespaces={ci,team-a}"))
		for _, o := range objs {
			if o.GetKind() == "ClusterRoleBinding" {
				roleRef, _, _ := unstructured.NestedStringMap(o.Object, "roleRef")
				g.Expect(roleRef["name"]).NotTo(Equal("buildlock-manager"), "the manager's rules are bound per namespace only")
			}
		}
		var d appsv1.Deployment
		find(t, objs, "Deployment", "buildlock", &d)
		g.Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--namespaces=ci,team-a"))
		var namespaces []string
		for _, o := range objs {
			if o.GetKind() == "RoleBinding" && o.GetName() == "buildlock-manager" {
				namespaces = append(namespaces, o.GetNamespace())
				roleRef, _, _ := unstructured.NestedStringMap(o.Object, "roleRef")
				g.Expect(roleRef).To(HaveKeyWithValue("name", "buildlock-manager"))
			}
		}
		g.Expect(namespaces).To(ConsistOf("ci", "team-a"))
	})

	t.Run("image, replicas, scheduling, extra args, PDB and ServiceMonitor values", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t,
			"--set", "image.repository=registry.example/buildlock", "--set", "image.tag=v9.9.9", "--set", "image.pullPolicy=Always",
			"--set", "replicaCount=2", "--set", "podDisruptionBudget.enabled=true",
			"--set", "nodeSelector.pool=ops", "--set", "tolerations[0].key=ops", "--set", "tolerations[0].operator=Exists",
			"--set", "extraArgs={--zap-encoder=console}", "--set", "finishedTTL=30m", "--set", "maxHold=2h",
			"--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prom",
			"--set", "pipelineRole.aggregateToEdit=false",
		))
		var d appsv1.Deployment
		find(t, objs, "Deployment", "buildlock", &d)
		c := d.Spec.Template.Spec.Containers[0]
		g.Expect(c.Image).To(Equal("registry.example/buildlock:v9.9.9"))
		g.Expect(c.ImagePullPolicy).To(Equal(corev1.PullAlways))
		g.Expect(d.Spec.Replicas).To(Equal(ptr.To[int32](2)))
		g.Expect(d.Spec.Template.Spec.NodeSelector).To(Equal(map[string]string{"pool": "ops"}))
		g.Expect(d.Spec.Template.Spec.Tolerations).To(HaveLen(1))
		g.Expect(c.Args).To(ContainElements("--zap-encoder=console", "--finished-ttl=30m", "--max-hold=2h", "--leader-elect=true"))
		g.Expect(kinds(objs)).To(HaveKeyWithValue("PodDisruptionBudget", 1))

		sm := findObj(t, objs, "ServiceMonitor", "buildlock")
		g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "prom"))
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		var svc corev1.Service
		find(t, objs, "Service", "buildlock-metrics", &svc)
		for k, v := range sel {
			g.Expect(svc.Labels).To(HaveKeyWithValue(k, v), "the ServiceMonitor must select the metrics Service")
		}

		var pipe rbacv1.ClusterRole
		find(t, objs, "ClusterRole", "buildlock-pipeline", &pipe)
		g.Expect(pipe.Labels).NotTo(HaveKey("rbac.authorization.k8s.io/aggregate-to-edit"))
	})

	t.Run("helm lint --strict passes", func(t *testing.T) {
		h.run(t, "lint", "--strict", "charts/buildlock")
	})
}

// TestHelmTemplateWithoutKubeVersion: the helm that `make` builds reports a
// Kubernetes version the chart's kubeVersion accepts (Helm's release builds
// set it with -ldflags; a plain `go install` build reports v1.20), so that
// `helm template` works as people type it.
func TestHelmTemplateWithoutKubeVersion(t *testing.T) {
	h := requireHelm(t)
	if _, err := h.try("template", release, "charts/buildlock"); err != nil {
		t.Fatalf("helm template without --kube-version: %v\n(is $HELM built by `make`, with Helm's -ldflags?)", err)
	}
}

// TestRenderedAggregationToView: whoever holds the built-in view role may
// see the locks (who holds staging, who waits) and their policies, and the
// rules aggregated into view write nothing.
func TestRenderedAggregationToView(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	var aggregated []rbacv1.PolicyRule
	for _, o := range parseObjects(t, h.template(t)) {
		if o.GetKind() == "ClusterRole" && o.GetLabels()["rbac.authorization.k8s.io/aggregate-to-view"] == "true" {
			var r rbacv1.ClusterRole
			find(t, []*unstructured.Unstructured{o}, "ClusterRole", o.GetName(), &r)
			aggregated = append(aggregated, r.Rules...)
		}
	}
	for _, resource := range []string{"buildlocks", "buildlockpolicies"} {
		for _, verb := range []string{"get", "list", "watch"} {
			g.Expect(grants(aggregated, "buildlock.io", resource, verb)).To(BeTrue(), "view must %s %s", verb, resource)
		}
	}
	for _, r := range aggregated {
		g.Expect(r.Verbs).To(HaveEach(BeElementOf("get", "list", "watch")), "view is read-only: %+v", r)
	}
}

// grants reports whether rules allow verb on group/resource.
func grants(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// configPolicies returns the objects of the given directories of config/,
// as the chart must render them.
func configPolicies(t *testing.T, dirs ...string) []map[string]any {
	t.Helper()
	var want []map[string]any
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(repoRoot(t), "config", dir, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no manifests in config/%s: %v", dir, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range parseObjects(t, string(data)) {
				want = append(want, o.Object)
			}
		}
	}
	return want
}

// renderedPolicies renders the chart for a release named buildlock in
// buildlock-system with values, and returns the objects of config/ it
// renders (by their component label: identity, enforcement) and the guard's
// kinds.
func renderedPolicies(t *testing.T, h *helmRunner, values ...string) (identity, enforcement []map[string]any, guard []string) {
	t.Helper()
	for _, o := range parseObjects(t, h.template(t, values...)) {
		switch {
		case strings.HasSuffix(o.GetName(), "-bindings-guard"):
			guard = append(guard, o.GetKind())
		case o.GetLabels()["app.kubernetes.io/component"] == "identity":
			identity = append(identity, o.Object)
		case o.GetLabels()["app.kubernetes.io/component"] == "enforcement":
			enforcement = append(enforcement, o.Object)
		}
	}
	return identity, enforcement, guard
}

// withoutMutating drops the objects that need MutatingAdmissionPolicies.
func withoutMutating(objs []map[string]any) []map[string]any {
	return slices.DeleteFunc(slices.Clone(objs), func(o map[string]any) bool {
		labels, _, _ := unstructured.NestedStringMap(o, "metadata", "labels")
		return labels["buildlock.io/requires"] == "MutatingAdmissionPolicy"
	})
}

// TestRenderedIdentityPolicies (issue 31): the chart's defaults install
// exactly the identity admission policies of config/identity (through its
// copies, which `make verify-chart` compares), naming its own
// ServiceAccount as the operator in buildlock-grant-leases, and no fence;
// on a cluster without MutatingAdmissionPolicies, those that need them are
// left out; identity.enabled=false leaves them all out.
func TestRenderedIdentityPolicies(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	want := configPolicies(t, "identity")

	identity, enforcement, guard := renderedPolicies(t, h)
	g.Expect(identity).To(ConsistOf(want), "the chart's defaults must install config/identity; run `make chart-sync`")
	g.Expect(enforcement).To(BeEmpty(), "fencing is not a default")
	g.Expect(guard).To(ConsistOf("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
		"a guard keeps the operator from binding any other admission policy")
	g.Expect(withoutMutating(identity)).NotTo(HaveLen(len(identity)), "Kubernetes 1.37, helm's default: with the mutating policies")

	for name, values := range map[string][]string{
		"Kubernetes 1.35, rendered without a cluster":      {"--kube-version", "1.35.0"},
		"a cluster that serves no MutatingAdmissionPolicy": {"--kube-version", "1.36.0", "--api-versions", "v1/Namespace"},
	} {
		identity, _, _ := renderedPolicies(t, h, values...)
		g.Expect(identity).To(ConsistOf(withoutMutating(want)), name)
		g.Expect(identity).NotTo(BeEmpty(), name)
	}
	identity, _, _ = renderedPolicies(t, h, "--kube-version", "1.35.0", "--api-versions",
		"admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
	g.Expect(identity).To(ConsistOf(want), "a cluster whose discovery names the kind")

	identity, _, guard = renderedPolicies(t, h, "--set", "identity.enabled=false")
	g.Expect(identity).To(BeEmpty(), "identity.enabled=false")
	g.Expect(guard).NotTo(BeEmpty(), "the guard stays: the operator's rights do")

	var operator []any
	for _, o := range parseObjects(t, h.template(t, "--set", "serviceAccount.name=deployer")) {
		if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "buildlock-grant-leases" {
			operator, _, _ = unstructured.NestedSlice(o.Object, "spec", "variables")
		}
	}
	g.Expect(operator).To(ContainElement(And(HaveKeyWithValue("name", "operator"),
		HaveKeyWithValue("expression", "'system:serviceaccount:buildlock-system:deployer'"))),
		"buildlock-grant-leases names the release's ServiceAccount")
	for _, o := range parseObjects(t, h.template(t, "--set", "serviceAccount.name=deployer")) {
		if o.GetKind() == "ValidatingAdmissionPolicy" && strings.HasSuffix(o.GetName(), "-bindings-guard") {
			conditions, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
			g.Expect(conditions).To(ContainElement(HaveKeyWithValue("expression", ContainSubstring(
				"'system:serviceaccount:buildlock-system:deployer'"))), "the guard applies to the operator's ServiceAccount")
		}
	}
}

// TestRenderedEnforcement: with enforcement.enabled the chart adds exactly
// the objects of config/enforcement and config/lease-informer to the
// identity policies, and none without.
func TestRenderedEnforcement(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	identity, enforcement, _ := renderedPolicies(t, h, "--set", "enforcement.enabled=true")
	g.Expect(enforcement).To(ConsistOf(configPolicies(t, "enforcement", "lease-informer")),
		"the chart's enforcement must be config/enforcement's and config/lease-informer's; run `make chart-sync`")
	g.Expect(identity).To(ConsistOf(configPolicies(t, "identity")), "enforcement builds on the identity policies")
	_, enforcement, _ = renderedPolicies(t, h, "--set", "enforcement.enabled=true", "--kube-version", "1.35.0")
	g.Expect(enforcement).To(ConsistOf(withoutMutating(configPolicies(t, "enforcement", "lease-informer"))),
		"buildlock-claims needs the requester's stamp")
}
