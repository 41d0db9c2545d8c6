package examples

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The GitHub Actions emulation reproduces what decides what a workflow run
// executes:
//
//   - ${{ }} expressions are evaluated before a step runs, and only the
//     property references used here are supported (github.x, secrets.x,
//     vars.x, inputs.x, steps.id.outputs.x, runner.x, job.x, strategy.x,
//     env.x),
//     alone or joined by ||, which gives the first truthy one (0 and ""
//     are falsy) or else the last; anything else fails the test.
//     The value lands verbatim wherever the expression is: in env it is
//     data, in run: it would be code, which is why no run: may hold one.
//   - A run: step is a script file run by its shell: `shell: bash` is
//     `bash --noprofile --norc -eo pipefail`, no shell is `bash -e`.
//     GITHUB_OUTPUT, GITHUB_ENV and GITHUB_PATH written by a step set its
//     outputs, and the environment and PATH of the job's later steps.
//   - `uses: buildlock/buildlock@REF` runs action.yml of this repository as a
//     composite action, with github.action_ref REF; its steps get the env of
//     the step that uses it. actions/checkout does nothing: the checkout is a
//     directory with the stub ./deploy.sh.
//   - A failing step fails its job, and the later steps whose if: is not
//     always() or failure() are skipped; a job runs only when every job it
//     needs succeeded.
//   - A job may request OIDC ID tokens (its steps get
//     ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN) only
//     with `id-token: write` (or write-all) in its permissions, or, when it
//     has none, the workflow's; never by default.

type ghStep struct {
	ID    string            `json:"id,omitempty"`
	Name  string            `json:"name,omitempty"`
	If    string            `json:"if,omitempty"`
	Uses  string            `json:"uses,omitempty"`
	With  map[string]any    `json:"with,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Run   string            `json:"run,omitempty"`
	Shell string            `json:"shell,omitempty"`
}

type ghJob struct {
	RunsOn      any               `json:"runs-on"`
	Needs       any               `json:"needs,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Permissions any               `json:"permissions,omitempty"`
	Environment any               `json:"environment,omitempty"`
	Steps       []ghStep          `json:"steps"`
}

