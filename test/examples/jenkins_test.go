package examples

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The Jenkins emulation runs the Jenkinsfile and vars/buildlock.groovy with
// Groovy under testdata/jenkins.groovy, a small stand-in for the steps they
// use (sh, withEnv, error, echo, currentBuild) and for declarative stages;
// its comment lists the rules it reproduces. Groovy is not part of a fresh
// CI machine: `.ci/run` installs it with apt-get, and without it these tests
// skip unless $REQUIRE_TOOLS is set.

// jenkinsRun is what an emulated build did.
type jenkinsRun struct {
	stages      map[string]string // stage -> passed, failed or skipped
	result      string
	description string
	output      string
}

var jenkinsLine = regexp.MustCompile(`(?m)^(STAGE (.+): (passed|failed|skipped)|RESULT (\S+)|DESCRIPTION (.*))$`)

// runJenkins runs the example Jenkinsfile as build BUILD_NUMBER of a
// multibranch job, on a Kubernetes agent pod, in a workspace with the stub
// ./deploy.sh; vars are the build's environment variables on top.
func runJenkins(t *testing.T, s *stubs, vars map[string]string, env ...string) jenkinsRun {
	t.Helper()
	return runJenkinsfile(t, s, repoFile(t, "examples/jenkins/Jenkinsfile"), vars, env...)
}

// runJenkinsfile is runJenkins with the Jenkinsfile at path.
func runJenkinsfile(t *testing.T, s *stubs, jenkinsfile string, vars map[string]string, env ...string) jenkinsRun {
	t.Helper()
	groovy := requireTool(t, "groovy")
	workspace := t.TempDir()
	s.deployScript(t, workspace)
	base := map[string]string{
		"JENKINS_URL": "https://jenkins.example.com/", "JOB_NAME": "acme/shop/main", "BRANCH_NAME": "main",
		"BUILD_NUMBER": "42", "BUILD_TAG": "jenkins-acme-shop-main-42", "NODE_NAME": "shop-main-42-agent",
		"WORKSPACE": workspace, "WORKSPACE_TMP": workspace + "@tmp", "HOSTNAME": "shop-main-42-agent",
		"KUBERNETES_SERVICE_HOST": "10.96.0.1", "CHANGE_TITLE": "Fix the checkout",
	}
	for k, v := range vars {
		base[k] = v
	}
	for k, v := range base {
		env = append(env, k+"="+v)
	}
	env = append(env, "JAVA_HOME="+javaHome(t))
	code, out := runScript(t, []string{groovy}, mustRead(t, "test/examples/testdata/jenkins.groovy"),
		[]string{repoFile(t, "vars/buildlock.groovy"), jenkinsfile}, workspace, s.env(env...))
	if code != 0 {
		t.Fatalf("groovy exited %d:\n%s", code, out)
	}
	run := jenkinsRun{stages: map[string]string{}, output: out}
	for _, m := range jenkinsLine.FindAllStringSubmatch(out, -1) {
		switch {
		case m[2] != "":
			run.stages[m[2]] = m[3]
		case m[4] != "":
			run.result = m[4]
		default:
			run.description = m[5]
		}
	}
	if run.result == "" {
		t.Fatalf("the emulation printed no result:\n%s", out)
	}
	return run
}

// javaHome is $JAVA_HOME, or the JDK of the java on PATH: Debian's groovy
// needs one or the other.
func javaHome(t *testing.T) string {
	t.Helper()
	if home := os.Getenv("JAVA_HOME"); home != "" {
		return home
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatal("groovy needs java on PATH or JAVA_HOME")
	}
	resolved, err := filepath.EvalSymlinks(java)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(resolved))
}

func mustRead(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(repoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// groovyScripts returns the shell scripts of a Groovy file: the
// single-quoted argument of each `sh '...'` and each `script: ”'...”'`.
// A double-quoted (interpolated) string passed to sh is an error.
func groovyScripts(t *testing.T, rel string) []embeddedScript {
	t.Helper()
	src := mustRead(t, rel)
	var out []embeddedScript
	// Comments may show what not to do; blank them, keeping line numbers.
	code := regexp.MustCompile(`(?m)^\s*//.*$`).ReplaceAllString(src, "")
	for _, bad := range regexp.MustCompile(`(?m)\bsh\s*\(?\s*"|script:\s*"`).FindAllStringIndex(code, -1) {
		line := strings.Count(code[:bad[0]], "\n") + 1
		t.Errorf("%s:%d: sh with a double-quoted Groovy string interpolates ${...} into the script as code; use single quotes and pass values with withEnv", rel, line)
	}
	for _, m := range regexp.MustCompile(`(?s)\bsh\s+'([^'\\]*)'|script:\s*'''(.*?)'''`).FindAllStringSubmatchIndex(src, -1) {
		start, end := m[2], m[3]
		if start < 0 {
			start, end = m[4], m[5]
		}
		text := src[start:end]
		if strings.Contains(text, `\`) {
			t.Errorf("%s: a backslash in a Groovy string is an escape, not shell: keep the scripts free of them", rel)
		}
		line := strings.Count(src[:start], "\n") + 1
		out = append(out, embeddedScript{where: rel + ":" + strconv.Itoa(line), dialect: "sh", text: text})
	}
	return out
}

// TestJenkinsStepReleasesWhenTheBodyFails: a failing deploy fails the stage
// and the build, and the lock is released all the same.
func TestJenkinsStepReleasesWhenTheBodyFails(t *testing.T) {
	s := newStubs(t)
	run := runJenkins(t, s, nil, "STUB_DEPLOY_EXIT=1")
	want := map[string]string{"Build": "passed", "Deploy to staging": "failed", "Deploy to production": "skipped"}
	if !maps.Equal(run.stages, want) || run.result != "FAILURE" {
		t.Errorf("stages %v, result %s; want %v and FAILURE; output:\n%s", run.stages, run.result, want, run.output)
	}
	var released []string
	for _, c := range named(s.calls(t), stubPlugin) {
		if c.Args[0] == "release" {
			target, _ := c.flag("--target")
			released = append(released, target)
		}
	}
	if !slices.Equal(released, []string{"staging"}) {
		t.Errorf("released %v, want [staging]", released)
	}
}
