package charts

import (
	"fmt"
	"io"
	"math"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Spread is a measured figure at one x value: the median of repeated trials and their
// minimum and maximum.
type Spread struct {
	N      float64 // x value, e.g. the shard count
	Median float64
	Min    float64
	Max    float64
}

// ScalingChart is throughput against shard count: the measured medians with min-max
// bars, optionally a fitted curve and the peak N* marked with a vertical line.
type ScalingChart struct {
	Title      string
	XLabel     string                  // default "shards"
	YLabel     string                  // default "throughput (ops/s)"
	Points     []Spread                // measured points
	Curve      func(n float64) float64 // fitted model, nil for none
	CurveLabel string                  // legend text of the curve, e.g. "USL fit"
	PeakN      int                     // N* to mark, 0 for none
}

// Render draws the chart in format f.
func (c ScalingChart) Render(w io.Writer, f Format) error {
	if len(c.Points) == 0 {
		return ErrNoData
	}
	xl, yl := c.XLabel, c.YLabel
	if xl == "" {
		xl = "shards"
	}
	if yl == "" {
		yl = "throughput (ops/s)"
	}
	p := newPlot(c.Title, xl, yl)

	pts := make(plotter.XYs, len(c.Points))
	errs := make(plotter.YErrors, len(c.Points))
	xmax, ymax := 1.0, 0.0
	for i, s := range c.Points {
		pts[i] = plotter.XY{X: s.N, Y: s.Median}
		errs[i] = struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median}
		xmax = math.Max(xmax, s.N)
		ymax = math.Max(ymax, s.Max)
	}
	// Show N* when it is near the measured range; a peak far beyond it would squash the
	// data into the left edge, so it is only named in the legend.
	peakShown := c.PeakN > 0 && float64(c.PeakN) <= 2*xmax
	if peakShown {
		xmax = math.Max(xmax, float64(c.PeakN))
	}
	xmax *= 1.05

	if c.Curve != nil {
		fn := plotter.NewFunction(c.Curve)
		fn.XMin, fn.XMax = 1, xmax
		fn.Samples = 200
		fn.Color = Color(1)
		fn.Width = vg.Points(1.5)
		p.Add(fn)
		label := c.CurveLabel
		if label == "" {
			label = "fit"
		}
		p.Legend.Add(label, fn)
		for n := 1.0; n <= xmax; n += xmax / 200 {
			ymax = math.Max(ymax, c.Curve(n))
		}
	}

	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Shape = draw.CircleGlyph{}
	sc.GlyphStyle.Radius = vg.Points(3)
	sc.GlyphStyle.Color = Color(0)
	bars, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
	if err != nil {
		return err
	}
	bars.Color = sc.GlyphStyle.Color
	p.Add(bars, sc)
	p.Legend.Add("measured: median,\nmin-max of trials", sc)

	if c.PeakN > 0 {
		label := fmt.Sprintf("N* = %d", c.PeakN)
		if peakShown {
			line, err := plotter.NewLine(plotter.XYs{{X: float64(c.PeakN), Y: 0}, {X: float64(c.PeakN), Y: ymax * 1.1}})
			if err != nil {
				return err
			}
			line.Color = Color(2)
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			p.Add(line)
			p.Legend.Add(label, line)
		} else {
			p.Legend.Add(label + " (beyond the chart)")
		}
	}
	p.X.Min, p.X.Max = 0, xmax
	p.X.Tick.Marker = IntegerTicks{} // shard counts are whole numbers
	p.Y.Min, p.Y.Max = 0, ymax*1.1
	p.Add(plotter.NewGrid())
	return render(w, f, 7*vg.Inch, 4.5*vg.Inch, p)
}

var _ Chart = ScalingChart{}
