package examples

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The GitLab emulation of includes reproduces what decides what a component
// adds to a pipeline (GitLab's CI/CD inputs):
//
//   - An include (component:, remote: or local:, each of this repository's
//     templates/buildlock.yml here) reads a file whose first YAML document is
//     the header `spec: inputs:` and whose second is the configuration.
//   - Each given input must be declared; an input without a default must be
//     given; a value must match the input's regex and options, and an input
//     of type boolean takes true or false (interpolated as that text).
//     Otherwise the pipeline is not created.
//   - $[[ inputs.name ]] is replaced in the configuration's keys and string
//     values after it is parsed, once: a value cannot add YAML structure,
//     and is not interpolated again.
//   - The included configuration is merged under the including file's, which
//     wins key by key (maps deeply), so a job of the same name completes it.
//   - A job variable {value: ..., expand: false} is not expanded by GitLab.

// gitlabComponent is the component this repository publishes.
const gitlabComponent = "templates/buildlock.yml"

// gitlabInputSpec is one input of a spec: inputs header.
type gitlabInputSpec struct {
	Description string `json:"description"`
	// Default is a string, or a boolean for type boolean; nil: none.
	Default any      `json:"default"`
	Regex   string   `json:"regex"`
	Options []string `json:"options"`
	Type    string   `json:"type"`
}

