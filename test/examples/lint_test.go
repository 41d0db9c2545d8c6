package examples

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// requireTool returns the path of a tool: $NAME (upper case) if set, else
// name on PATH. Without it the test skips, unless $REQUIRE_TOOLS is set (as
// `make lint-examples` and CI do).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	if path := os.Getenv(strings.ToUpper(name)); path != "" {
		return path
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("REQUIRE_TOOLS") != "" {
		t.Fatalf("%s is not on PATH, and REQUIRE_TOOLS is set", name)
	}
	t.Skipf("%s is not on PATH (set REQUIRE_TOOLS=1 to make that a failure)", name)
	return ""
}

// embeddedScript is one script a CI system runs, taken out of its file.
type embeddedScript struct {
	where   string // the file and the step or job
	dialect string // shellcheck's shell: sh or bash
	text    string
}

// embeddedScripts returns every script of the examples and building blocks.
func embeddedScripts(t *testing.T) []embeddedScript {
	t.Helper()
	var out []embeddedScript
	out = append(out, tektonScripts(t)...)
	out = append(out, gitlabScripts(t)...)
	out = append(out, githubScripts(t)...)
	out = append(out, groovyScripts(t, "examples/jenkins/Jenkinsfile")...)
	out = append(out, groovyScripts(t, "vars/buildlock.groovy")...)
	out = append(out, markdownScripts(t, "docs/pipelines.md")...)
	return out
}

// markdownScripts returns the ```sh blocks of a Markdown file: people copy
// them into pipelines.
func markdownScripts(t *testing.T, rel string) []embeddedScript {
	t.Helper()
	src := mustRead(t, rel)
	var out []embeddedScript
	for _, m := range regexp.MustCompile("(?s)\n```sh\n(.*?)\n```").FindAllStringSubmatchIndex(src, -1) {
		line := strings.Count(src[:m[2]], "\n") + 1
		out = append(out, embeddedScript{where: rel + ":" + strconv.Itoa(line), dialect: "sh", text: src[m[2]:m[3]] + "\n"})
	}
	return out
}

// githubScripts returns the run: steps of the example workflow and of the
// composite action; bash runs them.
func githubScripts(t *testing.T) []embeddedScript {
	t.Helper()
	var out []embeddedScript
	add := func(where string, steps []ghStep) {
		for i, s := range steps {
			if s.Run != "" {
				out = append(out, embeddedScript{where: fmt.Sprintf("%s step %d %s", where, i, s.ID+s.Name), dialect: "bash", text: s.Run})
			}
		}
	}
	for name, job := range githubExample(t).Jobs {
		add("GitHub job "+name, job.Steps)
	}
	var a ghAction
	readYAML(t, "action.yml", &a)
	add("action.yml", a.Runs.Steps)
	return out
}

// tektonScripts returns the steps' scripts with the Tekton variables that
// may appear in a script (result paths) replaced as Tekton would.
func tektonScripts(t *testing.T) []embeddedScript {
	t.Helper()
	_, tasks := tektonExample(t)
	var out []embeddedScript
	for _, task := range tasks {
		vars := map[string]string{}
		for _, r := range task.Spec.Results {
			vars["results."+r.Name+".path"] = "/tekton/results/" + r.Name
		}
		for _, step := range task.Spec.Steps {
			text := tektonSubst(step.Script, vars)
			dialect := "sh"
			if strings.HasPrefix(text, "#!/bin/bash") || strings.HasPrefix(text, "#!/usr/bin/env bash") {
				dialect = "bash"
			}
			out = append(out, embeddedScript{where: "Task " + task.Metadata.Name + " step " + step.Name, dialect: dialect, text: text})
		}
	}
	return out
}

// gitlabScripts returns each job's script (before_script and script, as
// one shell runs them) and after_script. They are checked as sh: the runner
// falls back to sh in images without bash.
func gitlabScripts(t *testing.T) []embeddedScript {
	t.Helper()
	var out []embeddedScript
	jobs := maps.Clone(gitlabExample(t).jobs)
	for name, job := range gitlabComponentExample(t).jobs {
		jobs["component "+name] = job
	}
	for name, job := range jobs {
		out = append(out, embeddedScript{
			where:   "GitLab job " + name,
			dialect: "sh",
			text:    strings.Join(append(append([]string{}, job.BeforeScript...), job.Script...), "\n") + "\n",
		})
		if len(job.AfterScript) > 0 {
			out = append(out, embeddedScript{where: "GitLab job " + name + " after_script", dialect: "sh", text: strings.Join(job.AfterScript, "\n") + "\n"})
		}
	}
	return out
}

// TestShellcheck runs shellcheck on every embedded script.
func TestShellcheck(t *testing.T) {
	shellcheck := requireTool(t, "shellcheck")
	for _, s := range embeddedScripts(t) {
		t.Run(s.where, func(t *testing.T) {
			cmd := exec.Command(shellcheck, "--shell="+s.dialect, "--format=gcc", "-")
			cmd.Stdin = strings.NewReader(s.text)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Errorf("shellcheck: %v\n%s\nthe script:\n%s", err, out.String(), numbered(s.text))
			}
		})
	}
}

// TestActionlint lints the example workflow with actionlint, which also
// runs shellcheck on its scripts and flags untrusted ${{ }} in them.
// (actionlint does not lint action.yml: TestShellcheck and
// TestNoExpressionInGitHubScripts cover it.)
func TestActionlint(t *testing.T) {
	actionlint := requireTool(t, "actionlint")
	requireTool(t, "shellcheck")
	cmd := exec.Command(actionlint, "-no-color", repoFile(t, "examples/github-actions/deploy.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("actionlint: %v\n%s", err, out)
	}
}

// numbered returns text with line numbers, to read shellcheck's positions.
func numbered(text string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, line)
	}
	return b.String()
}
