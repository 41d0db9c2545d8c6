package examples

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The GitLab CI emulation reproduces what decides what a pipeline runs:
//
//   - Jobs are the top-level keys that are not keywords; a key starting with
//     "." is a template that `extends` merges in (maps deeply, other values
//     replaced).
//   - Variables (global, then the job's) are expanded by GitLab, not by a
//     shell: $NAME and ${NAME} are replaced by values, which are not
//     expanded again and never executed.
//   - before_script and script run in one shell, which the runner picks by
//     the job's image: bash where the image has it, starting with
//     `set -eo pipefail`; else sh, starting with `set -o errexit` and
//     pipefail where that sh has it (GitLab Runner's shell detection). The
//     plugin's image (ghcr.io/buildlock/kubectl-buildlock, on busybox: see
//     pluginImageBase) has no bash: its jobs run under busybox's sh, with
//     busybox's tools alone on PATH beside the stubs. Any other image is
//     this machine's, with bash. after_script runs in a new shell whatever
//     happened, and its result does not count.
//   - Each entry of a job's id_tokens is a variable holding an ID token
//     (a JWT) whose aud is the entry's, minted for the job.
//   - A job runs when the jobs it needs (or, without needs, every job of the
//     earlier stages) passed or failed with allow_failure (true, or its exit
//     code among allow_failure.exit_codes): an allowed failure lets later jobs
//     run, which is why a superseded build must fail its job outright. A job
//     with `when: always` runs anyway.

// gitlabKeywords are the top-level keys that are not jobs.
var gitlabKeywords = []string{"stages", "variables", "default", "include", "workflow", "image", "services", "cache", "before_script", "after_script"}

type gitlabJob struct {
	Stage        string         `json:"stage,omitempty"`
	Image        string         `json:"image,omitempty"`
	Environment  any            `json:"environment,omitempty"`
	Variables    map[string]any `json:"variables,omitempty"` // a value, or {value, expand}
	Needs        []string       `json:"needs,omitempty"`
	BeforeScript []string       `json:"before_script,omitempty"`
	Script       []string       `json:"script"`
	AfterScript  []string       `json:"after_script,omitempty"`
	AllowFailure any            `json:"allow_failure,omitempty"`
	When         string         `json:"when,omitempty"`
	IDTokens     map[string]struct {
		Aud any `json:"aud"`
	} `json:"id_tokens,omitempty"`
}

type gitlabPipeline struct {
	stages    []string
	variables map[string]string
	jobs      map[string]gitlabJob
}

// loadGitLab reads a .gitlab-ci.yml and resolves `extends`.
func loadGitLab(t *testing.T, rel string) gitlabPipeline {
	t.Helper()
	var top map[string]any
	readYAML(t, rel, &top)
	top, err := gitlabInclude(t, top)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return gitlabPipelineOf(t, rel, top)
}

// gitlabPipelineOf is the pipeline of a configuration whose includes are
// resolved.
func gitlabPipelineOf(t *testing.T, rel string, top map[string]any) gitlabPipeline {
	t.Helper()
	p := gitlabPipeline{stages: []string{"build", "test", "deploy"}, variables: map[string]string{}, jobs: map[string]gitlabJob{}}
	if s, ok := top["stages"]; ok {
		p.stages = nil
		for _, st := range s.([]any) {
			p.stages = append(p.stages, st.(string))
		}
	}
	if v, ok := top["variables"]; ok {
		for k, val := range v.(map[string]any) {
			p.variables[k] = fmt.Sprint(val)
		}
	}
	for name, def := range top {
		if slices.Contains(gitlabKeywords, name) || strings.HasPrefix(name, ".") {
			continue
		}
		merged := gitlabExtend(t, top, def.(map[string]any), 0)
		delete(merged, "extends")
		data, err := json.Marshal(merged)
		if err != nil {
			t.Fatal(err)
		}
		var job gitlabJob
		if err := yaml.UnmarshalStrict(data, &job); err != nil {
			t.Fatalf("%s: job %s: %v", rel, name, err)
		}
		if job.Stage == "" {
			job.Stage = "test"
		}
		p.jobs[name] = job
	}
	return p
}

