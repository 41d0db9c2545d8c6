package controller_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/testenv"
)

// homes are the files where the operator's defaults are defined: the
// settings in DefaultOptions, the values the API shares in api/v1alpha1,
// and the arbiter's copies of those (it imports only the standard library;
// TestValuesAreTheAPIs keeps them equal).
var homes = map[string]bool{
	"internal/controller/options.go": true,
	"api/v1alpha1/values.go":         true,
	"internal/arbiter/arbiter.go":    true,
}

// defaultName is what a constant or variable holding a copy of one of the
// operator's defaults would be called.
var defaultName = regexp.MustCompile(`(?i)^default.*(ttl|workers|retention|settle|skew|jump|address|elect|secure)`)

// TestDefaultsAreDefinedOnce greps the repository's sources for the
// operator's defaults outside their one place: no flag of the operator's
// settings has a default of its own, and nothing outside DefaultOptions
// sets one of its settings (a field of Options that has a default) to a
// constant other than its zero value ("off", "none") or declares a
// Default* of its own. cmd/manager's flags default to the setting they set.
func TestDefaultsAreDefinedOnce(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	settings := settingsWithDefaults()
	flags := managerFlags(t, filepath.Join(root, "cmd", "manager", "main.go"), settings)
	if len(flags) < len(settings)-1 { // RequesterSettle has no flag
		t.Errorf("cmd/manager has flags for %v, want one for each of %v but RequesterSettle", flags, settings)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "bin" || name == "vendor" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || homes[rel] {
			return nil
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		report := func(n ast.Node, format string, args ...any) {
			t.Errorf("%s: "+format, append([]any{fset.Position(n.Pos())}, args...)...)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for _, name := range n.Names {
					if defaultName.MatchString(name.Name) {
						report(n, "%s repeats a default: use controller.DefaultOptions (or api/v1alpha1's)", name.Name)
					}
				}
			case *ast.CompositeLit:
				if !isOptions(n.Type) {
					return true
				}
				for _, elt := range n.Elts {
					if kv, ok := elt.(*ast.KeyValueExpr); ok && settings[identName(kv.Key)] && nonZeroConstant(kv.Value) {
						report(kv, "%s is set to a constant: take it from controller.DefaultOptions", identName(kv.Key))
					}
				}
			case *ast.AssignStmt:
				// o.Workers = 4, or workers = 4 for a local copy.
				for i, lhs := range n.Lhs {
					if name := settingNamed(lhs, settings); name != "" && i < len(n.Rhs) && nonZeroConstant(n.Rhs[i]) {
						report(n, "%s is set to a constant: take it from controller.DefaultOptions", name)
					}
				}
			case *ast.CallExpr:
				if field, def, ok := flagOf(n, flags); ok && nonZeroConstant(def) {
					report(n, "the flag of %s has a default of its own: take it from controller.DefaultOptions", field)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// settingsWithDefaults names the fields of Options that DefaultOptions
// gives a value.
func settingsWithDefaults() map[string]bool {
	settings := map[string]bool{}
	v := reflect.ValueOf(controller.DefaultOptions())
	for i := range v.NumField() {
		if !v.Field(i).IsZero() {
			settings[v.Type().Field(i).Name] = true
		}
	}
	return settings
}

// isOptions reports whether a composite literal's type is the operator's
// options (controller.Options, or testenv.ManagerOptions).
func isOptions(typ ast.Expr) bool {
	switch typ := typ.(type) {
	case *ast.Ident:
		return typ.Name == "Options" || typ.Name == "ManagerOptions"
	case *ast.SelectorExpr:
		pkg := identName(typ.X)
		return pkg == "controller" && typ.Sel.Name == "Options" || pkg == "testenv" && typ.Sel.Name == "ManagerOptions"
	}
	return false
}

// managerFlags reads cmd/manager's flags of the operator's settings,
// flag.XxxVar(&o.Field, "name", default, usage), and checks that each
// defaults to the value it sets (o.Field, from DefaultOptions). It returns
// the settings by flag name.
func managerFlags(t *testing.T, path string, settings map[string]bool) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]string{}
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 4 {
			return true
		}
		addr, ok := call.Args[0].(*ast.UnaryExpr)
		if !ok || addr.Op != token.AND {
			return true
		}
		sel, ok := addr.X.(*ast.SelectorExpr)
		name, isLit := call.Args[1].(*ast.BasicLit)
		if !ok || !isLit || !settings[sel.Sel.Name] {
			return true
		}
		flags[strings.Trim(name.Value, `"`)] = sel.Sel.Name
		if def, ok := call.Args[2].(*ast.SelectorExpr); !ok || def.Sel.Name != sel.Sel.Name || identName(def.X) != identName(sel.X) {
			t.Errorf("%s: --%s must default to the value it sets, %s.%s (controller.DefaultOptions)",
				fset.Position(call.Pos()), strings.Trim(name.Value, `"`), identName(sel.X), sel.Sel.Name)
		}
		return true
	})
	return flags
}

// flagOf recognizes the definition of one of the operator's flags,
// flag.XxxVar(p, "name", default, usage) or flag.Xxx("name", default,
// usage), and returns its setting and default.
func flagOf(call *ast.CallExpr, flags map[string]string) (string, ast.Expr, bool) {
	for i, arg := range call.Args {
		lit, ok := arg.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || i+1 >= len(call.Args) {
			continue
		}
		if field, ok := flags[strings.Trim(lit.Value, "`\"")]; ok {
			return field, call.Args[i+1], true
		}
	}
	return "", nil, false
}

// settingNamed is the setting that e names (o.Workers, or a local
// workers), or "".
func settingNamed(e ast.Expr, settings map[string]bool) string {
	name := identName(e)
	if sel, ok := e.(*ast.SelectorExpr); ok {
		name = sel.Sel.Name
	}
	for s := range settings {
		if strings.EqualFold(s, name) {
			return s
		}
	}
	return ""
}

// nonZeroConstant reports whether e is spelled with literals (or the time
// package's units) and is not a zero value: a default written out.
func nonZeroConstant(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Value != "0" && e.Value != `""` && e.Value != "``"
	case *ast.Ident:
		return e.Name == "true"
	case *ast.SelectorExpr:
		return identName(e.X) == "time"
	case *ast.BinaryExpr:
		return literalOnly(e.X) && literalOnly(e.Y) && (nonZeroConstant(e.X) || nonZeroConstant(e.Y))
	case *ast.ParenExpr:
		return nonZeroConstant(e.X)
	case *ast.CallExpr:
		return len(e.Args) == 1 && nonZeroConstant(e.Args[0]) // time.Duration(4), int64(1000)
	}
	return false
}

// literalOnly reports whether e is made of literals and the time package's
// units alone.
func literalOnly(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return true
	case *ast.SelectorExpr:
		return identName(e.X) == "time"
	case *ast.BinaryExpr:
		return literalOnly(e.X) && literalOnly(e.Y)
	case *ast.ParenExpr:
		return literalOnly(e.X)
	}
	return false
}

func identName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
