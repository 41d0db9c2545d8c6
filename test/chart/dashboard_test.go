package chart

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/buildlock/buildlock/internal/controller"
)

// grafanaDashboard is as much of a Grafana dashboard as the test reads.
type grafanaDashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// collectorRecorder is a prometheus.Registerer that keeps what is
// registered with it.
type collectorRecorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *collectorRecorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *collectorRecorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

// servedMetrics are the metric families the operator's manager registers:
// controller.NewMetrics's (with the labeled ones that have no series yet),
// and every other one its packages define (metricsInSource: the policy
// controller's fence and freeze metrics, which it registers itself).
func servedMetrics(t *testing.T) []string {
	t.Helper()
	names := registeredMetrics(t)
	for _, n := range metricsInSource(t, filepath.Join(repoRoot(t), "internal", "controller")) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// metricsInSource returns the names of the metrics that the Go files under
// dir (not tests) define: the Name of a prometheus *Opts literal, and the
// first argument of prometheus.NewDesc.
func metricsInSource(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	add := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if v, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(v, "buildlock_") {
				names = append(names, v)
			}
		}
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Name" {
					add(n.Value)
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					add(n.Args[0])
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// registeredMetrics are the metric families controller.NewMetrics
// registers, with the labeled ones that have no series yet.
func registeredMetrics(t *testing.T) []string {
	t.Helper()
	rec := &collectorRecorder{}
	controller.NewMetrics(rec)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("controller.NewMetrics registered no metric")
	}
	return names
}

// TestGrafanaDashboard: off by default; enabled, a ConfigMap with the
// sidecar's label holding the dashboard; every query is valid PromQL
// (promtool) and selects only metrics the operator serves, by the job of the
// chart's metrics Service.
func TestGrafanaDashboard(t *testing.T) {
	h := requireHelm(t)
	g := NewWithT(t)
	g.Expect(kinds(parseObjects(t, h.template(t)))).NotTo(HaveKey("ConfigMap"), "off by default")

	objs := parseObjects(t, h.template(t, "--set", "grafanaDashboard.enabled=true",
		"--set", "grafanaDashboard.namespace=monitoring", "--set", "grafanaDashboard.annotations.grafana_folder=CI"))
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", "buildlock-dashboard", &cm)
	g.Expect(cm.Namespace).To(Equal("monitoring"))
	g.Expect(cm.Labels).To(HaveKeyWithValue("grafana_dashboard", "1"), "kube-prometheus-stack's sidecar loads ConfigMaps with this label")
	g.Expect(cm.Annotations).To(HaveKeyWithValue("grafana_folder", "CI"))
	file, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "buildlock", "files", "grafana", "buildlock.json"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.Data).To(HaveKeyWithValue("buildlock.json", strings.TrimSuffix(string(file), "\n")))

	var d grafanaDashboard
	g.Expect(json.Unmarshal([]byte(cm.Data["buildlock.json"]), &d)).To(Succeed())
	g.Expect(d.UID).To(Equal("buildlock"), "a fixed uid, so that links to the dashboard survive reinstalls")
	served := servedMetrics(t)
	var exprs []string
	for _, p := range d.Panels {
		g.Expect(p.Targets).NotTo(BeEmpty(), "panel %q queries nothing", p.Title)
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
			sels := metricSelectors(target.Expr)
			g.Expect(sels).NotTo(BeEmpty(), "panel %q: %s", p.Title, target.Expr)
			for _, sel := range sels {
				g.Expect(sel).To(ContainSubstring(`job="$job"`), "panel %q: every selector names the job", p.Title)
				metric := selectorRE.FindStringSubmatch(sel)[1]
				family := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(metric, "")
				g.Expect(served).To(ContainElement(family), "panel %q queries %s, which the operator does not serve", p.Title, metric)
			}
		}
	}
	g.Expect(exprs).To(HaveLen(len(slices.Compact(slices.Sorted(slices.Values(exprs))))), "no query twice")

	// Every metric the operator serves is one a person acts on (a frozen
	// target, an override, a rollback, a fence that does not hold, a grant
	// record someone edits, ...): each has a panel.
	queried := map[string]bool{}
	for _, e := range exprs {
		for _, sel := range metricSelectors(e) {
			queried[regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(selectorRE.FindStringSubmatch(sel)[1], "")] = true
		}
	}
	for _, name := range served {
		g.Expect(queried).To(HaveKey(name), "the operator serves %s, which no panel shows", name)
	}

	t.Run("promtool: every query is valid PromQL", func(t *testing.T) {
		promtool := os.Getenv("PROMTOOL")
		if promtool == "" {
			t.Skip("PROMTOOL is not set: run `make test` (or set PROMTOOL) to check the queries")
		}
		// Grafana's variables, as Grafana substitutes them.
		vars := strings.NewReplacer("$__rate_interval", "5m", "$job", "buildlock-metrics", "$namespace", ".*")
		var rules []map[string]string
		for i, e := range exprs {
			rules = append(rules, map[string]string{"record": "buildlock:dashboard_query_" + string(rune('a'+i)), "expr": vars.Replace(e)})
		}
		data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "queries.yaml")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
	})

	_, err = h.try("template", release, "charts/buildlock", "--set", "grafanaDashboard.enabled=true", "--set", "metrics.enabled=false")
	g.Expect(err).To(MatchError(ContainSubstring("metrics.enabled")), "a dashboard without metrics")
}