type ghWorkflow struct {
	Name string `json:"name"`
	// On is the `on:` key, which YAML 1.1 reads as the boolean true.
	On          any               `json:"true"`
	Permissions any               `json:"permissions,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Jobs        map[string]ghJob  `json:"jobs"`
}

type ghAction struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Author      string `json:"author,omitempty"`
	Branding    any    `json:"branding,omitempty"`
	Inputs      map[string]struct {
		Description string `json:"description"`
		Required    bool   `json:"required,omitempty"`
		Default     string `json:"default,omitempty"`
	} `json:"inputs"`
	Outputs map[string]struct {
		Description string `json:"description"`
		Value       string `json:"value"`
	} `json:"outputs"`
	Runs struct {
		Using string   `json:"using"`
		Steps []ghStep `json:"steps"`
	} `json:"runs"`
}

// ghEvent is what the workflow run is about: the github context's values.
type ghEvent struct {
	repository, refName, headRef, runNumber, runID, runAttempt, commitMessage string
}

func defaultGHEvent() ghEvent {
	return ghEvent{repository: "acme/shop", refName: "main", runNumber: "42", runID: "5005", runAttempt: "1", commitMessage: "Fix the checkout"}
}

// ghRun runs a workflow's jobs.
type ghRun struct {
	t        *testing.T
	s        *stubs
	action   ghAction
	event    ghEvent
	env      []string // the test's extra environment (stub outcomes)
	platform [2]string
	// actionRef is github.action_ref while the action's steps run.
	actionRef string
	// jobIndex and checkRunID are the strategy.job-index and
	// job.check_run_id of every job (0: none).
	jobIndex, checkRunID int
	// idTokenURL is GitHub's ID token endpoint (a stub), for the jobs that
	// may request tokens; idTokenRequest is their request token.
	idTokenURL, idTokenRequest string
	status                     map[string]string // job -> jobPassed, jobFailed or jobSkipped
	output                     strings.Builder
}

// ghJobState is what a job's steps share.
type ghJobState struct {
	name                      string
	checkout, temp, toolCache string
	env                       map[string]string // GITHUB_ENV additions
	path                      []string          // GITHUB_PATH additions, newest first
	failed                    bool
	idTokens                  bool // the job may request OIDC ID tokens
}

func newGHRun(t *testing.T, s *stubs, event ghEvent, env ...string) *ghRun {
	t.Helper()
	r := &ghRun{t: t, s: s, event: event, env: env, platform: [2]string{"Linux", "X64"}, status: map[string]string{}}
	readYAML(t, "action.yml", &r.action)
	endpoint := newTokenEndpoint(t)
	r.idTokenURL, r.idTokenRequest = endpoint.URL+"/_apis/distributedtask/token?api-version=2.0", endpoint.request
	return r
}

// runWorkflow runs every job in an order that honors needs.
func (r *ghRun) runWorkflow(w ghWorkflow) {
	r.t.Helper()
	var names []string
	for name := range w.Jobs {
		names = append(names, name)
	}
	sort.Strings(names)
	for len(r.status) < len(names) {
		progress := false
		for _, name := range names {
			if _, done := r.status[name]; done {
				continue
			}
			needs := ghNeeds(r.t, w.Jobs[name].Needs)
			decided, ready := true, true
			for _, n := range needs {
				st, has := r.status[n]
				decided, ready = decided && has, ready && st == jobPassed
			}
			if !decided {
				continue
			}
			progress = true
			if !ready {
				r.status[name] = jobSkipped
				continue
			}
			r.status[name] = r.runJob(name, w, w.Jobs[name])
		}
		if !progress {
			r.t.Fatalf("the jobs' needs form a cycle or name a missing job: %v", names)
		}
	}
}

func ghNeeds(t *testing.T, needs any) []string {
	t.Helper()
	switch n := needs.(type) {
	case nil:
		return nil
	case string:
		return []string{n}
	case []any:
		var out []string
		for _, x := range n {
			out = append(out, fmt.Sprint(x))
		}
		return out
	}
	t.Fatalf("needs: %v", needs)
	return nil
}

func (r *ghRun) runJob(name string, w ghWorkflow, job ghJob) string {
	r.t.Helper()
	st := &ghJobState{name: name, checkout: r.t.TempDir(), temp: r.t.TempDir(), toolCache: r.t.TempDir(), env: map[string]string{}}
	permissions := job.Permissions
	if permissions == nil {
		permissions = w.Permissions
	}
	switch p := permissions.(type) {
	case string:
		st.idTokens = p == "write-all"
	case map[string]any:
		st.idTokens = p["id-token"] == "write"
	}
	r.s.deployScript(r.t, st.checkout)
	env := map[string]string{}
	for _, layer := range []map[string]string{w.Env, job.Env} {
		for k, v := range layer {
			env[k] = r.eval(v, r.contexts(st, nil, nil, nil))
		}
	}
	steps := map[string]any{}
	for i, step := range job.Steps {
		r.runStep(fmt.Sprintf("%s/%d", name, i), step, st, env, nil, steps)
	}
	if st.failed {
		return jobFailed
	}
	return jobPassed
}

// contexts returns the expression contexts for a step whose environment
// is env so far.
func (r *ghRun) contexts(st *ghJobState, inputs map[string]string, steps map[string]any, env map[string]string) map[string]any {
	envCtx := map[string]any{}
	for _, layer := range []map[string]string{st.env, env} {
		for k, v := range layer {
			envCtx[k] = v
		}
	}
	job := map[string]any{"status": "success"}
	if r.checkRunID != 0 {
		job["check_run_id"] = r.checkRunID
	}
	ctx := map[string]any{
		"github": map[string]any{
			"repository": r.event.repository,
			"ref_name":   r.event.refName,
			"head_ref":   r.event.headRef,
			"run_number": r.event.runNumber,
			"workspace":  st.checkout,
			"action_ref": r.actionRef,
			"event":      map[string]any{"head_commit": map[string]any{"message": r.event.commitMessage}},
		},
		"secrets": map[string]any{"KUBECONFIG": "apiVersion: v1\nkind: Config\n"},
		// The repository's variables the example uses (no secrets).
		"vars":     map[string]any{"CLUSTER_SERVER": "https://k8s.acme.example:6443", "CLUSTER_CA": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
		"runner":   map[string]any{"temp": st.temp, "tool_cache": st.toolCache, "os": r.platform[0], "arch": r.platform[1]},
		"steps":    steps,
		"job":      job,
		"strategy": map[string]any{"job-index": r.jobIndex, "job-total": 1, "fail-fast": true, "max-parallel": 1},
		"env":      envCtx,
	}
	if inputs != nil {
		in := map[string]any{}
		for k, v := range inputs {
			in[k] = v
		}
		ctx["inputs"] = in
	}
	return ctx
}

var (
	ghExprRe = regexp.MustCompile(`\$\{\{\s*(.*?)\s*\}\}`)
	ghPathRe = regexp.MustCompile(`^[A-Za-z_][\w-]*(\.[\w-]+)*$`)
)

// eval replaces each ${{ ref }} (or ${{ ref || ref ... }}) in s with the
// value of ref in ctx.
func (r *ghRun) eval(s string, ctx map[string]any) string {
	r.t.Helper()
	return ghExprRe.ReplaceAllStringFunc(s, func(expr string) string {
		refs := strings.Split(ghExprRe.FindStringSubmatch(expr)[1], "||")
		var v any
		for i, ref := range refs {
			ref = strings.TrimSpace(ref)
			if !ghPathRe.MatchString(ref) {
				r.t.Fatalf("the emulation supports property references only, not %q", expr)
			}
			parts := strings.Split(ref, ".")
			var ok bool
			if v, ok = ctx[parts[0]]; !ok {
				r.t.Fatalf("%s: the emulation has no context %q", expr, parts[0])
			}
			for _, p := range parts[1:] {
				m, _ := v.(map[string]any)
				v = m[p]
			}
			if truthy := v != nil && v != "" && v != 0 && v != false; truthy || i == len(refs)-1 {
				break
			}
		}
		if v == nil {
			return ""
		}
		return fmt.Sprint(v)
	})
}

// runStep runs one step (of a job, or of the composite action when inputs is
// set) and records its outputs in steps under its id.
func (r *ghRun) runStep(where string, step ghStep, st *ghJobState, inherited map[string]string, inputs map[string]string, steps map[string]any) {
	r.t.Helper()
	switch step.If {
	case "", "success()":
		if st.failed {
			return
		}
	case "always()":
	case "failure()":
		if !st.failed {
			return
		}
	default:
		r.t.Fatalf("%s: the emulation does not evaluate if: %q", where, step.If)
	}
	ctx := r.contexts(st, inputs, steps, inherited)
	env := map[string]string{}
	for k, v := range inherited {
		env[k] = v
	}
	for k, v := range step.Env {
		env[k] = r.eval(v, ctx)
	}
	outputs := map[string]any{}
	ok := true
	switch {
	case strings.HasPrefix(step.Uses, "actions/checkout@"):
	case strings.HasPrefix(step.Uses, "buildlock/buildlock@"):
		with := map[string]string{}
		for k, v := range step.With {
			with[k] = r.eval(fmt.Sprint(v), ctx)
		}
		outputs, ok = r.runAction(where, strings.TrimPrefix(step.Uses, "buildlock/buildlock@"), with, st, env)
	case step.Uses != "":
		r.t.Fatalf("%s: the emulation does not run %s", where, step.Uses)
	default:
		outputs, ok = r.runScript(where, step, st, env)
	}
	if step.ID != "" {
		steps[step.ID] = map[string]any{"outputs": outputs}
	}
	if !ok {
		st.failed = true
	}
}

// runAction runs action.yml as a composite action used at ref.
func (r *ghRun) runAction(where, ref string, with map[string]string, st *ghJobState, env map[string]string) (map[string]any, bool) {
	r.t.Helper()
	inputs := map[string]string{}
	for name, in := range r.action.Inputs {
		inputs[name] = in.Default
		if v, ok := with[name]; ok {
			inputs[name] = v
		} else if in.Required {
			r.t.Fatalf("%s: the action's required input %s is not given", where, name)
		}
	}
	for name := range with {
		if _, ok := r.action.Inputs[name]; !ok {
			r.t.Fatalf("%s: the action has no input %s", where, name)
		}
	}
	r.actionRef = ref
	defer func() { r.actionRef = "" }()
	steps := map[string]any{}
	inner := *st
	inner.failed = false
	for i, step := range r.action.Runs.Steps {
		if step.Shell == "" && step.Run != "" {
			r.t.Fatalf("action.yml step %d: a composite action's run step needs a shell", i)
		}
		r.runStep(fmt.Sprintf("%s/action/%d", where, i), step, &inner, env, inputs, steps)
	}
	st.env, st.path = inner.env, inner.path
	outputs := map[string]any{}
	ctx := r.contexts(&inner, inputs, steps, env)
	for name, out := range r.action.Outputs {
		outputs[name] = r.eval(out.Value, ctx)
	}
	return outputs, !inner.failed
}

// runScript runs a run: step with its shell and reads the files it wrote.
func (r *ghRun) runScript(where string, step ghStep, st *ghJobState, env map[string]string) (map[string]any, bool) {
	r.t.Helper()
	var shell []string
	switch step.Shell {
	case "":
		shell = []string{"bash", "-e"}
	case "bash":
		shell = []string{"bash", "--noprofile", "--norc", "-eo", "pipefail"}
	default:
		r.t.Fatalf("%s: the emulation runs bash steps only, not %q", where, step.Shell)
	}
	files := map[string]string{}
	dir := r.t.TempDir()
	for _, name := range []string{"GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY"} {
		files[name] = filepath.Join(dir, name)
		if err := os.WriteFile(files[name], nil, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	vars := []string{
		"CI=true", "GITHUB_ACTIONS=true",
		"GITHUB_REPOSITORY=" + r.event.repository,
		"GITHUB_REF_NAME=" + r.event.refName,
		"GITHUB_HEAD_REF=" + r.event.headRef,
		"GITHUB_RUN_NUMBER=" + r.event.runNumber,
		"GITHUB_RUN_ID=" + r.event.runID, "GITHUB_RUN_ATTEMPT=" + r.event.runAttempt,
		"GITHUB_JOB=" + st.name,
		"GITHUB_WORKSPACE=" + st.checkout,
		"RUNNER_OS=" + r.platform[0], "RUNNER_ARCH=" + r.platform[1],
		"RUNNER_TEMP=" + st.temp, "RUNNER_TOOL_CACHE=" + st.toolCache,
	}
	for name, path := range files {
		vars = append(vars, name+"="+path)
	}
	if st.idTokens && r.idTokenURL != "" {
		vars = append(vars, "ACTIONS_ID_TOKEN_REQUEST_URL="+r.idTokenURL, "ACTIONS_ID_TOKEN_REQUEST_TOKEN="+r.idTokenRequest)
	}
	for _, layer := range []map[string]string{st.env, env} {
		for k, v := range layer {
			vars = append(vars, k+"="+v)
		}
	}
	vars = append(vars, r.env...)
	full := r.s.env(vars...)
	for i, kv := range full {
		if strings.HasPrefix(kv, "PATH=") && len(st.path) > 0 {
			full[i] = "PATH=" + strings.Join(st.path, ":") + ":" + strings.TrimPrefix(kv, "PATH=")
		}
	}
	code, out := runScript(r.t, shell, step.Run, nil, st.checkout, full)
	fmt.Fprintf(&r.output, "[%s %s] exit %d\n%s", where, step.Name, code, out)

	outputs := map[string]any{}
	for k, v := range ghReadKV(r.t, files["GITHUB_OUTPUT"]) {
		outputs[k] = v
	}
	for k, v := range ghReadKV(r.t, files["GITHUB_ENV"]) {
		st.env[k] = v
	}
	if data, err := os.ReadFile(files["GITHUB_PATH"]); err == nil {
		for _, p := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if p != "" {
				st.path = append([]string{p}, st.path...)
			}
		}
	}
	if data, err := os.ReadFile(files["GITHUB_STEP_SUMMARY"]); err == nil && len(data) > 0 {
		fmt.Fprintf(&r.output, "[%s summary]\n%s", where, data)
	}
	return outputs, code == 0
}

// ghReadKV reads a GITHUB_OUTPUT or GITHUB_ENV file: name=value lines and
// name<<DELIMITER blocks.
func ghReadKV(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if name, delim, ok := strings.Cut(line, "<<"); ok && !strings.Contains(name, "=") {
			var value []string
			for i++; i < len(lines) && lines[i] != delim; i++ {
				value = append(value, lines[i])
			}
			kv[name] = strings.Join(value, "\n")
			continue
		}
		if name, value, ok := strings.Cut(line, "="); ok {
			kv[name] = value
		}
	}
	return kv
}

// fakeRelease writes a release of kubectl-buildlock (the stub, as a link in
// the tarball) with its checksums.txt for each platform, under
// dir/<version>/, as the curl stub serves them.
func fakeRelease(t *testing.T, version string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: stubPlugin, Typeflag: tar.TypeSymlink, Linkname: exe, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	var sums strings.Builder
	for _, platform := range []string{"linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64"} {
		name := "kubectl-buildlock_" + version + "_" + platform + ".tar.gz"
		if err := os.WriteFile(filepath.Join(dir, version, name), tgz.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sums, "%x  %s\n", sha256.Sum256(tgz.Bytes()), name)
	}
	if err := os.WriteFile(filepath.Join(dir, version, "checksums.txt"), []byte(sums.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// githubExample loads the example workflow.
func githubExample(t *testing.T) ghWorkflow {
	t.Helper()
	var w ghWorkflow
	readYAML(t, "examples/github-actions/deploy.yaml", &w)
	return w
}
