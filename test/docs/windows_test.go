package docs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/buildlock/buildlock/internal/doctest"
	"github.com/buildlock/buildlock/internal/localcluster"
)

// windowsSection is README's transcript of a freeze (issue 23).
const windowsSection = "Deploy windows and freezes"

// What differs from one run of the transcript to the next: instants, the
// freeze's window name (made of its start), and a table's trailing AGE.
var (
	transcriptInstant = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	transcriptWindow  = regexp.MustCompile(`freeze-\d{8}t\d{6}z`)
	transcriptAge     = regexp.MustCompile(`\s\d+[smh]$`)
)

// maskTranscript is a transcript line without what differs between runs,
// its words separated by single spaces.
func maskTranscript(line string) string {
	line = transcriptInstant.ReplaceAllString(line, "<instant>")
	line = transcriptWindow.ReplaceAllString(line, "freeze-<start>")
	line = transcriptAge.ReplaceAllString(strings.TrimRight(line, " "), " <age>")
	return strings.Join(strings.Fields(line), " ")
}

// TestReadmeWindowsTranscript runs the commands of README's deploy windows
// transcript in order on the local control plane and operator that `make
// run` starts, with the plugin freshly built, after README's walk-through
// (as a reader who follows the page does: its tokens go on from there):
// every line the README shows after a command must be among what that
// command (or a command it left in the background) printed, in order, but
// for instants, window names and ages. The README leaves some lines out,
// and says so.
func TestReadmeWindowsTranscript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	section, err := doctest.Section("README.md", windowsSection)
	if err != nil {
		t.Fatal(err)
	}
	var transcript string
	for _, b := range fencedBlocks(section) {
		if b.lang == "console" {
			transcript = b.text
		}
	}
	// Each command, then what the README shows of its output.
	var commands []string
	var shown [][]string
	for _, line := range strings.Split(transcript, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			commands = append(commands, cmd)
			shown = append(shown, nil)
		} else if len(commands) > 0 {
			shown[len(shown)-1] = append(shown[len(shown)-1], line)
		}
	}
	if len(commands) < 4 {
		t.Fatalf("README.md's %q shows %d commands; want its freeze transcript", windowsSection, len(commands))
	}
	// A command's output, and what a background command prints meanwhile,
	// is what comes before the next command's marker; the operator is given
	// a moment to act after each.
	var script strings.Builder
	script.WriteString("set -u\nexport PATH=\"$PLUGIN_DIR:$PATH\"\n")
	for i, cmd := range commands {
		fmt.Fprintf(&script, "echo %q\n", fmt.Sprintf("%s %d", blockEnd, i))
		if background, ok := strings.CutSuffix(strings.TrimSpace(cmd), "&"); ok {
			fmt.Fprintf(&script, "%s 2>&1 &\n", background)
		} else {
			fmt.Fprintf(&script, "%s 2>&1\n", cmd)
		}
		script.WriteString("sleep 3\n")
	}
	script.WriteString("wait\n")

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c, pluginDir := startMakeRun(ctx, t, root)
	kubectlDir := filepath.Dir(localcluster.KubectlPath(root))
	walk, _ := walkthroughScript(t)
	first := exec.CommandContext(ctx, "bash", "-c", walk)
	first.Dir = root
	first.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "PLUGIN_DIR="+pluginDir, "HOME="+t.TempDir())
	if out, err := first.CombinedOutput(); err != nil {
		t.Fatalf("README.md's %q, before the transcript, failed: %v\n%s", walkthrough, err, out)
	}
	sh := exec.CommandContext(ctx, "bash", "-c", script.String())
	sh.Dir = t.TempDir()
	sh.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "PLUGIN_DIR="+pluginDir+":"+kubectlDir, "HOME="+t.TempDir())
	var out bytes.Buffer
	sh.Stdout, sh.Stderr = &out, &out
	if err := sh.Run(); err != nil {
		t.Fatalf("README.md's %q failed: %v\nscript:\n%s\noutput:\n%s", windowsSection, err, script.String(), out.String())
	}
	printed := strings.Split(out.String(), blockEnd+" ")
	if len(printed) != len(commands)+1 {
		t.Fatalf("the transcript's commands printed %d sections, want %d:\n%s", len(printed)-1, len(commands), out.String())
	}
	for i, want := range shown {
		got := strings.Split(strings.TrimRight(printed[i+1], "\n"), "\n")[1:] // after the marker's number
		j := 0
		for _, w := range want {
			mw := maskTranscript(w)
			for j < len(got) && maskTranscript(got[j]) != mw {
				j++
			}
			if j == len(got) {
				t.Errorf("README.md: after %q it shows %q, which it did not print (in that order); it printed:\n%s", commands[i], w, strings.Join(got, "\n"))
				break
			}
			j++
		}
	}
}
