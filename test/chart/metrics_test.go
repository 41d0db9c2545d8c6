package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// strictly converts a rendered object into out, refusing fields out does not
// know: a misspelled field of a ServiceMonitor or PrometheusRule would be
// dropped by the API server's pruning, silently.
func strictly(t *testing.T, o *unstructured.Unstructured, out any) {
	t.Helper()
	data, err := yaml.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

// managerArgs returns the rendered manager's arguments.
func managerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var d appsv1.Deployment
	find(t, objs, "Deployment", "buildlock", &d)
	return d.Spec.Template.Spec.Containers[0].Args
}

// TestRenderedMetrics checks the metrics endpoint's values: secure by
// default (HTTPS, with the RBAC the manager needs to review tokens and
// access, and a reader role), plain HTTP only when asked, and nothing at all
// when disabled.
func TestRenderedMetrics(t *testing.T) {
	h := requireHelm(t)
	var authRole, readerRole rbacv1.ClusterRole
	readYAML(t, "config/rbac/metrics_auth_role.yaml", &authRole)
	readYAML(t, "config/rbac/metrics_reader_role.yaml", &readerRole)

	t.Run("secure by default: HTTPS, token and access reviews, a reader role, a ServiceMonitor with a token", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t, "--set", "serviceMonitor.enabled=true",
			"--set", "metrics.readers[0].kind=ServiceAccount", "--set", "metrics.readers[0].name=prometheus",
			"--set", "metrics.readers[0].namespace=monitoring"))
		g.Expect(managerArgs(t, objs)).To(ContainElements("--metrics-bind-address=:8443", "--metrics-secure=true"))

		var auth, reader rbacv1.ClusterRole
		find(t, objs, "ClusterRole", "buildlock-metrics-auth", &auth)
		g.Expect(normalizeRules(auth.Rules)).To(Equal(normalizeRules(authRole.Rules)), "config/rbac/metrics_auth_role.yaml's rules")
		g.Expect(grants(auth.Rules, "authentication.k8s.io", "tokenreviews", "create")).To(BeTrue())
		g.Expect(grants(auth.Rules, "authorization.k8s.io", "subjectaccessreviews", "create")).To(BeTrue())
		var authBinding rbacv1.ClusterRoleBinding
		find(t, objs, "ClusterRoleBinding", "buildlock-metrics-auth", &authBinding)
		g.Expect(authBinding.RoleRef.Name).To(Equal("buildlock-metrics-auth"))
		g.Expect(authBinding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "buildlock", Namespace: releaseNS}}))

		find(t, objs, "ClusterRole", "buildlock-metrics-reader", &reader)
		g.Expect(normalizeRules(reader.Rules)).To(Equal(normalizeRules(readerRole.Rules)), "config/rbac/metrics_reader_role.yaml's rules")
		var readerBinding rbacv1.ClusterRoleBinding
		find(t, objs, "ClusterRoleBinding", "buildlock-metrics-reader", &readerBinding)
		g.Expect(readerBinding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: "monitoring"}}))

		var svc corev1.Service
		find(t, objs, "Service", "buildlock-metrics", &svc)
		g.Expect(svc.Spec.Ports).To(HaveLen(1))
		g.Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(8443))
		g.Expect(svc.Spec.Ports[0].AppProtocol).To(HaveValue(Equal("https")))

		var sm monitoringv1.ServiceMonitor
		strictly(t, findObj(t, objs, "ServiceMonitor", "buildlock"), &sm)
		g.Expect(sm.Spec.Endpoints).To(HaveLen(1))
		ep := sm.Spec.Endpoints[0]
		g.Expect(ep.Port).To(Equal(svc.Spec.Ports[0].Name))
		g.Expect(ep.Scheme).To(HaveValue(BeEquivalentTo("https")))
		g.Expect(ep.BearerTokenFile).To(Equal("/var/run/secrets/kubernetes.io/serviceaccount/token"), //nolint:staticcheck // the way to send Prometheus's own token
			"Prometheus presents its ServiceAccount token, which the manager reviews")
		g.Expect(ep.TLSConfig).NotTo(BeNil())
		g.Expect(ep.HonorLabels).To(BeTrue(), "the per-lock metrics' namespace label must not become exported_namespace")
	})

	t.Run("metrics.secure=false: plain HTTP and no review rights", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t, "--set", "metrics.secure=false", "--set", "serviceMonitor.enabled=true"))
		g.Expect(managerArgs(t, objs)).To(ContainElement("--metrics-secure=false"))
		for _, o := range objs {
			g.Expect(o.GetName()).NotTo(ContainSubstring("metrics-auth"))
			g.Expect(o.GetName()).NotTo(ContainSubstring("metrics-reader"))
		}
		var sm monitoringv1.ServiceMonitor
		strictly(t, findObj(t, objs, "ServiceMonitor", "buildlock"), &sm)
		g.Expect(sm.Spec.Endpoints[0].Scheme).To(HaveValue(BeEquivalentTo("http")))
		g.Expect(sm.Spec.Endpoints[0].BearerTokenFile).To(BeEmpty()) //nolint:staticcheck // checking it is unset
	})

	t.Run("metrics.enabled=false: no endpoint, Service, reviews or test", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t, "--set", "metrics.enabled=false"))
		g.Expect(managerArgs(t, objs)).To(ContainElement("--metrics-bind-address=0"))
		g.Expect(managerArgs(t, objs)).NotTo(ContainElement(HavePrefix("--metrics-secure")))
		g.Expect(kinds(objs)).NotTo(HaveKey("Service"))
		g.Expect(kinds(objs)).NotTo(HaveKey("Pod"), "no helm test without an endpoint to check")
		var d appsv1.Deployment
		find(t, objs, "Deployment", "buildlock", &d)
		for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
			g.Expect(p.Name).NotTo(Equal("metrics"))
		}
		for _, set := range []string{"serviceMonitor.enabled=true", "prometheusRule.enabled=true"} {
			_, err := h.try("template", release, "charts/buildlock", "--set", "metrics.enabled=false", "--set", set)
			g.Expect(err).To(MatchError(ContainSubstring("metrics.enabled")), "%s without metrics", set)
		}
	})

	t.Run("the probes and the ports follow the flags", func(t *testing.T) {
		g := NewWithT(t)
		objs := parseObjects(t, h.template(t, "--set", "metrics.port=9443", "--set", "healthPort=9081"))
		var d appsv1.Deployment
		find(t, objs, "Deployment", "buildlock", &d)
		c := d.Spec.Template.Spec.Containers[0]
		g.Expect(c.Args).To(ContainElements("--metrics-bind-address=:9443", "--health-probe-bind-address=:9081"))
		g.Expect(c.Ports).To(ConsistOf(
			corev1.ContainerPort{Name: "metrics", ContainerPort: 9443, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: "health", ContainerPort: 9081, Protocol: corev1.ProtocolTCP}))
		g.Expect(c.ReadinessProbe.HTTPGet.Port.StrVal).To(Equal("health"))
		g.Expect(c.LivenessProbe.HTTPGet.Port.StrVal).To(Equal("health"))
		_, err := h.try("template", release, "charts/buildlock", "--set", "metrics.port=8081")
		g.Expect(err).To(MatchError(ContainSubstring("must differ")))
	})
}

