package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/buildlock/buildlock/internal/controller"
	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// TestValuesSchemaRejectsMistakes proves that values.schema.json turns the
// mistakes people make into errors of `helm lint --strict` and `helm
// template` (so of `helm install` and `helm upgrade`), instead of a chart
// that renders something else than was meant, or a manager that refuses to
// start.
func TestValuesSchemaRejectsMistakes(t *testing.T) {
	h := requireHelm(t)
	for name, tc := range map[string]struct {
		set  []string
		want string // in helm's error
	}{
		"a misspelled top-level value":         {[]string{"--set", "replicas=3"}, "replicas"},
		"a misspelled nested value":            {[]string{"--set", "serviceMonitor.enable=true"}, "enable"},
		"a value of the wrong type":            {[]string{"--set-string", "replicaCount=two"}, "replicaCount"},
		"a duration the manager refuses":       {[]string{"--set", "finishedTTL=1d"}, "finishedTTL"},
		"a grant retention without a unit":     {[]string{"--set", "grantRetention=24"}, "grantRetention"},
		"an alert threshold in days":           {[]string{"--set", "prometheusRule.lockHeldLongerThan=1d"}, "lockHeldLongerThan"},
		"an alert threshold with a fraction":   {[]string{"--set", "prometheusRule.buildWaitingLongerThan=1.5h"}, "buildWaitingLongerThan"},
		"a metrics reader without a kind":      {[]string{"--set", "metrics.readers[0].name=prometheus"}, "kind"},
		"a negative duration":                  {[]string{"--set", "maxHold=-1h"}, "maxHold"},
		"a scrape interval Prometheus refuses": {[]string{"--set", "serviceMonitor.interval=30 s"}, "interval"},
		"a log level zap refuses":              {[]string{"--set", "logLevel=verbose"}, "logLevel"},
		"a port out of range":                  {[]string{"--set", "healthPort=70000"}, "healthPort"},
		"a namespace that is no DNS label":     {[]string{"--set", "watchNamespaces={Team_A}"}, "watchNamespaces"},
		"an extra argument that is no flag":    {[]string{"--set", "extraArgs={debug}"}, "extraArgs"},
		"a PDB that would block every drain":   {[]string{"--set", "podDisruptionBudget.maxUnavailable=0"}, "maxUnavailable"},
		"minAvailable, which can block drains": {[]string{"--set", "podDisruptionBudget.minAvailable=1"}, "minAvailable"},
		"a typo in resources":                  {[]string{"--set", "resources.limit.memory=1Gi"}, "limit"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, cmd := range [][]string{
				{"lint", "--strict", "charts/buildlock"},
				{"template", release, "charts/buildlock"},
			} {
				_, err := h.try(append(cmd, tc.set...)...)
				if err == nil {
					t.Fatalf("helm %s accepted %v", cmd[0], tc.set)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("helm %s refused %v without naming %q:\n%v", cmd[0], tc.set, tc.want, err)
				}
			}
		})
	}

	t.Run("the values people set are accepted", func(t *testing.T) {
		h.run(t, "lint", "--strict", "charts/buildlock",
			"--set", "replicaCount=2", "--set", "finishedTTL=1h30m", "--set", "maxHold=0", "--set", "grantRetention=48h",
			"--set", "logLevel=5", "--set", "image.tag=20260115", "--set", "serviceMonitor.interval=1m",
			"--set", "watchNamespaces={ci,team-a}", "--set", "extraArgs={--zap-encoder=console}",
			"--set", "podDisruptionBudget.enabled=true", "--set", "podDisruptionBudget.maxUnavailable=50%",
			"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.lockHeldLongerThan=90m")
	})
}

