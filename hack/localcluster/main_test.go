//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// localcluster is `make run` as the user starts it: the binary built from
// this package (RunChildIfAsked must run first in its main, which `go run`
// or a test binary would not show).
func buildLocalcluster(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "localcluster")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("building localcluster: %v\n%s", err, out)
	}
	return bin
}

// pipedRun is `make run 2>&1 | tee log` in a process group of its own, as a
// terminal starts a pipeline: localcluster's output goes through cat, as
// through tee. Its lines arrive on lines until the pipe closes.
type pipedRun struct {
	cmd   *exec.Cmd
	lines chan string
	text  strings.Builder
	done  chan struct{}
}

func startPiped(t *testing.T, bin string) *pipedRun {
	t.Helper()
	cmd := exec.Command("sh", "-c", `"$0" 2>&1 | cat`, bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Dir = repoRoot(t)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &pipedRun{cmd: cmd, lines: make(chan string, 10000), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	})
	return r
}

// readUntil reads the output until a line matches re, and returns the
// line's submatches.
func (r *pipedRun) readUntil(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				t.Fatalf("the output ended before a line matching %s:\n%s", re, r.text.String())
			}
			r.text.WriteString(line + "\n")
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("no line matching %s within %s:\n%s", re, timeout, r.text.String())
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// controlPlane is what localcluster started: its etcd and kube-apiserver
// (children of pid), and every directory they and it wrote.
type controlPlane struct {
	pids []int
	dirs []string
}

// childrenOf returns the processes whose parent is pid, by name.
func childrenOf(t *testing.T, pid int) map[string]int {
	t.Helper()
	out := map[string]int{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndex(s, ")")+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			comm := s[strings.Index(s, "(")+1 : strings.LastIndex(s, ")")]
			out[comm] = child
		}
	}
	return out
}

// observe finds localcluster in the pipeline, and its control plane.
func observe(t *testing.T, r *pipedRun, kubeconfigDir string) (int, controlPlane) {
	t.Helper()
	var lc int
	for name, pid := range childrenOf(t, r.cmd.Process.Pid) {
		if name == "localcluster" {
			lc = pid
		}
	}
	if lc == 0 {
		t.Fatalf("no localcluster under the shell %d", r.cmd.Process.Pid)
	}
	cp := controlPlane{dirs: []string{kubeconfigDir}}
	children := childrenOf(t, lc)
	for _, name := range []string{"etcd", "kube-apiserver"} {
		pid, ok := children[name]
		if !ok {
			t.Fatalf("localcluster %d has no %s child: %v", lc, name, children)
		}
		cp.pids = append(cp.pids, pid)
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			t.Fatal(err)
		}
		for _, arg := range strings.Split(string(cmdline), "\x00") {
			for _, flag := range []string{"--data-dir=", "--cert-dir="} {
				if dir, ok := strings.CutPrefix(arg, flag); ok {
					cp.dirs = append(cp.dirs, dir)
				}
			}
		}
	}
	if len(cp.dirs) < 3 {
		t.Fatalf("found the directories %v, want the kubeconfig's, etcd's data and the API server's certificates", cp.dirs)
	}
	return lc, cp
}

// gone waits until every process of cp has exited and its directories are
// removed; it fails the test with what is left.
func (cp controlPlane) gone(t *testing.T, dirsToo bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, pid := range cp.pids {
			if stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); err == nil && !strings.Contains(string(stat), ") Z ") {
				left = append(left, "process "+strconv.Itoa(pid))
			}
		}
		if dirsToo {
			for _, d := range cp.dirs {
				if _, err := os.Stat(d); err == nil {
					left = append(left, "directory "+d)
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there %s later: %v", timeout, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var (
	kubeconfigLine = regexp.MustCompile(`^export KUBECONFIG=(\S+)`)
	metricsLine    = regexp.MustCompile(`curl (http://\S+/metrics)`)
)

// TestMakeRunServesMetricsAndStopsCleanlyWhenPiped: `make run 2>&1 | tee
// log` says where the operator's metrics are, serves buildlock's own there,
// and on Ctrl-C (SIGINT to the whole pipeline, tee included, so that
// writing to it fails) stops etcd and kube-apiserver and removes every
// file it wrote.
func TestMakeRunServesMetricsAndStopsCleanlyWhenPiped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	if os.Getenv("BUILDLOCK_TEST_PIPED_STOP") == "" {
		// Known bug, open (issue 33): now and then (2 of 6 .ci/runs on
		// 2026-12-03, once on a quiet machine) the local control plane's
		// files are still there 3 minutes after Ctrl-C, the cleanup hung;
		// it passes alone in about 30 s. Off in make test until it is found
		// (docs/runs/2026-12-03-make-test-loaded.md).
		t.Skip("set BUILDLOCK_TEST_PIPED_STOP=1: the piped Ctrl-C cleanup hangs now and then (issue 33, open)")
	}
	r := startPiped(t, buildLocalcluster(t))
	kubeconfig := r.readUntil(t, kubeconfigLine, 5*time.Minute)[1]
	url := r.readUntil(t, metricsLine, 10*time.Second)[1]
	lc, cp := observe(t, r, filepath.Dir(kubeconfig))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var body []byte
	for body == nil || !bytes.Contains(body, []byte("buildlock_")) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		if ctx.Err() != nil {
			t.Fatalf("%s serves no buildlock metrics: %v\n%.500s", url, err, body)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Ctrl-C, as the terminal sends it: to the whole process group.
	if err := syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	cp.pids = append(cp.pids, lc)
	defer func() {
		if t.Failed() {
			for line := range r.lines {
				r.text.WriteString(line + "\n")
			}
			t.Logf("localcluster printed:\n%s", r.text.String())
		}
	}()
	cp.gone(t, true, 3*time.Minute)
}

// TestMakeRunsControlPlaneDiesWithIt: killed outright, localcluster cannot
// clean up, but its etcd and kube-apiserver die with it.
func TestMakeRunsControlPlaneDiesWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	r := startPiped(t, buildLocalcluster(t))
	kubeconfig := r.readUntil(t, kubeconfigLine, 5*time.Minute)[1]
	lc, cp := observe(t, r, filepath.Dir(kubeconfig))
	t.Cleanup(func() {
		for _, d := range cp.dirs {
			_ = os.RemoveAll(d)
		}
	})
	if err := syscall.Kill(lc, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cp.gone(t, false, 3*time.Minute)
}
