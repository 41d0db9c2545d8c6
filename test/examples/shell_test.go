package examples

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/buildlock/buildlock/internal/testenv"
)

// scriptTimeout bounds one script: the stubs answer at once, so a script that
// runs longer hangs. It is generous: a Groovy emulation starts a JVM, which
// on a shared, loaded 2-core machine takes tens of seconds.
const scriptTimeout = 3 * time.Minute

// runScript writes script to a file and runs it as argv + [file] + args in
// dir with exactly env, the way a CI system hands a script to its shell. It
// returns the exit code and the combined output. The file is not executable:
// executing a file just written races with other tests' forks ("text file
// busy"), so the interpreter always comes first.
func runScript(t *testing.T, argv []string, script string, args []string, dir string, env []string) (int, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmdline := append(append(append([]string{}, argv...), file), args...)
	cmd := exec.CommandContext(ctx, cmdline[0], cmdline[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v timed out after %s; output:\n%s", argv, scriptTimeout, out.String())
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String()
	case err != nil:
		t.Fatalf("running %v: %v", argv, err)
	}
	return 0, out.String()
}

// repoFile returns the path of a file in the repository.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, filepath.FromSlash(rel))
}

// readYAML decodes one YAML document of the repository into v, strictly:
// a field the helper does not know is an error, so that nothing the CI
// system would act on is silently ignored by the emulation.
func readYAML(t *testing.T, rel string, v any) {
	t.Helper()
	data, err := os.ReadFile(repoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}
