package charts

import (
	"io"

	"gonum.org/v1/plot"
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

// Timeline is one configuration's per-second samples: one slice of samples per trial,
// drawn in one colour under one legend label (which may say how many trials it holds).
type Timeline struct {
	Label  string
	Trials [][]Sample
}

// TimelineChart draws throughput (top panel) and p99 (bottom panel) against time: every
// trial of every configuration, a colour (and dash pattern) per configuration, so that
// the spread between trials shows and no trial is picked to stand for the others.
type TimelineChart struct {
	Title  string
	Series []Timeline
	// Marks are moments drawn as labelled vertical lines on both panels (a resharding
	// move's steps, say).
	Marks []Mark
}

// Mark is a labelled moment of a timeline.
type Mark struct {
	T     float64 // seconds, as Sample.T
	Label string
}

// Render draws the chart in format f.
func (c TimelineChart) Render(w io.Writer, f Format) error {
	top := newPlot(c.Title, "", "throughput (ops/s)")
	bottom := newPlot("", "time since start of measurement (s)", "p99 (ms)")
	drawn := 0
	for i, s := range c.Series {
		var first *plotter.Line
		for _, samples := range s.Trials {
			if len(samples) == 0 {
				continue
			}
			tput := make(plotter.XYs, len(samples))
			p99 := make(plotter.XYs, len(samples))
			for j, x := range samples {
				tput[j] = plotter.XY{X: x.T, Y: x.Throughput}
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
				l.Color = Faded(Color(i), 0.8)
				l.Dashes = plotutil.Dashes(i)
				l.Width = vg.Points(1)
			}
			top.Add(lt)
			bottom.Add(lp)
			if first == nil {
				first = lt
			}
		}
		if first == nil {
			continue
		}
		top.Legend.Add(s.Label, first)
		drawn++
	}
	if drawn == 0 {
		return ErrNoData
	}
	top.Y.Min, bottom.Y.Min = 0, 0
	for i, m := range c.Marks {
		for j, p := range []*plot.Plot{top, bottom} {
			ymax := p.Y.Max // the data's, once the series are added
			l, err := plotter.NewLine(plotter.XYs{{X: m.T, Y: 0}, {X: m.T, Y: ymax}})
			if err != nil {
				return err
			}
			l.Color = Faded(Color(len(c.Series)+i), 0.6)
			l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
			p.Add(l)
			if j == 0 {
				// Labels alternate in height, so that close moments stay readable.
				y := ymax * (0.97 - 0.08*float64(i%4))
				lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: m.T, Y: y}}, Labels: []string{m.Label}})
				if err != nil {
					return err
				}
				for k := range lb.TextStyle {
					lb.TextStyle[k].Font.Size = vg.Points(7)
				}
				p.Add(lb)
			}
		}
	}
	top.Add(plotter.NewGrid())
	bottom.Add(plotter.NewGrid())
	return render(w, f, 7*vg.Inch, 5.5*vg.Inch, top, bottom)
}

var _ Chart = TimelineChart{}
