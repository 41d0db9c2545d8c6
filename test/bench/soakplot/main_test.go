package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// samples is a CSV as TestSoak writes it (writeSamplesCSV).
const samples = `seconds,heap_inuse_mib,rss_mib,goroutines,established_connections,open_fds,reconciles,objects
0,20.50,60.10,180,4,30,0,0
60,24.00,66.00,210,5,31,900,420
120,23.75,65.50,205,5,31,1800,415
`

// TestPlotDrawsEveryPanel plots a small soak into an SVG that parses, with
// each panel's title and legend; a CSV without a column fails.
func TestPlotDrawsEveryPanel(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "soak.csv"), filepath.Join(dir, "soak.svg")
	if err := os.WriteFile(in, []byte(samples), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, out, "bin/manager over a 2m soak"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG does not parse: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok && strings.TrimSpace(string(cd)) != "" {
			texts = append(texts, strings.TrimSpace(string(cd)))
		}
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"bin/manager over a 2m soak", "memory (MiB)", "heap in use", "resident", "goroutines", "established TCP connections", "minutes"} {
		if !strings.Contains(all, want) {
			t.Errorf("the plot has no text %q; it has:\n%s", want, all)
		}
	}
	if _, err := Plot(map[string][]float64{"seconds": {0}}, "x"); err == nil {
		t.Error("a CSV without the panels' columns was plotted")
	}
}
