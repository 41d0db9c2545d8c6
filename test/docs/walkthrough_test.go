package docs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/buildlock/buildlock/internal/doctest"
	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

// walkthrough is README's section that a newcomer types at the terminal.
const walkthrough = "Five minutes at the terminal"

// TestReadmeWalkthroughRuns runs README's five minutes at the terminal as
// written: on the local control plane and operator that `make run` starts
// (with the operator's defaults), every command of its sh blocks in order
// in one shell, `set -e`, from the repository root, with KUBECONFIG as `make
// run` prints it and the plugin freshly built on the PATH. `make` lines are
// what this test sets up itself. The output a console block shows must be
// the last lines of the block before it, word for word but for the AGE
// column of a table.
func TestReadmeWalkthroughRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script, shown := walkthroughScript(t)

	logs := &testenv.SyncBuffer{}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c, pluginDir := startMakeRun(ctx, t, root)

	sh := exec.CommandContext(ctx, "bash", "-c", script)
	sh.Dir = root
	sh.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "PLUGIN_DIR="+pluginDir, "HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &stdout, &stderr
	if err := sh.Run(); err != nil {
		t.Fatalf("README.md's %q failed: %v\nscript:\n%s\nstdout:\n%s\nstderr:\n%s\noperator:\n%s",
			walkthrough, err, script, stdout.String(), stderr.String(), logs.String())
	}
	if testing.Verbose() {
		t.Logf("README.md's %q printed:\n%s%s", walkthrough, stdout.String(), stderr.String())
	}
	outputs := strings.Split(stdout.String(), blockEnd+"\n")
	for i, want := range shown {
		if want == "" {
			continue
		}
		if problem := lastLinesDiffer(outputs[i], want); problem != "" {
			t.Errorf("README.md: the output shown after sh block %d is not what it prints: %s\nprinted:\n%s", i+1, problem, outputs[i])
		}
	}
}

// walkthroughScript is README's walk-through as one bash script, `set -e`:
// every line of its sh blocks but `make` lines (what the tests set up
// themselves), each block's output ended by blockEnd, with the test's
// plugin ($PLUGIN_DIR) first on PATH; and per sh block, the console block
// that follows it, if any.
func walkthroughScript(t *testing.T) (string, []string) {
	t.Helper()
	section, err := doctest.Section("README.md", walkthrough)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(section)
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	var shown []string // per sh block, the console block that follows it, if any
	for _, b := range blocks {
		switch b.lang {
		case "sh":
			for _, line := range strings.Split(b.text, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "make ") {
					continue
				}
				script.WriteString(line + "\n")
			}
			// The plugin this test built comes first, whatever bin/ holds.
			script.WriteString(`export PATH="$PLUGIN_DIR:$PATH"` + "\n")
			fmt.Fprintf(&script, "echo %s\n", blockEnd)
			shown = append(shown, "")
		case "console":
			if len(shown) == 0 {
				t.Fatalf("README.md: a console block before any sh block in %q", walkthrough)
			}
			shown[len(shown)-1] = b.text
		}
	}
	if len(shown) < 3 {
		t.Fatalf("README.md's %q has %d sh blocks; want the walk-through's", walkthrough, len(shown))
	}
	return script.String(), shown
}

// startMakeRun starts what `make run` starts, a local control plane and the
// operator in-process with its defaults, and builds the plugin; it returns
// the cluster and the plugin's directory. Both stop with the test.
func startMakeRun(ctx context.Context, t *testing.T, root string) (*localcluster.Cluster, string) {
	t.Helper()
	c, err := localcluster.Start(localcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	m, err := testenv.StartManager(ctx, c.Config, testenv.DefaultManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	pluginDir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(pluginDir, "kubectl-buildlock"), "./cmd/kubectl-buildlock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	return c, pluginDir
}

// blockEnd ends each sh block's output.
const blockEnd = "----- end of block -----"

// fencedBlock is a fenced code block: its info string's language and text.
type fencedBlock struct{ lang, text string }

// fencedBlocks returns the fenced code blocks of a Markdown text, in order.
func fencedBlocks(md string) []fencedBlock {
	var blocks []fencedBlock
	var cur *fencedBlock
	var lines []string
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &fencedBlock{lang: strings.TrimPrefix(trimmed, "```")}
			lines = nil
		case cur != nil && trimmed == "```":
			cur.text = strings.Join(lines, "\n")
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		}
	}
	return blocks
}

// lastLinesDiffer compares the last lines of out with want, word by word,
// skipping the words under a header's AGE column; it returns "" when they
// agree.
func lastLinesDiffer(out, want string) string {
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	wantLines := strings.Split(strings.TrimRight(want, "\n"), "\n")
	if len(got) < len(wantLines) {
		return fmt.Sprintf("it printed %d lines, the README shows %d", len(got), len(wantLines))
	}
	got = got[len(got)-len(wantLines):]
	age := -1
	for i := range wantLines {
		g, w := strings.Fields(got[i]), strings.Fields(wantLines[i])
		if i == 0 {
			for j, word := range w {
				if word == "AGE" {
					age = j
				}
			}
		}
		if len(g) != len(w) {
			return fmt.Sprintf("line %d: %q, the README shows %q", i+1, got[i], wantLines[i])
		}
		for j := range w {
			if j != age && g[j] != w[j] {
				return fmt.Sprintf("line %d: %q, the README shows %q", i+1, got[i], wantLines[i])
			}
		}
	}
	return ""
}
