package charts

import (
	"io"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Sample is one second of a run.
type Sample struct {
	T          float64 // seconds since the measured phase started
	Throughput float64 // completed requests in that second
	P99        float64 // p99 response time in that second, ms
}

// Timeline is one run's samples under a legend label.
type Timeline struct {
	Label   string
	Samples []Sample
}

// TimelineChart draws throughput (top panel) and p99 (bottom panel) against time, one
// line per Timeline.
type TimelineChart struct {
	Title  string
	Series []Timeline
}

// Render draws the chart in format f.
func (c TimelineChart) Render(w io.Writer, f Format) error {
	top := newPlot(c.Title, "", "throughput (ops/s)")
	bottom := newPlot("", "time since start of measurement (s)", "p99 (ms)")
	top.Legend.Left = false
	drawn, ymax := 0, 0.0
	for i, s := range c.Series {
		if len(s.Samples) == 0 {
			continue
		}
		tput := make(plotter.XYs, len(s.Samples))
		p99 := make(plotter.XYs, len(s.Samples))
		for j, x := range s.Samples {
			tput[j] = plotter.XY{X: x.T, Y: x.Throughput}
			ymax = max(ymax, x.Throughput)
			p99[j] = plotter.XY{X: x.T, Y: x.P99}
		}
		lt, err := plotter.NewLine(tput)
		if err != nil {
			return err
		}
		lp, err := plotter.NewLine(p99)
		if err != nil {
			return err
		}
		for _, l := range []*plotter.Line{lt, lp} {
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i)
			l.Width = vg.Points(1.2)
		}
		top.Add(lt)
		bottom.Add(lp)
		top.Legend.Add(s.Label, lt)
		drawn++
	}
	if drawn == 0 {
		return ErrNoData
	}
	// Leave room above the lines for the legend.
	top.Y.Min, top.Y.Max, bottom.Y.Min = 0, ymax*(1.1+0.1*float64(drawn)), 0
	top.Add(plotter.NewGrid())
	bottom.Add(plotter.NewGrid())
	return render(w, f, 7*vg.Inch, 5.5*vg.Inch, top, bottom)
}

var _ Chart = TimelineChart{}
