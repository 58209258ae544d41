package usl

import (
	"fmt"
	"slices"

	"github.com/shardlab/shardlab/lab/charts"
)

// ScalingChart builds the chart of points (median and min-max per n) with m's curve and
// peak. A fit that is not Meaningful is drawn, so the reader sees how badly it fits, but
// labelled so and without a peak.
func ScalingChart(title string, points []Point, m Model) charts.ScalingChart {
	c := charts.ScalingChart{
		Title:      title,
		Points:     Spreads(points),
		Curve:      m.Throughput,
		CurveLabel: fmt.Sprintf("USL fit (R² %.3f)", m.R2),
	}
	if !m.Meaningful() {
		c.CurveLabel = fmt.Sprintf("USL fit (R² %.3f):\ndoes not describe\nthe points", m.R2)
		return c
	}
	if n, ok := m.Peak(); ok {
		c.PeakN = n
	}
	return c
}

// Spreads summarises points per distinct n, in increasing n: the median, minimum and
// maximum throughput.
func Spreads(points []Point) []charts.Spread {
	byN := map[float64][]float64{}
	for _, p := range points {
		byN[p.N] = append(byN[p.N], p.X)
	}
	ns := make([]float64, 0, len(byN))
	for n := range byN {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	out := make([]charts.Spread, 0, len(ns))
	for _, n := range ns {
		xs := byN[n]
		slices.Sort(xs)
		med := xs[len(xs)/2]
		if len(xs)%2 == 0 {
			med = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
		}
		out = append(out, charts.Spread{N: n, Median: med, Min: xs[0], Max: xs[len(xs)-1]})
	}
	return out
}
