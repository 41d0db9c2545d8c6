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
	"time"
)

// The Jenkins emulation runs the Jenkinsfile and vars/buildlock.groovy with
// Groovy under testdata/jenkins.groovy, a small stand-in for the steps they
// use (sh, withEnv, error, echo, currentBuild, node, parallel, waitUntil,
// pwd, fileExists, readFile, writeFile, checkout), for executors, and for
// declarative stages and agents;
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
		"JENKINS_EXECUTORS": filepath.Join(t.TempDir(), "executors"),
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
// and the build, and the lock is released all the same: the plugin's
// acquire, which held while the body ran, ended.
func TestJenkinsStepReleasesWhenTheBodyFails(t *testing.T) {
	s := newStubs(t)
	run := runJenkins(t, s, nil, "STUB_DEPLOY_EXIT=1")
	want := map[string]string{"Build": "passed", "Deploy to staging": "failed", "Deploy to production": "skipped"}
	if !maps.Equal(run.stages, want) || run.result != "FAILURE" {
		t.Errorf("stages %v, result %s; want %v and FAILURE; output:\n%s", run.stages, run.result, want, run.output)
	}
	acq := acquires(s.calls(t))
	if len(acq) != 1 || len(acq[0].command()) == 0 {
		t.Fatalf("acquire calls %v, want one for staging that holds while a command runs", acq)
	}
	assertHoldsEnded(t, s)
}

// assertHoldsEnded fails the test if a stub acquire still holds: its
// command never ended, so the plugin would not have released the lock.
func assertHoldsEnded(t *testing.T, s *stubs) {
	t.Helper()
	if holding, _ := filepath.Glob(s.log + ".holding-*"); len(holding) > 0 {
		t.Errorf("acquire still holds after the build: %v", holding)
	}
}

// assertWaitsWithoutADeployExecutor: the example's deploy stages have no
// agent: the step runs the plugin on the small agent waitOn names while it
// waits, and the body's node('deploy') is allocated only once the lock is
// held; the plugin keeps holding (renewing) while the deploy runs.
func assertWaitsWithoutADeployExecutor(t *testing.T, s *stubs, run jenkinsRun) {
	t.Helper()
	if run.result != "SUCCESS" {
		t.Fatalf("result %s; output:\n%s", run.result, run.output)
	}
	calls := s.calls(t)
	for _, c := range acquires(calls) {
		target, _ := c.flag("--target")
		if !slices.Equal(c.Executors, []string{"buildlock"}) {
			t.Errorf("acquire %s ran while the executors %v were held, want only the buildlock agent's", target, c.Executors)
		}
		if len(c.command()) == 0 {
			t.Errorf("acquire %s runs no command: nothing holds (and renews) the claim while the body runs", target)
		}
		if _, ok := c.flag("--expires-after"); ok {
			t.Errorf("acquire %s passes --expires-after by default: the plugin's own, renewed while its command runs, is the one", target)
		}
	}
	assertDeployed(t, calls, run.output, "staging", "production")
	for _, d := range named(calls, stubDeploy) {
		if !slices.Contains(d.Executors, "deploy") || !slices.Equal(d.Holding, d.Args) {
			t.Errorf("./deploy.sh %v ran on the executors %v while %v held, want on deploy while its own target's acquire holds", d.Args, d.Executors, d.Holding)
		}
	}
	assertHoldsEnded(t, s)
}

// TestJenkinsStepInsideNodeHoldsWhileTheBodyRuns: called inside node, the
// step runs the plugin on that node, which holds (and renews a claim
// without a pod, with the expiresAfter given) while the body runs.
func TestJenkinsStepInsideNodeHoldsWhileTheBodyRuns(t *testing.T) {
	s := newStubs(t)
	run := runJenkinsfile(t, s, stepJenkinsfile(t, "agent { label 'deploy' }", "target: 'staging', expiresAfter: '10m'", "sh './deploy.sh staging'"), nil)
	if run.result != "SUCCESS" {
		t.Fatalf("result %s; output:\n%s", run.result, run.output)
	}
	calls := s.calls(t)
	acq := acquires(calls)
	if len(acq) != 1 || !slices.Equal(acq[0].Executors, []string{"deploy"}) || len(acq[0].command()) == 0 {
		t.Fatalf("acquire calls %+v, want one on the deploy executor, holding while a command runs", acq)
	}
	if v, _ := acq[0].flag("--expires-after"); v != "10m" {
		t.Errorf("--expires-after %q, want 10m", v)
	}
	assertDeployed(t, calls, run.output, "staging")
	if d := named(calls, stubDeploy)[0]; !slices.Equal(d.Holding, []string{"staging"}) {
		t.Errorf("./deploy.sh ran while %v held, want staging", d.Holding)
	}
	assertHoldsEnded(t, s)
}

// TestJenkinsStepStopsTheBodyWhenTheHoldIsLost: when the claim stops
// holding while the body runs (the plugin exits 5), the body is aborted,
// the stage fails and says why, and no later stage runs.
func TestJenkinsStepStopsTheBodyWhenTheHoldIsLost(t *testing.T) {
	s := newStubs(t)
	start := time.Now()
	run := runJenkins(t, s, nil, "STUB_LOSE=staging", "STUB_DEPLOY_SLEEP=120s")
	want := map[string]string{"Build": "passed", "Deploy to staging": "failed", "Deploy to production": "skipped"}
	if !maps.Equal(run.stages, want) || run.result != "FAILURE" {
		t.Errorf("stages %v, result %s; want %v and FAILURE; output:\n%s", run.stages, run.result, want, run.output)
	}
	if elapsed := time.Since(start); elapsed > 100*time.Second {
		t.Errorf("the build took %s: the deploy ran on after the hold was lost", elapsed)
	}
	assertContains(t, run.output, "stopped holding while the body ran")
}

// TestJenkinsStepOutsideNodeNeedsWaitOn: outside node, the step needs an
// agent for the plugin and says so.
func TestJenkinsStepOutsideNodeNeedsWaitOn(t *testing.T) {
	s := newStubs(t)
	run := runJenkinsfile(t, s, stepJenkinsfile(t, "agent none", "target: 'staging'", "node('deploy') { sh './deploy.sh staging' }"), nil)
	if run.result != "FAILURE" || len(s.calls(t)) != 0 {
		t.Errorf("result %s after %d calls, want FAILURE before any", run.result, len(s.calls(t)))
	}
	assertContains(t, run.output, "waitOn: '<label>'")
}

// stepJenkinsfile writes a Jenkinsfile of one stage, 'Deploy', under the
// pipeline agent agent, whose steps are buildlock(args) { body }, and
// returns its path.
func stepJenkinsfile(t *testing.T, agent, args, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Jenkinsfile")
	if err := os.WriteFile(path, []byte(`@Library('buildlock') _
pipeline {
  `+agent+`
  stages {
    stage('Deploy') {
      steps {
        buildlock(`+args+`) {
          `+body+`
        }
      }
    }
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
