// Package doctest reads the repository's Markdown docs for the tests that
// hold the docs' factual claims (flags and defaults, exit codes, reasons,
// platforms, what is watched) to the code: a claim that drifts from the code
// fails a test.
package doctest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// RepoRoot finds the repository root (the directory holding go.mod and
// config/crd/bases) from the working directory upwards, so that tests in any
// package find the docs, CRDs and binaries.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "config", "crd", "bases")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod with config/crd/bases above the working directory")
		}
		dir = parent
	}
}

// Table returns the rows of the first table under the heading titled
// heading (any level) of the Markdown file at path, relative to the
// repository root: one slice of trimmed cells per row, without the header
// and separator rows. The docs tests hold the docs' factual claims to the
// code through it.
func Table(path, heading string) ([][]string, error) {
	section, err := Section(path, heading)
	if err != nil {
		return nil, err
	}
	rows := tableRows(section)
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no table under the heading %q", path, heading)
	}
	return rows, nil
}

// tableRows returns the rows of the first table of a Markdown text, without
// its header and separator rows.
func tableRows(section string) [][]string {
	var rows [][]string
	inTable := false
	for _, line := range strings.Split(section, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		if !inTable { // the header row
			inTable = true
			continue
		}
		cells := splitRow(line)
		if len(cells) > 0 && strings.Trim(cells[0], "-: ") == "" {
			continue // the separator row
		}
		rows = append(rows, cells)
	}
	return rows
}

// splitRow splits a table row into its trimmed cells; a pipe inside a code
// span does not end a cell.
func splitRow(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cell strings.Builder
	inCode := false
	for _, r := range line {
		switch {
		case r == '`':
			inCode = !inCode
		case r == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
			continue
		}
		cell.WriteRune(r)
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

// Section returns the text under the heading titled heading (any level)
// of the Markdown file at path, relative to the repository root, up to the
// next heading of the same or a higher level. Lines in fenced code blocks
// are never headings.
func Section(path, heading string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return "", err
	}
	section, ok := sectionOf(string(data), heading)
	if !ok {
		return "", fmt.Errorf("%s has no heading %q", path, heading)
	}
	return section, nil
}

// sectionOf returns the text under the heading titled heading of doc, up to
// the next heading of the same or a higher level, and whether doc has it.
func sectionOf(doc, heading string) (string, bool) {
	var out []string
	level := 0
	for _, h := range Headings(doc) {
		if level == 0 && h.Title == heading {
			level = h.Level
			out = append(out, h.Body)
			continue
		}
		if level > 0 {
			if h.Level <= level {
				break
			}
			out = append(out, h.Body)
		}
	}
	return strings.Join(out, "\n"), level > 0
}

// Heading is one heading of a Markdown document and the text under it, up to
// the next heading of any level.
type Heading struct {
	Level int
	Title string
	Body  string
}

var atxHeading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// Headings splits a Markdown document at its ATX headings; lines in fenced
// code blocks are never headings. Text before the first heading is a
// Heading of level 0.
func Headings(doc string) []Heading {
	headings := []Heading{{}}
	var body []string
	fence := ""
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```"), strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
		default:
			if m := atxHeading.FindStringSubmatch(line); m != nil {
				headings[len(headings)-1].Body = strings.Join(body, "\n")
				headings = append(headings, Heading{Level: len(m[1]), Title: m[2]})
				body = nil
				continue
			}
		}
		body = append(body, line)
	}
	headings[len(headings)-1].Body = strings.Join(body, "\n")
	return headings
}

// CodeSpan returns the text of the first code span (`...`) of s, if any.
func CodeSpan(s string) (string, bool) {
	_, rest, ok := strings.Cut(s, "`")
	if !ok {
		return "", false
	}
	span, _, ok := strings.Cut(rest, "`")
	if !ok {
		return "", false
	}
	return span, true
}
