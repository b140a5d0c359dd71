package loadgen

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePlot renders the TTFT and end-to-end latency CDFs and the
// throughput of every target side by side into a PNG file.
func WritePlot(path string, results []*TargetResults) error {
	ttft := cdfPlot("time to first token", results, func(r Result) time.Duration { return r.TTFT })
	e2e := cdfPlot("end-to-end latency", results, func(r Result) time.Duration { return r.Latency })
	tput, err := throughputPlot(results)
	if err != nil {
		return err
	}
	const w, h = 18 * vg.Inch, 5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{ttft, e2e, tput}}, tiles, dc)
	ttft.Draw(canvases[0][0])
	e2e.Draw(canvases[0][1])
	tput.Draw(canvases[0][2])
	png := vgimg.PngCanvas{Canvas: img}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := png.WriteTo(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func cdfPlot(title string, results []*TargetResults, of func(Result) time.Duration) *plot.Plot {
	p := plot.New()
	p.Title.Text = title + " (CDF)"
	p.X.Label.Text = "ms (log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	for i, tr := range results {
		var vals []float64
		for _, r := range tr.Results {
			if r.Err == "" {
				vals = append(vals, max(float64(of(r))/float64(time.Millisecond), 0.001))
			}
		}
		if len(vals) == 0 {
			continue
		}
		slices.Sort(vals)
		step := max(1, len(vals)/500)
		pts := make(plotter.XYs, 0, len(vals)/step+1)
		for j := 0; j < len(vals); j += step {
			pts = append(pts, plotter.XY{X: vals[j], Y: float64(j+1) / float64(len(vals))})
		}
		pts = append(pts, plotter.XY{X: vals[len(vals)-1], Y: 1})
		line, err := plotter.NewLine(pts)
		if err != nil {
			continue
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(2)
		p.Add(line)
		p.Legend.Add(tr.Target.Name, line)
	}
	return p
}

func throughputPlot(results []*TargetResults) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "throughput"
	p.Y.Label.Text = "requests per second"
	vals := make(plotter.Values, len(results))
	names := make([]string, len(results))
	for i, tr := range results {
		vals[i] = Summarize(tr).ReqPerSec
		names[i] = tr.Target.Name
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return nil, fmt.Errorf("bar chart: %w", err)
	}
	bars.Color = color.RGBA{R: 60, G: 110, B: 200, A: 255}
	p.Add(bars)
	p.NominalX(names...)
	return p, nil
}
