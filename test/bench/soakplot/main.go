// Command soakplot draws the samples of the soak (test/chaos TestSoak's
// -chaos.soak-csv) with gonum/plot, as the benchmarks' plot is drawn: four
// panels against minutes, the manager's memory (heap in use and resident),
// its goroutines, its established TCP connections, and the objects of the
// workload's namespaces in the API. `make soak` runs it on the run's CSV; it
// lives in the benchmarks' module so that the plotting libraries stay out of
// the operator's go.mod.
//
// Usage:
//
//	go run ./soakplot -csv /tmp/buildlock-soak.csv -out ../../docs/soak.svg -title "bin/manager over a 30m soak"
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

func main() {
	in := flag.String("csv", "", "the soak's samples (TestSoak's -chaos.soak-csv)")
	out := flag.String("out", "docs/soak.svg", "the SVG to write")
	title := flag.String("title", "bin/manager over a soak (chaos workload, control-plane episodes, partitions)", "the plot's title")
	flag.Parse()
	if err := run(*in, *out, *title); err != nil {
		fmt.Fprintf(os.Stderr, "soakplot: %v\n", err)
		os.Exit(1)
	}
}

func run(in, out, title string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	cols, err := readColumns(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", in, err)
	}
	svg, err := Plot(cols, title)
	if err != nil {
		return err
	}
	w, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := svg.WriteTo(w); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

// readColumns reads a CSV with a header line into its columns by name.
func readColumns(r io.Reader) (map[string][]float64, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 {
		return nil, errors.New("no samples")
	}
	cols := map[string][]float64{}
	for i, row := range rows[1:] {
		for j, name := range rows[0] {
			v, err := strconv.ParseFloat(row[j], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d, %s: %w", i+2, name, err)
			}
			cols[name] = append(cols[name], v)
		}
	}
	return cols, nil
}

// panel is one of the stacked plots: its title and the columns it draws.
type panel struct {
	title   string
	columns []string
	labels  []string
}

// Panels are the plot's, top to bottom.
var Panels = []panel{
	{"memory (MiB)", []string{"heap_inuse_mib", "rss_mib"}, []string{"heap in use", "resident"}},
	{"goroutines", []string{"goroutines"}, []string{"goroutines"}},
	{"established TCP connections", []string{"established_connections"}, []string{"connections"}},
	{"pods, BuildLocks and Leases in the workload's namespaces", []string{"objects"}, []string{"objects"}},
}

// Plot draws the columns (seconds and each panel's) as stacked panels.
func Plot(cols map[string][]float64, title string) (*vgsvg.Canvas, error) {
	seconds, ok := cols["seconds"]
	if !ok {
		return nil, errors.New("no seconds column")
	}
	plots := make([][]*plot.Plot, len(Panels))
	colors := []color.Color{color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xae, 0xc7, 0xe8, 0xff}}
	for i, pn := range Panels {
		p := plot.New()
		p.Title.Text = pn.title
		if i == 0 {
			p.Title.Text = title + "\n\n" + pn.title
		}
		p.X.Label.Text = "minutes"
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		for k, name := range pn.columns {
			ys, ok := cols[name]
			if !ok {
				return nil, fmt.Errorf("no %s column", name)
			}
			xys := make(plotter.XYs, len(seconds))
			for j := range seconds {
				xys[j] = plotter.XY{X: seconds[j] / 60, Y: ys[j]}
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			line.Color = colors[k%len(colors)]
			line.Width = vg.Points(1.5)
			p.Add(line)
			p.Legend.Add(pn.labels[k], line)
		}
		plots[i] = []*plot.Plot{p}
	}
	const width, panelHeight = 8 * vg.Inch, 2.2 * vg.Inch
	canvas := vgsvg.New(width, panelHeight*vg.Length(len(Panels)))
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: len(Panels), Cols: 1, PadX: vg.Millimeter, PadY: 3 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	for i, row := range plot.Align(plots, tiles, dc) {
		plots[i][0].Draw(row[0])
	}
	return canvas, nil
}
