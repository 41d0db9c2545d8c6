package examples

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The Tekton emulation reproduces what decides what a PipelineRun executes:
//
//   - Variables are substituted textually, once, into every field of a step
//     (image, script, args, env values, workingDir): $(params.x),
//     $(results.x.path), $(workspaces.x.path), $(context.taskRun.*); an
//     argument that is exactly "$(params.x[*])" expands into the array's
//     items. A pipeline task's params get $(params.x) and
//     $(tasks.t.results.r). A value is not substituted again, so whatever a
//     param holds lands verbatim in a script that names it: that is the
//     injection this emulation exists to show.
//   - A script without "#!" gets "#!/bin/sh\nset -e\n" in front; the script
//     file is run by its "#!" interpreter with the step's args.
//   - A failing step fails its TaskRun and skips the steps after it; a failed
//     TaskRun stops the PipelineRun from starting more tasks (finally tasks
//     still run). A task whose when expressions are false is skipped.
//   - Every step runs in the TaskRun's pod: $HOSTNAME is the pod's name and
//     KUBERNETES_SERVICE_HOST is set, as the plugin expects in a pod. The
//     downward API gives the pod's UID and its labels; Tekton labels a
//     PipelineRun's pods tekton.dev/pipeline=<the Pipeline's name> and
//     tekton.dev/pipelineRun=<the PipelineRun's name>, and a label the pod
//     lacks is an empty value.

type tektonMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type tektonParamSpec struct {
	Name        string `json:"name"`
	Type        string `json:"type,omitempty"`
	Description string `json:"description,omitempty"`
	Default     any    `json:"default,omitempty"`
}

type tektonNamed struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Optional    bool   `json:"optional,omitempty"`
}

type tektonEnvVar struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	ValueFrom *struct {
		FieldRef struct {
			FieldPath string `json:"fieldPath"`
		} `json:"fieldRef"`
	} `json:"valueFrom,omitempty"`
}

// tektonPipelineRun is the name of the emulated PipelineRun, which Tekton
// labels its pods with (tekton.dev/pipelineRun).
const tektonPipelineRun = "build-and-deploy-x7k2p"

// tektonPodUID is the pod UID the emulated steps see through the downward
// API (valueFrom.fieldRef metadata.uid).
const tektonPodUID = "6f1c7a2e-5b1d-4c6e-9a0b-2f9d3c4e5a6b"

type tektonStep struct {
	Name       string         `json:"name"`
	Image      string         `json:"image"`
	Script     string         `json:"script,omitempty"`
	Args       []string       `json:"args,omitempty"`
	Env        []tektonEnvVar `json:"env,omitempty"`
	WorkingDir string         `json:"workingDir,omitempty"`
}

// tektonObject is what every Tekton object starts with.
type tektonObject struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   tektonMeta `json:"metadata"`
}

type tektonTask struct {
	tektonObject
	Spec struct {
		Description string            `json:"description,omitempty"`
		Params      []tektonParamSpec `json:"params,omitempty"`
		Results     []tektonNamed     `json:"results,omitempty"`
		Workspaces  []tektonNamed     `json:"workspaces,omitempty"`
		Steps       []tektonStep      `json:"steps"`
	} `json:"spec"`
}

