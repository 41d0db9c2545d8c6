package main

import (
	"flag"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/doctest"
)

// TestOperationsDocumentsEveryFlag holds the flags table of
// docs/operations.md to the manager's flag set: a row for every flag
// (controller-runtime's logging flags too) and no row for a flag the
// manager does not have, each with the flag's default. A default cell's
// first code span is the default it claims (a duration compares as a
// duration: `1h` is 1h0m0s); a flag without a default (an empty string)
// must say so in words, with no code span.
func TestOperationsDocumentsEveryFlag(t *testing.T) {
	rows, err := doctest.Table("docs/operations.md", "Flags and defaults")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	for _, row := range rows {
		name, ok := doctest.CodeSpan(row[0])
		if !ok || !strings.HasPrefix(name, "--") || len(row) < 3 {
			t.Errorf("docs/operations.md: the flags table's row %q does not start with a flag in a code span", strings.Join(row, " | "))
			continue
		}
		documented[strings.TrimPrefix(name, "--")] = row[1]
	}

	o, namespaces, zapOpts := controller.DefaultOptions(), "", zap.Options{}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	bindFlags(fs, &o, &namespaces, &zapOpts)
	fs.VisitAll(func(f *flag.Flag) {
		cell, ok := documented[f.Name]
		if !ok {
			t.Errorf("--%s (default %q) has no row in docs/operations.md's flags table", f.Name, f.DefValue)
			return
		}
		delete(documented, f.Name)
		if problem := defaultProblem(f, cell); problem != "" {
			t.Errorf("docs/operations.md: --%s: %s", f.Name, problem)
		}
	})
	for name := range documented {
		t.Errorf("docs/operations.md documents --%s, which the manager does not have", name)
	}
}

// defaultProblem says how the default a table cell claims differs from the
// flag's, or "" when it agrees.
func defaultProblem(f *flag.Flag, cell string) string {
	claimed, hasValue := doctest.CodeSpan(cell)
	switch {
	case f.DefValue == "" && hasValue:
		return "the table says its default is `" + claimed + "`, but it has none (say what happens without it, in words)"
	case f.DefValue == "":
		return ""
	case !hasValue:
		return "the table gives no default in a code span; the default is `" + f.DefValue + "`"
	}
	if getter, ok := f.Value.(flag.Getter); ok {
		if want, isDuration := getter.Get().(time.Duration); isDuration {
			got, err := time.ParseDuration(claimed)
			if err != nil || got != want {
				return "the table says its default is `" + claimed + "`; it is " + want.String()
			}
			return ""
		}
	}
	if claimed != f.DefValue {
		return "the table says its default is `" + claimed + "`; it is `" + f.DefValue + "`"
	}
	return ""
}
