package charts

import (
	"io"

	"gonum.org/v1/plot"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// LatencySeries is one configuration's response-time percentiles, in milliseconds.
type LatencySeries struct {
	Label               string // e.g. "single" or "sharded x3"
	P50, P95, P99, P999 float64
}

// LatencyGroup is one panel of a LatencyChart, typically one scenario.
type LatencyGroup struct {
	Name   string
	Series []LatencySeries
}

// LatencyChart draws p50/p95/p99/p99.9 as grouped bars, one panel per group and one bar
// colour per series. The scale is linear so bar heights compare directly.
type LatencyChart struct {
	Title  string
	Groups []LatencyGroup
}

// Render draws the chart in format f.
func (c LatencyChart) Render(w io.Writer, f Format) error {
	if len(c.Groups) == 0 {
		return ErrNoData
	}
	panels := make([]*plot.Plot, 0, len(c.Groups))
	for gi, g := range c.Groups {
		if len(g.Series) == 0 {
			return ErrNoData
		}
		title := g.Name
		if gi == 0 && c.Title != "" {
			title = c.Title + ": " + g.Name
		}
		p := newPlot(title, "", "response time (ms)")
		n := len(g.Series)
		top := 0.0
		width := vg.Points(min(18, 80/float64(n)))
		for i, s := range g.Series {
			top = max(top, s.P50, s.P95, s.P99, s.P999)
			bars, err := plotter.NewBarChart(plotter.Values{s.P50, s.P95, s.P99, s.P999}, width)
			if err != nil {
				return err
			}
			bars.Color = Color(i)
			bars.LineStyle.Width = 0
			bars.Offset = width * vg.Length(float64(i)-float64(n-1)/2)
			p.Add(bars)
			p.Legend.Add(s.Label, bars)
		}
		p.NominalX("p50", "p95", "p99", "p99.9")
		// Half a category either side, so that no bar is cut at the edge.
		p.Y.Min, p.Y.Max = 0, top*1.05
		p.X.Min, p.X.Max = -0.5, 3.5
		p.Add(plotter.NewGrid())
		panels = append(panels, p)
	}
	return render(w, f, 7*vg.Inch, vg.Length(len(panels))*2.8*vg.Inch, panels...)
}

var _ Chart = LatencyChart{}
