package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/doctest"
)

// codeSpans matches every code span of a cell.
var codeSpans = regexp.MustCompile("`([^`]*)`")

// TestTheTrustTableCoversEveryInput holds docs/api.md's trust table (issue
// 31) to api/v1alpha1: every field of a BuildLock's spec, and every
// annotation, label and user extra the API names under buildlock.io/, has
// a row (named by a code span in the first column), and no row names a
// field or key that does not exist.
func TestTheTrustTableCoversEveryInput(t *testing.T) {
	rows, err := doctest.Table("docs/api.md", "The trust model")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, row := range rows {
		if len(row) != 4 {
			t.Errorf("docs/api.md, the trust table: the row %q has %d cells, not 4 (value, who may write it, what verifies it, what it can do unverified)", row[0], len(row))
		}
		spans := codeSpans.FindAllStringSubmatch(row[0], -1)
		if len(spans) == 0 {
			t.Errorf("docs/api.md, the trust table: the row %q names no value as a code span", row[0])
		}
		for _, m := range spans {
			documented[m[1]] = true
		}
		for _, cell := range row[1:] {
			if cell == "" {
				t.Errorf("docs/api.md, the trust table: the row %q has an empty cell", row[0])
			}
		}
	}

	inputs := map[string]bool{}
	spec := reflect.TypeOf(buildlockv1.BuildLockSpec{})
	for i := range spec.NumField() {
		name, _, _ := strings.Cut(spec.Field(i).Tag.Get("json"), ",")
		inputs["spec."+name] = true
	}
	root, err := doctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keysOf(t, filepath.Join(root, "api", "v1alpha1")) {
		inputs[key] = true
	}
	for input := range inputs {
		if !documented[input] {
			t.Errorf("docs/api.md, the trust table, has no row for %s (api/v1alpha1): who may write it, what verifies it, what it can do unverified", input)
		}
	}
	for value := range documented {
		if (strings.HasPrefix(value, "spec.") || strings.HasPrefix(value, "buildlock.io/")) && !inputs[value] {
			t.Errorf("docs/api.md, the trust table, names %s, which api/v1alpha1 does not define", value)
		}
	}
}

// keysOf returns the values of the string constants of the Go package in
// dir whose names end in Annotation, Label or Extra: the keys a client can
// write on an object or a user.
func keysOf(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				value, _ := strconv.Unquote(lit.Value)
				for _, suffix := range []string{"Annotation", "Label", "Extra"} {
					if strings.HasSuffix(name.Name, suffix) && strings.HasPrefix(value, "buildlock.io/") {
						keys = append(keys, value)
					}
				}
			}
			return true
		})
	}
	return keys
}