// TestRenderedHelmTest checks the `helm test` Pod: it runs the chart's
// check script against the metrics Service, with a ServiceAccount that may
// read /metrics when metrics are secure, and meets Pod Security restricted
// on its own (TestChart applies it to a restricted namespace).
func TestRenderedHelmTest(t *testing.T) {
	h := requireHelm(t)
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "buildlock", "files", "tests", "check-metrics.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		set    []string
		url    string
		scheme string
	}{
		"secure":   {nil, "https://buildlock-metrics.buildlock-system.svc:8443/metrics", "https"},
		"insecure": {[]string{"--set", "metrics.secure=false", "--set", "metrics.port=8080"}, "http://buildlock-metrics.buildlock-system.svc:8080/metrics", "http"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			objs := parseObjects(t, h.template(t, tc.set...))
			var pod corev1.Pod
			find(t, objs, "Pod", "buildlock-test", &pod)
			g.Expect(pod.Annotations).To(HaveKeyWithValue("helm.sh/hook", "test"))
			// Deleted whatever the outcome (a failed or timed-out test too),
			// its log printed first when it failed.
			g.Expect(pod.Annotations).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded,hook-failed"))
			g.Expect(pod.Annotations).To(HaveKeyWithValue("helm.sh/hook-output-log-policy", "hook-failed"))
			c := pod.Spec.Containers[0]
			g.Expect(c.Command).To(Equal([]string{"sh", "-c", string(script)}))
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			g.Expect(env).To(HaveKeyWithValue("METRICS_URL", tc.url))
			g.Expect(env).To(HaveKeyWithValue("METRICS_SCHEME", tc.scheme))
			if tc.scheme == "https" {
				var binding rbacv1.ClusterRoleBinding
				find(t, objs, "ClusterRoleBinding", "buildlock-test", &binding)
				g.Expect(binding.RoleRef.Name).To(Equal("buildlock-metrics-reader"))
				g.Expect(binding.Subjects).To(ConsistOf(HaveField("Name", pod.Spec.ServiceAccountName)))
				g.Expect(binding.Annotations).To(HaveKeyWithValue("helm.sh/hook", "test"))
				g.Expect(binding.Annotations).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded,hook-failed"))
				var sa corev1.ServiceAccount
				find(t, objs, "ServiceAccount", "buildlock-test", &sa)
				g.Expect(sa.Annotations).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded,hook-failed"))
			} else {
				g.Expect(pod.Spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()), "no token when none is needed")
			}
		})
	}
}

