package main

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/buildlock/buildlock/internal/doctest"
)

// TestTroubleshootingDocumentsEveryExitCode holds the exit-code table of
// docs/troubleshooting.md to the plugin's: the codes of exitCodesHelp (what
// `kubectl buildlock --help` prints, and which must name every exit code
// constant), one row each, and no other.
func TestTroubleshootingDocumentsEveryExitCode(t *testing.T) {
	help := helpExitCodes(t)
	for _, code := range []int{exitOK, exitError, exitUsage, exitSuperseded, exitTimeout, exitEnded, exitOtherRun} {
		if !slices.Contains(help, code) {
			t.Errorf("exitCodesHelp does not list exit code %d", code)
		}
	}

	rows, err := doctest.Table("docs/troubleshooting.md", "Exit codes of the plugin")
	if err != nil {
		t.Fatal(err)
	}
	var documented []int
	for _, row := range rows {
		codes, err := parseCodes(row[0])
		if err != nil {
			t.Errorf("docs/troubleshooting.md: exit code row %q: %v", row[0], err)
		}
		documented = append(documented, codes...)
	}
	slices.Sort(documented)
	if !slices.Equal(documented, help) {
		t.Errorf("docs/troubleshooting.md documents the exit codes %v; the plugin's are %v (exitCodesHelp)", documented, help)
	}
}

// helpExitCodes returns the codes exitCodesHelp lists, in order.
func helpExitCodes(t *testing.T) []int {
	t.Helper()
	row := regexp.MustCompile(`^  ([0-9][0-9, ]*[0-9]|[0-9])  `)
	var codes []int
	for _, line := range strings.Split(exitCodesHelp, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		c, err := parseCodes(m[1])
		if err != nil {
			t.Fatalf("exitCodesHelp: %q: %v", line, err)
		}
		codes = append(codes, c...)
	}
	slices.Sort(codes)
	return codes
}

// parseCodes reads "3" or "126, 127".
func parseCodes(cell string) ([]int, error) {
	var codes []int
	for _, field := range strings.Split(cell, ",") {
		code, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil {
			return nil, err
		}
		codes = append(codes, code)
	}
	return codes, nil
}