// gitlabExtend merges the templates a job extends under the job's own keys.
func gitlabExtend(t *testing.T, top, job map[string]any, depth int) map[string]any {
	t.Helper()
	if depth > 10 {
		t.Fatal("extends nests too deep")
	}
	var parents []string
	switch e := job["extends"].(type) {
	case nil:
		return job
	case string:
		parents = []string{e}
	case []any:
		for _, p := range e {
			parents = append(parents, p.(string))
		}
	}
	merged := map[string]any{}
	for _, name := range parents {
		parent, ok := top[name].(map[string]any)
		if !ok {
			t.Fatalf("extends %q: no such template", name)
		}
		merged = deepMerge(merged, gitlabExtend(t, top, parent, depth+1))
	}
	return deepMerge(merged, job)
}

func deepMerge(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if bm, ok := out[k].(map[string]any); ok {
			if om, ok := v.(map[string]any); ok {
				out[k] = deepMerge(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

var gitlabVarRef = regexp.MustCompile(`\$\$|\$\{(\w+)\}|\$(\w+)`)

// gitlabExpand expands variable references once, as GitLab does in
// `variables:` values; "$$" is a literal "$".
func gitlabExpand(s string, vars map[string]string) string {
	return gitlabVarRef.ReplaceAllStringFunc(s, func(ref string) string {
		if ref == "$$" {
			return "$"
		}
		return vars[strings.Trim(ref, "${}")]
	})
}

// allowed reports whether allow_failure lets a job that exited with code
// fail without stopping the pipeline.
func (j gitlabJob) allowed(code int) bool {
	switch a := j.AllowFailure.(type) {
	case bool:
		return a
	case map[string]any:
		codes, _ := a["exit_codes"].([]any)
		for _, c := range codes {
			if n, ok := c.(float64); ok && int(n) == code {
				return true
			}
		}
	}
	return false
}

// The states of an emulated job.
const (
	jobPassed  = "passed"
	jobFailed  = "failed"
	jobAllowed = "failed (allowed to fail)"
	jobSkipped = "skipped"
)

// gitlabRun records what an emulated pipeline did.
type gitlabRun struct {
	status map[string]string // job -> one of the job states
	output strings.Builder
}

// runGitLab runs every job in stage order with the predefined variables
// predefined (CI_*), in a checkout holding the stub ./deploy.sh.
func runGitLab(t *testing.T, s *stubs, p gitlabPipeline, predefined map[string]string, env []string) *gitlabRun {
	t.Helper()
	checkout := t.TempDir()
	s.deployScript(t, checkout)
	var order []string
	for name := range p.jobs {
		order = append(order, name)
	}
	stageIndex := func(job string) int {
		i := slices.Index(p.stages, p.jobs[job].Stage)
		if i < 0 {
			t.Fatalf("job %s: stage %q is not in stages %v", job, p.jobs[job].Stage, p.stages)
		}
		return i
	}
	sort.SliceStable(order, func(a, b int) bool {
		if sa, sb := stageIndex(order[a]), stageIndex(order[b]); sa != sb {
			return sa < sb
		}
		return order[a] < order[b]
	})

	run := &gitlabRun{status: map[string]string{}}
	ok := func(job string) bool { st := run.status[job]; return st == jobPassed || st == jobAllowed }
	// A job's turn comes when every job it waits for has an outcome.
	waitsFor := func(name string) []string {
		if needs := p.jobs[name].Needs; needs != nil {
			for _, n := range needs {
				if _, known := p.jobs[n]; !known {
					t.Fatalf("job %s needs %s, which does not exist", name, n)
				}
			}
			return needs
		}
		var earlier []string
		for _, other := range order {
			if stageIndex(other) < stageIndex(name) {
				earlier = append(earlier, other)
			}
		}
		return earlier
	}
	for len(run.status) < len(order) {
		progress := false
		for _, name := range order {
			if _, done := run.status[name]; done {
				continue
			}
			ready, decided := true, true
			for _, w := range waitsFor(name) {
				_, has := run.status[w]
				decided = decided && has
				ready = ready && ok(w)
			}
			if !decided {
				continue
			}
			progress = true
			if job := p.jobs[name]; ready || job.When == "always" {
				run.status[name] = runGitLabJob(t, s, p, name, predefined, env, checkout, &run.output)
			} else {
				run.status[name] = jobSkipped
			}
		}
		if !progress {
			t.Fatalf("the jobs' needs form a cycle: %v", order)
		}
	}
	return run
}

// runGitLabJob runs one job's scripts and returns its state.
func runGitLabJob(t *testing.T, s *stubs, p gitlabPipeline, name string, predefined map[string]string, env []string, checkout string, output *strings.Builder) string {
	t.Helper()
	job := p.jobs[name]
	vars := map[string]string{}
	for k, v := range predefined {
		vars[k] = v
	}
	vars["CI_JOB_NAME"] = name
	for k, v := range p.variables {
		vars[k] = gitlabExpand(v, vars)
	}
	for k, v := range job.Variables {
		vars[k] = gitlabVariable(t, v, vars)
	}
	for k, id := range job.IDTokens {
		vars[k] = fakeIDToken(t, map[string]any{"iss": "https://gitlab.com", "aud": id.Aud, "project_path": vars["CI_PROJECT_PATH"], "job_id": "9001"})
	}
	jobEnv := append([]string{}, env...)
	for k, v := range vars {
		jobEnv = append(jobEnv, k+"="+v)
	}
	shell, prelude := []string{"bash", "--noprofile", "--norc"}, "set -eo pipefail\n"
	if strings.HasPrefix(job.Image, pluginImage+":") {
		busybox := busyboxImage(t)
		shell, prelude = []string{filepath.Join(busybox, "sh")}, "if set -o | grep pipefail > /dev/null; then set -o pipefail; fi\nset -o errexit\n"
		jobEnv = append(jobEnv, "PATH="+s.bin+":"+busybox)
	}
	script := prelude + strings.Join(append(append([]string{}, job.BeforeScript...), job.Script...), "\n") + "\n"
	code, out := runScript(t, shell, script, nil, checkout, s.env(jobEnv...))
	fmt.Fprintf(output, "[%s] exit %d\n%s", name, code, out)
	state := jobFailed
	switch {
	case code == 0:
		state = jobPassed
	case job.allowed(code):
		state = jobAllowed
	}
	if len(job.AfterScript) > 0 {
		code, out := runScript(t, shell, strings.Join(job.AfterScript, "\n")+"\n", nil, checkout, s.env(jobEnv...))
		fmt.Fprintf(output, "[%s after_script] exit %d\n%s", name, code, out)
	}
	return state
}

// gitlabPredefined are the variables GitLab sets for a pipeline of build
// 42 of acme/shop on main.
func gitlabPredefined() map[string]string {
	return map[string]string{
		"GITLAB_CI":            "true",
		"CI":                   "true",
		"CI_PROJECT_PATH":      "acme/shop",
		"CI_PROJECT_PATH_SLUG": "acme-shop",
		"CI_COMMIT_REF_NAME":   "main",
		"CI_COMMIT_REF_SLUG":   "main",
		"CI_COMMIT_BRANCH":     "main",
		"CI_PIPELINE_IID":      "42",
		"CI_COMMIT_TITLE":      "Fix the checkout",
		"CI_COMMIT_MESSAGE":    "Fix the checkout\n\nThe cart lost items.",
	}
}

// gitlabExample loads the example pipeline.
func gitlabExample(t *testing.T) gitlabPipeline {
	t.Helper()
	return loadGitLab(t, "examples/gitlab/gitlab-ci.yml")
}

// pluginImage is the plugin's release image, the component's default.
const pluginImage = "ghcr.io/buildlock/kubectl-buildlock"

// pluginImageBase is the base of the plugin's image as the release builds
// it: hack/images/plugin-base.Dockerfile's FROM where that file exists (the
// ko build), else release.yml's PLUGIN_BASE.
func pluginImageBase(t *testing.T) string {
	t.Helper()
	if data, err := os.ReadFile(repoFile(t, "hack/images/plugin-base.Dockerfile")); err == nil {
		if m := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindSubmatch(data); m != nil {
			return string(m[1])
		}
		t.Fatal("hack/images/plugin-base.Dockerfile has no FROM line")
	}
	m := regexp.MustCompile(`(?m)^\s*PLUGIN_BASE:\s*(\S+)`).FindStringSubmatch(mustRead(t, ".github/workflows/release.yml"))
	if m == nil {
		t.Fatal("no base of the plugin's image found (hack/images/plugin-base.Dockerfile, or release.yml's PLUGIN_BASE)")
	}
	return m[1]
}

// busyboxImage stands in for the plugin's image: a directory of busybox's
// tools, and nothing else. It fails the test unless the release builds the
// image on busybox, whose sh is what the emulation runs.
func busyboxImage(t *testing.T) string {
	t.Helper()
	if base := pluginImageBase(t); !strings.Contains(base, "/busybox:") {
		t.Fatalf("the plugin's image is built on %s; the emulation knows busybox's shell only: check that the component's scripts run there, and teach it", base)
	}
	busybox := requireTool(t, "busybox")
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	dir := t.TempDir()
	for _, applet := range strings.Fields(string(out)) {
		if err := os.Symlink(busybox, filepath.Join(dir, applet)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