// TestRenderedPrometheusRule checks the alerts: a valid PrometheusRule whose
// thresholds are the values, with every metric selected by the job of the
// chart's metrics Service; promtool then runs them against input series.
func TestRenderedPrometheusRule(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	objs := parseObjects(t, h.template(t, "--set", "prometheusRule.enabled=true",
		"--set", "prometheusRule.lockHeldLongerThan=1h30m", "--set", "prometheusRule.buildWaitingLongerThan=45m",
		"--set", "prometheusRule.alertLabels.team=platform"))
	var rule monitoringv1.PrometheusRule
	strictly(t, findObj(t, objs, "PrometheusRule", "buildlock"), &rule)
	alerts := map[string]monitoringv1.Rule{}
	for _, group := range rule.Spec.Groups {
		for _, r := range group.Rules {
			alerts[r.Alert] = r
			g.Expect(r.Labels).To(HaveKeyWithValue("team", "platform"))
			g.Expect(r.Labels).To(HaveKey("severity"))
			g.Expect(r.Annotations).To(HaveKey("summary"))
			g.Expect(r.Annotations).To(HaveKey("description"))
			for _, sel := range metricSelectors(exprOf(r)) {
				g.Expect(sel).To(ContainSubstring(`job="buildlock-metrics"`), "%s: every selector names the job", r.Alert)
			}
		}
	}
	g.Expect(alerts).To(HaveKey("BuildLockHeldTooLong"))
	g.Expect(exprOf(alerts["BuildLockHeldTooLong"])).To(HaveSuffix("> 5400"), "1h30m")
	g.Expect(exprOf(alerts["BuildLockWaitingTooLong"])).To(HaveSuffix("> 2700"), "45m")
	g.Expect(alerts).To(HaveKey("BuildLockGrantWritesFailing"))
	g.Expect(alerts).To(HaveKey("BuildLockFenceFrozen"))
	g.Expect(alerts).To(HaveKey("BuildLockOperatorDown"))

	t.Run("thresholds are the values, in seconds", func(t *testing.T) {
		for threshold, seconds := range map[string]string{"2h": "7200", "90m": "5400", "1h30m15s": "5415", "45s": "45", "100h": "360000"} {
			objs := parseObjects(t, h.template(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.lockHeldLongerThan="+threshold))
			var rule monitoringv1.PrometheusRule
			strictly(t, findObj(t, objs, "PrometheusRule", "buildlock"), &rule)
			NewWithT(t).Expect(exprOf(rule.Spec.Groups[0].Rules[0])).To(HaveSuffix("> "+seconds), threshold)
		}
	})

	t.Run("without leader election there is no leader to miss", func(t *testing.T) {
		objs := parseObjects(t, h.template(t, "--set", "prometheusRule.enabled=true", "--set", "leaderElection.enabled=false"))
		var rule monitoringv1.PrometheusRule
		strictly(t, findObj(t, objs, "PrometheusRule", "buildlock"), &rule)
		for _, r := range rule.Spec.Groups[0].Rules {
			NewWithT(t).Expect(r.Alert).NotTo(Equal("BuildLockNoLeader"))
		}
	})

	t.Run("promtool: each alert fires when it should, and only then", func(t *testing.T) {
		promtool := os.Getenv("PROMTOOL")
		if promtool == "" {
			t.Skip("PROMTOOL is not set: run `make test` (or set PROMTOOL to a promtool binary) to test the alerts")
		}
		dir := t.TempDir()
		// The defaults, as testdata/alerts_test.yaml expects them.
		objs := parseObjects(t, h.template(t, "--set", "prometheusRule.enabled=true"))
		spec, _, _ := unstructured.NestedMap(findObj(t, objs, "PrometheusRule", "buildlock").Object, "spec")
		rules, err := yaml.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		tests, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "chart", "testdata", "alerts_test.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"rules.yaml": rules, "alerts_test.yaml": tests} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool test rules: %v\n%s", err, out)
		}
	})
}

var selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)

// metricSelectors returns the metric selectors of a PromQL expression
// written as the chart writes them, name{matchers}.
func metricSelectors(expr string) []string {
	return selectorRE.FindAllString(expr, -1)
}

// alertMetrics returns the metric names the rendered alerts select, without
// Prometheus's own `up`.
func alertMetrics(t *testing.T, h *helmRunner) []string {
	t.Helper()
	var rule monitoringv1.PrometheusRule
	strictly(t, findObj(t, parseObjects(t, h.template(t, "--set", "prometheusRule.enabled=true")), "PrometheusRule", "buildlock"), &rule)
	var names []string
	for _, group := range rule.Spec.Groups {
		for _, r := range group.Rules {
			for _, m := range selectorRE.FindAllStringSubmatch(exprOf(r), -1) {
				if m[1] != "up" && !slices.Contains(names, m[1]) {
					names = append(names, m[1])
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// exposedMetrics returns the metric families of a Prometheus text
// exposition.
func exposedMetrics(body string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names[strings.Fields(rest)[0]] = true
		}
	}
	return names
}

func exprOf(r monitoringv1.Rule) string { return r.Expr.String() }
