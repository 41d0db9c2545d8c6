package chart

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// dockerfile is what the tests read from the Dockerfile.
type dockerfile struct {
	builderImage string   // the first stage's image
	buildCommand string   // the builder's `go build` command, as the shell runs it
	copies       []string // what the builder copies from the context besides go.mod and go.sum
	final        []string // the final stage's instructions, one per line
}

var (
	mountOpt  = regexp.MustCompile(`^--mount=\S+\s+`)
	stageLine = regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)`)
)

// parseDockerfile reads the repository's Dockerfile: its stages, the RUN line
// with `go build`, and the COPY sources of the builder.
func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	stage := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			t.Fatalf("Dockerfile: keep each instruction on one line so that the tests read it as Docker does: %q", line)
		}
		if m := stageLine.FindStringSubmatch(line); m != nil {
			stage++
			if stage == 1 {
				d.builderImage = m[1]
			}
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch {
		case stage > 1:
			d.final = append(d.final, line)
		case strings.EqualFold(instr, "RUN") && strings.Contains(rest, "go build"):
			cmd := strings.TrimSpace(rest)
			for mountOpt.MatchString(cmd) {
				cmd = mountOpt.ReplaceAllString(cmd, "")
			}
			d.buildCommand = cmd
		case strings.EqualFold(instr, "COPY"):
			for _, src := range strings.Fields(rest)[:len(strings.Fields(rest))-1] {
				if src != "go.mod" && src != "go.sum" {
					d.copies = append(d.copies, strings.TrimSuffix(src, "/"))
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if d.buildCommand == "" {
		t.Fatal("Dockerfile: no RUN line with `go build`")
	}
	return d
}

var (
	managerOnce sync.Once
	managerPath string
	managerErr  error
)

// buildManager builds ./cmd/manager with the Dockerfile's own `go build` line
// (for this machine's OS and architecture, into a temporary directory), once
// per test binary.
func buildManager(t *testing.T) string {
	t.Helper()
	d := parseDockerfile(t)
	root := repoRoot(t)
	managerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "buildlock-manager-")
		if err != nil {
			managerErr = err
			return
		}
		managerPath = filepath.Join(dir, "manager")
		if !strings.Contains(d.buildCommand, "-o /out/manager") {
			managerErr = fmt.Errorf("the Dockerfile's build line must write -o /out/manager (the final stage copies it from there): %s", d.buildCommand)
			return
		}
		script := strings.Replace(d.buildCommand, "-o /out/manager", "-o "+managerPath, 1)
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "TARGETOS="+runtime.GOOS, "TARGETARCH="+runtime.GOARCH)
		if out, err := cmd.CombinedOutput(); err != nil {
			managerErr = fmt.Errorf("building the manager as the Dockerfile does (%s): %w\n%s", script, err, out)
		}
	})
	if managerErr != nil {
		t.Fatal(managerErr)
	}
	return managerPath
}

// TestMain removes the manager binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if managerPath != "" {
		_ = os.RemoveAll(filepath.Dir(managerPath))
	}
	os.Exit(code)
}

// TestDockerfile builds the manager exactly as the Dockerfile does and checks
// the image's promises: a static binary (distroless static has no libc), a
// non-root final stage without a shell, every package the manager needs in
// the build context, and the Go version of go.mod.
func TestDockerfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the manager; skipped with -short")
	}
	d := parseDockerfile(t)
	root := repoRoot(t)

	t.Run("the build line is a static, CGO-free build of ./cmd/manager", func(t *testing.T) {
		for _, want := range []string{"CGO_ENABLED=0", "go build", "./cmd/manager"} {
			if !strings.Contains(d.buildCommand, want) {
				t.Errorf("the Dockerfile's build line lacks %q: %s", want, d.buildCommand)
			}
		}
		bin := buildManager(t)
		f, err := elf.Open(bin)
		if err != nil {
			t.Skipf("not an ELF binary on %s; the static check needs Linux: %v", runtime.GOOS, err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("the manager is dynamically linked (program header %s); distroless static has no libc", p.Type)
			}
		}
	})

	t.Run("the final stage is distroless static:nonroot, runs as 65532 and has no shell", func(t *testing.T) {
		if len(d.final) == 0 || !strings.Contains(d.final[0], "gcr.io/distroless/static:nonroot") {
			t.Fatalf("the final stage must be FROM gcr.io/distroless/static:nonroot, is %q", d.final)
		}
		var user, entrypoint string
		for _, line := range d.final {
			instr, rest, _ := strings.Cut(line, " ")
			switch strings.ToUpper(instr) {
			case "RUN", "SHELL":
				t.Errorf("the final stage has no shell: %q cannot run", line)
			case "USER":
				user = strings.TrimSpace(rest)
			case "ENTRYPOINT":
				entrypoint = strings.TrimSpace(rest)
			}
		}
		if user != "65532:65532" {
			t.Errorf("USER is %q, want 65532:65532 (the chart's runAsUser, and numeric for runAsNonRoot)", user)
		}
		if entrypoint != `["/manager"]` {
			t.Errorf(`ENTRYPOINT is %q, want the exec form ["/manager"] (no shell to run a string)`, entrypoint)
		}
	})

	t.Run("the build context holds every package of the manager's module", func(t *testing.T) {
		list := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/manager")
		list.Dir = root
		out, err := list.Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		ignored := dockerignoreExcludes(t, root)
		for _, dir := range strings.Fields(string(out)) {
			rel, _ := filepath.Rel(root, dir)
			copied := false
			for _, src := range d.copies {
				if rel == src || strings.HasPrefix(rel, src+"/") {
					copied = true
				}
			}
			if !copied {
				t.Errorf("the manager imports ./%s, which the Dockerfile does not COPY (it copies %v)", rel, d.copies)
			}
			for _, ex := range ignored {
				if rel == ex || strings.HasPrefix(rel, ex+"/") {
					t.Errorf("the manager imports ./%s, which .dockerignore excludes (%s)", rel, ex)
				}
			}
		}
	})

	t.Run("the builder image's Go is go.mod's", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
		if m == nil {
			t.Fatal("go.mod has no go directive")
		}
		if want := "golang:" + string(m[1]); !strings.HasPrefix(d.builderImage, want) {
			t.Errorf("the builder image is %s; go.mod says go %s, so use %s", d.builderImage, m[1], want)
		}
	})
}

// dockerignoreExcludes returns the directories .dockerignore excludes after
// its allow-list (lines without wildcards or "!").
func dockerignoreExcludes(t *testing.T, root string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") || strings.ContainsAny(line, "*?[") {
			continue
		}
		dirs = append(dirs, strings.TrimSuffix(line, "/"))
	}
	return dirs
}