// loadGitLabComponent reads the component's header and configuration.
func loadGitLabComponent(t *testing.T) (map[string]gitlabInputSpec, string) {
	t.Helper()
	header, body, ok := strings.Cut(mustRead(t, gitlabComponent), "\n---\n")
	if !ok {
		t.Fatalf("%s: no header document before ---", gitlabComponent)
	}
	var spec struct {
		Spec struct {
			Inputs map[string]gitlabInputSpec `json:"inputs"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(header), &spec); err != nil {
		t.Fatalf("%s: the header: %v", gitlabComponent, err)
	}
	return spec.Spec.Inputs, body
}

var gitlabInputRef = regexp.MustCompile(`\$\[\[\s*inputs\.([\w-]+)\s*\]\]`)

// gitlabInclude resolves top's includes of the component, with their
// inputs, and merges what they add under top.
func gitlabInclude(t *testing.T, top map[string]any) (map[string]any, error) {
	t.Helper()
	includes, _ := top["include"].([]any)
	if includes == nil {
		return top, nil
	}
	merged := map[string]any{}
	for _, inc := range includes {
		m, _ := inc.(map[string]any)
		where := fmt.Sprint(m["component"], m["remote"], m["local"])
		if !strings.Contains(where, "buildlock/buildlock@") && !strings.HasSuffix(where, gitlabComponent) {
			t.Fatalf("include %v: the emulation knows only this repository's component", m)
		}
		given := map[string]string{}
		inputs, _ := m["inputs"].(map[string]any)
		for k, v := range inputs {
			given[k] = fmt.Sprint(v)
		}
		cfg, err := gitlabInterpolate(t, given)
		if err != nil {
			return nil, fmt.Errorf("include %s: %w", where, err)
		}
		merged = deepMerge(merged, cfg)
	}
	out := deepMerge(merged, top)
	delete(out, "include")
	return out, nil
}

// gitlabInterpolate checks given against the component's inputs and
// returns its configuration with them interpolated.
func gitlabInterpolate(t *testing.T, given map[string]string) (map[string]any, error) {
	t.Helper()
	specs, body := loadGitLabComponent(t)
	values := map[string]string{}
	var errs []error
	for name := range given {
		if _, ok := specs[name]; !ok {
			errs = append(errs, fmt.Errorf("unknown input %q", name))
		}
	}
	for name, spec := range specs {
		v, ok := given[name]
		switch {
		case !ok && spec.Default == nil:
			errs = append(errs, fmt.Errorf("`%s` input: required value has not been provided", name))
			continue
		case !ok:
			v = fmt.Sprint(spec.Default)
		}
		if spec.Type == "boolean" && v != "true" && v != "false" {
			errs = append(errs, fmt.Errorf("`%s` input: provided value is not a boolean", name))
		}
		if spec.Regex != "" && !regexp.MustCompile(spec.Regex).MatchString(v) {
			errs = append(errs, fmt.Errorf("`%s` input: provided value does not match required RegEx pattern", name))
		}
		if spec.Type == "boolean" && v != "true" && v != "false" {
			errs = append(errs, fmt.Errorf("`%s` input: provided value is not a boolean", name))
		}
		if spec.Options != nil && !slices.Contains(spec.Options, v) {
			errs = append(errs, fmt.Errorf("`%s` input: `%s` cannot be used because it is not in the list of allowed options", name, v))
		}
		values[name] = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(body), &cfg); err != nil {
		t.Fatalf("%s: %v", gitlabComponent, err)
	}
	var unknown []string
	out := interpolateValue(cfg, func(s string) string {
		return gitlabInputRef.ReplaceAllStringFunc(s, func(ref string) string {
			name := gitlabInputRef.FindStringSubmatch(ref)[1]
			v, ok := values[name]
			if !ok {
				unknown = append(unknown, name)
			}
			return v
		})
	}).(map[string]any)
	if len(unknown) > 0 {
		t.Fatalf("%s refers to inputs it does not declare: %v", gitlabComponent, unknown)
	}
	return out, nil
}

// interpolateValue applies f to every string of v, map keys included.
func interpolateValue(v any, f func(string) string) any {
	switch v := v.(type) {
	case string:
		return f(v)
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			out[i] = interpolateValue(item, f)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, item := range v {
			out[f(k)] = interpolateValue(item, f)
		}
		return out
	}
	return v
}

// gitlabVariable is a job variable's value: a plain value is expanded
// against vars, {value, expand: false} is not.
func gitlabVariable(t *testing.T, v any, vars map[string]string) string {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		value := fmt.Sprint(v["value"])
		if expand, ok := v["expand"].(bool); ok && !expand {
			return value
		}
		return gitlabExpand(value, vars)
	case nil:
		return ""
	}
	return gitlabExpand(fmt.Sprint(v), vars)
}

// gitlabComponentExample is examples/gitlab/component.gitlab-ci.yml.
func gitlabComponentExample(t *testing.T) gitlabPipeline {
	t.Helper()
	return loadGitLab(t, "examples/gitlab/component.gitlab-ci.yml")
}

// TestGitLabComponentDeploysEachTargetInTurn: the example includes the
// component for staging and production; each job takes its target's lock
// and runs the command under it, staging first.
func TestGitLabComponentDeploysEachTargetInTurn(t *testing.T) {
	p := gitlabComponentExample(t)
	s := newStubs(t)
	run := runGitLab(t, s, p, gitlabPredefined(), nil)
	out := run.output.String()
	if run.status["deploy-staging"] != jobPassed || run.status["deploy-production"] != jobPassed {
		t.Fatalf("jobs %v; output:\n%s", run.status, out)
	}
	calls := s.calls(t)
	var got []string
	for _, c := range acquires(calls) {
		target, _ := c.flag("--target")
		timeout, _ := c.flag("--timeout")
		ns, _ := c.flag("--namespace")
		got = append(got, target+" "+timeout+" "+ns)
	}
	if want := []string{"staging 30m ci", "production 2h ci"}; !slices.Equal(got, want) {
		t.Errorf("acquired %q, want %q", got, want)
	}
	assertDeployed(t, calls, out, "staging", "production")
	if job := p.jobs["deploy-staging"]; job.Environment != "staging" || job.Image != "registry.example.com/tools/deploy-with-buildlock:latest" || job.Stage != "deploy" {
		t.Errorf("deploy-staging is %+v: the example's keys complete the component's job", job)
	}
}

// TestGitLabComponentKeepsValuesData: hostile branch names and commit
// titles stay data through the component's job, and so do the command's own
// $VARIABLES: GitLab does not expand them into its text, bash expands them
// as values.
func TestGitLabComponentKeepsValuesData(t *testing.T) {
	withHostileValues(t, func(t *testing.T, s *stubs, value string) string {
		vars := gitlabPredefined()
		for _, k := range []string{"CI_COMMIT_REF_NAME", "CI_COMMIT_BRANCH", "CI_COMMIT_TITLE", "CI_COMMIT_MESSAGE"} {
			vars[k] = value
		}
		return runGitLab(t, s, gitlabComponentExample(t), vars, nil).output.String()
	}, func(*testing.T, []call, string, string) {})

	for name := range hostileValues("") {
		t.Run("the command's "+name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "PWNED")
			value := hostileValues(marker)[name]
			top, err := gitlabInclude(t, map[string]any{"include": []any{map[string]any{
				"component": "gitlab.example.com/platform/buildlock/buildlock@v0.2.0",
				"inputs":    map[string]any{"target": "staging", "image": "deploy", "command": `./deploy.sh "$CI_COMMIT_TITLE"`},
			}}})
			if err != nil {
				t.Fatal(err)
			}
			s := newStubs(t)
			vars := gitlabPredefined()
			vars["CI_COMMIT_TITLE"] = value
			out := runGitLab(t, s, gitlabPipelineOf(t, "a pipeline with the component", top), vars, nil).output.String()
			assertNotRun(t, marker, out)
			deploys := named(s.calls(t), stubDeploy)
			if len(deploys) != 1 || !slices.Equal(deploys[0].Args, []string{value}) {
				t.Errorf("./deploy.sh ran as %v, want once with the title %q as one argument; output:\n%s", deploys, value, out)
			}
		})
	}
}

// TestGitLabComponentRefusesBadInputs: GitLab creates no pipeline for an
// include whose inputs are missing, unknown or malformed.
func TestGitLabComponentRefusesBadInputs(t *testing.T) {
	good := map[string]string{"target": "staging", "image": "deploy", "command": "./deploy.sh"}
	for name, tc := range map[string]struct {
		change map[string]string
		drop   string
		want   string
	}{
		"no target":                      {drop: "target", want: "`target` input: required value"},
		"no command":                     {drop: "command", want: "`command` input: required value"},
		"a target that is no namespace":  {change: map[string]string{"target": "Staging; rm -rf /"}, want: "`target` input: provided value does not match"},
		"a timeout that is no duration":  {change: map[string]string{"timeout": "30 minutes"}, want: "`timeout` input"},
		"a namespace that is no name":    {change: map[string]string{"namespace": "ci$(id)"}, want: "`namespace` input"},
		"an input the component lacks":   {change: map[string]string{"branch": "main"}, want: `unknown input "branch"`},
		"an expires-after with no units": {change: map[string]string{"expires-after": "90"}, want: "`expires-after` input"},
		"a rollback that is no boolean":  {change: map[string]string{"rollback": "yes"}, want: "`rollback` input: provided value is not a boolean"},
	} {
		t.Run(name, func(t *testing.T) {
			given := map[string]string{}
			for k, v := range good {
				given[k] = v
			}
			delete(given, tc.drop)
			for k, v := range tc.change {
				given[k] = v
			}
			_, err := gitlabInterpolate(t, given)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("inputs %v: %v, want an error with %q", given, err, tc.want)
			}
		})
	}
	if _, err := gitlabInterpolate(t, good); err != nil {
		t.Errorf("the minimal inputs %v: %v", good, err)
	}
}

// TestGitLabComponentDocumentsEveryInput: every input says what it is for.
func TestGitLabComponentDocumentsEveryInput(t *testing.T) {
	specs, body := loadGitLabComponent(t)
	for name, spec := range specs {
		if spec.Description == "" {
			t.Errorf("input %s has no description (the CI/CD Catalog shows it)", name)
		}
		if !strings.Contains(body, "$[[ inputs."+name+" ]]") {
			t.Errorf("input %s is declared but not used", name)
		}
	}
}

// TestGitLabComponentRunsOnThePluginImage: included with no image, the
// component's job runs on the plugin's release image, which has busybox's
// sh and no bash: it takes the lock, runs the command under it (with
// pipefail, which busybox's sh has), and fails when the command does; with
// oidc it writes its kubeconfig there too.
func TestGitLabComponentRunsOnThePluginImage(t *testing.T) {
	include := func(inputs map[string]any) gitlabPipeline {
		t.Helper()
		top, err := gitlabInclude(t, map[string]any{"include": []any{map[string]any{
			"component": "gitlab.example.com/platform/buildlock/buildlock@0.2.0", "inputs": inputs,
		}}})
		if err != nil {
			t.Fatal(err)
		}
		p := gitlabPipelineOf(t, "a pipeline with the component", top)
		if img := p.jobs["deploy-staging"].Image; !strings.HasPrefix(img, pluginImage+":") {
			t.Fatalf("the job's default image is %q, want the plugin's image", img)
		}
		return p
	}

	s := newStubs(t)
	run := runGitLab(t, s, include(map[string]any{"target": "staging", "command": `./deploy.sh "$BUILDLOCK_TARGET" | cat`}), gitlabPredefined(), nil)
	if run.status["deploy-staging"] != jobPassed {
		t.Fatalf("job %v; output:\n%s", run.status, run.output.String())
	}
	assertDeployed(t, s.calls(t), run.output.String(), "staging")

	s = newStubs(t)
	run = runGitLab(t, s, include(map[string]any{"target": "staging", "command": `./deploy.sh "$BUILDLOCK_TARGET" | cat`}), gitlabPredefined(), []string{"STUB_DEPLOY_EXIT=1"})
	if run.status["deploy-staging"] != jobFailed {
		t.Errorf("a deploy that fails in a pipeline: job %v, want failed (pipefail); output:\n%s", run.status, run.output.String())
	}

	s = newStubs(t)
	run = runGitLab(t, s, include(map[string]any{"target": "staging", "command": "./deploy.sh staging", "oidc": "true", "namespace": "ci",
		"oidc-audience": "https://k8s.acme.example", "server": "https://k8s.acme.example:6443"}), gitlabPredefined(), nil)
	if run.status["deploy-staging"] != jobPassed {
		t.Fatalf("with oidc: job %v; output:\n%s", run.status, run.output.String())
	}
	acq := acquires(s.calls(t))
	if len(acq) != 1 || acq[0].Env["KUBECONFIG"] == "" {
		t.Errorf("with oidc, acquire ran as %+v, want with the kubeconfig the job wrote", acq)
	}
}
