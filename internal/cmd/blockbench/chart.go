package blockbench

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/shardlab/shardlab/lab/charts"
)

var ingestCSVRe = regexp.MustCompile(`^ingest-T(never|\d+)-r(\d+)\.csv$`)

type runCurve struct {
	threshold int64
	round     int
	rows      []BatchRow
}

// readCSV reads a whole CSV file and checks that its first record is header.
func readCSV(path string, header []string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(recs) == 0 || !slices.Equal(recs[0], header) {
		return nil, fmt.Errorf("%s: header is not %v", path, header)
	}
	return recs, nil
}

// ReadIngestCSV parses a per-batch CSV written by Ingest.
func ReadIngestCSV(path string) ([]BatchRow, error) {
	recs, err := readCSV(path, CSVHeader)
	if err != nil {
		return nil, err
	}
	rows := make([]BatchRow, 0, len(recs)-1)
	for i, r := range recs[1:] {
		var row BatchRow
		var errs [7]error
		row.TimeS, errs[0] = strconv.ParseFloat(r[0], 64)
		row.Files, errs[1] = strconv.ParseInt(r[1], 10, 64)
		row.Blocks, errs[2] = strconv.ParseInt(r[2], 10, 64)
		row.FilesPerS, errs[3] = strconv.ParseFloat(r[3], 64)
		row.BlocksPerS, errs[4] = strconv.ParseFloat(r[4], 64)
		row.Shards, errs[5] = strconv.Atoi(r[5])
		row.Level, errs[6] = strconv.Atoi(r[6])
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", path, i+2, err)
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func readCurves(dir string) ([]runCurve, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var curves []runCurve
	for _, e := range entries {
		m := ingestCSVRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		var c runCurve
		if m[1] != "never" {
			c.threshold, _ = strconv.ParseInt(m[1], 10, 64)
		}
		c.round, _ = strconv.Atoi(m[2])
		if c.rows, err = ReadIngestCSV(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
		curves = append(curves, c)
	}
	if len(curves) == 0 {
		return nil, fmt.Errorf("no ingest-T*-r*.csv files in %s", dir)
	}
	sort.Slice(curves, func(i, j int) bool {
		if curves[i].threshold != curves[j].threshold {
			return curves[i].threshold < curves[j].threshold
		}
		return curves[i].round < curves[j].round
	})
	return curves, nil
}

type summaryRow struct {
	threshold      int64
	reached        bool
	timeToTarget   float64
	elapsed        float64
	lookupP50, p99 float64
	cpu            float64
}

func readSummary(path string) ([]summaryRow, error) {
	recs, err := readCSV(path, SummaryHeader)
	if err != nil {
		return nil, err
	}
	var out []summaryRow
	for _, r := range recs[1:] {
		var s summaryRow
		s.threshold, _ = strconv.ParseInt(r[0], 10, 64)
		s.reached = r[2] == "true"
		s.timeToTarget, _ = strconv.ParseFloat(r[3], 64)
		s.elapsed, _ = strconv.ParseFloat(r[4], 64)
		s.lookupP50, _ = strconv.ParseFloat(r[8], 64)
		s.p99, _ = strconv.ParseFloat(r[9], 64)
		s.cpu, _ = strconv.ParseFloat(r[12], 64)
		out = append(out, s)
	}
	return out, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// RenderCharts reads the CSVs of a sweep in dir and writes, as PNG and SVG:
// ingest_rate (blocks/s against total blocks, level switches marked),
// ingest_progress (total blocks against time) and time_to_target (median
// wall and CPU time to the target per threshold; runs that missed it show
// their elapsed time and a * in the label), and lookup_latency (median
// p50/p99).
func RenderCharts(dir string) error {
	curves, err := readCurves(dir)
	if err != nil {
		return err
	}
	var thresholds []int64
	for _, c := range curves {
		if !slices.Contains(thresholds, c.threshold) {
			thresholds = append(thresholds, c.threshold)
		}
	}
	colorOf := func(t int64) color.Color { return charts.Color(slices.Index(thresholds, t)) }

	rate := plot.New()
	rate.Title.Text = "Ingest rate per batch (bold: median over rounds, faint: each round; triangles: a new level began)"
	rate.X.Label.Text = "blocks in store (millions)"
	rate.Y.Label.Text = "blocks/s (this batch)"
	rate.Y.Min = 0
	rate.Y.Tick.Marker = thousands{}
	progress := plot.New()
	progress.Title.Text = "Blocks written over time (solid: round 1, dashed: later rounds)"
	progress.X.Min, progress.Y.Min = 0, 0
	progress.X.Label.Text = "time (s)"
	progress.Y.Label.Text = "blocks in store (millions)"
	// Every run as a faint line, and the median over rounds at each batch
	// as a bold line: runs of one threshold write identical batch sizes, so
	// batch i holds the same block count in every round.
	for _, c := range curves {
		rateXY := make(plotter.XYs, len(c.rows))
		progXY := make(plotter.XYs, len(c.rows))
		for i, r := range c.rows {
			rateXY[i] = plotter.XY{X: float64(r.Blocks) / 1e6, Y: r.BlocksPerS}
			progXY[i] = plotter.XY{X: r.TimeS, Y: float64(r.Blocks) / 1e6}
		}
		col := colorOf(c.threshold)
		faint, err := plotter.NewLine(rateXY)
		if err != nil {
			return err
		}
		faint.Color = charts.Faded(col, 0.3)
		faint.Width = vg.Points(0.8)
		rate.Add(faint)
		prog, err := plotter.NewLine(progXY)
		if err != nil {
			return err
		}
		prog.Color = col
		prog.Width = vg.Points(1.2)
		if c.round > 1 {
			prog.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
		} else {
			progress.Legend.Add("T="+ThresholdLabel(c.threshold), prog)
		}
		progress.Add(prog)
	}
	for _, t := range thresholds {
		var runs [][]BatchRow
		for _, c := range curves {
			if c.threshold == t {
				runs = append(runs, c.rows)
			}
		}
		n := slices.MinFunc(runs, func(a, b []BatchRow) int { return len(a) - len(b) })
		medXY := make(plotter.XYs, len(n))
		var jumps plotter.XYs
		for i := range n {
			var ys []float64
			for _, rows := range runs {
				ys = append(ys, rows[i].BlocksPerS)
			}
			medXY[i] = plotter.XY{X: float64(runs[0][i].Blocks) / 1e6, Y: median(ys)}
			if i > 0 && runs[0][i].Level != runs[0][i-1].Level {
				jumps = append(jumps, medXY[i])
			}
		}
		l, err := plotter.NewLine(medXY)
		if err != nil {
			return err
		}
		l.Color = colorOf(t)
		l.Width = vg.Points(2.2)
		rate.Add(l)
		rate.Legend.Add(fmt.Sprintf("T=%s (median of %d)", ThresholdLabel(t), len(runs)), l)
		if len(jumps) > 0 {
			sc, err := plotter.NewScatter(jumps)
			if err != nil {
				return err
			}
			sc.GlyphStyle.Color = colorOf(t)
			sc.GlyphStyle.Shape = draw.PyramidGlyph{}
			sc.GlyphStyle.Radius = vg.Points(4)
			rate.Add(sc)
		}
	}
	rate.Add(plotter.NewGrid())
	progress.Add(plotter.NewGrid())
	if err := saveBoth(rate, dir, "ingest_rate", 9, 5); err != nil {
		return err
	}
	if err := saveBoth(progress, dir, "ingest_progress", 9, 5); err != nil {
		return err
	}

	summary, err := readSummary(filepath.Join(dir, "summary.csv"))
	if err != nil {
		return err
	}
	var names []string
	var ttt, cpu, p50, p99 plotter.Values
	for _, t := range thresholds {
		var times, cpus, l50, l99 []float64
		reachedAll := true
		for _, s := range summary {
			if s.threshold != t {
				continue
			}
			if s.reached {
				times = append(times, s.timeToTarget)
			} else {
				times = append(times, s.elapsed)
				reachedAll = false
			}
			cpus = append(cpus, s.cpu)
			l50 = append(l50, s.lookupP50)
			l99 = append(l99, s.p99)
		}
		if len(times) == 0 {
			continue
		}
		name := "T=" + ThresholdLabel(t)
		if !reachedAll {
			name += "*"
		}
		names = append(names, name)
		ttt = append(ttt, median(times))
		cpu = append(cpu, median(cpus))
		p50 = append(p50, median(l50))
		p99 = append(p99, median(l99))
	}
	bars, err := pairedBars("Time to target (median over rounds; * = not reached, elapsed shown)", "seconds",
		names, ttt, "wall time", 0, cpu, "CPU time (user+sys)", 3)
	if err != nil {
		return err
	}
	if err := saveBoth(bars, dir, "time_to_target", 7, 4); err != nil {
		return err
	}
	lat, err := pairedBars("Lookup latency of a written hash after the ingest (median over rounds)", "microseconds",
		names, p50, "p50", 1, p99, "p99", 2)
	if err != nil {
		return err
	}
	return saveBoth(lat, dir, "lookup_latency", 7, 4)
}

// pairedBars draws two bar series side by side for each name, with the given palette
// colors and legend labels.
func pairedBars(title, yLabel string, names []string, left []float64, leftLabel string, leftColor int,
	right []float64, rightLabel string, rightColor int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	for _, series := range []struct {
		values []float64
		color  int
		offset vg.Length
		label  string
	}{{left, leftColor, -vg.Points(10), leftLabel}, {right, rightColor, vg.Points(10), rightLabel}} {
		b, err := plotter.NewBarChart(plotter.Values(series.values), vg.Points(20))
		if err != nil {
			return nil, err
		}
		b.Color = charts.Color(series.color)
		b.LineStyle.Width = 0
		b.Offset = series.offset
		p.Add(b)
		p.Legend.Add(series.label, b)
	}
	p.NominalX(names...)
	// Half a category either side: gonum sizes the axis to the bar centres, which cut the
	// outer bars in half.
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.Y.Min = 0
	return p, nil
}

// saveBoth writes p as name.png and name.svg in dir, w×h inches, with the lab's chart
// layout (legend outside the data, package charts).
func saveBoth(p *plot.Plot, dir, name string, w, h vg.Length) error {
	base := filepath.Join(dir, name)
	if err := charts.SavePlot(p, w*vg.Inch, h*vg.Inch, base+".png", base+".svg"); err != nil {
		return fmt.Errorf("save %s: %w", name, err)
	}
	return nil
}

// thousands labels an axis in k (1e3) units.
type thousands struct{}

// Ticks implements plot.Ticker.
func (thousands) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value/1000, 'f', -1, 64) + "k"
		}
	}
	return ticks
}