// TestValuesDefaultsAreTheManagers holds the chart's defaults for the
// manager's flags to the manager's own (controller.DefaultOptions), so that
// an installation with the chart's values runs as `manager` without flags
// does.
func TestValuesDefaultsAreTheManagers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "buildlock", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		FinishedTTL             string `json:"finishedTTL"`
		MaxHold                 string `json:"maxHold"`
		GrantRetention          string `json:"grantRetention"`
		MaxConcurrentReconciles int    `json:"maxConcurrentReconciles"`
		HealthPort              int    `json:"healthPort"`
		LeaderElection          struct {
			Enabled bool `json:"enabled"`
		} `json:"leaderElection"`
		Metrics struct {
			Port   int  `json:"port"`
			Secure bool `json:"secure"`
		} `json:"metrics"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	d := controller.DefaultOptions()
	duration := func(s string) time.Duration {
		t.Helper()
		parsed, err := time.ParseDuration(s)
		if err != nil {
			t.Errorf("values.yaml: %v", err)
		}
		return parsed
	}
	for _, c := range []struct {
		value       string
		chart, want any
	}{
		{"finishedTTL (--finished-ttl)", duration(v.FinishedTTL), d.FinishedTTL},
		{"maxHold (--max-hold)", duration(v.MaxHold), d.MaxHold},
		{"grantRetention (--grant-retention)", duration(v.GrantRetention), d.GrantRetention},
		{"maxConcurrentReconciles (--max-concurrent-reconciles)", v.MaxConcurrentReconciles, d.Workers},
		{"leaderElection.enabled (--leader-elect)", v.LeaderElection.Enabled, d.LeaderElection},
		{"metrics.port (--metrics-bind-address)", fmt.Sprintf(":%d", v.Metrics.Port), d.MetricsBindAddress},
		{"metrics.secure (--metrics-secure)", v.Metrics.Secure, d.SecureMetrics},
		{"healthPort (--health-probe-bind-address)", fmt.Sprintf(":%d", v.HealthPort), d.HealthProbeBindAddress},
	} {
		if c.chart != c.want {
			t.Errorf("values.yaml's %s is %v; the manager's default is %v", c.value, c.chart, c.want)
		}
	}
}

// TestImageTagRenderedAsString: `--set image.tag=20260115` gives helm an
// integer, which the image reference must show as the digits, not as Go's
// %!s(int64=20260115).
func TestImageTagRenderedAsString(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	objs := parseObjects(t, h.template(t, "--set", "image.tag=20260115"))
	var d appsv1.Deployment
	find(t, objs, "Deployment", "buildlock", &d)
	g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal("ghcr.io/buildlock/buildlock:20260115"))
	g.Expect(d.Labels).To(HaveKeyWithValue("app.kubernetes.io/version", "20260115"))
}

// TestPodDisruptionBudgetNeverBlocksADrain: whatever the replica count, the
// chart's PodDisruptionBudget lets the eviction API take at least one
// manager pod, so `kubectl drain` never waits forever on buildlock. (One
// replica briefly down is harmless: claims wait, nothing is granted twice.)
func TestPodDisruptionBudgetNeverBlocksADrain(t *testing.T) {
	h := requireHelm(t)
	for _, replicas := range []string{"1", "2", "3"} {
		t.Run(replicas+" replicas", func(t *testing.T) {
			g := NewWithT(t)
			objs := parseObjects(t, h.template(t, "--set", "replicaCount="+replicas, "--set", "podDisruptionBudget.enabled=true"))
			var pdb policyv1.PodDisruptionBudget
			find(t, objs, "PodDisruptionBudget", "buildlock", &pdb)
			var d appsv1.Deployment
			find(t, objs, "Deployment", "buildlock", &d)
			g.Expect(pdb.Spec.Selector.MatchLabels).To(Equal(d.Spec.Selector.MatchLabels))
			g.Expect(allowedDisruptions(t, pdb.Spec, int(*d.Spec.Replicas))).To(BeNumerically(">=", 1),
				"with %s healthy replicas the PDB must allow an eviction: %+v", replicas, pdb.Spec)
		})
	}
}

// allowedDisruptions is what the disruption controller computes for a PDB
// when all of replicas are healthy.
func allowedDisruptions(t *testing.T, spec policyv1.PodDisruptionBudgetSpec, replicas int) int {
	t.Helper()
	switch {
	case spec.MaxUnavailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(spec.MaxUnavailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		return n
	case spec.MinAvailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(spec.MinAvailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		return replicas - n
	}
	t.Fatal("the PDB sets neither maxUnavailable nor minAvailable")
	return 0
}

// valuesSchema is charts/buildlock/values.schema.json, parsed.
type valuesSchema struct {
	Definitions map[string]*schemaNode `json:"definitions"`
	schemaNode
}

type schemaNode struct {
	Ref                  string                 `json:"$ref"`
	Type                 any                    `json:"type"`
	Pattern              string                 `json:"pattern"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Items                *schemaNode            `json:"items"`
	AnyOf                []*schemaNode          `json:"anyOf"`
	Description          string                 `json:"description"`
}

