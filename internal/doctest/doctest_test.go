package doctest

import (
	"slices"
	"testing"
)

const doc = "intro\n" +
	"# Title\n" +
	"## Flags\n" +
	"text\n" +
	"| flag | default |\n" +
	"|---|---|\n" +
	"| `--a` | `1h` |\n" +
	"| `--b` | `x|y` (a pipe in code) |\n" +
	"\n" +
	"| second | table |\n" +
	"|---|---|\n" +
	"| no | |\n" +
	"### Sub\n" +
	"```sh\n" +
	"# not a heading\n" +
	"```\n" +
	"## Next\n" +
	"| other | table |\n" +
	"|---|---|\n" +
	"| c | d |\n"

func TestSectionAndTable(t *testing.T) {
	section, ok := sectionOf(doc, "Flags")
	if !ok {
		t.Fatal("no section Flags")
	}
	rows := tableRows(section)
	want := [][]string{{"`--a`", "`1h`"}, {"`--b`", "`x|y` (a pipe in code)"}}
	if !slices.EqualFunc(rows, want, slices.Equal[[]string]) {
		t.Errorf("rows = %q, want %q (the first table only)", rows, want)
	}
	if _, ok := sectionOf(doc, "not a heading"); ok {
		t.Error("a line in a code block was taken for a heading")
	}
	if next, _ := sectionOf(doc, "Next"); tableRows(next)[0][0] != "c" {
		t.Errorf("section Next = %q", next)
	}
	sub, _ := sectionOf(doc, "Sub")
	if want := "```sh\n# not a heading\n```"; sub != want {
		t.Errorf("section Sub = %q, want %q (up to the next heading of its level or higher)", sub, want)
	}
}

func TestHeadings(t *testing.T) {
	var titles []string
	for _, h := range Headings(doc) {
		titles = append(titles, h.Title)
	}
	if want := []string{"", "Title", "Flags", "Sub", "Next"}; !slices.Equal(titles, want) {
		t.Errorf("headings = %q, want %q", titles, want)
	}
}

func TestCodeSpan(t *testing.T) {
	for in, want := range map[string]string{"`1h`": "1h", "none: `info` then": "info", "all": "", "`open": ""} {
		got, ok := CodeSpan(in)
		if got != want || ok != (want != "") {
			t.Errorf("CodeSpan(%q) = %q, %t; want %q", in, got, ok, want)
		}
	}
}
