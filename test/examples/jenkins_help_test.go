package examples

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestJenkinsHelpPageDocumentsTheStep: vars/buildlock.txt, the help page
// Jenkins shows for the step (Pipeline Syntax, Global Variables Reference),
// documents exactly the arguments vars/buildlock.groovy accepts, marks the
// required one, and its example calls the step with arguments it accepts.
func TestJenkinsHelpPageDocumentsTheStep(t *testing.T) {
	step := mustRead(t, "vars/buildlock.groovy")
	help := mustRead(t, "vars/buildlock.txt")
	m := regexp.MustCompile(`def known = \[([^\]]*)\]`).FindStringSubmatch(step)
	if m == nil {
		t.Fatal("vars/buildlock.groovy: no `def known = [...]` list of arguments")
	}
	var known []string
	for _, q := range regexp.MustCompile(`'([^']+)'`).FindAllStringSubmatch(m[1], -1) {
		known = append(known, q[1])
	}
	var documented []string
	for _, d := range regexp.MustCompile(`<dt><code>(\w+)</code>`).FindAllStringSubmatch(help, -1) {
		documented = append(documented, d[1])
	}
	slices.Sort(known)
	slices.Sort(documented)
	if !slices.Equal(known, documented) {
		t.Errorf("vars/buildlock.txt documents the arguments %v; vars/buildlock.groovy accepts %v", documented, known)
	}
	if !strings.Contains(help, "<dt><code>target</code> (required)</dt>") {
		t.Error("vars/buildlock.txt does not say that target is required")
	}
	for _, call := range regexp.MustCompile(`buildlock\(([^)]*)\)`).FindAllStringSubmatch(help, -1) {
		for _, arg := range regexp.MustCompile(`(\w+):`).FindAllStringSubmatch(call[1], -1) {
			if !slices.Contains(known, arg[1]) {
				t.Errorf("vars/buildlock.txt calls buildlock(%s): the step has no argument %s", call[1], arg[1])
			}
		}
	}
	if strings.Contains(help, "<script") || strings.Contains(help, "javascript:") {
		t.Error("vars/buildlock.txt must be plain markup: Jenkins's markup formatter strips scripts")
	}
}