func readSchema(t *testing.T) valuesSchema {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "buildlock", "values.schema.json"))
	if err != nil {
		t.Fatalf("the chart has no values schema: %v", err)
	}
	var s valuesSchema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("parsing values.schema.json: %v", err)
	}
	return s
}

// goDurationPattern returns the schema's pattern for the manager's duration
// flags, compiled.
func goDurationPattern(t *testing.T, s valuesSchema) *regexp.Regexp {
	t.Helper()
	def := s.Definitions["goDuration"]
	if def == nil || def.Pattern == "" {
		t.Fatal("values.schema.json defines no goDuration pattern")
	}
	return regexp.MustCompile(def.Pattern)
}

// durationCorpus holds strings that time.ParseDuration accepts and refuses.
var durationCorpus = []string{
	"0", "0s", "1h", "90m", "1h30m", "1.5h", ".5h", "1.h", "300ms", "10us", "10µs", "10μs", "5ns", "24h0m0s", "1h1h",
	"", "1d", "1w", "-1h", "+1h", "h", "1", "10", "1 h", "1H", "1.5", ".h", "1h-1m", "0.0", "00", "1e3s", "1h ",
}

// acceptsDuration is what the manager accepts: a duration time.ParseDuration
// parses that is not negative (it refuses those) and has no sign.
func acceptsDuration(s string) bool {
	d, err := time.ParseDuration(s)
	return err == nil && d >= 0 && !strings.HasPrefix(s, "+")
}

// TestGoDurationPatternMatchesParseDuration proves that the schema accepts
// exactly the durations the manager accepts.
func TestGoDurationPatternMatchesParseDuration(t *testing.T) {
	re := goDurationPattern(t, readSchema(t))
	for _, s := range durationCorpus {
		if got, want := re.MatchString(s), acceptsDuration(s); got != want {
			t.Errorf("%q: the schema says %v, the manager %v", s, got, want)
		}
	}
}

// FuzzGoDurationPattern searches for a string the schema and the manager
// disagree on.
func FuzzGoDurationPattern(f *testing.F) {
	for _, s := range durationCorpus {
		f.Add(s)
	}
	var re *regexp.Regexp
	f.Fuzz(func(t *testing.T, s string) {
		if re == nil {
			re = goDurationPattern(t, readSchema(t))
		}
		if got, want := re.MatchString(s), acceptsDuration(s); got != want {
			t.Errorf("%q: the schema says %v, the manager %v", s, got, want)
		}
	})
}

// TestValuesSchemaCoversEveryValue walks values.yaml and the schema
// together: every value is described by the schema, every object of the
// chart's own closes itself to unknown keys (Kubernetes objects passed
// through, such as affinity, are left to the API server's validation), and
// every value whose default is a duration is validated as one.
func TestValuesSchemaCoversEveryValue(t *testing.T) {
	s := readSchema(t)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "buildlock", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, v any, n *schemaNode)
	walk = func(path string, v any, n *schemaNode) {
		if n.Ref != "" {
			name := strings.TrimPrefix(n.Ref, "#/definitions/")
			if s.Definitions[name] == nil {
				t.Errorf("%s: $ref %s names no definition", path, n.Ref)
				return
			}
			if str, ok := v.(string); ok && acceptsDuration(str) && !strings.HasSuffix(name, "Duration") {
				t.Errorf("%s: the default %q is a duration, but the schema validates it as %s", path, str, name)
			}
			return
		}
		switch v := v.(type) {
		case map[string]any:
			if n.Properties == nil {
				if n.AdditionalProperties == nil {
					t.Errorf("%s: an object the schema neither describes nor constrains", path)
				}
				return
			}
			if n.AdditionalProperties != false {
				t.Errorf("%s: the schema must refuse unknown keys (additionalProperties: false)", path)
			}
			for k, child := range v {
				p := strings.TrimPrefix(path+"."+k, ".")
				if n.Properties[k] == nil {
					t.Errorf("%s: in values.yaml but not in the schema", p)
					continue
				}
				walk(p, child, n.Properties[k])
			}
		case string:
			if acceptsDuration(v) && v != "" {
				t.Errorf("%s: the default %q is a duration; validate it with the goDuration, promDuration or hmsDuration definition", path, v)
			}
		}
		if n.Type == nil && n.AnyOf == nil {
			t.Errorf("%s: the schema gives no type", path)
		}
		if n.Description == "" {
			t.Errorf("%s: the schema gives no description", path)
		}
	}
	walk("", values, &s.schemaNode)
}