type tektonPipelineTask struct {
	Name    string `json:"name"`
	TaskRef struct {
		Name string `json:"name"`
	} `json:"taskRef"`
	RunAfter []string `json:"runAfter,omitempty"`
	Params   []struct {
		Name  string `json:"name"`
		Value any    `json:"value"`
	} `json:"params,omitempty"`
	When []struct {
		Input    string   `json:"input"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	} `json:"when,omitempty"`
	Workspaces []struct {
		Name      string `json:"name"`
		Workspace string `json:"workspace"`
	} `json:"workspaces,omitempty"`
}

type tektonPipeline struct {
	tektonObject
	Spec struct {
		Description string               `json:"description,omitempty"`
		Params      []tektonParamSpec    `json:"params,omitempty"`
		Workspaces  []tektonNamed        `json:"workspaces,omitempty"`
		Tasks       []tektonPipelineTask `json:"tasks"`
		Finally     []tektonPipelineTask `json:"finally,omitempty"`
	} `json:"spec"`
}

// tektonVar matches a Tekton variable reference; what it captures is looked
// up, and left alone (shell command substitution) when unknown.
var tektonVar = regexp.MustCompile(`\$\(([^()\s]+)\)`)

// tektonArrayArg matches an argument that is a whole array param.
var tektonArrayArg = regexp.MustCompile(`^\$\(params\.([^()\[\]]+)\[\*\]\)$`)

// tektonSubst replaces the known variables in s, once.
func tektonSubst(s string, vars map[string]string) string {
	return tektonVar.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := vars[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// tektonArgs substitutes args, expanding "$(params.x[*])" into items.
func tektonArgs(args []string, vars map[string]string, arrays map[string][]string) []string {
	var out []string
	for _, a := range args {
		if m := tektonArrayArg.FindStringSubmatch(a); m != nil {
			out = append(out, arrays[m[1]]...)
			continue
		}
		out = append(out, tektonSubst(a, vars))
	}
	return out
}

// tektonValue is a param value: a string, or an array of strings.
type tektonValue struct {
	str   string
	array []string
	isArr bool
}

func toTektonValue(t *testing.T, v any) tektonValue {
	t.Helper()
	switch v := v.(type) {
	case string:
		return tektonValue{str: v}
	case []string:
		return tektonValue{array: v, isArr: true}
	case []any:
		var items []string
		for _, item := range v {
			s, ok := item.(string)
			if !ok {
				t.Fatalf("an array param item is %T, want string", item)
			}
			items = append(items, s)
		}
		return tektonValue{array: items, isArr: true}
	}
	t.Fatalf("a param value is %T, want a string or an array of strings", v)
	return tektonValue{}
}

// tektonRun records what an emulated PipelineRun did.
type tektonRun struct {
	ran     []string // the pipeline tasks that ran, in order
	skipped []string // the pipeline tasks skipped by when expressions
	failed  string   // the pipeline task whose TaskRun failed, "" when none
	output  strings.Builder
}

// runTektonPipeline runs a Pipeline with the Tasks it references (by name)
// and the PipelineRun's params. Every workspace is one shared directory,
// which holds the stub ./deploy.sh and is also the steps' default working
// directory (standing for a deploy image with its tooling).
func runTektonPipeline(t *testing.T, s *stubs, p tektonPipeline, tasks map[string]tektonTask, params map[string]any, env []string) *tektonRun {
	t.Helper()
	pvars, parrays := map[string]string{}, map[string][]string{}
	resolveParams(t, "Pipeline "+p.Metadata.Name, p.Spec.Params, params, pvars, parrays)
	source := t.TempDir()
	s.deployScript(t, source)

	run := &tektonRun{}
	results := map[string]string{} // "tasks.T.results.R" -> value
	done := map[string]bool{}
	runTask := func(pt tektonPipelineTask) {
		for _, after := range pt.RunAfter {
			if !done[after] {
				t.Fatalf("pipeline task %s runs after %s, which is not before it", pt.Name, after)
			}
		}
		done[pt.Name] = true
		vars := map[string]string{}
		for k, v := range pvars {
			vars["params."+k] = v
		}
		for k, v := range results {
			vars[k] = v
		}
		for _, w := range pt.When {
			in := slices.Contains(w.Values, tektonSubst(w.Input, vars))
			if in != (w.Operator == "in") {
				run.skipped = append(run.skipped, pt.Name)
				return
			}
		}
		given := map[string]any{}
		for _, prm := range pt.Params {
			v := toTektonValue(t, prm.Value)
			if v.isArr {
				given[prm.Name] = tektonArgs(v.array, vars, parrays)
			} else {
				given[prm.Name] = tektonSubst(v.str, vars)
			}
		}
		task, ok := tasks[pt.TaskRef.Name]
		if !ok {
			t.Fatalf("pipeline task %s references Task %q, which the test did not load", pt.Name, pt.TaskRef.Name)
		}
		run.ran = append(run.ran, pt.Name)
		taskResults, ok := runTektonTask(t, s, task, pt.Name, p.Metadata.Name, given, source, env, &run.output)
		for name, v := range taskResults {
			results["tasks."+pt.Name+".results."+name] = v
		}
		if !ok && run.failed == "" {
			run.failed = pt.Name
		}
	}
	for _, pt := range p.Spec.Tasks {
		if run.failed != "" {
			break
		}
		runTask(pt)
	}
	for _, pt := range p.Spec.Finally {
		runTask(pt)
	}
	return run
}

// resolveParams fills vars (strings) and arrays from the declared params'
// defaults and the given values; a param without either fails the test.
func resolveParams(t *testing.T, what string, specs []tektonParamSpec, given map[string]any, vars map[string]string, arrays map[string][]string) {
	t.Helper()
	for _, spec := range specs {
		v, ok := given[spec.Name]
		if !ok {
			v = spec.Default
		}
		if v == nil {
			t.Fatalf("%s: param %s has no value and no default", what, spec.Name)
		}
		tv := toTektonValue(t, v)
		if tv.isArr != (spec.Type == "array") {
			t.Fatalf("%s: param %s is declared %q but given %v", what, spec.Name, spec.Type, v)
		}
		if tv.isArr {
			arrays[spec.Name] = tv.array
		} else {
			vars[spec.Name] = tv.str
		}
	}
	for name := range given {
		if !slices.ContainsFunc(specs, func(p tektonParamSpec) bool { return p.Name == name }) {
			t.Fatalf("%s: no param %s is declared", what, name)
		}
	}
}

// runTektonTask runs one TaskRun's steps in order, in a TaskRun of
// pipeline ("" for a TaskRun of its own), and returns its results and
// whether it succeeded.
func runTektonTask(t *testing.T, s *stubs, task tektonTask, runName, pipeline string, given map[string]any, source string, env []string, out *strings.Builder) (map[string]string, bool) {
	t.Helper()
	pvars, arrays := map[string]string{}, map[string][]string{}
	resolveParams(t, "Task "+task.Metadata.Name, task.Spec.Params, given, pvars, arrays)
	dir := t.TempDir()
	resultsDir := filepath.Join(dir, "results")
	if err := os.Mkdir(resultsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		"context.taskRun.name":      runName,
		"context.taskRun.namespace": "ci",
	}
	for k, v := range pvars {
		vars["params."+k] = v
	}
	for _, r := range task.Spec.Results {
		vars["results."+r.Name+".path"] = filepath.Join(resultsDir, r.Name)
	}
	for _, w := range task.Spec.Workspaces {
		vars["workspaces."+w.Name+".path"] = source
		vars["workspaces."+w.Name+".bound"] = "true"
	}
	ok := true
	for _, step := range task.Spec.Steps {
		if step.Script == "" {
			t.Fatalf("Task %s step %s: the emulation runs script steps only", task.Metadata.Name, step.Name)
		}
		script := tektonSubst(step.Script, vars)
		if !strings.HasPrefix(script, "#!") {
			script = "#!/bin/sh\nset -e\n" + script
		}
		// The kernel would run the file with its "#!" line; running that
		// interpreter on the file does the same, and a file just written is
		// not executed while another test's fork may hold it open for
		// writing ("text file busy").
		interpreter := strings.Fields(strings.TrimPrefix(strings.SplitN(script, "\n", 2)[0], "#!"))
		stepEnv := s.env(append([]string{
			"HOSTNAME=" + runName + "-pod",
			"KUBERNETES_SERVICE_HOST=10.96.0.1",
		}, env...)...)
		for _, e := range step.Env {
			switch {
			case e.ValueFrom == nil:
				stepEnv = append(stepEnv, e.Name+"="+tektonSubst(e.Value, vars))
			case e.ValueFrom.FieldRef.FieldPath == "metadata.uid":
				stepEnv = append(stepEnv, e.Name+"="+tektonPodUID)
			case e.ValueFrom.FieldRef.FieldPath == "metadata.labels['tekton.dev/pipeline']":
				stepEnv = append(stepEnv, e.Name+"="+pipeline)
			case e.ValueFrom.FieldRef.FieldPath == "metadata.labels['tekton.dev/pipelineRun']":
				if pipeline != "" {
					stepEnv = append(stepEnv, e.Name+"="+tektonPipelineRun)
				} else {
					stepEnv = append(stepEnv, e.Name+"=")
				}
			default:
				t.Fatalf("step %s: env %s from %q, which the emulation does not know", step.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		wd := tektonSubst(step.WorkingDir, vars)
		if wd == "" {
			wd = source // the image's own working directory, with ./deploy.sh
		}
		code, output := runScript(t, interpreter, script, tektonArgs(step.Args, vars, arrays), wd, stepEnv)
		fmt.Fprintf(out, "[%s/%s] exit %d\n%s", runName, step.Name, code, output)
		if code != 0 {
			ok = false
			break
		}
	}
	results := map[string]string{}
	for _, r := range task.Spec.Results {
		if data, err := os.ReadFile(filepath.Join(resultsDir, r.Name)); err == nil {
			results[r.Name] = string(data)
		}
	}
	return results, ok
}

// tektonExample loads the example Pipeline and the Task it uses.
func tektonExample(t *testing.T) (tektonPipeline, map[string]tektonTask) {
	t.Helper()
	var p tektonPipeline
	readYAML(t, "examples/tekton/pipeline.yaml", &p)
	var task tektonTask
	readYAML(t, tektonCatalogTask, &task)
	return p, map[string]tektonTask{task.Metadata.Name: task}
}

// tektonCatalogTask is the catalog Task that the example Pipeline uses.
const tektonCatalogTask = "tekton/task/buildlock-deploy/0.1/buildlock-deploy.yaml"

// TestTektonTaskNumbersTheBuildByItsPipelineRun: Tekton numbers no builds;
// run without the build param, the Task numbers the build by its
// PipelineRun (kubectl buildlock build-number --pipelinerun <its
// tekton.dev/pipelineRun label>), and its acquire and release steps agree
// on that number; a build param, where a trigger has one, wins.
func TestTektonTaskNumbersTheBuildByItsPipelineRun(t *testing.T) {
	p, tasks := tektonExample(t)
	s := newStubs(t)
	run := runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main"}, nil)
	if run.failed != "" {
		t.Fatalf("task %s failed; output:\n%s", run.failed, run.output.String())
	}
	var numbered, builds []string
	for _, c := range named(s.calls(t), stubPlugin) {
		switch c.Args[0] {
		case "build-number":
			pr, _ := c.flag("--pipelinerun")
			numbered = append(numbered, pr)
		case "acquire", "release":
			b, _ := c.flag("--build")
			builds = append(builds, c.Args[0]+" "+b)
		}
	}
	if len(numbered) != 4 || slices.ContainsFunc(numbered, func(pr string) bool { return pr != tektonPipelineRun }) {
		t.Errorf("build-number ran for %q, want the PipelineRun %s for each acquire and release", numbered, tektonPipelineRun)
	}
	want := []string{"acquire " + stubBuildNumber, "release " + stubBuildNumber, "acquire " + stubBuildNumber, "release " + stubBuildNumber}
	if !slices.Equal(builds, want) {
		t.Errorf("the plugin ran %q, want %q", builds, want)
	}

	s = newStubs(t)
	runTektonPipeline(t, s, p, tasks, map[string]any{"repo": "acme/shop", "branch": "main", "build": "42"}, nil)
	for _, c := range named(s.calls(t), stubPlugin) {
		if b, _ := c.flag("--build"); c.Args[0] == "build-number" || (c.Args[0] == "acquire" && b != "42") {
			t.Errorf("with build 42, the plugin ran %q", c.Args)
		}
	}
}
