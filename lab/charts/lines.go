package charts

import (
	"io"
	"math"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Line is one series of a LinesChart: a measured figure (its median, with the min-max
// of its trials as a bar when they differ) at each x, or a model's prediction, drawn
// dashed.
type Line struct {
	Label  string
	Points []Spread
	Model  bool // dashed, without bars: a prediction, not a measurement
	Color  int  // index into Palette
}

// LinesChart is figures against a numeric x, e.g. latency percentiles against shard
// count or round-trip time: one line per series.
type LinesChart struct {
	Title          string
	XLabel, YLabel string
	// IntegerX ticks x at whole numbers only (shard counts).
	IntegerX bool
	Lines    []Line
}

// Render draws the chart in format f.
func (c LinesChart) Render(w io.Writer, f Format) error {
	p := newPlot(c.Title, c.XLabel, c.YLabel)
	xmax, ymax, drawn := 0.0, 0.0, 0
	for _, l := range c.Lines {
		if len(l.Points) == 0 {
			continue
		}
		drawn++
		pts := make(plotter.XYs, len(l.Points))
		errs := make(plotter.YErrors, len(l.Points))
		bars := false
		for i, s := range l.Points {
			pts[i] = plotter.XY{X: s.N, Y: s.Median}
			lo, hi := s.Min, s.Max
			if lo == 0 && hi == 0 {
				lo, hi = s.Median, s.Median
			}
			errs[i] = struct{ Low, High float64 }{s.Median - lo, hi - s.Median}
			bars = bars || hi > lo
			xmax = math.Max(xmax, s.N)
			ymax = math.Max(ymax, math.Max(s.Median, hi))
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		col := Color(l.Color)
		line.Color, points.Color = col, col
		line.Width = vg.Points(1.5)
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		if l.Model {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			points.Shape = draw.RingGlyph{}
		}
		p.Add(line, points)
		if bars && !l.Model {
			eb, err := plotter.NewYErrorBars(struct {
				plotter.XYs
				plotter.YErrors
			}{pts, errs})
			if err != nil {
				return err
			}
			eb.Color = col
			p.Add(eb)
		}
		p.Legend.Add(l.Label, line, points)
	}
	if drawn == 0 {
		return ErrNoData
	}
	if c.IntegerX {
		p.X.Tick.Marker = IntegerTicks{}
	}
	p.X.Min, p.X.Max = 0, xmax*1.05
	p.Y.Min, p.Y.Max = 0, ymax*1.1
	p.Add(plotter.NewGrid())
	return render(w, f, 7*vg.Inch, 4.5*vg.Inch, p)
}

var _ Chart = LinesChart{}
