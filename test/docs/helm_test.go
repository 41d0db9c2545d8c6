package docs

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/buildlock/buildlock/internal/doctest"
)

// TestHelmIsWhereTheDocsSay: docs/install.md tells people to run `make
// helm` and find the pinned helm as bin/helm; make does link it there.
func TestHelmIsWhereTheDocsSay(t *testing.T) {
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	section, err := doctest.Section("docs/install.md", "Try it locally, with no cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"`make helm`", "`bin/helm`", `export PATH="$PWD/bin:$PATH"`} {
		if !strings.Contains(section, want) {
			t.Errorf(`docs/install.md's "Try it locally" does not say %s`, want)
		}
	}
	cmd := exec.Command("make", "--no-print-directory", "-n", "-B", "helm")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n helm: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ln -sf helm-v") || !strings.Contains(string(out), "/bin/helm") {
		t.Errorf("make helm does not link the pinned helm as bin/helm:\n%s", out)
	}
}
